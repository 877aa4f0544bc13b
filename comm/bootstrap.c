/*
 * comm/bootstrap.c - form the TCP full mesh of a world group, from a hostfile
 * or through a coordinator: rank i connects to every lower rank and accepts every
 * higher one, each connection authenticated both ways (comm_wire.h) before it
 * counts, strays refused without stopping the group, every wait bounded by
 * connect_timeout_ms; each worker also opens its liveness link to rank 0.  How
 * and why: docs/multi-node.md ("How the group forms"), docs/security.md.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "comm_impl.h"
#include "comm_wire.h"

#define HELLO_READ_MS 3000u   /* a silent stray may hold the accept loop this long */
#define CONNECT_RETRY_MS 50u

struct boot {
    int rank, size;
    struct tp_wire_key key;               /* the cluster token's bytes (empty when none) */
    uint8_t group[TP_WIRE_AUTH_BYTES];    /* SHA-256 of the group id */
    uint32_t epoch;                       /* group epoch; 0 on a joining worker until rank 0 tells it */
    int drop;                             /* rank 0 shrinking: the failed group's rank left out (0: none) */
    int former_world;                     /* rank 0: the largest world before it shrank (0: never) */
    int allow_shrink;                     /* a joining worker accepts rank 0's renumbering */
    int dropped;                          /* a worker that was renumbered: the rank left out (0: none) */
    uint64_t deadline;
    uint32_t timeout_ms;
    struct tp_host *table;                /* (size) */
    int *live_fds;                        /* (size) liveness links (rank 0: per worker; workers: [0]) */
    struct tp_wire_transcript *reg;       /* coordinator root: (size) each member's REGISTER handshake */
};

static void make_frame(const struct boot *b, uint16_t kind, uint32_t arg, const uint8_t *auth,
                       uint8_t out[TP_WIRE_FRAME_BYTES])
{
    struct tp_wire_frame f = {.magic = TP_WIRE_MAGIC,
                              .version = TP_WIRE_VERSION,
                              .kind = kind,
                              .rank = (uint32_t)b->rank,
                              .world_size = (uint32_t)b->size,
                              .arg = arg,
                              .epoch = b->epoch};
    if (auth) memcpy(f.auth, auth, TP_WIRE_AUTH_BYTES);
    tp_wire_encode(&f, out);
}

/* Answer a refused peer with a REJECT (reason only, no secret material),
 * log it with its address and the first bytes it sent (escaped), close. */
static void reject(const struct boot *b, int *fd, uint32_t why, const uint8_t *got, size_t n_got)
{
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    char peer[96], esc[16 * 4 + 1];
    struct tp_error e = {0};
    tp_sock_peer_str(*fd, peer, sizeof peer);
    tp_wire_escape(got, TP_MIN(n_got, (size_t)16), esc, sizeof esc);
    tp_log(TP_LOG_WARN, TP_COMM_MODULE, "rank %d: rejected a connection from %s: %s (it sent %s...)", b->rank, peer,
           tp_wire_reject_str(why), esc);
    make_frame(b, TP_WIRE_REJECT, why, NULL, buf);
    (void)tp_sock_write_full(*fd, buf, sizeof buf, tp_now_ns() + 200000000ull, &e);
    tp_sock_close(fd);
}

/* Structural checks of a peer's first frame (nothing secret is involved).
 * Sets *slots to the array its link goes into.  Returns the reject reason
 * or TP_REJECT_NONE. */
