/*
 * comm/backend_mpi.c - the mpi backend: every collective maps onto the MPI
 * call of the same meaning on a private duplicate of MPI_COMM_WORLD (or the
 * communicator made by split).  Rank and size come from MPI (mpirun, srun,
 * an MPIJob); f16/bf16 use user-defined MPI ops that reduce in f32.  Errors
 * are returned (MPI_ERRORS_RETURN) and poison the group.  MPI has no
 * per-operation timeout, so every call is the non-blocking variant finished
 * by polling MPI_Test until the group's op timeout (TP_COMM_TIMEOUT_MS) or
 * tp_comm_abort: a dead or stuck peer gives TP_ERR_TIMEOUT on every rank
 * that waits for it, instead of a hang.  A collective that never completed
 * cannot be cancelled, so after one the process leaves MPI without
 * MPI_Comm_free / MPI_Finalize (both could block forever) and mpirun then
 * stops the other ranks.  MPI_Init_thread is called on first use
 * (MPI_THREAD_SERIALIZED) and MPI_Finalize when the last mpi group is freed,
 * if we initialised MPI and nothing got stuck; a failed MPI_Init_thread is
 * TP_ERR_INIT with MPI's error string.  Built only with TP_HAVE_MPI; otherwise
 * the backend answers TP_ERR_NOT_BUILT.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"

#ifndef TP_HAVE_MPI

enum tp_status tp_mpi_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err)
{
    (void)cfg;
    (void)c;
    return tp_error_set(err, TP_ERR_NOT_BUILT,
                        "this tpserve was not built with MPI: install OpenMPI (libopenmpi-dev openmpi-bin) and "
                        "rebuild with -DTP_WITH_MPI=ON, or use --backend ring");
}

enum tp_status tp_mpi_start(struct tp_comm *c, int slot, int is_gather, const void *send, void *recv, size_t count,
                            enum tp_dtype dt)
{
    (void)slot;
    (void)is_gather;
    (void)send;
    (void)recv;
    (void)count;
    (void)dt;
    return tp_comm_fail(c, TP_ERR_NOT_BUILT, "not built with MPI");
}

enum tp_status tp_mpi_wait(struct tp_comm *c, int slot)
{
    (void)slot;
    return tp_comm_fail(c, TP_ERR_NOT_BUILT, "not built with MPI");
}

#else

#include <mpi.h>

struct mpi_state {
    MPI_Comm comm;
    MPI_Request reqs[TP_COMM_MAX_INFLIGHT];
    uint32_t timeout_ms;   /* per operation */
};

static int g_mpi_users;        /* live mpi groups (engine thread only) */
static int g_we_initialised;
static int g_stuck;            /* a request never completed: no MPI_Comm_free / MPI_Finalize */
static MPI_Op g_half_ops[2][TP_RED_COUNT]; /* [bf16][op] */

#define MPI_CHUNK ((size_t)1 << 30) /* elements per call: MPI counts are int */

static void half_op(void *in, void *inout, int *len, enum tp_dtype dt, enum tp_red_op op)
{
    tp_reduce(inout, in, inout, (size_t)*len, dt, op);
}
#define HALF_FN(NAME, DT, OP)                                                 \
    static void NAME(void *in, void *inout, int *len, MPI_Datatype *type)    \
    {                                                                         \
        (void)type;                                                           \
        half_op(in, inout, len, DT, OP);                                      \
    }
HALF_FN(f16_sum, TP_DTYPE_F16, TP_RED_SUM)
HALF_FN(f16_max, TP_DTYPE_F16, TP_RED_MAX)
HALF_FN(f16_min, TP_DTYPE_F16, TP_RED_MIN)
HALF_FN(bf16_sum, TP_DTYPE_BF16, TP_RED_SUM)
HALF_FN(bf16_max, TP_DTYPE_BF16, TP_RED_MAX)
HALF_FN(bf16_min, TP_DTYPE_BF16, TP_RED_MIN)

