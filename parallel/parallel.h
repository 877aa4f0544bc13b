/*
 * parallel/parallel.h - tensor parallelism: sharding plans and the
 * distributed engine that runs one model across the ranks of a comm group.
 *
 * Knows comm/ and model/; nothing of HTTP.  Rank 0 drives: each step it
 * sends every rank one step descriptor (tokens, positions, sequences,
 * cleared sequences); all ranks run the forward pass on their slice with two
 * all_sums per layer; rank 0 gets the logits.  Other ranks sit in
 * tp_parallel_worker_loop() until rank 0 shuts the group down or a peer fails.
 *
 * (The parallel issue fills this header in: plan types, engine API.)
 */
#ifndef TP_PARALLEL_H
#define TP_PARALLEL_H

#include "comm/comm.h"
#include "common/common.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* TP_PARALLEL_H */
