/*
 * comm/shm.c - the shared-memory transport of the ring backend, for groups
 * whose ranks all run on one host (cfg.shm / TP_COMM_SHM=1).
 *
 * After the TCP mesh has formed (it stays as the side channel), the ranks
 * compare host identities over it; if they all match, rank 0 creates one
 * POSIX shared-memory segment holding a byte ring per ordered pair of ranks,
 * sends its name to every rank, everyone maps it and rank 0 unlinks it once
 * all have (nothing is left behind even after a crash).  Each ring is a
 * single-producer single-consumer byte stream (head written by the sender,
 * tail by the receiver, acquire/release atomics), so the collective
 * algorithms in algo.c run unchanged on it.  Waiting: spin, then
 * sched_yield(), then poll() on the TCP side channel, which the peer rings
 * with a byte when it moves a ring that a sleeper waits on (the ring's
 * rx_sleep / tx_sleep flag), and which also shows a dead peer (EOF) and the
 * abort self-pipe.  A wait without
 * progress ends after the op timeout, as on TCP.
 *
 * When the ranks are not all on one host the TCP transport stays in use.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm_impl.h"
#include "comm_wire.h"

#define SHM_RING_BYTES (1u << 20) /* per ordered pair; power of two */
#define SHM_SPIN_NS 50000u
#define SHM_YIELD_NS 2000000u
#define SHM_SLEEP_MS 20 /* longest poll() sleep: a doorbell ends it at once */
#define SHM_NAME_BYTES 32

struct shm_ring {
    _Alignas(64) atomic_uint_fast64_t head; /* bytes written (sender) */
    _Alignas(64) atomic_uint_fast64_t tail; /* bytes read (receiver) */
    /* 1 while the receiver (rx) waiting for bytes or the sender (tx) waiting for space sleeps in poll():
     * the other side, after moving head or tail, clears it and rings the side channel (doorbell). */
    _Alignas(64) atomic_uint rx_sleep;
    _Alignas(64) atomic_uint tx_sleep;
    _Alignas(64) unsigned char data[SHM_RING_BYTES];
};

struct shm_state {
    void *base;
    size_t bytes;
    int n;
};

static struct shm_ring *ring(struct tp_net *net, int src, int dst)
{
    struct shm_state *st = net->impl;
    return (struct shm_ring *)st->base + (size_t)src * (size_t)st->n + (size_t)dst;
}

/* Wake `peer` if it sleeps on ring r's flag f: one byte on the TCP side channel, which its poll()
 * watches.  The flag was set before the sleeper's last look at the ring, and head / tail were moved
 * before this look at the flag (both sequentially consistent), so either the sleeper saw the move or
 * this sees the flag.  A full socket buffer already holds a doorbell: EAGAIN is fine. */
static void shm_doorbell(struct tp_net *net, atomic_uint *f, int peer)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(f, memory_order_relaxed) && atomic_exchange(f, 0)) {
        const char b = 0;
        ssize_t r = send(net->fds[peer], &b, 1, tp_sock_send_flags() | MSG_DONTWAIT);
        (void)r; /* a lost peer shows on the sleeper's side as EOF */
    }
}

/* Move what fits; 1 on progress. */
static int shm_step(struct tp_net *net, struct tp_xfer *x)
{
    unsigned char *buf = x->buf;
    if (x->is_send) {
        struct shm_ring *r = ring(net, net->rank, x->peer);
        uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
        size_t space = SHM_RING_BYTES - (size_t)(head - tail);
        size_t len = TP_MIN(space, x->bytes - x->done);
        if (len == 0) return 0;
        size_t at = (size_t)(head & (SHM_RING_BYTES - 1)), first = TP_MIN(len, SHM_RING_BYTES - at);
        memcpy(r->data + at, buf + x->done, first);
        memcpy(r->data, buf + x->done + first, len - first);
        atomic_store_explicit(&r->head, head + len, memory_order_release);
        x->done += len;
        shm_doorbell(net, &r->rx_sleep, x->peer);
        return 1;
    }
    struct shm_ring *r = ring(net, x->peer, net->rank);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    size_t len = TP_MIN((size_t)(head - tail), x->bytes - x->done);
    if (len == 0) return 0;
    size_t at = (size_t)(tail & (SHM_RING_BYTES - 1)), first = TP_MIN(len, SHM_RING_BYTES - at);
    memcpy(buf + x->done, r->data + at, first);
    memcpy(buf + x->done + first, r->data, len - first);
    atomic_store_explicit(&r->tail, tail + len, memory_order_release);
    x->done += len;
    shm_doorbell(net, &r->tx_sleep, x->peer);
    return 1;
}

