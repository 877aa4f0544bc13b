/* common/memory.c - aligned allocation, checked size arithmetic, clock, RSS. */
#define _POSIX_C_SOURCE 200809L
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <mach/mach.h>
#endif

void *tp_aligned_alloc(size_t align, size_t size)
{
    if (size == 0 || align < sizeof(void *) || (align & (align - 1)) != 0) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align, size) != 0) return NULL;
    return p;
}

void tp_aligned_free(void *p) { free(p); }

#define TP_HUGE_PAGE ((size_t)2 << 20)

void *tp_stream_alloc(size_t size)
{
#if defined(MADV_HUGEPAGE)
    if (size >= TP_HUGE_PAGE) {
        void *p = tp_aligned_alloc(TP_HUGE_PAGE, size);
        if (p) (void)madvise(p, size / TP_HUGE_PAGE * TP_HUGE_PAGE, MADV_HUGEPAGE); /* advice: ignored if refused */
        return p;
    }
#endif
    return tp_aligned_alloc(64, size);
}

int tp_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}

int tp_add_size(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a) return -1;
    *out = a + b;
    return 0;
}

uint64_t tp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double tp_now_s(void) { return (double)tp_now_ns() * 1e-9; }

void tp_sleep_ms(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

size_t tp_rss_bytes(void)
{
#if defined(__APPLE__)
    struct mach_task_basic_info info;
    mach_msg_type_number_t count = MACH_TASK_BASIC_INFO_COUNT;
    if (task_info(mach_task_self(), MACH_TASK_BASIC_INFO, (task_info_t)&info, &count) != KERN_SUCCESS)
        return 0;
    return (size_t)info.resident_size;
#elif defined(__linux__)
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size_pages = 0, resident = 0;
    int n = fscanf(f, "%lu %lu", &size_pages, &resident);
    fclose(f);
    if (n != 2) return 0;
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
#else
    return 0;
#endif
}

size_t tp_rss_peak_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
#if defined(__APPLE__)
    return (size_t)ru.ru_maxrss; /* bytes on macOS */
#else
    return (size_t)ru.ru_maxrss * 1024u; /* KiB on Linux */
#endif
}

uint64_t tp_mem_total_bytes(void)
{
#if defined(_SC_PHYS_PAGES)
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return (uint64_t)pages * (uint64_t)page;
#endif
    return 0;
}

int tp_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
