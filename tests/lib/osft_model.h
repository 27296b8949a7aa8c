/*
 * osft_model.h — the two-block model test_osft.c trains through the plugin's
 * OSFT hooks (b0.attn.w 12 x 9 and b1.mlp.w 7 x 12 decomposed; their biases and
 * a non-block head scale ordinary), its data, and a double-precision reference
 * of the same model trained in factor space, written independently of the
 * plugin: its own SVD (LAPACKE dgesdd), the dense gradient mapped through
 * W = U diag(S) Vt, the projections, AdamW, all in double.
 * Names: OM_ constants.
 * Header-only (static functions); include once, after cmocka.h.
 */
#ifndef PT_OSFT_MODEL_H
#define PT_OSFT_MODEL_H

#include <lapacke.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "osft/osft.h"

enum { OM_ROWS = 5,
       OM_NPAR = 5,
       OM_NT = 2 };
enum { OM_I_SCALE = 0,
       OM_I_W0,
       OM_I_B0,
       OM_I_W1,
       OM_I_B1 };
static const int64_t OM_TN[OM_NT] = {12, 7}, OM_TM[OM_NT] = {9, 12};   /* targets: out x in */
static const int OM_TIDX[OM_NT] = {OM_I_W0, OM_I_W1};
#define OM_D0 9   /* input width */
#define OM_H 12   /* hidden */
#define OM_O 7    /* output */

/* ---- the model's data ---- */

static float w_init(int t, int64_t i) {
    return 0.35f * sinf(1.37f * (float)i + 0.71f * (float)t + 0.2f) +
           0.05f * cosf(0.113f * (float)(i * i) + (float)t);
}
static float x_of(int r, int c, int s) { return 0.5f * sinf(0.37f * (float)(r * OM_D0 + c) + 0.91f * (float)s); }
static float t_of(int r, int j, int s) { return 0.2f * cosf(0.53f * (float)(r * OM_O + j) + 0.29f * (float)s); }

/* ---- a double-precision reference of the factorised model ---- */

typedef struct rtgt {
    int64_t N, M, R, k, kl;
    double *U, *S, *Vt;        /* U (N x R) = [U_high | U_low], S (R), Vt (R x M) */
    double *gU, *gS, *gV;      /* gradients (low columns / entries / rows only) */
    double *mU, *vU, *mS, *vS, *mV, *vV;
} rtgt;

typedef struct ref {
    rtgt t[OM_NT];
    double vec[3][OM_H];          /* scale (OM_O), b0 (OM_H), b1 (OM_O) */
    double gvec[3][OM_H], mvec[3][OM_H], vvec[3][OM_H];
    float lr, eps;
    int project_values;
    int64_t step;
} ref;
static const int OM_VLEN[3] = {OM_O, OM_H, OM_O};

static double *dz(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static void ref_open(ref *R, float urr, float lr, float eps) {
    memset(R, 0, sizeof *R);
    R->lr = lr;
    R->eps = eps;
    R->project_values = 1;
    for (int t = 0; t < OM_NT; t++) {
        rtgt *q = &R->t[t];
        q->N = OM_TN[t];
        q->M = OM_TM[t];
        q->R = q->N < q->M ? q->N : q->M;
        q->k = pt_osft_frozen_rank(q->R, urr);
        q->kl = q->R - q->k;
        double *a = dz((size_t)(q->N * q->M));
        for (int64_t e = 0; e < q->N * q->M; e++) a[e] = (double)w_init(t, e);
        q->U = dz((size_t)(q->N * q->R));
        q->S = dz((size_t)q->R);
        q->Vt = dz((size_t)(q->R * q->M));
        /* the reference's own SVD, in double (signs may differ from the plugin's
         * fp32 SVD pair by pair; the trajectory does not depend on them) */
        assert_int_equal(LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', (lapack_int)q->N,
                                        (lapack_int)q->M, a, (lapack_int)q->M, q->S, q->U,
                                        (lapack_int)q->R, q->Vt, (lapack_int)q->M),
                         0);
        free(a);
        size_t nu = (size_t)(q->N * q->R), nv = (size_t)(q->R * q->M);
        q->gU = dz(nu), q->mU = dz(nu), q->vU = dz(nu);
        q->gS = dz((size_t)q->R), q->mS = dz((size_t)q->R), q->vS = dz((size_t)q->R);
        q->gV = dz(nv), q->mV = dz(nv), q->vV = dz(nv);
    }
    for (int e = 0; e < OM_O; e++) R->vec[0][e] = (double)(1.0f + 0.05f * (float)e);
    for (int v = 1; v < 3; v++)
        for (int e = 0; e < OM_VLEN[v]; e++) R->vec[v][e] = (double)(0.01f * (float)(e % 5) - 0.02f);
}

