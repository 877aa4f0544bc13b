/*
 * comm/comm.c - the public API of comm/comm.h: configuration (struct and
 * environment), group life cycle, argument checks, the poison rule, stats,
 * split, and the non-blocking requests.
 *
 * Every collective goes through one wrapper (run_op) that: rejects calls on
 * a poisoned group (TP_ERR_POISONED at once), answers size-1 groups with a
 * local copy, waits for queued non-blocking requests (they complete in start
 * order), times the call for the stats, and dispatches to the backend's
 * collective table.
 *
 * Non-blocking requests (ring, rdma): a progress thread per group, created
 * on the first *_start, executes queued requests in order while the caller
 * computes; tp_comm_wait blocks on a condition variable.  On the mpi
 * backend *_start maps to MPI_Iallreduce / MPI_Iallgather.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

_Static_assert(TP_DTYPE_COUNT == 6, "update dtype tables");
_Static_assert(TP_COMM_BACKEND_COUNT == 3, "update backend tables");

enum req_kind { REQ_ALL_SUM = 0, REQ_ALL_GATHER };
enum req_state { REQ_FREE = 0, REQ_QUEUED, REQ_DONE };

struct tp_comm_request {
    int kind;
    int state;
    int mpi_pending;
    const void *send;
    void *recv;
    size_t count;
    enum tp_dtype dt;
    enum tp_status st;
};

/* ------------------------------------------------------------------ names */

size_t tp_dtype_size(enum tp_dtype dt)
{
    static const size_t sz[TP_DTYPE_COUNT] = {4, 2, 2, 4, 8, 1};
    return (unsigned)dt < TP_DTYPE_COUNT ? sz[dt] : 0;
}

const char *tp_dtype_name(enum tp_dtype dt)
{
    static const char *nm[TP_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "i64", "u8"};
    return (unsigned)dt < TP_DTYPE_COUNT ? nm[dt] : "invalid";
}

const char *tp_comm_backend_name(enum tp_comm_backend b)
{
    static const char *nm[TP_COMM_BACKEND_COUNT] = {"ring", "rdma", "mpi"};
    return (unsigned)b < TP_COMM_BACKEND_COUNT ? nm[b] : "invalid";
}

enum tp_status tp_comm_backend_parse(const char *s, enum tp_comm_backend *out)
{
    for (int b = 0; b < TP_COMM_BACKEND_COUNT && s; b++)
        if (strcmp(s, tp_comm_backend_name((enum tp_comm_backend)b)) == 0) {
            *out = (enum tp_comm_backend)b;
            return TP_OK;
        }
    return TP_ERR_INVALID_ARG;
}

/* ------------------------------------------------------------------ config */

struct tp_comm_config tp_comm_default_config(void)
{
    struct tp_comm_config c;
    memset(&c, 0, sizeof c);
    c.backend = TP_COMM_BACKEND_RING;
    c.rank = -1;
    c.world_size = -1;
    c.op_timeout_ms = 30000;
    c.connect_timeout_ms = 60000;
    c.listen_fd = -1;
    return c;
}

static enum tp_status env_long(const char *name, long lo, long hi, long *out, int *set, struct tp_error *err)
{
    const char *v = getenv(name);
    *set = 0;
    if (!v) return TP_OK;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || errno || *end || x < lo || x > hi)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "%s='%s' is not an integer in %ld..%ld", name, v, lo, hi);
    *out = x;
    *set = 1;
    return TP_OK;
}

enum tp_status tp_comm_config_from_env(struct tp_comm_config *cfg, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    long v;
    int set;
    const char *b = getenv("TP_BACKEND");
    if (b && tp_comm_backend_parse(b, &cfg->backend) != TP_OK)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "TP_BACKEND='%s' is not one of ring, rdma, mpi", b);
    TP_CHECK_GOTO(env_long("TP_RANK", 0, 1 << 20, &v, &set, err), rc, out);
    if (set) cfg->rank = (int)v;
    TP_CHECK_GOTO(env_long("TP_WORLD_SIZE", 1, 1 << 20, &v, &set, err), rc, out);
    if (set) cfg->world_size = (int)v;
    TP_CHECK_GOTO(env_long("TP_COMM_TIMEOUT_MS", 1, 86400000L, &v, &set, err), rc, out);
    if (set) cfg->op_timeout_ms = (uint32_t)v;
    TP_CHECK_GOTO(env_long("TP_COMM_CONNECT_TIMEOUT_MS", 1, 86400000L, &v, &set, err), rc, out);
    if (set) cfg->connect_timeout_ms = (uint32_t)v;
    TP_CHECK_GOTO(env_long("TP_COMM_SHM", 0, 1, &v, &set, err), rc, out);
    if (set) cfg->shm = (int)v;
    TP_CHECK_GOTO(env_long("TP_LISTEN_FD", 3, 1 << 20, &v, &set, err), rc, out);
    if (set) cfg->listen_fd = (int)v;
    TP_CHECK_GOTO(env_long("TP_COMM_SIM_LATENCY_US", 0, 1000000L, &v, &set, err), rc, out);
    if (set) cfg->sim_latency_us = (uint32_t)v;
    const char *s;
    if ((s = getenv("TP_HOSTFILE")) != NULL) cfg->hostfile = s;
    if ((s = getenv("TP_COORDINATOR")) != NULL) cfg->coordinator = s;
    if ((s = getenv("TP_CLUSTER_TOKEN")) != NULL) cfg->cluster_token = s;
    if ((s = getenv("TP_GROUP_ID")) != NULL) cfg->group_id = s;
