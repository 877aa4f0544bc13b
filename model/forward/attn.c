/*
 * model/forward/attn.c - attention over the KV cache, flash-attention style:
 * a work item is a block of query rows (consecutive positions of one
 * sequence times the query heads sharing one KV head) and a range of key
 * positions; keys and values are read TP_ATTN_KB positions at a time into
 * float tiles (converted once from the cache's f32 / fp16 / q8_0 rows and
 * shared by every row of the item), each row keeps a running max, sum and
 * weighted-value vector (online softmax), and tiles outside a row's causal or
 * sliding window are skipped.  An item over part of the keys leaves its
 * unnormalised partial for tp_attn_merge, which is how forward.c splits one
 * long sequence over every thread.  Attention sinks add e^(sink - max) to a
 * row's denominator.  The loop body (attn_tile_impl.h) is compiled for plain C,
 * AVX2 and AVX-512 over each one's helpers (the vector ones in
 * simd_x86_impl.h), float32 throughout; on CPUs with AVX512_BF16 the same loop
 * runs on bf16 vector products (attn_bf16.c), and with AMX-BF16 on bf16 tile
 * products (attn_amx.c).  Also the cache rows (tp_kv_store / tp_kv_load) and the
 * per-position reference.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "forward/model_impl.h"
#include "model/kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TP_ATTN_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* ------------------------------------------------------------ cache rows */

/* q8_0 rows: blocks of B int8 values after their fp16 scale, B = 32 when head_dim allows, else 16 or 8 */
static int q8_block(int hd) { return hd % 32 == 0 ? 32 : hd % 16 == 0 ? 16 : hd % 8 == 0 ? 8 : 0; }

const char *tp_kv_type_name(enum tp_kv_type t)
{
    switch (t) {
    case TP_KV_F32: return "f32";
    case TP_KV_F16: return "f16";
    case TP_KV_Q8_0: return "q8_0";
    case TP_KV_BF16: return "bf16";
    case TP_KV_AUTO: return "auto";
    default: return "?";
    }
}

enum tp_status tp_kv_type_parse(const char *s, enum tp_kv_type *out)
{
    for (int t = TP_KV_AUTO; s && t < TP_KV_TYPE_COUNT; t++)
        if (strcmp(s, tp_kv_type_name((enum tp_kv_type)t)) == 0) {
            *out = (enum tp_kv_type)t;
            return TP_OK;
        }
    return TP_ERR_INVALID_ARG;
}

size_t tp_kv_row_bytes(enum tp_kv_type t, int hd)
{
    if (hd <= 0) return 0;
    switch (t) {
    case TP_KV_F32: return (size_t)hd * 4;
    case TP_KV_F16: return (size_t)hd * 2;
    case TP_KV_Q8_0: return q8_block(hd) ? (size_t)hd / (size_t)q8_block(hd) * (size_t)(q8_block(hd) + 2) : 0;
    case TP_KV_BF16: return hd % 16 == 0 ? (size_t)hd * 2 : 0;
    case TP_KV_AUTO: return (size_t)hd * 2; /* bf16 or f16 */
    default: return 0;
    }
}

int64_t tp_kv_cap_rows(enum tp_kv_type t, int64_t positions)
{
    return t == TP_KV_BF16 || t == TP_KV_AUTO ? (positions + TP_KV_TILE - 1) / TP_KV_TILE * TP_KV_TILE : positions;
}

enum tp_kv_type tp_kv_type_resolve(enum tp_kv_type t, int hd)
{
    if (t != TP_KV_AUTO) return t;
    return tp_attn_isa_level() == TP_ATTN_ISA_AVX512BF16 && hd > 0 && hd % 32 == 0 ? TP_KV_BF16 : TP_KV_F16;
}

int tp_kv_layer_window(const struct tp_hparams *hp, int l)
{
    if (!hp || hp->sliding_window <= 0 || l < 0 || l >= hp->n_layer) return 0;
    return hp->swa_period <= 0 || l % hp->swa_period < hp->swa_period - 1 ? hp->sliding_window : 0;
}

int64_t tp_kv_layer_positions(const struct tp_hparams *hp, int l, int n_ctx, int n_batch)
{
    const int64_t w = tp_kv_layer_window(hp, l), ring = w + (int64_t)n_batch;
    return w > 0 && ring < n_ctx ? ring : (int64_t)n_ctx;
}

