/*
 * comm/algo.c - the collectives, written once over point-to-point transfers
 * (tp_comm_xfer) and shared by the ring (TCP) and rdma transports.  Small
 * messages (up to mesh_limit: 512 KiB with 2 ranks, 64 KiB with more) take
 * one mesh round, reduced in rank order; large ones a pipelined ring
 * reduce-scatter + all-gather (both ring directions from
 * TP_ALGO_BIDIR_BYTES on 3+ ranks).  Every element is reduced along one
 * fixed chain, so results are bit-identical on every rank.  send / recv
 * frame a payload with an 8-byte little-endian length.  docs/multi-node.md
 * ("All-reduce over TCP").
 */
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

/* First element of segment r when count elements are split into n parts. */
static size_t seg_begin(size_t count, int n, int r)
{
    return (count / (size_t)n) * (size_t)r + (count % (size_t)n) * (size_t)r / (size_t)n;
}

enum tp_status tp_algo_alloc_scratch(struct tp_comm *c)
{
    if (c->stage[0]) return TP_OK;
    for (int i = 0; i < 2; i++) {
        c->stage[i] = tp_aligned_alloc(64, TP_ALGO_CHUNK_BYTES);
        c->acc[i] = tp_aligned_alloc(64, TP_ALGO_CHUNK_BYTES);
        if (!c->stage[i] || !c->acc[i])
            return tp_comm_fail(c, TP_ERR_NOMEM, "out of memory for the ring staging buffers (%u bytes)",
                                4u * TP_ALGO_CHUNK_BYTES);
    }
    return TP_OK;
}

/* Largest per-rank message sent by the one-round mesh algorithms. */
static size_t mesh_limit(const struct tp_comm *c) { return c->size == 2 ? TP_ALGO_SMALL_BYTES : TP_ALGO_SMALL_BYTES_N; }

static enum tp_status ensure_small(struct tp_comm *c)
{
    if (c->small) return TP_OK;
    c->small_bytes = mesh_limit(c);
    c->small = tp_aligned_alloc(64, (size_t)c->size * c->small_bytes);
    if (!c->small) return tp_comm_fail(c, TP_ERR_NOMEM, "out of memory for the mesh buffer");
    return TP_OK;
}

static inline unsigned char *slot(struct tp_comm *c, int r) { return c->small + (size_t)r * c->small_bytes; }

/* Mesh all-reduce: bytes <= mesh_limit(c). */
static enum tp_status mesh_all_reduce(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                      enum tp_red_op op)
{
    const size_t bytes = count * tp_dtype_size(dt);
    const int n = c->size, me = c->rank;
    struct tp_xfer x[2 * TP_ALGO_MAX_RANKS];
    int nx = 0;
    enum tp_status rc = ensure_small(c);
    if (rc != TP_OK) return rc;
    for (int p = 0; p < n; p++) {
        if (p == me) continue;
        x[nx++] = (struct tp_xfer){.peer = p, .is_send = 1, .buf = (void *)send, .bytes = bytes};
        x[nx++] = (struct tp_xfer){.peer = p, .is_send = 0, .buf = slot(c, p), .bytes = bytes};
    }
    rc = tp_comm_xfer(c, x, nx);
    if (rc != TP_OK) return rc;
    /* Rank-ordered fold; my own data must survive until its turn. */
    const void *mine = send;
    if (send == recv && me >= 2) {
        memcpy(slot(c, me), send, bytes);
        mine = slot(c, me);
    }
    const void *d0 = me == 0 ? mine : slot(c, 0);
    const void *d1 = me == 1 ? mine : slot(c, 1);
    tp_reduce(recv, d0, d1, count, dt, op);
    for (int r = 2; r < n; r++) tp_reduce(recv, recv, r == me ? mine : slot(c, r), count, dt, op);
    return TP_OK;
}

/*
 * Ring reduce-scatter over n segments of `send` (segment r = elements
 * [off[r], off[r]+len[r])): this rank ends with the reduced segment `me` in
 * out[0..len[me]).  out may alias send + off[me].  Walks the ring once per
 * chunk with the two staging and two partial-sum buffers.
 */
