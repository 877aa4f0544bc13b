/*
 * comm/comm_impl.h - private: the group handle, the transport vtable and the
 * algorithm layer shared by the ring (TCP) and rdma (verbs) backends.
 *
 * Layering (top to bottom):
 *   comm.c        public API: argument checks, poison, stats, async queue,
 *                 dispatch to the backend's collective table (tp_coll_ops)
 *   algo.c        collectives written once over point-to-point transfers
 *                 (mesh exchange for small messages, chunked ring
 *                 reduce-scatter + all-gather for large ones)
 *   tcp.c/rdma.c  a transport: moves bytes on peer links (tp_transport_ops)
 *   backend_mpi.c the MPI backend maps every collective onto MPI directly
 *
 * A network (struct tp_net) is the set of links of the world group; groups
 * made by tp_comm_split share their parent's net (refcounted) and map their
 * own ranks to net ranks through peer_of[].  Ops on a parent and its
 * sub-groups must therefore be issued in the same order on every rank (the
 * links carry raw bytes in order per pair).
 */
#ifndef TP_COMM_IMPL_H
#define TP_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "comm/comm.h"

#define TP_COMM_MODULE "comm"

enum tp_red_op { TP_RED_SUM = 0, TP_RED_MAX, TP_RED_MIN, TP_RED_COUNT };

/* ---------------------------------------------------------------- reduce.c */

/* dst[i] = a[i] op b[i] for i < n (elements).  dst may alias a or b.
 * Half types are widened to f32, combined, rounded once.  Integer sums wrap. */
void tp_reduce(void *dst, const void *a, const void *b, size_t n, enum tp_dtype dt, enum tp_red_op op);

/* ---------------------------------------------------------------- transport */

/* One half of a point-to-point exchange on the link to `peer` (a NET rank). */
struct tp_xfer {
    int peer;      /* net rank of the other end */
    int is_send;   /* 1: send buf[0..bytes), 0: receive into it */
    void *buf;
    size_t bytes;
    size_t done;   /* progress, owned by the transport */
    int optional;  /* 1: progressed while others are waited for, not waited for itself */
    int started;   /* set by tp_comm_xfer once mapped/counted (a transfer may span calls) */
};

/* Transfers on one link in one direction run in array order: entry i waits
 * while an earlier entry with the same peer and direction is unfinished
 * (so a send may be queued behind another on the same socket). */
static inline int tp_xfer_blocked(const struct tp_xfer *x, int i)
{
    for (int j = 0; j < i; j++)
        if (x[j].peer == x[i].peer && x[j].is_send == x[i].is_send && x[j].done < x[j].bytes) return 1;
    return 0;
}

struct tp_net;
struct tp_transport_ops {
    const char *name;
    /* Progress every transfer in x[0..n) together until all non-optional
     * ones are complete (optional ones advance as far as the peer allows),
     * the op timeout passes without progress, the net is aborted, or a link
     * fails.  Sends and
     * receives advance together, so two peers sending to each other never
     * deadlock on full buffers.  On failure writes the reason into err. */
    enum tp_status (*xfer)(struct tp_net *net, struct tp_xfer *x, int n, struct tp_error *err);
    /* Make every peer notice at once that we are gone (close/shutdown links). */
    void (*shutdown)(struct tp_net *net);
    /* Release the transport state (links already shut down or not). */
    void (*destroy)(struct tp_net *net);
};

struct tp_net {
    atomic_int refs;
    int rank, size;                       /* this process in the world group */
    const struct tp_transport_ops *tops;
    void *impl;                           /* transport private state */
    int *fds;                             /* (size) TCP link per net rank, -1 for self */
    int *live_fds;                        /* (size) liveness links: on rank 0 one per worker, on a
                                             worker [0] only; -1 elsewhere (owned by liveness.c once
                                             tp_live_start ran) */
    struct tp_live *live;                 /* heartbeat thread state (liveness.c), NULL before start */
    int wake_rd, wake_wr;                 /* self-pipe: tp_comm_abort wakes poll() */
    uint32_t op_timeout_ms;
    uint32_t sim_latency_us;              /* tcp: each transfer step's sends wait this long first (tp_comm_config) */
    uint32_t epoch;                       /* group epoch agreed in the bootstrap (0: none, e.g. mpi) */
    int dropped;                          /* the bootstrap shrank the group: the previous group's rank
                                             left out (rank and size above are the new ones); 0: none */
    int door_fd;                          /* rank 0 of a group that shrank (hostfile): its bootstrap
                                             listener, kept open so that a left-out rank trying to join
                                             is told so at once (liveness.c); -1: none */
    int door_former;                      /* the largest world before the shrink */
    atomic_int poisoned;
    atomic_int err_claimed;               /* first writer of err wins (signal safe) */
    struct tp_error err;
    atomic_uint_fast64_t n_sleeps, n_sleeps_full; /* tp_comm_stats: waits that slept in poll(), and
                                                     sleeps that lasted their whole slice */
};

