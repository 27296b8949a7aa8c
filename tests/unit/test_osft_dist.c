/*
 * test_osft_dist.c — the plugin's own sharded OSFT projection
 * (pt_osft_split_path, what mode C runs for a factor in a chunk split across
 * the ranks): each rank holds an element range of every factor, cut at no row
 * boundary as a chunk's byte range is; an in-process collective hands every
 * rank the others' parts as they were before any rank projected (what the
 * all-gather gives); each rank keeps its own part of the result. The ranks'
 * parts put together must equal the double-precision projection of both
 * paths, on 2 and 3 ranks, gathered each step and with the frozen factor kept
 * whole ([osft] cache_frozen).
 */
#include <lapacke.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "osft/osft_internal.h"

/* ---- the plugin's sharded projection, on an in-process collective ---- */

enum { SN = 7, SM = 11, SK = 5, SKL = 3, SR = SK + SKL, MAXW = 3 };

/* One factor split across W ranks: the values before any rank projected
 * (what every rank's all-gather returns) and each rank's element range. */
typedef struct shard_fac {
    float pre[SN * SM];
    size_t n, lo[MAXW], len[MAXW];
} shard_fac;

typedef struct fake_coll {
    shard_fac fac[PT_OSFT_NF];
    int w, gathers;
} fake_coll;

/* The all-gather: this rank's part from its own buffer (as the plugin's gather
 * copies it), every other rank's from the values they held before the call. */
static int fake_gather(void *user, int32_t index, float *dst, const pt_store_part *own,
                       char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    fake_coll *fc = user;
    const shard_fac *f = &fc->fac[index];
    for (int r = 0; r < fc->w; r++)
        if (f->lo[r] != own->lo) memcpy(dst + f->lo[r], f->pre + f->lo[r], f->len[r] * 4);
    if (own->len) memcpy(dst + own->lo, own->p, own->len * 4);
    fc->gathers++;
    return 0;
}

/* Element ranges cut at no row boundary: rank r gets [n r / W + 1, n (r+1) / W + 1),
 * the first from 0 and the last to n. */
static void cut(shard_fac *f, size_t n, int w) {
    f->n = n;
    for (int r = 0; r < w; r++) {
        size_t a = r ? n * (size_t)r / (size_t)w + 1 : 0;
        size_t b = r + 1 < w ? n * (size_t)(r + 1) / (size_t)w + 1 : n;
        f->lo[r] = a;
        f->len[r] = b - a;
    }
}

/* U_low -= U_high (U_high^T U_low), V_low -= (V_low V_high^T) V_high, in double. */
static void project_ref(const float *uh, const float *ul, const float *vh, const float *vl,
                        double *ulx, double *vlx) {
    for (int i = 0; i < SN * SKL; i++) ulx[i] = ul[i];
    for (int i = 0; i < SKL * SM; i++) vlx[i] = vl[i];
    for (int j = 0; j < SKL; j++)
        for (int i = 0; i < SK; i++) {
            double cu = 0, cv = 0;
            for (int n = 0; n < SN; n++) cu += (double)uh[n * SK + i] * ul[n * SKL + j];
            for (int m = 0; m < SM; m++) cv += (double)vl[j * SM + m] * vh[i * SM + m];
            for (int n = 0; n < SN; n++) ulx[n * SKL + j] -= cu * uh[n * SK + i];
            for (int m = 0; m < SM; m++) vlx[j * SM + m] -= cv * vh[i * SM + m];
        }
}

