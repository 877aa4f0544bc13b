/*
 * tests/parallel/test_mlx.c - tensor parallelism over an MLX 4-bit
 * (group 64) quantized safetensors directory (`synth --format mlx`).
 *
 * The shape is chosen so that an even split would cut 64-value groups at 2
 * and 3 ranks: 8 heads of 32 (attn_output columns move in 2-head units = one
 * group; 4 units over 3 ranks = 4,2,2 heads instead of 3,3,2) and an FFN of
 * 320 = 5 groups (3,2 and 2,2,1 groups instead of 160 / 107 columns).
 * Oracles:
 *  - plan (from the directory's own tensor types through the probe, which
 *    names the packed U32 tensors as MLX types): every row-parallel boundary
 *    (attn_output and ffn_down columns) on a multiple of 64, `moved` set and
 *    the note saying so;
 *  - N = 2 and N = 3 real ranks (TCP ring on 127.0.0.1), each pread-ing only
 *    its byte ranges of the words, scales and biases: the same greedy tokens
 *    as N = 1 for two sequences over 48 steps, final logits within a
 *    normalized MSE of 1e-4.  Every rank multiplies whole groups exactly as
 *    the single rank does (the activation blocks of a group-aligned slice are
 *    those of the whole row); what differs is the float order of the all_sum
 *    and, through it, an occasional one-step int8 rounding flip when the next
 *    layer re-quantizes its input (~1e-6 in energy), well below 1e-4.
 *  - a tied head (vocab rows of the quantized embedding with their scales /
 *    biases rows), QKV biases, bf16 scales, group 32 and an unquantized
 *    ffn_down (rows not whole groups) on test-tiny-qwen2 at N = 2 vs N = 1;
 *    N = 3 refused by the plan with the reason.
 *  - `tpserve shard` of the directory at N = 2 and 3 (GGUF shard files that
 *    keep the packed words as I32 and the scales / biases slices as they
 *    are): under real ranks the same greedy tokens as the directory at N = 1
 *    (logits within the 1e-4 above) and the same logits as the directory at
 *    the same N within 1e-10 (each rank holds the very words, scales and
 *    biases it would pread from the directory; only the RoPE layout differs,
 *    interleaved in the GGUF with q/k rows permuted, as for F32); also the
 *    tied bf16-scales qwen2 directory above at N = 2.  Two
 *    damaged shard files are refused naming the tensor: a group-size key that
 *    disagrees with the shapes, and a missing scales tensor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "model/synth.h"
#include "mr_impl.h"
#include "parallel/parallel_impl.h"
#include "tp_test.h"

static const char *mlx_dir(void)
{
    static char path[512];
    if (path[0]) return path;
    struct tp_shape s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "test-mlx-tp");
    s.arch = TP_ARCH_LLAMA;
    s.n_embd = 256;
    s.n_layer = 2;
    s.n_head = 8;
    s.n_head_kv = 4;
    s.head_dim = 32;
    s.n_ff = 320;
    s.n_vocab = 512;
    s.n_ctx = 256;
    s.rope_theta = 10000.0f;
    s.norm_eps = 1e-5f;
    char want[512];
    snprintf(want, sizeof want, "%s/synth-mlx-tp", tp_test_tmpdir());
    struct tp_synth_config c = tp_synth_default_config();
    c.shape = &s;
    c.n_layer = s.n_layer;
    c.type = TP_WTYPE_MLX_Q4_G64;
    c.seed = 55;
    c.out_path = want;
    c.n_threads = 2;
    struct tp_error e = {0};
    if (tp_synth_write_hf(&c, &e) != TP_OK) {
        fprintf(stderr, "mlx_dir: %s\n", e.msg);
        return NULL;
    }
    snprintf(path, sizeof path, "%s", want);
    return path;
}

static void test_plan_mlx(void)
{
    const char *m = mlx_dir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    struct tp_model_probe pr;
    struct tp_error e = {0};
    if (tp_model_probe(m, &pr, &e) != TP_OK) fprintf(stderr, "probe: %s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(tp_model_probe(m, &pr, &e), TP_OK);
    CU_ASSERT_EQUAL(pr.types.attn_o, TP_WTYPE_MLX_Q4_G64);
    CU_ASSERT_EQUAL(pr.types.ffn_down, TP_WTYPE_MLX_Q4_G64);
    CU_ASSERT_EQUAL(pr.types.token_embd, TP_WTYPE_MLX_Q4_G64);
    CU_ASSERT_EQUAL(pr.types.output, TP_WTYPE_MLX_Q4_G64);
    static const int want_heads[2][4] = {{0, 4, 8, -1}, {0, 4, 6, 8}};
    static const int want_ff[2][4] = {{0, 192, 320, -1}, {0, 128, 256, 320}};
    for (int world = 2; world <= 3; world++) {
        struct tp_shard_plan p;
        CU_ASSERT_EQUAL_FATAL(tp_parallel_plan(&pr.hp, &pr.types, world, NULL, &p, &e), TP_OK);
        CU_ASSERT_EQUAL(p.ff_unit, 64);
        for (int r = 0; r < world; r++) {
            const struct tp_model_shard *s = &p.ranks[r].shard;
            CU_ASSERT_EQUAL((s->q_head_begin * 32) % 64, 0);
            CU_ASSERT_EQUAL((s->q_head_end * 32) % 64, 0);
            CU_ASSERT_EQUAL(s->ff_begin % 64, 0);
            CU_ASSERT_EQUAL(s->ff_end % 64, 0);
            CU_ASSERT_EQUAL(s->q_head_begin, want_heads[world - 2][r]);
            CU_ASSERT_EQUAL(s->q_head_end, want_heads[world - 2][r + 1]);
            CU_ASSERT_EQUAL(s->ff_begin, want_ff[world - 2][r]);
            CU_ASSERT_EQUAL(s->ff_end, want_ff[world - 2][r + 1]);
        }
        CU_ASSERT_EQUAL(p.moved, 1);
        CU_ASSERT_PTR_NOT_NULL(strstr(p.note, "FFN split moved to 64-column block boundaries (ffn_down mlx 4-bit group-64)"));
        if (world == 3) CU_ASSERT_PTR_NOT_NULL(strstr(p.note, "head split moved to 2-head units"));
        fprintf(stderr, "N=%d plan: %s\n", world, p.note);
    }
}

static void test_tp_mlx(void)
{
    const char *m = mlx_dir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    enum { STEPS = 48 };
    struct mr_run ref, r;
    mr_init(&ref, m, 1);
    ref.n_steps = STEPS;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    if (ref.exit_code[0] != 0) fprintf(stderr, "reference: %s\n", ref.msg[0]);
    CU_ASSERT_EQUAL_FATAL(ref.exit_code[0], 0);
    CU_ASSERT_EQUAL_FATAL(ref.n_tokens, STEPS + 1);
    int distinct = 0; /* a constant token would match anything */
    for (int i = 1; i < ref.n_tokens; i++) distinct += ref.tokens[i] != ref.tokens[0];
    CU_ASSERT(distinct > 0);
    for (int world = 2; world <= 3; world++) {
        mr_init(&r, m, world);
        r.n_steps = STEPS;
        CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
        for (int k = 0; k < world; k++) {
            if (r.exit_code[k] != 0) fprintf(stderr, "N=%d rank %d exit %d: %s\n", world, k, r.exit_code[k], r.msg[k]);
            CU_ASSERT_EQUAL(r.exit_code[k], 0);
        }
        CU_ASSERT_EQUAL_FATAL(r.n_tokens, ref.n_tokens);
        int diff = -1;
        for (int i = 0; i < r.n_tokens && diff < 0; i++)
            if (r.tokens[i] != ref.tokens[i] || r.tokens1[i] != ref.tokens1[i]) diff = i;
        double e = r.logits && ref.logits && r.n_vocab == ref.n_vocab ? mr_nmse(r.logits, ref.logits, r.n_vocab) : 1.0;
        fprintf(stderr, "mlx 4-bit g64 N=%d: %d+%d greedy tokens %s (first difference at %d), final logits nmse %.3g, %.2f s\n",
                world, r.n_tokens, r.n_tokens, diff < 0 ? "identical" : "DIFFER", diff, e, r.seconds);
        CU_ASSERT_EQUAL(diff, -1);
        CU_ASSERT(e <= 1e-4);
        /* each rank holds (and read) only its slice */
        if (r.weight_bytes[0] && ref.weight_bytes[0]) CU_ASSERT(r.weight_bytes[0] < ref.weight_bytes[0]);
        mr_free(&r);
    }
    mr_free(&ref);
}