static enum tp_status ring_reduce_scatter(struct tp_comm *c, const unsigned char *send, const size_t *off,
                                          const size_t *len, unsigned char *out, enum tp_dtype dt, enum tp_red_op op)
{
    const int n = c->size, me = c->rank;
    const size_t es = tp_dtype_size(dt);
    const size_t chunk = TP_ALGO_CHUNK_BYTES / es;
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    enum tp_status rc = tp_algo_alloc_scratch(c);
    if (rc != TP_OK) return rc;
    size_t maxlen = 0;
    for (int r = 0; r < n; r++) maxlen = TP_MAX(maxlen, len[r]);
    for (size_t k0 = 0; k0 < maxlen; k0 += chunk) {
        int cur = 0;
        for (int s = 0; s < n - 1; s++) {
            const int sseg = (me - s - 1 + 2 * n) % n, rseg = (me - s - 2 + 2 * n) % n;
            const size_t slen = len[sseg] > k0 ? TP_MIN(chunk, len[sseg] - k0) : 0;
            const size_t rlen = len[rseg] > k0 ? TP_MIN(chunk, len[rseg] - k0) : 0;
            const void *sp = s == 0 ? send + (off[sseg] + k0) * es : c->acc[cur];
            struct tp_xfer x[2] = {
                {.peer = right, .is_send = 1, .buf = (void *)sp, .bytes = slen * es},
                {.peer = left, .is_send = 0, .buf = c->stage[s & 1], .bytes = rlen * es},
            };
            rc = tp_comm_xfer(c, x, 2);
            if (rc != TP_OK) return rc;
            void *dst = s == n - 2 ? out + k0 * es : c->acc[cur ^ 1];
            tp_reduce(dst, c->stage[s & 1], send + (off[rseg] + k0) * es, rlen, dt, op);
            cur ^= 1;
        }
    }
    return TP_OK;
}

/*
 * One ring direction ("lane") of an all-reduce over one part of the buffer:
 * dir = +1 sends to the right neighbour (rank + 1) and receives from the
 * left, dir = -1 the reverse.  Segment r of the part is elements
 * [off[r], off[r] + len[r]) of the whole buffer; stage = the lane's own two
 * chunk staging buffers.
 */
struct ring_lane {
    int dir;
    const size_t *off, *len;
    unsigned char *stage[2];
};

/* Segment handled k steps "behind" me along the lane: me - dir*k (mod n). */
static int lane_seg(int me, int dir, int k, int n) { return ((me - dir * k) % n + n) % n; }

/*
 * Ring reduce-scatter for all_reduce, accumulating in recv (the classic
 * in-place ring), on nl (1 or 2) lanes at once: at step s rank r streams its
 * partial of segment r-dir(s+1) to r+dir (the whole segment as one optional
 * transfer) while it receives the partial of segment r-dir(s+2) from r-dir
 * chunk by chunk into the lane's two staging buffers, adding its own
 * contribution to each chunk as soon as it lands.  Both lanes' transfers go
 * in one tp_comm_xfer call, so with two lanes every link carries data both
 * ways.  Reduction overlaps the transfer; afterwards recv segment r of every
 * lane holds the full result.  Each segment is written once, so send == recv
 * is fine.
 *
 * Reduction order (so every rank gets bit-identical results): segment j of
 * a lane is reduced along one chain, starting from rank j+dir's data, then
 * ((d[j+dir] op d[j+2dir]) op d[j+3dir]) ... op d[j], each step as
 * tp_reduce(incoming partial, own data); the all-gather then copies the
 * final bytes to every rank.
 */
static enum tp_status ring_reduce_scatter_lanes(struct tp_comm *c, const unsigned char *send, unsigned char *recv,
                                                const struct ring_lane *ln, int nl, enum tp_dtype dt,
                                                enum tp_red_op op)
{
    const int n = c->size, me = c->rank;
    const size_t es = tp_dtype_size(dt);
    const size_t chunk = TP_ALGO_CHUNK_BYTES / es;
    for (int s = 0; s < n - 1; s++) {
        const unsigned char *src = s == 0 ? send : recv;
        struct tp_xfer x[4];
        int rseg[2];
        size_t nchunks = 0;
        for (int l = 0; l < nl; l++) {
            const int sseg = lane_seg(me, ln[l].dir, s + 1, n);
            rseg[l] = lane_seg(me, ln[l].dir, s + 2, n);
            x[l] = (struct tp_xfer){.peer = (me + ln[l].dir + n) % n, .is_send = 1,
                                    .buf = (void *)(src + ln[l].off[sseg] * es), .bytes = ln[l].len[sseg] * es,
                                    .optional = 1};
            nchunks = TP_MAX(nchunks, (ln[l].len[rseg[l]] + chunk - 1) / chunk);
        }
        for (size_t k = 0; k < nchunks; k++) {
            const size_t k0 = k * chunk;
            size_t clen[2];
            for (int l = 0; l < nl; l++) {
                const size_t rl = ln[l].len[rseg[l]];
                clen[l] = rl > k0 ? TP_MIN(chunk, rl - k0) : 0;
                x[nl + l] = (struct tp_xfer){.peer = (me - ln[l].dir + n) % n, .is_send = 0,
                                             .buf = ln[l].stage[k & 1], .bytes = clen[l] * es};
            }
            enum tp_status rc = tp_comm_xfer(c, x, 2 * nl);
            if (rc != TP_OK) return rc;
            for (int l = 0; l < nl; l++) {
                const size_t at = (ln[l].off[rseg[l]] + k0) * es;
                if (clen[l]) tp_reduce(recv + at, ln[l].stage[k & 1], send + at, clen[l], dt, op);
            }
        }
        for (int l = 0; l < nl; l++) x[l].optional = 0;
        enum tp_status rc = tp_comm_xfer(c, x, nl);
        if (rc != TP_OK) return rc;
    }
    return TP_OK;
}

