/*
 * comm/include/comm/comm.h - collective communication for tensor parallelism.
 *
 * A group (tp_comm_t) of `size` ranks, each with an index `rank`, runs
 * collectives on one of three backends chosen at start:
 *   ring  TCP sockets (Ethernet, Thunderbolt bridge, loopback); the default
 *   rdma  libibverbs reliable-connected queue pairs, loaded at run time
 *   mpi   OpenMPI (mpirun, Slurm, Kubernetes MPIJob)
 * This module knows nothing of models: it moves and reduces typed buffers.
 *
 * Buffer contracts (counts are ELEMENTS of `dtype`, never bytes):
 *   all_sum/all_max/all_min(send, recv, count): recv[i] = op over ranks of send[i];
 *       send == recv is allowed (in place).
 *   all_gather(send, recv, count): recv holds size*count elements; rank r's
 *       send lands at recv + r*count.  In place when send == recv + rank*count.
 *   sum_scatter(send, recv, count): send holds size*count elements; recv (count
 *       elements) gets the sum over ranks of send[rank*count .. +count).
 *   broadcast(buf, count, root): root's buf is copied to every rank's buf.
 *   scatter(send, recv, count, root): root's send holds size*count; rank r gets
 *       send[r*count..] in recv.  send ignored on non-roots.
 *   gather(send, recv, count, root): root's recv gets size*count; recv ignored on
 *       non-roots.
 *   send/recv(buf, count, peer): point to point, matched in order per pair.
 * Half types (f16, bf16) are reduced in f32 and rounded once per step.
 *
 * Errors: every call returns enum tp_status; tp_comm_last_error() has the
 * text.  After any failure the group is poisoned: every later call on it
 * returns TP_ERR_POISONED at once, and peers of a failed rank fail within
 * the op timeout (a dead peer fails loudly on every rank; nothing hangs).
 *
 * Threads: a group is used by one thread at a time (the engine thread).
 * tp_comm_abort() may be called from any thread (e.g. a signal watcher),
 * tp_comm_silent_rank() from any thread while the group exists.
 *
 * Security (ring, rdma): ranks authenticate each other with the cluster token while the group forms;
 * the data path after that is plain TCP (docs/security.md).
 */
#ifndef TP_COMM_H
#define TP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_comm tp_comm_t;

enum tp_comm_backend {
    TP_COMM_BACKEND_RING = 0,
    TP_COMM_BACKEND_RDMA,
    TP_COMM_BACKEND_MPI,
    TP_COMM_BACKEND_COUNT
};

enum tp_dtype {
    TP_DTYPE_F32 = 0,
    TP_DTYPE_F16,
    TP_DTYPE_BF16,
    TP_DTYPE_I32,
    TP_DTYPE_I64,
    TP_DTYPE_U8,
    TP_DTYPE_COUNT
};

/* Bytes per element; 0 for an invalid dtype. */
size_t tp_dtype_size(enum tp_dtype dt);
const char *tp_dtype_name(enum tp_dtype dt);
const char *tp_comm_backend_name(enum tp_comm_backend b);
/* "ring" | "rdma" | "mpi" -> backend; TP_ERR_INVALID_ARG otherwise. */
enum tp_status tp_comm_backend_parse(const char *s, enum tp_comm_backend *out);

