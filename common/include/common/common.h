/*
 * common/include/common/common.h - the shared basics every tpserve module may include.
 *
 * Status codes, the error buffer that hangs off every handle, the log hook,
 * the TP_CHECK_GOTO cleanup macro, aligned allocation, a monotonic clock,
 * half-precision conversions and a persistent thread pool.  Nothing here
 * knows about models, sockets or HTTP.
 *
 * Conventions (see README "Code conventions"):
 *   - every fallible call returns enum tp_status; detail text lives on the
 *     handle (struct tp_error) and is read with the module's *_last_error();
 *   - library code never prints or exits: it calls tp_log(), which goes to
 *     the hook installed by the program (tp_log_set_hook), or nowhere.
 */
#ifndef TP_COMMON_H
#define TP_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TP_VERSION_MAJOR 0
#define TP_VERSION_MINOR 1
#define TP_VERSION_PATCH 0
#define TP_VERSION_STRING "0.1.0"

#if defined(__GNUC__) || defined(__clang__)
#define TP_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#define TP_LIKELY(x) __builtin_expect(!!(x), 1)
#define TP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define TP_PRINTF(fmt_idx, arg_idx)
#define TP_LIKELY(x) (x)
#define TP_UNLIKELY(x) (x)
#endif

/* ------------------------------------------------------------------ status */

/* Closed set of result codes.  Keep tp_status_str() in sync (static assert). */
enum tp_status {
    TP_OK = 0,
    TP_ERR_INVALID_ARG,  /* caller passed something impossible            */
    TP_ERR_NOMEM,        /* allocation failed                             */
    TP_ERR_IO,           /* file or socket I/O failed                     */
    TP_ERR_FORMAT,       /* malformed file, frame or request              */
    TP_ERR_UNSUPPORTED,  /* valid but not supported (type, arch, feature) */
    TP_ERR_NOT_BUILT,    /* backend/library not compiled in or not found  */
    TP_ERR_TIMEOUT,      /* a wait ran past its deadline                  */
    TP_ERR_PEER,         /* a peer closed, reset or misbehaved            */
    TP_ERR_PROTOCOL,     /* peer spoke the wrong protocol / bad hello     */
    TP_ERR_POISONED,     /* handle failed earlier; all calls fail fast    */
    TP_ERR_CANCELLED,    /* operation cancelled by request                */
    TP_ERR_FULL,         /* a bounded queue or table is full              */
    TP_ERR_NOT_FOUND,    /* named thing does not exist                    */
    TP_ERR_INTERNAL,     /* our own invariant broke (a bug)               */
    TP_ERR_INIT,         /* a runtime we depend on failed to start (MPI)  */
    TP_ERR_DENIED,       /* credentials missing or wrong                  */
    TP_ERR_TOO_LARGE,    /* input over a configured size limit            */
    TP_ERR_BUSY,         /* not available now (loading, at a capacity
                          * limit, stopping); retrying later can succeed  */
    TP_ERR_NOT_ALLOWED,  /* operation not permitted on this object        */
    TP_STATUS_COUNT
};

/* Static string naming the code ("TP_ERR_TIMEOUT" -> "timeout"). Never NULL. */
const char *tp_status_str(enum tp_status st);

/*
 * Error text carried by a handle.  Fixed size: setting it never allocates,
 * so it works after TP_ERR_NOMEM too.  The first error sticks unless the
 * caller clears it (keep the root cause, not the last symptom).
 */
#define TP_ERROR_MSG_MAX 512
struct tp_error {
    enum tp_status status;
    char msg[TP_ERROR_MSG_MAX];
};

/* Record (st, formatted message) in err if err holds no error yet; returns st. */
enum tp_status tp_error_set(struct tp_error *err, enum tp_status st, const char *fmt, ...)
    TP_PRINTF(3, 4);
/* Same, overwriting any earlier error. */
enum tp_status tp_error_force(struct tp_error *err, enum tp_status st, const char *fmt, ...)
    TP_PRINTF(3, 4);
void tp_error_clear(struct tp_error *err);
/* Message, or "" when none. Never NULL. */
const char *tp_error_msg(const struct tp_error *err);

/* Evaluate call (an enum tp_status expression); on failure store it in rc and jump. */
#define TP_CHECK_GOTO(call, rc, label)      \
    do {                                    \
        enum tp_status tp__st = (call);     \
        if (TP_UNLIKELY(tp__st != TP_OK)) { \
            (rc) = tp__st;                  \
            goto label;                     \
        }                                   \
    } while (0)

