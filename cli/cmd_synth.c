/*
 * cli/cmd_synth.c - `tpserve synth`: write a random-weight model of a
 * real shape as GGUF or (--format hf) a Hugging Face directory
 * (model/synth.c, model/synth_hf.c do the work; shapes are data in
 * configs/shapes.json, built in, or --shapes FILE).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "model/synth.h"

struct progress_state {
    double t0;
    int last_pct;
    int step; /* percent between lines: 1 on a terminal (rewritten in place), 10 in logs */
};

static void progress(void *ctx, uint64_t done, uint64_t total)
{
    struct progress_state *p = ctx;
    int pct = total ? (int)(done * 100 / total) : 100;
    if (pct == p->last_pct || (pct % p->step && done != total)) return;
    p->last_pct = pct;
    double t = tp_now_s() - p->t0;
    fprintf(stderr, "%ssynth: %3d%%  %.0f / %.0f MiB  %.1f s", p->step == 1 ? "\r" : "", pct, (double)done / 1048576.0, (double)total / 1048576.0, t);
    if (done == total || p->step != 1) fputc('\n', stderr);
    fflush(stderr);
}

static int list_shapes(const char *json)
{
    struct tp_shape *arr = NULL;
    int n = 0;
    struct tp_error err = {0};
    if (tp_shapes_parse(json, &arr, &n, &err) != TP_OK) return tp_cli_fail("synth", "%s", err.msg);
    printf("%-18s %-6s %6s %6s %5s %5s %6s %7s %8s  %s\n", "shape", "arch", "embd", "layer", "head", "kv", "ff", "vocab",
           "params", "source");
    for (int i = 0; i < n; i++) {
        const struct tp_shape *s = &arr[i];
        double np = (double)tp_shape_n_params(s);
        printf("%-18s %-6s %6d %6d %5d %5d %6d %7d %7.2f%c  %s\n", s->name, tp_arch_name(s->arch), s->n_embd, s->n_layer,
               s->n_head, s->n_head_kv, s->n_ff, s->n_vocab, np >= 1e9 ? np / 1e9 : np / 1e6, np >= 1e9 ? 'B' : 'M',
               s->source);
    }
    free(arr);
    return 0;
}