static void run_shards(const struct mr_run *ref, const char *pat, int world, double max_nmse, const char *what);

/* Tied head (the output rows are rows of the quantized embedding, with their scales / biases
 * rows), QKV biases, and an FFN of 160 (not whole 64-groups: ffn_down stays F16 as mlx leaves
 * it) on test-tiny-qwen2 with 4-bit group-32 at N = 2 vs N = 1 (4 heads of 16: N = 3 cannot
 * keep 32-column groups whole and is refused by the plan). */
static void test_tp_mlx_tied(void)
{
    struct tp_shape sh;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "test-tiny-qwen2", &sh, &e), TP_OK);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/synth-mlx-qwen2", tp_test_tmpdir());
    struct tp_synth_config c = tp_synth_default_config();
    c.shape = &sh;
    c.type = TP_WTYPE_MLX_Q4_G32;
    c.seed = 21;
    c.out_path = dir;
    c.n_threads = 1;
    c.mlx_bf16 = 1;
    CU_ASSERT_EQUAL_FATAL(tp_synth_write_hf(&c, &e), TP_OK);
    struct mr_run ref, r;
    mr_init(&ref, dir, 1);
    ref.n_steps = 32;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    if (ref.exit_code[0] != 0) fprintf(stderr, "reference: %s\n", ref.msg[0]);
    CU_ASSERT_EQUAL_FATAL(ref.exit_code[0], 0);
    mr_init(&r, dir, 2);
    r.n_steps = 32;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < 2; k++) {
        if (r.exit_code[k] != 0) fprintf(stderr, "N=2 rank %d exit %d: %s\n", k, r.exit_code[k], r.msg[k]);
        CU_ASSERT_EQUAL(r.exit_code[k], 0);
    }
    CU_ASSERT_EQUAL_FATAL(r.n_tokens, ref.n_tokens);
    CU_ASSERT(memcmp(r.tokens, ref.tokens, sizeof(int32_t) * (size_t)r.n_tokens) == 0);
    CU_ASSERT(memcmp(r.tokens1, ref.tokens1, sizeof(int32_t) * (size_t)r.n_tokens) == 0);
    const double nm = r.logits && ref.logits && r.n_vocab == ref.n_vocab ? mr_nmse(r.logits, ref.logits, r.n_vocab) : 1.0;
    fprintf(stderr, "mlx 4-bit g32 bf16 tied qwen2 N=2 vs N=1: final logits nmse %.3g\n", nm);
    CU_ASSERT(nm <= 1e-4);
    mr_free(&r);
    { /* and its `tpserve shard` files: bf16 scales, the F16 ffn_down beside MLX triples, no output.weight */
        char out[600], pat[800];
        snprintf(out, sizeof out, "%s/mlx-qwen2-shards", tp_test_tmpdir());
        mkdir(out, 0755);
        if (tp_parallel_write_shards(dir, 2, NULL, out, &e) != TP_OK) fprintf(stderr, "%s\n", e.msg);
        CU_ASSERT_EQUAL_FATAL(e.status, TP_OK);
        snprintf(pat, sizeof pat, "%s/synth-mlx-qwen2.rank%%d-of-2.gguf", out);
        run_shards(&ref, pat, 2, 1e-4, "mlx 4-bit g32 bf16 tied qwen2 shard files N=2 vs directory N=1");
    }
    mr_init(&r, dir, 3);
    r.n_steps = 4;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    CU_ASSERT_NOT_EQUAL(r.exit_code[0], 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.msg[0], "attn_output's mlx 4-bit group-32 blocks are never cut"));
    if (!strstr(r.msg[0], "never cut")) fprintf(stderr, "N=3: %s\n", r.msg[0]);
    mr_free(&r);
    mr_free(&ref);
}