static uint32_t check_hello(const struct boot *b, const struct tp_wire_frame *f, uint16_t want_kind, int lo, int hi,
                            int *fds, int **slots, int *rank)
{
    if (f->magic != TP_WIRE_MAGIC) return TP_REJECT_MAGIC;
    if (f->version != TP_WIRE_VERSION) return TP_REJECT_VERSION;
    *rank = (int)TP_MIN(f->rank, (uint32_t)INT32_MAX);
    if (b->rank == 0 && b->drop > 0 && f->epoch == 0 && f->world_size == (uint32_t)b->size + 1) {
        /* a worker of the group that failed, joining the smaller one: same order, drop left out */
        if (f->rank == (uint32_t)b->drop) return TP_REJECT_DROPPED;
        if (f->rank > (uint32_t)b->drop) (*rank)--;
    } else if (b->rank == 0 && f->epoch == 0 && f->world_size > (uint32_t)b->size &&
               f->world_size <= (uint32_t)b->former_world) {
        return TP_REJECT_DROPPED; /* a rank of the group before it shrank (restarted, or woken up) */
    } else if (f->world_size != (uint32_t)b->size) {
        return TP_REJECT_WORLD;
    }
    /* rank 0 lets a joining worker (epoch 0) learn the epoch; between workers it is known */
    if (f->epoch != b->epoch && (b->rank != 0 || f->epoch != 0)) return TP_REJECT_EPOCH;
    if (f->kind == TP_WIRE_HELLO && f->arg == TP_WIRE_CH_LIVENESS && b->rank == 0 && b->live_fds)
        *slots = b->live_fds;
    else if (f->kind == want_kind && (want_kind != TP_WIRE_HELLO || f->arg == TP_WIRE_CH_DATA))
        *slots = fds;
    else
        return TP_REJECT_KIND;
    if (*rank < lo || *rank >= hi) return TP_REJECT_RANK;
    if ((*slots)[*rank] >= 0) return TP_REJECT_DUPLICATE;
    return TP_REJECT_NONE;
}

/* Connect to `peer` at ip:port, retrying while it is not listening yet. */
/* A worker's link to rank 0 (formed first) that rank 0 closed: rank 0 ended this attempt to form the
 * group (to re-form without a lost rank, or it gave up), so waiting longer for other ranks is useless. */
static int rank0_closed(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    uint8_t peek;
    return fd >= 0 && poll(&pf, 1, 0) > 0 &&
           (pf.revents & (POLLERR | POLLHUP) || recv(fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT) == 0);
}

/* Connect to rank `peer` until b->deadline.  watch_fd >= 0 (a worker's link to rank 0 while it
 * connects to another worker): give up as soon as rank 0 closes it (rank0_closed), so a survivor does
 * not retry a stopped or dead rank's port for the whole attempt while rank 0 re-forms without it. */
static enum tp_status connect_retry(const struct boot *b, int peer, const char *ip, int port, int watch_fd,
                                    int *fd_out, struct tp_error *err)
{
    struct tp_error last = {0};
    for (;;) {
        int refused = 0;
        tp_error_clear(&last);
        uint64_t dl = b->deadline;
        if (watch_fd >= 0 && tp_now_ns() + 100000000ull < dl) dl = tp_now_ns() + 100000000ull;
        enum tp_status st = tp_sock_connect(ip, port, dl, fd_out, &refused, &last);
        if (st == TP_OK) return TP_OK;
        if (st == TP_ERR_INVALID_ARG) return tp_error_set(err, st, "%s", last.msg);
        if (rank0_closed(watch_fd))
            return tp_error_set(err, TP_ERR_PEER,
                                "rank 0 closed its link while rank %d tried to reach rank %d at %s:%d (it ended this "
                                "attempt to form the group; last error: %s)",
                                b->rank, peer, ip, port, last.msg);
        if (tp_now_ns() + CONNECT_RETRY_MS * 1000000ull >= b->deadline)
            return tp_error_set(err, TP_ERR_TIMEOUT,
                                "rank %d could not reach rank %d at %s:%d within %u ms (last error: %s): is that rank "
                                "running, is the address right, does a firewall block the port?",
                                b->rank, peer, ip, port, b->timeout_ms, last.msg);
        tp_sleep_ms(CONNECT_RETRY_MS);
    }
}

/* Read one frame; a REJECT, a bad magic or another kind than want is an
 * error naming the peer. */
static enum tp_status read_answer(const struct boot *b, int fd, int peer, uint16_t want, struct tp_wire_frame *f,
                                  struct tp_error *err)
{
    /* a joining worker may hear rank 0 run a group one smaller (see handshake_connect) */
    const uint32_t shrunk = b->allow_shrink && b->epoch == 0 && peer == 0 && want == TP_WIRE_CHALLENGE && b->size > 2
                                ? (uint32_t)b->size - 1
                                : (uint32_t)b->size;
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    struct tp_error e = {0};
    if (tp_sock_read_full(fd, buf, sizeof buf, b->deadline, &e) != TP_OK)
        return tp_error_set(err, e.status, "hello exchange with rank %d failed: %s (is that rank part of this group?)",
                            peer, e.msg);
    tp_wire_decode(buf, f);
    if (f->magic != TP_WIRE_MAGIC)
        return tp_error_set(err, TP_ERR_PROTOCOL, "rank %d's address answered with something that is not tpserve comm",
                            peer);
    if (f->kind == TP_WIRE_REJECT)
        return tp_error_set(err, f->arg == TP_REJECT_DROPPED ? TP_ERR_CANCELLED : TP_ERR_PROTOCOL,
                            "rank %d rejected rank %d: %s", peer, b->rank, tp_wire_reject_str(f->arg));
    if (f->version != TP_WIRE_VERSION || f->rank != (uint32_t)peer ||
        (f->world_size != (uint32_t)b->size && f->world_size != shrunk) || f->kind != want)
        return tp_error_set(err, TP_ERR_PROTOCOL,
                            "the process at rank %d's address answered as rank %u of %u (frame kind %u, version %u): "
                            "two clusters share a port?",
                            peer, f->rank, f->world_size, f->kind, f->version);
    return TP_OK;
}

