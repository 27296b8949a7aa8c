/*
 * rank_sum.h — the NCCL transport's one kernel (nccl/cuda/rank_sum.cu), callable
 * from plain C: no CUDA type in it (the stream travels as a pointer).
 */
#ifndef PT_NCCL_RANK_SUM_H
#define PT_NCCL_RANK_SUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* For e in [0, m), on `stream` (a cudaStream_t):
 *   out[e] = scale * (x_0[e] + x_1[e] + ... + x_{world-1}[e])
 * added left to right in rank order, the first addend copied (not added to 0),
 * with x_me = out (this rank's own segment, summed in place) and
 * x_q = slots + q * stride for every other q (what rank q sent; slot `me` is
 * unused). The multiply is skipped when scale == 1 and done once, in the
 * buffer's type, otherwise: the MPI transport's sum and scaling, element for
 * element. dtype: PT_COLL_F32 or PT_COLL_F64. Returns a cudaError_t (0: launched). */
int pt_nccl_rank_sum(void *out, const void *slots, size_t stride, int me, int world, size_t m,
                     int32_t dtype, double scale, void *stream);

#ifdef __cplusplus
}
#endif

#endif
