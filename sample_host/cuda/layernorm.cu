// layernorm.cu — LayerNorm forward and backward on the stream (shapes and
// accumulation rules as sh_layers_layernorm_fwd/bwd). One warp per row for the row-wise
// parts (butterfly sums: fixed order), a column kernel for dw/db.
#include "cuda/shc.cuh"

// out (N,C) = (x - mean) * rstd * w + b per row; mean, rstd (N) saved for backward.
__global__ void k_ln_fwd(float *out, float *mean, float *rstd, const float *inp,
                         const float *w, const float *b, int N, int C) {
    size_t n = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= (size_t)N) return; // whole warps leave together: n is per warp
    int lane = threadIdx.x & 31;
    const float *x = inp + n * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = shc_warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = x[c] - m;
        v += d * d;
    }
    v = shc_warp_sum(v) / (float)C;
    float r = sh_ln_rstd(v);
    float *o = out + n * C;
    for (int c = lane; c < C; c += 32) o[c] = sh_ln_out(x[c], m, r, w[c], b[c]);
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = r;
    }
}

void shc_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int N, int C) {
    shc_ctx *c = shc(ctx);
    if (N < 1) return;
    k_ln_fwd<<<shc_row_grid((size_t)N), 256, 0, c->s>>>(out, mean, rstd, inp, w, b, N, C);
    SHC_LAUNCHED(c, "layernorm_fwd");
}

// dinp (N,C) += (dxh - mean_c(dxh) - xh * mean_c(dxh * xh)) * rstd, dxh = dy * w.
__global__ void k_ln_bwd_dx(float *dinp, const float *dout, const float *inp, const float *w,
                            const float *mean, const float *rstd, int N, int C) {
    size_t n = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= (size_t)N) return;
    int lane = threadIdx.x & 31;
    const float *x = inp + n * C, *dy = dout + n * C;
    float m = mean[n], r = rstd[n];
    float a = 0.0f, bs = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dxh = dy[c] * w[c];
        a += dxh;
        bs += dxh * sh_ln_xhat(x[c], m, r);
    }
    a = shc_warp_sum(a) / (float)C;
    bs = shc_warp_sum(bs) / (float)C;
    float *dx = dinp + n * C;
    for (int c = lane; c < C; c += 32)
        dx[c] += sh_ln_dx(dy[c] * w[c], a, sh_ln_xhat(x[c], m, r), bs, r);
}

// dw[c] += sum_n dy * xh, db[c] += sum_n dy: block (32, 8) owns 32 columns; thread
// row y sums rows y, y+8, ... in order, then row 0 adds the 8 partials in order and
// adds the total into the gradient once (the "sum, then one add" rule of layers.c).
__global__ void k_ln_bwd_wb(float *dw, float *db, const float *dout, const float *inp,
                            const float *mean, const float *rstd, int N, int C) {
    __shared__ float sw[8][33], sb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (int n = threadIdx.y; n < N; n += 8) {
            float dy = dout[(size_t)n * C + c];
            aw += dy * sh_ln_xhat(inp[(size_t)n * C + c], mean[n], rstd[n]);
            ab += dy;
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < 8; k++) {
            tw += sw[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
        }
        dw[c] += tw;
        db[c] += tb;
    }
}

void shc_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, const float *mean, const float *rstd,
                       int N, int C) {
    shc_ctx *c = shc(ctx);
    if (N < 1) return;
    if (dinp) {
        k_ln_bwd_dx<<<shc_row_grid((size_t)N), 256, 0, c->s>>>(dinp, dout, inp, w, mean, rstd,
                                                               N, C);
        SHC_LAUNCHED(c, "layernorm_bwd (dx)");
    }
    k_ln_bwd_wb<<<(C + 31) / 32, dim3(32, 8), 0, c->s>>>(dw, db, dout, inp, mean, rstd, N, C);
    SHC_LAUNCHED(c, "layernorm_bwd (dw, db)");
}
