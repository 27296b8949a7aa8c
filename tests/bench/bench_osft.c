/*
 * bench_osft.c — OSFT's factorised linear layer through the plugin's hooks
 * against the dense layer (make bench).
 *
 * For each shape (out N x in M, rows tokens) and unfreeze_rank_ratio 0.25 / 0.5 /
 * 1.0 a one-block model holding that weight is trained through the hooks:
 *   fwd+bwd   osft_linear_forward + osft_linear_backward (dx, dU_low, dS_low, dV_low)
 *   dense     the same layer as three OpenBLAS sgemm calls (y = x W^T, dx = dy W,
 *             dW += dy^T x), in this process on the same threads
 *   ratio     fwd+bwd / dense, printed next to the FLOP ratio R (N + M) / (N M):
 *             both branches together span rank R = min(N, M), whatever the split
 *   SVD       the decomposition time per target (the plugin's log line)
 *   proj      the projections' share of the step: block_post_backward (the gradient
 *             projection of the block) and optimizer_step (AdamW, then the value
 *             projection) over the whole step; 0 at ratio 1 (nothing frozen)
 * Each figure: one warm-up step, then the median of REPS steps.
 * Goal (STRICT): on the square shape the factorised fwd+bwd costs at most 1.6x what
 * its FLOP ratio predicts relative to dense (the GEMMs are thinner, not slower).
 *
 * Fused dx: the backward's dx = (e S_low) V_low + (h S_high) V_high as two GEMMs
 * per branch pair (e = dY U_low, h = dY U_high, then the two dx GEMMs: what the
 * hook runs) against one GEMM per product over the concatenated factors
 * ([U_low | U_high] and [V_low; V_high] copied together first, as the store
 * keeps frozen and trainable factors in separate regions), in this process with
 * OpenBLAS. The hook keeps two GEMMs unless the fused form wins here.
 *
 * Deferred CPU steps with OSFT: BLOCKS blocks of one 512 x 512 target each (URR
 * 0.25), every block's chunk streamed and stepped by CPU Adam, clipping on (so the
 * steps cannot overlap backward). optimizer_step's own time (what the host waits
 * in that hook) and the whole step's, with [protrain] defer_cpu_steps true and
 * false. The value projection runs inside each chunk's CPU step, so deferred,
 * optimizer_step returns while the steps and their projections run into the next
 * forward. Goal (STRICT): deferred, optimizer_step takes at most half its time
 * with the steps waited for (were the projection to wait for the steps, as it
 * once did, the two would be equal).
 * Env: PT_BENCH_REPS (default 7), PT_BENCH_STRICT.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protrain.h"
#include "pt_util.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double svd_s;   /* summed from the plugin's 'osft:' lines */
static void logf_(void *u, int32_t level, const char *msg) {
    (void)u;
    const char *p = strstr(msg, "(SVD ");
    if (p && strstr(msg, "osft: '")) svd_s += atof(p + 5);
    if (level <= PT_LOG_WARN) fprintf(stderr, "protrain: %s\n", msg);
}

typedef struct res {
    double fb, post, opt, step, svd;
} res;