/* Invariant we own: on violation log and abort (never for external input). */
#define TP_ASSERT(cond)                                                  \
    do {                                                                 \
        if (TP_UNLIKELY(!(cond))) tp_assert_fail(#cond, __FILE__, __LINE__); \
    } while (0)
_Noreturn void tp_assert_fail(const char *expr, const char *file, int line);

#define TP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TP_MAX(a, b) ((a) > (b) ? (a) : (b))
/* Request the cache line at p for reading ahead of its use: into L1 (l2 == 0; x86 prefetcht0) or into L2
 * and not L1 (l2 != 0; prefetcht1).  A constant l2 (an inlined caller's) costs no branch. */
#if defined(__GNUC__) || defined(__clang__)
#define TP_PREFETCH(p, l2) ((l2) ? __builtin_prefetch((p), 0, 2) : __builtin_prefetch((p), 0, 3))
#else
#define TP_PREFETCH(p, l2) ((void)(p), (void)(l2))
#endif

/* ------------------------------------------------------------------ logging */

enum tp_log_level { TP_LOG_DEBUG = 0, TP_LOG_INFO, TP_LOG_WARN, TP_LOG_ERROR, TP_LOG_LEVEL_COUNT };

/* Hook receives one complete line without trailing newline. Must be thread safe. */
typedef void (*tp_log_fn)(enum tp_log_level level, const char *module, const char *msg, void *user);

/* Install the process-wide hook (NULL: drop everything). Not thread safe vs tp_log. */
void tp_log_set_hook(tp_log_fn fn, void *user);
/* Messages below level are dropped before formatting. Default TP_LOG_INFO. */
void tp_log_set_level(enum tp_log_level level);
enum tp_log_level tp_log_get_level(void);
void tp_log(enum tp_log_level level, const char *module, const char *fmt, ...) TP_PRINTF(3, 4);
void tp_logv(enum tp_log_level level, const char *module, const char *fmt, va_list ap);
/* Ready-made hook for programs: "[level] module: msg" to stderr, with an optional
 * prefix string passed as user (e.g. "rank 1"); thread safe (one fputs per line). */
void tp_log_stderr_hook(enum tp_log_level level, const char *module, const char *msg, void *user);
const char *tp_log_level_str(enum tp_log_level level);
/* Parse "debug|info|warn|error"; returns TP_ERR_INVALID_ARG on anything else. */
enum tp_status tp_log_level_parse(const char *s, enum tp_log_level *out);

/* ------------------------------------------------------------------ memory */

/* Aligned allocation (align: power of two >= sizeof(void*)); NULL on failure
 * or size 0.  Release with tp_aligned_free (NULL safe). */
void *tp_aligned_alloc(size_t align, size_t size);
void tp_aligned_free(void *p);
/* A buffer streamed every step (re-laid weights, bandwidth probes): 64-byte aligned and, from 2 MiB
 * up, 2 MiB-aligned with its whole 2 MiB pages advised as huge pages where the OS takes the advice
 * (Linux MADV_HUGEPAGE; elsewhere a plain aligned buffer).  NULL on failure; tp_aligned_free. */
void *tp_stream_alloc(size_t size);
/* size_t multiply/add with overflow detection: returns 0 and sets *out, or -1. */
int tp_mul_size(size_t a, size_t b, size_t *out);
int tp_add_size(size_t a, size_t b, size_t *out);

/* ------------------------------------------------------------------ clock */

/* Monotonic nanoseconds since an arbitrary origin. */
uint64_t tp_now_ns(void);
double tp_now_s(void);
void tp_sleep_ms(uint32_t ms);
/* Current resident set size of this process in bytes (0 when unknown). */
size_t tp_rss_bytes(void);
/* Peak resident set size in bytes (0 when unknown). */
size_t tp_rss_peak_bytes(void);
/* Physical memory of this machine in bytes (0 when unknown). */
uint64_t tp_mem_total_bytes(void);

/* ------------------------------------------------------------------ small helpers */

/* qsort comparator for doubles, ascending (NaN-free input). */
int tp_cmp_double(const void *a, const void *b);
/* Median of v[0..n): sorts v in place; the mean of the two middle values
 * when n is even; 0 when n <= 0. */
double tp_median(double *v, int n);
/* 1 when the NUL-terminated s begins (ends) with prefix (suffix), else 0.
 * An empty prefix or suffix matches every string. */
int tp_str_starts_with(const char *s, const char *prefix);
int tp_str_ends_with(const char *s, const char *suffix);
/* s[0..n) as a malloc'd NUL-terminated string, bytes copied as they are (NULs too; caller frees);
 * NULL on out of memory.  (strdup for a whole NUL-terminated string.) */
char *tp_str_dup_n(const char *s, size_t n);
/* Read the whole file at path into *out (malloc'd, NUL-terminated after
 * *out_len bytes; out_len may be NULL; the caller frees).  Errors:
 * TP_ERR_NOT_FOUND (no such file), TP_ERR_IO (cannot open or read),
 * TP_ERR_FORMAT (more than max_bytes bytes), TP_ERR_NOMEM; *out is NULL then
 * and err says which file and why. */
enum tp_status tp_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len, struct tp_error *err);