out:
    return rc;
}

/* rank/size published by mpirun / srun / PMI launchers. */
void tp_comm_launcher_env(int *rank, int *size)
{
    static const char *const rk[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    static const char *const sz[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    *rank = -1;
    *size = -1;
    for (size_t i = 0; i < TP_ARRAY_LEN(rk); i++) {
        const char *r = getenv(rk[i]);
        const char *s = sz[i] ? getenv(sz[i]) : NULL;
        if (r && s) {
            *rank = atoi(r);
            *size = atoi(s);
            return;
        }
    }
}

/* ------------------------------------------------------------------ errors */

static void set_err_once(atomic_int *claimed, struct tp_error *e, enum tp_status st, const char *msg)
{
    if (atomic_exchange(claimed, 1) == 0) {
        e->status = st;
        snprintf(e->msg, sizeof e->msg, "%s", msg);
    }
}

enum tp_status tp_comm_fail(struct tp_comm *c, enum tp_status st, const char *fmt, ...)
{
    char msg[TP_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    set_err_once(&c->err_claimed, &c->err, st, msg);
    atomic_store(&c->poisoned, 1);
    tp_net_poison(c->net, st, msg);
    tp_log(TP_LOG_ERROR, TP_COMM_MODULE, "rank %d: %s", c->rank, msg);
    return st;
}

enum tp_status tp_comm_xfer(struct tp_comm *c, struct tp_xfer *x, int n)
{
    for (int i = 0; i < n; i++) {
        if (x[i].started) continue;
        x[i].started = 1;
        x[i].peer = c->peer_of[x[i].peer];
        x[i].done = 0;
        if (x[i].is_send)
            c->stats.bytes_sent += x[i].bytes;
        else
            c->stats.bytes_received += x[i].bytes;
    }
    struct tp_error e = {0};
    enum tp_status st = c->net->tops->xfer(c->net, x, n, &e);
    if (st != TP_OK) {
        if (st == TP_ERR_POISONED) {
            set_err_once(&c->err_claimed, &c->err, st, e.msg);
            atomic_store(&c->poisoned, 1);
            return st;
        }
        return tp_comm_fail(c, st, "%s", e.msg);
    }
    return TP_OK;
}

const char *tp_comm_last_error(const tp_comm_t *c)
{
    if (!c) return "";
    if (c->err.msg[0]) return c->err.msg;
    if (c->net && c->net->err.msg[0]) return c->net->err.msg;
    return "";
}

int tp_comm_is_poisoned(const tp_comm_t *c)
{
    if (!c) return 1;
    return atomic_load(&c->poisoned) || (c->net && atomic_load(&c->net->poisoned));
}

void tp_comm_abort(tp_comm_t *c, const char *reason)
{
    if (!c) return;
    const char *r = reason && *reason ? reason : "aborted by tp_comm_abort";
    set_err_once((atomic_int *)&c->err_claimed, &c->err, TP_ERR_CANCELLED, r);
    atomic_store(&c->poisoned, 1);
    tp_net_poison(c->net, TP_ERR_CANCELLED, r);
}

int tp_comm_silent_rank(const tp_comm_t *c, uint32_t silent_ms, uint32_t *silent_for_ms)
{
    if (silent_for_ms) *silent_for_ms = 0;
    if (!c || c->size == 1 || !c->net) return -1;
    return tp_live_silent(c->net, silent_ms, silent_for_ms);
}

int tp_comm_lost_rank(const tp_comm_t *c, uint32_t silent_ms, uint32_t *silent_for_ms)
{
    if (silent_for_ms) *silent_for_ms = 0;
    if (!c || c->size == 1 || !c->net) return -1;
    return tp_live_lost(c->net, silent_ms, silent_for_ms);
}

uint32_t tp_comm_epoch(const tp_comm_t *c) { return c && c->size > 1 && c->net ? c->net->epoch : 0; }
int tp_comm_dropped_rank(const tp_comm_t *c) { return c && c->net ? c->net->dropped : 0; }

uint64_t tp_comm_skip_add(uint64_t skip, int rank)
{
    for (int i = 0, r = 0; i < 64; i++) {
        if (skip & (1ull << i)) continue;
        if (r++ == rank) return skip | (1ull << i);
    }
    return skip;
}
int tp_comm_rank(const tp_comm_t *c) { return c ? c->rank : -1; }
int tp_comm_size(const tp_comm_t *c) { return c ? c->size : 0; }
enum tp_comm_backend tp_comm_backend(const tp_comm_t *c) { return c ? c->backend : TP_COMM_BACKEND_RING; }

const char *tp_comm_transport(const tp_comm_t *c)
{
    if (!c || c->size == 1) return "none";
    if (c->net && c->net->tops && c->net->tops->name) return c->net->tops->name;
    return tp_comm_backend_name(c->backend); /* mpi */
}

void tp_comm_get_stats(const tp_comm_t *c, struct tp_comm_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (c) *out = c->stats;
    if (c && c->net) {
        out->n_sleeps = atomic_load_explicit(&c->net->n_sleeps, memory_order_relaxed);
        out->n_sleeps_full = atomic_load_explicit(&c->net->n_sleeps_full, memory_order_relaxed);
    }
}

size_t tp_comm_op_times(const tp_comm_t *c, const uint64_t **ts)
{
    if (ts) *ts = c ? c->op_ts : NULL;
    return c ? c->op_n : 0;
}

void tp_comm_op_done(struct tp_comm *c, uint64_t t0)
{
    const uint64_t t1 = tp_now_ns();
    c->stats.ns_in_comm += t1 - t0;
    if (c->op_n < c->op_cap) {
        c->op_ts[2 * c->op_n] = t0;
        c->op_ts[2 * c->op_n + 1] = t1;
        c->op_n++;
    }
}

/* ------------------------------------------------------------------ life cycle */

static struct tp_comm *comm_alloc(void)
{
    struct tp_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    atomic_init(&c->poisoned, 0);
    atomic_init(&c->err_claimed, 0);
    return c;
}

static enum tp_status identity_peers(struct tp_comm *c)
{
    c->peer_of = malloc((size_t)c->size * sizeof(int));
    if (!c->peer_of) return TP_ERR_NOMEM;
    for (int i = 0; i < c->size; i++) c->peer_of[i] = i;
    return TP_OK;
}

enum tp_status tp_ring_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    c->rank = cfg->rank;
    c->size = cfg->world_size;
    c->ops = &tp_net_coll_ops;
    if (c->size == 1) return identity_peers(c) == TP_OK ? TP_OK : tp_error_set(err, TP_ERR_NOMEM, "out of memory");
    if (c->size > TP_ALGO_MAX_RANKS)
        return tp_error_set(err, TP_ERR_UNSUPPORTED, "the %s backend supports at most %d ranks (got %d)",
                            tp_comm_backend_name(cfg->backend), TP_ALGO_MAX_RANKS, c->size);
    TP_CHECK_GOTO(tp_tcp_net_create(c->rank, c->size, cfg->op_timeout_ms, &c->net, err), rc, out);
    c->net->sim_latency_us = cfg->sim_latency_us > 1000000u ? 1000000u : cfg->sim_latency_us;
    TP_CHECK_GOTO(tp_bootstrap_tcp(cfg, c->net, err), rc, out);
    c->rank = c->net->rank; /* a shrinking group renumbers a joining worker */
    c->size = c->net->size;
    if (cfg->shm && c->size <= TP_SHM_MAX_RANKS) {
        int attached = 0;
        TP_CHECK_GOTO(tp_shm_attach(c->net, cfg->connect_timeout_ms, &attached, err), rc, out);
    } else if (cfg->shm && c->rank == 0) {
        tp_log(TP_LOG_INFO, TP_COMM_MODULE, "shm: %d ranks are more than the shared rings serve (%d); staying on TCP",
               c->size, TP_SHM_MAX_RANKS);
    }
    if (identity_peers(c) != TP_OK) rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory");
out:
    return rc;
}

static void comm_release(struct tp_comm *c);

enum tp_status tp_comm_init(const struct tp_comm_config *cfg_in, tp_comm_t **out, struct tp_error *err)
{
    enum tp_status rc = TP_OK;
    struct tp_comm *c = NULL;
    if (!out) return tp_error_set(err, TP_ERR_INVALID_ARG, "tp_comm_init: out is NULL");
    *out = NULL;
    struct tp_comm_config cfg = cfg_in ? *cfg_in : tp_comm_default_config();
    if ((unsigned)cfg.backend >= TP_COMM_BACKEND_COUNT)
        return tp_error_set(err, TP_ERR_INVALID_ARG, "unknown backend %d (want ring, rdma or mpi)", (int)cfg.backend);
    if (cfg.op_timeout_ms == 0) cfg.op_timeout_ms = 30000;
    if (cfg.connect_timeout_ms == 0) cfg.connect_timeout_ms = 60000;
    if (cfg.backend != TP_COMM_BACKEND_MPI) {
        if (cfg.rank < 0 || cfg.world_size < 0) {
            int lr, ls;
            tp_comm_launcher_env(&lr, &ls);
            if (cfg.rank < 0) cfg.rank = lr;
            if (cfg.world_size < 0) cfg.world_size = ls;
        }
        if (cfg.world_size < 0 && cfg.hostfile && *cfg.hostfile) {
            struct tp_hostfile hf;
            TP_CHECK_GOTO(tp_hostfile_load(cfg.hostfile, &hf, err), rc, fail);
            cfg.world_size = hf.n;
            tp_hostfile_free(&hf);
        }
        if (cfg.world_size < 0) cfg.world_size = 1;
        if (cfg.rank < 0 && cfg.world_size == 1) cfg.rank = 0;
        if (cfg.world_size < 1) {
            rc = tp_error_set(err, TP_ERR_INVALID_ARG, "world size %d is invalid (TP_WORLD_SIZE must be >= 1)",
                              cfg.world_size);
            goto fail;
        }
        if (cfg.rank < 0) {
            rc = tp_error_set(err, TP_ERR_INVALID_ARG, "world size is %d but no rank given: set TP_RANK (0..%d)",
                              cfg.world_size, cfg.world_size - 1);
            goto fail;
        }
        if (cfg.rank >= cfg.world_size) {
            rc = tp_error_set(err, TP_ERR_INVALID_ARG,
                              "rank %d is out of range for world size %d (TP_RANK must be 0..%d)", cfg.rank,
                              cfg.world_size, cfg.world_size - 1);
            goto fail;
        }
    }
    c = comm_alloc();
    if (!c) return tp_error_set(err, TP_ERR_NOMEM, "out of memory for the group");
    c->backend = cfg.backend;
    switch (cfg.backend) {
    case TP_COMM_BACKEND_RING: TP_CHECK_GOTO(tp_ring_init(&cfg, c, err), rc, fail); break;
    case TP_COMM_BACKEND_RDMA: TP_CHECK_GOTO(tp_rdma_init(&cfg, c, err), rc, fail); break;
    case TP_COMM_BACKEND_MPI: TP_CHECK_GOTO(tp_mpi_init(&cfg, c, err), rc, fail); break;
    default: break;
    }
    if (pthread_mutex_init(&c->q_mu, NULL) != 0 || pthread_cond_init(&c->q_cv, NULL) != 0) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "cannot create the request queue lock");
        goto fail;
    }
    c->q_inited = 1;
    c->q_slots = calloc(TP_COMM_MAX_INFLIGHT, sizeof *c->q_slots);
    if (!c->q_slots) {
        rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for the request queue");
        goto fail;
    }
    if (cfg.op_log > 0 && cfg.op_log <= ((size_t)1 << 24)) {
        c->op_ts = malloc(cfg.op_log * 2 * sizeof *c->op_ts);
        if (!c->op_ts) {
            rc = tp_error_set(err, TP_ERR_NOMEM, "out of memory for the op log of %zu collectives", cfg.op_log);
            goto fail;
        }
        c->op_cap = cfg.op_log;
    }
    *out = c;
    return TP_OK;
fail:
    comm_release(c);
    return rc;
}