static void test_plugin_sharded_projection(void **s) {
    (void)s;
    /* orthonormal U_high columns and V_high rows from an SVD of a full-rank N x M */
    double a[SN * SM], sv[SN], u[SN * SN], vt[SN * SM];
    for (int i = 0; i < SN * SM; i++) a[i] = sin(0.7 * i + 0.3) + 0.1 * cos(1.3 * i);
    assert_int_equal(LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', SN, SM, a, SM, sv, u, SN, vt, SM), 0);
    float uh[SN * SK], vh[SK * SM], ul[SN * SKL], vl[SKL * SM];
    for (int n = 0; n < SN; n++)
        for (int i = 0; i < SK; i++) uh[n * SK + i] = (float)u[n * SN + i];
    for (int i = 0; i < SK * SM; i++) vh[i] = (float)vt[i];
    /* trainable factors as an optimizer step leaves them: not orthogonal to the frozen */
    for (int i = 0; i < SN * SKL; i++) ul[i] = (float)(sin(0.37 * i) + 0.25);
    for (int i = 0; i < SKL * SM; i++) vl[i] = (float)(cos(0.41 * i) - 0.2);
    double ulx[SN * SKL], vlx[SKL * SM];
    project_ref(uh, ul, vh, vl, ulx, vlx);
    tgt t = {.hidx = 0, .block = 0, .N = SN, .M = SM, .R = SR, .k = SK, .kl = SKL};
    for (int f = 0; f < PT_OSFT_NF; f++) t.x[f] = f;
    const float *init[PT_OSFT_NF] = {[PT_OSFT_UH] = uh, [PT_OSFT_VH] = vh,
                                     [PT_OSFT_UL] = ul, [PT_OSFT_VL] = vl};
    const size_t nel[PT_OSFT_NF] = {[PT_OSFT_UH] = SN * SK, [PT_OSFT_VH] = SK * SM,
                                    [PT_OSFT_UL] = SN * SKL, [PT_OSFT_VL] = SKL * SM};
    for (int w = 2; w <= MAXW; w++)
        for (int cached = 0; cached <= 1; cached++) {
            fake_coll fc;
            memset(&fc, 0, sizeof fc);
            fc.w = w;
            float own[MAXW][PT_OSFT_NF][SN * SM];
            for (int f = 0; f < PT_OSFT_NF; f++) {
                if (!nel[f]) continue;
                cut(&fc.fac[f], nel[f], w);
                memcpy(fc.fac[f].pre, init[f], nel[f] * 4);
                for (int r = 0; r < w; r++)
                    memcpy(own[r][f], init[f] + fc.fac[f].lo[r], fc.fac[f].len[r] * 4);
            }
            for (int r = 0; r < w; r++)
                for (int v = 0; v < 2; v++) {
                    int fz = v ? PT_OSFT_VH : PT_OSFT_UH, tr = v ? PT_OSFT_VL : PT_OSFT_UL;
                    pt_store_part pf = {.p = own[r][fz], .split = 1, .lo = fc.fac[fz].lo[r],
                                        .len = fc.fac[fz].len[r]};
                    pt_store_part pq = {.p = own[r][tr], .split = 1, .lo = fc.fac[tr].lo[r],
                                        .len = fc.fac[tr].len[r]};
                    float fbuf[SN * SM], qbuf[SN * SM], c[SK * SKL];
                    pt_osft_split sp = {.pf = &pf, .pq = &pq, .fz = cached ? init[fz] : NULL,
                                        .f = fbuf, .q = qbuf, .c = c, .gather = fake_gather,
                                        .user = &fc};
                    lin L = {.cpu = 1};
                    char err[256] = "";
                    assert_int_equal(pt_osft_split_path(&L, &t, v, &sp, err, sizeof err), 0);
                    assert_int_equal(L.rc, 0);
                }
            double eu = 0, ev = 0, efz = 0;
            for (int r = 0; r < w; r++) {
                const shard_fac *fu = &fc.fac[PT_OSFT_UL], *fv = &fc.fac[PT_OSFT_VL];
                for (size_t i = 0; i < fu->len[r]; i++)
                    eu = fmax(eu, fabs(own[r][PT_OSFT_UL][i] - ulx[fu->lo[r] + i]));
                for (size_t i = 0; i < fv->len[r]; i++)
                    ev = fmax(ev, fabs(own[r][PT_OSFT_VL][i] - vlx[fv->lo[r] + i]));
                /* the frozen parts are read, never written */
                for (int f = PT_OSFT_UH; f <= PT_OSFT_VH; f += PT_OSFT_VH - PT_OSFT_UH)
                    for (size_t i = 0; i < fc.fac[f].len[r]; i++)
                        efz = fmax(efz, fabs(own[r][f][i] - init[f][fc.fac[f].lo[r] + i]));
            }
            printf("  plugin's sharded projection, %d ranks%s: U path %.2g, V path %.2g "
                   "(max abs error against double)\n", w, cached ? ", frozen cached" : "", eu,
                   ev);
            /* float32 products of length <= 11 on values below 1.5: rounding is
             * ~1e-6; a wrong split (the local-coefficient sum) is off by > 1e-2 */
            assert_true(eu <= 1e-5 && ev <= 1e-5);
            assert_true(efz == 0);
            /* one gather per split factor and path and rank; the cached frozen none */
            assert_int_equal(fc.gathers, w * 2 * (cached ? 1 : 2));
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plugin_sharded_projection),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
