/*
 * comm/tcp.c - the TCP transport: moves bytes on the per-peer links of a net
 * (one non-blocking, TCP_NODELAY socket per pair of ranks, formed by
 * bootstrap.c).
 *
 * tcp_xfer() drives all pending sends and receives of one algorithm step
 * together: it tries every transfer until the kernel says EAGAIN, then, after
 * a short spin (small collectives finish within microseconds on a quiet
 * link, and a poll() sleep/wake costs more than that), sleeps in poll() on
 * exactly the sockets still pending plus the abort self-pipe.  A 0-byte read
 * is a lost peer; EINTR is retried; SIGPIPE is suppressed per send
 * (MSG_NOSIGNAL) or per socket (SO_NOSIGPIPE).  A wait fails with
 * TP_ERR_TIMEOUT after op_timeout_ms without any progress.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#include "comm_impl.h"
#include "comm_wire.h"

#define TCP_SPIN_NS 50000u      /* busy-poll this long after the last progress, */
#define TCP_YIELD_NS 2000000u   /* then poll + sched_yield() this long, then sleep in poll() */
#define TCP_POLL_SLICE_MS 200   /* upper bound of one poll() sleep */
#define TCP_MAX_XFER (2 * TP_ALGO_MAX_RANKS)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ __volatile__("pause");
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Advance one transfer until done or EAGAIN.  Returns 1 on progress, 0 on
 * none, -1 on a failed link (err set). */
