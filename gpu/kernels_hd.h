/*
 * kernels_hd.h — element-wise math shared by the host path (C11) and the CUDA
 * kernels (gpu/cuda). One body per kernel so what the CPU tests check is what
 * the GPU runs.
 */
#ifndef PT_KERNELS_HD_H
#define PT_KERNELS_HD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define PT_HD __host__ __device__ __forceinline__
#else
#define PT_HD static inline
#endif

/* ---- dtype conversions ---- */

/* bf16 = top 16 bits of fp32, rounded to nearest even; NaN kept quiet (0x7fc0). */
PT_HD uint16_t pt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

PT_HD float pt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE binary16, round to nearest even, overflow -> inf, NaN kept. */
PT_HD uint16_t pt_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* >= 65520: inf */
    if (ax < 0x38800000u) {                                           /* subnormal/zero */
        if (ax < 0x33000000u) return (uint16_t)sign;                  /* < 2^-25: 0 */
        uint32_t e = ax >> 23;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                                    /* 14..24 */
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000u;                                    /* rebias 127->15 */
    uint32_t rem = r & 0x1fffu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

PT_HD float pt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t u;
    if (e == 0) {
        if (m == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            e = 1;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            m &= 0x3ffu;
            u = sign | ((e + 112u) << 23) | (m << 13);
        }
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* dtype codes match pt_dtype in host_api/protrain.h: 0 f32, 1 bf16, 2 f16, 3 u8.
 * u8 (opaque frozen bytes) never reaches an element kernel: it has no gradient
 * and no optimizer state, and every backend op refuses it. Loading one reads
 * the byte's value so a stray use stays inside the array. */
PT_HD float pt_load_elem(const void *p, int dtype, size_t i) {
    if (dtype == 1) return pt_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dtype == 2) return pt_f16_to_f32(((const uint16_t *)p)[i]);
    if (dtype == 3) return (float)((const unsigned char *)p)[i];
    return ((const float *)p)[i];
}

PT_HD void pt_store_elem(void *p, int dtype, size_t i, float v) {
    if (dtype == 1) ((uint16_t *)p)[i] = pt_f32_to_bf16(v);
    else if (dtype == 2) ((uint16_t *)p)[i] = pt_f32_to_f16(v);
    else ((float *)p)[i] = v;
}

PT_HD size_t pt_dtype_size(int dtype) { return dtype == 0 ? 4u : dtype == 3 ? 1u
                                                                            : 2u; }

/* ---- AdamW element body ----
 * Decoupled weight decay (PyTorch AdamW order, decay uses the old p):
 *   g  = grad * grad_scale
 *   m  = b1*m + (1-b1)*g
 *   v  = b2*v + (1-b2)*g^2
 *   p  = p - lr*wd*p
 *   p  = p - (lr/bc1) * m / (sqrt(v)*bc2_rsqrt + eps)
 * where bc1 = 1-b1^t and bc2_rsqrt = 1/sqrt(1-b2^t); equal to m_hat/(sqrt(v_hat)+eps).
 * The step constants are precomputed once per step by the caller.
 * The decay is p - (lr*wd)*p, not p*(1 - lr*wd): fp32 spaces its values below
 * 1 by 6e-8, so 1 - lr*wd rounded there decays 19% more than asked at
 * lr*wd = 1e-7 (lr 1e-5, wd 0.01, a usual fine-tuning setting) and 1.3% more at
 * 1e-6; lr*wd itself is rounded relative to its size (error < 6e-8 of it).
 */
typedef struct pt_adamw_consts {
    float b1, one_minus_b1, b2, one_minus_b2;
    float lrwd;         /* lr*wd */
    float step_size;    /* lr / bc1 */
    float bc2_rsqrt, eps, grad_scale;
} pt_adamw_consts;

PT_HD pt_adamw_consts pt_adamw_make_consts(float lr, float b1, float b2, float eps, float wd,
                                           float bc1, float bc2_rsqrt, float grad_scale) {
    pt_adamw_consts c;
    c.b1 = b1;
    c.one_minus_b1 = 1.0f - b1;
    c.b2 = b2;
    c.one_minus_b2 = 1.0f - b2;
    c.lrwd = lr * wd;
    c.step_size = lr / bc1;
    c.bc2_rsqrt = bc2_rsqrt;
    c.eps = eps;
    c.grad_scale = grad_scale;
    return c;
}

PT_HD float pt_adamw_elem(const pt_adamw_consts *c, float p, float g, float *m, float *v) {
    g *= c->grad_scale;
    float mm = c->b1 * *m + c->one_minus_b1 * g;
    float vv = c->b2 * *v + c->one_minus_b2 * g * g;
    *m = mm;
    *v = vv;
    p = p - c->lrwd * p;
    return p - c->step_size * mm / (sqrtf(vv) * c->bc2_rsqrt + c->eps);
}

/* Bias-correction terms for step t (1-based), computed in double for accuracy. */
static inline void pt_adamw_bias(float b1, float b2, int64_t t, float *bc1, float *bc2_rsqrt) {
    *bc1 = (float)(1.0 - pow((double)b1, (double)t));
    *bc2_rsqrt = (float)(1.0 / sqrt(1.0 - pow((double)b2, (double)t)));
}

/* ---- per-column scaling and column dot products (OSFT's singular values) ---- */

/* One element of x diag(s): the factorised layer's (x V^T) * S. */
PT_HD float pt_colscale_elem(float x, float s) { return x * s; }

/* Column j of acc += sum_i x[i][j] * y[i][j], rows in ascending order, one fp32
 * rounding per product and per add (no contraction: the CUDA build uses
 * -fmad=false), so the host loop and a thread per column give the same bits. */
PT_HD float pt_coldot_col(const float *x, const float *y, int64_t rows, int64_t ld, int64_t j,
                          float acc) {
    float sum = 0.0f;
    for (int64_t i = 0; i < rows; i++) {
        float p = x[i * ld + j] * y[i * ld + j];
        sum = sum + p;
    }
    return acc + sum;
}

/* ---- REKLS element bodies (runtime/optim/rekls.c runs the step) ----
 * Every REKLS kernel that is not a GEMM or an eigendecomposition is one of
 * these, run over a flat range by pt_rekls_ew_range (gpu/rekls_ew.h) on the
 * CPU and the host backend, and by the same bodies in the CUDA kernels. */

/* KL factor update weight of the other factor's eigenvalue lam:
 * 1 / (dim * max(lam, eps)) (dim = that factor's size; eps also floors the
 * eigenvalues, which may come out slightly negative). */
PT_HD float pt_rekls_inv_elem(float lam, float dim, float eps) {
    float l = lam > eps ? lam : eps;
    return 1.0f / (dim * l);
}

/* lerp(x, y, w) = x + w (y - x): the exponential averages of the factors and
 * the Adam moments (1 - w is the decay). */
PT_HD float pt_rekls_lerp_elem(float x, float y, float w) { return x + w * (y - x); }

/* Adam in the eigenbasis for one element g (rotated gradient):
 *   m = lerp(m, g, 1-b1), v = lerp(v, g^2, 1-b2),
 *   u = (m / bc1) / (sqrt(v / bc2) + eps)   (bc_i = 1 - b_i^k). Returns u. */
PT_HD float pt_rekls_adam_elem(float g, float *m, float *v, float omb1, float omb2, float bc1,
                               float bc2, float eps) {
    float mm = pt_rekls_lerp_elem(*m, g, omb1);
    float vv = pt_rekls_lerp_elem(*v, g * g, omb2);
    *m = mm;
    *v = vv;
    return (mm / bc1) / (sqrtf(vv / bc2) + eps);
}

/* l2 decay into the gradient: g + wd * w (two roundings, no fused multiply-add,
 * as every body here). */
PT_HD float pt_rekls_axpy_elem(float g, float w, float wd) { return g + wd * w; }

/* Decay then the step: p = p - c*p (c = lr*wd, wd or lr^2*wd by mode);
 * p = p - lr*d. */
PT_HD float pt_rekls_apply_elem(float p, float d, float lr, float lrwd) {
    p = p - lrwd * p;
    return p - lr * d;
}

#endif /* PT_KERNELS_HD_H */
