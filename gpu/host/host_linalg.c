/*
 * host_linalg.c — the host backend's dense linear algebra: fp32 GEMM (OpenBLAS
 * cblas_sgemm), per-column scaling and column dot products (the shared bodies of
 * kernels_hd.h) and the thin SVD (LAPACKE sgesdd). Queued on a stream like every
 * other op, so they run in order with the host's launched work.
 *
 * The gpu/ layer owns BLAS and LAPACK: runtime/ reaches them only through these
 * backend ops.
 */
#include <cblas.h>
#include <lapacke.h>
#include <stdlib.h>
#include <string.h>

#include "host_backend.h"
#include "kernels_hd.h"
#include "protrain.h"

/* Fits a BLAS/LAPACK int (32-bit in the Debian OpenBLAS build). */
static int fits(int64_t v) { return v >= 0 && v <= 0x7fffffff; }

static int gemm_ok(const pt_gemm_args *a) {
    if (!a || !fits(a->m) || !fits(a->n) || !fits(a->k) || !fits(a->lda) || !fits(a->ldb) ||
        !fits(a->ldc))
        return 0;
    if (a->m && a->n && (!a->c || (a->k && (!a->a || !a->b)))) return 0;
    /* row strides at least the stored row length */
    return a->ldc >= a->n && a->lda >= (a->trans_a ? a->m : a->k) &&
           a->ldb >= (a->trans_b ? a->k : a->n);
}

static int cols_ok(const pt_cols_args *a) {
    if (!a || a->rows < 0 || a->cols < 0 || a->ld < a->cols) return 0;
    if (a->op != PT_COLS_SCALE && a->op != PT_COLS_DOT) return 0;
    return !a->rows || !a->cols ||
           (a->x && (a->op == PT_COLS_SCALE ? (a->s && a->out) : (a->y && a->acc)));
}

/* No injection point for these three (PT_GPU_OP_NONE). */
int pt_hb_gemm(void *impl, const pt_gemm_args *a, pt_stream *s) {
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_NONE, gemm_ok(a), HB_OP_GEMM, &op);
    if (rc != PT_OK) return rc;
    op->u.gemm = *a;
    return pt_hb_submit(impl, s, op);
}

int pt_hb_cols(void *impl, const pt_cols_args *a, pt_stream *s) {
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_NONE, cols_ok(a), HB_OP_COLS, &op);
    if (rc != PT_OK) return rc;
    op->u.cols = *a;
    return pt_hb_submit(impl, s, op);
}

int pt_hb_svd(void *impl, const pt_svd_args *a, pt_stream *s) {
    int ok = a && fits(a->m) && fits(a->n) && a->m >= 1 && a->n >= 1 && a->a && a->u && a->s &&
             a->vt && a->info;
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_NONE, ok, HB_OP_SVD, &op);
    if (rc != PT_OK) return rc;
    op->u.svd = *a;
    return pt_hb_submit(impl, s, op);
}

static void gemm_run(const pt_gemm_args *a) {
    if (!a->m || !a->n) return;
    if (!a->k) {   /* C = beta C, with beta = 0 writing zeros */
        for (int64_t i = 0; i < a->m; i++)
            for (int64_t j = 0; j < a->n; j++)
                a->c[i * a->ldc + j] = a->beta == 0.0f ? 0.0f : a->beta * a->c[i * a->ldc + j];
        return;
    }
    if (a->beta == 0.0f)   /* BLAS may read C before scaling it by 0: NaN would survive */
        for (int64_t i = 0; i < a->m; i++) memset(a->c + i * a->ldc, 0, (size_t)a->n * 4);
    cblas_sgemm(CblasRowMajor, a->trans_a ? CblasTrans : CblasNoTrans,
                a->trans_b ? CblasTrans : CblasNoTrans, (blasint)a->m, (blasint)a->n,
                (blasint)a->k, a->alpha, a->a, (blasint)a->lda, a->b, (blasint)a->ldb, a->beta,
                a->c, (blasint)a->ldc);
}

static void cols_run(const pt_cols_args *a) {
    if (a->op == PT_COLS_SCALE) {
        for (int64_t i = 0; i < a->rows; i++)
            for (int64_t j = 0; j < a->cols; j++)
                a->out[i * a->ld + j] = pt_colscale_elem(a->x[i * a->ld + j], a->s[j]);
        return;
    }
    for (int64_t j = 0; j < a->cols; j++)
        a->acc[j] = pt_coldot_col(a->x, a->y, a->rows, a->ld, j, a->acc[j]);
}

/* sgesdd with jobz 'S': the thin factors, row-major as stored. */
static void svd_run(const pt_svd_args *a) {
    lapack_int r = (lapack_int)(a->m < a->n ? a->m : a->n);
    lapack_int info = LAPACKE_sgesdd(LAPACK_ROW_MAJOR, 'S', (lapack_int)a->m, (lapack_int)a->n,
                                     a->a, (lapack_int)a->n, a->s, a->u, r, a->vt,
                                     (lapack_int)a->n);
    *a->info = (int32_t)info;
}

void pt_hb_exec_linalg(hb_op *op) {
    switch (op->kind) {
    case HB_OP_GEMM: gemm_run(&op->u.gemm); break;
    case HB_OP_COLS: cols_run(&op->u.cols); break;
    case HB_OP_SVD: svd_run(&op->u.svd); break;
    default: break;
    }
}
