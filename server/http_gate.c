/*
 * server/http_gate.c - the listening socket and the gate in front of
 * libmicrohttpd: a new connection waits here (a descriptor, no thread) until
 * its first header block is complete, then goes to MHD, which parses the
 * same bytes (the gate only peeks, MSG_PEEK with SO_RCVLOWAT).  It enforces
 * the header deadline, the per-address cap and the connection limit for
 * waiting connections, and answers the header-block errors MHD 0.9.75 would
 * answer with a doubled status line.  A refused connection's rest is read
 * and dropped (64 KiB, 1 s) so that the close does not reset it under the
 * answer.  docs/http.md ("Connections", "Framing").
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http_impl.h"

#define GATE_HEADER_MAX (32 * 1024) /* a header block must fit in this many bytes (else 431) */
#define GATE_DRAIN_MAX (64 * 1024)
#define GATE_DRAIN_NS (1000000000ull)

struct pend {
    int fd;
    struct sockaddr_in addr;
    uint64_t t0_ns;   /* accepted (waiting) or answered (closing) */
    size_t peeked;    /* bytes seen so far */
    size_t drained;   /* closing: bytes read and dropped */
    int closing;      /* answered; draining until close */
};

struct tp_http_gate {
    struct tp_server *s;
    int listen_fd;
    int wake[2];
    pthread_t th;
    int started;
    struct pend *p;   /* (cap) */
    int n, cap;
    struct pollfd *pf; /* (cap + 2) */
    char buf[GATE_HEADER_MAX];
};

static void pend_remove(struct tp_http_gate *g, int i, int close_fd)
{
    if (close_fd) close(g->p[i].fd);
    g->p[i] = g->p[--g->n];
}

/* Offset just past the blank line that ends the header block in b[0..n), or 0. */
static size_t header_end(const char *b, size_t n)
{
    size_t i = 0;
    while (i < n && (b[i] == '\r' || b[i] == '\n')) i++; /* empty lines before the request line */
    for (; i < n; i++) {
        if (b[i] != '\n') continue;
        if (i + 1 < n && b[i + 1] == '\n') return i + 2;
        if (i + 2 < n && b[i + 1] == '\r' && b[i + 2] == '\n') return i + 3;
    }
    return 0;
}

/*
 * The checks MHD 0.9.75 would answer with a doubled status line.  Returns
 * TP_OK, or with e filled TP_ERR_FORMAT (bad Content-Length, no Host) or
 * TP_ERR_TOO_LARGE (a Content-Length of over 19 digits).
 */
static enum tp_status check_header_block(const char *b, size_t n, size_t max_body, struct tp_api_error *e)
{
    size_t i = 0;
    while (i < n && (b[i] == '\r' || b[i] == '\n')) i++;
    const char *line = b + i, *end = b + n;
    const char *eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol) return TP_OK;
    int http11 = eol - line >= 8 && memcmp(eol - ((eol > line && eol[-1] == '\r') ? 9 : 8), "HTTP/1.1", 8) == 0;
    int has_host = 0;
    for (line = eol + 1; line < end; line = eol + 1) {
        eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) break;
        const char *le = eol > line && eol[-1] == '\r' ? eol - 1 : eol;
        if (le == line) break; /* the blank line */
        const char *colon = memchr(line, ':', (size_t)(le - line));
        if (!colon) continue;
        size_t kl = (size_t)(colon - line);
        const char *v = colon + 1, *ve = le;
        while (v < ve && (*v == ' ' || *v == '\t')) v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        if (kl == 4 && strncasecmp(line, "Host", 4) == 0) has_host = 1;
        if (kl != 14 || strncasecmp(line, "Content-Length", 14) != 0) continue;
        int digits = ve > v;
        for (const char *q = v; digits && q < ve; q++) digits = *q >= '0' && *q <= '9';
        if (!digits)
            return tp_api_err(e, TP_ERR_FORMAT, NULL, "Content-Length '%.*s' is not a decimal byte count",
                              (int)TP_MIN(ve - v, 32), v);
        if (ve - v > 19)
            return tp_api_err(e, TP_ERR_TOO_LARGE, NULL,
                              "Content-Length %.*s... exceeds the limit of %zu bytes (--max-body)", 24, v, max_body);
    }
    if (http11 && !has_host) return tp_api_err(e, TP_ERR_FORMAT, NULL, "an HTTP/1.1 request needs a Host header");
    return TP_OK;
}

