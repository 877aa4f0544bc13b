/*
 * comm/comm_wire.h - private: the frames exchanged while a group forms, the
 * mutual authentication of two ranks, and the blocking socket helpers used
 * by the bootstrap.
 *
 * Every frame is 64 bytes, fixed-width little-endian fields, encoded and
 * decoded field by field (never a struct written in host layout):
 *
 *   off size field
 *     0    4 magic        "TPCM" = 0x4d435054 read as little-endian u32
 *     4    2 version      TP_WIRE_VERSION
 *     6    2 kind         enum tp_wire_kind
 *     8    4 rank         sender's rank
 *    12    4 world_size   sender's world size
 *    16   32 auth         HELLO/REGISTER: the connector's nonce;
 *                         CHALLENGE: the acceptor's nonce;
 *                         PROOF: the connector's MAC; ACCEPT: the acceptor's
 *                         MAC; TABLE: MAC of the table; REJECT: zeros
 *    48    4 arg          HELLO: channel (TP_WIRE_CH_*); REGISTER: listen
 *                         port; REJECT: reason code; TABLE: entries that follow
 *    52    4 epoch        the sender's group epoch (0: a joining worker that
 *                         does not know it yet; see below)
 *    56    8 reserved     zero
 *
 * A TABLE frame is followed by `arg` entries of TP_WIRE_ENTRY_BYTES:
 *   ip (48 bytes, NUL padded text), port (u16), reserved (u16).
 *
 * Handshake (C = the connecting rank, A = the accepting one):
 *   C -> A  HELLO or REGISTER   nonce_c (32 fresh random bytes)
 *   A -> C  CHALLENGE           nonce_a (32 fresh random bytes)  | REJECT
 *   C -> A  PROOF               MAC("C", transcript)
 *   A -> C  ACCEPT              MAC("A", transcript)             | REJECT
 * MAC = HMAC-SHA-256 keyed by the cluster token over a role label and the transcript (version, hello
 * kind and arg, world size, both ranks, both nonces, the agreed epoch, SHA-256 of the group id),
 * compared in constant time; the coordinator's TABLE carries HMAC("T", nonce_c, nonce_a,
 * SHA-256(entries)).  Why it is built so, and the epoch rules: docs/security.md.
 */
#ifndef TP_COMM_WIRE_H
#define TP_COMM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define TP_WIRE_MAGIC 0x4d435054u /* "TPCM" */
#define TP_WIRE_VERSION 2u
#define TP_WIRE_FRAME_BYTES 64u
#define TP_WIRE_AUTH_BYTES 32u  /* nonce or HMAC-SHA-256 */
#define TP_WIRE_IP_BYTES 48u
#define TP_WIRE_ENTRY_BYTES 52u
#define TP_WIRE_MAX_WORLD 4096

enum tp_wire_kind {
    TP_WIRE_HELLO = 1,
    TP_WIRE_REGISTER = 2,
    TP_WIRE_ACCEPT = 3,
    TP_WIRE_REJECT = 4,
    TP_WIRE_TABLE = 5,
    TP_WIRE_CHALLENGE = 6,
    TP_WIRE_PROOF = 7,
};

/* HELLO arg: which link the connection becomes. */
enum tp_wire_channel {
    TP_WIRE_CH_DATA = 0,     /* the data link of the pair */
    TP_WIRE_CH_LIVENESS = 1, /* worker -> rank 0 heartbeat link (liveness.c) */
};

enum tp_wire_reject {
    TP_REJECT_NONE = 0,
    TP_REJECT_MAGIC,
    TP_REJECT_VERSION,
    TP_REJECT_AUTH,          /* the PROOF did not verify */
    TP_REJECT_WORLD,
    TP_REJECT_RANK,
    TP_REJECT_DUPLICATE,
    TP_REJECT_KIND,
    TP_REJECT_EPOCH,         /* the connector is in another group epoch (a stale rank) */
    TP_REJECT_DROPPED,       /* the connector's rank was left out when the group shrank */
};

struct tp_wire_frame {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint32_t rank;
    uint32_t world_size;
    uint8_t auth[TP_WIRE_AUTH_BYTES];
    uint32_t arg;
    uint32_t epoch;
};

/* What both MACs of one handshake cover (see the file comment). */
struct tp_wire_transcript {
    uint16_t hello_kind;                      /* HELLO or REGISTER */
    uint32_t hello_arg;                       /* channel or listen port */
    uint32_t world_size;
    uint32_t rank_c, rank_a;                  /* connector, acceptor */
    uint8_t nonce_c[TP_WIRE_AUTH_BYTES];
    uint8_t nonce_a[TP_WIRE_AUTH_BYTES];
    uint8_t group[TP_WIRE_AUTH_BYTES];        /* tp_wire_group_hash() */
    uint32_t epoch;                           /* the group epoch both sides agreed on */
};