struct tp_comm_config {
    enum tp_comm_backend backend;
    int rank;                    /* -1: take from environment / MPI */
    int world_size;              /* -1: take from environment / MPI */
    const char *hostfile;        /* JSON hostfile path (ring, rdma); may be NULL */
    const char *coordinator;     /* "host:port": rank 0 listens, others register */
    const char *cluster_token;   /* shared secret keying the handshake MACs; NULL or "": an empty key,
                                    allowed only when every rank listens on a loopback address */
    const char *group_id;        /* optional: what this group runs (e.g. a model/plan hash); ranks
                                    with different ids refuse each other.  NULL = "" */
    uint32_t op_timeout_ms;      /* max wait in any collective (TP_COMM_TIMEOUT_MS) */
    uint32_t connect_timeout_ms; /* max time to form the group */
    int shm;                     /* ring: shared-memory rings when all ranks share one host
                                    (TP_COMM_SHM=1); default 0 = TCP everywhere.  Where the rings
                                    cannot be set up on some rank (no /dev/shm, its size or a limit)
                                    every rank stays on TCP and logs why (tp_comm_transport) */
    int listen_fd;               /* ring/rdma: an inherited TCP socket already bound to this rank's
                                    hostfile port, or on rank 0 to the coordinator port (TP_LISTEN_FD; `tpserve launch` passes one, so no
                                    other process can take the port between choosing and binding it).
                                    Used, and closed, instead of binding when it is a socket on that
                                    port; otherwise ignored.  Default -1: bind the port. */
    uint32_t epoch;              /* ring/rdma group epoch, authenticated in the handshake: rank 0 runs
                                    this epoch (0 means 1) and refuses ranks of another one; a worker
                                    with 0 joins whatever epoch rank 0 runs, one with N > 0 only N.
                                    A group that re-forms after losing a rank takes a new epoch, so
                                    a rank of the previous one cannot join it.  Default 0. */
    /* Shrinking a ring group by one rank (re-planning over the survivors, docs/recovery.md):
     * drop_rank  rank 0 only: world_size is one less than the group that failed, and its rank
     *            drop_rank (1 .. world_size) is left out.  Workers of the failed group that join
     *            (epoch 0) keep their order: rank r > drop_rank becomes r - 1; drop_rank itself
     *            is refused.  0: no shrink (rank 0 is never dropped).
     * allow_shrink  a joining worker (epoch 0) accepts that renumbering from rank 0's
     *            authenticated handshake; tp_comm_rank/size then give the new place and
     *            tp_comm_dropped_rank the dropped rank.
     * hostfile_skip  hostfile entries that are not in the group (bit i: entry i), dropped by
     *            earlier shrinks: rank r is the r-th entry not skipped.  Default 0. */
    int drop_rank;
    int allow_shrink;
    uint64_t hostfile_skip;
    int former_world;  /* rank 0: the largest world this group had before it shrank (0: never): a joining
                        * worker of a world in (world_size, former_world] was left out and is refused
                        * (its tp_comm_init returns TP_ERR_CANCELLED) */    size_t op_log;     /* time-stamp the entry and exit of this group's first op_log collectives
                        * (tp_comm_op_times; benchmarks); 0: off (default) */
    uint32_t sim_latency_us; /* ring over TCP: hold every message this long before sending it, a simulated
                              * one-way link latency on one machine (tests, benchmarks;
                              * TP_COMM_SIM_LATENCY_US, at most 1 s); 0: off (default) */
};

/* Defaults: ring, rank/world -1, 30 s op timeout, 60 s connect timeout. */
struct tp_comm_config tp_comm_default_config(void);

/*
 * Fill cfg from the environment: TP_BACKEND, TP_RANK, TP_WORLD_SIZE,
 * TP_HOSTFILE, TP_COORDINATOR, TP_CLUSTER_TOKEN, TP_COMM_TIMEOUT_MS,
 * TP_COMM_CONNECT_TIMEOUT_MS, TP_COMM_SHM (0/1), TP_LISTEN_FD, TP_GROUP_ID,
 * TP_COMM_SIM_LATENCY_US.
 * Only variables that are set override cfg.  Malformed values give
 * TP_ERR_INVALID_ARG with a message in err naming the variable.
 * Returned strings point into the environment (valid for the process).
 */
enum tp_status tp_comm_config_from_env(struct tp_comm_config *cfg, struct tp_error *err);

/*
 * Bind n listening TCP sockets on 127.0.0.1 to free ports (close-on-exec,
 * SO_REUSEADDR): ports[i] and fds[i].  A launcher hands fds[i] to local rank
 * i as TP_LISTEN_FD, so no other process takes the port before the rank
 * listens on it.  TP_OK, or TP_ERR_IO with err filled (may be NULL), every
 * socket closed and fds[] all -1.  The caller closes the fds.
 */
enum tp_status tp_comm_hold_loopback_ports(int n, int *ports, int *fds, struct tp_error *err);

/*
 * Form the group (blocks until every rank joined or connect_timeout_ms).
 * On failure *out is NULL and err (may be NULL) says what went wrong, naming
 * the problem and the fix (missing hostfile, rank out of range, port in use,
 * unreachable peer, "not built with MPI", no RDMA device ...).
 * TP_ERR_CANCELLED: rank 0 refused this rank because the group shrank
 * without it (see tp_comm_config.drop_rank).
 * A world of size 1 needs no network and costs nothing per call.
 */
