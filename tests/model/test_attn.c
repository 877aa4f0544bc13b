/*
 * tests/model/test_attn.c - the tiled attention kernel (model/forward/attn.c)
 * against a float64 oracle that masks explicitly, and against the
 * per-position reference:
 *   - head sizes 64, 80, 128; 1..9000 positions; f32, f16, q8_0 and bf16
 *     caches (q8_0 blocks of 32, and of 16 for head 80; bf16 in tiles of 64
 *     positions, read in place by the AVX512_BF16 path, whole tiles with the
 *     keys outside the item masked)
 *     (the oracle reads the cache rows as stored, so it checks the kernel,
 *     not the rounding of the cache); full attention and sliding windows of
 *     4, 128 and 4096, the cache a ring of window + block rows when that is
 *     shorter than the sequence; with and without attention sinks;
 *   - blocks of 1, 5 and 8 query positions times 1, 4 and 8 query heads per
 *     KV head (up to 64 rows: 4 row groups of the AMX tiles, 16 groups of 4 of
 *     the AVX512_BF16 path, which also runs groups of 1-3 rows here); the keys
 *     in one item and split into 3 key ranges merged with tp_attn_merge (the
 *     split decode);
 *   - every path the CPU has (AMX-BF16, AVX512_BF16, AVX-512, AVX2, plain C);
 *     the 9000-position cases on the best path, the best float32 path and
 *     AVX512_BF16 (head 80 there: its AVX-512 fallback);
 *   - q8_0 rows: round trip within half a quantization step;
 *   - the per-position reference (tp_op_attn_head_ref) equals the kernel.
 * The output whole and split in 3 agree within 1e-10 (float32 paths), 1e-7
 * (AVX512_BF16: its weights round alike against any part's max) or 5e-5 (AMX).
 * Bound: NMSE of the output against the oracle <= 1e-9 for the float32
 * paths: float32 scores and sums over up to 9000 terms, and the vector exp
 * (~2 ulp), stay near 1e-12; a wrong mask, window edge, sink or merge weight
 * gives 1e-3 or more.  The AMX and AVX512_BF16 paths round q, k, the softmax
 * weights and v to bf16 (relative error <= 2^-9, RMS ~1.6e-3 each): the scores here (std ~1)
 * move by ~2.6e-3, which moves a diffuse output by ~2.6e-3 of its norm, and
 * the rounding of p and v adds ~1.6e-3 each: NMSE ~(2.6e-3)^2 + 2 (1.6e-3)^2
 * = 1.2e-5, as measured (worst 1.6e-5 over these cases on either path, the
 * log line);
 * bound 5e-5, still 20x below what a wrong mask or merge gives.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward/model_impl.h"
#include "tp_test.h"

static uint64_t at_state = 0x9E3779B97F4A7C15ull;

/* test_rising_max's key profile when set: keys before position 200 scaled by 0.1, then by 0.5, from 400 on by 3; the
 * largest rise, over all rows of a case, of a row's max score (log2 units) from positions < 400 to >= 400 */
