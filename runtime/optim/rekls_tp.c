/*
 * rekls_tp.c — tensor-parallel REKLS (see rekls_tp.h).
 */
#include <string.h>

#include "protrain.h"
#include "pt_util.h"
#include "rekls_ew.h"
#include "rekls_tp.h"

int pt_rekls_tp_check(int64_t m, int64_t n, int P, int split, char *err, size_t errlen) {
    if (P < 1 || split < 0 || split > 2 || m < 1 || n < 1)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "tensor-parallel REKLS: group size %d, split %d or shape %lld x %lld is "
                       "invalid (split 0 = replicated, 1 = rows, 2 = columns)",
                       P, split,
                       (long long)m, (long long)n);
    if (split && (m % P || n % P))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "tensor-parallel REKLS: the full shape %lld x %lld does not divide by the "
                       "group size %d (%s %lld); both sides must, because the Kronecker factors "
                       "(%lld x %lld and %lld x %lld) are stored in row blocks whichever dim the "
                       "weight is split on",
                       (long long)m, (long long)n, P,
                       m % P ? "rows" : "columns", (long long)(m % P ? m : n), (long long)m,
                       (long long)m, (long long)n, (long long)n);
    return PT_OK;
}

uint64_t pt_rekls_tp_ws_words(uint64_t m, uint64_t n) {
    uint64_t d = m > n ? m : n;
    return 4 * m * n + 2 * d * d + 2 * m * m + 2 * n * n + m + n;
}

/* Gathers a full m x n matrix from the local shards (split 1: m/P x n row
 * blocks, split 2: m x n/P column blocks): part [nloc] is this rank's shard,
 * out [mn] the full matrix, B [mn] scratch for the column regrouping. */
static int gather_full(const pt_rekls_tp *tp, int m, int n, const float *part, float *out,
                       float *B, const char *what, char *err, size_t errlen) {
    const int P = tp->P, r = tp->rank, ml = m / P, nl = n / P;
    const size_t mn = (size_t)m * n;
    if (tp->split == 1) {
        if (part) memcpy(out + (size_t)r * ml * n, part, (size_t)ml * n * sizeof *out);
        return tp->gather(tp->gather_ctx, out, mn, 4, what, err, errlen);
    }
    if (part) memcpy(B + (size_t)r * m * nl, part, (size_t)m * nl * sizeof *B);
    int rc = tp->gather(tp->gather_ctx, B, mn, 4, what, err, errlen);
    if (rc) return rc;
    for (int p = 0; p < P; p++)   /* parts are m x n/P blocks: regroup into rows of n */
        for (int i = 0; i < m; i++)
            memcpy(out + (size_t)i * n + (size_t)p * nl, B + ((size_t)p * m + i) * nl,
                   (size_t)nl * sizeof *out);
    return PT_OK;
}

int pt_rekls_tp_gather_coll(void *ctx, void *buf, size_t n, size_t elem_size, const char *what,
                            char *err, size_t errlen) {
    pt_coll *c = ctx;
    int P = pt_coll_world(c);
    if (elem_size != 4 || n % (size_t)P)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "tensor-parallel gather of %s: %zu elements of %zu bytes do not split "
                       "into %d f32 parts",
                       what, n, elem_size, P);
    /* n divides by P, so coll's parts (ceil(n / P) each) are exactly the n/P blocks */
    return pt_coll_allgather(c, buf, n, elem_size, what, err, errlen);
}