/* Ring all-gather in place on nl lanes at once: segment r of every lane
 * already holds rank r's part on rank r; at step s rank r sends segment
 * r-dir*s to r+dir and receives segment r-dir(s+1) from r-dir. */
static enum tp_status ring_all_gather_lanes(struct tp_comm *c, unsigned char *buf, const struct ring_lane *ln, int nl,
                                            size_t es)
{
    const int n = c->size, me = c->rank;
    for (int s = 0; s < n - 1; s++) {
        struct tp_xfer x[4];
        for (int l = 0; l < nl; l++) {
            const int sseg = lane_seg(me, ln[l].dir, s, n), rseg = lane_seg(me, ln[l].dir, s + 1, n);
            x[2 * l] = (struct tp_xfer){.peer = (me + ln[l].dir + n) % n, .is_send = 1,
                                        .buf = buf + ln[l].off[sseg] * es, .bytes = ln[l].len[sseg] * es};
            x[2 * l + 1] = (struct tp_xfer){.peer = (me - ln[l].dir + n) % n, .is_send = 0,
                                            .buf = buf + ln[l].off[rseg] * es, .bytes = ln[l].len[rseg] * es};
        }
        enum tp_status rc = tp_comm_xfer(c, x, 2 * nl);
        if (rc != TP_OK) return rc;
    }
    return TP_OK;
}

/* Ring all-gather in place: segment r of buf already holds rank r's part on
 * rank r; afterwards every segment is everywhere. */
static enum tp_status ring_all_gather(struct tp_comm *c, unsigned char *buf, const size_t *off, const size_t *len,
                                      size_t es)
{
    const struct ring_lane lane = {.dir = 1, .off = off, .len = len};
    return ring_all_gather_lanes(c, buf, &lane, 1, es);
}

/*
 * Two ranks, large messages: reduce-scatter and all-gather pipelined into
 * one pass.  Each rank streams the peer's half of its input (optional send)
 * and receives its own half chunk by chunk into the staging buffers; every
 * reduced chunk is appended to a second send (the all-gather of its half),
 * queued behind the first on the same socket, so the all-gather starts while
 * the reduce-scatter is still running.  Last, the peer's reduced half lands
 * straight in recv.  In place is safe: the peer's all-gather bytes for a
 * chunk arrive only after it received (so we sent) that chunk.
 */
static enum tp_status pair_all_reduce(struct tp_comm *c, const unsigned char *send, unsigned char *recv, size_t count,
                                      enum tp_dtype dt, enum tp_red_op op)
{
    const int me = c->rank, peer = 1 - me;
    const size_t es = tp_dtype_size(dt), chunk = TP_ALGO_CHUNK_BYTES / es;
    const size_t off[2] = {0, count / 2}, len[2] = {count / 2, count - count / 2};
    enum tp_status rc = tp_algo_alloc_scratch(c);
    if (rc != TP_OK) return rc;
    struct tp_xfer x[3] = {
        {.peer = peer, .is_send = 1, .buf = (void *)(send + off[peer] * es), .bytes = len[peer] * es, .optional = 1},
        {.peer = peer, .is_send = 1, .buf = recv + off[me] * es, .bytes = 0, .optional = 1},
        {.peer = peer, .is_send = 0},
    };
    for (size_t k0 = 0; k0 < len[me]; k0 += chunk) {
        const size_t clen = TP_MIN(chunk, len[me] - k0);
        unsigned char *stage = c->stage[(k0 / chunk) & 1];
        x[2] = (struct tp_xfer){.peer = peer, .is_send = 0, .buf = stage, .bytes = clen * es};
        rc = tp_comm_xfer(c, x, 3);
        if (rc != TP_OK) return rc;
        /* same operand order on both ranks: a op b is bitwise symmetric for sum/max/min */
        tp_reduce(recv + (off[me] + k0) * es, stage, send + (off[me] + k0) * es, clen, dt, op);
        x[1].bytes += clen * es;
        c->stats.bytes_sent += clen * es;
    }
    x[0].optional = 0;
    x[1].optional = 0;
    x[2] = (struct tp_xfer){.peer = peer, .is_send = 0, .buf = recv + off[peer] * es, .bytes = len[peer] * es};
    return tp_comm_xfer(c, x, 3);
}

