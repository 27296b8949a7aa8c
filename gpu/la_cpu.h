/*
 * la_cpu.h — the dense linear algebra the CPU runs for REKLS: a row-major
 * fp32 GEMM (OpenBLAS) and a symmetric eigendecomposition (LAPACKE ssyevd,
 * retried in dsyevd) sorted descending. Both the CPU optimizer (offloaded
 * chunks) and the host backend (resident chunks: its eigh op calls
 * pt_la_eigh_desc, its gemm_f32 makes the same cblas_sgemm call) compute with
 * the same calls and arguments, which is what makes the two paths bit-identical
 * on the host backend.
 *
 * Determinism: OpenBLAS gives the same bits for the same call whichever thread
 * makes it, as long as its thread count is not changed in between (its level-3
 * kernels split the output, never the sum over K).
 */
#ifndef PT_LA_CPU_H
#define PT_LA_CPU_H

#include <stddef.h>

/* C[M x N] = alpha * op(A) op(B) + beta * C, row-major; op(X) = X^T when tX. */
void pt_la_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);

/* A [n x n] symmetric (row-major; the upper triangle is read) -> eigenvectors
 * as the columns of A, w [n] eigenvalues, both in descending order of w.
 * ssyevd first; when it reports no convergence (or a bad argument) the input
 * is decomposed again in dsyevd and cast back. A non-finite input fails at once. Returns 0, or non-zero when both
 * failed (A and w are then filled with NaN, so nothing downstream mistakes them
 * for a basis). Allocates its scratch (n^2 floats + n^2 doubles at most). */
int pt_la_eigh_desc(int n, float *A, float *w);

#endif /* PT_LA_CPU_H */