static int at_rising;
static double at_rise_seen;
/* the largest NMSE between an item's output whole and split into 3 key ranges merged, since last reset */
static double at_split_seen;
static float at_rand(void) /* uniform [-1, 1) */
{
    at_state ^= at_state << 13;
    at_state ^= at_state >> 7;
    at_state ^= at_state << 17;
    return (float)((double)(at_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/*
 * float64 oracle of one query row at position p: keys j in [lo, p] (lo =
 * max(0, p - window + 1), or 0 without a window) with scores q.k_j * scale,
 * softmax whose denominator also holds e^sink when has_sink, o = sum p_j v_j.
 * kf / vf: (n, hd) values of position j as the cache holds them.
 */
static void oracle(const float *q, const float *kf, const float *vf, int p, int window, int hd, double scale,
                   int has_sink, double sink, double *o)
{
    const int lo = window > 0 ? (p - window + 1 > 0 ? p - window + 1 : 0) : 0;
    double mx = has_sink ? sink : -1e300, sum = 0;
    double *s = malloc((size_t)(p + 1) * sizeof(double));
    for (int j = lo; j <= p; j++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * kf[(size_t)j * hd + i];
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
    }
    for (int j = lo; j <= p; j++) sum += s[j] = exp(s[j] - mx);
    if (has_sink) sum += exp(sink - mx);
    for (int i = 0; i < hd; i++) {
        double a = 0;
        for (int j = lo; j <= p; j++) a += s[j] * vf[(size_t)j * hd + i];
        o[i] = a / sum;
    }
    free(s);
}

struct acc {
    double num, den;
};

static void acc_add(struct acc *a, const float *got, const double *ref, int n)
{
    for (int i = 0; i < n; i++) {
        a->num += (got[i] - ref[i]) * (got[i] - ref[i]);
        a->den += ref[i] * ref[i];
    }
}

/*
 * One case: n positions of one sequence in a cache of type t (a ring of cap
 * rows when window + block < n), the last nt positions as the query block,
 * ng query heads; the kernel once over all keys and once split in 3 merged.
 * Returns the larger of the two NMSEs.
 */
static double run_case(int hd, enum tp_kv_type t, int n, int window, int nt, int ng, int sinks)
{
    const size_t rb = tp_kv_row_bytes(t, hd);
    if (rb == 0) return 0; /* bf16 with hd % 16 != 0: no such cache */
    const int cap = (int)tp_kv_cap_rows(t, window > 0 && window + nt < n ? window + nt : n);
    uint8_t *kc = calloc((size_t)cap, rb), *vc = calloc((size_t)cap, rb);
    float *kf = malloc((size_t)n * hd * sizeof(float)), *vf = malloc((size_t)n * hd * sizeof(float));
    float *x = malloc((size_t)hd * sizeof(float));
    float *q = malloc((size_t)nt * ng * hd * sizeof(float)), *o = malloc((size_t)nt * ng * hd * sizeof(float));
    float *o2 = malloc((size_t)nt * ng * hd * sizeof(float)), sink[8];
    double *od = malloc((size_t)hd * sizeof(double));
    const int rows = nt * ng;
    float *scratch = malloc(tp_attn_scratch_floats(hd, rows) * sizeof(float));
    float *parts = malloc(3 * TP_ATTN_PART_FLOATS(hd, rows) * sizeof(float));
    CU_ASSERT_FATAL(kc && vc && kf && vf && x && q && o && o2 && od && scratch && parts);
    /* keys with a per-position offset so scores differ in scale across the sequence */
    for (int j = 0; j < n; j++) {
        const float bias = 0.5f * sinf((float)j * 0.01f), amp = !at_rising ? 1.0f : j < 200 ? 0.1f : j < 400 ? 0.5f : 3.0f;
        for (int i = 0; i < hd; i++) x[i] = amp * (at_rand() + bias);
        tp_kv_store_at(t, kc, 0, j % cap, x, hd);
        tp_kv_load_at(t, kc, 0, j % cap, kf + (size_t)j * hd, hd);
        for (int i = 0; i < hd; i++) x[i] = at_rand();
        tp_kv_store_at(t, vc, 1, j % cap, x, hd);
        tp_kv_load_at(t, vc, 1, j % cap, vf + (size_t)j * hd, hd);
    }
    for (int i = 0; i < nt * ng * hd; i++) q[i] = 3.0f * at_rand();
    for (int h = 0; h < ng; h++) sink[h] = 2.0f * at_rand() + 1.0f;
    const struct tp_attn_geom g = {hd, t, rb, cap, window, 1.0f / sqrtf((float)hd)};
    const int pos0 = n - nt;
    const struct tp_attn_rows r = {q, (size_t)ng * hd, nt, ng, pos0, sinks ? sink : NULL};
    tp_attn_tile(&g, &r, kc, vc, 0, n, scratch, o, (size_t)ng * hd, NULL);
    const size_t ps = TP_ATTN_PART_FLOATS(hd, rows);
    const int lo = window > 0 && pos0 - window + 1 > 0 ? pos0 - window + 1 : 0;
    for (int k = 0; k < 3; k++)
        tp_attn_tile(&g, &r, kc, vc, lo + (n - lo) * k / 3, lo + (n - lo) * (k + 1) / 3, scratch, NULL, 0,
                     parts + k * ps);
    tp_attn_merge(parts, 3, ps, hd, &r, o2, (size_t)ng * hd);
    struct acc a1 = {0, 0}, a2 = {0, 0};
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < ng; h++) {
            oracle(q + ((size_t)i * ng + h) * hd, kf, vf, pos0 + i, window, hd, 1.0 / sqrt((double)hd), sinks,
                   sink[h], od);
            if (at_rising && pos0 + i >= 400) {
                const float *qr = q + ((size_t)i * ng + h) * hd;
                double m1 = -1e300, m2 = -1e300;
                for (int j = 0; j <= pos0 + i; j++) {
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += (double)qr[c] * kf[(size_t)j * hd + c];
                    d *= 1.4426950408889634 / sqrt((double)hd);
                    if (j < 400) m1 = d > m1 ? d : m1;
                    else m2 = d > m2 ? d : m2;
                }
                if (m2 - m1 > at_rise_seen) at_rise_seen = m2 - m1;
            }
            acc_add(&a1, o + ((size_t)i * ng + h) * hd, od, hd);
            acc_add(&a2, o2 + ((size_t)i * ng + h) * hd, od, hd);
        }
    double dn = 0, dd = 0; /* the item whole against split in 3 */
    for (size_t i = 0; i < (size_t)nt * ng * hd; i++) dn += (double)(o[i] - o2[i]) * (o[i] - o2[i]), dd += (double)o[i] * o[i];
    if (dd > 0 && dn / dd > at_split_seen) at_split_seen = dn / dd;
    free(kc), free(vc), free(kf), free(vf), free(x), free(q), free(o), free(o2), free(od), free(scratch), free(parts);
    const double e1 = a1.num / a1.den, e2 = a2.num / a2.den;
    return e1 > e2 ? e1 : e2;
}

static void test_tile_long_at(void);

/* the NMSE bound of the path in use (see the top of the file) */
static double level_bound(void) { return tp_attn_isa_level() >= TP_ATTN_ISA_AVX512BF16 ? 5e-5 : 1e-9; }

static void tile_oracle_at(void)
{
    static const int hds[] = {8, 24, 64, 80, 128};
    static const int ns[] = {1, 2, 63, 64, 65, 129, 700};
    static const int windows[] = {0, 4, 128};
    const double bound = level_bound();
    double worst = 0;
    int cases = 0;
    at_split_seen = 0;
    for (size_t a = 0; a < TP_ARRAY_LEN(hds); a++)
        for (int t = 0; t < TP_KV_TYPE_COUNT; t++) {
            for (size_t b = 0; b < TP_ARRAY_LEN(ns); b++)
                for (size_t w = 0; w < TP_ARRAY_LEN(windows); w++)
                    for (int shape = 0; shape < 4; shape++) { /* shape 3: a prefill item of TinyLlama (8 x 8) */
                        const int nt = shape == 0 ? 1 : shape == 3 ? 8 : 5, ng = shape == 2 ? 1 : shape == 3 ? 8 : 4;
                        if (nt > ns[b]) continue;
                        const double e =
                            run_case(hds[a], (enum tp_kv_type)t, ns[b], windows[w], nt, ng, (int)(b + w + shape) % 2);
                        if (e > worst) worst = e;
                        if (e > bound)
                            fprintf(stderr, "attn tile: hd %d %s n %d window %d nt %d ng %d: NMSE %.3g\n", hds[a],
                                    tp_kv_type_name((enum tp_kv_type)t), ns[b], windows[w], nt, ng, e);
                        CU_ASSERT(e <= bound);
                        cases++;
                    }
        }
    /* whole against split: float32 sums in another order, and on the AVX512_BF16 path the same weight
     * roundings (a row's max a whole number in log2 units, so a weight rounds alike against any max a part
     * reaches): measured 4.5e-13 (float32) and 3.3e-9 (AVX512_BF16; 3.5e-6 with the exact running max, whose
     * parts round their weights against different maxima).  The AMX path keeps the exact running max: the
     * bound of the bf16 rounding itself. */
    const int lv = tp_attn_isa_level();
    const double split_bound = lv == TP_ATTN_ISA_AMX ? 5e-5 : lv == TP_ATTN_ISA_AVX512BF16 ? 1e-7 : 1e-10;
    fprintf(stderr, "attn tile (%s): %d cases, worst NMSE vs float64 %.3g (bound %.0e), whole vs split %.3g (bound %.0e)\n",
            tp_attn_isa_name(tp_attn_isa_level()), cases, worst, bound, at_split_seen, split_bound);
    CU_ASSERT(at_split_seen <= split_bound);
}

/* every path this CPU has: AMX-BF16, AVX512_BF16, AVX-512, AVX2, plain C; the long cases on the best float32 path
 * and on AVX512_BF16 too */
static void test_tile_oracle(void)
{
    const int prev = tp_attn_isa_limit(TP_ATTN_ISA_AMX);
    const int top = tp_attn_isa_level();
    for (int level = top; level >= 0; level--) {
        tp_attn_isa_limit(level);
        CU_ASSERT_EQUAL(tp_attn_isa_level(), level);
        tile_oracle_at();
        const int best_f32 = level == TP_ATTN_ISA_AVX512 && top > TP_ATTN_ISA_AVX512;
        if (level == top || best_f32 || level == TP_ATTN_ISA_AVX512BF16) test_tile_long_at();
    }
    tp_attn_isa_limit(prev);
}

/* Long sequences: 9000 positions, full and windowed (4096 with sinks, the ring shorter than the sequence); decode
 * items of 8 and 4 query heads per KV head (TinyLlama, Llama 3) over f16, q8_0, f32 and bf16 caches. */
static void test_tile_long_at(void)
{
    static const struct {
        int hd, t, window, nt, ng, sinks;
    } cs[] = {{128, TP_KV_F16, 0, 1, 4, 0}, {64, TP_KV_Q8_0, 4096, 1, 1, 1}, {80, TP_KV_F32, 4096, 5, 1, 1},
              {128, TP_KV_Q8_0, 0, 3, 2, 1}, {64, TP_KV_F16, 128, 5, 4, 1}, {64, TP_KV_F16, 0, 1, 8, 0},
              {128, TP_KV_F32, 0, 1, 4, 1}, {64, TP_KV_Q8_0, 0, 1, 8, 1}, {64, TP_KV_BF16, 0, 1, 8, 0},
              {128, TP_KV_BF16, 4096, 1, 4, 1}, {80, TP_KV_BF16, 0, 5, 1, 0}};
    const double bound = level_bound();
    for (size_t i = 0; i < TP_ARRAY_LEN(cs); i++) {
        const double e = run_case(cs[i].hd, (enum tp_kv_type)cs[i].t, 9000, cs[i].window, cs[i].nt, cs[i].ng, cs[i].sinks);
        fprintf(stderr, "attn long case %zu (%s): NMSE %.3g (bound %.0e)\n", i, tp_attn_isa_name(tp_attn_isa_level()), e,
                bound);
        CU_ASSERT(e <= bound);
    }
}

/* A row's max that rises late: keys scaled by 0.1 before position 200, by 1 up to 400, by 4 after, so a row's max
 * rises within the AVX512_BF16 path's slack (8 in log2 units, attn_bf16.c) at 200 and past it at 400, where the
 * kernel raises the max, rescaling the sums it holds.  Every path, f16 / bf16 / f32 caches, decode and prefill
 * items, whole and split in 3; the profile must rise past the slack in some row (checked on the oracle's scores). */
static void test_rising_max(void)
{
    static const struct {
        int hd, t, nt, ng, sinks;
    } cs[] = {{64, TP_KV_BF16, 1, 8, 0}, {64, TP_KV_F16, 8, 8, 1}, {128, TP_KV_BF16, 5, 4, 1}, {64, TP_KV_BF16, 1, 1, 0},
              {64, TP_KV_F32, 1, 8, 1}};
    const int prev = tp_attn_isa_limit(TP_ATTN_ISA_AMX);
    const int top = tp_attn_isa_level();
    at_rising = 1;
    for (int level = top; level >= 0; level--) {
        tp_attn_isa_limit(level);
        /* The bf16 paths' error grows with the scores (q and k rounded: |s| 2^-9 each), here ~3x those of the other
         * cases after position 400, and a row whose weight sits on a few keys keeps its error unaveraged: measured
         * up to 8.3e-5 (single row) whether the max is raised at every tile or only past the slack; a sum or
         * output left unrescaled at a rise is off by 2^rise. */
        const double bound = level >= TP_ATTN_ISA_AVX512BF16 ? 2e-4 : level_bound();
        for (size_t i = 0; i < TP_ARRAY_LEN(cs); i++) {
            at_rise_seen = 0;
            const double e = run_case(cs[i].hd, (enum tp_kv_type)cs[i].t, 700, 0, cs[i].nt, cs[i].ng, cs[i].sinks);
            fprintf(stderr, "attn rising max case %zu (%s): NMSE %.3g (bound %.0e), largest rise %.1f\n", i,
                    tp_attn_isa_name(level), e, bound, at_rise_seen);
            CU_ASSERT(e <= bound);
            CU_ASSERT(at_rise_seen > 8.0);
        }
    }
    at_rising = 0;
    tp_attn_isa_limit(prev);
}

/* The per-position reference and the kernel's float32 path on the same f32 / f16 cache (window 0, no sinks). */
static void test_tile_vs_ref(void)
{
    const int prev = tp_attn_isa_limit(TP_ATTN_ISA_AVX512);
    for (int f16 = 0; f16 <= 1; f16++) {
        const int hd = 64, n = 300;
        const enum tp_kv_type t = f16 ? TP_KV_F16 : TP_KV_F32;
        const size_t rb = tp_kv_row_bytes(t, hd);
        uint8_t *kc = malloc((size_t)n * rb), *vc = malloc((size_t)n * rb);
        float x[64], q[64], o[64], o_ref[64], *sc = malloc((size_t)n * sizeof(float));
        float *scratch = malloc(tp_attn_scratch_floats(hd, 1) * sizeof(float));
        CU_ASSERT_FATAL(kc && vc && sc && scratch);
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < hd; i++) x[i] = at_rand();
            tp_kv_store(t, kc + (size_t)j * rb, x, hd);
            for (int i = 0; i < hd; i++) x[i] = at_rand();
            tp_kv_store(t, vc + (size_t)j * rb, x, hd);
        }
        for (int i = 0; i < hd; i++) q[i] = 2.0f * at_rand();
        const float scale = 0.125f;
        tp_op_attn_head_ref(q, kc, vc, (size_t)hd, f16, n, hd, scale, sc, o_ref);
        const struct tp_attn_geom g = {hd, t, rb, n, 0, scale};
        const struct tp_attn_rows r = {q, (size_t)hd, 1, 1, n - 1, NULL};
        tp_attn_tile(&g, &r, kc, vc, 0, n, scratch, o, (size_t)hd, NULL);
        double num = 0, den = 0;
        for (int i = 0; i < hd; i++) {
            num += (o[i] - o_ref[i]) * (o[i] - o_ref[i]);
            den += (double)o_ref[i] * o_ref[i];
        }
        CU_ASSERT(num / den <= 1e-10);
        free(kc), free(vc), free(sc), free(scratch);
    }
    tp_attn_isa_limit(prev);
}