static enum tp_status net_all_reduce(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                     enum tp_red_op op)
{
    const int n = c->size;
    const size_t es = tp_dtype_size(dt);
    if (count * es <= mesh_limit(c)) return mesh_all_reduce(c, send, recv, count, dt, op);
    if (n == 2) return pair_all_reduce(c, send, recv, count, dt, op);
    enum tp_status rc = tp_algo_alloc_scratch(c);
    if (rc != TP_OK) return rc;
    /* Large: two lanes, the first half clockwise, the second counter-clockwise. */
    const int nl = count * es >= TP_ALGO_BIDIR_BYTES ? 2 : 1;
    const size_t hbeg[2] = {0, nl == 2 ? count / 2 : count};
    const size_t hlen[2] = {hbeg[1], count - hbeg[1]};
    size_t off[2][TP_ALGO_MAX_RANKS], len[2][TP_ALGO_MAX_RANKS];
    struct ring_lane lanes[2];
    for (int l = 0; l < nl; l++) {
        for (int r = 0; r < n; r++) {
            off[l][r] = hbeg[l] + seg_begin(hlen[l], n, r);
            len[l][r] = seg_begin(hlen[l], n, r + 1) - seg_begin(hlen[l], n, r);
        }
        lanes[l] = (struct ring_lane){.dir = l == 0 ? 1 : -1, .off = off[l], .len = len[l]};
        lanes[l].stage[0] = l == 0 ? c->stage[0] : c->acc[0];
        lanes[l].stage[1] = l == 0 ? c->stage[1] : c->acc[1];
    }
    unsigned char *out = (unsigned char *)recv;
    rc = ring_reduce_scatter_lanes(c, send, out, lanes, nl, dt, op);
    if (rc != TP_OK) return rc;
    return ring_all_gather_lanes(c, out, lanes, nl, es);
}

static enum tp_status net_all_gather(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt)
{
    const int n = c->size, me = c->rank;
    const size_t bytes = count * tp_dtype_size(dt);
    unsigned char *out = recv;
    if (send != out + (size_t)me * bytes) memcpy(out + (size_t)me * bytes, send, bytes);
    if (n == 2 || bytes * (size_t)(n - 1) <= (1u << 20)) {
        struct tp_xfer x[2 * TP_ALGO_MAX_RANKS];
        int nx = 0;
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            x[nx++] = (struct tp_xfer){.peer = p, .is_send = 1, .buf = out + (size_t)me * bytes, .bytes = bytes};
            x[nx++] = (struct tp_xfer){.peer = p, .is_send = 0, .buf = out + (size_t)p * bytes, .bytes = bytes};
        }
        return tp_comm_xfer(c, x, nx);
    }
    size_t off[TP_ALGO_MAX_RANKS], len[TP_ALGO_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        off[r] = (size_t)r * count;
        len[r] = count;
    }
    return ring_all_gather(c, out, off, len, tp_dtype_size(dt));
}