static MPI_Datatype mpi_type(enum tp_dtype dt)
{
    switch (dt) {
    case TP_DTYPE_F32: return MPI_FLOAT;
    case TP_DTYPE_I32: return MPI_INT32_T;
    case TP_DTYPE_I64: return MPI_INT64_T;
    case TP_DTYPE_U8: return MPI_UINT8_T;
    default: return MPI_UINT16_T; /* f16, bf16: raw bits, reduced by our ops */
    }
}

static MPI_Op mpi_op(enum tp_dtype dt, enum tp_red_op op)
{
    if (dt == TP_DTYPE_F16 || dt == TP_DTYPE_BF16) return g_half_ops[dt == TP_DTYPE_BF16][op];
    return op == TP_RED_SUM ? MPI_SUM : op == TP_RED_MAX ? MPI_MAX : MPI_MIN;
}

static enum tp_status mpi_fail(struct tp_comm *c, const char *what, int code)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", code);
    return tp_comm_fail(c, TP_ERR_PEER, "%s failed: %s", what, text);
}

#define ST(c) ((struct mpi_state *)(c)->mpi)
#define CALL(c, what, expr)                                 \
    do {                                                    \
        int e_ = (expr);                                    \
        if (e_ != MPI_SUCCESS) return mpi_fail(c, what, e_); \
    } while (0)

#define MPI_SPIN_NS 1000000ull /* poll MPI_Test flat out this long, then 50 us naps */

/* Drive *rq to completion (MPI_Test) within the op timeout; status may be
 * NULL.  On timeout or abort the request stays pending for good. */
