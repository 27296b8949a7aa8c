// shc.cuh — internals of libsample_cuda.so shared by its sources: the context
// (stream, cuBLAS handle, first error, pinned staging), error recording, launch
// geometry, warp/block reductions in a fixed order, and the entry points that
// api.cu collects into the exported table (sh_cuda.h).
//
// Determinism: no atomics anywhere. Every reduction is a fixed tree (warp butterfly
// or shared-memory tree of a fixed blockDim) or a sequential loop, and every grid
// depends only on the shapes, so a run repeats bit for bit on one GPU model.
#ifndef SHC_CUH
#define SHC_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "sh_cuda.h"

#define SHC_NSTAGE 8                  // pinned staging slots for small uploads
#define SHC_STAGE_MAX (4u << 20)      // larger uploads copy synchronously

struct shc_stage {
    void *host;                       // pinned buffer
    size_t cap;
    cudaEvent_t ev;                   // recorded after the copy out of it
    int pending;
};

struct shc_ctx {
    int device;
    cudaStream_t s;
    cublasHandle_t blas;
    int failed;                       // first error kept in err
    char err[384];
    char name[320];
    shc_stage stage[SHC_NSTAGE];
    int next_stage;
    double *part;                     // clipping partial sums (device)
    size_t part_n;
    float *scale;                     // clipping factor (device, 1 float)
};

static inline shc_ctx *shc(void *ctx) { return (shc_ctx *)ctx; }

// Record the first failure: what failed and CUDA's words for it.
void shc_fail(shc_ctx *c, const char *what, const char *why);
void shc_check(shc_ctx *c, cudaError_t e, const char *what);
void shc_blas(shc_ctx *c, cublasStatus_t st, const char *what);
// After a kernel launch: a bad configuration shows up here.
#define SHC_LAUNCHED(c, what) shc_check((c), cudaGetLastError(), (what))

// Grid-stride launches: enough blocks to cover n, capped (the loops stride over the
// rest), so any size_t n works with gridDim.x far below its limit.
#define SHC_THREADS 256
static inline unsigned shc_grid(size_t n) {
    size_t b = (n + SHC_THREADS - 1) / SHC_THREADS;
    if (b < 1) b = 1;
    return b > 65535u * 16u ? 65535u * 16u : (unsigned)b;
}
// One warp per row, 8 rows per 256-thread block.
static inline unsigned shc_row_grid(size_t rows) { return (unsigned)((rows + 7) / 8); }

__device__ __forceinline__ float shc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float shc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Sum / max over a 256-thread block; every thread gets the result. sh: 8 floats of
// shared memory (may be reused by the next call: the first barrier protects it).
__device__ __forceinline__ float shc_block_sum(float v, float *sh) {
    v = shc_warp_sum(v);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        float r = lane < 8 ? sh[lane] : 0.0f;
        r = shc_warp_sum(r);
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}
__device__ __forceinline__ float shc_block_max(float v, float *sh) {
    v = shc_warp_max(v);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        float r = lane < 8 ? sh[lane] : -INFINITY;
        r = shc_warp_max(r);
        if (lane == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}

// Row-major GEMM through column-major cuBLAS: C (M,N) = alpha op(A) op(B) + beta C,
// op(A) (M,K), op(B) (K,N), leading dimensions of the row-major storage. batch > 1:
// strided batches (element strides sA, sB, sC). Computed as C^T = op(B)^T op(A)^T.
void shc_gemm(shc_ctx *c, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
              int lda, long long sA, const float *B, int ldb, long long sB, float beta,
              float *C, int ldc, long long sC, int batch);
// dst[c] += sum_n x[n*C + c] over N rows (column sums, fixed order).
void shc_colsum_add(shc_ctx *c, float *dst, const float *x, int N, int C);

// ---- layer entries (sh_ops.h semantics) ----
void shc_encoder_fwd(void *ctx, float *out, const int32_t *tok, const float *wte,
                     const float *wpe, int B, int T, int C);
void shc_encoder_bwd(void *ctx, float *dwte, float *dwpe, const float *dout,
                     const int32_t *tok, int B, int T, int C);
void shc_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int N, int C);
void shc_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                       const float *inp, const float *w, const float *mean, const float *rstd,
                       int N, int C);
void shc_matmul_fwd(void *ctx, float *out, const float *inp, const float *W, const float *bias,
                    int N, int IC, int OC);
void shc_matmul_bwd(void *ctx, float *dinp, float *dW, float *dbias, const float *dout,
                    const float *inp, const float *W, int N, int IC, int OC, float *wtmp);
void shc_attention_fwd(void *ctx, float *out, float *att, const float *qkv, int B, int T,
                       int C, int NH);
void shc_attention_bwd(void *ctx, float *dqkv, float *datt, int nslots, const float *dout,
                       const float *qkv, const float *att, int B, int T, int C, int NH);
int shc_attention_slots(void *ctx, int NH);
void shc_gelu_fwd(void *ctx, float *out, const float *inp, size_t n);
void shc_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);
void shc_add_inplace(void *ctx, float *out, const float *a, size_t n);
void shc_crossentropy_fwd(void *ctx, float *probs, float *losses, const int32_t *targets,
                          int N, int V, int Vp, double *loss_acc);
void shc_crossentropy_bwd(void *ctx, float *dlogits, const float *probs,
                          const int32_t *targets, float dloss, int N, int V, int Vp);
void shc_zero(void *ctx, void *dst, size_t bytes);
void shc_adamw(void *ctx, float *p, float *g, float *m, float *v, size_t n,
               const size_t *seg_off, const size_t *seg_len, int nseg, float max_norm,
               const sh_adamw_k *k, double *d_norm);

#endif // SHC_CUH