void tp_net_release(struct tp_net *net);
/* Poison the net with a reason (first reason sticks), wake waiters, shut links. */
void tp_net_poison(struct tp_net *net, enum tp_status st, const char *msg);
void tp_net_wake(struct tp_net *net);
/* The timeout error of a transport's transfer loop (shared by tcp and shm):
 * names the first unfinished, non-optional transfer's peer and direction. */
enum tp_status tp_net_timeout_error(const struct tp_net *net, const struct tp_xfer *x, int n, struct tp_error *err);

/* ---------------------------------------------------------------- collectives */

struct tp_comm;
/* Backend collective table.  Arguments are already validated by comm.c;
 * count may be 0 only where noted; size-1 groups never reach these. */
struct tp_coll_ops {
    enum tp_status (*all_reduce)(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                                 enum tp_red_op op);
    enum tp_status (*all_gather)(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt);
    enum tp_status (*reduce_scatter)(struct tp_comm *c, const void *send, void *recv, size_t count,
                                     enum tp_dtype dt);
    enum tp_status (*broadcast)(struct tp_comm *c, void *buf, size_t count, enum tp_dtype dt, int root);
    enum tp_status (*scatter)(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                              int root);
    enum tp_status (*gather)(struct tp_comm *c, const void *send, void *recv, size_t count, enum tp_dtype dt,
                             int root);
    enum tp_status (*barrier)(struct tp_comm *c);
    enum tp_status (*send)(struct tp_comm *c, const void *buf, size_t bytes, int peer);
    enum tp_status (*recv)(struct tp_comm *c, void *buf, size_t bytes, int peer);
    /* Backend-specific split (MPI: MPI_Comm_split); NULL = the generic one in
     * comm.c (all_gather of (color, key), sub-group sharing the parent net). */
    enum tp_status (*split)(struct tp_comm *c, int color, int key, struct tp_comm **out);
    void (*free)(struct tp_comm *c);
};

extern const struct tp_coll_ops tp_net_coll_ops; /* algo.c: ring + rdma */

struct tp_comm_request;

struct tp_comm {
    enum tp_comm_backend backend;
    int rank, size;
    const struct tp_coll_ops *ops;
    struct tp_net *net;        /* ring/rdma: shared with sub-groups */
    int *peer_of;              /* (size) group rank -> net rank */
    void *mpi;                 /* backend_mpi.c state */
    atomic_int poisoned;
    atomic_int err_claimed;
    struct tp_error err;
    struct tp_comm_stats stats;
    uint64_t *op_ts;           /* (op_cap, 2) entry and exit ns of the first collectives (tp_comm_op_times) */
    size_t op_cap, op_n;

    /* Scratch owned by the algorithm layer, allocated once. */
    unsigned char *small;      /* (size) * small_bytes: mesh receive slots, one per rank */
    size_t small_bytes;        /* slot size = the mesh threshold for this group size */
    unsigned char *stage[2];   /* TP_ALGO_CHUNK_BYTES each: ring receive staging */
    unsigned char *acc[2];     /* TP_ALGO_CHUNK_BYTES each: ring partial sums */

    /* Non-blocking requests: a progress thread created on first use. */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    pthread_t q_thread;
    int q_started, q_stop;
    int q_inited;
    struct tp_comm_request *q_slots;    /* TP_COMM_MAX_INFLIGHT */
    unsigned q_head, q_tail;         /* submitted = tail, finished = head */
};

#define TP_ALGO_MAX_RANKS 64             /* ring/rdma world size limit (full mesh) */
#define TP_ALGO_SMALL_BYTES (512u * 1024u)   /* 2 ranks: <= this, mesh exchange (one round) */
#define TP_ALGO_SMALL_BYTES_N (64u * 1024u)  /* 3+ ranks: mesh up to here, ring above */
#define TP_ALGO_CHUNK_BYTES (32u * 1024u)   /* ring pipeline chunk (choice: docs/design-measurements.md) */
/* 3+ ranks, all_reduce of >= this many bytes: bidirectional ring (first half
 * clockwise, second half counter-clockwise at once, so each link direction
 * carries half the data).  Below it one direction, where the two lanes'
 * extra transfers and half-size segments cost more than the halved link
 * load saves (docs/design-measurements.md). */
#define TP_ALGO_BIDIR_BYTES (2u << 20)