static enum tp_status net_reduce_scatter(struct tp_comm *c, const void *send, void *recv, size_t count,
                                         enum tp_dtype dt)
{
    const int n = c->size, me = c->rank;
    const size_t es = tp_dtype_size(dt), bytes = count * es;
    const unsigned char *in = send;
    if (bytes <= mesh_limit(c)) {
        struct tp_xfer x[2 * TP_ALGO_MAX_RANKS];
        int nx = 0;
        enum tp_status rc = ensure_small(c);
        if (rc != TP_OK) return rc;
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            x[nx++] = (struct tp_xfer){.peer = p, .is_send = 1, .buf = (void *)(in + (size_t)p * bytes), .bytes = bytes};
            x[nx++] = (struct tp_xfer){.peer = p, .is_send = 0, .buf = slot(c, p), .bytes = bytes};
        }
        rc = tp_comm_xfer(c, x, nx);
        if (rc != TP_OK) return rc;
        memcpy(slot(c, me), in + (size_t)me * bytes, bytes);
        tp_reduce(recv, slot(c, 0), slot(c, 1), count, dt, TP_RED_SUM);
        for (int r = 2; r < n; r++) tp_reduce(recv, recv, slot(c, r), count, dt, TP_RED_SUM);
        return TP_OK;
    }
    size_t off[TP_ALGO_MAX_RANKS], len[TP_ALGO_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        off[r] = (size_t)r * count;
        len[r] = count;
    }
    /* recv may not alias send (contract: separate buffers of different sizes),
     * but if it aliases send's own block the elementwise reduce is still safe. */
    return ring_reduce_scatter(c, in, off, len, recv, dt, TP_RED_SUM);
}

static enum tp_status net_broadcast(struct tp_comm *c, void *buf, size_t count, enum tp_dtype dt, int root)
{
    const size_t bytes = count * tp_dtype_size(dt);
    if (c->rank != root) {
        struct tp_xfer x = {.peer = root, .is_send = 0, .buf = buf, .bytes = bytes};
        return tp_comm_xfer(c, &x, 1);
    }
    struct tp_xfer x[TP_ALGO_MAX_RANKS];
    int nx = 0;
    for (int p = 0; p < c->size; p++)
        if (p != root) x[nx++] = (struct tp_xfer){.peer = p, .is_send = 1, .buf = buf, .bytes = bytes};
    return tp_comm_xfer(c, x, nx);
}

static enum tp_status net_scatter(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                  int root)
{
    const size_t bytes = count * tp_dtype_size(dt);
    if (c->rank != root) {
        struct tp_xfer x = {.peer = root, .is_send = 0, .buf = recv, .bytes = bytes};
        return tp_comm_xfer(c, &x, 1);
    }
    const unsigned char *in = send;
    struct tp_xfer x[TP_ALGO_MAX_RANKS];
    int nx = 0;
    for (int p = 0; p < c->size; p++)
        if (p != root)
            x[nx++] = (struct tp_xfer){.peer = p, .is_send = 1, .buf = (void *)(in + (size_t)p * bytes), .bytes = bytes};
    enum tp_status rc = tp_comm_xfer(c, x, nx);
    if (rc == TP_OK && recv != in + (size_t)root * bytes) memmove(recv, in + (size_t)root * bytes, bytes);
    return rc;
}

static enum tp_status net_gather(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                 int root)
{
    const size_t bytes = count * tp_dtype_size(dt);
    if (c->rank != root) {
        struct tp_xfer x = {.peer = root, .is_send = 1, .buf = (void *)send, .bytes = bytes};
        return tp_comm_xfer(c, &x, 1);
    }
    unsigned char *out = recv;
    struct tp_xfer x[TP_ALGO_MAX_RANKS];
    int nx = 0;
    if (send != out + (size_t)root * bytes) memmove(out + (size_t)root * bytes, send, bytes);
    for (int p = 0; p < c->size; p++)
        if (p != root) x[nx++] = (struct tp_xfer){.peer = p, .is_send = 0, .buf = out + (size_t)p * bytes, .bytes = bytes};
    return tp_comm_xfer(c, x, nx);
}

static enum tp_status net_barrier(struct tp_comm *c)
{
    unsigned char out = 1, in[TP_ALGO_MAX_RANKS];
    struct tp_xfer x[2 * TP_ALGO_MAX_RANKS];
    int nx = 0;
    for (int p = 0; p < c->size; p++) {
        if (p == c->rank) continue;
        x[nx++] = (struct tp_xfer){.peer = p, .is_send = 1, .buf = &out, .bytes = 1};
        x[nx++] = (struct tp_xfer){.peer = p, .is_send = 0, .buf = &in[p], .bytes = 1};
    }
    return tp_comm_xfer(c, x, nx);
}

