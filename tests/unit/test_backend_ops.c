/*
 * test_backend_ops.c — every pt_gpu_backend op checked against a plain C
 * reference, on the backend named by $PT_TEST_BACKEND ("host" when unset).
 *
 * `make test` runs it on the host backend; `make test-gpu` runs the same
 * binary with PT_TEST_BACKEND=cuda on a GPU machine, so the simulated device
 * and the real one answer the same questions:
 *  - copies in every direction, at misaligned offsets and of 1 byte, and
 *    memset without touching the neighbours;
 *  - stream order: a copy on one stream that waits on an event of another sees
 *    the first stream's data; a host function runs after the work queued
 *    before it; events report done after a sync and elapsed times are >= 0;
 *  - AdamW over several steps, bit-identical to pt_adamw_elem run here on the
 *    CPU (n = 1, odd n, a misaligned sub-range, every output dtype);
 *  - sqnorm within n * 2^-53 relative of a long double sum here (the bound of
 *    any summation order of n non-negative doubles), and bit-identical
 *    between two runs (the grad norm must not vary run to run);
 *  - bf16 -> fp32 and fp16 -> fp32 over all 65,536 bit patterns, fp32 -> bf16
 *    and fp32 -> fp16 over every exponent with several mantissas plus the
 *    rounding ties, each bit-identical to kernels_hd.h; convert-accumulate
 *    (bf16 into fp32, and fp32 into fp32 on a stream: TiledMLP's gradient add);
 *  - gemm_f32 in all four transpose combinations with padded strides against a
 *    double reference (beta 0 overwrites NaN, padding untouched), cols_f32
 *    bit-identical to the shared column bodies, svd_f32 tall and wide
 *    (reconstruction and orthonormality within 1e-5, s descending);
 *  - bad arguments (unknown dtype, unknown copy kind) refused with
 *    PT_ERR_INVALID_ARG, the same on every backend;
 *  - with PT_TEST_LARGE=1, kernels over 2^31 + 17 elements (indices past
 *    INT_MAX), checked at the tail.
 * With PT_TEST_BACKEND=cuda and no usable GPU the program says so and exits 0
 * without claiming anything. PT_TEST_FILTER (a cmocka name pattern, e.g.
 * "test_linalg") runs only the matching tests; one that matches none fails.
 */
#include <fnmatch.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device_ext.h"
#include "gpu.h"
#include "kernels_hd.h"
#include "la_cpu.h"
#include "protrain.h"
#include "rekls_ew.h"

static const char *kind_name(void) {
    const char *k = getenv("PT_TEST_BACKEND");
    return k && *k ? k : "host";
}

static pt_gpu *G;                 /* opened once for the whole run */
static const pt_gpu_backend *OPS;
static void *IMPL;

/* splitmix64: the test's data, the same on every machine */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 40) * 0x1p-24); }

static void *dalloc(size_t bytes) {
    void *p = NULL;
    char err[512] = "";
    int rc = pt_gpu_alloc(G, bytes, PT_TAG_OTHER, &p, err, sizeof err);
    if (rc) fail_msg("device alloc of %zu bytes: %s", bytes, err);
    return p;
}
static void h2d(void *d, const void *h, size_t n) { assert_int_equal(pt_gpu_memcpy(G, d, h, n, PT_GPU_H2D), 0); }
static void d2h(void *h, const void *d, size_t n) { assert_int_equal(pt_gpu_memcpy(G, h, d, n, PT_GPU_D2H), 0); }
static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float fbits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- copies and memset ---- */

static void test_copies(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    uint8_t *src = malloc(N), *back = malloc(N);
    assert_non_null(src);
    assert_non_null(back);
    for (size_t i = 0; i < N; i++) src[i] = (uint8_t)rnd();
    uint8_t *a = dalloc(N), *b = dalloc(N);
    /* misaligned on both sides: host +3, device +1, then D2D to +7 */
    h2d(a + 1, src + 3, N - 8);
    assert_int_equal(pt_gpu_memcpy(G, b + 7, a + 1, N - 8, PT_GPU_D2D), 0);
    d2h(back, b + 7, N - 8);
    assert_memory_equal(back, src + 3, N - 8);
    /* one byte each way */
    uint8_t one = 0x5a, got = 0;
    h2d(a + 13, &one, 1);
    d2h(&got, a + 13, 1);
    assert_int_equal(got, 0x5a);
    /* memset a misaligned range; the bytes around it keep their values */
    assert_int_equal(OPS->memset_async(IMPL, b + 9, 0xab, 1000, NULL), 0);
    d2h(back, b, 1100);
    assert_memory_equal(back + 7, src + 3, 2);   /* b[7..8]: from the D2D copy */
    for (int i = 9; i < 1009; i++) assert_int_equal(back[i], 0xab);
    assert_memory_equal(back + 1009, src + 3 + 1002, 91);
    /* H2H through the backend */
    assert_int_equal(pt_gpu_memcpy(G, back, src, 4096, PT_GPU_H2H), 0);
    assert_memory_equal(back, src, 4096);
    pt_gpu_free(G, a);
    pt_gpu_free(G, b);
    free(src);
    free(back);
}

/* ---- streams and events ---- */

typedef struct seen { const volatile uint32_t *p; uint32_t v; int ran; } seen;
static void read_back(void *arg) {
    seen *s = arg;
    s->v = *s->p;
    s->ran = 1;
}

