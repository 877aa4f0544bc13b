/*
 * comm/bootstrap.c - form the TCP full mesh of a world group.
 *
 * Two ways to learn the addresses:
 *   hostfile     every rank reads the same table (rank = entry index) and
 *                listens on its own port;
 *   coordinator  rank 0 listens on TP_COORDINATOR=host:port, every other rank
 *                listens on a free port, registers (REGISTER frame carrying
 *                that port) and receives the address table (TABLE frame);
 *                the registration connection becomes its link to rank 0.
 * Then rank i connects to every lower rank and accepts every higher one (a
 * fixed order, so there is no cycle of waits).  The connector sends HELLO;
 * the acceptor checks magic, version, world size, rank and token digest and
 * answers ACCEPT or REJECT (with a reason) before closing a bad connection.
 * Strays (port scanners, a wrong cluster) are rejected and do not count: the
 * group keeps forming.  Every wait is bounded by connect_timeout_ms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "comm_wire.h"

#define HELLO_READ_MS 3000u   /* a silent stray may hold the accept loop this long */
#define CONNECT_RETRY_MS 50u

struct boot {
    int rank, size;
    uint8_t token[TP_WIRE_TOKEN_BYTES];
    uint64_t deadline;
    uint32_t timeout_ms;
    struct tp_host *table;   /* (size) */
};

static void make_frame(const struct boot *b, uint16_t kind, uint32_t arg, uint8_t out[TP_WIRE_FRAME_BYTES])
{
    struct tp_wire_frame f = {.magic = TP_WIRE_MAGIC,
                              .version = TP_WIRE_VERSION,
                              .kind = kind,
                              .rank = (uint32_t)b->rank,
                              .world_size = (uint32_t)b->size,
                              .arg = arg};
    memcpy(f.token, b->token, TP_WIRE_TOKEN_BYTES);
    tp_wire_encode(&f, out);
}

/* Validate a peer's first frame.  Returns the reject reason or TP_REJECT_NONE. */
static uint32_t check_hello(const struct boot *b, const struct tp_wire_frame *f, uint16_t want_kind, int lo, int hi,
                            const int *have)
{
    if (f->magic != TP_WIRE_MAGIC) return TP_REJECT_MAGIC;
    if (f->version != TP_WIRE_VERSION) return TP_REJECT_VERSION;
    if (memcmp(f->token, b->token, TP_WIRE_TOKEN_BYTES) != 0) return TP_REJECT_TOKEN;
    if (f->world_size != (uint32_t)b->size) return TP_REJECT_WORLD;
    if (f->kind != want_kind) return TP_REJECT_KIND;
    if (f->rank < (uint32_t)lo || f->rank >= (uint32_t)hi) return TP_REJECT_RANK;
    if (have[f->rank] >= 0) return TP_REJECT_DUPLICATE;
    return TP_REJECT_NONE;
}

/* Connect to `peer` at ip:port, retrying while it is not listening yet. */
static enum tp_status connect_retry(const struct boot *b, int peer, const char *ip, int port, int *fd_out,
                                    struct tp_error *err)
{
    struct tp_error last = {0};
    for (;;) {
        int refused = 0;
        tp_error_clear(&last);
        enum tp_status st = tp_sock_connect(ip, port, b->deadline, fd_out, &refused, &last);
        if (st == TP_OK) return TP_OK;
        if (st == TP_ERR_INVALID_ARG) return tp_error_set(err, st, "%s", last.msg);
        if (tp_now_ns() + CONNECT_RETRY_MS * 1000000ull >= b->deadline)
            return tp_error_set(err, TP_ERR_TIMEOUT,
                                "rank %d could not reach rank %d at %s:%d within %u ms (last error: %s): is that rank "
                                "running, is the address right, does a firewall block the port?",
                                b->rank, peer, ip, port, b->timeout_ms, last.msg);
        tp_sleep_ms(CONNECT_RETRY_MS);
    }
}