static enum tp_status finish(struct tp_comm *c, MPI_Request *rq, MPI_Status *status, const char *what)
{
    const uint64_t t0 = tp_now_ns(), limit = (uint64_t)ST(c)->timeout_ms * 1000000ull;
    for (;;) {
        int done = 0;
        int e = MPI_Test(rq, &done, status ? status : MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) return mpi_fail(c, what, e);
        if (done) return TP_OK;
        const uint64_t dt = tp_now_ns() - t0;
        if (atomic_load(&c->poisoned) || dt > limit) {
            g_stuck = 1;
            if (dt > limit)
                return tp_comm_fail(c, TP_ERR_TIMEOUT,
                                    "%s: no progress for %u ms: another rank is dead, stuck or far behind (raise "
                                    "TP_COMM_TIMEOUT_MS if it is only slow)",
                                    what, ST(c)->timeout_ms);
            return tp_comm_fail(c, TP_ERR_CANCELLED, "%s: aborted", what);
        }
        if (dt > MPI_SPIN_NS) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Start a non-blocking call (expr fills rq) and finish it. */
#define RUN(c, what, rq, expr)                                   \
    do {                                                         \
        int e_ = (expr);                                         \
        if (e_ != MPI_SUCCESS) return mpi_fail(c, what, e_);     \
        enum tp_status s_ = finish(c, &(rq), NULL, what);        \
        if (s_ != TP_OK) return s_;                              \
    } while (0)

/* MPI moves the bytes itself: count the payload (what the caller handed in
 * and got back), not MPI's internal traffic. */
static void account(struct tp_comm *c, size_t sent, size_t received)
{
    c->stats.bytes_sent += sent;
    c->stats.bytes_received += received;
}

static enum tp_status m_all_reduce(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                   enum tp_red_op op)
{
    const size_t es = tp_dtype_size(dt);
    account(c, count * es, count * es);
    for (size_t o = 0; o < count; o += MPI_CHUNK) {
        int n = (int)TP_MIN(MPI_CHUNK, count - o);
        const void *s = send == recv ? MPI_IN_PLACE : (const unsigned char *)send + o * es;
        MPI_Request rq;
        RUN(c, "MPI_Allreduce", rq,
            MPI_Iallreduce(s, (unsigned char *)recv + o * es, n, mpi_type(dt), mpi_op(dt, op), ST(c)->comm, &rq));
    }
    return TP_OK;
}

static enum tp_status too_big(struct tp_comm *c, const char *op, size_t count)
{
    return tp_comm_fail(c, TP_ERR_UNSUPPORTED, "mpi %s: count %zu exceeds INT_MAX elements", op, count);
}

static enum tp_status m_all_gather(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt)
{
    if (count > INT_MAX) return too_big(c, "all_gather", count);
    const size_t bytes = count * tp_dtype_size(dt);
    const void *s = send == (unsigned char *)recv + (size_t)c->rank * bytes ? MPI_IN_PLACE : send;
    account(c, bytes, bytes * (size_t)(c->size - 1));
    MPI_Request rq;
    RUN(c, "MPI_Allgather", rq,
        MPI_Iallgather(s, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt), ST(c)->comm, &rq));
    return TP_OK;
}

static enum tp_status m_reduce_scatter(struct tp_comm *c, const void *send, void *recv, size_t count,
                                       enum tp_dtype dt)
{
    if (count > INT_MAX) return too_big(c, "sum_scatter", count);
    MPI_Request rq;
    RUN(c, "MPI_Reduce_scatter_block", rq,
        MPI_Ireduce_scatter_block(send, recv, (int)count, mpi_type(dt), mpi_op(dt, TP_RED_SUM), ST(c)->comm, &rq));
    return TP_OK;
}

static enum tp_status m_broadcast(struct tp_comm *c, void *buf, size_t count, enum tp_dtype dt, int root)
{
    const size_t es = tp_dtype_size(dt);
    for (size_t o = 0; o < count; o += MPI_CHUNK) {
        int n = (int)TP_MIN(MPI_CHUNK, count - o);
        MPI_Request rq;
        RUN(c, "MPI_Bcast", rq, MPI_Ibcast((unsigned char *)buf + o * es, n, mpi_type(dt), root, ST(c)->comm, &rq));
    }
    return TP_OK;
}

static enum tp_status m_scatter(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                int root)
{
    if (count > INT_MAX) return too_big(c, "scatter", count);
    const size_t bytes = count * tp_dtype_size(dt);
    void *r = recv;
    if (c->rank == root && recv == (const unsigned char *)send + (size_t)root * bytes) r = MPI_IN_PLACE;
    MPI_Request rq;
    RUN(c, "MPI_Scatter", rq,
        MPI_Iscatter(send, (int)count, mpi_type(dt), r, (int)count, mpi_type(dt), root, ST(c)->comm, &rq));
    return TP_OK;
}

static enum tp_status m_gather(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                               int root)
{
    if (count > INT_MAX) return too_big(c, "gather", count);
    const size_t bytes = count * tp_dtype_size(dt);
    const void *s = send;
    if (c->rank == root && send == (unsigned char *)recv + (size_t)root * bytes) s = MPI_IN_PLACE;
    MPI_Request rq;
    RUN(c, "MPI_Gather", rq,
        MPI_Igather(s, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt), root, ST(c)->comm, &rq));
    return TP_OK;
}

static enum tp_status m_barrier(struct tp_comm *c)
{
    MPI_Request rq;
    RUN(c, "MPI_Barrier", rq, MPI_Ibarrier(ST(c)->comm, &rq));
    return TP_OK;
}

static enum tp_status m_send(struct tp_comm *c, const void *buf, size_t bytes, int peer)
{
    for (size_t o = 0; o == 0 || o < bytes; o += MPI_CHUNK) {
        int n = (int)TP_MIN(MPI_CHUNK, bytes - o);
        MPI_Request rq;
        RUN(c, "MPI_Send", rq, MPI_Isend((const unsigned char *)buf + o, n, MPI_BYTE, peer, 0, ST(c)->comm, &rq));
    }
    return TP_OK;
}

