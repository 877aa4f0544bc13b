/*
 * comm/liveness.c - heartbeats on a side channel, so a stalled rank shows within a second or two even
 * while the engine thread is blocked in a collective.  Every worker has one extra authenticated TCP
 * link to rank 0 (net->live_fds, from the bootstrap); a small thread per rank sends a byte on its links
 * every TP_LIVE_BEAT_MS and records per peer when it last heard anything (an atomic timestamp), whatever
 * the engine does, so a stopped peer (SIGSTOP, a hung host, a cut link) goes silent while a busy one
 * does not.  The bytes carry nothing: the data links (and their op timeout) decide whether a collective
 * fails; this channel only reports silence.  On rank 0 of a group that shrank, the thread also keeps the
 * bootstrap listener open (the door) and answers a left-out rank that tries to join with a REJECT, so it
 * stops at once (at most TP_LIVE_DOOR_MAX pending connections, each for at most TP_LIVE_DOOR_MS).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm_impl.h"
#include "comm_wire.h"

#define TP_LIVE_BEAT_MS 200u
#define TP_LIVE_DOOR_MAX 8
#define TP_LIVE_DOOR_MS 3000u

struct door_conn {
    int fd;                        /* -1: free */
    uint64_t t0;                   /* accepted at */
    size_t got;
    uint8_t buf[TP_WIRE_FRAME_BYTES];
};

struct tp_live {
    pthread_t th;
    int stop_rd, stop_wr;         /* self-pipe: stop wakes the thread */
    int n;                        /* net size */
    int *fds;                     /* (n) liveness link per net rank, -1 where none (owned) */
    _Atomic uint64_t *last_ns;    /* (n) tp_now_ns() of the last byte received, 0 where no link */
    _Atomic uint64_t *closed_ns;  /* (n) tp_now_ns() when the link closed, 0 while open */
    int door;                     /* rank 0 after a shrink: the bootstrap listener (owned), else -1 */
    int door_former;              /* the largest world before the shrink */
    uint32_t epoch;
    struct door_conn pend[TP_LIVE_DOOR_MAX];
};

/* Answer a door connection whose first frame arrived (or that sent junk) and close it. */
static void door_answer(struct tp_live *lv, struct door_conn *d)
{
    struct tp_wire_frame f;
    uint32_t why = TP_REJECT_MAGIC;
    if (d->got == TP_WIRE_FRAME_BYTES) {
        tp_wire_decode(d->buf, &f);
        if (f.magic != TP_WIRE_MAGIC) why = TP_REJECT_MAGIC;
        else if (f.version != TP_WIRE_VERSION) why = TP_REJECT_VERSION;
        else if (f.world_size > (uint32_t)lv->n && f.world_size <= (uint32_t)lv->door_former) why = TP_REJECT_DROPPED;
        else why = TP_REJECT_WORLD;
    }
    struct tp_wire_frame r = {.magic = TP_WIRE_MAGIC, .version = TP_WIRE_VERSION, .kind = TP_WIRE_REJECT,
                              .rank = 0, .world_size = (uint32_t)lv->n, .arg = why, .epoch = lv->epoch};
    uint8_t out[TP_WIRE_FRAME_BYTES];
    tp_wire_encode(&r, out);
    ssize_t w = send(d->fd, out, sizeof out, tp_sock_send_flags() | MSG_DONTWAIT);
    (void)w;
    char peer[96];
    tp_sock_peer_str(d->fd, peer, sizeof peer);
    tp_log(TP_LOG_WARN, TP_COMM_MODULE, "rank 0: refused %s: %s", peer, tp_wire_reject_str(why));
    close(d->fd);
    d->fd = -1;
}

