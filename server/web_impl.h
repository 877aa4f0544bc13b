/*
 * server/web_impl.h - private: state shared by web.c (routes) and cluster.c
 * (GET /v1/cluster): rank 0's loading progress, the generated-token samples
 * behind tokens/s and its history, and when each rank was last seen silent.
 */
#ifndef TP_SERVER_WEB_IMPL_H
#define TP_SERVER_WEB_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "parallel/parallel.h"

#define TP_WEB_HISTORY 300 /* tokens/s samples kept: 5 minutes at one a second */

struct tp_web_sample {
    double t;              /* Unix time, seconds */
    uint64_t n_generated;  /* tokens generated since start, at t */
};

struct tp_web {
    pthread_mutex_t mu;                          /* guards everything below */
    uint64_t load_done, load_total;              /* rank 0's slice, bytes */
    struct tp_web_sample hist[TP_WEB_HISTORY];   /* ring, oldest first from hist_head */
    int hist_head, hist_len;
    uint64_t silent_seen_ns[TP_PLAN_MAX_RANKS];  /* monotonic ns a rank was last reported silent; 0: never */
};

#endif /* TP_SERVER_WEB_IMPL_H */
