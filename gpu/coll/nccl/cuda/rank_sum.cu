/*
 * rank_sum.cu — the rank-order sum that keeps the NCCL transport's reductions
 * deterministic (see rank_sum.h for the contract). One thread per element
 * (grid-stride): each element's addends are read in rank order 0..W-1 and added
 * one at a time, so the result does not depend on the grid, the world's
 * topology or NCCL's algorithm choice, and is meant to equal the CPU's (MPI
 * transport's) sum bit for bit: IEEE adds in the same order, denormals kept
 * (no -ftz); not yet run on a GPU. Built with -fmad=false like the backend (only adds and one
 * multiply here, so nothing could contract anyway).
 */
#include <cuda_runtime.h>

#include "../rank_sum.h"
#include "coll/coll.h"

namespace {

template <typename T>
__global__ void rank_sum_k(T *out, const T *slots, size_t stride, int me, int world, size_t m,
                           T scale, int do_scale) {
    size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < m; e += step) {
        T acc = me == 0 ? out[e] : slots[e];
        for (int q = 1; q < world; q++) acc += q == me ? out[e] : slots[(size_t)q * stride + e];
        if (do_scale) acc *= scale;
        out[e] = acc;
    }
}

}  // namespace

extern "C" int pt_nccl_rank_sum(void *out, const void *slots, size_t stride, int me, int world,
                                size_t m, int32_t dtype, double scale, void *stream) {
    if (!m) return (int)cudaSuccess;
    const unsigned threads = 256;
    size_t want = (m + threads - 1) / threads;
    unsigned blocks = want < 4096 ? (unsigned)want : 4096u;
    cudaStream_t s = (cudaStream_t)stream;
    int do_scale = scale != 1.0;
    if (dtype == PT_COLL_F64)
        rank_sum_k<double><<<blocks, threads, 0, s>>>((double *)out, (const double *)slots, stride,
                                                      me, world, m, scale, do_scale);
    else
        rank_sum_k<float><<<blocks, threads, 0, s>>>((float *)out, (const float *)slots, stride,
                                                     me, world, m, (float)scale, do_scale);
    return (int)cudaGetLastError();
}