/* The connector's side of the handshake on fd (see comm_wire.h): HELLO or
 * REGISTER with a fresh nonce, CHALLENGE, PROOF, then the acceptor's MAC in
 * its ACCEPT, checked.  *t gets the transcript (for the TABLE's MAC). */
static enum tp_status handshake_connect(struct boot *b, int fd, int peer, uint16_t kind, uint32_t arg,
                                        struct tp_wire_transcript *t, struct tp_error *err)
{
    uint8_t buf[TP_WIRE_FRAME_BYTES], mac[TP_WIRE_AUTH_BYTES];
    struct tp_wire_frame f;
    struct tp_error e = {0};
    enum tp_status st;
    memset(t, 0, sizeof *t);
    t->hello_kind = kind;
    t->hello_arg = arg;
    t->world_size = (uint32_t)b->size;
    t->rank_c = (uint32_t)b->rank;
    t->rank_a = (uint32_t)peer;
    memcpy(t->group, b->group, sizeof t->group);
    if (tp_wire_random(t->nonce_c, sizeof t->nonce_c) != 0)
        return tp_error_set(err, TP_ERR_INTERNAL, "the system's random generator failed (OpenSSL RAND_bytes)");
    make_frame(b, kind, arg, t->nonce_c, buf);
    if ((st = tp_sock_write_full(fd, buf, sizeof buf, b->deadline, &e)) != TP_OK)
        return tp_error_set(err, st, "hello to rank %d failed: %s", peer, e.msg);
    if ((st = read_answer(b, fd, peer, TP_WIRE_CHALLENGE, &f, err)) != TP_OK) return st;
    if (f.world_size + 1 == (uint32_t)b->size) {
        /* rank 0 re-planned over the survivors: it left out rank f.arg of this group; the ranks
         * above it move down one.  Taken as the epoch is: the MACs below cover the new place. */
        if (f.arg < 1 || f.arg >= (uint32_t)b->size || f.arg == (uint32_t)b->rank)
            return tp_error_set(err, TP_ERR_PROTOCOL, "rank 0 shrank the group leaving out rank %u, which is "
                                "impossible for rank %d of %d", f.arg, b->rank, b->size);
        b->dropped = (int)f.arg;
        if (b->rank > b->dropped) b->rank--;
        memmove(&b->table[b->dropped], &b->table[b->dropped + 1],
                (size_t)(b->size - 1 - b->dropped) * sizeof *b->table);
        b->size--;
        t->world_size = (uint32_t)b->size;
        t->rank_c = (uint32_t)b->rank;
        tp_log(TP_LOG_INFO, TP_COMM_MODULE, "rank 0 re-formed the group without rank %d: this rank is now %d of %d",
               b->dropped, b->rank, b->size);
    }
    if (b->epoch == 0 && peer == 0 && f.epoch != 0) b->epoch = f.epoch; /* joining: rank 0 says which epoch */
    if (f.epoch != b->epoch)
        return tp_error_set(err, TP_ERR_PROTOCOL,
                            "rank %d answered in group epoch %u, this rank is in epoch %u: a rank of another "
                            "epoch of a group that re-formed (restart this rank to join the current one)",
                            peer, f.epoch, b->epoch);
    t->epoch = b->epoch;
    memcpy(t->nonce_a, f.auth, sizeof t->nonce_a);
    if (tp_wire_mac(&b->key, 'C', t, mac) != 0)
        return tp_error_set(err, TP_ERR_INTERNAL, "HMAC-SHA-256 failed in libcrypto");
    make_frame(b, TP_WIRE_PROOF, 0, mac, buf);
    if ((st = tp_sock_write_full(fd, buf, sizeof buf, b->deadline, &e)) != TP_OK)
        return tp_error_set(err, st, "proof to rank %d failed: %s", peer, e.msg);
    if ((st = read_answer(b, fd, peer, TP_WIRE_ACCEPT, &f, err)) != TP_OK) return st;
    if (tp_wire_mac(&b->key, 'A', t, mac) != 0 || !tp_wire_mac_equal(mac, f.auth))
        return tp_error_set(err, TP_ERR_PROTOCOL,
                            "the process at rank %d's address could not prove it holds the cluster token: another "
                            "cluster, a different TP_CLUSTER_TOKEN / hostfile cluster_token or group id, or someone "
                            "else on that address",
                            peer);
    return TP_OK;
}