static void door_accept(struct tp_live *lv)
{
    int fd = accept(lv->door, NULL, NULL);
    if (fd < 0) return;
    (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    struct door_conn *slot = &lv->pend[0];
    for (int i = 0; i < TP_LIVE_DOOR_MAX; i++) {
        if (lv->pend[i].fd < 0) {
            slot = &lv->pend[i];
            break;
        }
        if (lv->pend[i].t0 < slot->t0) slot = &lv->pend[i];
    }
    if (slot->fd >= 0) close(slot->fd); /* full: the oldest goes */
    slot->fd = fd;
    slot->t0 = tp_now_ns();
    slot->got = 0;
}

static void *live_main(void *arg)
{
    struct tp_live *lv = arg;
    struct pollfd pfd[TP_ALGO_MAX_RANKS + 2 + TP_LIVE_DOOR_MAX];
    int who[TP_ALGO_MAX_RANKS + 2 + TP_LIVE_DOOR_MAX]; /* rank, -1 stop, -2 door, -3 - i pending door conn i */
    int open_fd[TP_ALGO_MAX_RANKS];
    for (int r = 0; r < lv->n; r++) open_fd[r] = lv->fds[r] >= 0;
    uint64_t next_beat = 0;
    for (;;) {
        uint64_t now = tp_now_ns();
        if (now >= next_beat) {
            static const uint8_t beat = 0xb7;
            for (int r = 0; r < lv->n; r++) {
                if (!open_fd[r]) continue;
                ssize_t w = send(lv->fds[r], &beat, 1, tp_sock_send_flags());
                if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) open_fd[r] = 0;
            }
            next_beat = now + TP_LIVE_BEAT_MS * 1000000ull;
        }
        int np = 0;
        pfd[np] = (struct pollfd){.fd = lv->stop_rd, .events = POLLIN};
        who[np++] = -1;
        for (int r = 0; r < lv->n; r++)
            if (open_fd[r]) {
                pfd[np] = (struct pollfd){.fd = lv->fds[r], .events = POLLIN};
                who[np++] = r;
            }
        if (lv->door >= 0) {
            pfd[np] = (struct pollfd){.fd = lv->door, .events = POLLIN};
            who[np++] = -2;
            for (int i = 0; i < TP_LIVE_DOOR_MAX; i++) {
                struct door_conn *d = &lv->pend[i];
                if (d->fd < 0) continue;
                if (now - d->t0 > TP_LIVE_DOOR_MS * 1000000ull) {
                    door_answer(lv, d); /* silent too long */
                    continue;
                }
                pfd[np] = (struct pollfd){.fd = d->fd, .events = POLLIN};
                who[np++] = -3 - i;
            }
        }
        uint64_t left_ns = next_beat > now ? next_beat - now : 0;
        int pr = poll(pfd, (nfds_t)np, (int)(left_ns / 1000000u) + 1);
        if (pr < 0 && errno != EINTR) break;
        if (pr <= 0) continue;
        if (pfd[0].revents) break; /* stop */
        for (int i = 1; i < np; i++) {
            if (!pfd[i].revents) continue;
            int r = who[i];
            if (r == -2) {
                door_accept(lv);
                continue;
            }
            if (r <= -3) {
                struct door_conn *d = &lv->pend[-3 - r];
                if (d->fd < 0) continue;
                ssize_t got = recv(d->fd, d->buf + d->got, sizeof d->buf - d->got, MSG_DONTWAIT);
                if (got > 0) d->got += (size_t)got;
                if (got == 0 || d->got == sizeof d->buf ||
                    (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                    if (got <= 0 && d->got < sizeof d->buf) {
                        close(d->fd); /* gone before saying anything */
                        d->fd = -1;
                    } else {
                        door_answer(lv, d);
                    }
                }
                continue;
            }
            uint8_t buf[256];
            ssize_t got = recv(lv->fds[r], buf, sizeof buf, 0);
            if (got > 0)
                atomic_store(&lv->last_ns[r], tp_now_ns());
            else if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
                open_fd[r] = 0; /* closed: its timestamp stops, so it reads as silent */
                atomic_store(&lv->closed_ns[r], tp_now_ns());
            }
        }
    }
    return NULL;
}

static void live_free(struct tp_live *lv)
{
    if (!lv) return;
    for (int r = 0; r < lv->n; r++)
        if (lv->fds && lv->fds[r] >= 0) close(lv->fds[r]);
    if (lv->stop_rd >= 0) close(lv->stop_rd);
    if (lv->door >= 0) close(lv->door);
    for (int i = 0; i < TP_LIVE_DOOR_MAX; i++)
        if (lv->pend[i].fd >= 0) close(lv->pend[i].fd);
    if (lv->stop_wr >= 0) close(lv->stop_wr);
    free(lv->fds);
    free((void *)lv->last_ns);
    free((void *)lv->closed_ns);
    free(lv);
}

