/*
 * tests/comm/comm_test.h - helpers shared by the comm suites: start real
 * rank processes (fork) on 127.0.0.1 with free ports and a generated
 * hostfile, wait for them with a deadline, and the integer-valued data
 * oracle that checks every collective exactly.
 */
#ifndef TP_COMM_TEST_H
#define TP_COMM_TEST_H

#include <stddef.h>
#include <sys/types.h>

#include "comm/comm.h"

#define CT_MAX_RANKS 8

/* Body run in each rank process after tp_comm_init; returns its exit code
 * (0 = all checks passed).  Failures are printed to stderr by the body. */
typedef int (*ct_rank_fn)(tp_comm_t *c, void *arg);

struct ct_group {
    int n;
    char hostfile[512];
    int ports[CT_MAX_RANKS];
    pid_t pids[CT_MAX_RANKS];
    int status[CT_MAX_RANKS];     /* waitpid status */
    double exit_s[CT_MAX_RANKS];  /* seconds from spawn to exit */
    int exited[CT_MAX_RANKS];
    int listen_fd[CT_MAX_RANKS];  /* ct_make_hostfile_held: rank r's bound, listening socket until
                                     rank r is spawned (it inherits and adopts it); <= 2: none */
};

/* Nonzero: ranks started by ct_spawn* ask for the shared-memory transport. */
extern int ct_shm;
/* >= 0: that rank's file-size limit is set below the shared rings' size before tp_comm_init (with
 * SIGXFSZ ignored), so it cannot create or grow the segment (the TCP fallback test); default -1. */
extern int ct_shm_fsize_rank;

/* Pick n free ports and write a hostfile for them (token may be NULL). */
int ct_make_hostfile(struct ct_group *g, int n, const char *token);
/* Same, but each port stays bound and listening in g->listen_fd until its
 * rank is spawned (TP_LISTEN_FD style), so no other process can take it. */
int ct_make_hostfile_held(struct ct_group *g, int n, const char *token);
/* Fork n ranks: each builds cfg (defaults + rank, world, g->hostfile, token,
 * op_timeout_ms if nonzero), inits, runs fn, frees, _exits with fn's code
 * (100 when init fails).  Returns 0 on success. */
int ct_spawn(struct ct_group *g, ct_rank_fn fn, void *arg, const char *token, uint32_t op_timeout_ms);
/* Fork only rank r (same setup as ct_spawn); returns the pid or -1. */
pid_t ct_spawn_one(struct ct_group *g, int r, ct_rank_fn fn, void *arg, const char *token, uint32_t op_timeout_ms);
/* Wait for all ranks at most timeout_ms; kills the rest with SIGKILL then.
 * Returns the number of ranks that did not exit in time. */
int ct_wait(struct ct_group *g, int timeout_ms);
/* Spawn + wait + assert every rank exited 0 (CUnit assertions). */
void ct_run_ok(int n, ct_rank_fn fn, void *arg, int timeout_ms);

/* The data oracle. */
double ct_val(int rank, size_t i, int salt, enum tp_dtype dt);
void ct_set(void *buf, enum tp_dtype dt, size_t i, double v);
double ct_get(const void *buf, enum tp_dtype dt, size_t i);
void ct_fill(void *buf, enum tp_dtype dt, size_t count, int rank, int salt);
/* Compare buf[i] with expected(i) for i < count; prints the first few
 * mismatches with index / expected / got.  Returns mismatch count. */
size_t ct_check_reduce(const void *buf, enum tp_dtype dt, size_t count, int size, int op, int salt, size_t base_index,
                       const char *what, int rank);

/* Every collective on c for the given dtypes/counts; returns failures. */
int ct_check_collectives(tp_comm_t *c, const size_t *counts, int n_counts, int big_all_dtypes);

/* Rank bodies shared by the ring and mpi suites (test_comm_ring.c). */
int ct_body_p2p(tp_comm_t *c, void *arg);   /* send/recv every pair; ends poisoned on ranks 0/1 */
int ct_body_split(tp_comm_t *c, void *arg); /* split(rank % 2, -rank) */
int ct_body_async(tp_comm_t *c, void *arg); /* non-blocking requests and stats */

#endif