/* Run the N ranks of shard pattern pat (one %d) against ref: the same tokens, logits within max_nmse. */
static void run_shards(const struct mr_run *ref, const char *pat, int world, double max_nmse, const char *what)
{
    struct mr_run r;
    mr_init(&r, pat, world);
    r.shard_files = 1;
    r.n_steps = ref->n_tokens - 1;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
    for (int k = 0; k < world; k++) {
        if (r.exit_code[k] != 0) fprintf(stderr, "%s: rank %d exit %d: %s\n", what, k, r.exit_code[k], r.msg[k]);
        CU_ASSERT_EQUAL(r.exit_code[k], 0);
    }
    CU_ASSERT_EQUAL_FATAL(r.n_tokens, ref->n_tokens);
    const int same = memcmp(r.tokens, ref->tokens, sizeof(int32_t) * (size_t)r.n_tokens) == 0 &&
                     memcmp(r.tokens1, ref->tokens1, sizeof(int32_t) * (size_t)r.n_tokens) == 0;
    const double e = r.logits && ref->logits && r.n_vocab == ref->n_vocab ? mr_nmse(r.logits, ref->logits, r.n_vocab) : 1.0;
    fprintf(stderr, "%s: %d+%d greedy tokens %s, final logits nmse %.3g, %.2f s\n", what, r.n_tokens, r.n_tokens,
            same ? "identical" : "DIFFER", e, r.seconds);
    CU_ASSERT(same);
    CU_ASSERT(e <= max_nmse);
    /* each rank holds only its slice */
    if (r.weight_bytes[0] && ref->weight_bytes[0] && ref->world == 1) CU_ASSERT(r.weight_bytes[0] < ref->weight_bytes[0]);
    mr_free(&r);
}