enum tp_status tp_comm_init(const struct tp_comm_config *cfg, tp_comm_t **out, struct tp_error *err);

/* Leave the group and release everything.  Never hangs.  NULL safe. */
void tp_comm_free(tp_comm_t *c);

int tp_comm_rank(const tp_comm_t *c);
int tp_comm_size(const tp_comm_t *c);
enum tp_comm_backend tp_comm_backend(const tp_comm_t *c);
/* How this rank moves collective data: "tcp", "shm" (ring backend with cfg.shm, every rank on this
 * host and the shared rings mapped on all of them), "rdma", "mpi", or "none" in a group of one or for
 * NULL (no group).  A static string. */
const char *tp_comm_transport(const tp_comm_t *c);
/* Text of the first failure on this group, "" if none.  Never NULL. */
const char *tp_comm_last_error(const tp_comm_t *c);
/* Nonzero once the group failed; all later calls return TP_ERR_POISONED. */
int tp_comm_is_poisoned(const tp_comm_t *c);
/* Poison the group and wake any blocked call (thread/signal safe). */
void tp_comm_abort(tp_comm_t *c, const char *reason);

/*
 * Liveness (ring, rdma): every worker keeps a side connection to rank 0 on
 * which both ends send a heartbeat every 200 ms from a thread of their own,
 * also while the engine thread is blocked inside a collective; a process
 * that frees its group (tp_comm_free: alive, leaving, e.g. because a
 * collective failed) says so on it before closing.  Returns the WORLD rank
 * of a peer that has sent nothing for more than silent_ms (on rank 0: any
 * worker; on a worker: rank 0), with *silent_for_ms (may be NULL) set to
 * how long; -1 when every peer is answering.  When several are silent, the
 * same order as tp_comm_lost_rank() picks one (a peer that said it was
 * leaving comes last).  A peer whose link closed stays silent.  Thread
 * safe; cheap (atomic loads).  Size-1 groups and the mpi backend return -1:
 * MPI owns its processes, and mpirun (or the resource manager) detects and
 * kills a job whose rank died; a stopped MPI rank shows only as a
 * collective that does not finish.
 */
int tp_comm_silent_rank(const tp_comm_t *c, uint32_t silent_ms, uint32_t *silent_for_ms);

/*
 * Which peer was lost, for a report after a collective failed, by the
 * strength of the evidence: the rank whose liveness link closed first
 * without saying it was leaving (a killed process, a lost link); else the
 * rank silent longest when that is more than silent_ms (a stopped or hung
 * one); else a rank that said it was leaving, once 400 ms have passed
 * without anything stronger (an orderly exit), unless an open link went
 * silent well before that leave (that rank is named: the leave followed
 * its stop); else -1.  In a ring, the neighbours of a stopped rank time out
 * and leave at about the same moment as rank 0 notices, so the first link
 * to close is usually a survivor's: it is never named while the stopped
 * rank is silent.  *silent_for_ms (may be NULL) as above.  Same threads
 * and backends as tp_comm_silent_rank().
 */
int tp_comm_lost_rank(const tp_comm_t *c, uint32_t silent_ms, uint32_t *silent_for_ms);

/* The group epoch agreed while the group formed (see tp_comm_config.epoch);
 * 0 for size-1 groups and the mpi backend. */
uint32_t tp_comm_epoch(const tp_comm_t *c);
/* The rank of the previous, one larger group that this group left out when it
 * formed by shrinking (see tp_comm_config.drop_rank); 0 when it did not shrink. */
int tp_comm_dropped_rank(const tp_comm_t *c);
/* hostfile_skip after the group of `skip` dropped its rank `rank` (the entry of
 * the rank-th entry not in skip is added).  Pure. */
uint64_t tp_comm_skip_add(uint64_t skip, int rank);

/*
 * Sub-group of ranks with equal color, ordered by (key, rank).  Collective
 * over c: every rank must call it.  color < 0 gives *out = NULL (not in any
 * sub-group).
 */
enum tp_status tp_comm_split(tp_comm_t *c, int color, int key, tp_comm_t **out);

