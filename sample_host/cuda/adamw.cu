// adamw.cu — the --no-plugin optimizer on the stream: global-norm clipping and the
// AdamW element update of sh_elem.h over the flat parameter layout, then zeroed
// gradients (the arithmetic sh_train.h states).
#include <math.h>

#include "cuda/shc.cuh"

#define NB 64 // blocks per parameter's squared-norm sum (fixed: the order is fixed)

// part[blockIdx.x] = sum over this block's elements of (double)g^2: thread i sums
// elements i, i + NB*256, ... in order, then a shared-memory tree of fixed shape.
__global__ void k_sqnorm_part(double *part, const float *g, size_t n) {
    __shared__ double sh[256];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        s += (double)g[i] * (double)g[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

// One thread: S_i = partials of segment i in block order, norm = sqrt(sum_i S_i) in
// segment order; scale = (float)(max / (norm + 1e-6)) when norm > max, else 1.
__global__ void k_clip_finish(const double *part, int nseg, float max_norm, double *d_norm,
                              float *scale) {
    double tot = 0.0;
    for (int i = 0; i < nseg; i++) {
        double s = 0.0;
        for (int k = 0; k < NB; k++) s += part[(size_t)i * NB + k];
        tot += s;
    }
    double norm = sqrt(tot);
    if (d_norm) *d_norm = norm;
    *scale = norm > (double)max_norm ? (float)((double)max_norm / (norm + 1e-6)) : 1.0f;
}

// Per element: g * scale (scale NULL: 1), then sh_adamw_elem.
__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n,
                        const float *scale, sh_adamw_k k) {
    float s = scale ? *scale : 1.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        sh_adamw_elem(&p[i], &m[i], &v[i], g[i] * s, &k);
}

void shc_adamw(void *ctx, float *p, float *g, float *m, float *v, size_t n,
               const size_t *seg_off, const size_t *seg_len, int nseg, float max_norm,
               const sh_adamw_k *k, double *d_norm) {
    shc_ctx *c = shc(ctx);
    const float *scale = NULL;
    if (max_norm > 0.0f && nseg > 0) {
        size_t need = (size_t)nseg * NB;
        if (c->part_n < need) {
            if (c->part) shc_check(c, cudaFree(c->part), "cudaFree"); // waits for its users
            c->part = NULL;
            c->part_n = 0;
            cudaError_t e = cudaMalloc((void **)&c->part, need * sizeof(double));
            if (e != cudaSuccess) {
                c->part = NULL;
                shc_check(c, e, "cudaMalloc (clipping partials)");
                return;
            }
            c->part_n = need;
        }
        for (int i = 0; i < nseg; i++) {
            k_sqnorm_part<<<NB, 256, 0, c->s>>>(c->part + (size_t)i * NB, g + seg_off[i],
                                                seg_len[i]);
            SHC_LAUNCHED(c, "gradient norm");
        }
        k_clip_finish<<<1, 1, 0, c->s>>>(c->part, nseg, max_norm, d_norm, c->scale);
        SHC_LAUNCHED(c, "gradient norm (total)");
        scale = c->scale;
    }
    k_adamw<<<shc_grid(n), SHC_THREADS, 0, c->s>>>(p, g, m, v, n, scale, *k);
    SHC_LAUNCHED(c, "adamw");
    shc_zero(ctx, g, n * sizeof(float));
}