/* ------------------------------------------------------------------ half floats */

float tp_fp16_to_f32(uint16_t h);
uint16_t tp_f32_to_fp16(float f);   /* round to nearest even, inf/nan kept */
float tp_bf16_to_f32(uint16_t h);
uint16_t tp_f32_to_bf16(float f);   /* round to nearest even, nan kept */

/* ------------------------------------------------------------------ thread pool */

/*
 * Persistent pool of n_threads workers (the caller counts as thread 0, so
 * n_threads-1 OS threads are created once, at init).  tp_pool_run() hands one
 * job to every thread and returns when all have finished it: a fork/join with
 * no allocation and no thread creation per call.  Waiting workers spin for a
 * short while (low latency for the per-layer jobs of a decode step), then
 * sleep on a condition variable (no burnt cores when idle).
 *
 * Not re-entrant: one tp_pool_run at a time per pool (the engine thread).
 */
typedef struct tp_pool tp_pool_t;
/* Job: called once per thread with its index ith in [0, nth). */
typedef void (*tp_pool_fn)(void *ctx, int ith, int nth);

struct tp_pool_config {
    int n_threads;          /* >= 1; 0 means tp_cpu_count() */
    uint32_t spin_us;       /* how long idle workers spin before sleeping */
};
struct tp_pool_config tp_pool_default_config(void);
enum tp_status tp_pool_init(const struct tp_pool_config *cfg, tp_pool_t **out);
void tp_pool_free(tp_pool_t *pool);   /* joins workers; NULL safe */
int tp_pool_size(const tp_pool_t *pool);
void tp_pool_run(tp_pool_t *pool, tp_pool_fn fn, void *ctx);
/* Split [0, n) into nth nearly equal parts; part ith is [*begin, *end). */
void tp_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end);

/*
 * Owned shares with stealing, for a pool job over n units (rows, groups of rows): thread i owns the
 * contiguous share tp_split_range(n, i, nth) and takes it front to back, in chunks of half of what is
 * left (at least min_units), so its work is one walk in order (for a matmul, one stream of weights);
 * a thread done with its share steals chunks from the back of the others', so one that is descheduled
 * or slower does not hold up the rest.  Every unit is handed out exactly once per reset.
 */
typedef struct tp_worksplit tp_worksplit_t;
#define TP_WORKSPLIT_MAX_UNITS 0xffffffffu
/* n_threads: the pool's size (1..1024).  TP_ERR_INVALID_ARG / TP_ERR_NOMEM. */
enum tp_status tp_worksplit_init(int n_threads, tp_worksplit_t **out);
void tp_worksplit_free(tp_worksplit_t *ws); /* NULL safe */
/* Before tp_pool_run (the calling thread): n_units (<= TP_WORKSPLIT_MAX_UNITS, else TP_ERR_INVALID_ARG)
 * in shares, chunks of at least min_units (0: 1). */
enum tp_status tp_worksplit_reset(tp_worksplit_t *ws, uint64_t n_units, uint64_t min_units);
/* In the job, thread ith: its next chunk of units [*u0, *u1); *cursor, the thread's own, starts at 0.
 * Returns 0 when every share is used up. */
int tp_worksplit_next(tp_worksplit_t *ws, int ith, int *cursor, uint64_t *u0, uint64_t *u1);
/* Online CPUs (>= 1). */
int tp_cpu_count(void);

/* Streaming-read memory bandwidth in GB/s (1e9 bytes/s): pool's threads sum a
 * buffer of `bytes` (allocated and first-touched here; make it far larger than
 * the caches); best of `passes`.  0 when the buffer cannot be allocated. */
double tp_mem_read_bw_gbs(tp_pool_t *pool, size_t bytes, int passes);
/* The same over a caller's buffer (64-byte aligned, already written; bytes
 * rounded down to 64), but the MEAN of `passes` reads (bytes * passes /
 * elapsed), threads claiming 1 MiB chunks as they come free (as the forward
 * pass claims rows), for probes interleaved with timed work.  0 on bad
 * arguments. */
double tp_mem_read_bw_buf(tp_pool_t *pool, const void *buf, size_t bytes, int passes);

#ifdef __cplusplus
}
#endif
#endif /* TP_COMMON_H */
