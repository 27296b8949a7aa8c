/*
 * layers.c — fp32 GPT-2 layer kernels (see sh_layers.h for shapes and conventions).
 * GEMMs go through OpenBLAS cblas_sgemm; the other hot loops use OpenMP over
 * independent outputs only, so the arithmetic order never depends on threads.
 */
#include "sh_layers.h"

#include <cblas.h>
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Columns handled together by the column-parallel reductions (dW of layernorm,
 * bias gradients, embedding gradients): 16 floats = one 64-byte line.
 *
 * ACCUMULATION: block parameters' gradients are formed as "this call's full sum, then
 * one add" (g = g + S), never by adding partial products into g. A plugin that offloads
 * a chunk zeroes its device gradient per micro-batch and adds the micro-batch totals on
 * the host (g1 + g2); a resident gradient accumulates in place (g1 + S2 with S2 == g2):
 * the same arithmetic, so results are bit-identical wherever the chunk lives. */
#define COLS 16

void sh_layers_encoder_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe,
                           int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        const float *we = wte + (size_t)tok[n] * C;   /* (C) row of the token */
        const float *pe = wpe + (size_t)(n % T) * C;  /* (C) row of the position */
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
}

void sh_layers_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                           int B, int T, int C) {
    /* Tokens repeat, so rows of dwte receive several contributions: partition by
     * channel block and walk positions in order (deterministic, race-free). */
    int nblk = (C + COLS - 1) / COLS;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < nblk; cb++) {
        int c0 = cb * COLS, c1 = c0 + COLS < C ? c0 + COLS : C;
        for (int n = 0; n < B * T; n++) {
            const float *d = dout + (size_t)n * C;
            float *gw = dwte + (size_t)tok[n] * C;
            float *gp = dwpe + (size_t)(n % T) * C;
            for (int c = c0; c < c1; c++) {
                gw[c] += d[c];
                gp[c] += d[c];
            }
        }
    }
}

void sh_layers_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                             const float *w, const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= (float)C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        v /= (float)C;
        float s = sh_ln_rstd(v);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = sh_ln_out(x[c], m, s, w[c], b[c]);
        mean[n] = m;
        rstd[n] = s;
    }
}

void sh_layers_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C) {
    /* With xh = (x - mean) * rstd and y = xh * w + b:
     *   dxh = dy * w
     *   dx  = rstd * (dxh - mean_c(dxh) - xh * mean_c(dxh * xh))
     *   dw += sum_n dy * xh,  db += sum_n dy. */
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            float a = 0.0f, bsum = 0.0f;
            for (int c = 0; c < C; c++) {
                float xh = sh_ln_xhat(x[c], m, s);
                float dxh = dy[c] * w[c];
                a += dxh;
                bsum += dxh * xh;
            }
            a /= (float)C;
            bsum /= (float)C;
            float *dx = dinp + (size_t)n * C;
            for (int c = 0; c < C; c++) {
                float xh = sh_ln_xhat(x[c], m, s);
                float dxh = dy[c] * w[c];
                dx[c] += sh_ln_dx(dxh, a, xh, bsum, s);
            }
        }
    }
    /* this call's sums first, then one add into the gradient (see ACCUMULATION) */
    int nblk = (C + COLS - 1) / COLS;
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < nblk; cb++) {
        int c0 = cb * COLS, c1 = c0 + COLS < C ? c0 + COLS : C;
        float sw[COLS] = {0}, sb[COLS] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            for (int c = c0; c < c1; c++) {
                sw[c - c0] += dy[c] * sh_ln_xhat(x[c], m, s);
                sb[c - c0] += dy[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dw[c] += sw[c - c0];
            db[c] += sb[c - c0];
        }
    }
}

/* GEMMs are cut into a fixed number of row slabs (independent of the thread count, so
 * the result never depends on it) and the slabs run on OpenMP threads, with OpenBLAS
 * itself single-threaded (sh_layers_init): one thread pool, no spinning contention
 * between libgomp and OpenBLAS workers on a small machine. */