static int step_one(struct tp_net *net, struct tp_xfer *x, struct tp_error *err)
{
    int fd = net->fds[x->peer];
    int progressed = 0;
    while (x->done < x->bytes) {
        ssize_t r;
        unsigned char *p = (unsigned char *)x->buf + x->done;
        size_t left = x->bytes - x->done;
        if (x->is_send)
            r = send(fd, p, left, tp_sock_send_flags());
        else
            r = recv(fd, p, left, 0);
        if (r > 0) {
            x->done += (size_t)r;
            progressed = 1;
            continue;
        }
        if (r == 0 && !x->is_send) {
            tp_error_set(err, TP_ERR_PEER, "rank %d closed its connection (it exited, crashed or failed)", x->peer);
            return -1;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        tp_error_set(err, TP_ERR_PEER, "link to rank %d failed while %s: %s", x->peer,
                     x->is_send ? "sending" : "receiving", r < 0 ? strerror(errno) : "send returned 0");
        return -1;
    }
    return progressed;
}

/* tp_comm_config.sim_latency_us: a step that sends anything waits that long first (on the abort
 * self-pipe, so tp_comm_abort still ends it at once). */
static void sim_latency(struct tp_net *net, const struct tp_xfer *x, int n)
{
    int sends = 0;
    for (int i = 0; i < n; i++) sends |= x[i].is_send && x[i].bytes > 0;
    if (!sends) return;
    const uint64_t until = tp_now_ns() + (uint64_t)net->sim_latency_us * 1000u;
    for (uint64_t now = tp_now_ns(); now < until && !atomic_load(&net->poisoned); now = tp_now_ns()) {
        struct pollfd p = {.fd = net->wake_rd, .events = POLLIN, .revents = 0};
        const uint64_t left_us = (until - now) / 1000u;
        if (left_us >= 1000) (void)poll(&p, 1, (int)(left_us / 1000));
        else cpu_relax();
    }
}

static enum tp_status tcp_xfer(struct tp_net *net, struct tp_xfer *x, int n, struct tp_error *err)
{
    struct pollfd pfd[TCP_MAX_XFER + 1];
    if (n > TCP_MAX_XFER) return tp_error_set(err, TP_ERR_INTERNAL, "too many transfers in one step (%d)", n);
    if (net->sim_latency_us) sim_latency(net, x, n);
    uint64_t last = tp_now_ns();
    const uint64_t idle_ns = (uint64_t)net->op_timeout_ms * 1000000u;
    for (;;) {
        int pending = 0, progressed = 0;
        for (int i = 0; i < n; i++) {
            if (x[i].done >= x[i].bytes) continue;
            if (tp_xfer_blocked(x, i)) {
                pending += !x[i].optional;
                continue;
            }
            int r = step_one(net, &x[i], err);
            if (r < 0 && atomic_load_explicit(&net->poisoned, memory_order_acquire))
                return tp_error_force(err, TP_ERR_POISONED, "aborted: %s", tp_error_msg(&net->err));
            if (r < 0) return err->status;
            progressed |= r;
            if (x[i].done < x[i].bytes && !x[i].optional) pending++;
        }
        if (!pending) return TP_OK;
        if (atomic_load_explicit(&net->poisoned, memory_order_acquire))
            return tp_error_set(err, TP_ERR_POISONED, "aborted: %s", tp_error_msg(&net->err));
        uint64_t now = tp_now_ns();
        if (progressed) last = now;
        if (now - last < TCP_SPIN_NS) {
            for (int k = 0; k < 32; k++) cpu_relax();
            continue;
        }
        if (now - last < TCP_YIELD_NS) {
            sched_yield(); /* let a rank sharing this core produce our data */
            continue;
        }
        if (now - last >= idle_ns) {
            return tp_net_timeout_error(net, x, n, err);
        }
        int np = 0;
        for (int i = 0; i < n; i++) {
            if (x[i].done >= x[i].bytes || tp_xfer_blocked(x, i)) continue;
            pfd[np].fd = net->fds[x[i].peer];
            pfd[np].events = x[i].is_send ? POLLOUT : POLLIN;
            pfd[np].revents = 0;
            np++;
        }
        pfd[np].fd = net->wake_rd;
        pfd[np].events = POLLIN;
        pfd[np].revents = 0;
        np++;
        uint64_t left_ms = (idle_ns - (now - last)) / 1000000u + 1;
        int to = left_ms < TCP_POLL_SLICE_MS ? (int)left_ms : TCP_POLL_SLICE_MS;
        int r = poll(pfd, (nfds_t)np, to);
        if (r < 0 && errno != EINTR) return tp_error_set(err, TP_ERR_IO, "poll failed: %s", strerror(errno));
        atomic_fetch_add_explicit(&net->n_sleeps, 1, memory_order_relaxed);
        if (r == 0) atomic_fetch_add_explicit(&net->n_sleeps_full, 1, memory_order_relaxed);
    }
}

static void tcp_shutdown(struct tp_net *net)
{
    for (int i = 0; i < net->size; i++)
        if (net->fds[i] >= 0) shutdown(net->fds[i], SHUT_RDWR);
}

static void tcp_destroy(struct tp_net *net)
{
    for (int i = 0; i < net->size; i++) tp_sock_close(&net->fds[i]);
}

static const struct tp_transport_ops tcp_ops = {
    .name = "tcp",
    .xfer = tcp_xfer,
    .shutdown = tcp_shutdown,
    .destroy = tcp_destroy,
};

enum tp_status tp_tcp_net_create(int rank, int size, uint32_t op_timeout_ms, struct tp_net **out,
                                 struct tp_error *err)
{
    *out = NULL;
    struct tp_net *net = calloc(1, sizeof *net);
    if (!net) return tp_error_set(err, TP_ERR_NOMEM, "out of memory for the network state");
    net->fds = malloc((size_t)size * sizeof(int));
    net->live_fds = malloc((size_t)size * sizeof(int));
    int pfds[2] = {-1, -1};
    if (!net->fds || !net->live_fds || pipe(pfds) != 0) {
        free(net->fds);
        free(net->live_fds);
        free(net);
        return tp_error_set(err, TP_ERR_NOMEM, "cannot allocate network state (fds or self-pipe)");
    }
    for (int i = 0; i < size; i++) net->fds[i] = net->live_fds[i] = -1;
    for (int i = 0; i < 2; i++) {
        fcntl(pfds[i], F_SETFL, fcntl(pfds[i], F_GETFL, 0) | O_NONBLOCK);
        fcntl(pfds[i], F_SETFD, FD_CLOEXEC);
    }
    atomic_init(&net->refs, 1);
    atomic_init(&net->poisoned, 0);
    atomic_init(&net->n_sleeps, 0);
    atomic_init(&net->n_sleeps_full, 0);
    atomic_init(&net->err_claimed, 0);
    net->rank = rank;
    net->size = size;
    net->door_fd = -1;
    net->tops = &tcp_ops;
    net->wake_rd = pfds[0];
    net->wake_wr = pfds[1];
    net->op_timeout_ms = op_timeout_ms;
    *out = net;
    return TP_OK;
}

enum tp_status tp_net_timeout_error(const struct tp_net *net, const struct tp_xfer *x, int n, struct tp_error *err)
{
    int who = 0;
    for (int i = 0; i < n; i++)
        if (x[i].done < x[i].bytes && !x[i].optional) {
            who = i;
            break;
        }
    return tp_error_set(err, TP_ERR_TIMEOUT,
                        "timed out after %u ms without progress %s rank %d (is it stopped or overloaded? "
                        "raise TP_COMM_TIMEOUT_MS if it is just slow)",
                        net->op_timeout_ms, x[who].is_send ? "sending to" : "receiving from", x[who].peer);
}

void tp_net_wake(struct tp_net *net)
{
    char b = 1;
    ssize_t r = write(net->wake_wr, &b, 1); /* async-signal-safe; full pipe is fine */
    (void)r;
}

void tp_net_poison(struct tp_net *net, enum tp_status st, const char *msg)
{
    if (!net) return;
    if (atomic_exchange(&net->err_claimed, 1) == 0) {
        net->err.status = st;
        snprintf(net->err.msg, sizeof net->err.msg, "%s", msg);
    }
    if (atomic_exchange(&net->poisoned, 1) == 0) {
        tp_net_wake(net);
        if (net->tops && net->tops->shutdown) net->tops->shutdown(net);
    }
}

void tp_net_release(struct tp_net *net)
{
    if (!net) return;
    if (atomic_fetch_sub(&net->refs, 1) != 1) return;
    tp_live_stop(net);
    if (net->tops && net->tops->destroy) net->tops->destroy(net);
    if (net->door_fd >= 0) close(net->door_fd);
    if (net->wake_rd >= 0) close(net->wake_rd);
    if (net->wake_wr >= 0) close(net->wake_wr);
    free(net->fds);
    free(net->live_fds);
    free(net);
}
