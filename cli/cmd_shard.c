/*
 * cli/cmd_shard.c - `tpserve shard MODEL -n N [--shard-weights W] -o DIR`:
 * cut a model into one GGUF file per rank (that rank's slices + the plan),
 * so each machine stores only its part.  The work is
 * tp_parallel_write_shards() (parallel/shard_file.c); this file parses the
 * command line, prints the plan and the files written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "parallel/parallel.h"

static const char shard_usage[] =
    "Usage: tpserve shard MODEL.gguf|HF_DIR|MLX_DIR -n N [--shard-weights 2,1,1] [--moe-split S] -o DIR\n"
    "\n"
    "Writes DIR/<model>.rank<R>-of-<N>.gguf for R = 0..N-1: each a valid GGUF with the model's metadata,\n"
    "(from a Hugging Face directory: config.json and tokenizer.json converted, F32/F16/BF16 weights; from an\n"
    "MLX quantized directory the packed words, scales and biases as they are, never re-quantized),\n"
    "the sharding plan (tpserve.shard.*) and only rank R's slices of the sharded weights.  Give rank R its\n"
    "file in place of the model (`tpserve serve` / `generate` -m FILE); a file cut for another rank, world\n"
    "size or --shard-weights is refused at start on every rank.  A mixture-of-experts model (GGUF, or a\n"
    "Qwen3-MoE / Qwen2-MoE / Mixtral HF or MLX directory) is cut by its experts' split (--moe-split: each\n"
    "file holds its rank's column slice of every expert, or whole experts; auto lets the plan choose, as\n"
    "serve does); the files are then served with that split.";

int tp_cmd_shard(int argc, char **argv)
{
    const char *out_dir = NULL, *weights = NULL, *moe_split = "auto", *pos[1] = {NULL};
    int n = 0, np = 0;
    const struct tp_opt opts[] = {
        {"n", 'n', TP_OPT_INT, &n, "N", "number of ranks (required)", 1, TP_PLAN_MAX_RANKS},
        {"shard-weights", 0, TP_OPT_LIST, &weights, "W,W,...", "relative share per rank (default: equal)", 0, 0},
        {"moe-split", 0, TP_OPT_STRING, &moe_split, "S", TP_CLI_MOE_SPLIT_HELP, 0, 0},
        {"output", 'o', TP_OPT_STRING, &out_dir, "DIR", "output directory (created if missing; required)", 0, 0},
        {NULL, 0, 0, NULL, NULL, NULL, 0, 0}};
    int prc = tp_cli_parse("shard", shard_usage, opts, argc, argv, pos, 1, &np, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(prc);
    if (np != 1 || n < 1 || !out_dir) {
        fprintf(stderr, "tpserve shard: need MODEL, -n N and -o DIR (see tpserve shard --help)\n");
        return 2;
    }
    tp_cli_setup_logging(NULL);
    struct stat sb;
    if (stat(out_dir, &sb) != 0 && mkdir(out_dir, 0777) != 0)
        return tp_cli_fail("shard", "cannot create the output directory %s", out_dir);
    if (stat(out_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return tp_cli_fail("shard", "%s is not a directory", out_dir);
    struct tp_error err = {0};
    enum tp_moe_split split = TP_MOE_SPLIT_AUTO;
    if (tp_moe_split_parse(moe_split, &split, &err) != TP_OK) return tp_cli_fail("shard", "%s", err.msg);
    double t0 = tp_now_s();
    if (tp_parallel_write_shards_moe(pos[0], n, weights, split, out_dir, &err) != TP_OK)
        return tp_cli_fail("shard", "%s", err.msg);
    for (int r = 0; r < n; r++) {
        char name[512];
        tp_parallel_shard_name(pos[0], r, n, name, sizeof name);
        printf("%s/%s\n", out_dir, name);
    }
    fprintf(stderr, "wrote %d shard files in %.1f s\n", n, tp_now_s() - t0);
    return 0;
}