static void test_stream_order(void **state) {
    (void)state;
    enum { N = 16 << 20 };   /* 16 MiB: long enough that an unordered copy would be seen */
    pt_stream *s1 = NULL, *s2 = NULL;
    pt_event *e1 = NULL, *e2 = NULL, *e0 = NULL;
    assert_int_equal(OPS->stream_create(IMPL, &s1), 0);
    assert_int_equal(OPS->stream_create(IMPL, &s2), 0);
    assert_int_equal(pt_gpu_event_create_timing(G, &e0), 0);   /* elapsed time read */
    assert_int_equal(pt_gpu_event_create_timing(G, &e1), 0);
    assert_int_equal(OPS->event_create(IMPL, &e2), 0);
    uint32_t *pin = NULL, *out = NULL;
    char err[256];
    assert_int_equal(pt_gpu_pinned_alloc(G, N, (void **)&pin, err, sizeof err), 0);
    assert_int_equal(pt_gpu_pinned_alloc(G, N, (void **)&out, err, sizeof err), 0);
    for (size_t i = 0; i < N / 4; i++) pin[i] = (uint32_t)i * 2654435761u;
    uint8_t *a = dalloc(N), *b = dalloc(N);
    for (int round = 0; round < 3; round++) {
        memset(out, 0, N);
        /* s1: upload into a; s2 waits for it, copies a -> b and downloads b */
        assert_int_equal(OPS->event_record(IMPL, e0, s1), 0);
        assert_int_equal(OPS->memset_async(IMPL, a, 0, N, s1), 0);
        assert_int_equal(pt_gpu_memcpy_async(G, a, pin, N, PT_GPU_H2D, s1), 0);
        assert_int_equal(OPS->event_record(IMPL, e1, s1), 0);
        assert_int_equal(OPS->stream_wait_event(IMPL, s2, e1), 0);
        assert_int_equal(pt_gpu_memcpy_async(G, b, a, N, PT_GPU_D2D, s2), 0);
        assert_int_equal(pt_gpu_memcpy_async(G, out, b, N, PT_GPU_D2H, s2), 0);
        /* a host function queued after the download sees its last word */
        seen sn = {out + N / 4 - 1, 0, 0};
        assert_int_equal(OPS->host_fn(IMPL, s2, read_back, &sn), 0);
        assert_int_equal(OPS->event_record(IMPL, e2, s2), 0);
        assert_int_equal(OPS->event_sync(IMPL, e2), 0);
        assert_int_equal(OPS->stream_sync(IMPL, s2), 0);
        assert_int_equal(sn.ran, 1);
        assert_int_equal(sn.v, pin[N / 4 - 1]);
        assert_memory_equal(out, pin, N);
        assert_int_equal(OPS->event_query(IMPL, e2), 1);
        float ms = -1.0f;
        assert_int_equal(OPS->stream_sync(IMPL, s1), 0);
        assert_int_equal(OPS->event_elapsed_ms(IMPL, e0, e1, &ms), 0);
        assert_true(ms >= 0.0f);
        /* a NULL stream waiting on an event: the caller blocks until it is done */
        assert_int_equal(OPS->memset_async(IMPL, a, 7, N, s1), 0);
        assert_int_equal(OPS->event_record(IMPL, e1, s1), 0);
        assert_int_equal(OPS->stream_wait_event(IMPL, NULL, e1), 0);
        assert_int_equal(OPS->event_query(IMPL, e1), 1);
    }
    pt_gpu_free(G, a);
    pt_gpu_free(G, b);
    pt_gpu_pinned_free(G, pin);
    pt_gpu_pinned_free(G, out);
    OPS->event_destroy(IMPL, e0);
    OPS->event_destroy(IMPL, e1);
    OPS->event_destroy(IMPL, e2);
    OPS->stream_destroy(IMPL, s1);
    OPS->stream_destroy(IMPL, s2);
}

/* ---- AdamW ---- */

/* Runs `steps` AdamW steps over n elements starting `off` elements into the
 * buffers, on the device and here with pt_adamw_elem; every param, moment and
 * output element must match bit for bit. */
static void adamw_case(size_t n, size_t off, int out_dtype, int steps) {
    size_t tot = n + off;
    float *p = malloc(tot * 4), *g = malloc(tot * 4), *m = malloc(tot * 4), *v = malloc(tot * 4);
    uint16_t *o16 = calloc(tot, 2);
    float *back = malloc(tot * 4);
    uint16_t *back16 = malloc(tot * 2);
    assert_true(p && g && m && v && o16 && back && back16);
    for (size_t i = 0; i < tot; i++) {
        p[i] = rndf(-1.0f, 1.0f);
        m[i] = rndf(-0.01f, 0.01f);
        v[i] = rndf(0.0f, 1e-4f);
    }
    float *dp = dalloc(tot * 4), *dg = dalloc(tot * 4), *dm = dalloc(tot * 4), *dv = dalloc(tot * 4);
    void *dout = out_dtype >= 0 ? dalloc(tot * 4) : NULL;
    h2d(dp, p, tot * 4);
    h2d(dm, m, tot * 4);
    h2d(dv, v, tot * 4);
    for (int t = 1; t <= steps; t++) {
        for (size_t i = 0; i < tot; i++) g[i] = rndf(-0.5f, 0.5f) * (float)t;
        h2d(dg, g, tot * 4);
        pt_adamw_args a;
        memset(&a, 0, sizeof a);
        a.param = dp + off;
        a.grad = dg + off;
        a.m = dm + off;
        a.v = dv + off;
        a.param_out = dout ? (char *)dout + off * pt_dtype_size(out_dtype) : NULL;
        a.out_dtype = out_dtype >= 0 ? out_dtype : 0;
        a.n = n;
        a.lr = 1e-3f * (float)t;
        a.beta1 = 0.9f;
        a.beta2 = 0.999f;
        a.eps = 1e-8f;
        a.weight_decay = 0.1f;
        a.grad_scale = t == 2 ? 0.37f : 1.0f;
        pt_adamw_bias(a.beta1, a.beta2, t, &a.bc1, &a.bc2_rsqrt);
        assert_int_equal(OPS->adamw(IMPL, &a, NULL), 0);
        pt_adamw_consts c = pt_adamw_make_consts(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                                                 a.bc1, a.bc2_rsqrt, a.grad_scale);
        for (size_t i = off; i < tot; i++) {
            p[i] = pt_adamw_elem(&c, p[i], g[i], &m[i], &v[i]);
            if (out_dtype >= 0) pt_store_elem(out_dtype == 0 ? (void *)back : (void *)o16,
                                              out_dtype, i, p[i]);
        }
    }
    float *ref[3] = {p, m, v}, *dev[3] = {dp, dm, dv};
    for (int k = 0; k < 3; k++) {
        d2h(back, dev[k], tot * 4);
        for (size_t i = 0; i < tot; i++)
            if (bits(back[i]) != bits(ref[k][i]))
                fail_msg("adamw n=%zu off=%zu: array %d element %zu: device %a, CPU %a", n, off,
                         k, i, (double)back[i], (double)ref[k][i]);
    }
    if (out_dtype > 0) {
        d2h(back16, (char *)dout + off * 2, n * 2);
        for (size_t i = 0; i < n; i++)
            if (back16[i] != o16[off + i])
                fail_msg("adamw out dtype %d element %zu: %04x vs %04x", out_dtype, i, back16[i],
                         o16[off + i]);
    } else if (out_dtype == 0) {
        float *ref32 = malloc(tot * 4);
        assert_non_null(ref32);
        memcpy(ref32, p, tot * 4);
        d2h(back, (char *)dout + off * 4, n * 4);
        assert_memory_equal(back, ref32 + off, n * 4);
        free(ref32);
    }
    pt_gpu_free(G, dp);
    pt_gpu_free(G, dg);
    pt_gpu_free(G, dm);
    pt_gpu_free(G, dv);
    if (dout) pt_gpu_free(G, dout);
    free(p); free(g); free(m); free(v); free(o16); free(back); free(back16);
}

