/* cli/cmd_bench.c - `tpserve bench <what>`: dispatch to the benchmark programs.
 * Each benchmark prints a table (and JSON lines with --json); none is a test. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct tp_cli_command benches[] = {
    {"", "", NULL}, /* placeholder so the table is never empty; skipped below */
    {"comm", "collective latency / algbw / busbw per size (run under launch or mpirun; --compare-mpi)", tp_bench_comm},
    {"gen", "prefill / decode tokens/s of a model and the fraction of memory bandwidth reached", tp_bench_gen},
    {"nodes", "tokens/s, compute vs comm, memory per node count (simulated hosts; CSV/MD/JSON/SVG)", tp_bench_nodes},
    {"serve", "HTTP load test of a running server: aggregate tok/s, TTFT, TPOT per concurrency", tp_bench_serve},
    {"kernels", "matrix-kernel GB/s (decode) and GOP/s (prefill) vs a streaming read", tp_bench_kernels},
    {"attn", "attention-kernel GFLOP/s per path (amx, avx512bf16, avx512, avx2, c) at a head shape and depth", tp_bench_attn},
};

int tp_cmd_bench(int argc, char **argv)
{
    int any = 0;
    if (argc >= 2 && strcmp(argv[1], "--help") != 0 && strcmp(argv[1], "-h") != 0) {
        for (size_t i = 0; i < TP_ARRAY_LEN(benches); i++)
            if (benches[i].run && strcmp(argv[1], benches[i].name) == 0) return benches[i].run(argc - 1, argv + 1);
        fprintf(stderr, "tpserve bench: unknown benchmark '%s' (see 'tpserve bench --help')\n", argv[1]);
        return 2;
    }
    FILE *f = argc >= 2 ? stdout : stderr;
    fprintf(f, "Usage: tpserve bench <benchmark> [options]   (tpserve bench <benchmark> --help)\n\nBenchmarks:\n");
    for (size_t i = 0; i < TP_ARRAY_LEN(benches); i++) {
        if (!benches[i].run) continue;
        any = 1;
        fprintf(f, "  %-8s %s\n", benches[i].name, benches[i].summary);
    }
    if (!any) fprintf(f, "  (none built)\n");
    return argc >= 2 ? 0 : 2;
}