/* The acceptor's side after a first frame f passed check_hello: CHALLENGE,
 * then the PROOF checked in constant time.  Returns TP_REJECT_NONE with *t
 * filled, or the reject reason (bytes of the bad frame in bad). */
static uint32_t handshake_accept(const struct boot *b, int fd, const struct tp_wire_frame *f, int rank_c,
                                 struct tp_wire_transcript *t, uint8_t bad[TP_WIRE_FRAME_BYTES], size_t *n_bad)
{
    uint8_t buf[TP_WIRE_FRAME_BYTES], mac[TP_WIRE_AUTH_BYTES];
    struct tp_error e = {0};
    struct tp_wire_frame p;
    memset(t, 0, sizeof *t);
    t->hello_kind = f->kind;
    t->hello_arg = f->arg;
    t->world_size = (uint32_t)b->size;
    t->rank_c = (uint32_t)rank_c;
    t->rank_a = (uint32_t)b->rank;
    memcpy(t->nonce_c, f->auth, sizeof t->nonce_c);
    memcpy(t->group, b->group, sizeof t->group);
    t->epoch = b->epoch;
    *n_bad = 0;
    if (tp_wire_random(t->nonce_a, sizeof t->nonce_a) != 0) return TP_REJECT_AUTH;
    /* a worker of the failed group learns from the arg which rank was left out */
    const uint32_t carg = b->drop > 0 && f->world_size != (uint32_t)b->size ? (uint32_t)b->drop : 0u;
    make_frame(b, TP_WIRE_CHALLENGE, carg, t->nonce_a, buf);
    uint64_t dl = tp_now_ns() + HELLO_READ_MS * 1000000ull;
    if (dl > b->deadline) dl = b->deadline;
    if (tp_sock_write_full(fd, buf, sizeof buf, dl, &e) != TP_OK) return TP_REJECT_AUTH;
    if (tp_sock_read_full(fd, bad, TP_WIRE_FRAME_BYTES, dl, &e) != TP_OK) return TP_REJECT_AUTH;
    *n_bad = TP_WIRE_FRAME_BYTES;
    tp_wire_decode(bad, &p);
    if (p.magic != TP_WIRE_MAGIC) return TP_REJECT_MAGIC;
    if (p.kind != TP_WIRE_PROOF || p.version != TP_WIRE_VERSION || p.rank != (uint32_t)rank_c) return TP_REJECT_KIND;
    if (tp_wire_mac(&b->key, 'C', t, mac) != 0 || !tp_wire_mac_equal(mac, p.auth)) return TP_REJECT_AUTH;
    return TP_REJECT_NONE;
}

/* Accept until every rank in [lo, hi) has a link in fds (first frames of
 * kind want_kind) and, on rank 0 with live_fds, a liveness link.  REGISTER
 * mode also records the peer's address and handshake. */