static int run(int64_t N, int64_t M, int64_t rows, float urr, int reps, res *r) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/bench_osft_%d.ini", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "[plugin]\nbackend = host\nlog_level = info\n[memory]\ndevice_capacity = 2GiB\n"
               "[protrain]\nforce_all_persistent = true\n[osft]\nenabled = true\n"
               "unfreeze_rank_ratio = %g\ntargets = w\n",
            (double)urr);
    fclose(f);
    pt_host_v1 h = {.abi_version = PT_ABI_VERSION, .struct_size = sizeof h, .world_size = 1, .device_kind = PT_DEVICE_HOST, .log = logf_};
    void *ctx = NULL;
    if (P->init(path, &h, &ctx)) {
        fprintf(stderr, "init: %s\n", P->last_error(NULL));
        return -1;
    }
    unlink(path);
    float *w = malloc((size_t)(N * M) * 4);
    for (int64_t i = 0; i < N * M; i++) w[i] = 0.02f * (float)((i * 7919) % 201 - 100) / 100.0f;
    pt_param_v1 p = {.name = "l.w", .dtype = PT_F32, .ndim = 2, .shape = {N, M}, .block = 0, .trainable = 1, .tie = -1, .init = w};
    pt_model_v1 m = {.struct_size = sizeof m, .n_params = 1, .params = &p, .n_blocks = 1, .batch = 1, .seq = rows, .arch = "bench-osft"};
    svd_s = 0;
    int rc = P->post_model_load(ctx, &m) || P->create_optimizer(ctx, NULL);
    if (rc) fprintf(stderr, "setup: %s\n", P->last_error(ctx));
    r->svd = svd_s;
    float *x, *y, *dy, *dx;
    rc = rc || P->dev_alloc(ctx, (uint64_t)(rows * M) * 4, "act", (void **)&x) ||
         P->dev_alloc(ctx, (uint64_t)(rows * N) * 4, "act", (void **)&y) ||
         P->dev_alloc(ctx, (uint64_t)(rows * N) * 4, "act", (void **)&dy) ||
         P->dev_alloc(ctx, (uint64_t)(rows * M) * 4, "act", (void **)&dx);
    if (!rc) {
        for (int64_t i = 0; i < rows * M; i++) x[i] = 0.01f * (float)(i % 97);
        for (int64_t i = 0; i < rows * N; i++) dy[i] = 1e-3f * (float)(i % 89 - 44);
    }
    double *fb = calloc((size_t)reps, 8), *po = calloc((size_t)reps, 8),
           *op = calloc((size_t)reps, 8), *sp = calloc((size_t)reps, 8);
    for (int s = 0; s <= reps && !rc; s++) {
        double t0 = pt_now_s();
        rc = P->set_lr(ctx, 1e-4f) || P->pre_step(ctx, s, 0, 1) || P->block_pre_forward(ctx, 0);
        double a = pt_now_s();
        rc = rc || P->osft_linear_forward(ctx, 0, x, y, rows) || P->block_post_forward(ctx, 0) ||
             P->block_pre_backward(ctx, 0) || P->osft_linear_backward(ctx, 0, x, dy, dx, rows);
        double b = pt_now_s();
        rc = rc || P->block_post_backward(ctx, 0);
        double c = pt_now_s();
        rc = rc || P->optimizer_step(ctx, -1.0f) || P->post_step(ctx, s, 0.0f);
        double d = pt_now_s();
        if (s) {   /* step 0 warms up */
            fb[s - 1] = b - a;
            po[s - 1] = c - b;
            op[s - 1] = d - c;
            sp[s - 1] = d - t0;
        }
    }
    if (rc) fprintf(stderr, "step: %s\n", P->last_error(ctx));
    if (!rc) {
        r->fb = median(fb, reps);
        r->post = median(po, reps);
        r->opt = median(op, reps);
        r->step = median(sp, reps);
    }
    free(fb), free(po), free(op), free(sp);
    P->dev_free(ctx, x), P->dev_free(ctx, y), P->dev_free(ctx, dy), P->dev_free(ctx, dx);
    P->finalize(ctx);
    free(w);
    return rc ? -1 : 0;
}

/* the dense layer's three GEMMs */
static double dense(int64_t N, int64_t M, int64_t rows, int reps) {
    float *x = malloc((size_t)(rows * M) * 4), *y = malloc((size_t)(rows * N) * 4),
          *w = malloc((size_t)(N * M) * 4), *dw = calloc((size_t)(N * M), 4),
          *dx = malloc((size_t)(rows * M) * 4), *dy = malloc((size_t)(rows * N) * 4);
    for (int64_t i = 0; i < rows * M; i++) x[i] = 0.01f * (float)(i % 97);
    for (int64_t i = 0; i < rows * N; i++) dy[i] = 1e-3f * (float)(i % 89 - 44);
    for (int64_t i = 0; i < N * M; i++) w[i] = 0.001f * (float)(i % 13);
    double *t = calloc((size_t)reps, 8);
    for (int s = 0; s <= reps; s++) {
        double a = pt_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)N, (int)M, 1.0f, x,
                    (int)M, w, (int)M, 0.0f, y, (int)N);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)M, (int)N, 1.0f,
                    dy, (int)N, w, (int)M, 0.0f, dx, (int)M);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)M, (int)rows, 1.0f, dy,
                    (int)N, x, (int)M, 1.0f, dw, (int)M);
        if (s) t[s - 1] = pt_now_s() - a;
    }
    double r = median(t, reps);
    free(x), free(y), free(w), free(dw), free(dx), free(dy), free(t);
    return r;
}