static void test_adamw(void **state) {
    (void)state;
    adamw_case(1, 0, -1, 3);
    adamw_case(1000003, 0, -1, 5);
    adamw_case(4099, 3, PT_BF16, 4);    /* misaligned sub-range: 12 bytes in */
    adamw_case(4099, 1, PT_F16, 4);
    adamw_case(777, 5, PT_F32, 2);
}

/* ---- dense linear algebra (gemm_f32, cols_f32, svd_f32) ---- */

/* row-major op(X)[i][j] of a stored matrix with row stride ld */
static double at(const float *x, int64_t ld, int t, int64_t i, int64_t j) {
    return t ? (double)x[j * ld + i] : (double)x[i * ld + j];
}

static void gemm_case(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, float beta) {
    int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
    int64_t ra = ta ? k : m, rb = tb ? n : k;
    size_t na = (size_t)(ra * lda), nb = (size_t)(rb * ldb), nc = (size_t)(m * ldc);
    float *a = malloc(na * 4), *b = malloc(nb * 4), *c = malloc(nc * 4), *got = malloc(nc * 4);
    assert_true(a && b && c && got);
    for (size_t i = 0; i < na; i++) a[i] = rndf(-1, 1);
    for (size_t i = 0; i < nb; i++) b[i] = rndf(-1, 1);
    /* beta = 0 must overwrite C even where it holds NaN */
    for (size_t i = 0; i < nc; i++) c[i] = beta == 0.0f ? NAN : rndf(-1, 1);
    float *da = dalloc(na * 4), *db = dalloc(nb * 4), *dc = dalloc(nc * 4);
    h2d(da, a, na * 4), h2d(db, b, nb * 4), h2d(dc, c, nc * 4);
    pt_gemm_args g = {ta, tb, m, n, k, alpha, beta, da, lda, db, ldb, dc, ldc};
    assert_int_equal(OPS->gemm_f32(IMPL, &g, NULL), 0);
    d2h(got, dc, nc * 4);
    double worst = 0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double r = 0, mag = 0;
            for (int64_t l = 0; l < k; l++) {
                r += at(a, lda, ta, i, l) * at(b, ldb, tb, l, j);
                mag += fabs(at(a, lda, ta, i, l) * at(b, ldb, tb, l, j));
            }
            r = alpha * r + (beta == 0.0f ? 0.0 : beta * (double)c[i * ldc + j]);
            double e = fabs((double)got[i * ldc + j] - r) / (fabs(alpha) * mag + 1.0);
            if (!(e <= worst)) worst = e;   /* NaN lands here too */
        }
        /* the padding past n is not written */
        for (int64_t j = n; j < ldc; j++)
            assert_memory_equal(&got[i * ldc + j], &c[i * ldc + j], 4);
    }
    if (!(worst <= 1e-6))
        fail_msg("gemm ta %d tb %d %lldx%lldx%lld: error %.3g", ta, tb, (long long)m, (long long)n,
                 (long long)k, worst);
    pt_gpu_free(G, da), pt_gpu_free(G, db), pt_gpu_free(G, dc);
    free(a), free(b), free(c), free(got);
}

