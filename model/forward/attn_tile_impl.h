/*
 * model/forward/attn_tile_impl.h - private: the body of the tiled attention
 * kernel, included by attn.c once per instruction set.  Before including,
 * attn.c defines
 *   AT_FN       function attributes (static, target)
 *   AT_NAME(x)  the instruction set's name for x
 * and the helpers AT_NAME(load_row) (a row-major cache row as floats), AT_NAME(dots), AT_NAME(exp_sum),
 * AT_NAME(pv), AT_NAME(scal) (see attn.c for their contracts).
 */

/* Position p's key (is_v 0) or value (is_v 1) as hd floats: the vector load_row for the row-major types, the
 * generic tp_kv_load_at for bf16 tiles (the bf16 paths read those as they are) */
AT_FN void AT_NAME(load_pos)(const struct tp_attn_geom *g, const uint8_t *c, int is_v, int p, float *dst)
{
    if (g->type == TP_KV_BF16)
        tp_kv_load_at(g->type, c, is_v, p % g->cap, dst, g->hd);
    else
        AT_NAME(load_row)(g->type, c + (size_t)(p % g->cap) * g->row_bytes, dst, g->hd);
}

/* The tile loop: see tp_attn_tile in model_impl.h. */
AT_FN void AT_NAME(tile)(const struct tp_attn_geom *g, const struct tp_attn_rows *r, const uint8_t *kc,
                         const uint8_t *vc, int k0, int k1, float *scratch, float *o, size_t o_stride, float *part)
{
    const int hd = g->hd, nt = r->nt, ng = r->ng, R = nt * ng, KB = TP_ATTN_KB;
    float *Qs = scratch, *O = Qs + (size_t)R * hd, *M = O + (size_t)R * hd, *L = M + R;
    float *Kt = L + R, *Vt = Kt + (size_t)KB * hd, *S = Vt + (size_t)KB * hd;
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < ng; h++) {
            const int row = i * ng + h;
            const float *q = r->q + (size_t)i * r->q_stride + (size_t)h * hd;
            for (int c = 0; c < hd; c++) Qs[(size_t)row * hd + c] = q[c] * g->scale;
            for (int c = 0; c < hd; c++) O[(size_t)row * hd + c] = 0.0f;
            M[row] = -INFINITY;
            L[row] = 0.0f;
        }
    /* keys any row can see: from the first row's window start to the last row's position */
    int lo0 = tp_attn_first_key(g, r->pos0);
    const int kmin = TP_MAX(k0, lo0), kmax = TP_MIN(k1, r->pos0 + nt);
    const int pfl2 = tp_kern_prefetch() == TP_KERN_PF_L2;
    for (int j0 = kmin; j0 < kmax; j0 += KB) {
        const int jn = TP_MIN(KB, kmax - j0);
        struct tp_attn_pf pf; /* the next tile's rows, requested over the rows' arithmetic */
        tp_attn_pf_init(&pf, kc, vc, j0 + KB, TP_MIN(j0 + 2 * KB, kmax), g->cap, g->row_bytes, pfl2);
        const int pfq = (int)((tp_attn_pf_lines(&pf) + (size_t)R - 1) / (size_t)R);
        for (int j = 0; j < jn; j++)
            AT_NAME(load_pos)(g, kc, 0, j0 + j, Kt + (size_t)j * hd);
        int v_loaded = 0;
        for (int i = 0; i < nt; i++) {
            const int p = r->pos0 + i;
            const int lo = tp_attn_first_key(g, p);
            const int a = TP_MAX(j0, lo) - j0, b = TP_MIN(j0 + jn, p + 1) - j0;
            if (a >= b) continue; /* this tile is outside row i's window (causal or sliding) */
            if (!v_loaded) {
                for (int j = 0; j < jn; j++) AT_NAME(load_pos)(g, vc, 1, j0 + j, Vt + (size_t)j * hd);
                v_loaded = 1;
            }
            for (int h = 0; h < ng; h++) {
                const int row = i * ng + h;
                const float *qs = Qs + (size_t)row * hd;
                tp_attn_pf_step(&pf, pfq);
                float *s = S + (size_t)row * KB;
                float mx = M[row];
                AT_NAME(dots)(qs, Kt + (size_t)a * hd, b - a, hd, s + a);
                for (int j = a; j < b; j++) mx = s[j] > mx ? s[j] : mx;
                const float corr = M[row] == -INFINITY ? 0.0f : expf(M[row] - mx);
                const float sum = AT_NAME(exp_sum)(s + a, b - a, mx);
                L[row] = L[row] * corr + sum;
                M[row] = mx;
                float *orow = O + (size_t)row * hd;
                if (corr != 1.0f) AT_NAME(scal)(orow, corr, hd);
                AT_NAME(pv)(orow, s + a, Vt + (size_t)a * hd, b - a, hd);
            }
        }
        tp_attn_pf_step(&pf, 1 << 30);
    }
    tp_attn_finish(r, hd, M, L, O, o, o_stride, part);
}
