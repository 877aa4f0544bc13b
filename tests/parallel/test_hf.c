/*
 * tests/parallel/test_hf.c - Hugging Face directories (safetensors) through
 * the distributed engine, against oracles:
 *   - the GGUF F32 file of the same seed at N = 1 (the same model: synth
 *     writes the same values, llama q/k rows permuted to the halves layout):
 *     the HF directory at N = 1 must give identical greedy tokens over 64
 *     steps (two sequences) and final logits within a normalized MSE of
 *     1e-10 (only the order of the q.k sums inside a head differs);
 *   - the HF directory at N = 1: N = 2 and N = 3 must give identical tokens
 *     and logits within 1e-10 (each rank preads only its row / column
 *     slices from the safetensors files);
 *   - a sharded set (model-0000i-of-0000N.safetensors + index, 64 KiB
 *     files so every tensor kind lands in different files) the same;
 *   - `tpserve shard` of an HF directory (GGUF shard files) at N = 2, 3
 *     against the directory at N = 1; of mixture-of-experts directories
 *     (one tensor per expert) at N = 2 with each expert split, against the
 *     directory at N = 1 and at N = 2 with that split.
 * Shapes: the llama (GQA, untied head), qwen2 (QKV bias, tied head) and
 * qwen3 (q/k norms, head_dim != n_embd / n_head) test shapes of
 * configs/shapes.json.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "mr_impl.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "tp_test.h"

/* Write shape `name` with `layers` layers as GGUF F32 and as an HF F32 directory
 * (shard_bytes 0: one file) of the same seed.  0 on success. */