static void queue_stop(struct tp_comm *c)
{
    if (!c->q_started) return;
    pthread_mutex_lock(&c->q_mu);
    if (c->q_head != c->q_tail) {
        pthread_mutex_unlock(&c->q_mu);
        tp_comm_abort(c, "group freed with non-blocking requests in flight");
        pthread_mutex_lock(&c->q_mu);
    }
    c->q_stop = 1;
    pthread_cond_broadcast(&c->q_cv);
    pthread_mutex_unlock(&c->q_mu);
    pthread_join(c->q_thread, NULL);
    c->q_started = 0;
}

static void comm_release(struct tp_comm *c)
{
    if (!c) return;
    queue_stop(c);
    if (c->ops && c->ops->free) c->ops->free(c);
    tp_net_release(c->net);
    free(c->peer_of);
    tp_aligned_free(c->small);
    for (int i = 0; i < 2; i++) {
        tp_aligned_free(c->stage[i]);
        tp_aligned_free(c->acc[i]);
    }
    free(c->q_slots);
    free(c->op_ts);
    if (c->q_inited) {
        pthread_mutex_destroy(&c->q_mu);
        pthread_cond_destroy(&c->q_cv);
    }
    free(c);
}

void tp_comm_free(tp_comm_t *c) { comm_release(c); }