#define SLABS 8

static int slab_rows(int M) {
    int r = (M + SLABS - 1) / SLABS;
    return (r + 15) & ~15;
}

void sh_layers_init(void) { openblas_set_num_threads(1); }

int sh_layers_attention_slots(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void sh_layers_matmul_fwd(float *out, const float *inp, const float *W, const float *bias,
                          int N, int IC, int OC) {
    int rs = slab_rows(N), ns = (N + rs - 1) / rs;
#pragma omp parallel for schedule(static)
    for (int s = 0; s < ns; s++) {
        int r0 = s * rs, m = N - r0 < rs ? N - r0 : rs;
        /* out[r0:r0+m] (m,OC) = inp[r0:r0+m] (m,IC) * W(OC,IC)^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, OC, IC, 1.0f,
                    inp + (size_t)r0 * IC, IC, W, IC, 0.0f, out + (size_t)r0 * OC, OC);
        if (bias) {
            for (int n = r0; n < r0 + m; n++) {
                float *o = out + (size_t)n * OC;
                for (int j = 0; j < OC; j++) o[j] += bias[j];
            }
        }
    }
}

void sh_layers_matmul_bwd(float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                          const float *W, int N, int IC, int OC, float *wtmp) {
    if (dinp) {
        int rs = slab_rows(N), ns = (N + rs - 1) / rs;
#pragma omp parallel for schedule(static)
        for (int s = 0; s < ns; s++) {
            int r0 = s * rs, m = N - r0 < rs ? N - r0 : rs;
            /* dinp[r0:r0+m] (m,IC) = dout[r0:r0+m] (m,OC) * W(OC,IC) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, IC, OC, 1.0f,
                        dout + (size_t)r0 * OC, OC, W, IC, 0.0f, dinp + (size_t)r0 * IC, IC);
        }
    }
    int rs = slab_rows(OC), ns = (OC + rs - 1) / rs;
#pragma omp parallel for schedule(static)
    for (int s = 0; s < ns; s++) {
        int j0 = s * rs, m = OC - j0 < rs ? OC - j0 : rs;
        /* dW[j0:j0+m] (m,IC) += dout[:, j0:j0+m]^T (m,N) * inp (N,IC): into wtmp, then
         * one add (see ACCUMULATION); without wtmp straight into dW (beta = 1) */
        size_t o = (size_t)j0 * IC, cnt = (size_t)m * IC;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, IC, N, 1.0f, dout + j0, OC,
                    inp, IC, wtmp ? 0.0f : 1.0f, (wtmp ? wtmp : dW) + o, IC);
        if (wtmp)
            for (size_t k = 0; k < cnt; k++) dW[o + k] += wtmp[o + k];
        if (dbias) {
            for (int jb = j0; jb < j0 + m; jb += COLS) {
                int je = jb + COLS < j0 + m ? jb + COLS : j0 + m;
                float acc[COLS] = {0};
                for (int n = 0; n < N; n++) {
                    const float *d = dout + (size_t)n * OC;
                    for (int j = jb; j < je; j++) acc[j - jb] += d[j];
                }
                for (int j = jb; j < je; j++) dbias[j] += acc[j - jb];
            }
        }
    }
}

void sh_layers_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    /* Per (b,h), with Q,K,V the (T,hd) head slices of qkv (row stride 3C):
     *   S = Q K^T / sqrt(hd) (T,T); P = causal row softmax of S (P[t][t2>t] = 0);
     *   O = P V (T,hd) into out (row stride C). */
    int hd = C / NH;
    float scale = 1.0f / sqrtf((float)hd);
    int C3 = 3 * C;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *Q = qkv + (size_t)b * T * C3 + (size_t)h * hd;
            float *P = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, Q, C3, Q + C,
                        C3, 0.0f, P, T);
            for (int t = 0; t < T; t++) {
                float *a = P + (size_t)t * T;
                float mx = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) mx = a[t2] > mx ? a[t2] : mx;
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(a[t2] - mx);
                    a[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, P, T,
                        Q + 2 * C, C3, 0.0f, out + (size_t)b * T * C + (size_t)h * hd, C);
        }
    }
}