/* One step of every unfinished transfer whose turn it is; 1 if any moved data. */
static int shm_step_pending(struct tp_net *net, struct tp_xfer *x, int n)
{
    int moved = 0;
    for (int i = 0; i < n; i++)
        if (x[i].done < x[i].bytes && !tp_xfer_blocked(x, i)) moved |= shm_step(net, &x[i]);
    return moved;
}

/* The flag a waiting transfer sleeps on: its ring's rx_sleep (receive) or tx_sleep (send). */
static atomic_uint *sleep_flag(struct tp_net *net, const struct tp_xfer *x)
{
    return x->is_send ? &ring(net, net->rank, x->peer)->tx_sleep : &ring(net, x->peer, net->rank)->rx_sleep;
}

/* Set (1) or clear (0) the sleep flags of the pending transfers; with 1, then look at the rings once
 * more (shm_doorbell's other half).  Returns 1 if that look moved data. */
static int shm_announce(struct tp_net *net, struct tp_xfer *x, int n, unsigned v)
{
    for (int i = 0; i < n; i++)
        if (x[i].done < x[i].bytes && !tp_xfer_blocked(x, i)) atomic_store(sleep_flag(net, &x[i]), v);
    if (!v) return 0;
    atomic_thread_fence(memory_order_seq_cst);
    return shm_step_pending(net, x, n);
}

static enum tp_status shm_xfer(struct tp_net *net, struct tp_xfer *x, int n, struct tp_error *err)
{
    struct pollfd pfd[TP_ALGO_MAX_RANKS + 1];
    uint64_t last = tp_now_ns();
    const uint64_t idle_ns = (uint64_t)net->op_timeout_ms * 1000000u;
    for (;;) {
        int pending = 0, progressed = 0;
        for (int i = 0; i < n; i++) {
            if (x[i].done >= x[i].bytes) continue;
            if (!tp_xfer_blocked(x, i)) progressed |= shm_step(net, &x[i]);
            if (x[i].done < x[i].bytes && !x[i].optional) pending++;
        }
        if (!pending) return TP_OK;
        if (atomic_load_explicit(&net->poisoned, memory_order_acquire))
            return tp_error_set(err, TP_ERR_POISONED, "aborted: %s", tp_error_msg(&net->err));
        uint64_t now = tp_now_ns();
        if (progressed) last = now;
        if (now - last < SHM_SPIN_NS) continue;
        if (now - last < SHM_YIELD_NS) {
            sched_yield();
            continue;
        }
        if (now - last >= idle_ns) {
            return tp_net_timeout_error(net, x, n, err);
        }
        /* Sleep on the side channel: a peer's doorbell (it moved a ring this rank waits on), a dead
         * peer (EOF) or an abort wakes it; the slice bounds the wait for the op timeout's check. */
        if (shm_announce(net, x, n, 1)) {
            shm_announce(net, x, n, 0);
            last = tp_now_ns();
            continue;
        }
        int np = 0, seen[TP_ALGO_MAX_RANKS] = {0};
        for (int i = 0; i < n; i++)
            if (x[i].done < x[i].bytes && !seen[x[i].peer]) {
                seen[x[i].peer] = 1;
                pfd[np++] = (struct pollfd){.fd = net->fds[x[i].peer], .events = POLLIN};
            }
        pfd[np++] = (struct pollfd){.fd = net->wake_rd, .events = POLLIN};
        const int woke = poll(pfd, (nfds_t)np, SHM_SLEEP_MS);
        shm_announce(net, x, n, 0);
        atomic_fetch_add_explicit(&net->n_sleeps, 1, memory_order_relaxed);
        if (woke == 0) atomic_fetch_add_explicit(&net->n_sleeps_full, 1, memory_order_relaxed);
        if (woke > 0) {
            for (int i = 0; i + 1 < np; i++) {
                char b[64];
                if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                ssize_t got = recv(pfd[i].fd, b, sizeof b, MSG_DONTWAIT); /* doorbells: nothing else comes here */
                if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) continue;
                /* The peer is gone, but what it wrote before leaving is still
                 * in the rings: drain first, fail only when nothing moves. */
                if (shm_step_pending(net, x, n)) {
                    last = tp_now_ns();
                    break;
                }
                {
                    int who = -1;
                    for (int k = 0; k < net->size; k++)
                        if (net->fds[k] == pfd[i].fd) who = k;
                    if (atomic_load_explicit(&net->poisoned, memory_order_acquire))
                        return tp_error_set(err, TP_ERR_POISONED, "aborted: %s", tp_error_msg(&net->err));
                    return tp_error_set(err, TP_ERR_PEER,
                                        "rank %d closed its connection (it exited, crashed or failed)", who);
                }
            }
        }
    }
}