/* ------------------------------------------------------------------ op wrapper */

static void queue_drain(struct tp_comm *c)
{
    if (!c->q_started) return;
    pthread_mutex_lock(&c->q_mu);
    while (c->q_head != c->q_tail) pthread_cond_wait(&c->q_cv, &c->q_mu);
    pthread_mutex_unlock(&c->q_mu);
}

static enum tp_status check_common(struct tp_comm *c, const char *op, size_t count, enum tp_dtype dt, size_t mult,
                                   size_t *bytes)
{
    if (!c) return TP_ERR_INVALID_ARG;
    if (tp_comm_is_poisoned(c)) return TP_ERR_POISONED;
    size_t es = tp_dtype_size(dt);
    size_t b = 0, total = 0;
    if (es == 0) return tp_comm_fail(c, TP_ERR_INVALID_ARG, "%s: invalid dtype %d", op, (int)dt);
    if (tp_mul_size(count, es, &b) != 0 || tp_mul_size(b, mult, &total) != 0 || total > ((size_t)1 << 62))
        return tp_comm_fail(c, TP_ERR_INVALID_ARG, "%s: count %zu of %s overflows", op, count, tp_dtype_name(dt));
    *bytes = b;
    return TP_OK;
}

#define BEGIN_OP(c)                     \
    queue_drain(c);                     \
    uint64_t t0_ = tp_now_ns();         \
    (c)->stats.n_ops++