/* Answer e on p's socket (non-blocking: the answer fits the socket buffer) and start draining it. */
static void gate_refuse(struct tp_http_gate *g, struct pend *p, const struct tp_api_error *e)
{
    tp_http_refuse_fd(g->s, p->fd, e, 0);
    shutdown(p->fd, SHUT_WR);
    int one = 1;
    setsockopt(p->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    p->closing = 1;
    p->t0_ns = tp_now_ns();
}

/* What becomes of a waiting connection after a read. */
enum gate_next {
    GATE_WAIT,   /* keep it waiting */
    GATE_HANDED, /* handed to MHD: drop the entry, the socket is MHD's */
    GATE_CLOSE,  /* close it */
};

/* p is readable: read and decide. */
static enum gate_next gate_read(struct tp_http_gate *g, struct pend *p)
{
    if (p->closing) {
        ssize_t n = recv(p->fd, g->buf, sizeof g->buf, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return GATE_WAIT;
        if (n <= 0) return GATE_CLOSE;
        p->drained += (size_t)n;
        return p->drained >= GATE_DRAIN_MAX ? GATE_CLOSE : GATE_WAIT;
    }
    ssize_t n = recv(p->fd, g->buf, sizeof g->buf, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return GATE_WAIT;
    /* nothing, or nothing new although poll said readable: the client closed its side mid-header */
    if (n <= 0 || (size_t)n == p->peeked) return GATE_CLOSE;
    p->peeked = (size_t)n;
    size_t he = header_end(g->buf, (size_t)n);
    struct tp_api_error e;
    if (!he) {
        if ((size_t)n == sizeof g->buf) {
            tp_api_err(&e, TP_ERR_PROTOCOL, NULL, "the request header block exceeds %d bytes", GATE_HEADER_MAX);
            gate_refuse(g, p, &e);
            return GATE_WAIT;
        }
        int lowat = (int)n + 1;
        setsockopt(p->fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat);
        return GATE_WAIT;
    }
    if (check_header_block(g->buf, he, g->s->cfg.max_body_bytes, &e) != TP_OK) {
        gate_refuse(g, p, &e);
        return GATE_WAIT;
    }
    int one = 1;
    setsockopt(p->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    /* MHD owns the socket from here, and closes it if it cannot take it */
    MHD_add_connection(g->s->daemon, p->fd, (const struct sockaddr *)&p->addr, sizeof p->addr);
    return GATE_HANDED;
}

static void gate_accept(struct tp_http_gate *g, uint64_t now)
{
    struct tp_server *s = g->s;
    for (;;) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        int fd = accept(g->listen_fd, (struct sockaddr *)&a, &al);
        if (fd < 0) {
            /* out of descriptors: the rest wait in the backlog; pause so poll does not spin on it */
            if (errno == EMFILE || errno == ENFILE) tp_sleep_ms(50);
            return;
        }
        if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
            close(fd);
            continue;
        }
        int same = 0;
        for (int i = 0; i < g->n; i++)
            if (!g->p[i].closing && g->p[i].addr.sin_addr.s_addr == a.sin_addr.s_addr) same++;
        if (same >= s->cfg.max_conn_per_ip) {
            close(fd);
            continue;
        }
        if (g->n == g->cap) {
            /* full: the connection that has waited longest for its headers (or a closing one) goes */
            int victim = 0;
            for (int i = 1; i < g->n; i++)
                if (g->p[i].closing > g->p[victim].closing ||
                    (g->p[i].closing == g->p[victim].closing && g->p[i].t0_ns < g->p[victim].t0_ns))
                    victim = i;
            pend_remove(g, victim, 1);
        }
        struct pend *p = &g->p[g->n++];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->addr = a;
        p->t0_ns = now;
    }
}

static void *gate_main(void *arg)
{
    struct tp_http_gate *g = arg;
    const uint64_t hdr_ns = (uint64_t)g->s->cfg.header_timeout_s * 1000000000u;
    for (;;) {
        int np = 0;
        g->pf[np++] = (struct pollfd){.fd = g->wake[0], .events = POLLIN};
        g->pf[np++] = (struct pollfd){.fd = g->listen_fd, .events = POLLIN};
        for (int i = 0; i < g->n; i++) g->pf[np++] = (struct pollfd){.fd = g->p[i].fd, .events = POLLIN};
        int rc = poll(g->pf, (nfds_t)np, 200);
        if (rc < 0 && errno != EINTR) {
            tp_log(TP_LOG_ERROR, "http", "poll in the connection gate failed: %s", strerror(errno));
            tp_sleep_ms(100);
            continue;
        }
        if (rc > 0 && g->pf[0].revents) break;
        uint64_t now = tp_now_ns();
        int n_late = 0;
        /* backwards: removing i moves the last entry (already handled) into its place */
        for (int i = g->n - 1; i >= 0; i--) {
            struct pend *p = &g->p[i];
            short re = rc > 0 ? g->pf[2 + i].revents : 0;
            if (re) {
                enum gate_next next = gate_read(g, p);
                if (next == GATE_CLOSE) pend_remove(g, i, 1);
                else if (next == GATE_HANDED) pend_remove(g, i, 0);
                continue;
            }
            if (p->closing ? now - p->t0_ns > GATE_DRAIN_NS : (hdr_ns && now - p->t0_ns > hdr_ns)) {
                n_late += !p->closing;
                pend_remove(g, i, 1);
            }
        }
        if (n_late)
            tp_log(TP_LOG_INFO, "http", "closed %d connection(s) that sent no complete header block within %u s",
                   n_late, g->s->cfg.header_timeout_s);
        if (rc > 0 && (g->pf[1].revents & POLLIN)) gate_accept(g, now);
    }
    return NULL;
}

enum tp_status tp_http_gate_start(struct tp_server *s, const struct sockaddr_in *sa, struct tp_error *err)
{
    struct tp_http_gate *g = calloc(1, sizeof *g);
    if (!g) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    g->s = s;
    g->wake[0] = g->wake[1] = g->listen_fd = -1;
    g->cap = s->cfg.max_connections;
    g->p = calloc((size_t)g->cap, sizeof *g->p);
    g->pf = calloc((size_t)g->cap + 2, sizeof *g->pf);
    s->gate = g;
    if (!g->p || !g->pf) return tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    if (pipe(g->wake) != 0) return tp_error_set(err, TP_ERR_IO, "pipe: %s", strerror(errno));
    g->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (g->listen_fd < 0) return tp_error_set(err, TP_ERR_IO, "socket: %s", strerror(errno));
    fcntl(g->listen_fd, F_SETFL, fcntl(g->listen_fd, F_GETFL) | O_NONBLOCK);
    fcntl(g->listen_fd, F_SETFD, FD_CLOEXEC);
    int one = 1;
    setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(g->listen_fd, (const struct sockaddr *)sa, sizeof *sa) != 0 || listen(g->listen_fd, 511) != 0)
        return tp_error_set(err, TP_ERR_IO, "%s", strerror(errno));
    struct sockaddr_in bound;
    socklen_t bl = sizeof bound;
    if (getsockname(g->listen_fd, (struct sockaddr *)&bound, &bl) != 0)
        return tp_error_set(err, TP_ERR_IO, "getsockname: %s", strerror(errno));
    s->port = ntohs(bound.sin_port);
    if (pthread_create(&g->th, NULL, gate_main, g) != 0)
        return tp_error_set(err, TP_ERR_IO, "could not start the connection gate thread");
    g->started = 1;
    return TP_OK;
}

void tp_http_gate_stop(struct tp_server *s)
{
    struct tp_http_gate *g = s->gate;
    if (!g) return;
    if (g->started) {
        char ch = 1;
        ssize_t n = write(g->wake[1], &ch, 1);
        (void)n;
        pthread_join(g->th, NULL);
    }
    for (int i = 0; i < g->n; i++) close(g->p[i].fd);
    if (g->listen_fd >= 0) close(g->listen_fd);
    if (g->wake[0] >= 0) close(g->wake[0]);
    if (g->wake[1] >= 0) close(g->wake[1]);
    free(g->p);
    free(g->pf);
    free(g);
    s->gate = NULL;
}