static void shm_shutdown(struct tp_net *net)
{
    for (int i = 0; i < net->size; i++)
        if (net->fds[i] >= 0) shutdown(net->fds[i], SHUT_RDWR);
}

static void shm_destroy(struct tp_net *net)
{
    struct shm_state *st = net->impl;
    if (st) {
        if (st->base && st->base != MAP_FAILED) munmap(st->base, st->bytes);
        free(st);
        net->impl = NULL;
    }
    for (int i = 0; i < net->size; i++) tp_sock_close(&net->fds[i]);
}

static const struct tp_transport_ops shm_ops = {
    .name = "shm",
    .xfer = shm_xfer,
    .shutdown = shm_shutdown,
    .destroy = shm_destroy,
};

/* "hostname|boot id": equal on ranks that share memory. */
static void host_identity(char *out, size_t cap)
{
    char host[128] = "";
    char boot[64] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
#ifdef __linux__
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
#endif
    memset(out, 0, cap);
    snprintf(out, cap, "%s|%s", host, boot);
}

/* Reserve the segment's pages now (0, or an errno).  On Linux the segment lives on tmpfs, where ftruncate
 * only sets the size: a /dev/shm too small for it (a container's default 64 MiB, or one nearly full) would
 * otherwise show as SIGBUS at the first write into a page it cannot back, mid-collective. */
static int shm_reserve(int fd, size_t bytes)
{
#ifdef __linux__
    int e;
    while ((e = posix_fallocate(fd, 0, (off_t)bytes)) == EINTR) {
    }
    return e;
#else
    (void)fd, (void)bytes;
    return 0;
#endif
}

/* Exchange fixed-size blobs with every peer (write all, then read all). */
static enum tp_status swap_all(struct tp_net *net, const void *mine, void *theirs, size_t bytes, uint64_t deadline,
                               struct tp_error *err)
{
    for (int r = 0; r < net->size; r++)
        if (r != net->rank && tp_sock_write_full(net->fds[r], mine, bytes, deadline, err) != TP_OK) return err->status;
    for (int r = 0; r < net->size; r++)
        if (r != net->rank &&
            tp_sock_read_full(net->fds[r], (unsigned char *)theirs + (size_t)r * bytes, bytes, deadline, err) != TP_OK)
            return err->status;
    return TP_OK;
}