#define END_OP(c) tp_comm_op_done(c, t0_)

static enum tp_status do_all_reduce(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                    enum tp_red_op op, int from_queue)
{
    static const char *names[TP_RED_COUNT] = {"all_sum", "all_max", "all_min"};
    size_t bytes;
    enum tp_status rc = check_common(c, names[op], count, dt, 1, &bytes);
    if (rc != TP_OK) return rc;
    if (count == 0) return TP_OK;
    if (!send || !recv) return tp_comm_fail(c, TP_ERR_INVALID_ARG, "%s: NULL buffer", names[op]);
    if (c->size == 1) {
        if (send != recv) memmove(recv, send, bytes);
        c->stats.n_ops++;
        return TP_OK;
    }
    if (!from_queue) queue_drain(c);
    uint64_t t0 = tp_now_ns();
    c->stats.n_ops++;
    rc = c->ops->all_reduce(c, send, recv, count, dt, op);
    tp_comm_op_done(c, t0);
    return rc;
}

enum tp_status tp_comm_all_sum(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt)
{
    return do_all_reduce(c, send, recv, count, dt, TP_RED_SUM, 0);
}

enum tp_status tp_comm_all_max(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt)
{
    return do_all_reduce(c, send, recv, count, dt, TP_RED_MAX, 0);
}

enum tp_status tp_comm_all_min(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt)
{
    return do_all_reduce(c, send, recv, count, dt, TP_RED_MIN, 0);
}

static enum tp_status do_all_gather(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                    int from_queue)
{
    size_t bytes;
    enum tp_status rc = check_common(c, "all_gather", count, dt, c ? (size_t)c->size : 1, &bytes);
    if (rc != TP_OK) return rc;
    if (count == 0) return TP_OK;
    if (!send || !recv) return tp_comm_fail(c, TP_ERR_INVALID_ARG, "all_gather: NULL buffer");
    if (c->size == 1) {
        if (send != recv) memmove(recv, send, bytes);
        c->stats.n_ops++;
        return TP_OK;
    }
    if (!from_queue) queue_drain(c);
    uint64_t t0 = tp_now_ns();
    c->stats.n_ops++;
    rc = c->ops->all_gather(c, send, recv, count, dt);
    tp_comm_op_done(c, t0);
    return rc;
}

enum tp_status tp_comm_all_gather(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt)
{
    return do_all_gather(c, send, recv, count, dt, 0);
}