int pt_rekls_tp_step(const pt_rekls_la *la, const pt_rekls_hyper *h, const pt_rekls_tp *tp,
                     const pt_rekls_tp_tensors *x, char *err, size_t errlen) {
    const int m = x->m, n = x->n, grad_dtype = x->grad_dtype, out_dtype = x->out_dtype;
    const void *grad = x->grad;
    float *param = x->param, *M = x->M, *V = x->V, *L_loc = x->L_loc, *R_loc = x->R_loc;
    float *ws = x->ws;
    void *param_out = x->param_out;
    int rc = pt_rekls_tp_check(m, n, tp->P, tp->split, err, errlen);
    if (rc) return rc;
    if (!tp->split || !tp->gather || tp->rank < 0 || tp->rank >= tp->P || h->k < 1)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "tensor-parallel REKLS: needs a split (1 or 2), a gather and a rank in "
                       "[0, %d), got split %d rank %d (a replicated weight steps with plain "
                       "REKLS)",
                       tp->P, tp->split, tp->rank);
    const int P = tp->P, r = tp->rank, ml = m / P, nl = n / P;
    const size_t mn = (size_t)m * n, mm = (size_t)m * m, nn = (size_t)n * n;
    const size_t d2 = mm > nn ? mm : nn;
    float *G = ws, *T = G + mn, *C = T + mn, *X = C + d2, *L = X + d2, *QL = L + mm, *R = QL + mm,
          *QR = R + nn, *lamL = QR + nn, *lamR = lamL + m, *B = lamR + n, *Wf = B + mn;
    pt_rekls_ew_args a;
    memset(&a, 0, sizeof a);

    /* 1. full gradient (scaled into this rank's part, then gathered) */
    a.kind = PT_RK_GRAD_IN;
    a.src = grad;
    a.src_dtype = grad_dtype;
    a.a = h->grad_scale;
    a.n = tp->split == 1 ? (size_t)ml * n : (size_t)m * nl;
    a.x = tp->split == 1 ? G + (size_t)r * ml * n : B + (size_t)r * m * nl;
    la->ew(la->ctx, &a);
    if ((rc = gather_full(tp, m, n, NULL, G, B, "REKLS gradient", err, errlen))) return rc;
    /* l2 decay adds wd W to the full gradient after the factor update, as
     * single-rank REKLS does, so the full W is needed (one more gather, only in
     * that mode). The reference's tensor-parallel variant adds it to the local
     * gradient before the gather instead, which lets the decay into the
     * factors; keeping REKLS's order keeps every rank's shard equal to what
     * REKLS gives the full matrix in every mode. */
    int l2 = h->wd_mode == PT_REKLS_WD_L2 && h->weight_decay != 0;
    if (l2 && (rc = gather_full(tp, m, n, param, Wf, B, "REKLS weights (l2 decay)", err, errlen)))
        return rc;
    /* factors: row blocks in rank order */
    memcpy(L + (size_t)r * ml * m, L_loc, (size_t)ml * m * sizeof *L);
    memcpy(R + (size_t)r * nl * n, R_loc, (size_t)nl * n * sizeof *R);
    if ((rc = tp->gather(tp->gather_ctx, L, mm, 4, "REKLS left factor", err, errlen)) ||
        (rc = tp->gather(tp->gather_ctx, R, nn, 4, "REKLS right factor", err, errlen)))
        return rc;

    /* 2. the previous step's bases and eigenvalues */
    if (h->k == 1) {
        memset(QL, 0, mm * sizeof *QL);
        memset(QR, 0, nn * sizeof *QR);
        memset(lamL, 0, (size_t)(m + n) * sizeof *lamL);
        for (int i = 0; i < m; i++) QL[(size_t)i * m + i] = 1.0f;
        for (int i = 0; i < n; i++) QR[(size_t)i * n + i] = 1.0f;
    } else {
        memcpy(QL, L, mm * sizeof *QL);
        memcpy(QR, R, nn * sizeof *QR);
        if (la->eigh(la->ctx, m, QL, lamL) || la->eigh(la->ctx, n, QR, lamR))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "tensor-parallel REKLS on a %d x %d weight: eigh of the gathered "
                           "factors failed in fp32 and fp64",
                           m, n);
    }

    /* 3. REKLS steps 2-8 on the full matrices: D in G */
    pt_rekls_view s = {L, R, QL, QR, lamL, lamR};
    if ((rc = pt_rekls_core(la, h, m, n, s, M, V, G, l2 ? Wf : NULL, T, C, X, err, errlen)))
        return rc;

    /* 4. this rank's factor rows and its slice of the update */
    memcpy(L_loc, L + (size_t)r * ml * m, (size_t)ml * m * sizeof *L);
    memcpy(R_loc, R + (size_t)r * nl * n, (size_t)nl * n * sizeof *R);
    memset(&a, 0, sizeof a);
    a.kind = PT_RK_APPLY;
    a.a = h->lr;
    a.c0 = pt_rekls_decay(h);
    a.dst_dtype = out_dtype;
    if (tp->split == 1) {
        a.n = (size_t)ml * n;
        a.x = param;
        a.y = G + (size_t)r * ml * n;
        a.dst = param_out;
        la->ew(la->ctx, &a);
    } else {
        for (int i = 0; i < m; i++) {
            a.n = (size_t)nl;
            a.x = param + (size_t)i * nl;
            a.y = G + (size_t)i * n + (size_t)r * nl;
            a.dst = param_out ? (char *)param_out + (size_t)i * nl * pt_dtype_size(out_dtype) : NULL;
            la->ew(la->ctx, &a);
        }
    }
    return PT_OK;
}