enum tp_status tp_live_start(struct tp_net *net, struct tp_error *err)
{
    int any = 0;
    for (int r = 0; r < net->size; r++) any |= net->live_fds[r] >= 0;
    if (!any || net->size > TP_ALGO_MAX_RANKS) return TP_OK;
    struct tp_live *lv = calloc(1, sizeof *lv);
    if (!lv) return tp_error_set(err, TP_ERR_NOMEM, "out of memory for the liveness thread");
    lv->n = net->size;
    lv->stop_rd = lv->stop_wr = -1;
    lv->door = net->door_fd;
    net->door_fd = -1;
    lv->door_former = net->door_former;
    lv->epoch = net->epoch;
    for (int i = 0; i < TP_LIVE_DOOR_MAX; i++) lv->pend[i].fd = -1;
    if (lv->door >= 0) (void)fcntl(lv->door, F_SETFL, fcntl(lv->door, F_GETFL, 0) | O_NONBLOCK);
    lv->fds = malloc((size_t)lv->n * sizeof *lv->fds);
    lv->last_ns = calloc((size_t)lv->n, sizeof *lv->last_ns);
    lv->closed_ns = calloc((size_t)lv->n, sizeof *lv->closed_ns);
    int p[2] = {-1, -1};
    if (!lv->fds || !lv->last_ns || !lv->closed_ns || pipe(p) != 0) {
        free(lv->fds);
        lv->fds = NULL;
        live_free(lv);
        return tp_error_set(err, TP_ERR_NOMEM, "cannot set up the liveness thread");
    }
    lv->stop_rd = p[0];
    lv->stop_wr = p[1];
    (void)fcntl(p[0], F_SETFD, FD_CLOEXEC);
    (void)fcntl(p[1], F_SETFD, FD_CLOEXEC);
    uint64_t now = tp_now_ns();
    for (int r = 0; r < lv->n; r++) {
        lv->fds[r] = net->live_fds[r];
        net->live_fds[r] = -1;
        atomic_init(&lv->last_ns[r], lv->fds[r] >= 0 ? now : 0);
        atomic_init(&lv->closed_ns[r], 0);
        if (lv->fds[r] >= 0) {
            struct tp_error e = {0};
            if (tp_sock_tune(lv->fds[r], &e) != TP_OK) {
                live_free(lv);
                return tp_error_set(err, e.status, "liveness link to rank %d: %s", r, e.msg);
            }
        }
    }
    if (pthread_create(&lv->th, NULL, live_main, lv) != 0) {
        live_free(lv);
        return tp_error_set(err, TP_ERR_NOMEM, "cannot start the liveness thread");
    }
    net->live = lv;
    return TP_OK;
}

void tp_live_stop(struct tp_net *net)
{
    if (!net) return;
    if (net->live_fds)
        for (int r = 0; r < net->size; r++) tp_sock_close(&net->live_fds[r]);
    struct tp_live *lv = net->live;
    if (!lv) return;
    net->live = NULL;
    char b = 1;
    ssize_t w;
    do {
        w = write(lv->stop_wr, &b, 1);
    } while (w < 0 && errno == EINTR);
    pthread_join(lv->th, NULL);
    live_free(lv);
}

int tp_live_silent(const struct tp_net *net, uint32_t silent_ms, uint32_t *silent_for_ms)
{
    const struct tp_live *lv = net ? net->live : NULL;
    if (silent_for_ms) *silent_for_ms = 0;
    if (!lv) return -1;
    uint64_t now = tp_now_ns();
    for (int r = 0; r < lv->n; r++) {
        uint64_t last = atomic_load(&((struct tp_live *)lv)->last_ns[r]);
        if (!last || now <= last) continue;
        uint64_t ms = (now - last) / 1000000u;
        if (ms > silent_ms) {
            if (silent_for_ms) *silent_for_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
            return r;
        }
    }
    return -1;
}

int tp_live_lost(const struct tp_net *net, uint32_t silent_ms, uint32_t *silent_for_ms)
{
    struct tp_live *lv = net ? net->live : NULL;
    if (silent_for_ms) *silent_for_ms = 0;
    if (!lv) return -1;
    uint64_t now = tp_now_ns(), first = 0;
    int who = -1;
    for (int r = 0; r < lv->n; r++) {
        uint64_t c = atomic_load(&lv->closed_ns[r]);
        if (c && (!first || c < first)) first = c, who = r;
    }
    if (who >= 0) {
        uint64_t last = atomic_load(&lv->last_ns[who]);
        uint64_t ms = now > last ? (now - last) / 1000000u : 0;
        if (silent_for_ms) *silent_for_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
        return who;
    }
    uint64_t oldest = UINT64_MAX;
    for (int r = 0; r < lv->n; r++) {
        uint64_t last = atomic_load(&lv->last_ns[r]);
        if (last && last < oldest) oldest = last, who = r;
    }
    if (who < 0 || now <= oldest || (now - oldest) / 1000000u <= silent_ms) return -1;
    uint64_t ms = (now - oldest) / 1000000u;
    if (silent_for_ms) *silent_for_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    return who;
}