enum tp_status tp_comm_sum_scatter(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt)
{
    size_t bytes;
    enum tp_status rc = check_common(c, "sum_scatter", count, dt, c ? (size_t)c->size : 1, &bytes);
    if (rc != TP_OK) return rc;
    if (count == 0) return TP_OK;
    if (!send || !recv) return tp_comm_fail(c, TP_ERR_INVALID_ARG, "sum_scatter: NULL buffer");
    if (c->size == 1) {
        if (send != recv) memmove(recv, send, bytes);
        c->stats.n_ops++;
        return TP_OK;
    }
    BEGIN_OP(c);
    rc = c->ops->reduce_scatter(c, send, recv, count, dt);
    END_OP(c);
    return rc;
}

static enum tp_status check_root(struct tp_comm *c, const char *op, int root)
{
    if (root < 0 || root >= c->size)
        return tp_comm_fail(c, TP_ERR_INVALID_ARG, "%s: root %d out of range (group size %d)", op, root, c->size);
    return TP_OK;
}

enum tp_status tp_comm_broadcast(tp_comm_t *c, void *buf, size_t count, enum tp_dtype dt, int root)
{
    size_t bytes;
    enum tp_status rc = check_common(c, "broadcast", count, dt, 1, &bytes);
    if (rc == TP_OK) rc = check_root(c, "broadcast", root);
    if (rc != TP_OK || count == 0 || c->size == 1) return rc;
    if (!buf) return tp_comm_fail(c, TP_ERR_INVALID_ARG, "broadcast: NULL buffer");
    BEGIN_OP(c);
    rc = c->ops->broadcast(c, buf, count, dt, root);
    END_OP(c);
    return rc;
}

/* scatter (gather 0) or gather: scatter needs recv on every rank and send at the root, gather the reverse */
static enum tp_status rooted(tp_comm_t *c, int gather, const void *send, void *recv, size_t count, enum tp_dtype dt,
                             int root)
{
    const char *name = gather ? "gather" : "scatter";
    size_t bytes;
    enum tp_status rc = check_common(c, name, count, dt, c ? (size_t)c->size : 1, &bytes);
    if (rc == TP_OK) rc = check_root(c, name, root);
    if (rc != TP_OK || count == 0) return rc;
    const void *every = gather ? send : recv, *at_root = gather ? recv : send;
    if (!every || (c->rank == root && !at_root)) return tp_comm_fail(c, TP_ERR_INVALID_ARG, "%s: NULL buffer", name);
    if (c->size == 1) {
        if (send != recv) memmove(recv, send, bytes);
        return TP_OK;
    }
    BEGIN_OP(c);
    rc = gather ? c->ops->gather(c, send, recv, count, dt, root) : c->ops->scatter(c, send, recv, count, dt, root);
    END_OP(c);
    return rc;
}

enum tp_status tp_comm_scatter(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt, int root)
{
    return rooted(c, 0, send, recv, count, dt, root);
}

enum tp_status tp_comm_gather(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt, int root)
{
    return rooted(c, 1, send, recv, count, dt, root);
}

enum tp_status tp_comm_barrier(tp_comm_t *c)
{
    if (!c) return TP_ERR_INVALID_ARG;
    if (tp_comm_is_poisoned(c)) return TP_ERR_POISONED;
    if (c->size == 1) return TP_OK;
    BEGIN_OP(c);
    enum tp_status rc = c->ops->barrier(c);
    END_OP(c);
    return rc;
}

static enum tp_status check_peer(struct tp_comm *c, const char *op, int peer)
{
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return tp_comm_fail(c, TP_ERR_INVALID_ARG, "%s: peer %d is invalid (group size %d, own rank %d)", op, peer,
                            c->size, c->rank);
    return TP_OK;
}

enum tp_status tp_comm_send(tp_comm_t *c, const void *buf, size_t count, enum tp_dtype dt, int peer)
{
    size_t bytes;
    enum tp_status rc = check_common(c, "send", count, dt, 1, &bytes);
    if (rc == TP_OK) rc = check_peer(c, "send", peer);
    if (rc != TP_OK) return rc;
    if (!buf && count) return tp_comm_fail(c, TP_ERR_INVALID_ARG, "send: NULL buffer");
    BEGIN_OP(c);
    rc = c->ops->send(c, buf, bytes, peer);
    END_OP(c);
    return rc;
}