static void test_linalg(void **state) {
    (void)state;
    if (!pt_gpu_has_linalg(OPS)) fail_msg("the %s backend has no linear algebra ops", kind_name());
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(ta, tb, 7, 5, 9, 1.0f, 0.0f);
            gemm_case(ta, tb, 33, 17, 64, -1.0f, 1.0f);
            gemm_case(ta, tb, 1, 130, 3, 0.5f, 0.25f);
        }
    gemm_case(0, 0, 4, 6, 0, 1.0f, 0.0f);   /* k = 0: C = 0 */
    /* cols: scale and column dots, bit-identical to the shared bodies */
    enum { R = 37, C = 11 };
    float x[R * C], y[R * C], sv[C], acc0[C], acc[C], out[R * C], want[R * C], wacc[C];
    for (int i = 0; i < R * C; i++) x[i] = rndf(-2, 2), y[i] = rndf(-2, 2);
    for (int j = 0; j < C; j++) sv[j] = rndf(-1, 1), acc0[j] = rndf(-1, 1);
    float *dx = dalloc(sizeof x), *dy = dalloc(sizeof y), *ds = dalloc(sizeof sv),
          *dacc = dalloc(sizeof acc), *dout = dalloc(sizeof out);
    h2d(dx, x, sizeof x), h2d(dy, y, sizeof y), h2d(ds, sv, sizeof sv), h2d(dacc, acc0, sizeof acc0);
    pt_cols_args sc = {PT_COLS_SCALE, R, C, C, dx, NULL, ds, dout, NULL};
    pt_cols_args dt = {PT_COLS_DOT, R, C, C, dx, dy, NULL, NULL, dacc};
    assert_int_equal(OPS->cols_f32(IMPL, &sc, NULL), 0);
    assert_int_equal(OPS->cols_f32(IMPL, &dt, NULL), 0);
    d2h(out, dout, sizeof out), d2h(acc, dacc, sizeof acc);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) want[i * C + j] = pt_colscale_elem(x[i * C + j], sv[j]);
    for (int j = 0; j < C; j++) wacc[j] = pt_coldot_col(x, y, R, C, j, acc0[j]);
    assert_memory_equal(out, want, sizeof out);
    assert_memory_equal(acc, wacc, sizeof acc);
    pt_gpu_free(G, dx), pt_gpu_free(G, dy), pt_gpu_free(G, ds), pt_gpu_free(G, dacc),
        pt_gpu_free(G, dout);
    /* thin SVD, tall and wide: a = u diag(s) vt within 1e-5, orthonormal factors,
     * s descending */
    static const int64_t shp[2][2] = {{13, 6}, {5, 12}};
    for (int c = 0; c < 2; c++) {
        int64_t m = shp[c][0], n = shp[c][1], r = m < n ? m : n;
        float *h = malloc((size_t)(m * n) * 4), *u = malloc((size_t)(m * r) * 4),
              *sg = malloc((size_t)r * 4), *vt = malloc((size_t)(r * n) * 4);
        assert_true(h && u && sg && vt);
        for (int64_t i = 0; i < m * n; i++) h[i] = rndf(-1, 1);
        float *da = dalloc((size_t)(m * n) * 4), *du = dalloc((size_t)(m * r) * 4),
              *dsg = dalloc((size_t)r * 4), *dvt = dalloc((size_t)(r * n) * 4);
        int32_t *dinfo = dalloc(4), info = -1;
        h2d(da, h, (size_t)(m * n) * 4);
        pt_svd_args sa = {m, n, da, du, dsg, dvt, dinfo};
        assert_int_equal(OPS->svd_f32(IMPL, &sa, NULL), 0);
        d2h(u, du, (size_t)(m * r) * 4), d2h(sg, dsg, (size_t)r * 4), d2h(vt, dvt, (size_t)(r * n) * 4);
        d2h(&info, dinfo, 4);
        assert_int_equal(info, 0);
        double e2 = 0, a2 = 0, oe = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double v = 0;
                for (int64_t l = 0; l < r; l++) v += (double)u[i * r + l] * sg[l] * vt[l * n + j];
                e2 += (v - h[i * n + j]) * (v - h[i * n + j]);
                a2 += (double)h[i * n + j] * h[i * n + j];
            }
        for (int64_t p = 0; p < r; p++) {
            if (p) assert_true(sg[p] <= sg[p - 1]);
            for (int64_t q = 0; q < r; q++) {
                double uu = 0, vv = 0;
                for (int64_t i = 0; i < m; i++) uu += (double)u[i * r + p] * u[i * r + q];
                for (int64_t j = 0; j < n; j++) vv += (double)vt[p * n + j] * vt[q * n + j];
                oe = fmax(oe, fmax(fabs(uu - (p == q)), fabs(vv - (p == q))));
            }
        }
        if (!(sqrt(e2 / a2) <= 1e-5 && oe <= 1e-5))
            fail_msg("svd %lldx%lld: reconstruction %.3g, orthonormality %.3g", (long long)m,
                     (long long)n, sqrt(e2 / a2), oe);
        pt_gpu_free(G, da), pt_gpu_free(G, du), pt_gpu_free(G, dsg), pt_gpu_free(G, dvt),
            pt_gpu_free(G, dinfo);
        free(h), free(u), free(sg), free(vt);
    }
    /* bad arguments */
    pt_gemm_args bad = {0, 0, 4, 4, 4, 1.0f, 0.0f, (float *)1, 4, (float *)1, 4, (float *)1, 3};
    assert_int_equal(OPS->gemm_f32(IMPL, &bad, NULL), PT_ERR_INVALID_ARG);   /* ldc < n */
    pt_cols_args badc = {7, 1, 1, 1, (float *)1, (float *)1, (float *)1, (float *)1, (float *)1};
    assert_int_equal(OPS->cols_f32(IMPL, &badc, NULL), PT_ERR_INVALID_ARG);
}

/* ---- sqnorm ---- */