static enum tp_status accept_ranks(const struct boot *b, int lfd, int lo, int hi, uint16_t want_kind, int *fds,
                                   struct tp_error *err)
{
    int need = 0;
    for (int r = lo; r < hi; r++) need += (fds[r] < 0) + (b->rank == 0 && b->live_fds && b->live_fds[r] < 0);
    while (need > 0) {
        int fd = -1;
        struct tp_error e = {0};
        /* a worker waits in slices and gives up as soon as rank 0 closes its link (rank 0 ended this
         * attempt, e.g. to re-form without a lost rank): no waiting out a group that cannot form */
        const int watch = b->rank > 0 && fds[0] >= 0;
        uint64_t slice = watch ? tp_now_ns() + 100000000ull : b->deadline;
        enum tp_status st = tp_sock_accept(lfd, slice < b->deadline ? slice : b->deadline, &fd, &e);
        if (st == TP_ERR_TIMEOUT && watch && tp_now_ns() < b->deadline) {
            if (rank0_closed(fds[0]))
                return tp_error_set(err, TP_ERR_PEER,
                                    "rank 0 closed its link while rank %d waited for higher ranks to connect (it ended "
                                    "this attempt to form the group)",
                                    b->rank);
            continue;
        }
        if (st != TP_OK) {
            char missing[256] = "";
            size_t len = 0;
            for (int r = lo; r < hi && len + 16 < sizeof missing; r++)
                if (fds[r] < 0 || (b->rank == 0 && b->live_fds && b->live_fds[r] < 0))
                    len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "", r);
            return tp_error_set(err, st == TP_ERR_TIMEOUT ? TP_ERR_TIMEOUT : st,
                                "rank %d waited %u ms for rank(s) %s to connect (%s): start every rank, check that "
                                "they use the same hostfile/coordinator, world size and cluster token",
                                b->rank, b->timeout_ms, missing, e.msg);
        }
        uint8_t buf[TP_WIRE_FRAME_BYTES], bad[TP_WIRE_FRAME_BYTES];
        size_t n_bad = 0;
        uint64_t dl = tp_now_ns() + HELLO_READ_MS * 1000000ull;
        if (dl > b->deadline) dl = b->deadline;
        if (tp_sock_read_full(fd, buf, sizeof buf, dl, &e) != TP_OK) {
            char peer[96];
            tp_sock_peer_str(fd, peer, sizeof peer);
            tp_log(TP_LOG_WARN, TP_COMM_MODULE, "rank %d: dropped a connection from %s that sent no hello (%s)",
                   b->rank, peer, e.msg);
            tp_sock_close(&fd);
            continue;
        }
        struct tp_wire_frame f;
        struct tp_wire_transcript t;
        int *slots = NULL, r = -1;
        tp_wire_decode(buf, &f);
        uint32_t why = check_hello(b, &f, want_kind, lo, hi, fds, &slots, &r);
        if (why != TP_REJECT_NONE) {
            reject(b, &fd, why, buf, sizeof buf);
            continue;
        }
        why = handshake_accept(b, fd, &f, r, &t, bad, &n_bad);
        if (why == TP_REJECT_NONE && f.kind == TP_WIRE_REGISTER && (f.arg < 1 || f.arg > 65535)) why = TP_REJECT_KIND;
        if (why != TP_REJECT_NONE) {
            reject(b, &fd, why, n_bad ? bad : buf, n_bad ? n_bad : sizeof buf);
            continue;
        }
        uint8_t mac[TP_WIRE_AUTH_BYTES];
        if (tp_wire_mac(&b->key, 'A', &t, mac) != 0) {
            tp_sock_close(&fd);
            return tp_error_set(err, TP_ERR_INTERNAL, "HMAC-SHA-256 failed in libcrypto");
        }
        make_frame(b, TP_WIRE_ACCEPT, 0, mac, buf);
        if (tp_sock_write_full(fd, buf, sizeof buf, b->deadline, &e) != TP_OK) {
            tp_sock_close(&fd);
            continue;
        }
        if (slots == fds && want_kind == TP_WIRE_REGISTER) {
            b->table[r].port = (int)f.arg;
            tp_sock_peer_ip(fd, b->table[r].ip, sizeof b->table[r].ip);
            b->reg[r] = t;
        }
        slots[r] = fd;
        need--;
    }
    return TP_OK;
}

static enum tp_status connect_lower(struct boot *b, int lo, int *fds, struct tp_error *err)
{
    struct tp_wire_transcript t;
    for (int j = lo; j < b->rank; j++) {
        const int watch = j > 0 && b->rank > 0 ? fds[0] : -1; /* a worker, rank 0's link already formed */
        enum tp_status st = connect_retry(b, j, b->table[j].ip, b->table[j].port, watch, &fds[j], err);
        if (st == TP_OK) st = handshake_connect(b, fds[j], j, TP_WIRE_HELLO, TP_WIRE_CH_DATA, &t, err);
        if (st != TP_OK) return st;
    }
    return TP_OK;
}

/* A worker's liveness link to rank 0 at ip:port. */
static enum tp_status connect_liveness(struct boot *b, const char *ip, int port, struct tp_error *err)
{
    struct tp_wire_transcript t;
    enum tp_status st = connect_retry(b, 0, ip, port, -1, &b->live_fds[0], err);
    if (st == TP_OK) st = handshake_connect(b, b->live_fds[0], 0, TP_WIRE_HELLO, TP_WIRE_CH_LIVENESS, &t, err);
    return st;
}

