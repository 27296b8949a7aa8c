/*
 * sh_elem.h — element-wise math shared by the CPU layers (layers.c), the no-plugin
 * AdamW (train.c) and the CUDA kernels (sample_host/cuda/). One definition of each
 * formula, so the CPU and the GPU round the same expressions in the same order:
 * the CPU build is ISO C11 (no FMA contraction) and the CUDA build uses -fmad=false,
 * so a*b+c is two roundings on both. Differences left between devices come from the
 * math libraries (expf, sqrtf and division are correctly rounded or nearly so on both,
 * but expf may differ in the last bit) and from reduction order, not from these.
 *
 * SH_HD marks a function callable from host and device code; in plain C it is an
 * ordinary static inline function.
 */
#ifndef SH_ELEM_H
#define SH_ELEM_H

#include <math.h>

#ifdef __CUDACC__
#define SH_HD static __host__ __device__ __forceinline__
#else
#define SH_HD static inline
#endif

#define SH_LN_EPS 1e-5f
#define SH_GELU_S 0.7978845608028654f /* sqrt(2/pi) */
#define SH_GELU_A 0.044715f

/* GELU, tanh approximation, written with 0.5 (1 + tanh u) = sigmoid(2u) (expf is much
 * cheaper than tanhf): gelu(x) = x * s, s = 1 / (1 + exp(-2u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3). */
SH_HD float sh_gelu(float x) {
    float u = SH_GELU_S * (x + SH_GELU_A * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

/* d gelu / dx = s + x * 2 s (1 - s) * du/dx, du/dx = sqrt(2/pi) (1 + 3*0.044715 x^2)
 * (s(1-s) is the sigmoid's derivative; 2 from the argument 2u). */
SH_HD float sh_gelu_grad(float x) {
    float u = SH_GELU_S * (x + SH_GELU_A * x * x * x);
    float s = 1.0f / (1.0f + expf(-2.0f * u));
    float du = SH_GELU_S * (1.0f + 3.0f * SH_GELU_A * x * x);
    return s + 2.0f * x * s * (1.0f - s) * du;
}

/* LayerNorm of one row: rstd from the (biased) variance v, the normalised value
 * xh = (x - mean) * rstd, and the output xh * w + b. */
SH_HD float sh_ln_rstd(float var) { return 1.0f / sqrtf(var + SH_LN_EPS); }
SH_HD float sh_ln_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }
SH_HD float sh_ln_out(float x, float mean, float rstd, float w, float b) {
    return (x - mean) * rstd * w + b;
}
/* Input gradient of one element: with dxh = dy * w, a = mean_c(dxh) and
 * bsum = mean_c(dxh * xh) over the row, dx = (dxh - a - xh * bsum) * rstd. */
SH_HD float sh_ln_dx(float dxh, float a, float xh, float bsum, float rstd) {
    return (dxh - a - xh * bsum) * rstd;
}

/* Softmax backward of one causal attention entry: p (dp - sum_j p_j dp_j) * scale. */
SH_HD float sh_softmax_bwd(float p, float dp, float dot, float scale) {
    return p * (dp - dot) * scale;
}

/* Cross-entropy backward of one logit: (p - [i == y]) * dloss. */
SH_HD float sh_xent_grad(float p, int is_target, float dloss) {
    return (p - (is_target ? 1.0f : 0.0f)) * dloss;
}

/* AdamW constants of one step, computed once per step in float on the host
 * (sh_train.h gives the formulas): 1-b1, 1-b2, lr*wd, lr/bc1 and bc2r. */
typedef struct sh_adamw_k {
    float b1, omb1, b2, omb2, lrwd, step, bc2r, eps;
} sh_adamw_k;

/* One element: g already scaled by the clip factor.
 *   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g; p = p - (lr wd) p (not
 *   p (1 - lr wd): that factor rounded in float decays 19% too much at
 *   lr wd = 1e-7);
 *   p = p - (lr/bc1) m / (sqrtf(v) bc2r + eps). */
SH_HD void sh_adamw_elem(float *p, float *m, float *v, float g, const sh_adamw_k *k) {
    float mi = k->b1 * *m + k->omb1 * g;
    float vi = k->b2 * *v + k->omb2 * g * g;
    *m = mi;
    *v = vi;
    float pp = *p - k->lrwd * *p;
    *p = pp - k->step * mi / (sqrtf(vi) * k->bc2r + k->eps);
}

#endif /* SH_ELEM_H */
