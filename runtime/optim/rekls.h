/*
 * rekls.h — REKLS: Adam run in the eigenbasis of two Kronecker factors that are
 * averaged with the KL-Shampoo rule, the eigenbasis recomputed by a full
 * symmetric eigendecomposition every step after the current gradient has been
 * folded in. One step for a 2-D parameter W [m x n] with gradient G (k = t + 1):
 *
 *  1. G = float(grad) * grad_scale (clipping / averaging).
 *  2. factor weight w = 1 - beta_hat = (1 - bs) / (1 - bs^k)  (bias-corrected
 *     average: w = 1 at k = 1).
 *  3. KL factor update from the PREVIOUS step's bases and eigenvalues (both
 *     increments computed before either factor changes, and crossed: L's uses
 *     R's eigensystem and R's size n, R's uses L's and m):
 *       C_R = Q_R diag(1 / (n max(lam_R, eps))) Q_R^T,  X_L = G C_R G^T,
 *       C_L = Q_L diag(1 / (m max(lam_L, eps))) Q_L^T,  X_R = G^T C_L G,
 *       L = lerp(L, X_L, w),  R = lerp(R, X_R, w).
 *     At k = 1 (Q = I, lam = 0) that is L = G G^T / (n eps): the first gradient
 *     dominates the factors for hundreds of steps. seed_shampoo replaces step 1
 *     by plain Shampoo outer products L = G G^T / n, R = G^T G / m.
 *  4. M_w = Q_L M Q_R^T (first moment back to weight coordinates);
 *     (lam_L, Q_L) = eigh(L), (lam_R, Q_R) = eigh(R), sorted descending
 *     (fp32, retried in fp64); M = Q_L^T M_w Q_R. V is NOT rotated: slot i
 *     keeps meaning "i-th largest eigenvalue".
 *  5. weight decay (skipped when wd = 0), one of four modes (pt_rekls_wd):
 *     decoupled W -= lr wd W; independent W -= wd W; palm W -= lr^2 wd W
 *     (these three shrink W together with step 9, which reads no W); l2
 *     G += wd W, here, after the factor update: the Adam moments see the
 *     decay, the Kronecker factors do not (they stay statistics of the
 *     loss gradient alone, so the eigenbasis does not drift towards W).
 *  6-9. G~ = Q_L^T G Q_R; M = lerp(M, G~, 1-b1), V = lerp(V, G~^2, 1-b2);
 *     U = (M / (1-b1^k)) / (sqrt(V / (1-b2^k)) + eps); D = Q_L U Q_R^T;
 *     W = W - c W - lr D (c the decay of step 5, 0 for l2). eps is used
 *     twice: the eigenvalue floor of step 3 and the Adam denominator.
 *
 * The step is written once against a table of operations (pt_rekls_la): the CPU
 * optimizer runs it with pt_rekls_la_cpu (OpenBLAS / LAPACKE on the calling
 * thread), resident chunks with a table whose entries queue the backend's
 * gemm_f32 / eigh / rekls_ew ops on a stream. Same calls in the same order, and on
 * the host backend the same functions underneath: the two paths give the same
 * bits.
 *
 * State per parameter: M, V [m x n] (the chunk's Adam moment slots, in eigen
 * coordinates) and the aux block pt_rekls_aux_words(m, n) fp32 words:
 *   L [m x m], R [n x n], Q_L [m x m], Q_R [n x n], lam_L [m], lam_R [n]
 * initialised by pt_rekls_aux_init_host (zeros, identity bases). Scratch per
 * running step: pt_rekls_ws_words(m, n) fp32 words.
 */
#ifndef PT_REKLS_H
#define PT_REKLS_H

#include <stddef.h>
#include <stdint.h>

#include "gpu.h"

/* Largest factor side REKLS takes: a factor is d x d fp32 four times over
 * (factor, basis, and two d x d scratch), and eigh is O(d^3) every step. */
#define PT_REKLS_MAX_DIM 8192

typedef struct pt_rekls_la {
    void *ctx;
    int (*gemm)(void *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                int lda, const float *B, int ldb, float beta, float *C, int ldc);
    /* in-place, descending (see gpu.h eigh); a non-zero return is a failure to
     * queue or to decompose */
    int (*eigh)(void *ctx, int n, float *A, float *w);
    int (*ew)(void *ctx, const pt_rekls_ew_args *a);
    int (*copy)(void *ctx, float *dst, const float *src, size_t n);
} pt_rekls_la;

/* The CPU table (ctx unused: NULL). */
extern const pt_rekls_la pt_rekls_la_cpu;

/* A table whose ops queue the backend's gemm_f32 / eigh / rekls_ew / memcpy (D2D)
 * on stream s, for tensors in device memory. eigh failures land in *status
 * (device int, zeroed by the caller) and show only after the stream has run. */
typedef struct pt_rekls_dev {
    const pt_gpu_backend *ops;
    void *impl;
    pt_stream *s;
    int *status;
} pt_rekls_dev;
/* Fills *la with ctx = d (which must outlive the table's use). NULL ops in the
 * backend: returns PT_ERR_UNSUPPORTED with a sentence. */