/* Transfers on group ranks (mapped to net ranks here on their first call);
 * counts stats, poisons the group (and net) on failure with a message naming
 * the peer.  An optional transfer left unfinished may be passed again. */
enum tp_status tp_comm_xfer(struct tp_comm *c, struct tp_xfer *x, int n);
/* Record a failure on c (first reason sticks) and poison it. */
enum tp_status tp_comm_fail(struct tp_comm *c, enum tp_status st, const char *fmt, ...) TP_PRINTF(3, 4);
enum tp_status tp_algo_alloc_scratch(struct tp_comm *c);
/* A fresh group handle inheriting backend and ops from parent (rank, size,
 * net/mpi and peer_of left for the caller); NULL when out of memory. */
struct tp_comm *tp_comm_alloc_child(const struct tp_comm *parent);
void tp_comm_release(struct tp_comm *c);
/* End of one timed collective that began at t0 (tp_now_ns): adds to stats.ns_in_comm and, while the op
 * log has room, records (t0, now). */
void tp_comm_op_done(struct tp_comm *c, uint64_t t0);

/* ---------------------------------------------------------------- bootstrap */

/* Parsed hostfile (see configs/README.md). */
#define TP_HOST_IP_MAX 64
#define TP_HOST_RDMA_MAX 64
struct tp_host {
    char ip[TP_HOST_IP_MAX];       /* first of "ips": where peers connect */
    int port;
    char rdma[TP_HOST_RDMA_MAX];   /* first of "rdma" device names, "" if none */
};
struct tp_hostfile {
    int n;
    struct tp_host *hosts;         /* (n) indexed by rank; owned */
    char token[256];               /* "cluster_token", "" if none */
};
enum tp_status tp_hostfile_load(const char *path, struct tp_hostfile *out, struct tp_error *err);
void tp_hostfile_free(struct tp_hostfile *hf);

/* Form the TCP mesh of the world group; fills net->fds.  cfg has rank/world
 * resolved. */
enum tp_status tp_bootstrap_tcp(const struct tp_comm_config *cfg, struct tp_net *net, struct tp_error *err);

/* Backend entry points: fill c (rank, size, ops, net or mpi). */
enum tp_status tp_ring_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err);
enum tp_status tp_rdma_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err);
enum tp_status tp_mpi_init(const struct tp_comm_config *cfg, struct tp_comm *c, struct tp_error *err);
/* Non-blocking MPI all-reduce/all-gather (NULL when not built). */
enum tp_status tp_mpi_start(struct tp_comm *c, int slot, int is_gather, const void *send, void *recv, size_t count,
                            enum tp_dtype dt);
enum tp_status tp_mpi_wait(struct tp_comm *c, int slot);
/* rank/size from an MPI launcher's environment (OMPI_COMM_WORLD_*, PMI_*), -1 when absent. */
void tp_comm_launcher_env(int *rank, int *size);

/* Shared-memory transport (shm.c): switch net (already formed over TCP) to
 * shared-memory rings when every rank is on this host; *attached says. */
enum tp_status tp_shm_attach(struct tp_net *net, uint32_t timeout_ms, int *attached, struct tp_error *err);
#define TP_SHM_MAX_RANKS 8

/* A group that listens on a non-loopback address (hostfile entries, or the
 * coordinator host in table[0]) needs a cluster token: TP_ERR_INVALID_ARG
 * naming TP_CLUSTER_TOKEN / "cluster_token" otherwise (bootstrap.c). */
enum tp_status tp_comm_check_token(const struct tp_comm_config *cfg, const struct tp_host *table, int n,
                                   const char *token, struct tp_error *err);

/* Liveness (liveness.c): a heartbeat thread on the liveness links formed by
 * the bootstrap.  Start takes ownership of net->live_fds' sockets; stop
 * (idempotent, called by tp_net_release) joins the thread and closes them. */
enum tp_status tp_live_start(struct tp_net *net, struct tp_error *err);
void tp_live_stop(struct tp_net *net);
/* A net rank silent for more than silent_ms, or -1 (see tp_comm_silent_rank; the order of liveness.c). */
int tp_live_silent(const struct tp_net *net, uint32_t silent_ms, uint32_t *silent_for_ms);
/* tp_comm_lost_rank() on the net (world ranks == net ranks for the world group). */
int tp_live_lost(const struct tp_net *net, uint32_t silent_ms, uint32_t *silent_for_ms);

/* TCP transport (tcp.c). */
enum tp_status tp_tcp_net_create(int rank, int size, uint32_t op_timeout_ms, struct tp_net **out,
                                 struct tp_error *err);

#endif /* TP_COMM_IMPL_H */