static enum tp_status parse_hostport(const char *s, char *host, size_t cap, int *port, struct tp_error *err)
{
    const char *colon = strrchr(s, ':');
    char *end = NULL;
    long p = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == s || (size_t)(colon - s) >= cap || !end || *end || p < 1 || p > 65535)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "TP_COORDINATOR '%s' must be host:port (port 1..65535)", s);
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    *port = (int)p;
    return TP_OK;
}

static enum tp_status coordinator_root(struct boot *b, const char *host, int port, int listen_fd, int *fds,
                                      struct tp_error *err)
{
    int lfd = -1;
    enum tp_status rc = TP_OK;
    uint8_t *tab = NULL;
    if (listen_fd > 2 && tp_sock_adopt_listener(listen_fd, port) == 0) {
        lfd = listen_fd; /* inherited, already bound to the coordinator port */
        tp_log(TP_LOG_DEBUG, TP_COMM_MODULE, "coordinator: listening on inherited socket %d (port %d)", lfd, port);
    } else if ((rc = tp_sock_listen(host, port, &lfd, NULL, err)) != TP_OK) {
        return rc;
    }
    b->reg = calloc((size_t)b->size, sizeof *b->reg);
    if (!b->reg) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for the registrations");
        goto out;
    }
    TP_CHECK_GOTO(accept_ranks(b, lfd, 1, b->size, TP_WIRE_REGISTER, fds, err), rc, out);
    size_t tbytes = (size_t)b->size * TP_WIRE_ENTRY_BYTES;
    tab = calloc(1, tbytes + TP_WIRE_FRAME_BYTES);
    if (!tab) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for the address table");
        goto out;
    }
    uint8_t *entries = tab + TP_WIRE_FRAME_BYTES;
    for (int r = 0; r < b->size; r++) {
        uint8_t *e = entries + (size_t)r * TP_WIRE_ENTRY_BYTES;
        size_t iplen = TP_MIN(strlen(b->table[r].ip), (size_t)TP_WIRE_IP_BYTES - 1);
        memcpy(e, b->table[r].ip, iplen); /* NUL padded by calloc */
        e[TP_WIRE_IP_BYTES] = (uint8_t)b->table[r].port;
        e[TP_WIRE_IP_BYTES + 1] = (uint8_t)(b->table[r].port >> 8);
    }
    for (int r = 1; r < b->size && rc == TP_OK; r++) {
        uint8_t mac[TP_WIRE_AUTH_BYTES];
        if (tp_wire_table_mac(&b->key, &b->reg[r], entries, tbytes, mac) != 0) {
            rc = tp_error_set(err, TP_ERR_INTERNAL, "HMAC-SHA-256 failed in libcrypto");
            break;
        }
        make_frame(b, TP_WIRE_TABLE, (uint32_t)b->size, mac, tab);
        rc = tp_sock_write_full(fds[r], tab, tbytes + TP_WIRE_FRAME_BYTES, b->deadline, err);
    }
out:
    free(tab);
    free(b->reg);
    b->reg = NULL;
    tp_sock_close(&lfd);
    return rc;
}