/* Overwrite the first occurrence of `find` (len bytes) in file path with `repl` at byte `at` past its start. */
static int patch_file(const char *path, const void *find, size_t len, size_t at, const void *repl, size_t rlen)
{
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    static unsigned char buf[4 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    int rc = -1;
    for (size_t i = 0; i + len <= n && rc != 0; i++)
        if (memcmp(buf + i, find, len) == 0 && i + at + rlen <= n) {
            rc = fseek(f, (long)(i + at), SEEK_SET) == 0 && fwrite(repl, 1, rlen, f) == rlen ? 0 : -1;
            break;
        }
    fclose(f);
    return rc;
}

static void copy_file(const char *from, const char *to)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    CU_ASSERT_EQUAL(system(cmd), 0);
}

/* `tpserve shard` of the MLX 4-bit directory at N = 2, 3; damaged shard files refused. */
static void test_mlx_shard_files(void)
{
    const char *m = mlx_dir();
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    enum { STEPS = 48 };
    struct mr_run ref, dirn;
    mr_init(&ref, m, 1);
    ref.n_steps = STEPS;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    CU_ASSERT_EQUAL_FATAL(ref.exit_code[0], 0);
    char out[600], pat[800], tag[160], f0[900], bad[900];
    const char *base = strrchr(m, '/') + 1;
    for (int n = 2; n <= 3; n++) {
        snprintf(out, sizeof out, "%s/mlx-shards-%d", tp_test_tmpdir(), n);
        mkdir(out, 0755);
        struct tp_error e = {0};
        if (tp_parallel_write_shards(m, n, NULL, out, &e) != TP_OK) fprintf(stderr, "%s\n", e.msg);
        CU_ASSERT_EQUAL_FATAL(e.status, TP_OK);
        snprintf(pat, sizeof pat, "%s/%s.rank%%d-of-%d.gguf", out, base, n);
        /* the rank's tensors are the packed slices: words I32, scales / biases F16, MLX type by the probe */
        snprintf(f0, sizeof f0, pat, 0);
        struct tp_model_probe pr;
        CU_ASSERT_EQUAL_FATAL(tp_model_probe(f0, &pr, &e), TP_OK);
        CU_ASSERT_EQUAL(pr.is_shard, 1);
        CU_ASSERT_EQUAL(pr.types.attn_o, TP_WTYPE_MLX_Q4_G64);
        CU_ASSERT_EQUAL(pr.types.ffn_down, TP_WTYPE_MLX_Q4_G64);
        CU_ASSERT_EQUAL(pr.types.output, TP_WTYPE_MLX_Q4_G64);
        snprintf(tag, sizeof tag, "mlx 4-bit g64 shard files N=%d vs directory N=1", n);
        run_shards(&ref, pat, n, 1e-4, tag);
        mr_init(&dirn, m, n); /* the directory at the same N: the same slices, so the same floats */
        dirn.n_steps = STEPS;
        CU_ASSERT_EQUAL_FATAL(mr_exec(&dirn), 0);
        snprintf(tag, sizeof tag, "mlx 4-bit g64 shard files N=%d vs directory N=%d", n, n);
        run_shards(&dirn, pat, n, 1e-10, tag);
        mr_free(&dirn);
    }
    /* damaged N = 2 shard sets (rank 1's file intact): a group-size key that contradicts the shapes */
    snprintf(out, sizeof out, "%s/mlx-shards-2", tp_test_tmpdir());
    static const struct {
        const char *find, *repl, *want;
        size_t at;
    } cases[] = {
        {"tpserve.mlx.group_size", " ", "by its shapes", 22 + 4}, /* u32 value 64 -> 32 ('\x20') */
        {"blk.1.ffn_down.scales", "blk.1.ffn_down.scalez", "blk.1.ffn_down.scales", 0},
    };
    for (size_t c = 0; c < TP_ARRAY_LEN(cases); c++) {
        char dir[700];
        snprintf(dir, sizeof dir, "%s/mlx-bad-%zu", tp_test_tmpdir(), c);
        mkdir(dir, 0755);
        for (int k = 0; k < 2; k++) {
            snprintf(f0, sizeof f0, "%s/%s.rank%d-of-2.gguf", out, base, k);
            snprintf(bad, sizeof bad, "%s/%s.rank%d-of-2.gguf", dir, base, k);
            copy_file(f0, bad);
        }
        snprintf(bad, sizeof bad, "%s/%s.rank0-of-2.gguf", dir, base);
        CU_ASSERT_EQUAL_FATAL(patch_file(bad, cases[c].find, strlen(cases[c].find), cases[c].at, cases[c].repl,
                                         strlen(cases[c].repl)),
                              0);
        snprintf(pat, sizeof pat, "%s/%s.rank%%d-of-2.gguf", dir, base);
        struct mr_run r;
        mr_init(&r, pat, 2);
        r.shard_files = 1;
        r.n_steps = 2;
        CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
        fprintf(stderr, "damaged shard %zu: rank 0 exit %d: %s\n", c, r.exit_code[0], r.msg[0]);
        CU_ASSERT_NOT_EQUAL(r.exit_code[0], 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.msg[0], cases[c].want));
        mr_free(&r);
    }
    mr_free(&ref);
}

