/*
 * la_cpu.c — OpenBLAS / LAPACKE wrappers for REKLS (see la_cpu.h).
 */
#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "la_cpu.h"

void pt_la_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* LAPACK returns ascending eigenvalues; REKLS keeps slot i = i-th largest
 * (its second moment is not rotated between steps), so reverse the order of
 * the values and of the eigenvector columns. */
static void reverse_cols(int n, float *A, float *w) {
    for (int j = 0; j < n / 2; j++) {
        int k = n - 1 - j;
        float t = w[j];
        w[j] = w[k];
        w[k] = t;
        for (int r = 0; r < n; r++) {
            t = A[(size_t)r * n + j];
            A[(size_t)r * n + j] = A[(size_t)r * n + k];
            A[(size_t)r * n + k] = t;
        }
    }
}

int pt_la_eigh_desc(int n, float *A, float *w) {
    if (n <= 0) return 0;
    size_t nn = (size_t)n * (size_t)n;
    float *keep = malloc(nn * sizeof *keep);
    if (!keep) goto fail;
    memcpy(keep, A, nn * sizeof *keep);
    /* a non-finite factor (a NaN gradient got in) has no eigendecomposition to
     * retry: fail at once, so the caller reports it instead of stepping on NaN */
    for (size_t i = 0; i < nn; i++)
        if (!isfinite(keep[i])) {
            free(keep);
            goto fail;
        }
    /* explicit workspace (the documented minimum for vectors): the size query
     * returns it as a float, which rounds 1 + 6n + 2n^2 down for n in the
     * thousands and makes ssyevd refuse its own answer */
    lapack_int lw = 1 + 6 * (lapack_int)n + 2 * (lapack_int)n * n, liw = 3 + 5 * (lapack_int)n;
    float *work = malloc((size_t)lw * sizeof *work);
    lapack_int *iwork = malloc((size_t)liw * sizeof *iwork);
    lapack_int info = -1;
    if (work && iwork)
        info = LAPACKE_ssyevd_work(LAPACK_ROW_MAJOR, 'V', 'U', n, A, n, w, work, lw, iwork, liw);
    free(work);
    free(iwork);
    if (info == 0) {
        free(keep);
        reverse_cols(n, A, w);
        return 0;
    }
    /* fp32 did not converge: the same matrix in fp64, cast back */
    double *a = malloc(nn * sizeof *a), *wd = malloc((size_t)n * sizeof *wd);
    if (a && wd) {
        for (size_t i = 0; i < nn; i++) a[i] = keep[i];
        lapack_int lw = 1 + 6 * (lapack_int)n + 2 * (lapack_int)n * n, liw = 3 + 5 * (lapack_int)n;
        double *work = malloc((size_t)lw * sizeof *work);
        lapack_int *iwork = malloc((size_t)liw * sizeof *iwork);
        info = work && iwork ? LAPACKE_dsyevd_work(LAPACK_ROW_MAJOR, 'V', 'U', n, a, n, wd, work,
                                                   lw, iwork, liw)
                             : -1;
        free(work);
        free(iwork);
        if (info == 0) {
            for (size_t i = 0; i < nn; i++) A[i] = (float)a[i];
            for (int i = 0; i < n; i++) w[i] = (float)wd[i];
        }
    }
    free(a);
    free(wd);
    free(keep);
    if (info == 0 && a && wd) {
        reverse_cols(n, A, w);
        return 0;
    }
fail:
    for (size_t i = 0; i < nn; i++) A[i] = NAN;
    for (int i = 0; i < n; i++) w[i] = NAN;
    return 1;
}