static enum tp_status coordinator_member(struct boot *b, const char *chost, int cport, int *fds,
                                         struct tp_error *err)
{
    int lfd = -1, my_port = 0;
    uint8_t *tab = NULL;
    char my_ip[TP_HOST_IP_MAX];
    struct tp_wire_transcript t;
    struct tp_wire_frame reply;
    enum tp_status rc = connect_retry(b, 0, chost, cport, -1, &fds[0], err);
    if (rc != TP_OK) return rc;
    /* listen on the local address that reaches the coordinator: the address
     * the coordinator will publish for us */
    tp_sock_local_ip(fds[0], my_ip, sizeof my_ip);
    TP_CHECK_GOTO(tp_sock_listen(my_ip, 0, &lfd, &my_port, err), rc, out);
    TP_CHECK_GOTO(handshake_connect(b, fds[0], 0, TP_WIRE_REGISTER, (uint32_t)my_port, &t, err), rc, out);
    TP_CHECK_GOTO(connect_liveness(b, chost, cport, err), rc, out);
    TP_CHECK_GOTO(read_answer(b, fds[0], 0, TP_WIRE_TABLE, &reply, err), rc, out);
    if (reply.arg != (uint32_t)b->size) {
        rc = tp_error_set(err, TP_ERR_PROTOCOL, "coordinator sent a table of %u entries, want %d", reply.arg, b->size);
        goto out;
    }
    size_t tbytes = (size_t)b->size * TP_WIRE_ENTRY_BYTES;
    tab = malloc(tbytes);
    if (!tab) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for the address table");
        goto out;
    }
    TP_CHECK_GOTO(tp_sock_read_full(fds[0], tab, tbytes, b->deadline, err), rc, out);
    uint8_t mac[TP_WIRE_AUTH_BYTES];
    if (tp_wire_table_mac(&b->key, &t, tab, tbytes, mac) != 0 || !tp_wire_mac_equal(mac, reply.auth)) {
        rc = tp_error_set(err, TP_ERR_PROTOCOL,
                          "the coordinator's address table failed its MAC check (altered on the way?)");
        goto out;
    }
    for (int r = 0; r < b->size; r++) {
        const uint8_t *e = tab + (size_t)r * TP_WIRE_ENTRY_BYTES;
        if (memchr(e, '\0', TP_WIRE_IP_BYTES) == NULL) {
            rc = tp_error_set(err, TP_ERR_PROTOCOL, "coordinator's table entry %d has an unterminated address", r);
            goto out;
        }
        snprintf(b->table[r].ip, sizeof b->table[r].ip, "%s", (const char *)e);
        b->table[r].port = e[TP_WIRE_IP_BYTES] | (e[TP_WIRE_IP_BYTES + 1] << 8);
    }
    TP_CHECK_GOTO(connect_lower(b, 1, fds, err), rc, out);
    TP_CHECK_GOTO(accept_ranks(b, lfd, b->rank + 1, b->size, TP_WIRE_HELLO, fds, err), rc, out);
out:
    free(tab);
    tp_sock_close(&lfd);
    return rc;
}

/* A group listening on a non-loopback address needs a token. */
static enum tp_status check_token_needed(const char *addr, int rank, const char *token, const char *where,
                                         struct tp_error *err)
{
    if ((token && *token) || tp_sock_is_loopback(addr)) return TP_OK;
    return tp_error_set(err, TP_ERR_INVALID_ARG,
                        "%s gives rank %d the address '%s', which is not a loopback address, and no cluster token is "
                        "set: anyone who can reach that port could join the group.  Set the same secret on every "
                        "rank in TP_CLUSTER_TOKEN or the hostfile's \"cluster_token\" (make one with `openssl rand "
                        "-hex 32`; `tpserve launch` makes one for you), or use 127.0.0.1 for a one-machine group",
                        where, rank, addr);
}

enum tp_status tp_comm_check_token(const struct tp_comm_config *cfg, const struct tp_host *table, int n,
                                   const char *token, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    if (cfg->hostfile && *cfg->hostfile) {
        for (int r = 0; r < n && rc == TP_OK; r++) rc = check_token_needed(table[r].ip, r, token, "the hostfile", err);
    } else if (cfg->coordinator && *cfg->coordinator) {
        rc = check_token_needed(table[0].ip, 0, token, "TP_COORDINATOR", err);
    }
    return rc;
}