/* The command line: synth --format mlx, shard DIR -n 1 / -n 2, info of a shard, generate from the N = 1 shard
 * file == generate from the directory. */
static void test_mlx_shard_cli(void)
{
    const char *bin = tp_test_tpserve();
    if (!bin) {
        tp_test_skip("tpserve binary not found");
        return;
    }
    const char *tmp = tp_test_tmpdir();
    char cmd[4096], out[8192], out2[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' synth -q --shape test-tiny --format mlx --group-size 32 --seed 9 -o '%s/cli-mlx' 2>&1 && "
             "mkdir -p '%s/cli-mlx-s1' '%s/cli-mlx-s2' && '%s' shard '%s/cli-mlx' -n 1 -o '%s/cli-mlx-s1' 2>&1 && "
             "'%s' shard '%s/cli-mlx' -n 2 -o '%s/cli-mlx-s2' 2>&1",
             bin, tmp, tmp, tmp, bin, tmp, tmp, bin, tmp, tmp);
    CU_ASSERT_EQUAL_FATAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "'%s' info '%s/cli-mlx-s2/cli-mlx.rank1-of-2.gguf' 2>&1", bin, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "shard       rank 1 of 2 (cut from cli-mlx)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "MLX affine (tpserve.mlx.bits: 4 bits, group size 32)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "mlx_q4_g32 x16")); /* 7 per layer x 2 layers + embedding + head */
    if (!strstr(out, "mlx_q4_g32 x16")) fprintf(stderr, "%s\n", out);
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s/cli-mlx' -p 'once upon' -n 24 --temp 0 -t 1 --quiet-stats 2>/dev/null",
             bin, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd,
             "'%s' generate -m '%s/cli-mlx-s1/cli-mlx.rank0-of-1.gguf' -p 'once upon' -n 24 --temp 0 -t 1 "
             "--quiet-stats 2>/dev/null",
             bin, tmp);
    CU_ASSERT_EQUAL(tp_test_run_cmd(cmd, out2, sizeof out2), 0);
    CU_ASSERT(strlen(out) > strlen("once upon"));
    CU_ASSERT_STRING_EQUAL(out, out2);
}

