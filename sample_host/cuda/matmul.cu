// matmul.cu — linear layers through cublasSgemm on the stream (row-major shapes as
// sh_layers_matmul_fwd/bwd), the row-major GEMM wrapper and column sums for bias gradients.
#include "cuda/shc.cuh"

void shc_gemm(shc_ctx *c, bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
              int lda, long long sA, const float *B, int ldb, long long sB, float beta,
              float *C, int ldc, long long sC, int batch) {
    // A row-major (r, cols) matrix with leading dimension ld is, read column-major,
    // its transpose. So row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
    // B comes first, with op N when op(B) = B (its stored transpose is what we need).
    cublasOperation_t ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t st;
    if (batch <= 1)
        st = cublasSgemm(c->blas, ob, oa, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc);
    else
        st = cublasSgemmStridedBatched(c->blas, ob, oa, N, M, K, &alpha, B, ldb, sB, A, lda,
                                       sA, &beta, C, ldc, sC, batch);
    shc_blas(c, st, batch <= 1 ? "cublasSgemm" : "cublasSgemmStridedBatched");
}

// out (N,OC) += bias (OC) per row.
__global__ void k_bias_add(float *out, const float *bias, size_t n, int OC) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % (size_t)OC];
}

// dst[c] += column sum of x (N,C): block (32, 8) owns 32 columns, thread row y sums
// rows y, y+8, ... in order, row 0 adds the 8 partials in order, then one add.
__global__ void k_colsum_add(float *dst, const float *x, int N, int C) {
    __shared__ float sh[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float a = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += 8) a += x[(size_t)n * C + c];
    sh[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
        dst[c] += t;
    }
}

void shc_colsum_add(shc_ctx *c, float *dst, const float *x, int N, int C) {
    k_colsum_add<<<(C + 31) / 32, dim3(32, 8), 0, c->s>>>(dst, x, N, C);
    SHC_LAUNCHED(c, "column sum");
}

void shc_matmul_fwd(void *ctx, float *out, const float *inp, const float *W, const float *bias,
                    int N, int IC, int OC) {
    shc_ctx *c = shc(ctx);
    if (N < 1) return;
    // out (N,OC) = inp (N,IC) * W (OC,IC)^T
    shc_gemm(c, false, true, N, OC, IC, 1.0f, inp, IC, 0, W, IC, 0, 0.0f, out, OC, 0, 1);
    if (bias) {
        size_t n = (size_t)N * OC;
        k_bias_add<<<shc_grid(n), SHC_THREADS, 0, c->s>>>(out, bias, n, OC);
        SHC_LAUNCHED(c, "matmul_fwd (bias)");
    }
}

void shc_matmul_bwd(void *ctx, float *dinp, float *dW, float *dbias, const float *dout,
                    const float *inp, const float *W, int N, int IC, int OC, float *wtmp) {
    shc_ctx *c = shc(ctx);
    if (N < 1) return;
    // dinp (N,IC) = dout (N,OC) * W (OC,IC)   (overwritten)
    if (dinp)
        shc_gemm(c, false, false, N, IC, OC, 1.0f, dout, OC, 0, W, IC, 0, 0.0f, dinp, IC, 0, 1);
    // dW (OC,IC) += dout^T (OC,N) * inp (N,IC): the product into wtmp, then one add
    // (the rule of layers.c); without wtmp straight into dW with beta = 1
    shc_gemm(c, true, false, OC, IC, N, 1.0f, dout, OC, 0, inp, IC, 0, wtmp ? 0.0f : 1.0f,
             wtmp ? wtmp : dW, IC, 0, 1);
    if (wtmp) {
        size_t n = (size_t)OC * IC;
        shc_add_inplace(ctx, dW, wtmp, n);
    }
    if (dbias) shc_colsum_add(c, dbias, dout, N, OC);
}