static void ref_close(ref *R) {
    for (int t = 0; t < OM_NT; t++) {
        rtgt *q = &R->t[t];
        double *all[] = {q->U, q->S, q->Vt, q->gU, q->gS, q->gV, q->mU, q->vU, q->mS, q->vS, q->mV, q->vV};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    }
}

/* W = U diag(S) Vt (N x M) */
static void ref_w(const rtgt *q, double *W) {
    for (int64_t n = 0; n < q->N; n++)
        for (int64_t m = 0; m < q->M; m++) {
            double a = 0;
            for (int64_t j = 0; j < q->R; j++) a += q->U[n * q->R + j] * q->S[j] * q->Vt[j * q->M + m];
            W[n * q->M + m] = a;
        }
}

/* Loss of step s; with grads: the factor gradients of the low part (the dense
 * gradient mapped through the factorisation) and the vectors' gradients. */
static double ref_loss(ref *R, int s, int grads) {
    double W0[OM_H * OM_D0], W1[OM_O * OM_H], x[OM_ROWS][OM_D0], h[OM_ROWS][OM_H], y[OM_ROWS][OM_O];
    ref_w(&R->t[0], W0);
    ref_w(&R->t[1], W1);
    for (int r = 0; r < OM_ROWS; r++)
        for (int c = 0; c < OM_D0; c++) x[r][c] = (double)x_of(r, c, s);
    for (int r = 0; r < OM_ROWS; r++)
        for (int j = 0; j < OM_H; j++) {
            double a = R->vec[1][j];
            for (int c = 0; c < OM_D0; c++) a += x[r][c] * W0[j * OM_D0 + c];
            h[r][j] = a;
        }
    double loss = 0, dy[OM_ROWS][OM_O], dh[OM_ROWS][OM_H];
    for (int r = 0; r < OM_ROWS; r++)
        for (int j = 0; j < OM_O; j++) {
            double a = R->vec[2][j];
            for (int c = 0; c < OM_H; c++) a += h[r][c] * W1[j * OM_H + c];
            y[r][j] = a;
            double d = a * R->vec[0][j] - (double)t_of(r, j, s);
            loss += 0.5 * d * d / OM_ROWS;
            dy[r][j] = d / OM_ROWS;
        }
    if (!grads) return loss;
    memset(R->gvec, 0, sizeof R->gvec);
    for (int r = 0; r < OM_ROWS; r++)
        for (int j = 0; j < OM_O; j++) {
            R->gvec[0][j] += dy[r][j] * y[r][j];
            dy[r][j] *= R->vec[0][j];
            R->gvec[2][j] += dy[r][j];
        }
    for (int r = 0; r < OM_ROWS; r++)
        for (int c = 0; c < OM_H; c++) {
            double a = 0;
            for (int j = 0; j < OM_O; j++) a += dy[r][j] * W1[j * OM_H + c];
            dh[r][c] = a;
            R->gvec[1][c] += a;
        }
    /* dense gradients dW = dY^T X, then through W = U S Vt (low part only) */
    for (int t = 0; t < OM_NT; t++) {
        rtgt *q = &R->t[t];
        double *dW = dz((size_t)(q->N * q->M));
        for (int64_t n = 0; n < q->N; n++)
            for (int64_t m = 0; m < q->M; m++) {
                double a = 0;
                for (int r = 0; r < OM_ROWS; r++)
                    a += (t ? dy[r][n] : dh[r][n]) * (t ? h[r][m] : x[r][m]);
                dW[n * q->M + m] = a;
            }
        memset(q->gU, 0, (size_t)(q->N * q->R) * 8);
        memset(q->gS, 0, (size_t)q->R * 8);
        memset(q->gV, 0, (size_t)(q->R * q->M) * 8);
        for (int64_t j = q->k; j < q->R; j++) {
            for (int64_t n = 0; n < q->N; n++) {
                double a = 0;
                for (int64_t m = 0; m < q->M; m++) a += dW[n * q->M + m] * q->Vt[j * q->M + m];
                q->gU[n * q->R + j] = a * q->S[j];
                q->gS[j] += q->U[n * q->R + j] * a;
            }
            for (int64_t m = 0; m < q->M; m++) {
                double a = 0;
                for (int64_t n = 0; n < q->N; n++) a += q->U[n * q->R + j] * dW[n * q->M + m];
                q->gV[j * q->M + m] = a * q->S[j];
            }
        }
        free(dW);
    }
    return loss;
}

