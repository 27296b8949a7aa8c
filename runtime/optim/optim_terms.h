/*
 * optim_terms.h — what an optimizer kind's own state and work amount to for
 * one chunk, as the planner and the store's footprints count them, and the
 * CPU rates a kind's time model is measured with. Kind-neutral: the kinds
 * (the store's runtime/store/kinds) fill them, the profiler and the planner
 * read them.
 */
#ifndef PT_OPTIM_TERMS_H
#define PT_OPTIM_TERMS_H

#include <stdint.h>

/* A chunk's optimizer state beyond its Adam moments, as the planner and the
 * store's footprints count it (zero for AdamW). Words are fp32. */
typedef struct pt_optim_terms {
    uint64_t aux_words;       /* state words (device when resident, pinned when offloaded) */
    uint64_t ws_words;        /* the largest device scratch of its params */
    double gemm_flops, eigh_flops;   /* one step of its params */
    int n_params;             /* params the kind steps with that state */
    /* tensor parallel: fp32 bytes of its split params' full gradients and
     * factors, which every step gathers */
    uint64_t tp_grad_bytes, tp_fac_bytes;
    uint64_t mn;              /* sum of its params' m n */
    uint64_t own_max;         /* the largest aux + 2 m n of one param */
    uint64_t own_words;       /* mode C, split chunk: the words this rank owns */
} pt_optim_terms;

/* A kind's measured CPU rates for its time model, owned by the caller (one
 * per profile, zeroed before the first chunk): the kind fills w on its first
 * need and sets measured, so the probes run once per profile and only when
 * some chunk has work to time. */
typedef struct pt_optim_rates {
    int measured;
    double w[8];
} pt_optim_rates;

#endif