enum tp_status tp_bootstrap_tcp(const struct tp_comm_config *cfg, struct tp_net *net, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    struct tp_hostfile hf = {0};
    struct boot b = {.rank = cfg->rank, .size = cfg->world_size, .timeout_ms = cfg->connect_timeout_ms};
    b.epoch = cfg->rank == 0 ? (cfg->epoch ? cfg->epoch : 1u) : cfg->epoch;
    b.drop = cfg->rank == 0 && cfg->drop_rank > 0 && cfg->drop_rank <= cfg->world_size ? cfg->drop_rank : 0;
    b.allow_shrink = cfg->rank > 0 && cfg->allow_shrink;
    b.former_world = cfg->rank == 0 ? cfg->former_world : 0;
    int lfd = -1;
    b.deadline = tp_now_ns() + (uint64_t)cfg->connect_timeout_ms * 1000000ull;
    const char *token = cfg->cluster_token;
    char host[TP_HOST_IP_MAX];
    int port = 0;
    if (cfg->hostfile && *cfg->hostfile) {
        TP_CHECK_GOTO(tp_hostfile_load(cfg->hostfile, &hf, err), rc, out);
        /* entries dropped by earlier shrinks are not in the group: rank r is the r-th one left */
        int kept = 0;
        for (int i = 0; i < hf.n; i++)
            if (i >= 64 || !(cfg->hostfile_skip & (1ull << i))) hf.hosts[kept++] = hf.hosts[i];
        if (kept != cfg->world_size) {
            rc = tp_error_set(err, TP_ERR_INVALID_ARG, "hostfile '%s' lists %d ranks but the world size is %d",
                              cfg->hostfile, kept, cfg->world_size);
            goto out;
        }
        if ((!token || !*token) && hf.token[0]) token = hf.token;
        b.table = hf.hosts;
    } else {
        b.table = calloc((size_t)b.size, sizeof *b.table);
        if (!b.table) {
            rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for the address table");
            goto out;
        }
        if (cfg->coordinator && *cfg->coordinator) {
            TP_CHECK_GOTO(parse_hostport(cfg->coordinator, host, sizeof host, &port, err), rc, out);
            snprintf(b.table[0].ip, sizeof b.table[0].ip, "%s", host);
            b.table[0].port = port;
        }
    }
    TP_CHECK_GOTO(tp_comm_check_token(cfg, b.table, b.size, token, err), rc, out);
    b.key.bytes = (const uint8_t *)(token ? token : "");
    b.key.len = token ? strlen(token) : 0;
    if (tp_wire_group_hash(cfg->group_id, b.group) != 0) {
        rc = tp_error_set(err, TP_ERR_INTERNAL, "SHA-256 failed in libcrypto");
        goto out;
    }
    b.live_fds = net->live_fds;
    if (cfg->hostfile && *cfg->hostfile) {
        struct tp_error e = {0};
        const struct tp_host *me = &b.table[b.rank];
        if (cfg->listen_fd > 2 && tp_sock_adopt_listener(cfg->listen_fd, me->port) == 0) {
            lfd = cfg->listen_fd; /* the launcher bound it for us */
            rc = TP_OK;
            tp_log(TP_LOG_DEBUG, TP_COMM_MODULE, "rank %d: listening on inherited socket %d (port %d)", b.rank, lfd,
                   me->port);
        } else {
            rc = tp_sock_listen(me->ip, me->port, &lfd, NULL, &e);
        }
        if (rc != TP_OK) {
            rc = tp_error_set(err, rc, "rank %d (hostfile '%s' entry %d, %s:%d): %s", b.rank, cfg->hostfile, b.rank,
                              me->ip, me->port, e.msg);
            goto out;
        }
        TP_CHECK_GOTO(connect_lower(&b, 0, net->fds, err), rc, out);
        if (b.rank > 0) TP_CHECK_GOTO(connect_liveness(&b, b.table[0].ip, b.table[0].port, err), rc, out);
        TP_CHECK_GOTO(accept_ranks(&b, lfd, b.rank + 1, b.size, TP_WIRE_HELLO, net->fds, err), rc, out);
    } else if (cfg->coordinator && *cfg->coordinator) {
        if (b.rank == 0)
            TP_CHECK_GOTO(coordinator_root(&b, host, port, cfg->listen_fd, net->fds, err), rc, out);
        else
            TP_CHECK_GOTO(coordinator_member(&b, host, port, net->fds, err), rc, out);
    } else {
        rc = tp_error_set(err, TP_ERR_INVALID_ARG,
                          "world size %d needs peer addresses: set TP_HOSTFILE (see configs/README.md) or "
                          "TP_COORDINATOR=host:port, or start the ranks with 'tpserve launch'",
                          b.size);
        goto out;
    }
    for (int r = 0; r < b.size; r++)
        if (r != b.rank) TP_CHECK_GOTO(tp_sock_tune(net->fds[r], err), rc, out);
    net->rank = b.rank;
    net->size = b.size;
    net->dropped = b.drop ? b.drop : b.dropped;
    if (b.rank == 0 && (b.drop || b.former_world > b.size) && lfd >= 0) {
        net->door_fd = lfd; /* liveness.c answers left-out ranks on it */
        net->door_former = TP_MAX(b.former_world, b.size + (b.drop ? 1 : 0));
        lfd = -1;
    }
    net->epoch = b.epoch;
    TP_CHECK_GOTO(tp_live_start(net, err), rc, out);
out:
    tp_sock_close(&lfd);
    if (hf.hosts)
        tp_hostfile_free(&hf);
    else
        free(b.table);
    return rc;
}
