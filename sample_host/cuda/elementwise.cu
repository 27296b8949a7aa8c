// elementwise.cu — embeddings, GELU, residual add and the softmax cross-entropy on
// the stream (shapes as in sh_layers.h). Element formulas come from sh_elem.h, the
// ones the CPU layers use.
#include "cuda/shc.cuh"

// out (N,C)[n][c] = wte[tok[n]][c] + wpe[n % T][c]; grid-stride over N*C.
__global__ void k_encoder_fwd(float *out, const int32_t *tok, const float *wte,
                              const float *wpe, size_t NC, int T, int C) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < NC;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / (size_t)C;
        int c = (int)(i % (size_t)C);
        out[i] = wte[(size_t)tok[n] * C + c] + wpe[(n % (size_t)T) * C + c];
    }
}

void shc_encoder_fwd(void *ctx, float *out, const int32_t *tok, const float *wte,
                     const float *wpe, int B, int T, int C) {
    shc_ctx *c = shc(ctx);
    size_t NC = (size_t)B * T * C;
    k_encoder_fwd<<<shc_grid(NC), SHC_THREADS, 0, c->s>>>(out, tok, wte, wpe, NC, T, C);
    SHC_LAUNCHED(c, "encoder_fwd");
}

// Tokens repeat, so several positions add into one dwte row. One thread owns one
// channel c and walks the positions in order: race-free without atomics, and the
// additions per element happen in the CPU's order (the same floats).
__global__ void k_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                              int N, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int n = 0; n < N; n++) {
        float d = dout[(size_t)n * C + c];
        dwte[(size_t)tok[n] * C + c] += d;
        dwpe[(size_t)(n % T) * C + c] += d;
    }
}

void shc_encoder_bwd(void *ctx, float *dwte, float *dwpe, const float *dout,
                     const int32_t *tok, int B, int T, int C) {
    shc_ctx *c = shc(ctx);
    k_encoder_bwd<<<(C + 127) / 128, 128, 0, c->s>>>(dwte, dwpe, dout, tok, B * T, T, C);
    SHC_LAUNCHED(c, "encoder_bwd");
}

__global__ void k_gelu_fwd(float *out, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = sh_gelu(inp[i]);
}

// dinp may alias dout: each element is read before it is written, by one thread.
__global__ void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dinp[i] = sh_gelu_grad(inp[i]) * dout[i];
}

__global__ void k_add(float *out, const float *a, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += a[i];
}

void shc_gelu_fwd(void *ctx, float *out, const float *inp, size_t n) {
    shc_ctx *c = shc(ctx);
    k_gelu_fwd<<<shc_grid(n), SHC_THREADS, 0, c->s>>>(out, inp, n);
    SHC_LAUNCHED(c, "gelu_fwd");
}

void shc_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n) {
    shc_ctx *c = shc(ctx);
    k_gelu_bwd<<<shc_grid(n), SHC_THREADS, 0, c->s>>>(dinp, inp, dout, n);
    SHC_LAUNCHED(c, "gelu_bwd");
}

void shc_add_inplace(void *ctx, float *out, const float *a, size_t n) {
    shc_ctx *c = shc(ctx);
    k_add<<<shc_grid(n), SHC_THREADS, 0, c->s>>>(out, a, n);
    SHC_LAUNCHED(c, "add_inplace");
}

// One 256-thread block per row n of (N,Vp): max over the first V logits, exp and
// sum (stable: exponents are <= 0), normalise, padded columns 0, and
// losses[n] = log(sum) - (z_y - max) (no log(0) when p_y underflows). The target
// logit is read by every thread before the first barrier, i.e. before any write.
__global__ void k_xent_fwd(float *probs, float *losses, const int32_t *targets, int V,
                           int Vp) {
    __shared__ float sh[8];
    size_t n = blockIdx.x;
    float *z = probs + n * (size_t)Vp;
    float zy = z[targets[n]];
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, z[i]);
    mx = shc_block_max(mx, sh);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf(z[i] - mx);
        z[i] = e;
        sum += e;
    }
    sum = shc_block_sum(sum, sh);
    float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) z[i] = i < V ? z[i] * inv : 0.0f;
    if (threadIdx.x == 0) losses[n] = logf(sum) - (zy - mx);
}

// *acc += (sum of losses in row order, in double) / N: one thread, the CPU's order.
__global__ void k_loss_mean_add(double *acc, const float *losses, int N) {
    double s = 0.0;
    for (int n = 0; n < N; n++) s += (double)losses[n];
    *acc += s / (double)N;
}

void shc_crossentropy_fwd(void *ctx, float *probs, float *losses, const int32_t *targets,
                          int N, int V, int Vp, double *loss_acc) {
    shc_ctx *c = shc(ctx);
    if (N < 1) return;
    k_xent_fwd<<<N, 256, 0, c->s>>>(probs, losses, targets, V, Vp);
    SHC_LAUNCHED(c, "crossentropy_fwd");
    if (loss_acc) {
        k_loss_mean_add<<<1, 1, 0, c->s>>>(loss_acc, losses, N);
        SHC_LAUNCHED(c, "crossentropy_fwd (mean)");
    }
}

// dlogits (N,Vp) = (probs - onehot(y)) * dloss for i < V, 0 for padded columns;
// may alias probs (element-wise).
__global__ void k_xent_bwd(float *dlogits, const float *probs, const int32_t *targets,
                           float dloss, size_t NVp, int V, int Vp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < NVp;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / (size_t)Vp;
        int j = (int)(i % (size_t)Vp);
        dlogits[i] = j < V ? sh_xent_grad(probs[i], j == targets[n], dloss) : 0.0f;
    }
}

void shc_crossentropy_bwd(void *ctx, float *dlogits, const float *probs,
                          const int32_t *targets, float dloss, int N, int V, int Vp) {
    shc_ctx *c = shc(ctx);
    size_t n = (size_t)N * Vp;
    k_xent_bwd<<<shc_grid(n), SHC_THREADS, 0, c->s>>>(dlogits, probs, targets, dloss, n, V, Vp);
    SHC_LAUNCHED(c, "crossentropy_bwd");
}