uint64_t tp_kv_head_bytes(const struct tp_hparams *hp, int n_ctx, int n_batch, enum tp_kv_type t)
{
    uint64_t pos = 0;
    for (int l = 0; hp && l < hp->n_layer; l++)
        pos += (uint64_t)tp_kv_cap_rows(t, tp_kv_layer_positions(hp, l, n_ctx, n_batch));
    return 2ull * pos * (uint64_t)tp_kv_row_bytes(t, hp ? hp->head_dim : 0);
}

void tp_kv_store(enum tp_kv_type t, uint8_t *dst, const float *x, int hd)
{
    if (t == TP_KV_F32) {
        memcpy(dst, x, sizeof(float) * (size_t)hd);
    } else if (t == TP_KV_F16) {
        tp_op_to_f16((uint16_t *)(void *)dst, x, hd);
    } else { /* q8_0: d = amax / 127 rounded to fp16, q = round(x / d) within +-127 */
        const int B = q8_block(hd);
        for (int b = 0; b < hd / B; b++) {
            const float *xb = x + b * B;
            uint8_t *blk = dst + (size_t)b * (size_t)(B + 2);
            float amax = 0.0f;
            for (int i = 0; i < B; i++) amax = fmaxf(amax, fabsf(xb[i]));
            const uint16_t dh = tp_f32_to_fp16(amax / 127.0f);
            const float d = tp_fp16_to_f32(dh), id = d > 0.0f ? 1.0f / d : 0.0f;
            memcpy(blk, &dh, 2);
            for (int i = 0; i < B; i++) {
                const long q = lrintf(xb[i] * id);
                blk[2 + i] = (uint8_t)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
            }
        }
    }
}

void tp_kv_load(enum tp_kv_type t, const uint8_t *src, float *dst, int hd)
{
    if (t == TP_KV_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)hd);
    } else if (t == TP_KV_F16) {
        const uint16_t *h = (const uint16_t *)(const void *)src;
        for (int i = 0; i < hd; i++) dst[i] = tp_fp16_to_f32(h[i]);
    } else {
        const int B = q8_block(hd);
        for (int b = 0; b < hd / B; b++) {
            const uint8_t *blk = src + (size_t)b * (size_t)(B + 2);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            const float d = tp_fp16_to_f32(dh);
            for (int i = 0; i < B; i++) dst[b * B + i] = d * (float)(int8_t)blk[2 + i];
        }
    }
}

/* float -> bf16, rounded to nearest even (NaN kept a quiet NaN), as VCVTNE2PS2BF16 does */
static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void tp_kv_store_at(enum tp_kv_type t, uint8_t *rows, int is_v, int64_t row, const float *x, int hd)
{
    if (t != TP_KV_BF16) {
        tp_kv_store(t, rows + (size_t)row * tp_kv_row_bytes(t, hd), x, hd);
        return;
    }
    uint16_t *b = (uint16_t *)(void *)rows;
    for (int i = 0; i < hd; i++) b[tp_kv_bf16_index(is_v, row, i, hd)] = to_bf16(x[i]);
}

void tp_kv_load_at(enum tp_kv_type t, const uint8_t *rows, int is_v, int64_t row, float *dst, int hd)
{
    if (t != TP_KV_BF16) {
        tp_kv_load(t, rows + (size_t)row * tp_kv_row_bytes(t, hd), dst, hd);
        return;
    }
    const uint16_t *b = (const uint16_t *)(const void *)rows;
    for (int i = 0; i < hd; i++) {
        const uint32_t u = (uint32_t)b[tp_kv_bf16_index(is_v, row, i, hd)] << 16;
        memcpy(dst + i, &u, 4);
    }
}

size_t tp_attn_scratch_floats(int hd, int rows)
{
    /* Qs, O (rows x hd), M, L (rows), K and V tiles (KB x hd), scores (rows x KB); or what the AMX or
     * AVX512_BF16 path needs */
    const size_t n = (size_t)rows * hd * 2 + (size_t)rows * 2 + (size_t)TP_ATTN_KB * hd * 2 + (size_t)rows * TP_ATTN_KB;
    const size_t n_amx = hd % 32 == 0 ? tp_attn_amx_scratch_floats(hd, rows) : 0;
    const size_t n_bf16 = hd % 32 == 0 ? tp_attn_bf16_scratch_floats(hd, rows) : 0;
    const size_t n_bf = n_amx > n_bf16 ? n_amx : n_bf16;
    return n > n_bf ? n : n_bf;
}

/* ------------------------------------------------------- plain C helpers */

static inline void ref_load_row(enum tp_kv_type t, const uint8_t *src, float *dst, int hd) { tp_kv_load(t, src, dst, hd); }

/* s[j] = q . k_j for the n rows k (hd floats each) */
static inline void ref_dots(const float *q, const float *k, int n, int hd, float *s)
{
    for (int j = 0; j < n; j++) s[j] = tp_op_dot_ref(q, k + (size_t)j * hd, hd);
}