/* mlx-lm's Qwen3-MoE layout (stacked switch_mlp experts, 8-bit router) served by 2 ranks with each expert
 * split, against one rank: the same integer dots in another summation order (near-tie rule of the
 * quantized checks, 8% of the logits' rms, and the final logits within a normalized MSE of 1e-4, as
 * the dense MLX check above), each rank holding less than the whole; and `tpserve shard` of the
 * directory with each split (stacked triples cut expert by expert, never re-quantized): the two files
 * give the tokens and logits of the directory at N = 2 with that split exactly (the same bytes, the same
 * sums), each file smaller than the directory. */
static void test_tp_mlx_moe(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/synth-mlx-qwen3moe", tp_test_tmpdir());
    struct tp_shape sh;
    struct tp_error e = {0};
    CU_ASSERT_EQUAL_FATAL(tp_shape_find(NULL, "test-tiny-qwen3moe", &sh, &e), TP_OK);
    struct tp_synth_config c = tp_synth_default_config();
    c.shape = &sh;
    c.n_layer = sh.n_layer;
    c.type = TP_WTYPE_MLX_Q4_G32; /* experts of 64 columns: 2 groups, so the column split has one per rank */
    c.seed = 56;
    c.out_path = dir;
    c.n_threads = 2;
    if (tp_synth_write_hf(&c, &e) != TP_OK) fprintf(stderr, "%s\n", e.msg);
    CU_ASSERT_EQUAL_FATAL(e.status, TP_OK);
    enum { STEPS = 40 };
    struct mr_run ref, r;
    mr_init(&ref, dir, 1);
    ref.n_steps = STEPS;
    CU_ASSERT_EQUAL_FATAL(mr_exec(&ref), 0);
    if (ref.exit_code[0] != 0) fprintf(stderr, "reference: %s\n", ref.msg[0]);
    CU_ASSERT_EQUAL_FATAL(ref.exit_code[0], 0);
    CU_ASSERT_EQUAL_FATAL(ref.n_tokens, STEPS + 1);
    const enum tp_moe_split splits[] = {TP_MOE_SPLIT_TENSOR, TP_MOE_SPLIT_EXPERT};
    for (int sp = 0; sp < 2; sp++) {
        char what[96];
        snprintf(what, sizeof what, "mlx qwen3moe 4-bit g32 %s-parallel N=2", tp_moe_split_name(splits[sp]));
        mr_init(&r, dir, 2);
        r.n_steps = STEPS;
        r.moe_split = splits[sp];
        CU_ASSERT_EQUAL_FATAL(mr_exec(&r), 0);
        for (int k = 0; k < 2; k++) {
            if (r.exit_code[k] != 0) fprintf(stderr, "%s rank %d exit %d: %s\n", what, k, r.exit_code[k], r.msg[k]);
            CU_ASSERT_EQUAL(r.exit_code[k], 0);
            CU_ASSERT(r.weight_bytes[k] > 0 && r.weight_bytes[k] < ref.weight_bytes[0]);
        }
        CU_ASSERT_EQUAL(r.plan_split, (int)splits[sp]);
        CU_ASSERT_EQUAL(mr_near_tie_violations(&ref, &r, 0.08, 0, what), 0);
        const double nm = r.logits && ref.logits ? mr_nmse(r.logits, ref.logits, r.n_vocab) : 1.0;
        fprintf(stderr, "%s: final logits nmse %.3g\n", what, nm);
        if (r.tokens[STEPS] == ref.tokens[STEPS]) CU_ASSERT(nm <= 1e-4); /* same text: same final context */
        /* the shard files of this split against the directory at N = 2 with it */
        char out[600], pat[800];
        snprintf(out, sizeof out, "%s/mlx-moe-shards-%s", tp_test_tmpdir(), tp_moe_split_name(splits[sp]));
        mkdir(out, 0755);
        if (tp_parallel_write_shards_moe(dir, 2, NULL, splits[sp], out, &e) != TP_OK) fprintf(stderr, "%s\n", e.msg);
        CU_ASSERT_EQUAL_FATAL(e.status, TP_OK);
        snprintf(pat, sizeof pat, "%s/synth-mlx-qwen3moe.rank%%d-of-2.gguf", out);
        struct mr_run f;
        mr_init(&f, pat, 2);
        f.shard_files = 1;
        f.n_steps = STEPS;
        f.moe_split = splits[sp];
        CU_ASSERT_EQUAL_FATAL(mr_exec(&f), 0);
        for (int k = 0; k < 2; k++) {
            if (f.exit_code[k] != 0) fprintf(stderr, "%s files rank %d exit %d: %s\n", what, k, f.exit_code[k], f.msg[k]);
            CU_ASSERT_EQUAL_FATAL(f.exit_code[k], 0);
            CU_ASSERT_EQUAL(f.weight_bytes[k], r.weight_bytes[k]); /* exactly the slice the directory's rank read */
        }
        CU_ASSERT_EQUAL_FATAL(f.n_tokens, r.n_tokens);
        CU_ASSERT(memcmp(f.tokens, r.tokens, sizeof(int32_t) * (size_t)r.n_tokens) == 0);
        CU_ASSERT(memcmp(f.tokens1, r.tokens1, sizeof(int32_t) * (size_t)r.n_tokens) == 0);
        const double nf = f.logits && r.logits ? mr_nmse(f.logits, r.logits, r.n_vocab) : 1.0;
        fprintf(stderr, "%s shard files vs directory: final logits nmse %.3g\n", what, nf);
        CU_ASSERT(nf <= 1e-12);
        mr_free(&f);
        mr_free(&r);
    }
    mr_free(&ref);
}

static const struct tp_test_case mlx_plan_cases[] = {
    {"plan_mlx", test_plan_mlx},
    {NULL, NULL},
};
TP_TEST_SUITE(mlx_plan, "unit", 60, mlx_plan_cases)

static const struct tp_test_case mlx_tp_cases[] = {
    {"tp_mlx_q4_g64", test_tp_mlx},
    {"tp_mlx_tied_qwen2", test_tp_mlx_tied},
    {"mlx_shard_files", test_mlx_shard_files},
    {"mlx_shard_cli", test_mlx_shard_cli},
    {"tp_mlx_moe_qwen3moe", test_tp_mlx_moe},
    {NULL, NULL},
};
TP_TEST_SUITE(mlx_tp, "multirank,model", 300, mlx_tp_cases)
