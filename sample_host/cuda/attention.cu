// attention.cu — causal multi-head self-attention on the stream (shapes as
// sh_layers_attention_fwd/bwd): per batch row b, the heads' GEMMs as one strided batch
// (head h's q/k/v slices start h*hd floats apart in qkv (B,T,3C)), and one warp per
// attention row for the causal softmax and its backward.
#include <math.h>

#include "cuda/shc.cuh"

// Rows of P (rows, T), row r at query position t = r % T: softmax over t2 <= t,
// entries t2 > t set to 0. Stable: the row maximum is subtracted before expf.
__global__ void k_softmax_causal(float *P, size_t rows, int T) {
    size_t r = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return; // per warp
    int lane = threadIdx.x & 31;
    int t = (int)(r % (size_t)T);
    float *a = P + r * (size_t)T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, a[j]);
    mx = shc_warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        float e = expf(a[j] - mx);
        a[j] = e;
        sum += e;
    }
    float inv = 1.0f / shc_warp_sum(sum); // entry t2 = t gives e = 1: sum >= 1
    for (int j = lane; j < T; j += 32) a[j] = j <= t ? a[j] * inv : 0.0f;
}

// Softmax backward in place on dP (rows, T) with the saved P (rows of one head group):
// dS[t2] = P[t2] (dP[t2] - sum_{j<=t} P[j] dP[j]) * scale for t2 <= t, else 0.
// Row r of the group is head r / T, position t = r % T; head slots are T*T apart in
// both P (from P0) and dP (from S0).
__global__ void k_softmax_causal_bwd(float *S0, const float *P0, size_t rows, int T,
                                     float scale) {
    size_t r = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    int lane = threadIdx.x & 31;
    int t = (int)(r % (size_t)T);
    const float *p = P0 + r * (size_t)T; // rows of consecutive heads are contiguous
    float *d = S0 + r * (size_t)T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += p[j] * d[j];
    dot = shc_warp_sum(dot);
    for (int j = lane; j < T; j += 32) d[j] = j <= t ? sh_softmax_bwd(p[j], d[j], dot, scale) : 0.0f;
}

void shc_attention_fwd(void *ctx, float *out, float *att, const float *qkv, int B, int T,
                       int C, int NH) {
    shc_ctx *c = shc(ctx);
    if (B < 1 || T < 1) return;
    int hd = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *Q = qkv + (size_t)b * T * C3; // head h: Q + h*hd, K = Q + C
        float *P = att + (size_t)b * NH * TT;      // head h: P + h*T*T
        // S (T,T) = scale * Q (T,hd) K (T,hd)^T, all T*T entries (the upper triangle is
        // overwritten by the softmax)
        shc_gemm(c, false, true, T, T, hd, scale, Q, C3, hd, Q + C, C3, hd, 0.0f, P, T, TT, NH);
    }
    size_t rows = (size_t)B * NH * T;
    k_softmax_causal<<<shc_row_grid(rows), 256, 0, c->s>>>(att, rows, T);
    SHC_LAUNCHED(c, "attention softmax");
    for (int b = 0; b < B; b++) {
        const float *V = qkv + (size_t)b * T * C3 + 2 * C;
        const float *P = att + (size_t)b * NH * TT;
        // out (T,hd) slice of head h (row stride C) = P (T,T) V (T,hd)
        shc_gemm(c, false, false, T, hd, T, 1.0f, P, T, TT, V, C3, hd, 0.0f,
                 out + (size_t)b * T * C, C, hd, NH);
    }
}

int shc_attention_slots(void *ctx, int NH) {
    (void)ctx;
    return NH; // one (T,T) slot per head: a batch row's heads run as one batch
}

void shc_attention_bwd(void *ctx, float *dqkv, float *datt, int nslots, const float *dout,
                       const float *qkv, const float *att, int B, int T, int C, int NH) {
    shc_ctx *c = shc(ctx);
    if (B < 1 || T < 1) return;
    int hd = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    long long TT = (long long)T * T;
    // Heads in groups of up to nslots (the scratch slots); the stream runs the groups
    // one after another, so every group reuses the same slots.
    int g = nslots < 1 ? 1 : (nslots < NH ? nslots : NH);
    for (int b = 0; b < B; b++) {
        for (int h0 = 0; h0 < NH; h0 += g) {
            int gg = NH - h0 < g ? NH - h0 : g;
            const float *Q = qkv + (size_t)b * T * C3 + (size_t)h0 * hd;
            const float *K = Q + C, *Vv = Q + 2 * C;
            const float *dO = dout + (size_t)b * T * C + (size_t)h0 * hd;
            const float *P = att + ((size_t)b * NH + h0) * TT;
            float *dQ = dqkv + (size_t)b * T * C3 + (size_t)h0 * hd;
            float *dK = dQ + C, *dV = dQ + 2 * C;
            // dP (T,T) = dO (T,hd) V^T                     -> slots
            shc_gemm(c, false, true, T, T, hd, 1.0f, dO, C, hd, Vv, C3, hd, 0.0f, datt, T, TT, gg);
            // dV (T,hd) = P^T (T,T) dO (T,hd)               (overwritten)
            shc_gemm(c, true, false, T, hd, T, 1.0f, P, T, TT, dO, C, hd, 0.0f, dV, C3, hd, gg);
            // dS = softmax backward of dP, in place, scaled by 1/sqrt(hd)
            size_t rows = (size_t)gg * T;
            k_softmax_causal_bwd<<<shc_row_grid(rows), 256, 0, c->s>>>(datt, P, rows, T, scale);
            SHC_LAUNCHED(c, "attention softmax backward");
            // dQ (T,hd) = dS (T,T) K (T,hd); dK (T,hd) = dS^T Q   (overwritten)
            shc_gemm(c, false, false, T, hd, T, 1.0f, datt, T, TT, K, C3, hd, 0.0f, dQ, C3, hd, gg);
            shc_gemm(c, true, false, T, hd, T, 1.0f, datt, T, TT, Q, C3, hd, 0.0f, dK, C3, hd, gg);
        }
    }
}