/* dx of one backward: the hook's two-branch products vs the fused ones with
 * their copies; median seconds of each into *two, *one. */
static void dx_fused(int64_t N, int64_t M, int64_t rows, float urr, int reps, double *two,
                     double *one) {
    int R = (int)(N < M ? N : M), k = (int)((double)R * (1.0 - urr)), kl = R - k;
    int n = (int)N, m = (int)M, r = (int)rows;
    float *dy = malloc((size_t)(rows * N) * 4), *uh = malloc((size_t)(N * k) * 4 + 4),
          *ul = malloc((size_t)(N * kl) * 4), *vh = malloc((size_t)(k * M) * 4 + 4),
          *vl = malloc((size_t)(kl * M) * 4), *e = malloc((size_t)(rows * R) * 4),
          *dx = malloc((size_t)(rows * M) * 4), *vc = malloc((size_t)(R * M) * 4),
          *uc = malloc((size_t)(N * R) * 4);
    for (int64_t i = 0; i < rows * N; i++) dy[i] = 1e-3f * (float)(i % 89 - 44);
    for (int64_t i = 0; i < N * k; i++) uh[i] = 0.01f * (float)(i % 13);
    for (int64_t i = 0; i < N * kl; i++) ul[i] = 0.01f * (float)(i % 11);
    for (int64_t i = 0; i < k * M; i++) vh[i] = 0.01f * (float)(i % 7);
    for (int64_t i = 0; i < kl * M; i++) vl[i] = 0.01f * (float)(i % 5);
    double *t2 = calloc((size_t)reps, 8), *t1 = calloc((size_t)reps, 8);
    for (int s = 0; s <= reps; s++) {
        double a = pt_now_s();
        float *h = e + (size_t)r * kl;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, kl, n, 1.0f, dy, n, ul, kl,
                    0.0f, e, kl);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, k, n, 1.0f, dy, n, uh, k, 0.0f,
                    h, k);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, m, kl, 1.0f, e, kl, vl, m, 0.0f,
                    dx, m);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, m, k, 1.0f, h, k, vh, m, 1.0f,
                    dx, m);
        double b = pt_now_s();
        memcpy(vc, vl, (size_t)kl * (size_t)m * 4);
        memcpy(vc + (size_t)kl * (size_t)m, vh, (size_t)k * (size_t)m * 4);
        for (int i = 0; i < n; i++) {
            memcpy(uc + (size_t)i * R, ul + (size_t)i * kl, (size_t)kl * 4);
            memcpy(uc + (size_t)i * R + kl, uh + (size_t)i * k, (size_t)k * 4);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, R, n, 1.0f, dy, n, uc, R, 0.0f,
                    e, R);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, m, R, 1.0f, e, R, vc, m, 0.0f,
                    dx, m);
        double c = pt_now_s();
        if (s) {
            t2[s - 1] = b - a;
            t1[s - 1] = c - b;
        }
    }
    *two = median(t2, reps);
    *one = median(t1, reps);
    free(dy), free(uh), free(ul), free(vh), free(vl), free(e), free(dx), free(vc), free(uc);
    free(t2), free(t1);
}

enum { BLOCKS = 4,
       DN = 512,
       DROWS = 256 };

/* The BLOCKS-block model streamed with clipping: median optimizer_step and step
 * seconds with defer_cpu_steps on or off. */