/* u (columns k.. of U) -= U_high (U_high^T u); v (rows k.. of Vt) -= (v V_high^T) V_high */
static void ref_project(rtgt *q, double *u, double *v) {
    int64_t N = q->N, M = q->M, R = q->R, k = q->k;
    for (int64_t j = k; j < R; j++) {
        double c[16] = {0}, d[16] = {0};
        for (int64_t i = 0; i < k; i++) {
            for (int64_t n = 0; n < N; n++) c[i] += q->U[n * R + i] * u[n * R + j];
            for (int64_t m = 0; m < M; m++) d[i] += v[j * M + m] * q->Vt[i * M + m];
        }
        for (int64_t i = 0; i < k; i++) {
            for (int64_t n = 0; n < N; n++) u[n * R + j] -= q->U[n * R + i] * c[i];
            for (int64_t m = 0; m < M; m++) v[j * M + m] -= d[i] * q->Vt[i * M + m];
        }
    }
}

static void adam(double *p, double g, double *m, double *v, const ref *R, double wd) {
    double b1 = 0.9, b2 = 0.999, t = (double)(R->step + 1);
    *m = b1 * *m + (1 - b1) * g;
    *v = b2 * *v + (1 - b2) * g * g;
    double mh = *m / (1 - pow(b1, t)), vh = *v / (1 - pow(b2, t));
    *p = *p * (1 - (double)R->lr * wd) - (double)R->lr * mh / (sqrt(vh) + (double)R->eps);
}

static double ref_step(ref *R, int s) {
    double loss = ref_loss(R, s, 1);
    for (int t = 0; t < OM_NT; t++) ref_project(&R->t[t], R->t[t].gU, R->t[t].gV);
    const double wd = 0.01;
    for (int v = 0; v < 3; v++)
        for (int e = 0; e < OM_VLEN[v]; e++)
            adam(&R->vec[v][e], R->gvec[v][e], &R->mvec[v][e], &R->vvec[v][e], R, wd);
    for (int t = 0; t < OM_NT; t++) {
        rtgt *q = &R->t[t];
        for (int64_t j = q->k; j < q->R; j++) {
            for (int64_t n = 0; n < q->N; n++) {
                size_t i = (size_t)(n * q->R + j);
                adam(&q->U[i], q->gU[i], &q->mU[i], &q->vU[i], R, wd);
            }
            adam(&q->S[j], q->gS[j], &q->mS[j], &q->vS[j], R, wd);
            for (int64_t m = 0; m < q->M; m++) {
                size_t i = (size_t)(j * q->M + m);
                adam(&q->Vt[i], q->gV[i], &q->mV[i], &q->vV[i], R, wd);
            }
        }
        if (R->project_values) ref_project(q, q->U, q->Vt);
    }
    R->step++;
    return loss;
}

/* ||A^T B|| / (||A|| ||B||) for the column blocks [0,k) and [k,R) of U (N x R) */
static double ref_ortho_u(const rtgt *q) {
    double c2 = 0, a2 = 0, b2 = 0;
    for (int64_t i = 0; i < q->R; i++)
        for (int64_t n = 0; n < q->N; n++) *(i < q->k ? &a2 : &b2) += q->U[n * q->R + i] * q->U[n * q->R + i];
    for (int64_t i = 0; i < q->k; i++)
        for (int64_t j = q->k; j < q->R; j++) {
            double c = 0;
            for (int64_t n = 0; n < q->N; n++) c += q->U[n * q->R + i] * q->U[n * q->R + j];
            c2 += c * c;
        }
    return sqrt(c2) / sqrt(a2 * b2);
}


#endif
