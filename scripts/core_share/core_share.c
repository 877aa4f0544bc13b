/*
 * scripts/core_share/core_share.c - do these CPUs share a physical core right now?
 *
 * A cloud VM's vCPUs can be scheduled by the host on two hardware threads (SMT
 * siblings) of one core some of the time and on two cores at other times, and
 * the guest cannot see which: lscpu says "1 thread per core" either way.  When
 * they share a core, two threads get one core's arithmetic between them, and a
 * benchmark's per-thread rates halve.  This runs a loop that keeps a core's
 * vector FMA pipes busy (16 independent chains of 8-float multiply-adds) on CPU 0
 * alone, then on CPU 0 and CPU c together for every other CPU c, and prints
 * each thread's rate together as a fraction of CPU 0's alone: ~1.0 for CPUs on
 * separate cores, ~0.5 for siblings (a lone rate well under the CPU's usual
 * one means someone else's work shares CPU 0's core).
 * Rates are over each thread's CPU time, so time the host takes the vCPU away
 * altogether does not count.  Each pair also passes a cache line back and forth
 * (each thread waits for the other's store, then stores): the round trip, best
 * of CS_PP_BATCHES, is what every fork and join of a thread pool pays, tens of ns
 * between cores that share a cache and several hundred between cores that do
 * not (another CCD, another socket: the VM may be moved between the two).
 * Pinning is Linux-only: elsewhere the threads float, and a warning says the
 * pairs are not the CPUs named.
 * Usage: core_share [rounds]   (default 3; the table is printed per round)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#endif

typedef float vf __attribute__((vector_size(32)));

#define CS_CHAINS 16 /* the loop's independent chains */
#define CS_ITERS 20000000L

struct cs_run {
    int cpu;           /* in: the CPU to pin to; out: -1 where pinning failed or is not available */
    double gflops;     /* out: over the thread's CPU time */
    float sink;        /* out: keeps the sums live */
    atomic_int *ready; /* threads that have started; each spins until all n have */
    int n;
};

static double clock_s(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double thread_cpu_s(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

/* The calling thread pinned to cpu (Linux): cpu, or -1 where it could not be (or cpu was -1). */
static int pin_self(int cpu)
{
#ifdef __linux__
    if (cpu < 0) return -1;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0 ? cpu : -1;
#else
    (void)cpu;
    return -1;
#endif
}

static void *cs_thread(void *arg)
{
    struct cs_run *r = arg;
    r->cpu = pin_self(r->cpu);
    /* 16 chains in named registers; x * m + a with m < 1 stays normal and is not folded away */
    const vf m = {0.999f, 0.999f, 0.999f, 0.999f, 0.999f, 0.999f, 0.999f, 0.999f};
    const vf a = m - m + 1e-3f;
    vf x0 = a, x1 = a + 1, x2 = a + 2, x3 = a + 3, x4 = a + 4, x5 = a + 5, x6 = a + 6, x7 = a + 7;
    vf x8 = a + 8, x9 = a + 9, xa = a + 10, xb = a + 11, xc = a + 12, xd = a + 13, xe = a + 14, xf = a + 15;
    atomic_fetch_add(r->ready, 1);
    while (atomic_load(r->ready) < r->n) {
    }
    const double t0 = thread_cpu_s();
    for (long k = 0; k < CS_ITERS; k++) {
        x0 = x0 * m + a, x1 = x1 * m + a, x2 = x2 * m + a, x3 = x3 * m + a;
        x4 = x4 * m + a, x5 = x5 * m + a, x6 = x6 * m + a, x7 = x7 * m + a;
        x8 = x8 * m + a, x9 = x9 * m + a, xa = xa * m + a, xb = xb * m + a;
        xc = xc * m + a, xd = xd * m + a, xe = xe * m + a, xf = xf * m + a;
    }
    const double t = thread_cpu_s() - t0;
    const vf s = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)) + ((x8 + x9) + (xa + xb)) + ((xc + xd) + (xe + xf));
    r->sink = s[0];
    r->gflops = (double)CS_ITERS * CS_CHAINS * 8 * 2 / t * 1e-9;
    return NULL;
}

#define CS_PP_TRIPS 100000L /* round trips per batch */
#define CS_PP_BATCHES 5