enum tp_status tp_comm_recv(tp_comm_t *c, void *buf, size_t count, enum tp_dtype dt, int peer)
{
    size_t bytes;
    enum tp_status rc = check_common(c, "recv", count, dt, 1, &bytes);
    if (rc == TP_OK) rc = check_peer(c, "recv", peer);
    if (rc != TP_OK) return rc;
    if (!buf && count) return tp_comm_fail(c, TP_ERR_INVALID_ARG, "recv: NULL buffer");
    BEGIN_OP(c);
    rc = c->ops->recv(c, buf, bytes, peer);
    END_OP(c);
    return rc;
}

/* ------------------------------------------------------------------ split */

static int cmp_member(const void *a, const void *b)
{
    const int32_t *x = a, *y = b; /* (color, key, rank) */
    if (x[1] != y[1]) return x[1] < y[1] ? -1 : 1;
    return x[2] < y[2] ? -1 : x[2] > y[2];
}

struct tp_comm *tp_comm_alloc_child(const struct tp_comm *parent)
{
    struct tp_comm *sub = comm_alloc();
    if (!sub) return NULL;
    sub->backend = parent->backend;
    sub->ops = parent->ops;
    sub->q_slots = calloc(TP_COMM_MAX_INFLIGHT, sizeof *sub->q_slots);
    if (!sub->q_slots || pthread_mutex_init(&sub->q_mu, NULL) != 0) goto fail;
    if (pthread_cond_init(&sub->q_cv, NULL) != 0) {
        pthread_mutex_destroy(&sub->q_mu);
        goto fail;
    }
    sub->q_inited = 1;
    return sub;
fail:
    free(sub->q_slots);
    free(sub);
    return NULL;
}

void tp_comm_release(struct tp_comm *c) { comm_release(c); }