static enum tp_status m_recv(struct tp_comm *c, void *buf, size_t bytes, int peer)
{
    for (size_t o = 0; o == 0 || o < bytes; o += MPI_CHUNK) {
        int n = (int)TP_MIN(MPI_CHUNK, bytes - o), got = 0;
        MPI_Status status;
        MPI_Request rq;
        CALL(c, "MPI_Irecv", MPI_Irecv((unsigned char *)buf + o, n, MPI_BYTE, peer, 0, ST(c)->comm, &rq));
        enum tp_status fs = finish(c, &rq, &status, "MPI_Recv");
        if (fs != TP_OK) return fs;
        MPI_Get_count(&status, MPI_BYTE, &got);
        if (got != n)
            return tp_comm_fail(c, TP_ERR_PROTOCOL,
                                "rank %d sent %d bytes but this recv expects %d (send and recv counts or dtypes differ)",
                                peer, got, n);
    }
    return TP_OK;
}

static int g_ops_ready;
static void make_ops(void)
{
    if (g_ops_ready) return;
    MPI_Op_create(f16_sum, 1, &g_half_ops[0][TP_RED_SUM]);
    MPI_Op_create(f16_max, 1, &g_half_ops[0][TP_RED_MAX]);
    MPI_Op_create(f16_min, 1, &g_half_ops[0][TP_RED_MIN]);
    MPI_Op_create(bf16_sum, 1, &g_half_ops[1][TP_RED_SUM]);
    MPI_Op_create(bf16_max, 1, &g_half_ops[1][TP_RED_MAX]);
    MPI_Op_create(bf16_min, 1, &g_half_ops[1][TP_RED_MIN]);
    g_ops_ready = 1;
}

static void m_free(struct tp_comm *c)
{
    struct mpi_state *st = ST(c);
    if (!st) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !g_stuck && st->comm != MPI_COMM_NULL) MPI_Comm_free(&st->comm);
    free(st);
    c->mpi = NULL;
    if (--g_mpi_users == 0 && g_stuck && g_we_initialised && !finalized) {
        tp_log(TP_LOG_WARN, TP_COMM_MODULE,
               "mpi: a collective never completed; leaving MPI without MPI_Finalize (mpirun will stop the other "
               "ranks)");
        return;
    }
    if (g_mpi_users == 0 && g_we_initialised && !finalized) {
        for (int b = 0; b < 2; b++)
            for (int o = 0; o < TP_RED_COUNT; o++) MPI_Op_free(&g_half_ops[b][o]);
        g_ops_ready = 0;
        MPI_Finalize();
    }
}

static enum tp_status m_split(struct tp_comm *c, int color, int key, struct tp_comm **out);

static const struct tp_coll_ops mpi_ops = {
    .all_reduce = m_all_reduce,
    .all_gather = m_all_gather,
    .reduce_scatter = m_reduce_scatter,
    .broadcast = m_broadcast,
    .scatter = m_scatter,
    .gather = m_gather,
    .barrier = m_barrier,
    .send = m_send,
    .recv = m_recv,
    .split = m_split,
    .free = m_free,
};

/* Make c a group over comm, which it takes over: on failure (TP_ERR_NOMEM)
 * comm is freed and c is left untouched. */
static enum tp_status attach(struct tp_comm *c, MPI_Comm comm, uint32_t timeout_ms)
{
    int size = 0;
    MPI_Comm_size(comm, &size);
    struct mpi_state *st = calloc(1, sizeof *st);
    int *peer_of = size > 0 ? malloc((size_t)size * sizeof(int)) : NULL;
    if (!st || !peer_of) {
        free(st);
        free(peer_of);
        MPI_Comm_free(&comm);
        return TP_ERR_NOMEM;
    }
    st->comm = comm;
    st->timeout_ms = timeout_ms ? timeout_ms : 30000;
    for (int i = 0; i < TP_COMM_MAX_INFLIGHT; i++) st->reqs[i] = MPI_REQUEST_NULL;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &c->rank);
    c->size = size;
    c->mpi = st;
    c->ops = &mpi_ops;
    g_mpi_users++;
    c->peer_of = peer_of;
    for (int i = 0; i < c->size; i++) c->peer_of[i] = i;
    return TP_OK;
}