/* q8_0 rows: each value within half a step (amax / 127 / 2, plus the fp16 rounding of the scale); head 80 in
 * blocks of 16 */
static void test_q8_row(void)
{
    float x[128], y[128];
    uint8_t row[136];
    CU_ASSERT_EQUAL(tp_kv_row_bytes(TP_KV_Q8_0, 128), 136u);
    CU_ASSERT_EQUAL(tp_kv_row_bytes(TP_KV_Q8_0, 80), 90u); /* 5 blocks of 16 */
    CU_ASSERT_EQUAL(tp_kv_row_bytes(TP_KV_Q8_0, 8), 10u);
    CU_ASSERT_EQUAL(tp_kv_row_bytes(TP_KV_Q8_0, 12), 0u);
    CU_ASSERT_EQUAL(tp_kv_row_bytes(TP_KV_F16, 80), 160u);
    for (int i = 0; i < 128; i++) x[i] = 4.0f * at_rand();
    x[5] = 0.0f;
    tp_kv_store(TP_KV_Q8_0, row, x, 128);
    tp_kv_load(TP_KV_Q8_0, row, y, 128);
    for (int b = 0; b < 4; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        for (int i = 0; i < 32; i++) CU_ASSERT(fabsf(x[b * 32 + i] - y[b * 32 + i]) <= amax / 127.0f * 0.5f * 1.002f + 1e-7f);
    }
    CU_ASSERT_EQUAL(y[5], 0.0f);
    uint8_t row80[90];
    tp_kv_store(TP_KV_Q8_0, row80, x, 80);
    tp_kv_load(TP_KV_Q8_0, row80, y, 80);
    for (int b = 0; b < 5; b++) {
        float amax = 0;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[b * 16 + i]));
        for (int i = 0; i < 16; i++) CU_ASSERT(fabsf(x[b * 16 + i] - y[b * 16 + i]) <= amax / 127.0f * 0.5f * 1.002f + 1e-7f);
    }
    enum tp_kv_type t;
    CU_ASSERT_EQUAL(tp_kv_type_parse("q8_0", &t), TP_OK);
    CU_ASSERT_EQUAL(t, TP_KV_Q8_0);
    CU_ASSERT_EQUAL(tp_kv_type_parse("q4", &t), TP_ERR_INVALID_ARG);
}