static enum tp_status net_send(struct tp_comm *c, const void *buf, size_t bytes, int peer)
{
    unsigned char hdr[8];
    for (int i = 0; i < 8; i++) hdr[i] = (unsigned char)((uint64_t)bytes >> (8 * i));
    struct tp_xfer x = {.peer = peer, .is_send = 1, .buf = hdr, .bytes = 8};
    enum tp_status rc = tp_comm_xfer(c, &x, 1);
    if (rc != TP_OK || bytes == 0) return rc;
    x = (struct tp_xfer){.peer = peer, .is_send = 1, .buf = (void *)buf, .bytes = bytes};
    return tp_comm_xfer(c, &x, 1);
}

static enum tp_status net_recv(struct tp_comm *c, void *buf, size_t bytes, int peer)
{
    unsigned char hdr[8];
    struct tp_xfer x = {.peer = peer, .is_send = 0, .buf = hdr, .bytes = 8};
    enum tp_status rc = tp_comm_xfer(c, &x, 1);
    if (rc != TP_OK) return rc;
    uint64_t got = 0;
    for (int i = 0; i < 8; i++) got |= (uint64_t)hdr[i] << (8 * i);
    if (got != (uint64_t)bytes)
        return tp_comm_fail(c, TP_ERR_PROTOCOL,
                            "rank %d sent %llu bytes but this recv expects %zu (send and recv counts or dtypes differ)",
                            peer, (unsigned long long)got, bytes);
    if (bytes == 0) return TP_OK;
    x = (struct tp_xfer){.peer = peer, .is_send = 0, .buf = buf, .bytes = bytes};
    return tp_comm_xfer(c, &x, 1);
}

const struct tp_coll_ops tp_net_coll_ops = {
    .all_reduce = net_all_reduce,
    .all_gather = net_all_gather,
    .reduce_scatter = net_reduce_scatter,
    .broadcast = net_broadcast,
    .scatter = net_scatter,
    .gather = net_gather,
    .barrier = net_barrier,
    .send = net_send,
    .recv = net_recv,
    .split = NULL, /* generic split in comm.c */
    .free = NULL,
};

/* ---------------------------------------------------------------- cost -- */

/* Bytes rank me sends in one ring all-reduce lane over segments len[0..n)
 * (reduce-scatter: every segment but its own; all-gather: every segment but
 * the one of its upstream neighbour me+dir). */
static uint64_t ring_lane_sent(size_t count, int n, int me, int dir, size_t es)
{
    const int up = ((me + dir) % n + n) % n;
    const uint64_t mine = seg_begin(count, n, me + 1) - seg_begin(count, n, me);
    const uint64_t upn = seg_begin(count, n, up + 1) - seg_begin(count, n, up);
    return (2 * (uint64_t)count - mine - upn) * es;
}

struct tp_comm_cost tp_comm_op_cost(enum tp_comm_op op, int world, int rank, int root, size_t count,
                                    enum tp_dtype dt)
{
    struct tp_comm_cost c = {0, 0};
    const size_t es = tp_dtype_size(dt), bytes = count * es;
    if (world <= 1 || rank < 0 || rank >= world || es == 0) return c;
    const uint64_t n1 = (uint64_t)(world - 1);
    switch (op) {
    case TP_COMM_OP_ALL_SUM: {
        const size_t limit = world == 2 ? TP_ALGO_SMALL_BYTES : TP_ALGO_SMALL_BYTES_N;
        if (bytes <= limit) {
            c.bytes_sent = n1 * bytes;
            c.rounds = 1;
        } else if (world == 2) {
            c.bytes_sent = bytes; /* the peer's half out, then its own reduced half */
            c.rounds = 2;
        } else { /* the ring, on two lanes (halves) from TP_ALGO_BIDIR_BYTES */
            const int nl = bytes >= TP_ALGO_BIDIR_BYTES ? 2 : 1;
            const size_t h0 = nl == 2 ? count / 2 : count;
            c.bytes_sent = ring_lane_sent(h0, world, rank, 1, es);
            if (nl == 2) c.bytes_sent += ring_lane_sent(count - h0, world, rank, -1, es);
            c.rounds = 2 * (world - 1);
        }
        break;
    }
    case TP_COMM_OP_ALL_GATHER:
        c.bytes_sent = n1 * bytes;
        c.rounds = world == 2 || bytes * n1 <= (1u << 20) ? 1 : world - 1;
        break;
    case TP_COMM_OP_BROADCAST:
        c.bytes_sent = rank == root ? n1 * bytes : 0;
        c.rounds = 1;
        break;
    case TP_COMM_OP_GATHER:
        c.bytes_sent = rank == root ? 0 : bytes;
        c.rounds = 1;
        break;
    default: break;
    }
    return c;
}
