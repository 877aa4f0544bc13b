/*
 * comm/liveness.c - heartbeats on a side channel (one extra TCP link per
 * worker to rank 0), so a stalled rank shows within a second or two even while
 * the engine thread is blocked inside a collective; the ranking of evidence
 * that names the lost rank (tp_live_pick); on rank 0 of a group that shrank,
 * the door that refuses a left-out rank at once.  The data links still decide
 * whether a collective fails.  The design: docs/recovery.md ("The liveness
 * channel", "Which rank is named").
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
#define TP_LIVE_BEAT 0xb7u            /* a heartbeat: "alive" */
#define TP_LIVE_LEAVE 0xb8u           /* "alive, and leaving this group" (sent once, before closing) */
#define TP_LIVE_LEAVE_GRACE_MS 400u   /* a leaving rank is named only when nothing else is for this long */
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
    _Atomic uint64_t *left_ns;    /* (n) tp_now_ns() when the peer said TP_LIVE_LEAVE, 0: it did not */
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
            static const uint8_t beat = TP_LIVE_BEAT;
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
            if (got > 0) {
                uint64_t t = tp_now_ns();
                if (memchr(buf, TP_LIVE_LEAVE, (size_t)got) && !atomic_load(&lv->left_ns[r]))
                    atomic_store(&lv->left_ns[r], t);
                atomic_store(&lv->last_ns[r], t);
            } else if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
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
    free((void *)lv->left_ns);
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
    lv->left_ns = calloc((size_t)lv->n, sizeof *lv->left_ns);
    int p[2] = {-1, -1};
    if (!lv->fds || !lv->last_ns || !lv->closed_ns || !lv->left_ns || pipe(p) != 0) {
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
        atomic_init(&lv->left_ns[r], 0);
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
    /* this process is alive and leaves the group: say so before the links close, so that the peers do not
     * take the closing for a death (tp_live_pick) */
    static const uint8_t leave = TP_LIVE_LEAVE;
    for (int r = 0; r < lv->n; r++)
        if (lv->fds[r] >= 0) {
            ssize_t s = send(lv->fds[r], &leave, 1, tp_sock_send_flags() | MSG_DONTWAIT);
            (void)s;
        }
    live_free(lv);
}

/*
 * The rank to name for a silence or a loss, -1 when none (see the top of
 * this file): 1. a link closed without the leave notice, the earliest
 * closing first (with closed_counts 0, only once it is silent for more than
 * silent_ms, like an open link); 2. an open link silent for more than
 * silent_ms, the longest silent first; 3. a rank that said it was leaving,
 * TP_LIVE_LEAVE_GRACE_MS or more ago, unless an open link went silent more
 * than two heartbeats before that leave (a stop that the leave followed:
 * that rank is named instead); the earliest leave first.  *silent_for_ms:
 * how long the named rank has sent nothing.
 */
static int live_pick(struct tp_live *lv, uint32_t silent_ms, int closed_counts, uint32_t *silent_for_ms)
{
    const uint64_t now = tp_now_ns(), silent_ns = (uint64_t)silent_ms * 1000000ull;
    const uint64_t grace_ns = TP_LIVE_LEAVE_GRACE_MS * 1000000ull, beats_ns = 2ull * TP_LIVE_BEAT_MS * 1000000ull;
    int dead = -1, quiet = -1, left = -1, oldest = -1;
    uint64_t dead_at = 0, quiet_last = 0, left_at = 0, oldest_last = 0;
    for (int r = 0; r < lv->n; r++) {
        const uint64_t last = atomic_load(&lv->last_ns[r]);
        if (!last) continue; /* no link to this rank */
        const uint64_t closed = atomic_load(&lv->closed_ns[r]), leave = atomic_load(&lv->left_ns[r]);
        const uint64_t quiet_ns = now > last ? now - last : 0;
        if (leave) {
            if (now > leave && now - leave >= grace_ns && (closed_counts || quiet_ns > silent_ns) && (left < 0 || leave < left_at))
                left = r, left_at = leave;
        } else if (closed) {
            if ((closed_counts || quiet_ns > silent_ns) && (dead < 0 || closed < dead_at)) dead = r, dead_at = closed;
        } else {
            if (quiet_ns > silent_ns && (quiet < 0 || last < quiet_last)) quiet = r, quiet_last = last;
            if (oldest < 0 || last < oldest_last) oldest = r, oldest_last = last;
        }
    }
    int who = dead >= 0 ? dead : quiet >= 0 ? quiet : left;
    if (dead < 0 && quiet < 0 && left >= 0 && oldest >= 0 && oldest_last + beats_ns < left_at) who = oldest;
    if (who >= 0 && silent_for_ms) {
        const uint64_t last = atomic_load(&lv->last_ns[who]);
        const uint64_t ms = now > last ? (now - last) / 1000000u : 0;
        *silent_for_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    }
    return who;
}

int tp_live_silent(const struct tp_net *net, uint32_t silent_ms, uint32_t *silent_for_ms)
{
    if (silent_for_ms) *silent_for_ms = 0;
    return net && net->live ? live_pick(net->live, silent_ms, 0, silent_for_ms) : -1;
}

int tp_live_lost(const struct tp_net *net, uint32_t silent_ms, uint32_t *silent_for_ms)
{
    if (silent_for_ms) *silent_for_ms = 0;
    return net && net->live ? live_pick(net->live, silent_ms, 1, silent_for_ms) : -1;
}