static void sqnorm_case(int dtype, size_t n, size_t off) {
    size_t es = pt_dtype_size(dtype), tot = n + off;
    void *h = malloc(tot * es);
    assert_non_null(h);
    for (size_t i = 0; i < tot; i++) pt_store_elem(h, dtype, i, rndf(-2.0f, 2.0f));
    /* the reference in long double (64-bit mantissa), so its own error is far
     * below the bound the device's double sum is held to */
    long double lref = 0.0L;
    for (size_t i = off; i < tot; i++) {
        long double x = (long double)pt_load_elem(h, dtype, i);
        lref += x * x;
    }
    double ref = (double)lref;
    char *dx = dalloc(tot * es);
    double *dout = dalloc(sizeof(double));
    h2d(dx, h, tot * es);
    double got[2];
    for (int r = 0; r < 2; r++) {
        double start = 0.25;   /* sqnorm adds into *out */
        h2d(dout, &start, sizeof start);
        assert_int_equal(OPS->sqnorm(IMPL, dx + off * es, dtype, n, dout, NULL), 0);
        d2h(&got[r], dout, sizeof got[r]);
        got[r] -= 0.25;
    }
    /* any order of adding n non-negative doubles is within (n-1) * 2^-53 of the
     * exact sum, relative (the classic bound for recursive summation; a tree is
     * tighter): the host sums in index order, the GPU in a block tree */
    double rel = fabs(got[0] - ref) / (ref > 0 ? ref : 1.0);
    double bound = (double)n * 0x1p-53 + 0x1p-60;
    if (!(rel <= bound)) fail_msg("sqnorm dtype %d n=%zu: %.17g vs %.17g (rel %.3g)", dtype, n, got[0], ref, rel);
    if (memcmp(&got[0], &got[1], sizeof got[0]))
        fail_msg("sqnorm dtype %d n=%zu not reproducible: %.17g then %.17g", dtype, n, got[0], got[1]);
    pt_gpu_free(G, dx);
    pt_gpu_free(G, dout);
    free(h);
}

static void test_sqnorm(void **state) {
    (void)state;
    for (int d = 0; d < 3; d++) {
        sqnorm_case(d, 1, 0);
        sqnorm_case(d, 3000017, 1);
        sqnorm_case(d, 255, 3);
    }
}

/* ---- converters ---- */

/* src (n elements of sd) converted on the device to dd; compared bit for bit
 * with pt_store_elem(pt_load_elem()) here. */
static void convert_check(const void *src, int sd, int dd, size_t n, const char *what) {
    size_t ss = pt_dtype_size(sd), ds = pt_dtype_size(dd);
    void *dsrc = dalloc(n * ss), *ddst = dalloc(n * ds);
    void *got = malloc(n * ds), *want = malloc(n * ds);
    assert_true(got && want);
    h2d(dsrc, src, n * ss);
    assert_int_equal(OPS->convert(IMPL, ddst, dd, dsrc, sd, n, 0, NULL), 0);
    d2h(got, ddst, n * ds);
    for (size_t i = 0; i < n; i++) pt_store_elem(want, dd, i, pt_load_elem(src, sd, i));
    for (size_t i = 0; i < n; i++) {
        uint32_t a = 0, b = 0;
        memcpy(&a, (char *)got + i * ds, ds);
        memcpy(&b, (char *)want + i * ds, ds);
        if (a != b) fail_msg("%s element %zu: device %08x, CPU %08x", what, i, a, b);
    }
    pt_gpu_free(G, dsrc);
    pt_gpu_free(G, ddst);
    free(got);
    free(want);
}

static void test_convert_all_patterns(void **state) {
    (void)state;
    uint16_t *h = malloc(65536 * 2);
    assert_non_null(h);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    convert_check(h, PT_BF16, PT_F32, 65536, "bf16->f32");
    convert_check(h, PT_F16, PT_F32, 65536, "f16->f32");
    free(h);
    /* fp32 -> 16 bit: both signs, all 256 exponents, mantissas at the rounding
     * edges of bf16 (low 16 bits) and fp16 (low 13 bits) plus random ones */
    static const uint32_t mant[] = {0x000000, 0x000001, 0x007fff, 0x008000, 0x008001, 0x018000,
                                    0x000fff, 0x001000, 0x001001, 0x003000, 0x7fffff, 0x400000,
                                    0x7f8000, 0x7fefff, 0x7ff000};
    size_t nm = sizeof mant / sizeof mant[0] + 48, n = 2 * 256 * nm, k = 0;
    float *f = malloc(n * 4);
    assert_non_null(f);
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t e = 0; e < 256; e++)
            for (size_t j = 0; j < nm; j++) {
                uint32_t m = j < sizeof mant / sizeof mant[0] ? mant[j] : (uint32_t)rnd() & 0x7fffffu;
                f[k++] = fbits(s << 31 | e << 23 | m);
            }
    assert_int_equal(k, n);
    convert_check(f, PT_F32, PT_BF16, n, "f32->bf16");
    convert_check(f, PT_F32, PT_F16, n, "f32->f16");
    free(f);
}

static void test_convert_accumulate(void **state) {
    (void)state;
    enum { N = 10007 };
    float *acc = malloc(N * 4), *got = malloc(N * 4);
    uint16_t *src = malloc(N * 2);
    assert_true(acc && got && src);
    for (int i = 0; i < N; i++) {
        acc[i] = rndf(-1, 1);
        src[i] = pt_f32_to_bf16(rndf(-1, 1));
    }
    float *dacc = dalloc(N * 4);
    uint16_t *dsrc = dalloc(N * 2);
    h2d(dacc, acc, N * 4);
    h2d(dsrc, src, N * 2);
    assert_int_equal(OPS->convert(IMPL, dacc + 1, PT_F32, dsrc + 1, PT_BF16, N - 1, 1, NULL), 0);
    d2h(got, dacc, N * 4);
    assert_int_equal(bits(got[0]), bits(acc[0]));
    for (int i = 1; i < N; i++)
        assert_int_equal(bits(got[i]), bits(acc[i] + pt_bf16_to_f32(src[i])));
    pt_gpu_free(G, dacc);
    pt_gpu_free(G, dsrc);
    free(acc); free(got); free(src);
}