int pt_rekls_la_device(pt_rekls_dev *d, pt_rekls_la *la, char *err, size_t errlen);

/* Weight-decay modes ([optimizer] rekls_weight_decay_method). */
typedef enum pt_rekls_wd {
    PT_REKLS_WD_DECOUPLED = 0,   /* W -= lr wd W */
    PT_REKLS_WD_INDEPENDENT = 1, /* W -= wd W (not scaled by the learning rate) */
    PT_REKLS_WD_L2 = 2,          /* G += wd W after the factor update */
    PT_REKLS_WD_PALM = 3         /* W -= lr^2 wd W */
} pt_rekls_wd;

typedef struct pt_rekls_hyper {
    float lr, beta1, beta2, eps, weight_decay;
    float shampoo_beta;
    int seed_shampoo;
    int64_t k;            /* 1-based step */
    float grad_scale;
    int wd_mode;          /* pt_rekls_wd */
} pt_rekls_hyper;

/* The factor c of W -= c W in the update (step 9): lr wd, wd or lr^2 wd
 * (rounded once from double), 0 for l2 (its decay is in the gradient) and
 * for wd = 0. */
float pt_rekls_decay(const pt_rekls_hyper *h);

typedef struct pt_rekls_tensors {
    int m, n;
    const void *grad;     /* [m x n] grad_dtype */
    int grad_dtype;
    float *param;         /* [m x n] fp32 weights (master for 16-bit params) */
    void *param_out;      /* [m x n] compute-dtype copy to write, or NULL */
    int out_dtype;
    float *M, *V;         /* [m x n] moments in eigen coordinates */
    float *aux;           /* [pt_rekls_aux_words] */
    float *ws;            /* [pt_rekls_ws_words] scratch */
} pt_rekls_tensors;

/* 2mn + 2m^2 + 2n^2 + m + n is the whole state; the aux block is the part
 * beyond the two moments: 2m^2 + 2n^2 + m + n. */
uint64_t pt_rekls_aux_words(uint64_t m, uint64_t n);
/* Scratch: G and T [m x n], C and X [max(m,n)^2]. */
uint64_t pt_rekls_ws_words(uint64_t m, uint64_t n);
/* Zero factors and eigenvalues, identity bases (host memory). */
void pt_rekls_aux_init_host(float *aux, int m, int n);
/* Views into the aux block. */
typedef struct pt_rekls_view {
    float *L, *R, *QL, *QR, *lamL, *lamR;
} pt_rekls_view;
pt_rekls_view pt_rekls_aux_view(float *aux, int m, int n);

/* One step (see top). Returns 0, or the first non-zero status of an op; err
 * names the op (one sentence). */
int pt_rekls_step(const pt_rekls_la *la, const pt_rekls_hyper *h, const pt_rekls_tensors *x,
                  char *err, size_t errlen);

/* Steps 2-8 alone, for variants that assemble the gradient and the factors
 * themselves (rekls_tp.c): G [m x n] holds the scaled fp32 gradient, s the
 * factors and the previous step's bases and eigenvalues; W [m x n] the fp32
 * weights, read only for l2 decay (may be NULL otherwise); on return G holds
 * the update D (W -= pt_rekls_decay W + lr D is the caller's). T [mn], C, X
 * [max(m,n)^2] scratch. */
int pt_rekls_core(const pt_rekls_la *la, const pt_rekls_hyper *h, int m, int n,
                  pt_rekls_view s, float *M, float *V, float *G, const float *W, float *T,
                  float *C, float *X, char *err, size_t errlen);

/* FLOPs of one step (the GEMMs; 2 per multiply-add) and a rough eigh count
 * (9 d^3 per side, divide-and-conquer with vectors), for the cost model. */
double pt_rekls_gemm_flops(uint64_t m, uint64_t n);
double pt_rekls_eigh_flops(uint64_t m, uint64_t n);

/* Time model of one CPU step: per call a fixed cost plus FLOPs at a rate, for
 * the 14 GEMM calls and the 2 eigh calls of a step. Fitted from two sizes each
 * (64 and 384: small sizes are call-bound, larger ones rate-bound), best of 3. */
#define PT_REKLS_GEMM_CALLS 14
#define PT_REKLS_EIGH_CALLS 2
typedef struct pt_rekls_rates {
    double gemm_call_s, gemm_flops_per_s;
    double eigh_call_s, eigh_flops_per_s;   /* per "FLOP" of pt_rekls_eigh_flops */
} pt_rekls_rates;
/* Runs the probes on the calling thread (about 0.1 s). */
void pt_rekls_measure_rates(pt_rekls_rates *r);
/* Seconds of n_params steps whose GEMM and eigh FLOPs sum to gemm_flops and
 * eigh_flops. */
double pt_rekls_predict_s(const pt_rekls_rates *r, double n_params, double gemm_flops,
                          double eigh_flops);

#endif /* PT_REKLS_H */