/* ---- blocking collectives (see buffer contracts above) ---------------- */
enum tp_status tp_comm_all_sum(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt);
enum tp_status tp_comm_all_max(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt);
enum tp_status tp_comm_all_min(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt);
enum tp_status tp_comm_all_gather(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt);
enum tp_status tp_comm_sum_scatter(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt);
enum tp_status tp_comm_broadcast(tp_comm_t *c, void *buf, size_t count, enum tp_dtype dt, int root);
enum tp_status tp_comm_scatter(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                               int root);
enum tp_status tp_comm_gather(tp_comm_t *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                              int root);
enum tp_status tp_comm_barrier(tp_comm_t *c);
enum tp_status tp_comm_send(tp_comm_t *c, const void *buf, size_t count, enum tp_dtype dt, int peer);
enum tp_status tp_comm_recv(tp_comm_t *c, void *buf, size_t count, enum tp_dtype dt, int peer);

/* ---- non-blocking variants ------------------------------------------------
 * Start returns at once with a request; buffers must stay valid and untouched
 * until tp_comm_wait() returns.  ring/rdma: a per-group progress thread
 * (started on first use) runs the requests in order while the caller
 * computes; a blocking call first waits for them.  mpi: MPI_Iallreduce /
 * MPI_Iallgather.  At most TP_COMM_MAX_INFLIGHT requests per
 * group; they complete in start order.  Wait always releases the request. */
#define TP_COMM_MAX_INFLIGHT 8
typedef struct tp_comm_request tp_comm_request_t;
enum tp_status tp_comm_all_sum_start(tp_comm_t *c, const void *send, void *recv, size_t count,
                                     enum tp_dtype dt, tp_comm_request_t **req);
enum tp_status tp_comm_all_gather_start(tp_comm_t *c, const void *send, void *recv, size_t count,
                                        enum tp_dtype dt, tp_comm_request_t **req);
enum tp_status tp_comm_wait(tp_comm_t *c, tp_comm_request_t *req);

/* Counters since init (for per-token compute/communication split). */
struct tp_comm_stats {
    uint64_t n_ops;
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t ns_in_comm;   /* wall time spent inside collectives */
    /* This rank's waits (tcp, shm; shared with sub-groups): those that slept in poll() after spinning
     * and yielding, and of those the sleeps that ran to the end of their slice, nothing having woken
     * them (a peer far behind, or on shm a missed doorbell). */
    uint64_t n_sleeps, n_sleeps_full;
};
void tp_comm_get_stats(const tp_comm_t *c, struct tp_comm_stats *out);
/* The entry and exit times (tp_now_ns) of this rank's collectives while the op log of
 * tp_comm_config.op_log had room: *ts (owned by c, valid until tp_comm_free) holds 2 values per
 * collective, in call order (the same order on every rank); returns how many were recorded.
 * Ranks on one machine share the clock, so their entries can be compared (bench gen). */
size_t tp_comm_op_times(const tp_comm_t *c, const uint64_t **ts);

/*
 * Cost of one collective as the ring and rdma backends run it (comm/algo.c
 * chooses the algorithm by message size and world size): the bytes `rank`
 * sends and the network rounds on the critical path (latencies paid one
 * after another) for a call of count elements of dt (all_gather: one rank's
 * block; broadcast / gather: root names the root).  all_sum: one-round mesh up to the mesh limit (512 KiB with
 * 2 ranks, 64 KiB with more), each rank sending its buffer to every peer;
 * above it the 2-rank pair exchange (2 rounds) or the ring (2 (n-1) rounds,
 * 2 (n-1)/n of the buffer).  broadcast / gather: direct root <-> peer
 * transfers, one round.  The mpi backend's costs are MPI's own.  Pure.
 */
enum tp_comm_op {
    TP_COMM_OP_ALL_SUM = 0,
    TP_COMM_OP_ALL_GATHER,
    TP_COMM_OP_BROADCAST,
    TP_COMM_OP_GATHER,
    TP_COMM_OP_COUNT
};
struct tp_comm_cost {
    uint64_t bytes_sent; /* by this rank, payload only (what tp_comm_stats.bytes_sent counts) */
    int rounds;          /* network latencies on the critical path; 0 for a world of 1 */
};
struct tp_comm_cost tp_comm_op_cost(enum tp_comm_op op, int world, int rank, int root, size_t count,
                                    enum tp_dtype dt);

#ifdef __cplusplus
}
#endif
#endif /* TP_COMM_H */