/* fp32 += fp32 on a stream: TiledMLP's gradient add (g = g + the tiles' sum),
 * each element one fp32 addition, so bit-identical to g[i] + a[i] formed here;
 * the elements around the range stay as they were. */
static void test_convert_accumulate_f32(void **state) {
    (void)state;
    enum { N = 70001 };
    float *g = malloc(N * 4), *a = malloc(N * 4), *got = malloc(N * 4);
    assert_true(g && a && got);
    for (int i = 0; i < N; i++) {
        g[i] = rndf(-1, 1) * (i % 7 ? 1.0f : 1e-6f);
        a[i] = rndf(-1, 1);
    }
    float *dg = dalloc(N * 4), *da = dalloc(N * 4);
    h2d(dg, g, N * 4);
    h2d(da, a, N * 4);
    pt_stream *s = NULL;
    assert_int_equal(OPS->stream_create(IMPL, &s), 0);
    assert_int_equal(OPS->convert(IMPL, dg + 3, PT_F32, da + 3, PT_F32, N - 5, 1, s), 0);
    assert_int_equal(OPS->stream_sync(IMPL, s), 0);
    OPS->stream_destroy(IMPL, s);
    d2h(got, dg, N * 4);
    for (int i = 0; i < N; i++) {
        float want = (i >= 3 && i < N - 2) ? g[i] + a[i] : g[i];
        if (bits(got[i]) != bits(want))
            fail_msg("f32 += f32 at %d: got %a, want %a", i, (double)got[i], (double)want);
    }
    pt_gpu_free(G, dg);
    pt_gpu_free(G, da);
    free(g); free(a); free(got);
}

/* ---- argument checks (the same on every backend) ---- */

static void test_bad_args(void **state) {
    (void)state;
    void *a = dalloc(64), *b = dalloc(64);
    assert_int_equal(OPS->convert(IMPL, a, 7, b, PT_F32, 4, 0, NULL), PT_ERR_INVALID_ARG);
    assert_int_equal(OPS->convert(IMPL, a, PT_F32, b, -1, 4, 0, NULL), PT_ERR_INVALID_ARG);
    assert_int_equal(OPS->sqnorm(IMPL, a, 9, 4, b, NULL), PT_ERR_INVALID_ARG);
    /* frozen byte parameters never reach an element op */
    assert_int_equal(OPS->convert(IMPL, a, PT_U8, b, PT_F32, 4, 0, NULL), PT_ERR_INVALID_ARG);
    assert_int_equal(OPS->convert(IMPL, a, PT_F32, b, PT_U8, 4, 0, NULL), PT_ERR_INVALID_ARG);
    assert_int_equal(OPS->sqnorm(IMPL, a, PT_U8, 4, b, NULL), PT_ERR_INVALID_ARG);
    assert_int_equal(OPS->memcpy_async(IMPL, a, b, 4, 9, NULL), PT_ERR_INVALID_ARG);
    assert_int_equal(OPS->memcpy_async(IMPL, NULL, b, 4, PT_GPU_D2D, NULL), PT_ERR_INVALID_ARG);
    assert_int_equal(OPS->memset_async(IMPL, NULL, 0, 4, NULL), PT_ERR_INVALID_ARG);
    pt_adamw_args x;
    memset(&x, 0, sizeof x);
    x.n = 4;
    assert_int_equal(OPS->adamw(IMPL, &x, NULL), PT_ERR_INVALID_ARG);   /* NULL arrays */
    assert_int_equal(OPS->adamw(IMPL, NULL, NULL), PT_ERR_INVALID_ARG);
    /* zero-length work with NULL pointers is a no-op, as in CUDA */
    assert_int_equal(OPS->memset_async(IMPL, NULL, 0, 0, NULL), 0);
    pt_gpu_free(G, a);
    pt_gpu_free(G, b);
}

/* ---- more than 2^31 elements (PT_TEST_LARGE=1) ---- */

static void test_large(void **state) {
    (void)state;
    const char *on = getenv("PT_TEST_LARGE");
    if (!on || strcmp(on, "1")) {
        print_message("  (kernels over 2^31 elements: set PT_TEST_LARGE=1 on a large device)\n");
        skip();   /* not run: the summary says SKIPPED, not PASSED */
    }
    const size_t n = (1ull << 31) + 17;
    /* every fp32 byte 0x3f: x = 0x3f3f3f3f = 0.7470...; the tail is where a
     * 32-bit index would have wrapped */
    float x = fbits(0x3f3f3f3fu);
    float *src = dalloc(n * 4);
    uint16_t *dst = dalloc(n * 2);
    double *acc = dalloc(sizeof(double));
    assert_int_equal(OPS->memset_async(IMPL, src, 0x3f, n * 4, NULL), 0);
    assert_int_equal(OPS->memset_async(IMPL, dst, 0, n * 2, NULL), 0);
    assert_int_equal(OPS->convert(IMPL, dst, PT_BF16, src, PT_F32, n, 0, NULL), 0);
    uint16_t tail[64];
    d2h(tail, dst + n - 64, sizeof tail);
    for (int i = 0; i < 64; i++) assert_int_equal(tail[i], pt_f32_to_bf16(x));
    double zero = 0.0, got = 0.0;
    h2d(acc, &zero, sizeof zero);
    assert_int_equal(OPS->sqnorm(IMPL, dst, PT_BF16, n, acc, NULL), 0);
    d2h(&got, acc, sizeof got);
    double b = (double)pt_bf16_to_f32(pt_f32_to_bf16(x));
    double want = (double)n * b * b;
    assert_true(fabs(got - want) <= 1e-9 * want);
    /* AdamW in place over the same n: p = src, g = src, m = v = 0 (reuse dst as
     * scratch is not possible: four fp32 arrays) */
    float *m = dalloc(n * 4), *v = dalloc(n * 4);
    assert_int_equal(OPS->memset_async(IMPL, m, 0, n * 4, NULL), 0);
    assert_int_equal(OPS->memset_async(IMPL, v, 0, n * 4, NULL), 0);
    pt_adamw_args a;
    memset(&a, 0, sizeof a);
    a.param = src; a.grad = src; a.m = m; a.v = v; a.n = n;
    a.lr = 1e-3f; a.beta1 = 0.9f; a.beta2 = 0.999f; a.eps = 1e-8f; a.weight_decay = 0.01f;
    a.grad_scale = 1.0f;
    pt_adamw_bias(a.beta1, a.beta2, 1, &a.bc1, &a.bc2_rsqrt);
    assert_int_equal(OPS->adamw(IMPL, &a, NULL), 0);
    pt_adamw_consts c = pt_adamw_make_consts(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                                             a.bc1, a.bc2_rsqrt, a.grad_scale);
    float m0 = 0, v0 = 0, p1 = pt_adamw_elem(&c, x, x, &m0, &v0), ptail[16];
    d2h(ptail, src + n - 16, sizeof ptail);
    for (int i = 0; i < 16; i++) assert_int_equal(bits(ptail[i]), bits(p1));
    pt_gpu_free(G, m);
    pt_gpu_free(G, v);
    pt_gpu_free(G, src);
    pt_gpu_free(G, dst);
    pt_gpu_free(G, acc);
}