static int run_defer(int defer, int reps, double *opt, double *step) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/bench_osft_d_%d.ini", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "[plugin]\nbackend = host\nlog_level = warn\n[memory]\ndevice_capacity = 2GiB\n"
               "[protrain]\nauto_memory = false\nn_persist = 0\nn_buffer = 2\nn_swap = 0\n"
               "n_checkpoint = 0\nchunk_size = 4MiB\ndefer_cpu_steps = %s\n"
               "[optimizer]\nmax_grad_norm = 1e6\n[osft]\nenabled = true\n"
               "unfreeze_rank_ratio = 0.25\ntargets = w\n",
            defer ? "true" : "false");
    fclose(f);
    pt_host_v1 h = {.abi_version = PT_ABI_VERSION, .struct_size = sizeof h, .world_size = 1, .device_kind = PT_DEVICE_HOST, .log = logf_};
    void *ctx = NULL;
    if (P->init(path, &h, &ctx)) {
        fprintf(stderr, "init: %s\n", P->last_error(NULL));
        return -1;
    }
    unlink(path);
    static char names[BLOCKS][16];
    pt_param_v1 p[BLOCKS];
    float *w = malloc((size_t)BLOCKS * DN * DN * 4);
    for (int64_t i = 0; i < (int64_t)BLOCKS * DN * DN; i++)
        w[i] = 0.02f * (float)((i * 7919) % 201 - 100) / 100.0f;
    for (int b = 0; b < BLOCKS; b++) {
        snprintf(names[b], sizeof names[b], "b%d.w", b);
        p[b] = (pt_param_v1){.name = names[b], .dtype = PT_F32, .ndim = 2, .shape = {DN, DN}, .block = b, .trainable = 1, .tie = -1, .init = w + (size_t)b * DN * DN};
    }
    pt_model_v1 m = {.struct_size = sizeof m, .n_params = BLOCKS, .params = p, .n_blocks = BLOCKS, .batch = 1, .seq = DROWS, .arch = "bench-osft-defer"};
    int rc = P->post_model_load(ctx, &m) || P->create_optimizer(ctx, NULL);
    if (rc) fprintf(stderr, "setup: %s\n", P->last_error(ctx));
    float *x = NULL, *y = NULL, *dy = NULL, *dx = NULL;
    rc = rc || P->dev_alloc(ctx, (uint64_t)DROWS * DN * 4, "act", (void **)&x) ||
         P->dev_alloc(ctx, (uint64_t)DROWS * DN * 4, "act", (void **)&y) ||
         P->dev_alloc(ctx, (uint64_t)DROWS * DN * 4, "act", (void **)&dy) ||
         P->dev_alloc(ctx, (uint64_t)DROWS * DN * 4, "act", (void **)&dx);
    if (!rc)
        for (int64_t i = 0; i < (int64_t)DROWS * DN; i++) {
            x[i] = 0.01f * (float)(i % 97);
            dy[i] = 1e-3f * (float)(i % 89 - 44);
        }
    double *op = calloc((size_t)reps, 8), *sp = calloc((size_t)reps, 8);
    for (int s = 0; s <= reps && !rc; s++) {
        double t0 = pt_now_s();
        rc = P->set_lr(ctx, 1e-4f) || P->pre_step(ctx, s, 0, 1);
        for (int b = 0; b < BLOCKS && !rc; b++)
            rc = P->block_pre_forward(ctx, b) || P->osft_linear_forward(ctx, b, x, y, DROWS) ||
                 P->block_post_forward(ctx, b);
        for (int b = BLOCKS - 1; b >= 0 && !rc; b--)
            rc = P->block_pre_backward(ctx, b) ||
                 P->osft_linear_backward(ctx, b, x, dy, dx, DROWS) ||
                 P->block_post_backward(ctx, b);
        double c = pt_now_s();
        rc = rc || P->optimizer_step(ctx, -1.0f);
        double d = pt_now_s();
        rc = rc || P->post_step(ctx, s, 0.0f);
        if (s) {
            op[s - 1] = d - c;
            sp[s - 1] = pt_now_s() - t0;
        }
    }
    if (rc) fprintf(stderr, "step: %s\n", P->last_error(ctx));
    else {
        *opt = median(op, reps);
        *step = median(sp, reps);
    }
    free(op), free(sp);
    P->dev_free(ctx, x), P->dev_free(ctx, y), P->dev_free(ctx, dy), P->dev_free(ctx, dx);
    P->finalize(ctx);
    free(w);
    return rc ? -1 : 0;
}