static enum tp_status m_split(struct tp_comm *c, int color, int key, struct tp_comm **out)
{
    MPI_Comm nc = MPI_COMM_NULL;
    CALL(c, "MPI_Comm_split", MPI_Comm_split(ST(c)->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc));
    if (nc == MPI_COMM_NULL) return TP_OK;
    struct tp_comm *sub = tp_comm_alloc_child(c);
    if (!sub) {
        MPI_Comm_free(&nc);
        return tp_comm_fail(c, TP_ERR_NOMEM, "split: out of memory");
    }
    enum tp_status rc = attach(sub, nc, ST(c)->timeout_ms);
    if (rc != TP_OK) {
        tp_comm_release(sub);
        return tp_comm_fail(c, rc, "split: out of memory");
    }
    *out = sub;
    return TP_OK;
}

enum tp_status tp_mpi_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err)
{
    int inited = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return tp_error_set(err, TP_ERR_UNSUPPORTED,
                            "MPI was already finalized in this process (keep one mpi group alive for the whole run)");
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        int code = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (code != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            int len = 0;
            if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", code);
            return tp_error_set(err, TP_ERR_INIT, "MPI_Init_thread failed: %s (run under mpirun / srun)", text);
        }
        g_we_initialised = 1;
    }
    make_ops();
    MPI_Comm dup = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS)
        return tp_error_set(err, TP_ERR_PEER, "MPI_Comm_dup(MPI_COMM_WORLD) failed");
    enum tp_status rc = attach(c, dup, cfg->op_timeout_ms);
    if (rc != TP_OK) return tp_error_set(err, rc, "mpi: out of memory for the group over MPI_COMM_WORLD");
    if (cfg->world_size > 1 && c->size != cfg->world_size)
        return tp_error_set(err, TP_ERR_INVALID_ARG,
                            "world size %d was requested but MPI has %d ranks: start with 'mpirun -n %d' (or "
                            "'tpserve launch -n %d --backend mpi')",
                            cfg->world_size, c->size, cfg->world_size, cfg->world_size);
    if (cfg->rank >= 0 && cfg->rank != c->rank)
        tp_log(TP_LOG_WARN, TP_COMM_MODULE, "TP_RANK=%d ignored: MPI says this is rank %d", cfg->rank, c->rank);
    return TP_OK;
}

enum tp_status tp_mpi_start(struct tp_comm *c, int slot, int is_gather, const void *send, void *recv, size_t count,
                            enum tp_dtype dt)
{
    if (count > INT_MAX) return too_big(c, is_gather ? "all_gather_start" : "all_sum_start", count);
    MPI_Request *rq = &ST(c)->reqs[slot];
    const size_t bytes = count * tp_dtype_size(dt);
    account(c, bytes, is_gather ? bytes * (size_t)(c->size - 1) : bytes);
    if (is_gather) {
        const void *s = send == (unsigned char *)recv + (size_t)c->rank * bytes ? MPI_IN_PLACE : send;
        CALL(c, "MPI_Iallgather",
             MPI_Iallgather(s, (int)count, mpi_type(dt), recv, (int)count, mpi_type(dt), ST(c)->comm, rq));
    } else {
        const void *s = send == recv ? MPI_IN_PLACE : send;
        CALL(c, "MPI_Iallreduce",
             MPI_Iallreduce(s, recv, (int)count, mpi_type(dt), mpi_op(dt, TP_RED_SUM), ST(c)->comm, rq));
    }
    c->stats.n_ops++;
    return TP_OK;
}

enum tp_status tp_mpi_wait(struct tp_comm *c, int slot)
{
    MPI_Request *rq = &ST(c)->reqs[slot];
    if (*rq == MPI_REQUEST_NULL) return TP_OK;
    uint64_t t0 = tp_now_ns();
    enum tp_status st = finish(c, rq, NULL, "MPI_Wait");
    tp_comm_op_done(c, t0);
    return st;
}

#endif /* TP_HAVE_MPI */