/* x[i] = e^(x[i] - mx), returns the sum */
static inline float ref_exp_sum(float *x, int n, float mx)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += x[i] = expf(x[i] - mx);
    return s;
}

static inline void ref_scal(float *o, float c, int hd)
{
    for (int i = 0; i < hd; i++) o[i] *= c;
}

/* o[hd] += sum_j p[j] v[j * hd ..] for j < n */
static inline void ref_pv(float *o, const float *p, const float *v, int n, int hd)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < hd; i++) o[i] += p[j] * v[(size_t)j * hd + i];
}

#define AT_FN static
#define AT_NAME(x) ref_##x
#include "forward/attn_tile_impl.h"
#undef AT_FN
#undef AT_NAME

/* ------------------------------------------ AVX2 and AVX-512 (simd_x86_impl.h) */

#if defined(TP_ATTN_X86)
#define SX_ATTN 1
#define AT_FN __attribute__((target(SX_TARGET))) static
#define AT_NAME(x) SX_NAME(x)

#define SX_W 8
#define SX_NAME(x) avx_##x
#define SX_TARGET "avx2,fma,f16c"
#include "forward/simd_x86_impl.h"
#include "forward/attn_tile_impl.h"
#undef SX_W
#undef SX_NAME
#undef SX_TARGET

#define SX_W 16
#define SX_NAME(x) z_##x
#define SX_TARGET "avx512f,avx2,fma,f16c"
#include "forward/simd_x86_impl.h"
#include "forward/attn_tile_impl.h"
#undef SX_W
#undef SX_NAME
#undef SX_TARGET

#undef AT_FN
#undef AT_NAME
#undef SX_ATTN
#endif

/* -------------------------------------------------------------- dispatch */

static int attn_has_avx2, attn_has_avx512, attn_has_bf16, attn_has_amx;
/* tp_attn_isa_limit, TP_ATTN_ISA: the best path the CPU has unless capped (the bf16 paths move results by
 * ~1e-5 NMSE: float64-reference tests cap it at avx512) */
static int attn_level_max = TP_ATTN_ISA_AMX;

static const char *const attn_isa_names[TP_ATTN_ISA_COUNT] = {"c", "avx2", "avx512", "avx512bf16", "amx"};

static void attn_choose(void)
{
#if defined(TP_ATTN_X86)
    __builtin_cpu_init();
    unsigned a = 0, b = 0, c = 0, d = 0;
    attn_has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
                    (c & (1u << 29)); /* F16C */
    attn_has_avx512 = attn_has_avx2 && __builtin_cpu_supports("avx512f");
    attn_has_bf16 = attn_has_avx512 && tp_attn_bf16_detect();
    attn_has_amx = attn_has_avx512 && tp_attn_amx_detect();
#endif
    const char *want = getenv("TP_ATTN_ISA"); /* the best attention path allowed */
    const int level = tp_attn_isa_parse(want);
    if (level >= 0)
        attn_level_max = level;
    else
        tp_log(TP_LOG_WARN, "attn", "TP_ATTN_ISA=%s is not one of c, avx2, avx512, avx512bf16, amx; ignored", want);
}

int tp_attn_isa_parse(const char *want)
{
    if (!want || !*want) return TP_ATTN_ISA_AMX;
    for (int i = 0; i < TP_ATTN_ISA_COUNT; i++)
        if (strcmp(want, attn_isa_names[i]) == 0) return i;
    return -1;
}

static pthread_once_t attn_once = PTHREAD_ONCE_INIT;

const char *tp_attn_isa_name(int level)
{
    return level >= 0 && level < TP_ATTN_ISA_COUNT ? attn_isa_names[level] : "?";
}

const char *tp_kern_attn_isa(void) { return tp_attn_isa_name(tp_attn_isa_level()); }

int tp_attn_isa_limit(int level)
{
    pthread_once(&attn_once, attn_choose);
    const int prev = attn_level_max;
    attn_level_max = level;
    return prev;
}

int tp_attn_isa_level(void)
{
    pthread_once(&attn_once, attn_choose);
    const int have = attn_has_amx ? TP_ATTN_ISA_AMX : attn_has_bf16 ? TP_ATTN_ISA_AVX512BF16
                     : attn_has_avx512 ? TP_ATTN_ISA_AVX512 : attn_has_avx2 ? TP_ATTN_ISA_AVX2 : TP_ATTN_ISA_C;
    return have < attn_level_max ? have : attn_level_max;
}