/* Send our first frame on fd and read the answer (ACCEPT, REJECT or TABLE). */
static enum tp_status say_hello(const struct boot *b, int fd, int peer, uint16_t kind, uint32_t arg,
                                struct tp_wire_frame *reply, struct tp_error *err)
{
    uint8_t buf[TP_WIRE_FRAME_BYTES];
    struct tp_error e = {0};
    make_frame(b, kind, arg, buf);
    enum tp_status st = tp_sock_write_full(fd, buf, sizeof buf, b->deadline, &e);
    if (st == TP_OK) st = tp_sock_read_full(fd, buf, sizeof buf, b->deadline, &e);
    if (st != TP_OK)
        return tp_error_set(err, st, "hello exchange with rank %d failed: %s (is that rank part of this group?)", peer,
                            e.msg);
    tp_wire_decode(buf, reply);
    if (reply->magic != TP_WIRE_MAGIC)
        return tp_error_set(err, TP_ERR_PROTOCOL, "rank %d's address answered with something that is not tpserve comm",
                            peer);
    if (reply->kind == TP_WIRE_REJECT)
        return tp_error_set(err, TP_ERR_PROTOCOL, "rank %d rejected rank %d: %s", peer, b->rank,
                            tp_wire_reject_str(reply->arg));
    if (reply->version != TP_WIRE_VERSION || reply->rank != (uint32_t)peer ||
        reply->world_size != (uint32_t)b->size ||
        memcmp(reply->token, b->token, TP_WIRE_TOKEN_BYTES) != 0)
        return tp_error_set(err, TP_ERR_PROTOCOL,
                            "the process at rank %d's address answered as rank %u of %u with another token or "
                            "version: two clusters share a port?",
                            peer, reply->rank, reply->world_size);
    return TP_OK;
}

/* Accept until every rank in [lo, hi) has a link in fds (HELLO frames with
 * kind want_kind).  REGISTER mode also records the peer's address. */
static enum tp_status accept_ranks(const struct boot *b, int lfd, int lo, int hi, uint16_t want_kind, int *fds,
                                   struct tp_error *err)
{
    int need = 0;
    for (int r = lo; r < hi; r++) need += fds[r] < 0;
    while (need > 0) {
        int fd = -1;
        struct tp_error e = {0};
        enum tp_status st = tp_sock_accept(lfd, b->deadline, &fd, &e);
        if (st != TP_OK) {
            char missing[256] = "";
            size_t len = 0;
            for (int r = lo; r < hi && len + 16 < sizeof missing; r++)
                if (fds[r] < 0) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "", r);
            return tp_error_set(err, st == TP_ERR_TIMEOUT ? TP_ERR_TIMEOUT : st,
                                "rank %d waited %u ms for rank(s) %s to connect (%s): start every rank, check that "
                                "they use the same hostfile/coordinator and world size",
                                b->rank, b->timeout_ms, missing, e.msg);
        }
        uint8_t buf[TP_WIRE_FRAME_BYTES];
        uint64_t dl = tp_now_ns() + HELLO_READ_MS * 1000000ull;
        if (dl > b->deadline) dl = b->deadline;
        if (tp_sock_read_full(fd, buf, sizeof buf, dl, &e) != TP_OK) {
            tp_log(TP_LOG_WARN, TP_COMM_MODULE, "rank %d: dropped a connection that sent no hello (%s)", b->rank,
                   e.msg);
            tp_sock_close(&fd);
            continue;
        }
        struct tp_wire_frame f;
        tp_wire_decode(buf, &f);
        uint32_t why = check_hello(b, &f, want_kind, lo, hi, fds);
        if (why != TP_REJECT_NONE) {
            tp_log(TP_LOG_WARN, TP_COMM_MODULE, "rank %d: rejected a connection: %s", b->rank, tp_wire_reject_str(why));
            make_frame(b, TP_WIRE_REJECT, why, buf);
            (void)tp_sock_write_full(fd, buf, sizeof buf, tp_now_ns() + 200000000ull, &e);
            tp_sock_close(&fd);
            continue;
        }
        int r = (int)f.rank;
        if (want_kind == TP_WIRE_REGISTER) {
            if (f.arg < 1 || f.arg > 65535) {
                make_frame(b, TP_WIRE_REJECT, TP_REJECT_KIND, buf);
                (void)tp_sock_write_full(fd, buf, sizeof buf, tp_now_ns() + 200000000ull, &e);
                tp_sock_close(&fd);
                continue;
            }
            b->table[r].port = (int)f.arg;
            tp_sock_peer_ip(fd, b->table[r].ip, sizeof b->table[r].ip);
        } else {
            make_frame(b, TP_WIRE_ACCEPT, 0, buf);
            if (tp_sock_write_full(fd, buf, sizeof buf, b->deadline, &e) != TP_OK) {
                tp_sock_close(&fd);
                continue;
            }
        }
        fds[r] = fd;
        need--;
    }
    return TP_OK;
}

