/*
 * parallel/act_compress.c - the per-layer all_sum hook with optional compression of
 * the activations that cross the network (--comm-dtype f32|f16|bf16|q8).
 *
 * f32 is exact up to summation order.  f16/bf16 halve the bytes; comm
 * reduces them in f32 and rounds once per ring step.  q8 quarters them
 * (blocks of 32 int8 values with one f32 scale, 36 bytes per 32 floats),
 * reduced by all_gather + local sum in rank order so every rank holds
 * identical bits afterwards.  All buffers are allocated at init.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_impl.h"

static size_t q8_blocks(size_t n) { return (n + TP_WIRE_Q8_BLOCK - 1) / TP_WIRE_Q8_BLOCK; }

enum tp_status tp_wire_init(struct tp_wire *w, tp_comm_t *comm, enum tp_wire_dtype dt, size_t max_count)
{
    memset(w, 0, sizeof *w);
    w->comm = comm;
    w->dtype = dt;
    w->world = comm ? tp_comm_size(comm) : 1;
    w->max_count = max_count;
    if (dt == TP_WIRE_F16 || dt == TP_WIRE_BF16) {
        w->half = tp_aligned_alloc(64, max_count * sizeof(uint16_t));
        if (!w->half) return TP_ERR_NOMEM;
    } else if (dt == TP_WIRE_Q8) {
        size_t bytes;
        if (tp_mul_size(q8_blocks(max_count) * TP_WIRE_Q8_BYTES, (size_t)w->world, &bytes)) return TP_ERR_NOMEM;
        w->q8 = tp_aligned_alloc(64, bytes);
        if (!w->q8) return TP_ERR_NOMEM;
    }
    return TP_OK;
}

void tp_wire_release(struct tp_wire *w)
{
    if (!w) return;
    tp_aligned_free(w->half);
    tp_aligned_free(w->q8);
    w->half = NULL;
    w->q8 = NULL;
}

void tp_wire_q8_pack(const float *src, size_t n, uint8_t *dst)
{
    for (size_t b = 0; b < q8_blocks(n); b++) {
        const float *x = src + b * TP_WIRE_Q8_BLOCK;
        size_t m = TP_MIN((size_t)TP_WIRE_Q8_BLOCK, n - b * TP_WIRE_Q8_BLOCK);
        uint8_t *o = dst + b * TP_WIRE_Q8_BYTES;
        float amax = 0.0f;
        for (size_t i = 0; i < m; i++) amax = fmaxf(amax, fabsf(x[i]));
        float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        memcpy(o, &scale, 4); /* little-endian hosts only (all supported ones) */
        int8_t *q = (int8_t *)(o + 4);
        for (size_t i = 0; i < TP_WIRE_Q8_BLOCK; i++) {
            float v = i < m ? x[i] * inv : 0.0f;
            long r = lrintf(v);
            q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
        }
    }
}

void tp_wire_q8_add(float *dst, const uint8_t *src, size_t n)
{
    for (size_t b = 0; b < q8_blocks(n); b++) {
        const uint8_t *o = src + b * TP_WIRE_Q8_BYTES;
        float scale;
        memcpy(&scale, o, 4);
        const int8_t *q = (const int8_t *)(o + 4);
        size_t m = TP_MIN((size_t)TP_WIRE_Q8_BLOCK, n - b * TP_WIRE_Q8_BLOCK);
        float *d = dst + b * TP_WIRE_Q8_BLOCK;
        for (size_t i = 0; i < m; i++) d[i] += scale * (float)q[i];
    }
}

enum tp_status tp_wire_all_sum(void *ctx, float *buf, size_t count)
{
    struct tp_wire *w = ctx;
    enum tp_status st = TP_OK;
    if (!w->comm || w->world <= 1) return TP_OK;
    uint64_t t0 = tp_now_ns();
    if (count > w->max_count) {
        tp_comm_abort(w->comm, "parallel: all_sum larger than the buffers sized at init (bug)");
        return TP_ERR_INTERNAL;
    }
    switch (w->dtype) {
    case TP_WIRE_F16:
    case TP_WIRE_BF16: {
        int f16 = w->dtype == TP_WIRE_F16;
        for (size_t i = 0; i < count; i++) w->half[i] = f16 ? tp_f32_to_fp16(buf[i]) : tp_f32_to_bf16(buf[i]);
        st = tp_comm_all_sum(w->comm, w->half, w->half, count, f16 ? TP_DTYPE_F16 : TP_DTYPE_BF16);
        if (st == TP_OK)
            for (size_t i = 0; i < count; i++) buf[i] = f16 ? tp_fp16_to_f32(w->half[i]) : tp_bf16_to_f32(w->half[i]);
        break;
    }
    case TP_WIRE_Q8: {
        size_t part = q8_blocks(count) * TP_WIRE_Q8_BYTES;
        int me = tp_comm_rank(w->comm);
        tp_wire_q8_pack(buf, count, w->q8 + (size_t)me * part);
        st = tp_comm_all_gather(w->comm, w->q8 + (size_t)me * part, w->q8, part, TP_DTYPE_U8);
        if (st == TP_OK) {
            memset(buf, 0, count * sizeof(float));
            for (int r = 0; r < w->world; r++) tp_wire_q8_add(buf, w->q8 + (size_t)r * part, count);
        }
        break;
    }
    default:
        st = tp_comm_all_sum(w->comm, buf, buf, count, TP_DTYPE_F32);
        break;
    }
    w->ns += tp_now_ns() - t0;
    return st;
}
