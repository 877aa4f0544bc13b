/*
 * model/kernels/kernels_x16_neon_kv_impl.h - private: the 8-lane vector interface of
 * kernels_x16_tmpl_impl.h for arm64 NEON (two q-registers per 8 rows), shared
 * by kernels_x16_neondot.c and kernels_x16_i8mm.c.  The includer defines
 * KV_ATTR (its target attribute, or nothing), KV_BT and KV_FILL first.
 */
#ifndef TP_MODEL_KERNELS_X16_NEON_KV_IMPL_H
#define TP_MODEL_KERNELS_X16_NEON_KV_IMPL_H

#include <arm_neon.h>
#include <string.h>

#include "kernels/kernels_impl.h"

#define KV_FN static inline __attribute__((always_inline)) KV_ATTR
#define KV_OUT static KV_ATTR

typedef struct {
    int32x4_t a, b;
} kvi;
typedef struct {
    float32x4_t a, b;
} kvf;

KV_FN kvi kv_ld(const char *p) { return (kvi){vld1q_s32((const int32_t *)(const void *)p), vld1q_s32((const int32_t *)(const void *)(p + 16))}; }
KV_FN kvi kv_and(kvi x, kvi y) { return (kvi){vandq_s32(x.a, y.a), vandq_s32(x.b, y.b)}; }
KV_FN kvi kv_b8(int c)
{
    const int32x4_t v = vreinterpretq_s32_s8(vdupq_n_s8((int8_t)c));
    return (kvi){v, v};
}
KV_FN kvi kv_b32(int32_t c) { return (kvi){vdupq_n_s32(c), vdupq_n_s32(c)}; }
KV_FN kvi kv_zero(void) { return kv_b32(0); }
#define KV_SH16(name, op, sign)                                                                        \
    KV_FN kvi name(kvi v, int n)                                                                       \
    {                                                                                                  \
        const int16x8_t s = vdupq_n_s16((int16_t)(sign * n));                                          \
        return (kvi){vreinterpretq_s32_##op(vshlq_##op(vreinterpretq_##op##_s32(v.a), s)),             \
                     vreinterpretq_s32_##op(vshlq_##op(vreinterpretq_##op##_s32(v.b), s))};            \
    }
KV_SH16(kv_srl16, u16, -1)
KV_SH16(kv_sll16, u16, 1)
KV_SH16(kv_sra16, s16, -1)
KV_FN kvi kv_srl32(kvi v, int n)
{
    const int32x4_t s = vdupq_n_s32(-n);
    return (kvi){vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(v.a), s)),
                 vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(v.b), s))};
}
KV_FN kvi kv_sll32(kvi v, int n) { return (kvi){vshlq_s32(v.a, vdupq_n_s32(n)), vshlq_s32(v.b, vdupq_n_s32(n))}; }
KV_FN kvi kv_sra32(kvi v, int n) { return (kvi){vshlq_s32(v.a, vdupq_n_s32(-n)), vshlq_s32(v.b, vdupq_n_s32(-n))}; }
KV_FN kvi kv_bsel(kvi b, kvi m, kvi c) { return (kvi){vbslq_s32(vreinterpretq_u32_s32(m.a), b.a, c.a), vbslq_s32(vreinterpretq_u32_s32(m.b), b.b, c.b)}; }
KV_FN int8x16_t kv_bc(const void *a)
{
    int32_t v;
    memcpy(&v, a, sizeof v);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}
KV_FN kvi kv_dpb(kvi acc, kvi w, const void *a)
{
    const int8x16_t x = kv_bc(a);
    return (kvi){vdotq_s32(acc.a, vreinterpretq_s8_s32(w.a), x), vdotq_s32(acc.b, vreinterpretq_s8_s32(w.b), x)};
}
KV_FN kvi kv_dpbs(kvi acc, kvi w, const void *a) { return kv_dpb(acc, w, a); }
KV_FN int32x4_t kv_dpwd1(int32x4_t acc, int32x4_t w, int16x8_t p)
{
    const int16x8_t w16 = vreinterpretq_s16_s32(w);
    return vaddq_s32(acc, vpaddq_s32(vmull_s16(vget_low_s16(w16), vget_low_s16(p)), vmull_high_s16(w16, p)));
}
KV_FN kvi kv_dpwd(kvi acc, kvi w, const int16_t *p)
{
    const int16x8_t pv = vreinterpretq_s16_s8(kv_bc(p));
    return (kvi){kv_dpwd1(acc.a, w.a, pv), kv_dpwd1(acc.b, w.b, pv)};
}
KV_FN kvi kv_lut(kvi v)
{
    static const uint8_t k_table_u[16] = {16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4};
    const uint8x16_t t = vld1q_u8(k_table_u);
    return (kvi){vreinterpretq_s32_u8(vqtbl1q_u8(t, vreinterpretq_u8_s32(v.a))),
                 vreinterpretq_s32_u8(vqtbl1q_u8(t, vreinterpretq_u8_s32(v.b)))};
}
KV_FN float32x4_t kv_e8m0_4(uint32x4_t e) /* e >= 2: (e - 1) << 23; e < 2: the subnormal 0x00200000 << e */
{
    const uint32x4_t big = vshlq_n_u32(vsubq_u32(e, vdupq_n_u32(1)), 23);
    const uint32x4_t small = vshlq_u32(vdupq_n_u32(0x00200000), vreinterpretq_s32_u32(e));
    return vreinterpretq_f32_u32(vbslq_u32(vcgtq_u32(e, vdupq_n_u32(1)), big, small));
}
KV_FN kvf kv_e8m0(const char *p)
{
    uint8_t b[8];
    memcpy(b, p, sizeof b);
    const uint16x8_t e = vmovl_u8(vld1_u8(b));
    return (kvf){kv_e8m0_4(vmovl_u16(vget_low_u16(e))), kv_e8m0_4(vmovl_high_u16(e))};
}
KV_FN kvf kv_cvt(kvi v) { return (kvf){vcvtq_f32_s32(v.a), vcvtq_f32_s32(v.b)}; }
KV_FN kvf kv_h2f(const char *p)
{
    uint16_t h[8];
    memcpy(h, p, sizeof h);
    const float16x8_t f = vreinterpretq_f16_u16(vld1q_u16(h));
    return (kvf){vcvt_f32_f16(vget_low_f16(f)), vcvt_high_f32_f16(f)};
}
KV_FN kvf kv_setf(float f) { return (kvf){vdupq_n_f32(f), vdupq_n_f32(f)}; }
KV_FN kvf kv_fzero(void) { return kv_setf(0.0f); }
KV_FN kvf kv_mul(kvf x, kvf y) { return (kvf){vmulq_f32(x.a, y.a), vmulq_f32(x.b, y.b)}; }
KV_FN kvf kv_fma(kvf x, kvf y, kvf c) { return (kvf){vfmaq_f32(c.a, x.a, y.a), vfmaq_f32(c.b, x.b, y.b)}; }
KV_FN kvf kv_fnma(kvf x, kvf y, kvf c) { return (kvf){vfmsq_f32(c.a, x.a, y.a), vfmsq_f32(c.b, x.b, y.b)}; }
KV_FN void kv_stf(float *o, kvf v)
{
    vst1q_f32(o, v.a);
    vst1q_f32(o + 4, v.b);
}

#endif /* TP_MODEL_KERNELS_X16_NEON_KV_IMPL_H */
