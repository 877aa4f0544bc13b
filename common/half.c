/* common/half.c - IEEE fp16 and bfloat16 conversions (portable, bit exact). */
#include "common/common.h"

#include <string.h>

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float tp_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t tp_f32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below smallest normal fp16 (2^-14): subnormal or zero */
        float v = bits_f32(ax) * 16777216.0f; /* scale so that 1 ulp = 1 */
        /* round half to even */
        uint32_t r = (uint32_t)v;
        float frac = v - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t exp = ((ax >> 23) - 112u) << 10;
    uint32_t man = (ax >> 13) & 0x3ffu;
    uint32_t rest = ax & 0x1fffu;
    uint32_t h = exp | man;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float tp_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t tp_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}