/* The handshake key: the cluster token's bytes (an empty key when none). */
struct tp_wire_key {
    const uint8_t *bytes;                     /* not owned; NULL when len == 0 */
    size_t len;
};

/* Fill out with cryptographically random bytes (OpenSSL RAND_bytes).
 * 0 on success, -1 when the generator failed. */
int tp_wire_random(uint8_t *out, size_t n);
/* SHA-256 of the group id (NULL or "" hashes as the empty string).
 * This and the MACs return 0, or -1 when libcrypto failed (out zeroed). */
int tp_wire_group_hash(const char *group_id, uint8_t out[TP_WIRE_AUTH_BYTES]);
/* HMAC-SHA-256(key, "tpserve-comm-2" || role || transcript); role 'C' or 'A'. */
int tp_wire_mac(const struct tp_wire_key *key, char role, const struct tp_wire_transcript *t,
                uint8_t out[TP_WIRE_AUTH_BYTES]);
/* HMAC-SHA-256(key, "tpserve-comm-2" || 'T' || nonce_c || nonce_a || SHA-256(entries)). */
int tp_wire_table_mac(const struct tp_wire_key *key, const struct tp_wire_transcript *t, const uint8_t *entries,
                      size_t bytes, uint8_t out[TP_WIRE_AUTH_BYTES]);
/* Constant-time equality of two MACs: 1 when equal. */
int tp_wire_mac_equal(const uint8_t a[TP_WIRE_AUTH_BYTES], const uint8_t b[TP_WIRE_AUTH_BYTES]);
/* Peer bytes for a log line: every byte as \xNN (never raw), at most
 * (cap - 1) / 4 bytes, NUL terminated. */
void tp_wire_escape(const uint8_t *p, size_t n, char *out, size_t cap);
void tp_wire_encode(const struct tp_wire_frame *f, uint8_t out[TP_WIRE_FRAME_BYTES]);
/* Decodes any 64 bytes; the caller validates the fields. */
void tp_wire_decode(const uint8_t in[TP_WIRE_FRAME_BYTES], struct tp_wire_frame *f);
const char *tp_wire_reject_str(uint32_t reason);

/* ---- blocking helpers with deadlines (bootstrap only) ---- */

/* Listen on host:port (host NULL or "" = all interfaces, which the
 * bootstrap never asks for; port 0 = any).
 * Errors name the port and the fix (e.g. "in use"). */
enum tp_status tp_sock_listen(const char *host, int port, int *fd_out, int *port_out, struct tp_error *err);
/* Take over fd (inherited from a launcher) as the listening socket for port:
 * 0 when it is a TCP socket bound to that port (now listening, non-blocking,
 * close-on-exec; the caller owns it), -1 otherwise (fd left untouched). */
int tp_sock_adopt_listener(int fd, int port);
/* One connect attempt with a timeout; *refused set when the peer is not
 * listening yet (worth retrying). */
enum tp_status tp_sock_connect(const char *host, int port, uint64_t deadline_ns, int *fd_out, int *refused,
                               struct tp_error *err);
/* Accept one connection before the deadline (TP_ERR_TIMEOUT otherwise). */
enum tp_status tp_sock_accept(int lfd, uint64_t deadline_ns, int *fd_out, struct tp_error *err);
/* Read/write exactly n bytes before the deadline.  EOF is TP_ERR_PEER. */
enum tp_status tp_sock_read_full(int fd, void *buf, size_t n, uint64_t deadline_ns, struct tp_error *err);
enum tp_status tp_sock_write_full(int fd, const void *buf, size_t n, uint64_t deadline_ns, struct tp_error *err);
/* Switch to the data-path mode: non-blocking, TCP_NODELAY, no SIGPIPE. */
enum tp_status tp_sock_tune(int fd, struct tp_error *err);
void tp_sock_close(int *fd);
/* "a.b.c.d" of the remote end. */
void tp_sock_peer_ip(int fd, char *out, size_t cap);
/* "a.b.c.d" of the local end (the address a peer reached us on). */
void tp_sock_local_ip(int fd, char *out, size_t cap);
/* "a.b.c.d:port" of the remote end, for log lines. */
void tp_sock_peer_str(int fd, char *out, size_t cap);
/* 1 when every address host resolves to is loopback (127.0.0.0/8, ::1,
 * ::ffff:127.x), 0 otherwise (including a name that does not resolve). */
int tp_sock_is_loopback(const char *host);
/* Send flags that suppress SIGPIPE where the platform has MSG_NOSIGNAL. */
int tp_sock_send_flags(void);

#endif /* TP_COMM_WIRE_H */
