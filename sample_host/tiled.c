/*
 * tiled.c — sample_host's TiledMLP callbacks (sh_tiled.h).
 */
#include "sh_tiled.h"

#include <stdio.h>
#include <string.h>

void sh_tiled_query(sh_tiled *t) {
    t->on = 0;
    if (!t->tbl || !PT_HAS_HOOK(t->tbl, get_stats) || !PT_HAS_HOOK(t->tbl, tiled_mlp_forward) ||
        !PT_HAS_HOOK(t->tbl, tiled_mlp_backward) || !PT_HAS_HOOK(t->tbl, tiled_mlp_scratch))
        return;
    pt_stats_v1 st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    if (t->tbl->get_stats(t->ctx, &st) != 0) return;
    if (st.struct_size >= offsetof(pt_stats_v1, mlp_tiles) + sizeof st.mlp_tiles)
        t->on = st.mlp_tiles > 0;
}

static int32_t run(sh_tiled *t, int l, int backward, int B, int T) {
    t->active = 1;
    t->l = l;
    t->B = B;
    t->T = T;
    t->backward = backward;
    int64_t tokens = (int64_t)B * T;
    int32_t st = backward ? t->tbl->tiled_mlp_backward(t->ctx, l, tokens)
                          : t->tbl->tiled_mlp_forward(t->ctx, l, tokens);
    t->active = 0;
    return st;
}

int32_t sh_tiled_fwd(sh_tiled *t, int l, float *a, float *out, int B, int T) {
    t->a = a;
    t->out = out;
    return run(t, l, 0, B, T);
}

int32_t sh_tiled_bwd(sh_tiled *t, int l, float *a, float *dres, float *dsmall, int B, int T) {
    t->a = a;
    t->dres = dres;
    t->dsmall = dsmall;
    return run(t, l, 1, B, T);
}

int32_t sh_tiled_cb(sh_tiled *t, int32_t b, int64_t begin, int64_t count, int backward) {
    const char *cb = backward ? "mlp_backward" : "mlp_forward";
    int64_t N = (int64_t)t->B * t->T;
    if (!t->active || b != t->l || begin < 0 || count < 1 || begin + count > N ||
        (backward && !t->backward)) {
        snprintf(t->err, t->errlen, "%s(%d, %lld, %lld) called outside block %d's tiled MLP or "
                                    "with tokens outside [0, %lld)",
                 cb, (int)b, (long long)begin, (long long)count,
                 t->l, (long long)N);
        return PT_ERR_ORDER;
    }
    size_t C = (size_t)t->m->d.C, n = (size_t)count, F = n * 4 * C;
    /* forward pass: fch, fch_gelu; a backward's tile: also dbig, and the same
     * size for its recompute and its backward, so both see the same bytes */
    size_t floats = t->backward ? 3 * F : 2 * F;
    void *p = NULL;
    int32_t st = t->tbl->tiled_mlp_scratch(t->ctx, floats * sizeof(float), &p);
    if (st != 0 || !p) {
        snprintf(t->err, t->errlen, "%s(%d): tiled_mlp_scratch failed with status %d", cb,
                 (int)b, (int)st);
        return st ? st : PT_ERR_INTERNAL;
    }
    sh_arena_layout lay;
    sh_model_arena_layout_make_t(&lay, &t->m->d, t->B, t->T, 1);
    size_t r0 = (size_t)begin * C;
    float *scr = p;
    sh_op op;
    memset(&op, 0, sizeof op);
    op.kind = backward ? SH_OP_MLP_BWD : SH_OP_MLP_FWD;
    op.l = b;
    op.mlp.n = (int)count;
    op.mlp.inp = t->a + lay.ln2 + r0;
    op.mlp.res = t->a + lay.res2 + r0;
    op.mlp.out = t->backward ? NULL : t->out + r0; /* recompute: no output */
    op.mlp.fch = scr;
    op.mlp.fch_gelu = scr + F;
    if (t->backward) {
        op.mlp.dbig = scr + 2 * F;
        op.mlp.dout = t->dres + r0;
        op.mlp.dinp = t->dsmall + r0;
        op.mlp.wtmp = NULL; /* straight into the plugin's fp32 accumulator, beta = 1 */
    }
    st = sh_work_run(t->lw, t->m, &op);
    if (st != 0) {
        snprintf(t->err, t->errlen, "%s(%d): launch failed with status %d", cb, (int)b, (int)st);
        return st;
    }
    return 0;
}