int main(void) {
    const char *e = getenv("PT_BENCH_REPS");
    int reps = e && atoi(e) >= 3 ? atoi(e) : 7;
    int strict = getenv("PT_BENCH_STRICT") && atoi(getenv("PT_BENCH_STRICT"));
    static const int64_t shapes[][3] = {{768, 768, 1024}, {3072, 768, 1024}, {768, 3072, 1024}};
    static const float urrs[] = {0.25f, 0.5f, 1.0f};
    int missed = 0;
    printf("OSFT factorised linear layer (hooks, host backend) vs dense sgemm; median of %d\n",
           reps);
    printf("%-18s %5s %10s %10s %7s %9s %8s %7s %7s\n", "N x M, rows", "URR", "fwd+bwd",
           "dense", "ratio", "flop-ratio", "SVD s", "post%", "optim%");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t N = shapes[i][0], M = shapes[i][1], rows = shapes[i][2];
        double d = dense(N, M, rows, reps);
        double R = (double)(N < M ? N : M), fr = R * (double)(N + M) / ((double)N * (double)M);
        for (size_t u = 0; u < sizeof urrs / sizeof urrs[0]; u++) {
            res r;
            if (run(N, M, rows, urrs[u], reps, &r)) return 1;
            char shp[32];
            snprintf(shp, sizeof shp, "%lldx%lld, %lld", (long long)N, (long long)M,
                     (long long)rows);
            double ratio = r.fb / d;
            printf("%-18s %5.2f %8.2f ms %8.2f ms %7.2f %9.2f %8.3f %6.1f%% %6.1f%%\n", shp,
                   (double)urrs[u], 1e3 * r.fb, 1e3 * d, ratio, fr, r.svd, 100 * r.post / r.step,
                   100 * r.opt / r.step);
            if (N == M && ratio > 1.6 * fr) {
                printf("  goal missed: %.2f > 1.6 x the FLOP ratio %.2f\n", ratio, fr);
                missed = 1;
            }
        }
    }
    printf("dx of one backward, OpenBLAS in this process: two-branch GEMMs (the hook) vs "
           "fused over copied factors\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t u = 0; u < 2; u++) {
            double two, one;
            dx_fused(shapes[i][0], shapes[i][1], shapes[i][2], urrs[u], reps, &two, &one);
            printf("  %lldx%lld, %lld  URR %.2f: two-branch %.2f ms, fused %.2f ms (%.2f)\n",
                   (long long)shapes[i][0], (long long)shapes[i][1], (long long)shapes[i][2],
                   (double)urrs[u], 1e3 * two, 1e3 * one, one / two);
        }
    double o1, s1, o0, s0;
    if (run_defer(1, reps, &o1, &s1) || run_defer(0, reps, &o0, &s0)) return 1;
    printf("deferred CPU steps with OSFT (%d blocks of %dx%d, URR 0.25, streamed, clipped):\n"
           "  optimizer_step %.2f ms deferred vs %.2f ms waited (%.2f); step %.2f ms vs %.2f ms\n",
           BLOCKS, DN, DN, 1e3 * o1, 1e3 * o0, o1 / o0, 1e3 * s1, 1e3 * s0);
    if (o1 > 0.5 * o0) {
        printf("  goal missed: deferred optimizer_step %.2f ms > half of %.2f ms\n", 1e3 * o1,
               1e3 * o0);
        missed = 1;
    }
    if (missed && strict) return 1;
    return 0;
}