enum tp_status tp_comm_split(tp_comm_t *c, int color, int key, tp_comm_t **out)
{
    enum tp_status rc = TP_OK;
    int32_t *all = NULL;
    struct tp_comm *sub = NULL;
    if (!out) return TP_ERR_INVALID_ARG;
    *out = NULL;
    if (!c) return TP_ERR_INVALID_ARG;
    if (tp_comm_is_poisoned(c)) return TP_ERR_POISONED;
    queue_drain(c);
    if (c->ops->split && c->size > 1) return c->ops->split(c, color, key, out);
    int32_t mine[3] = {color < 0 ? -1 : color, key, c->rank};
    all = malloc((size_t)c->size * sizeof mine);
    if (!all) return tp_comm_fail(c, TP_ERR_NOMEM, "split: out of memory");
    TP_CHECK_GOTO(tp_comm_all_gather(c, mine, all, 3, TP_DTYPE_I32), rc, out);
    if (color < 0) goto out;
    int n = 0;
    for (int r = 0; r < c->size; r++)
        if (all[3 * r] == mine[0]) memmove(&all[3 * n++], &all[3 * r], sizeof mine);
    qsort(all, (size_t)n, sizeof mine, cmp_member);
    sub = tp_comm_alloc_child(c);
    if (!sub) {
        rc = tp_comm_fail(c, TP_ERR_NOMEM, "split: out of memory");
        goto out;
    }
    sub->size = n;
    sub->peer_of = malloc((size_t)n * sizeof(int));
    if (!sub->peer_of) {
        rc = tp_comm_fail(c, TP_ERR_NOMEM, "split: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int pr = all[3 * i + 2];
        sub->peer_of[i] = c->peer_of[pr];
        if (pr == c->rank) sub->rank = i;
    }
    if (c->net) {
        atomic_fetch_add(&c->net->refs, 1);
        sub->net = c->net;
    }
    *out = sub;
    sub = NULL;
out:
    comm_release(sub);
    free(all);
    return rc;
}

/* ------------------------------------------------------------------ non-blocking */

static void *queue_main(void *arg)
{
    struct tp_comm *c = arg;
    pthread_mutex_lock(&c->q_mu);
    for (;;) {
        while (c->q_head == c->q_tail && !c->q_stop) pthread_cond_wait(&c->q_cv, &c->q_mu);
        if (c->q_head == c->q_tail && c->q_stop) break;
        struct tp_comm_request *r = &c->q_slots[c->q_head % TP_COMM_MAX_INFLIGHT];
        pthread_mutex_unlock(&c->q_mu);
        enum tp_status st = r->kind == REQ_ALL_SUM ? do_all_reduce(c, r->send, r->recv, r->count, r->dt, TP_RED_SUM, 1)
                                                   : do_all_gather(c, r->send, r->recv, r->count, r->dt, 1);
        pthread_mutex_lock(&c->q_mu);
        r->st = st;
        r->state = REQ_DONE;
        c->q_head++;
        pthread_cond_broadcast(&c->q_cv);
    }
    pthread_mutex_unlock(&c->q_mu);
    return NULL;
}

static enum tp_status start_req(struct tp_comm *c, int kind, const void *send, void *recv, size_t count,
                                enum tp_dtype dt, tp_comm_request_t **req)
{
    if (!req) return TP_ERR_INVALID_ARG;
    *req = NULL;
    if (!c) return TP_ERR_INVALID_ARG;
    if (tp_comm_is_poisoned(c)) return TP_ERR_POISONED;
    pthread_mutex_lock(&c->q_mu);
    struct tp_comm_request *r = &c->q_slots[c->q_tail % TP_COMM_MAX_INFLIGHT];
    if (r->state != REQ_FREE) {
        pthread_mutex_unlock(&c->q_mu);
        return tp_comm_fail(c, TP_ERR_FULL, "more than %d non-blocking requests in flight (wait on some first)",
                            TP_COMM_MAX_INFLIGHT);
    }
    *r = (struct tp_comm_request){.kind = kind, .state = REQ_QUEUED, .send = send, .recv = recv, .count = count,
                                  .dt = dt};
    enum tp_status rc = TP_OK;
    if (c->backend == TP_COMM_BACKEND_MPI && c->size > 1) {
        /* MPI progresses the request itself; the slot only tracks it. */
        size_t bytes;
        rc = check_common(c, kind == REQ_ALL_SUM ? "all_sum_start" : "all_gather_start", count, dt, 1, &bytes);
        int idx = (int)(r - c->q_slots);
        if (rc == TP_OK) rc = tp_mpi_start(c, idx, kind == REQ_ALL_GATHER, send, recv, count, dt);
        if (rc != TP_OK) {
            r->state = REQ_FREE;
        } else {
            r->mpi_pending = 1;
            c->q_tail++;
            c->q_head++;
        }
        pthread_mutex_unlock(&c->q_mu);
        if (rc == TP_OK) *req = r;
        return rc;
    }
    if (c->size == 1) {
        pthread_mutex_unlock(&c->q_mu);
        r->st = kind == REQ_ALL_SUM ? do_all_reduce(c, send, recv, count, dt, TP_RED_SUM, 1)
                                    : do_all_gather(c, send, recv, count, dt, 1);
        pthread_mutex_lock(&c->q_mu);
        r->state = REQ_DONE;
        c->q_tail++;
        c->q_head++;
        pthread_mutex_unlock(&c->q_mu);
        *req = r;
        return TP_OK;
    }
    if (!c->q_started) {
        c->q_stop = 0;
        if (pthread_create(&c->q_thread, NULL, queue_main, c) != 0) {
            r->state = REQ_FREE;
            pthread_mutex_unlock(&c->q_mu);
            return tp_comm_fail(c, TP_ERR_NOMEM, "cannot start the progress thread");
        }
        c->q_started = 1;
    }
    c->q_tail++;
    pthread_cond_broadcast(&c->q_cv);
    pthread_mutex_unlock(&c->q_mu);
    *req = r;
    return rc;
}

enum tp_status tp_comm_all_sum_start(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                     tp_comm_request_t **req)
{
    return start_req(c, REQ_ALL_SUM, send, recv, count, dt, req);
}

enum tp_status tp_comm_all_gather_start(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                        tp_comm_request_t **req)
{
    return start_req(c, REQ_ALL_GATHER, send, recv, count, dt, req);
}

enum tp_status tp_comm_wait(tp_comm_t *c, tp_comm_request_t *req)
{
    if (!c || !req) return TP_ERR_INVALID_ARG;
    if (req < c->q_slots || req >= c->q_slots + TP_COMM_MAX_INFLIGHT)
        return tp_comm_fail(c, TP_ERR_INVALID_ARG, "wait: request does not belong to this group");
    enum tp_status st;
    if (req->mpi_pending) {
        st = tp_mpi_wait(c, (int)(req - c->q_slots));
        pthread_mutex_lock(&c->q_mu);
        req->mpi_pending = 0;
        req->state = REQ_FREE;
        pthread_mutex_unlock(&c->q_mu);
        return st;
    }
    pthread_mutex_lock(&c->q_mu);
    while (req->state == REQ_QUEUED) pthread_cond_wait(&c->q_cv, &c->q_mu);
    if (req->state == REQ_FREE) {
        pthread_mutex_unlock(&c->q_mu);
        return tp_comm_fail(c, TP_ERR_INVALID_ARG, "wait: request was already released");
    }
    st = req->st;
    req->state = REQ_FREE;
    pthread_mutex_unlock(&c->q_mu);
    return st;
}