struct cs_pp {
    int cpu;           /* in: the CPU to pin to; out: -1 where pinning failed or is not available */
    int side;          /* 0: stores the odd values, 1: the even ones */
    atomic_long *line; /* the value passed back and forth (a line of its own) */
    atomic_int *ready;
    double best_ns;    /* out (side 0): the fastest batch's ns per round trip */
};

static void *cs_pingpong(void *arg)
{
    struct cs_pp *r = arg;
    r->cpu = pin_self(r->cpu);
    atomic_fetch_add(r->ready, 1);
    while (atomic_load(r->ready) < 2) {
    }
    r->best_ns = 1e30;
    long v = 0;
    for (int b = 0; b < CS_PP_BATCHES; b++) {
        const double t0 = clock_s(CLOCK_MONOTONIC);
        for (long i = 0; i < CS_PP_TRIPS; i++, v += 2) {
            while (atomic_load_explicit(r->line, memory_order_acquire) != v + r->side) {
            }
            atomic_store_explicit(r->line, v + r->side + 1, memory_order_release);
        }
        const double ns = (clock_s(CLOCK_MONOTONIC) - t0) / CS_PP_TRIPS * 1e9;
        if (ns < r->best_ns) r->best_ns = ns;
    }
    return NULL;
}

/* ns per round trip of a value between threads on cpus[0] and cpus[1]; -1 where a thread could not
 * start; *unpinned += the threads that could not be pinned. */
static double cs_roundtrip(const int *cpus, int *unpinned)
{
    static struct {
        _Alignas(64) atomic_long v;
    } line;
    atomic_store(&line.v, 0);
    atomic_int ready = 0;
    pthread_t th[2];
    struct cs_pp r[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (struct cs_pp){cpus[i], i, &line.v, &ready, 0.0};
        if (pthread_create(&th[i], NULL, cs_pingpong, &r[i]) != 0) return -1.0;
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        *unpinned += r[i].cpu < 0;
    }
    return r[0].best_ns;
}

/* Threads on cpus[0..n) at once (n <= 2); their rates into g.  -1: a thread could not start;
 * otherwise the number of threads that could not be pinned. */
static int cs_together(const int *cpus, int n, double *g)
{
    pthread_t th[2];
    struct cs_run r[2];
    atomic_int ready = 0;
    for (int i = 0; i < n; i++) {
        r[i] = (struct cs_run){cpus[i], 0.0, 0.0f, &ready, n};
        if (pthread_create(&th[i], NULL, cs_thread, &r[i]) != 0) return -1; /* the caller exits */
    }
    int unpinned = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        g[i] = r[i].gflops;
        unpinned += r[i].cpu < 0;
    }
    return unpinned;
}

int main(int argc, char **argv)
{
    const int rounds = argc > 1 ? atoi(argv[1]) : 3;
    if (rounds < 1 || rounds > 100) {
        fprintf(stderr, "usage: core_share [rounds 1..100]\n");
        return 2;
    }
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 2) {
        fprintf(stderr, "core_share: %ld CPU online; it compares two\n", ncpu);
        return 2;
    }
    printf("round  cpus   alone GFLOP/s  together GFLOP/s (each)  together/alone  one core?  round trip ns\n");
    int unpinned = 0;
    for (int round = 0; round < rounds; round++) {
        double alone;
        const int c0[1] = {0};
        const int u0 = cs_together(c0, 1, &alone);
        if (u0 < 0) {
            fprintf(stderr, "core_share: cannot start a thread\n");
            return 1;
        }
        unpinned += u0;
        for (long c = 1; c < ncpu; c++) {
            const int pair[2] = {0, (int)c};
            double g[2];
            const int u = cs_together(pair, 2, g);
            if (u < 0) {
                fprintf(stderr, "core_share: cannot start a thread\n");
                return 1;
            }
            unpinned += u;
            const double rt = cs_roundtrip(pair, &unpinned);
            if (rt < 0) {
                fprintf(stderr, "core_share: cannot start a thread\n");
                return 1;
            }
            const double f = (g[0] + g[1]) / 2 / alone;
            printf("%5d  0,%-3ld %14.1f  %8.1f %8.1f  %14.2f  %-9s  %12.0f\n", round + 1, c, alone, g[0], g[1], f,
                   f < 0.75 ? "yes" : f > 0.9 ? "no" : "partly", rt);
        }
    }
    if (unpinned)
        fprintf(stderr, "core_share: %d threads ran unpinned (no CPU pinning here): the pairs are not the CPUs named\n",
                unpinned);
    return 0;
}