/* TP_ATTN_ISA's values, and the default: with the variable unset, the best path the CPU has (AMX-BF16 where
 * the CPU has it and the kernel grants the tile state, else AVX-512, AVX2, plain C). */
static void test_isa_default(void)
{
    CU_ASSERT_EQUAL(tp_attn_isa_parse(NULL), TP_ATTN_ISA_AMX);
    CU_ASSERT_EQUAL(tp_attn_isa_parse(""), TP_ATTN_ISA_AMX);
    CU_ASSERT_EQUAL(tp_attn_isa_parse("amx"), TP_ATTN_ISA_AMX);
    CU_ASSERT_EQUAL(tp_attn_isa_parse("avx512bf16"), TP_ATTN_ISA_AVX512BF16);
    CU_ASSERT_EQUAL(tp_attn_isa_parse("avx512"), TP_ATTN_ISA_AVX512);
    CU_ASSERT_EQUAL(tp_attn_isa_parse("avx2"), TP_ATTN_ISA_AVX2);
    CU_ASSERT_EQUAL(tp_attn_isa_parse("c"), TP_ATTN_ISA_C);
    CU_ASSERT_EQUAL(tp_attn_isa_parse("AVX512"), -1);
    CU_ASSERT_EQUAL(tp_attn_isa_parse("sse"), -1);
    int best = TP_ATTN_ISA_C;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = TP_ATTN_ISA_AVX2; /* F16C: every such CPU */
    if (best == TP_ATTN_ISA_AVX2 && __builtin_cpu_supports("avx512f")) best = TP_ATTN_ISA_AVX512;
    if (best == TP_ATTN_ISA_AVX512 && tp_attn_bf16_detect()) best = TP_ATTN_ISA_AVX512BF16;
    if (best >= TP_ATTN_ISA_AVX512 && tp_attn_amx_detect()) best = TP_ATTN_ISA_AMX;
#endif
    const char *env = getenv("TP_ATTN_ISA");
    const int limit = tp_attn_isa_parse(env) >= 0 ? tp_attn_isa_parse(env) : TP_ATTN_ISA_AMX;
    const int prev = tp_attn_isa_limit(limit); /* the cases before this one restored theirs */
    CU_ASSERT_EQUAL(prev, limit);
    CU_ASSERT_EQUAL(tp_attn_isa_level(), best < limit ? best : limit);
    fprintf(stderr, "attn path by default: %s (TP_ATTN_ISA %s)\n", tp_attn_isa_name(tp_attn_isa_level()),
            env ? env : "unset");
    tp_attn_isa_limit(prev);
}

static const struct tp_test_case attn_cases[] = {
    {"isa_default", test_isa_default},
    {"tile_oracle", test_tile_oracle},
    {"tile_vs_ref", test_tile_vs_ref},
    {"rising_max", test_rising_max},
    {"q8_row", test_q8_row},
    {NULL, NULL},
};
TP_TEST_SUITE(attn, "unit", 120, attn_cases)
