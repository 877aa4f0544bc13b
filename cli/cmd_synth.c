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

/* ------------------------------------------------------------------ parse */

struct synth_opts {
    const char *shape_name, *type_name, *tokenizer, *out, *shapes_file, *format;
    uint64_t shard_mib, seed;
    int layers, threads, list, quiet, bits, group;
    int hf, mlx;                  /* --format hf (mlx is a kind of hf directory) */
    enum tp_wtype type, mlx_type; /* the weight type; mlx: the quantization (type is the scales' dtype) */
    enum tp_synth_mix mix;
};

/* Parse argv into o and check the combinations.  Returns what tp_cli_parse does: 0 to go on, 1 after
 * --help, 2 after printing a usage error. */
static int synth_parse(int argc, char **argv, struct synth_opts *o)
{
    *o = (struct synth_opts){.format = "gguf", .seed = 1};
    const struct tp_opt opts[] = {
        {"shape", 's', TP_OPT_STRING, &o->shape_name, "NAME", "model shape (see --list)", 0, 0},
        {"layers", 'l', TP_OPT_INT, &o->layers, "L", "number of layers (default: the shape's)", 1, 1000},
        {"type", 't', TP_OPT_STRING, &o->type_name, "TYPE",
         "weight type: q4_0, q8_0, f16, bf16, f32, q4_k, q5_k, q6_k, or llama.cpp's per-tensor mix q4_k_m / q5_k_m "
         "(default q8_0)", 0, 0},
        {"tokenizer", 0, TP_OPT_STRING, &o->tokenizer, "FILE",
         "embed this tokenizer.json (its tokenizer_config.json beside it adds bos/eos/chat template); default: a "
         "generated SentencePiece vocabulary", 0, 0},
        {"seed", 0, TP_OPT_U64, &o->seed, "S", "random seed (default 1)", 0, 0},
        {"threads", 0, TP_OPT_INT, &o->threads, "T", "generation threads (default: all cores)", 1, 1024},
        {"output", 'o', TP_OPT_STRING, &o->out, "FILE.gguf|DIR", "output file (a directory for --format hf)", 0, 0},
        {"format", 0, TP_OPT_STRING, &o->format, "gguf|hf|mlx",
         "gguf (default) or hf: a Hugging Face directory (config.json, safetensors, tokenizer.json) with the same "
         "values for the same seed; types f32, f16, bf16 (default bf16); or mlx: an mlx-community quantized "
         "directory of the same values (--bits, --group-size; --type f16|bf16 for scales, biases and norms, default "
         "f16)", 0, 0},
        {"bits", 0, TP_OPT_INT, &o->bits, "4|8", "mlx: bits per weight (default 4)", 4, 8},
        {"group-size", 0, TP_OPT_INT, &o->group, "32|64", "mlx: values per scale/bias group (default 64)", 32, 64},
        {"shard-size", 0, TP_OPT_U64, &o->shard_mib, "MIB",
         "hf: split the safetensors into files of at most MIB MiB with model.safetensors.index.json (default: one "
         "file up to 5 GB)", 0, 0},
        {"shapes", 0, TP_OPT_STRING, &o->shapes_file, "FILE", "shapes JSON instead of the built-in configs/shapes.json",
         0, 0},
        {"list", 0, TP_OPT_FLAG, &o->list, NULL, "list the known shapes and exit", 0, 0},
        {"quiet", 'q', TP_OPT_FLAG, &o->quiet, NULL, "no progress on stderr", 0, 0},
        {0},
    };
    const char *usage = "Usage: tpserve synth --shape NAME [--layers L] [--type q4_0|q8_0|q4_k_m|q5_k_m|f16|...] "
                        "[--tokenizer tokenizer.json] [--seed S] [--format gguf|hf|mlx [--shard-size MIB]] "
                        "[--bits 4|8 --group-size 32|64] -o FILE.gguf|DIR\n"
                        "Writes a random-weight GGUF model of a real model's shape (for speed and scale tests).";
    int np = 0;
    int rc = tp_cli_parse("synth", usage, opts, argc, argv, NULL, 0, &np, NULL, NULL);
    if (rc || o->list) return rc;
    if (!o->shape_name || !o->out) {
        fprintf(stderr, "tpserve synth: --shape and -o are required (tpserve synth --list shows the shapes)\n");
        return 2;
    }
    o->mlx = strcmp(o->format, "mlx") == 0;
    o->hf = o->mlx || strcmp(o->format, "hf") == 0;
    if (!o->hf && strcmp(o->format, "gguf") != 0) {
        fprintf(stderr, "tpserve synth: unknown --format '%s' (gguf, hf or mlx)\n", o->format);
        return 2;
    }
    if ((o->bits || o->group) && !o->mlx) {
        fprintf(stderr, "tpserve synth: --bits and --group-size apply to --format mlx only\n");
        return 2;
    }
    o->mlx_type = tp_wtype_mlx(o->bits ? o->bits : 4, o->group ? o->group : 64);
    if (o->mlx && o->mlx_type == TP_WTYPE_COUNT) {
        fprintf(stderr, "tpserve synth: --bits %d --group-size %d: MLX affine supports bits 4 or 8, group size 32 or 64\n",
                o->bits, o->group);
        return 2;
    }
    if (o->mlx && o->type_name && strcmp(o->type_name, "f16") != 0 && strcmp(o->type_name, "bf16") != 0) {
        fprintf(stderr, "tpserve synth: --format mlx: --type names the scales/biases/norms dtype, f16 or bf16 (got '%s'); "
                        "choose the quantization with --bits and --group-size\n", o->type_name);
        return 2;
    }
    if (o->shard_mib && !o->hf) {
        fprintf(stderr, "tpserve synth: --shard-size applies to --format hf only\n");
        return 2;
    }
    if (!o->type_name) o->type_name = o->mlx ? "f16" : o->hf ? "bf16" : "q8_0";
    if (tp_synth_type_parse(o->type_name, &o->type, &o->mix) != TP_OK) {
        fprintf(stderr, "tpserve synth: unknown --type '%s' (q4_0, q8_0, f16, bf16, f32, q4_k, q5_k, q6_k, q4_k_m, "
                        "q5_k_m)\n", o->type_name);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------------ run */

/* Write the model of shape; progress on stderr unless --quiet. */
static int synth_write(const struct synth_opts *o, const struct tp_shape *shape)
{
    struct tp_error err = {0};
    struct progress_state ps = {tp_now_s(), -1, isatty(2) ? 1 : 10};
    struct tp_synth_config cfg = tp_synth_default_config();
    cfg.shape = shape;
    cfg.n_layer = o->layers;
    cfg.type = o->type;
    cfg.mix = o->mix;
    cfg.tokenizer_json = o->tokenizer;
    cfg.seed = o->seed;
    cfg.out_path = o->out;
    cfg.n_threads = o->threads > 0 ? o->threads : tp_cpu_count();
    cfg.progress = o->quiet ? NULL : progress;
    cfg.progress_ctx = &ps;
    cfg.shard_bytes = o->shard_mib << 20;
    enum tp_wtype type = o->type;
    if (o->mlx) {
        cfg.mlx_bf16 = o->type == TP_WTYPE_BF16;
        cfg.type = type = o->mlx_type;
    }
    if ((o->hf ? tp_synth_write_hf(&cfg, &err) : tp_synth_write(&cfg, &err)) != TP_OK)
        return tp_cli_fail("synth", "%s", err.msg);
    if (!o->quiet)
        fprintf(stderr, "synth: wrote %s (%s, %d layers, %s) in %.1f s\n", o->out, shape->name,
                o->layers > 0 ? o->layers : shape->n_layer, o->mix ? tp_synth_mix_name(o->mix) : tp_wtype_name(type),
                tp_now_s() - ps.t0);
    return 0;
}

/* ------------------------------------------------------------------ command */

int tp_cmd_synth(int argc, char **argv)
{
    struct synth_opts o;
    int rc = synth_parse(argc, argv, &o);
    TP_CLI_RETURN_UNLESS_PARSED(rc);
    tp_cli_setup_logging(NULL);
    char *shapes_text = NULL; /* --shapes FILE's text (owned), else the built-in shapes */
    struct tp_error err = {0};
    if (o.shapes_file && tp_read_file(o.shapes_file, (size_t)1 << 26, &shapes_text, NULL, &err) != TP_OK)
        return tp_cli_fail("synth", "cannot read shapes file %s (%s)", o.shapes_file, err.msg);
    const char *json = shapes_text ? shapes_text : tp_shapes_builtin_json();
    struct tp_shape shape;
    if (o.list) {
        rc = list_shapes(json);
    } else if (tp_shape_find(json, o.shape_name, &shape, &err) != TP_OK) {
        fprintf(stderr, "tpserve synth: %s\n", err.msg);
        rc = 2;
    } else {
        rc = synth_write(&o, &shape);
    }
    free(shapes_text);
    return rc;
}