enum tp_status tp_shm_attach(struct tp_net *net, uint32_t timeout_ms, int *attached, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    enum { ID = 192 };
    char mine[ID], *all = NULL;
    char name[SHM_NAME_BYTES];
    struct shm_state *st = NULL;
    int fd = -1;
    *attached = 0;
    uint64_t deadline = tp_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    all = calloc((size_t)net->size, ID);
    st = calloc(1, sizeof *st);
    if (!all || !st) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory");
        goto out;
    }
    host_identity(mine, sizeof mine);
    TP_CHECK_GOTO(swap_all(net, mine, all, ID, deadline, err), rc, out);
    int same = 1;
    for (int r = 0; r < net->size; r++)
        if (r != net->rank && memcmp(all + (size_t)r * ID, mine, ID) != 0) same = 0;
    /* Everyone must agree: a rank that sees a different host says no (0). */
    unsigned char vote = (unsigned char)same, votes[TP_ALGO_MAX_RANKS];
    TP_CHECK_GOTO(swap_all(net, &vote, votes, 1, deadline, err), rc, out);
    for (int r = 0; r < net->size; r++)
        if (r != net->rank && !votes[r]) same = 0;
    if (!same) {
        tp_log(TP_LOG_INFO, TP_COMM_MODULE, "shm: ranks are on different hosts, staying on TCP");
        goto out;
    }
    st->n = net->size;
    st->bytes = (size_t)net->size * (size_t)net->size * sizeof(struct shm_ring);
    /* Where the rings cannot be set up (no /dev/shm, its size, a file-size or address-space limit) the
     * group stays on TCP: rank 0 sends an empty name when it cannot create the segment, and every rank
     * votes on its mapping before any of them uses it. */
    char why[160] = "";
    memset(name, 0, sizeof name);
    if (net->rank == 0) {
        uint64_t salt = tp_now_ns() ^ ((uint64_t)getpid() << 20);
        snprintf(name, sizeof name, "/tpc%x%08x", (unsigned)getpid() & 0xfffffu, (unsigned)(salt & 0xffffffffu));
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        int e = fd < 0 || ftruncate(fd, (off_t)st->bytes) != 0 ? errno : shm_reserve(fd, st->bytes);
        if (e != 0) {
            snprintf(why, sizeof why, "rank 0 cannot create %s (%zu bytes): %s%s", name, st->bytes, strerror(e),
                     e == ENOSPC ? " (/dev/shm is too small; in a container, raise its --shm-size)" : "");
            if (fd >= 0) {
                close(fd);
                fd = -1;
                shm_unlink(name);
            }
            memset(name, 0, sizeof name); /* "no rings" */
        }
        for (int r = 1; r < net->size; r++)
            TP_CHECK_GOTO(tp_sock_write_full(net->fds[r], name, sizeof name, deadline, err), rc, unlink_out);
    } else {
        TP_CHECK_GOTO(tp_sock_read_full(net->fds[0], name, sizeof name, deadline, err), rc, out);
        name[sizeof name - 1] = '\0';
        if (!name[0]) snprintf(why, sizeof why, "rank 0 could not create the shared rings");
        else if ((fd = shm_open(name, O_RDWR, 0600)) < 0)
            snprintf(why, sizeof why, "rank %d cannot open %s: %s", net->rank, name, strerror(errno));
    }
    if (!name[0]) {
        tp_log(TP_LOG_WARN, TP_COMM_MODULE, "shm: %s; staying on TCP", why);
        goto out;
    }
    if (fd >= 0) {
        st->base = mmap(NULL, st->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (st->base == MAP_FAILED) {
            snprintf(why, sizeof why, "rank %d cannot map %zu bytes: %s", net->rank, st->bytes, strerror(errno));
            st->base = NULL;
        }
    }
    /* every rank mapped -> rank 0 unlinks (the mappings live on); any failure -> all stay on TCP */
    unsigned char ok = st->base != NULL;
    TP_CHECK_GOTO(swap_all(net, &ok, votes, 1, deadline, err), rc, unlink_out);
    int all_ok = ok;
    for (int r = 0; r < net->size; r++)
        if (r != net->rank && !votes[r]) {
            if (all_ok && !why[0]) snprintf(why, sizeof why, "rank %d could not open or map the shared rings", r);
            all_ok = 0;
        }
    if (net->rank == 0) shm_unlink(name);
    if (!all_ok) {
        tp_log(TP_LOG_WARN, TP_COMM_MODULE, "shm: %s; staying on TCP", why);
        goto out;
    }
    close(fd);
    fd = -1;
    net->impl = st;
    net->tops = &shm_ops;
    st = NULL;
    *attached = 1;
    tp_log(TP_LOG_DEBUG, TP_COMM_MODULE, "shm: %d ranks on shared-memory rings", net->size);
    goto out;
unlink_out:
    if (net->rank == 0 && name[0]) shm_unlink(name);
out:
    if (fd >= 0) close(fd);
    if (st && st->base && st->base != MAP_FAILED) munmap(st->base, st->bytes);
    free(st);
    free(all);
    return rc;
}
