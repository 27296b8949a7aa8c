/*
 * rekls_tp.h — tensor-parallel REKLS: a weight split over a group of P ranks
 * along dim 0 (rows) or dim 1 (columns) gets exactly the update REKLS gives
 * the full m x n matrix, while its Kronecker factors are stored row-sharded.
 *
 * Per step, on every rank of the group:
 *  1. the local gradient shard (scaled) and the factor row blocks are
 *     all-gathered: full G [m x n], L [m x m], R [n x n];
 *  2. (lam, Q) = eigh(L), eigh(R) — the previous step's bases, recomputed
 *     instead of stored (at step 1: identity and zeros, as REKLS starts);
 *     they are bit-identical to what REKLS stored, as eigh of the same bits
 *     gives the same bits;
 *  3. steps 2-8 of REKLS on the full matrices (pt_rekls_core), redundantly on
 *     every rank: factor update, basis change, Adam, the full update D;
 *  4. rank r keeps rows [r m/P, (r+1) m/P) of L and [r n/P, (r+1) n/P) of R,
 *     and applies its slice of D (the rows or columns of its shard), with the
 *     decay of h->wd_mode on its shard (l2: the full W is gathered too, so
 *     the decay enters the full gradient where REKLS adds it).
 * So both factor sides must divide by P whichever dim the weight is split on
 * (the factors are row-sharded either way): other shapes are refused with a
 * sentence. A replicated weight (split 0) is plain REKLS (pt_rekls_step).
 *
 * State per rank: M, V full [m x n] (replicated), L rows [m/P x m], R rows
 * [n/P x n]. Scratch: pt_rekls_tp_ws_words. Bit-identity with single-rank
 * REKLS needs the eigendecomposition to be deterministic across the ranks
 * (same library, same input bits), as it is on the CPU path.
 *
 * The all-gather is a callback with the in-place semantics of a sharded
 * all-gather: buf holds n elements of elem_size bytes, rank p's part is
 * [p n/P, (p+1) n/P) (n divisible by P here); afterwards every rank holds
 * every part. pt_rekls_tp_gather_coll implements it over gpu/coll/coll.h.
 */
#ifndef PT_REKLS_TP_H
#define PT_REKLS_TP_H

#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"
#include "rekls.h"

typedef int (*pt_rekls_gather_fn)(void *ctx, void *buf, size_t n, size_t elem_size,
                                  const char *what, char *err, size_t errlen);

typedef struct pt_rekls_tp {
    int P, rank;                /* group size, this rank's index in it */
    int split;                  /* 1: split along dim 0 (rows), 2: along dim 1 (columns) */
    pt_rekls_gather_fn gather;
    void *gather_ctx;
} pt_rekls_tp;

/* Full shape m x n split over P ranks along split (0 = replicated, 1, 2):
 * PT_OK, or PT_ERR_INVALID_ARG with a sentence naming the side that does not
 * divide (both must, for split 1 and 2). */
int pt_rekls_tp_check(int64_t m, int64_t n, int P, int split, char *err, size_t errlen);
/* Scratch of one step: G, T [mn], C, X [d^2], L, Q_L [m^2], R, Q_R [n^2],
 * lam_L [m], lam_R [n], [mn] for regrouping a column split, and [mn] for the
 * full weights (gathered only for l2 decay, which adds wd W to the full
 * gradient after the factor update, as REKLS does). */
uint64_t pt_rekls_tp_ws_words(uint64_t m, uint64_t n);

/* One step's tensors. m x n is the FULL shape; grad, param (fp32) and
 * param_out are the local shard (m/P x n for split 1, m x n/P for split 2,
 * row-major); M, V full; L_loc [m/P x m], R_loc [n/P x n] this rank's factor
 * rows (zero before step 1); ws [pt_rekls_tp_ws_words] host memory. */
typedef struct pt_rekls_tp_tensors {
    int m, n;
    const void *grad;
    int grad_dtype;
    float *param;
    void *param_out;      /* compute-dtype copy to write, or NULL */
    int out_dtype;
    float *M, *V;
    float *L_loc, *R_loc;
    float *ws;
} pt_rekls_tp_tensors;

/* One step. CPU table only (the scratch is host memory). */
int pt_rekls_tp_step(const pt_rekls_la *la, const pt_rekls_hyper *h, const pt_rekls_tp *tp,
                     const pt_rekls_tp_tensors *x, char *err, size_t errlen);

/* The all-gather over a pt_coll group spanning exactly the P ranks (ctx =
 * the pt_coll *): coll's all-gather, whose parts are these blocks when n
 * divides by P (checked). f32 elements; bytes are copied, not added. */
int pt_rekls_tp_gather_coll(void *ctx, void *buf, size_t n, size_t elem_size, const char *what,
                            char *err, size_t errlen);

#endif /* PT_REKLS_TP_H */