void sh_layers_attention_bwd(float *dqkv, float *datt, int nslots, const float *dout,
                             const float *qkv, const float *att, int B, int T, int C, int NH) {
    /* Per (b,h), with P the saved probabilities and dO the head slice of dout:
     *   dP = dO V^T, dV = P^T dO,
     *   dS[t][t2] = P[t][t2] (dP[t][t2] - sum_j P[t][j] dP[t][j]) / sqrt(hd)  (softmax bwd)
     *   dQ = dS K, dK = dS^T Q.
     * dP/dS live in the calling thread's (T,T) slot of datt; every (b,h) writes its own
     * q/k/v slices of dqkv completely (beta = 0), so dqkv needs no zeroing. */
    int hd = C / NH;
    float scale = 1.0f / sqrtf((float)hd);
    int C3 = 3 * C;
    if (nslots < 1) nslots = 1;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nslots)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
#ifdef _OPENMP
            float *S = datt + (size_t)omp_get_thread_num() * T * T;
#else
            float *S = datt;
#endif
            const float *Q = qkv + (size_t)b * T * C3 + (size_t)h * hd;
            const float *P = att + ((size_t)b * NH + h) * T * T;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * hd;
            float *dQ = dqkv + (size_t)b * T * C3 + (size_t)h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dO, C, Q + 2 * C,
                        C3, 0.0f, S, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, P, T, dO, C,
                        0.0f, dQ + 2 * C, C3);
            for (int t = 0; t < T; t++) {
                const float *p = P + (size_t)t * T;
                float *d = S + (size_t)t * T;
                float dot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) dot += p[t2] * d[t2];
                for (int t2 = 0; t2 <= t; t2++) d[t2] = sh_softmax_bwd(p[t2], d[t2], dot, scale);
                for (int t2 = t + 1; t2 < T; t2++) d[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, S, T, Q + C,
                        C3, 0.0f, dQ, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, S, T, Q, C3,
                        0.0f, dQ + C, C3);
        }
    }
}

/* GELU and its derivative: sh_elem.h (shared with the CUDA kernels). */
void sh_layers_gelu_fwd(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = sh_gelu(inp[i]);
}

void sh_layers_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = sh_gelu_grad(inp[i]) * dout[i];
}

void sh_layers_add_inplace(float *out, const float *a, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] += a[i];
}

double sh_layers_crossentropy_fwd(float *probs, float *losses, const int32_t *targets,
                                  int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *z = probs + (size_t)n * Vp;
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = z[i] > mx ? z[i] : mx;
        float sum = 0.0f;
        float zt = z[targets[n]] - mx;
        for (int i = 0; i < V; i++) {
            float e = expf(z[i] - mx);
            z[i] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++) z[i] *= inv;
        for (int i = V; i < Vp; i++) z[i] = 0.0f;
        /* -log softmax_y = log(sum exp(z - max)) - (z_y - max): no log(0) when p_y underflows */
        losses[n] = logf(sum) - zt;
    }
    double acc = 0.0;
    for (int n = 0; n < N; n++) acc += (double)losses[n];
    return acc / (double)N;
}

void sh_layers_crossentropy_bwd(float *dlogits, const float *probs, const int32_t *targets,
                                float dloss, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * Vp;
        float *d = dlogits + (size_t)n * Vp;
        int y = targets[n];
        for (int i = 0; i < V; i++) d[i] = sh_xent_grad(p[i], i == y, dloss);
        for (int i = V; i < Vp; i++) d[i] = 0.0f;
    }
}