static int write_pair(const char *name, int layers, uint64_t shard_bytes, char *gguf, char *dir, size_t cap)
{
    struct tp_shape sh;
    struct tp_error e = {0};
    if (tp_shape_find(NULL, name, &sh, &e) != TP_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    snprintf(gguf, cap, "%s/hf-%s.gguf", tp_test_tmpdir(), name);
    snprintf(dir, cap, "%s/hf-%s-%llu", tp_test_tmpdir(), name, (unsigned long long)shard_bytes);
    struct tp_synth_config sc = tp_synth_default_config();
    sc.shape = &sh;
    sc.n_layer = layers;
    sc.type = TP_WTYPE_F32;
    sc.seed = 4321;
    sc.n_threads = 1;
    sc.out_path = gguf;
    if (tp_synth_write(&sc, &e) != TP_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    sc.out_path = dir;
    sc.shard_bytes = shard_bytes;
    if (tp_synth_write_hf(&sc, &e) != TP_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    return 0;
}

static void expect_same(const struct mr_run *ref, struct mr_run *r, double max_nmse, const char *what)
{
    CU_ASSERT_EQUAL_FATAL(mr_exec(r), 0);
    for (int k = 0; k < r->world; k++) {
        if (r->exit_code[k] != 0) fprintf(stderr, "%s: rank %d exit %d: %s\n", what, k, r->exit_code[k], r->msg[k]);
        CU_ASSERT_EQUAL_FATAL(r->exit_code[k], 0);
    }
    CU_ASSERT_EQUAL_FATAL(r->n_tokens, ref->n_tokens);
    int same0 = memcmp(r->tokens, ref->tokens, sizeof(int32_t) * (size_t)r->n_tokens) == 0;
    int same1 = memcmp(r->tokens1, ref->tokens1, sizeof(int32_t) * (size_t)r->n_tokens) == 0;
    CU_ASSERT(same0);
    CU_ASSERT(same1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r->logits);
    CU_ASSERT_EQUAL_FATAL(r->n_vocab, ref->n_vocab);
    double e = mr_nmse(r->logits, ref->logits, r->n_vocab);
    fprintf(stderr, "%s: %d+%d greedy tokens %s, final logits nmse %.3g, %.2f s\n", what, r->n_tokens, r->n_tokens,
            same0 && same1 ? "identical" : "DIFFER", e, r->seconds);
    CU_ASSERT(e <= max_nmse);
}

static void run_shape(const char *shape, uint64_t shard_bytes)
{
    char gguf[512], dir[512], tag[160];
    CU_ASSERT_EQUAL_FATAL(write_pair(shape, 0, shard_bytes, gguf, dir, sizeof gguf), 0);
    if (shard_bytes) { /* really split: an index over several files */
        tp_st_t *st = NULL;
        struct tp_error e = {0};
        CU_ASSERT_EQUAL_FATAL(tp_st_open(dir, &st, &e), TP_OK);
        fprintf(stderr, "%s: %d safetensors files\n", dir, tp_st_n_files(st));
        CU_ASSERT(tp_st_n_files(st) >= 3);
        tp_st_close(st);
    }
    struct mr_run ref, hf1, r;
    mr_init(&ref, gguf, 1);
    ref.n_steps = 64;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    if (ref.exit_code[0] != 0) fprintf(stderr, "GGUF reference: %s\n", ref.msg[0]);
    CU_ASSERT_EQUAL_FATAL(ref.exit_code[0], 0);
    CU_ASSERT_EQUAL_FATAL(ref.n_tokens, 65);
    int distinct = 0;
    for (int i = 1; i < ref.n_tokens; i++)
        distinct += ref.tokens[i] != ref.tokens[0] || ref.tokens1[i] != ref.tokens1[0];
    CU_ASSERT(distinct > 0); /* a constant oracle would match anything */

    mr_init(&hf1, dir, 1);
    hf1.n_steps = 64;
    snprintf(tag, sizeof tag, "%s HF%s N=1 vs GGUF F32", shape, shard_bytes ? " sharded" : "");
    expect_same(&ref, &hf1, 1e-10, tag);
    for (int n = 2; n <= 3; n++) {
        mr_init(&r, dir, n);
        r.n_steps = 64;
        snprintf(tag, sizeof tag, "%s HF%s N=%d vs N=1", shape, shard_bytes ? " sharded" : "", n);
        expect_same(&hf1, &r, 1e-10, tag);
        /* each rank holds (and read) only its slice: less than the whole model */
        if (r.weight_bytes[0] && hf1.weight_bytes[0]) CU_ASSERT(r.weight_bytes[0] < hf1.weight_bytes[0]);
        mr_free(&r);
    }
    mr_free(&hf1);
    mr_free(&ref);
}

/* `tpserve shard` of an HF directory: GGUF shard files (llama q/k rows back in the interleaved
 * layout) at N = 2 and 3 give the tokens and logits of the directory itself at N = 1. */
static void shard_files(const char *shape)
{
    char gguf[512], dir[512], out[600], pat[800], tag[160];
    CU_ASSERT_EQUAL_FATAL(write_pair(shape, 0, 0, gguf, dir, sizeof gguf), 0);
    struct mr_run ref, r;
    mr_init(&ref, dir, 1);
    ref.n_steps = 64;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    CU_ASSERT_EQUAL_FATAL(ref.exit_code[0], 0);
    for (int n = 2; n <= 3; n++) {
        snprintf(out, sizeof out, "%s/hf-shards-%s-%d", tp_test_tmpdir(), shape, n);
        mkdir(out, 0755);
        struct tp_error e = {0};
        if (tp_parallel_write_shards(dir, n, NULL, out, &e) != TP_OK) fprintf(stderr, "%s\n", e.msg);
        CU_ASSERT_EQUAL_FATAL(e.status, TP_OK);
        const char *base = strrchr(dir, '/') + 1;
        snprintf(pat, sizeof pat, "%s/%s.rank%%d-of-%d.gguf", out, base, n);
        mr_init(&r, pat, n);
        r.shard_files = 1;
        r.n_steps = 64;
        snprintf(tag, sizeof tag, "%s HF shard files N=%d vs HF N=1", shape, n);
        expect_same(&ref, &r, 1e-10, tag);
        mr_free(&r);
    }
    mr_free(&ref);
}

static void test_hf_shard_files(void)
{
    shard_files("test-tiny");
    shard_files("test-tiny-qwen3");
}

/* `tpserve shard` of mixture-of-experts directories (one safetensors tensor per expert): Qwen3-MoE with
 * both splits, Qwen2-MoE (shared expert and its gate cut or left out, QKV bias) with the column split,
 * Mixtral (w1/w2/w3, q/k rows back in the interleaved layout) with whole experts.  The two files at N = 2
 * give the greedy tokens of the directory at N = 1 (F32: the partial sums differ only in order, final
 * logits within 1e-10) and each rank holds exactly the bytes its rank of the directory at N = 2 with
 * that split read, which gives the same logits to 1e-12. */
static void moe_files(const char *shape, enum tp_moe_split split)
{
    char gguf[512], dir[512], out[600], pat[800], tag[160];
    CU_ASSERT_EQUAL_FATAL(write_pair(shape, 0, 0, gguf, dir, sizeof gguf), 0);
    struct mr_run ref, d2, r;
    mr_init(&ref, dir, 1);
    ref.n_steps = 32;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    if (ref.exit_code[0] != 0) fprintf(stderr, "%s: %s\n", shape, ref.msg[0]);
    CU_ASSERT_EQUAL_FATAL(ref.exit_code[0], 0);
    mr_init(&d2, dir, 2);
    d2.n_steps = 32;
    d2.moe_split = split;
    snprintf(tag, sizeof tag, "%s HF N=2 %s vs HF N=1", shape, tp_moe_split_name(split));
    expect_same(&ref, &d2, 1e-10, tag);
    snprintf(out, sizeof out, "%s/hf-moe-shards-%s-%s", tp_test_tmpdir(), shape, tp_moe_split_name(split));
    mkdir(out, 0755);
    struct tp_error e = {0};
    if (tp_parallel_write_shards_moe(dir, 2, NULL, split, out, &e) != TP_OK) fprintf(stderr, "%s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(e.status, TP_OK);
    snprintf(pat, sizeof pat, "%s/%s.rank%%d-of-2.gguf", out, strrchr(dir, '/') + 1);
    mr_init(&r, pat, 2);
    r.shard_files = 1;
    r.n_steps = 32;
    r.moe_split = split;
    snprintf(tag, sizeof tag, "%s HF shard files N=2 %s vs HF N=1", shape, tp_moe_split_name(split));
    expect_same(&ref, &r, 1e-10, tag);
    CU_ASSERT_EQUAL(r.plan_split, (int)split);
    for (int k = 0; k < 2; k++) CU_ASSERT_EQUAL(r.weight_bytes[k], d2.weight_bytes[k]);
    const double nm = r.logits && d2.logits ? mr_nmse(r.logits, d2.logits, r.n_vocab) : 1.0;
    fprintf(stderr, "%s: shard files vs the directory at N=2: final logits nmse %.3g\n", shape, nm);
    CU_ASSERT(nm <= 1e-12);
    mr_free(&r);
    mr_free(&d2);
    mr_free(&ref);
}

static void test_hf_moe_shard_files(void)
{
    moe_files("test-tiny-qwen3moe", TP_MOE_SPLIT_TENSOR);
    moe_files("test-tiny-qwen3moe", TP_MOE_SPLIT_EXPERT);
    moe_files("test-tiny-qwen2moe", TP_MOE_SPLIT_TENSOR);
    moe_files("test-tiny-mixtral", TP_MOE_SPLIT_EXPERT);
}

/* The command line: synth --format hf (+ sharded), info DIR, generate -m DIR == -m GGUF, shard DIR. */
static void test_hf_cli(void)
{
    const char *bin = tp_test_tpserve();
    if (!bin) {
        tp_test_skip("tpserve binary not found");
        return;
    }
    const char *tmp = tp_test_tmpdir();
    char cmd[2048], out[8192], out2[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' synth -q --shape test-tiny --type f32 --seed 5 -o '%s/cli.gguf' 2>&1 && "
             "'%s' synth -q --shape test-tiny --type f32 --seed 5 --format hf -o '%s/cli-hf' 2>&1",
             bin, tmp, bin, tmp);
    CU_ASSERT_EQUAL_FATAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "'%s' info '%s/cli-hf' 2>&1", bin, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "(Hugging Face: config.json, 1 safetensors file"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "neox (halves)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "per rank    2 ranks"));
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s/cli-hf' -p 'once upon' -n 24 --temp 0 -t 1 --quiet-stats 2>/dev/null",
             bin, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s/cli.gguf' -p 'once upon' -n 24 --temp 0 -t 1 --quiet-stats 2>/dev/null",
             bin, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out2, sizeof out2), 0);
    CU_ASSERT(strlen(out) > strlen("once upon"));
    CU_ASSERT_STRING_EQUAL(out, out2);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/cli-shards' && '%s' shard '%s/cli-hf' -n 2 -o '%s/cli-shards' 2>&1", tmp,
             bin, tmp, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "'%s' info '%s/cli-shards/cli-hf.rank1-of-2.gguf' 2>&1", bin, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "shard       rank 1 of 2 (cut from cli-hf)"));
    /* refusals: a bad --format, a quantized type for hf, a file where a directory should go */
    snprintf(cmd, sizeof cmd, "'%s' synth --shape test-tiny --format safetensors -o '%s/x' 2>&1", bin, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "unknown --format 'safetensors'"));
    snprintf(cmd, sizeof cmd, "'%s' synth -q --shape test-tiny --format hf --type q4_0 -o '%s/x' 2>&1", bin, tmp);
    CU_ASSERT_NOT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "--format hf writes f32, f16 or bf16 weights"));
    snprintf(cmd, sizeof cmd, "'%s' synth -q --shape test-tiny --format hf -o '%s/cli.gguf' 2>&1", bin, tmp);
    CU_ASSERT_NOT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "is not a directory"));
}

static void test_hf_llama(void) { run_shape("test-tiny", 0); }
static void test_hf_qwen2(void) { run_shape("test-tiny-qwen2", 0); }
static void test_hf_qwen3(void) { run_shape("test-tiny-qwen3", 0); }
static void test_hf_sharded(void) { run_shape("test-tiny-qwen3", 64 << 10); }

static const struct tp_test_case hf_cases[] = {{"llama", test_hf_llama},
                                               {"qwen2", test_hf_qwen2},
                                               {"qwen3", test_hf_qwen3},
                                               {"sharded_index", test_hf_sharded},
                                               {"shard_files", test_hf_shard_files},
                                               {"moe_shard_files", test_hf_moe_shard_files},
                                               {"cli", test_hf_cli},
                                               {NULL, NULL}};
TP_TEST_SUITE(hf_multirank, "multirank,model", 300, hf_cases)