void tp_attn_tile(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc, const uint8_t *vc,
                  int k0, int k1, float *scratch, float *o, size_t o_stride, float *part)
{
    pthread_once(&attn_once, attn_choose);
#if defined(TP_ATTN_X86)
    const int level = tp_attn_isa_level();
    /* a bf16 cache is read as stored by the AVX512_BF16 vector products (AMX CPUs have them too) */
    if (level >= TP_ATTN_ISA_AMX && g->hd % 32 == 0 && g->type != TP_KV_BF16) {
        tp_attn_amx_tile(g, r, kc, vc, k0, k1, scratch, o, o_stride, part);
        return;
    }
    if (level >= TP_ATTN_ISA_AVX512BF16 && attn_has_bf16 && g->hd % 32 == 0) {
        tp_attn_bf16_tile(g, r, kc, vc, k0, k1, scratch, o, o_stride, part);
        return;
    }
    if (level >= TP_ATTN_ISA_AVX512 && g->hd % 16 == 0) {
        z_tile(g, r, kc, vc, k0, k1, scratch, o, o_stride, part);
        return;
    }
    if (level >= TP_ATTN_ISA_AVX2 && g->hd % 8 == 0) {
        avx_tile(g, r, kc, vc, k0, k1, scratch, o, o_stride, part);
        return;
    }
#endif
    ref_tile(g, r, kc, vc, k0, k1, scratch, o, o_stride, part);
}

void tp_attn_finish(const struct tp_attn_rows *r, int hd, const float *M, const float *L, const float *O, float *o,
                    size_t o_stride, float *part)
{
    const int nt = r->nt, ng = r->ng;
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < ng; h++) {
            const int row = i * ng + h;
            const float *orow = O + (size_t)row * hd;
            if (part) {
                float *pr = part + (size_t)row * (hd + 2);
                pr[0] = M[row];
                pr[1] = L[row];
                memcpy(pr + 2, orow, sizeof(float) * (size_t)hd);
                continue;
            }
            float den = L[row];
            if (r->sinks && M[row] > -INFINITY) den += expf(r->sinks[h] - M[row]);
            const float inv = den > 0.0f ? 1.0f / den : 0.0f;
            float *dst = o + (size_t)i * o_stride + (size_t)h * hd;
            for (int c = 0; c < hd; c++) dst[c] = orow[c] * inv;
        }
}

void tp_attn_merge(const float *parts, int n, size_t stride, int hd, const struct tp_attn_rows *r, float *o,
                   size_t o_stride)
{
    for (int i = 0; i < r->nt; i++)
        for (int h = 0; h < r->ng; h++) {
            const size_t row = (size_t)(i * r->ng + h) * ((size_t)hd + 2);
            float mx = -INFINITY;
            for (int k = 0; k < n; k++) mx = fmaxf(mx, parts[k * stride + row]);
            float *dst = o + (size_t)i * o_stride + (size_t)h * hd;
            for (int c = 0; c < hd; c++) dst[c] = 0.0f;
            if (mx == -INFINITY) continue;
            float den = 0.0f;
            for (int k = 0; k < n; k++) {
                const float *pr = parts + k * stride + row;
                if (pr[0] == -INFINITY) continue;
                const float w = expf(pr[0] - mx);
                den += w * pr[1];
                for (int c = 0; c < hd; c++) dst[c] += w * pr[2 + c];
            }
            if (r->sinks) den += expf(r->sinks[h] - mx);
            const float inv = den > 0.0f ? 1.0f / den : 0.0f;
            for (int c = 0; c < hd; c++) dst[c] *= inv;
        }
}

/* ------------------------------------------------- per-position reference */

void tp_op_attn_head_ref(const float *q, const void *kc, const void *vc, size_t kvs, int f16, int n, int hd,
                         float scale, float *sc, float *o)
{
    for (int i = 0; i < hd; i++) o[i] = 0.0f;
    if (f16) {
        const uint16_t *k = kc, *v = vc;
        for (int j = 0; j < n; j++) sc[j] = tp_op_dot_f16(q, k + (size_t)j * kvs, hd) * scale;
        tp_op_softmax(sc, n);
        for (int j = 0; j < n; j++) tp_op_axpy_f16(o, sc[j], v + (size_t)j * kvs, hd);
    } else {
        const float *k = kc, *v = vc;
        for (int j = 0; j < n; j++) sc[j] = tp_op_dot(q, k + (size_t)j * kvs, hd) * scale;
        tp_op_softmax(sc, n);
        for (int j = 0; j < n; j++) tp_op_axpy(o, sc[j], v + (size_t)j * kvs, hd);
    }
}
