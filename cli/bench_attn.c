/*
 * cli/bench_attn.c - `tpserve bench attn`: the attention kernel's FLOP rate
 * per path (amx, avx512bf16, avx512, avx2, c: those this CPU has) at a model's head
 * shape, one thread, random data:
 *   decode   one query position x the query heads of one KV head over D keys;
 *   prefill  a block of 64 / gqa positions x those heads (the forward pass's
 *            prefill work item) over the D keys before it.
 * Rates are FLOPs (4 x head_dim x query heads x keys) over the calling
 * thread's CPU time, best of --reps, so a busy machine changes them little;
 * the wall-clock rate is printed beside.  The cache is read from the CPU's
 * caches, or with --mib M from memory (copies of it totalling M MiB, a
 * different one per timed call), as a decode at depth reads it.  Uses
 * tp_kern_attn_time (model/kernels.h).  Not a test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/common.h"
#include "model/kernels.h"
#include "model/model.h"

struct ba_opts {
    int hd, gqa, reps, mib, json;
    const char *depths, *kv_type;
    int dlist[16], nd;
};

static int ba_parse(int argc, char **argv, struct ba_opts *o)
{
    *o = (struct ba_opts){.hd = 64, .gqa = 8, .reps = 5, .depths = "2048,8192", .kv_type = "auto"};
    const struct tp_opt opts[] = {
        {"head-dim", 0, TP_OPT_INT, &o->hd, "HD", "head dimension (default 64, TinyLlama / Llama; a multiple of 8)", 8,
         1024},
        {"gqa", 0, TP_OPT_INT, &o->gqa, "G", "query heads per KV head (default 8, TinyLlama)", 1, 64},
        {"depth", 0, TP_OPT_LIST, &o->depths, "D,D,..", "keys attended to (default 2048,8192)", 0, 0},
        {"kv-type", 0, TP_OPT_STRING, &o->kv_type, "T", TP_CLI_KV_TYPE_HELP, 0, 0},
        {"reps", 'r', TP_OPT_INT, &o->reps, "R", "timed calls per measurement, best reported (default 5)", 1, 1000},
        {"mib", 0, TP_OPT_INT, &o->mib, "M",
         "read the cache from memory: copies of it totalling M MiB (more than the CPU's caches, e.g. 512), a "
         "different one per timed call (default 0: from the CPU's caches)",
         0, 1 << 30},
        {"json", 0, TP_OPT_FLAG, &o->json, NULL, "one JSON object per line", 0, 0},
        {0},
    };
    const char *usage = "Usage: tpserve bench attn [--head-dim 64] [--gqa 8] [--depth 2048,8192] [--kv-type auto] "
                        "[--mib 0]\n"
                        "Attention kernel GFLOP/s per path (this CPU's: amx, avx512bf16, avx512, avx2, c), one thread, decode "
                        "and prefill work items;\nFLOPs over thread CPU time (wall-clock rate beside).";
    int rc = tp_cli_parse("bench attn", usage, opts, argc, argv, NULL, 0, NULL, NULL, NULL);
    if (rc) return rc;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", o->depths);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        const long v = strtol(tok, &end, 10);
        if (end == tok || *end || v < 64 || v > (1 << 20) || o->nd == 16) {
            fprintf(stderr, "tpserve bench attn: --depth '%s': want up to 16 values in 64..%d\n", tok, 1 << 20);
            return 2;
        }
        o->dlist[o->nd++] = (int)v;
    }
    enum tp_kv_type t;
    if (tp_kv_type_parse(o->kv_type, &t) != TP_OK || tp_kv_type_name(t) == NULL) {
        fprintf(stderr, "tpserve bench attn: --kv-type '%s': want auto, f32, f16, bf16 or q8_0\n", o->kv_type);
        return 2;
    }
    if (o->hd % 8 != 0) {
        fprintf(stderr, "tpserve bench attn: --head-dim %d is not a multiple of 8\n", o->hd);
        return 2;
    }
    char what[32];
    snprintf(what, sizeof what, "--mib %d", o->mib); /* the copies are written in full: keep them well inside memory */
    return tp_cli_check_memory("bench attn", what, (uint64_t)o->mib << 20,
                               "a few times the CPU's last-level cache (e.g. 512) is enough to read from memory");
}

int tp_bench_attn(int argc, char **argv)
{
    struct ba_opts o;
    const int rc = ba_parse(argc, argv, &o);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    enum tp_kv_type kv = TP_KV_F16;
    tp_kv_type_parse(o.kv_type, &kv);
    kv = tp_kv_type_resolve(kv, o.hd); /* auto: what a model loaded here would use */
    static const char *const paths[] = {"amx", "avx512bf16", "avx512", "avx2", "c"};
    if (!o.json)
        printf("attention kernel, head_dim %d, %d query heads per KV head, KV cache %s read from %s, one thread, best "
               "of %d\n%-10s %-8s %7s %6s %10s %14s %14s\n",
               o.hd, o.gqa, tp_kv_type_name(kv), o.mib ? "memory" : "the CPU's caches", o.reps, "path", "item", "depth",
               "rows", "ms/call", "GFLOP/s (cpu)", "GFLOP/s (wall)");
    for (int p = 0; p < (int)TP_ARRAY_LEN(paths); p++)
        for (int d = 0; d < o.nd; d++)
            for (int pre = 0; pre <= 1; pre++) {
                const int nt = pre ? (64 / o.gqa > 1 ? 64 / o.gqa : 1) : 1;
                double best_cpu = 0, best_wall = 0, flop = 0;
                const enum tp_status st = tp_kern_attn_time(paths[p], kv, o.hd, nt, o.gqa, o.dlist[d], o.reps, o.mib,
                                                            &best_cpu, &best_wall, &flop);
                if (st == TP_ERR_UNSUPPORTED) continue; /* not on this CPU / build */
                if (st != TP_OK) {
                    fprintf(stderr, "tpserve bench attn: %s at head_dim %d, kv %s: %s\n", paths[p], o.hd,
                            tp_kv_type_name(kv), tp_status_str(st));
                    return 1;
                }
                const double gc = best_cpu > 0 ? flop / best_cpu / 1e9 : 0, gw = best_wall > 0 ? flop / best_wall / 1e9 : 0;
                if (o.json)
                    printf("{\"bench\":\"attn\",\"path\":\"%s\",\"item\":\"%s\",\"head_dim\":%d,\"gqa\":%d,"
                           "\"kv_type\":\"%s\",\"stream_mib\":%d,\"depth\":%d,\"rows\":%d,\"flop\":%.0f,"
                           "\"cpu_ms\":%.4f,\"gflops_cpu\":%.2f,\"gflops_wall\":%.2f}\n",
                           paths[p], pre ? "prefill" : "decode", o.hd, o.gqa, tp_kv_type_name(kv), o.mib, o.dlist[d],
                           nt * o.gqa, flop, best_cpu * 1e3, gc, gw);
                else
                    printf("%-10s %-8s %7d %6d %10.3f %14.1f %14.1f\n", paths[p], pre ? "prefill" : "decode", o.dlist[d],
                           nt * o.gqa, best_cpu * 1e3, gc, gw);
            }
    return 0;
}
