/*
 * comm/bootstrap_frame.c - encode and decode the 64-byte bootstrap frames described in
 * comm_wire.h, field by field in little-endian order, and the handshake's
 * cryptography (nonces, HMAC-SHA-256 over the transcript) from libcrypto.
 */
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "comm_wire.h"

_Static_assert(4 + 2 + 2 + 4 + 4 + TP_WIRE_AUTH_BYTES + 4 + 12 == TP_WIRE_FRAME_BYTES, "hello frame layout");
_Static_assert(TP_WIRE_AUTH_BYTES == SHA256_DIGEST_LENGTH, "auth field holds one SHA-256 output");
_Static_assert(TP_WIRE_IP_BYTES + 2 + 2 == TP_WIRE_ENTRY_BYTES, "table entry layout");

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

#define MAC_LABEL "tpserve-comm-2"

int tp_wire_random(uint8_t *out, size_t n)
{
    return n <= (size_t)0x7fffffff && RAND_bytes(out, (int)n) == 1 ? 0 : -1;
}

int tp_wire_group_hash(const char *group_id, uint8_t out[TP_WIRE_AUTH_BYTES])
{
    const char *g = group_id ? group_id : "";
    return SHA256((const unsigned char *)g, strlen(g), out) ? 0 : -1;
}

/* HMAC over label || role || msg (msg <= 160 bytes).  An empty key is a
 * valid HMAC key. */
static int hmac_label(const struct tp_wire_key *key, char role, const uint8_t *msg, size_t n,
                       uint8_t out[TP_WIRE_AUTH_BYTES])
{
    static const uint8_t empty = 0;
    const uint8_t *k = key && key->len ? key->bytes : &empty;
    int klen = key && key->len ? (int)key->len : 0;
    unsigned int olen = 0;
    uint8_t buf[sizeof MAC_LABEL + 1 + 160];
    size_t off = sizeof MAC_LABEL - 1;
    memcpy(buf, MAC_LABEL, off);
    buf[off++] = (uint8_t)role;
    if (n > 160) n = 160;
    memcpy(buf + off, msg, n);
    off += n;
    if (HMAC(EVP_sha256(), k, klen, buf, off, out, &olen) && olen == TP_WIRE_AUTH_BYTES) return 0;
    memset(out, 0, TP_WIRE_AUTH_BYTES);
    return -1;
}

int tp_wire_mac(const struct tp_wire_key *key, char role, const struct tp_wire_transcript *t,
                uint8_t out[TP_WIRE_AUTH_BYTES])
{
    uint8_t m[2 + 2 + 4 + 4 + 4 + 4 + 4 + 3 * TP_WIRE_AUTH_BYTES];
    size_t off = 0;
    put_u16(m + off, (uint16_t)TP_WIRE_VERSION), off += 2;
    put_u16(m + off, t->hello_kind), off += 2;
    put_u32(m + off, t->hello_arg), off += 4;
    put_u32(m + off, t->world_size), off += 4;
    put_u32(m + off, t->rank_c), off += 4;
    put_u32(m + off, t->rank_a), off += 4;
    put_u32(m + off, t->epoch), off += 4;
    memcpy(m + off, t->nonce_c, TP_WIRE_AUTH_BYTES), off += TP_WIRE_AUTH_BYTES;
    memcpy(m + off, t->nonce_a, TP_WIRE_AUTH_BYTES), off += TP_WIRE_AUTH_BYTES;
    memcpy(m + off, t->group, TP_WIRE_AUTH_BYTES), off += TP_WIRE_AUTH_BYTES;
    return hmac_label(key, role, m, off, out);
}

int tp_wire_table_mac(const struct tp_wire_key *key, const struct tp_wire_transcript *t, const uint8_t *entries,
                      size_t bytes, uint8_t out[TP_WIRE_AUTH_BYTES])
{
    uint8_t m[3 * TP_WIRE_AUTH_BYTES];
    memcpy(m, t->nonce_c, TP_WIRE_AUTH_BYTES);
    memcpy(m + TP_WIRE_AUTH_BYTES, t->nonce_a, TP_WIRE_AUTH_BYTES);
    static const uint8_t none = 0;
    if (!SHA256(entries ? entries : &none, entries ? bytes : 0, m + 2 * TP_WIRE_AUTH_BYTES)) return -1;
    return hmac_label(key, 'T', m, sizeof m, out);
}

int tp_wire_mac_equal(const uint8_t a[TP_WIRE_AUTH_BYTES], const uint8_t b[TP_WIRE_AUTH_BYTES])
{
    return CRYPTO_memcmp(a, b, TP_WIRE_AUTH_BYTES) == 0;
}

void tp_wire_escape(const uint8_t *p, size_t n, char *out, size_t cap)
{
    size_t off = 0;
    if (cap == 0) return;
    for (size_t i = 0; i < n && off + 4 < cap; i++) off += (size_t)snprintf(out + off, cap - off, "\\x%02x", p[i]);
    out[off] = '\0';
}

void tp_wire_encode(const struct tp_wire_frame *f, uint8_t out[TP_WIRE_FRAME_BYTES])
{
    memset(out, 0, TP_WIRE_FRAME_BYTES);
    put_u32(out + 0, f->magic);
    put_u16(out + 4, f->version);
    put_u16(out + 6, f->kind);
    put_u32(out + 8, f->rank);
    put_u32(out + 12, f->world_size);
    memcpy(out + 16, f->auth, TP_WIRE_AUTH_BYTES);
    put_u32(out + 48, f->arg);
    put_u32(out + 52, f->epoch);
}

void tp_wire_decode(const uint8_t in[TP_WIRE_FRAME_BYTES], struct tp_wire_frame *f)
{
    f->magic = get_u32(in + 0);
    f->version = get_u16(in + 4);
    f->kind = get_u16(in + 6);
    f->rank = get_u32(in + 8);
    f->world_size = get_u32(in + 12);
    memcpy(f->auth, in + 16, TP_WIRE_AUTH_BYTES);
    f->arg = get_u32(in + 48);
    f->epoch = get_u32(in + 52);
}

const char *tp_wire_reject_str(uint32_t reason)
{
    switch (reason) {
    case TP_REJECT_MAGIC: return "bad magic (not a tpserve comm peer)";
    case TP_REJECT_VERSION: return "protocol version mismatch (run the same tpserve version on every node)";
    case TP_REJECT_WORLD: return "world size mismatch (every rank must use the same hostfile / TP_WORLD_SIZE)";
    case TP_REJECT_RANK: return "unexpected rank (rank out of range or wrong connect order)";
    case TP_REJECT_DUPLICATE: return "duplicate rank (two processes claim the same TP_RANK)";
    case TP_REJECT_KIND: return "unexpected frame kind";
    case TP_REJECT_DROPPED:
        return "this rank was left out when the group re-planned over the surviving ranks (restart the whole job to "
               "bring it back)";
    case TP_REJECT_EPOCH: return "group epoch mismatch (a rank of an earlier epoch of a group that has re-formed since)";
    case TP_REJECT_AUTH:
        return "authentication failed: the peer does not hold this group's cluster token (set the same "
               "TP_CLUSTER_TOKEN / hostfile cluster_token everywhere) or runs another group id / model plan";
    default: return "unknown reason";
    }
}