/* REKLS's ops against the CPU functions: gemm_f32 (every transpose pair; REKLS's
 * GEMMs) and eigh bit-identical on the host backend (the same calls), within
 * fp32 round-off elsewhere (other GEMM / eigensolver); eigh sorted descending,
 * orthonormal, A Q = Q diag(w); a NaN input sets the status and NaN-fills; every
 * rekls_ew kind bit-identical to the C loop on both (shared element bodies). */
static void test_rekls_ops(void **state) {
    (void)state;
    if (!pt_gpu_has_linalg(OPS) || !OPS->eigh || !OPS->rekls_ew) {
        printf("  this backend has no REKLS ops\n");
        return;
    }
    int host = !strcmp(pt_gpu_backend_name(G), "host");
    const int M = 33, N = 20, K = 17, n = 40;
    float A[33 * 17], B[17 * 20], C[33 * 20], R[33 * 20];
    uint32_t s = 7;
    for (int i = 0; i < 33 * 17; i++) A[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
    for (int i = 0; i < 17 * 20; i++) B[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
    float *dA = dalloc(sizeof A), *dB = dalloc(sizeof B), *dC = dalloc(sizeof C);
    h2d(dA, A, sizeof A);
    h2d(dB, B, sizeof B);
    for (int t = 0; t < 4; t++) {
        int ta = t & 1, tb = t >> 1;
        /* the same buffers read as op(A) [M x K], op(B) [K x N] */
        int lda = ta ? M : K, ldb = tb ? K : N;
        pt_la_sgemm(ta, tb, M, N, K, 1.5f, A, lda, B, ldb, 0.0f, R, N);
        pt_gemm_args ga = {ta, tb, M, N, K, 1.5f, 0.0f, dA, lda, dB, ldb, dC, N};
        assert_int_equal(OPS->gemm_f32(IMPL, &ga, NULL), 0);
        d2h(C, dC, sizeof C);
        double e = 0, mx = 0;
        for (int i = 0; i < M * N; i++) e = fmax(e, fabs(C[i] - R[i])), mx = fmax(mx, fabs(R[i]));
        if (host) assert_memory_equal(C, R, sizeof C);
        else assert_true(e <= 1e-5 * mx);
    }
    /* eigh of S = X X^T (X = the first 40 x 17 of A and B, padded) */
    float X[40 * 17], S[40 * 40], Q[40 * 40], w[40], Qc[40 * 40], wc[40];
    for (int i = 0; i < 40 * 17; i++) X[i] = i < 33 * 17 ? A[i] : B[i - 33 * 17];
    pt_la_sgemm(0, 1, n, n, K, 1.0f, X, K, X, K, 0.0f, S, n);
    for (int i = 0; i < n; i++) S[i * n + i] += 0.01f * (float)i;   /* distinct eigenvalues */
    float *dS = dalloc(sizeof S), *dw = dalloc(sizeof w);
    int *dst = dalloc(sizeof(int)), st = 0;
    assert_int_equal(OPS->memset_async(IMPL, dst, 0, sizeof(int), NULL), 0);
    h2d(dS, S, sizeof S);
    assert_int_equal(OPS->eigh(IMPL, n, dS, dw, dst, NULL), 0);
    d2h(Q, dS, sizeof Q);
    d2h(w, dw, sizeof w);
    d2h(&st, dst, sizeof st);
    assert_int_equal(st, 0);
    memcpy(Qc, S, sizeof S);
    assert_int_equal(pt_la_eigh_desc(n, Qc, wc), 0);
    if (host) {
        assert_memory_equal(Q, Qc, sizeof Q);
        assert_memory_equal(w, wc, sizeof w);
    }
    double lmax = wc[0], e = 0, o = 0;
    for (int j = 0; j < n; j++) {
        assert_true(fabs(w[j] - wc[j]) <= 1e-5 * lmax);
        if (j) assert_true(w[j] <= w[j - 1]);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double aq = 0, qq = 0;
            for (int k = 0; k < n; k++) {
                aq += (double)S[i * n + k] * Q[k * n + j];
                qq += (double)Q[k * n + i] * Q[k * n + j];
            }
            e = fmax(e, fabs(aq - Q[i * n + j] * (double)w[j]));
            o = fmax(o, fabs(qq - (i == j)));
        }
    assert_true(e <= 1e-4 * lmax);
    assert_true(o <= 1e-5);
    S[3] = NAN;
    h2d(dS, S, sizeof S);
    assert_int_equal(OPS->eigh(IMPL, n, dS, dw, dst, NULL), 0);
    d2h(&st, dst, sizeof st);
    d2h(w, dw, sizeof w);
    assert_int_not_equal(st, 0);
    assert_true(isnan(w[0]));
    /* element kernels: every kind on the device vs the C loop */
    const size_t ne = 40 * 40;
    float *x = malloc(ne * 4), *y = malloc(ne * 4), *m = malloc(ne * 4), *v = malloc(ne * 4);
    float *xr = malloc(ne * 4), *mr = malloc(ne * 4), *vr = malloc(ne * 4), lam[40];
    uint16_t *o16 = malloc(ne * 2), *o16r = malloc(ne * 2);
    float *dx = dalloc(ne * 4), *dy = dalloc(ne * 4), *dm = dalloc(ne * 4), *dv = dalloc(ne * 4),
          *dl = dalloc(sizeof lam);
    uint16_t *do16 = dalloc(ne * 2);
    for (size_t i = 0; i < ne; i++) {
        x[i] = Q[i] * 3;
        y[i] = Qc[i] - 0.1f;
        m[i] = 0.01f * Q[i];
        v[i] = 1e-4f * fabsf(Qc[i]);
    }
    for (int i = 0; i < 40; i++) lam[i] = wc[i] - 2.0f;   /* some below eps: the floor */
    static const int kinds[] = {PT_RK_GRAD_IN, PT_RK_SCALE_COLS, PT_RK_LERP, PT_RK_COPY, PT_RK_ADAM,
                                PT_RK_APPLY, PT_RK_AXPY};
    for (int kk = 0; kk < (int)(sizeof kinds / sizeof kinds[0]); kk++) {
        pt_rekls_ew_args a;
        memset(&a, 0, sizeof a);
        a.kind = kinds[kk];
        a.n = ne;
        a.a = 0.3f, a.b = 0.05f, a.c0 = 1e-3f, a.c1 = 0.2f, a.c2 = 1e-8f;
        a.cols = 40;
        a.src_dtype = PT_F32;
        a.dst_dtype = PT_BF16;
        memcpy(xr, x, ne * 4), memcpy(mr, m, ne * 4), memcpy(vr, v, ne * 4);
        a.x = xr, a.y = y, a.m = mr, a.v = vr, a.lam = lam, a.src = y, a.dst = o16r;
        pt_rekls_ew_range(&a, 0, ne);
        h2d(dx, x, ne * 4), h2d(dy, y, ne * 4), h2d(dm, m, ne * 4), h2d(dv, v, ne * 4);
        h2d(dl, lam, sizeof lam);
        a.x = dx, a.y = dy, a.m = dm, a.v = dv, a.lam = dl, a.src = dy, a.dst = do16;
        assert_int_equal(OPS->rekls_ew(IMPL, &a, NULL), 0);
        float got[40 * 40];
        d2h(got, dx, ne * 4);
        assert_memory_equal(got, xr, ne * 4);
        if (a.kind == PT_RK_ADAM) {
            d2h(got, dm, ne * 4);
            assert_memory_equal(got, mr, ne * 4);
            d2h(got, dv, ne * 4);
            assert_memory_equal(got, vr, ne * 4);
        }
        if (a.kind == PT_RK_APPLY) {
            d2h(o16, do16, ne * 2);
            assert_memory_equal(o16, o16r, ne * 2);
        }
    }
    free(x); free(y); free(m); free(v); free(xr); free(mr); free(vr); free(o16); free(o16r);
    void *dev[] = {dA, dB, dC, dS, dw, dst, dx, dy, dm, dv, dl, do16};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) pt_gpu_free(G, dev[i]);
}

static int setup(void **state) {
    (void)state;
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    const char *on = getenv("PT_TEST_LARGE");
    int large = on && !strcmp(on, "1");
    /* large: 8 + 4 + 8 + 8 GiB live at once, plus room */
    c.capacity = large ? (34ull << 30) : (256ull << 20);
    char err[768] = "";
    int rc = pt_gpu_open(kind_name(), &c, &G, err, sizeof err);
    if (rc) {
        fprintf(stderr, "test_backend_ops: cannot open the %s backend: %s\n", kind_name(), err);
        return -1;
    }
    OPS = pt_gpu_ops(G);
    IMPL = pt_gpu_impl(G);
    char name[320];
    pt_gpu_device_name(G, name, sizeof name);
    printf("  backend %s: %s\n", pt_gpu_backend_name(G), name);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (!G) return 0;
    assert_int_equal(pt_gpu_live_allocs(G), 0);
    pt_gpu_close(G);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies),
        cmocka_unit_test(test_stream_order),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_linalg),
        cmocka_unit_test(test_sqnorm),
        cmocka_unit_test(test_convert_all_patterns),
        cmocka_unit_test(test_convert_accumulate),
        cmocka_unit_test(test_convert_accumulate_f32),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_rekls_ops),
        cmocka_unit_test(test_large),
    };
    /* make test-gpu names groups of these checks on lines of their own */
    const char *only = getenv("PT_TEST_FILTER");
    if (only && *only) {
        /* a pattern that matches nothing would run 0 tests and pass */
        size_t hits = 0;
        for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
            hits += fnmatch(only, tests[i].name, 0) == 0;
        if (!hits) {
            fprintf(stderr, "test_backend_ops: FAIL: PT_TEST_FILTER=%s matches no test\n", only);
            return 1;
        }
        cmocka_set_test_filter(only);
    }
    return cmocka_run_group_tests_name(kind_name(), tests, setup, teardown);
}