int tp_cmd_synth(int argc, char **argv)
{
    const char *shape_name = NULL, *type_name = NULL, *tokenizer = NULL, *out = NULL, *shapes_file = NULL;
    const char *format = "gguf";
    uint64_t shard_mib = 0;
    int layers = 0, threads = 0, list = 0, quiet = 0, bits = 0, group = 0;
    uint64_t seed = 1;
    const struct tp_opt opts[] = {
        {"shape", 's', TP_OPT_STRING, &shape_name, "NAME", "model shape (see --list)", 0, 0},
        {"layers", 'l', TP_OPT_INT, &layers, "L", "number of layers (default: the shape's)", 1, 1000},
        {"type", 't', TP_OPT_STRING, &type_name, "TYPE",
         "weight type: q4_0, q8_0, f16, bf16, f32, q4_k, q5_k, q6_k, or llama.cpp's per-tensor mix q4_k_m / q5_k_m "
         "(default q8_0)", 0, 0},
        {"tokenizer", 0, TP_OPT_STRING, &tokenizer, "FILE",
         "embed this tokenizer.json (its tokenizer_config.json beside it adds bos/eos/chat template); default: a "
         "generated SentencePiece vocabulary", 0, 0},
        {"seed", 0, TP_OPT_U64, &seed, "S", "random seed (default 1)", 0, 0},
        {"threads", 0, TP_OPT_INT, &threads, "T", "generation threads (default: all cores)", 1, 1024},
        {"output", 'o', TP_OPT_STRING, &out, "FILE.gguf|DIR", "output file (a directory for --format hf)", 0, 0},
        {"format", 0, TP_OPT_STRING, &format, "gguf|hf|mlx",
         "gguf (default) or hf: a Hugging Face directory (config.json, safetensors, tokenizer.json) with the same "
         "values for the same seed; types f32, f16, bf16 (default bf16); or mlx: an mlx-community quantized "
         "directory of the same values (--bits, --group-size; --type f16|bf16 for scales, biases and norms, default "
         "f16)", 0, 0},
        {"bits", 0, TP_OPT_INT, &bits, "4|8", "mlx: bits per weight (default 4)", 4, 8},
        {"group-size", 0, TP_OPT_INT, &group, "32|64", "mlx: values per scale/bias group (default 64)", 32, 64},
        {"shard-size", 0, TP_OPT_U64, &shard_mib, "MIB",
         "hf: split the safetensors into files of at most MIB MiB with model.safetensors.index.json (default: one "
         "file up to 5 GB)", 0, 0},
        {"shapes", 0, TP_OPT_STRING, &shapes_file, "FILE", "shapes JSON instead of the built-in configs/shapes.json", 0, 0},
        {"list", 0, TP_OPT_FLAG, &list, NULL, "list the known shapes and exit", 0, 0},
        {"quiet", 'q', TP_OPT_FLAG, &quiet, NULL, "no progress on stderr", 0, 0},
        {0},
    };
    const char *usage = "Usage: tpserve synth --shape NAME [--layers L] [--type q4_0|q8_0|q4_k_m|q5_k_m|f16|...] "
                        "[--tokenizer tokenizer.json] [--seed S] [--format gguf|hf|mlx [--shard-size MIB]] "
                        "[--bits 4|8 --group-size 32|64] -o FILE.gguf|DIR\n"
                        "Writes a random-weight GGUF model of a real model's shape (for speed and scale tests).";
    int np = 0;
    int rc = tp_cli_parse("synth", usage, opts, argc, argv, NULL, 0, &np, NULL, NULL);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    tp_cli_setup_logging(NULL);

    char *shapes_text = NULL;
    if (shapes_file) {
        struct tp_error rerr = {0};
        if (tp_read_file(shapes_file, (size_t)1 << 26, &shapes_text, NULL, &rerr) != TP_OK)
            return tp_cli_fail("synth", "cannot read shapes file %s (%s)", shapes_file, rerr.msg);
    }
    const char *json = shapes_text ? shapes_text : tp_shapes_builtin_json();
    if (list) {
        rc = list_shapes(json);
        free(shapes_text);
        return rc;
    }
    if (!shape_name || !out) {
        free(shapes_text);
        fprintf(stderr, "tpserve synth: --shape and -o are required (tpserve synth --list shows the shapes)\n");
        return 2;
    }
    int mlx = strcmp(format, "mlx") == 0;
    int hf = mlx || strcmp(format, "hf") == 0;
    if (!hf && strcmp(format, "gguf") != 0) {
        free(shapes_text);
        fprintf(stderr, "tpserve synth: unknown --format '%s' (gguf, hf or mlx)\n", format);
        return 2;
    }
    if ((bits || group) && !mlx) {
        free(shapes_text);
        fprintf(stderr, "tpserve synth: --bits and --group-size apply to --format mlx only\n");
        return 2;
    }
    enum tp_wtype mlx_type = tp_wtype_mlx(bits ? bits : 4, group ? group : 64);
    if (mlx && mlx_type == TP_WTYPE_COUNT) {
        free(shapes_text);
        fprintf(stderr, "tpserve synth: --bits %d --group-size %d: MLX affine supports bits 4 or 8, group size 32 or 64\n",
                bits, group);
        return 2;
    }
    if (mlx && type_name && strcmp(type_name, "f16") != 0 && strcmp(type_name, "bf16") != 0) {
        free(shapes_text);
        fprintf(stderr, "tpserve synth: --format mlx: --type names the scales/biases/norms dtype, f16 or bf16 (got '%s'); "
                        "choose the quantization with --bits and --group-size\n", type_name);
        return 2;
    }
    if (mlx && !type_name) type_name = "f16";
    if (shard_mib && !hf) {
        free(shapes_text);
        fprintf(stderr, "tpserve synth: --shard-size applies to --format hf only\n");
        return 2;
    }
    if (!type_name) type_name = hf ? "bf16" : "q8_0";
    enum tp_wtype type;
    enum tp_synth_mix mix;
    if (tp_synth_type_parse(type_name, &type, &mix) != TP_OK) {
        free(shapes_text);
        fprintf(stderr, "tpserve synth: unknown --type '%s' (q4_0, q8_0, f16, bf16, f32, q4_k, q5_k, q6_k, q4_k_m, q5_k_m)\n",
                type_name);
        return 2;
    }
    struct tp_shape shape;
    struct tp_error err = {0};
    if (tp_shape_find(json, shape_name, &shape, &err) != TP_OK) {
        free(shapes_text);
        fprintf(stderr, "tpserve synth: %s\n", err.msg);
        return 2;
    }
    free(shapes_text);

    struct progress_state ps = {tp_now_s(), -1, isatty(2) ? 1 : 10};
    struct tp_synth_config cfg = tp_synth_default_config();
    cfg.shape = &shape;
    cfg.n_layer = layers;
    cfg.type = type;
    cfg.mix = mix;
    cfg.tokenizer_json = tokenizer;
    cfg.seed = seed;
    cfg.out_path = out;
    cfg.n_threads = threads > 0 ? threads : tp_cpu_count();
    cfg.progress = quiet ? NULL : progress;
    cfg.progress_ctx = &ps;
    cfg.shard_bytes = shard_mib << 20;
    if (mlx) {
        cfg.mlx_bf16 = type == TP_WTYPE_BF16;
        cfg.type = type = mlx_type;
    }
    if ((hf ? tp_synth_write_hf(&cfg, &err) : tp_synth_write(&cfg, &err)) != TP_OK)
        return tp_cli_fail("synth", "%s", err.msg);
    if (!quiet)
        fprintf(stderr, "synth: wrote %s (%s, %d layers, %s) in %.1f s\n", out, shape.name,
                layers > 0 ? layers : shape.n_layer, mix ? tp_synth_mix_name(mix) : tp_wtype_name(type),
                tp_now_s() - ps.t0);
    return 0;
}
