/*
 * common/threadpool.c - persistent fork/join thread pool.
 *
 * One job at a time: the caller publishes (fn, ctx), bumps the generation
 * counter and runs part 0 itself; workers notice the new generation, run
 * their part and bump the done counter.  Idle workers spin for spin_us,
 * then sleep on a condition variable; the caller wakes sleepers only when
 * some are actually asleep, so the hot decode path is a pure atomic
 * handshake.
 */
#define _POSIX_C_SOURCE 200809L
#include "common/common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

struct tp_pool {
    int n_threads;
    uint32_t spin_us;
    pthread_t *threads;        /* n_threads-1 workers */
    tp_pool_fn fn;             /* current job, written before generation bump */
    void *ctx;
    _Atomic uint64_t generation;
    _Atomic int n_done;
    _Atomic int n_sleeping;
    _Atomic int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

struct worker_arg {
    tp_pool_t *pool;
    int ith;
};

struct tp_pool_config tp_pool_default_config(void)
{
    struct tp_pool_config c = {.n_threads = 0, .spin_us = 200};
    return c;
}

void tp_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end)
{
    int64_t base = n / nth, rem = n % nth;
    *begin = ith * base + (ith < rem ? ith : rem);
    *end = *begin + base + (ith < rem ? 1 : 0);
}

static void *worker_main(void *p)
{
    struct worker_arg wa = *(struct worker_arg *)p;
    free(p);
    tp_pool_t *pool = wa.pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (gen == seen) {
            uint64_t t0 = tp_now_ns(), spin_ns = (uint64_t)pool->spin_us * 1000u;
            unsigned iter = 0;
            while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
                   !atomic_load(&pool->stop)) {
                cpu_relax();
                if ((++iter & 255u) == 0 && tp_now_ns() - t0 > spin_ns) break;
            }
            if (gen == seen && !atomic_load(&pool->stop)) {
                pthread_mutex_lock(&pool->mu);
                atomic_fetch_add(&pool->n_sleeping, 1);
                while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
                       !atomic_load(&pool->stop))
                    pthread_cond_wait(&pool->cv, &pool->mu);
                atomic_fetch_sub(&pool->n_sleeping, 1);
                pthread_mutex_unlock(&pool->mu);
            }
        }
        if (atomic_load(&pool->stop)) break;
        seen = gen;
        pool->fn(pool->ctx, wa.ith, pool->n_threads);
        atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_acq_rel);
    }
    return NULL;
}

enum tp_status tp_pool_init(const struct tp_pool_config *cfg, tp_pool_t **out)
{
    struct tp_pool_config c = cfg ? *cfg : tp_pool_default_config();
    *out = NULL;
    if (c.n_threads < 0 || c.n_threads > 1024) return TP_ERR_INVALID_ARG;
    if (c.n_threads == 0) c.n_threads = tp_cpu_count();
    tp_pool_t *pool = calloc(1, sizeof *pool);
    if (!pool) return TP_ERR_NOMEM;
    pool->n_threads = c.n_threads;
    pool->spin_us = c.spin_us;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    if (c.n_threads > 1) {
        pool->threads = calloc((size_t)c.n_threads - 1, sizeof(pthread_t));
        if (!pool->threads) {
            tp_pool_free(pool);
            return TP_ERR_NOMEM;
        }
    }
    for (int i = 1; i < c.n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->pool = pool;
            wa->ith = i;
        }
        if (!wa || pthread_create(&pool->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->n_threads = i; /* only i-1 workers exist; free joins those */
            tp_pool_free(pool);
            return TP_ERR_NOMEM;
        }
    }
    *out = pool;
    return TP_OK;
}

void tp_pool_free(tp_pool_t *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n_threads && pool->threads; i++) pthread_join(pool->threads[i - 1], NULL);
    free(pool->threads);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

int tp_pool_size(const tp_pool_t *pool) { return pool ? pool->n_threads : 1; }

void tp_pool_run(tp_pool_t *pool, tp_pool_fn fn, void *ctx)
{
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->n_done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }
    fn(ctx, 0, pool->n_threads);
    unsigned iter = 0;
    while (atomic_load_explicit(&pool->n_done, memory_order_acquire) != pool->n_threads - 1) {
        cpu_relax();
        if ((++iter & 1023u) == 0) sched_yield();
    }
}
