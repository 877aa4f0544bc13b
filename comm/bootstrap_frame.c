/*
 * comm/wire.c - encode and decode the 64-byte bootstrap frames described in
 * comm_wire.h, field by field in little-endian order, and the cluster-token
 * digest carried in them.
 */
#include <string.h>

#include "comm_wire.h"

_Static_assert(4 + 2 + 2 + 4 + 4 + TP_WIRE_TOKEN_BYTES + 4 + 12 == TP_WIRE_FRAME_BYTES, "hello frame layout");
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

void tp_wire_token_digest(const char *token, uint8_t out[TP_WIRE_TOKEN_BYTES])
{
    memset(out, 0, TP_WIRE_TOKEN_BYTES);
    if (!token || !*token) return;
    for (int k = 0; k < 4; k++) {
        uint64_t h = 1469598103934665603ull ^ (0x9e3779b97f4a7c15ull * (uint64_t)(k + 1));
        for (const unsigned char *s = (const unsigned char *)token; *s; s++) {
            h ^= *s;
            h *= 1099511628211ull;
        }
        for (int i = 0; i < 8; i++) out[k * 8 + i] = (uint8_t)(h >> (8 * i));
    }
}

void tp_wire_encode(const struct tp_wire_frame *f, uint8_t out[TP_WIRE_FRAME_BYTES])
{
    memset(out, 0, TP_WIRE_FRAME_BYTES);
    put_u32(out + 0, f->magic);
    put_u16(out + 4, f->version);
    put_u16(out + 6, f->kind);
    put_u32(out + 8, f->rank);
    put_u32(out + 12, f->world_size);
    memcpy(out + 16, f->token, TP_WIRE_TOKEN_BYTES);
    put_u32(out + 48, f->arg);
}

void tp_wire_decode(const uint8_t in[TP_WIRE_FRAME_BYTES], struct tp_wire_frame *f)
{
    f->magic = get_u32(in + 0);
    f->version = get_u16(in + 4);
    f->kind = get_u16(in + 6);
    f->rank = get_u32(in + 8);
    f->world_size = get_u32(in + 12);
    memcpy(f->token, in + 16, TP_WIRE_TOKEN_BYTES);
    f->arg = get_u32(in + 48);
}

const char *tp_wire_reject_str(uint32_t reason)
{
    switch (reason) {
    case TP_REJECT_MAGIC: return "bad magic (not a tpserve comm peer)";
    case TP_REJECT_VERSION: return "protocol version mismatch (run the same tpserve version on every node)";
    case TP_REJECT_TOKEN: return "cluster token mismatch (set the same TP_CLUSTER_TOKEN / hostfile cluster_token everywhere)";
    case TP_REJECT_WORLD: return "world size mismatch (every rank must use the same hostfile / TP_WORLD_SIZE)";
    case TP_REJECT_RANK: return "unexpected rank (rank out of range or wrong connect order)";
    case TP_REJECT_DUPLICATE: return "duplicate rank (two processes claim the same TP_RANK)";
    case TP_REJECT_KIND: return "unexpected frame kind";
    default: return "unknown reason";
    }
}
