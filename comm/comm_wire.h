/*
 * comm/comm_wire.h - private: the frames exchanged while a group forms, and
 * the blocking socket helpers used by the bootstrap.
 *
 * Every frame is 64 bytes, fixed-width little-endian fields, encoded and
 * decoded field by field (never a struct written in host layout):
 *
 *   off size field
 *     0    4 magic        "TPCM" = 0x4d435054 read as little-endian u32
 *     4    2 version      TP_WIRE_VERSION
 *     6    2 kind         HELLO (connector -> acceptor), REGISTER (to the
 *                         coordinator), ACCEPT / REJECT (answers), TABLE
 *     8    4 rank         sender's rank
 *    12    4 world_size   sender's world size
 *    16   32 token        digest of the cluster token (zeros when none)
 *    48    4 arg          REGISTER: listen port; REJECT: reason code;
 *                         TABLE: number of entries that follow
 *    52   12 reserved     zero
 *
 * A TABLE frame is followed by `arg` entries of TP_WIRE_ENTRY_BYTES:
 *   ip (48 bytes, NUL padded text), port (u16), reserved (u16).
 *
 * The token digest is four FNV-1a-64 hashes with different seeds: it keeps
 * separate clusters (and mistakes) apart; it is not cryptography.
 */
#ifndef TP_COMM_WIRE_H
#define TP_COMM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#define TP_WIRE_MAGIC 0x4d435054u /* "TPCM" */
#define TP_WIRE_VERSION 1u
#define TP_WIRE_FRAME_BYTES 64u
#define TP_WIRE_TOKEN_BYTES 32u
#define TP_WIRE_IP_BYTES 48u
#define TP_WIRE_ENTRY_BYTES 52u
#define TP_WIRE_MAX_WORLD 4096

enum tp_wire_kind {
    TP_WIRE_HELLO = 1,
    TP_WIRE_REGISTER = 2,
    TP_WIRE_ACCEPT = 3,
    TP_WIRE_REJECT = 4,
    TP_WIRE_TABLE = 5,
};

enum tp_wire_reject {
    TP_REJECT_NONE = 0,
    TP_REJECT_MAGIC,
    TP_REJECT_VERSION,
    TP_REJECT_TOKEN,
    TP_REJECT_WORLD,
    TP_REJECT_RANK,
    TP_REJECT_DUPLICATE,
    TP_REJECT_KIND,
};

struct tp_wire_frame {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint32_t rank;
    uint32_t world_size;
    uint8_t token[TP_WIRE_TOKEN_BYTES];
    uint32_t arg;
};

void tp_wire_token_digest(const char *token, uint8_t out[TP_WIRE_TOKEN_BYTES]);
void tp_wire_encode(const struct tp_wire_frame *f, uint8_t out[TP_WIRE_FRAME_BYTES]);
/* Decodes any 64 bytes; the caller validates the fields. */
void tp_wire_decode(const uint8_t in[TP_WIRE_FRAME_BYTES], struct tp_wire_frame *f);
const char *tp_wire_reject_str(uint32_t reason);

/* ---- blocking helpers with deadlines (bootstrap only) ---- */

/* Listen on host:port (host NULL or "" = all interfaces; port 0 = any).
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
/* Send flags that suppress SIGPIPE where the platform has MSG_NOSIGNAL. */
int tp_sock_send_flags(void);

#endif /* TP_COMM_WIRE_H */