static enum tp_status connect_lower(const struct boot *b, int lo, int *fds, struct tp_error *err)
{
    for (int j = lo; j < b->rank; j++) {
        struct tp_wire_frame reply;
        enum tp_status st = connect_retry(b, j, b->table[j].ip, b->table[j].port, &fds[j], err);
        if (st == TP_OK) st = say_hello(b, fds[j], j, TP_WIRE_HELLO, 0, &reply, err);
        if (st != TP_OK) return st;
        if (reply.kind != TP_WIRE_ACCEPT)
            return tp_error_set(err, TP_ERR_PROTOCOL, "rank %d answered our hello with frame kind %u", j, reply.kind);
    }
    return TP_OK;
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

static enum tp_status coordinator_root(struct boot *b, int port, int listen_fd, int *fds, struct tp_error *err)
{
    int lfd = -1;
    enum tp_status rc = TP_OK;
    if (listen_fd > 2 && tp_sock_adopt_listener(listen_fd, port) == 0) {
        lfd = listen_fd; /* inherited, already bound to the coordinator port */
        tp_log(TP_LOG_DEBUG, TP_COMM_MODULE, "coordinator: listening on inherited socket %d (port %d)", lfd, port);
    } else if ((rc = tp_sock_listen(NULL, port, &lfd, NULL, err)) != TP_OK) {
        return rc;
    }
    TP_CHECK_GOTO(accept_ranks(b, lfd, 1, b->size, TP_WIRE_REGISTER, fds, err), rc, out);
    size_t tbytes = (size_t)b->size * TP_WIRE_ENTRY_BYTES;
    uint8_t *tab = calloc(1, tbytes + TP_WIRE_FRAME_BYTES);
    if (!tab) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for the address table");
        goto out;
    }
    make_frame(b, TP_WIRE_TABLE, (uint32_t)b->size, tab);
    for (int r = 0; r < b->size; r++) {
        uint8_t *e = tab + TP_WIRE_FRAME_BYTES + (size_t)r * TP_WIRE_ENTRY_BYTES;
        size_t iplen = TP_MIN(strlen(b->table[r].ip), (size_t)TP_WIRE_IP_BYTES - 1);
        memcpy(e, b->table[r].ip, iplen); /* NUL padded by calloc */
        e[TP_WIRE_IP_BYTES] = (uint8_t)b->table[r].port;
        e[TP_WIRE_IP_BYTES + 1] = (uint8_t)(b->table[r].port >> 8);
    }
    for (int r = 1; r < b->size && rc == TP_OK; r++)
        rc = tp_sock_write_full(fds[r], tab, tbytes + TP_WIRE_FRAME_BYTES, b->deadline, err);
    free(tab);
out:
    tp_sock_close(&lfd);
    return rc;
}

static enum tp_status coordinator_member(struct boot *b, const char *chost, int cport, int *fds,
                                         struct tp_error *err)
{
    int lfd = -1, my_port = 0;
    uint8_t *tab = NULL;
    enum tp_status rc = tp_sock_listen(NULL, 0, &lfd, &my_port, err);
    if (rc != TP_OK) return rc;
    struct tp_wire_frame reply;
    TP_CHECK_GOTO(connect_retry(b, 0, chost, cport, &fds[0], err), rc, out);
    TP_CHECK_GOTO(say_hello(b, fds[0], 0, TP_WIRE_REGISTER, (uint32_t)my_port, &reply, err), rc, out);
    if (reply.kind != TP_WIRE_TABLE || reply.arg != (uint32_t)b->size) {
        rc = tp_error_set(err, TP_ERR_PROTOCOL, "coordinator sent frame kind %u with %u entries, want a table of %d",
                          reply.kind, reply.arg, b->size);
        goto out;
    }
    size_t tbytes = (size_t)b->size * TP_WIRE_ENTRY_BYTES;
    tab = malloc(tbytes);
    if (!tab) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for the address table");
        goto out;
    }
    TP_CHECK_GOTO(tp_sock_read_full(fds[0], tab, tbytes, b->deadline, err), rc, out);
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

enum tp_status tp_bootstrap_tcp(const struct tp_comm_config *cfg, struct tp_net *net, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    struct tp_hostfile hf = {0};
    struct boot b = {.rank = cfg->rank, .size = cfg->world_size, .timeout_ms = cfg->connect_timeout_ms};
    int lfd = -1;
    b.deadline = tp_now_ns() + (uint64_t)cfg->connect_timeout_ms * 1000000ull;
    const char *token = cfg->cluster_token;
    if (cfg->hostfile && *cfg->hostfile) {
        TP_CHECK_GOTO(tp_hostfile_load(cfg->hostfile, &hf, err), rc, out);
        if (hf.n != cfg->world_size) {
            rc = tp_error_set(err, TP_ERR_INVALID_ARG, "hostfile '%s' lists %d ranks but the world size is %d",
                              cfg->hostfile, hf.n, cfg->world_size);
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
    }
    tp_wire_token_digest(token, b.token);
    if (cfg->hostfile && *cfg->hostfile) {
        struct tp_error e = {0};
        if (cfg->listen_fd > 2 && tp_sock_adopt_listener(cfg->listen_fd, b.table[b.rank].port) == 0) {
            lfd = cfg->listen_fd; /* the launcher bound it for us */
            rc = TP_OK;
            tp_log(TP_LOG_DEBUG, TP_COMM_MODULE, "rank %d: listening on inherited socket %d (port %d)", b.rank, lfd,
                   b.table[b.rank].port);
        } else {
            rc = tp_sock_listen(NULL, b.table[b.rank].port, &lfd, NULL, &e);
        }
        if (rc != TP_OK) {
            rc = tp_error_set(err, rc, "rank %d (hostfile '%s' entry %d): %s", b.rank, cfg->hostfile, b.rank, e.msg);
            goto out;
        }
        TP_CHECK_GOTO(connect_lower(&b, 0, net->fds, err), rc, out);
        TP_CHECK_GOTO(accept_ranks(&b, lfd, b.rank + 1, b.size, TP_WIRE_HELLO, net->fds, err), rc, out);
    } else if (cfg->coordinator && *cfg->coordinator) {
        char host[TP_HOST_IP_MAX];
        int port = 0;
        TP_CHECK_GOTO(parse_hostport(cfg->coordinator, host, sizeof host, &port, err), rc, out);
        snprintf(b.table[0].ip, sizeof b.table[0].ip, "%s", host);
        b.table[0].port = port;
        if (b.rank == 0)
            TP_CHECK_GOTO(coordinator_root(&b, port, cfg->listen_fd, net->fds, err), rc, out);
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
out:
    tp_sock_close(&lfd);
    if (hf.hosts)
        tp_hostfile_free(&hf);
    else
        free(b.table);
    return rc;
}
