/*
 * rekls_store.h — REKLS's side of the chunk store, private to runtime/store/kinds'
 * rekls_store.c (which params, their state, the chunk steps, tensor parallel)
 * and rekls_dist.c (mode C: owners and their exchange). Its state hangs off
 * the store through one pointer per store (pt_store.opt: pt_rk_store) and
 * one per chunk (cs_chunk.opt: pt_rk_chunk), both allocated and freed here;
 * the store reaches them only through the table pt_optk_rekls (optim_kind.h).
 */
#ifndef PT_REKLS_STORE_H
#define PT_REKLS_STORE_H

#include "../store_internal.h"

/* One parameter stepped by REKLS. */
typedef struct rk_param {
    int param;                /* root index */
    int chunk;
    int m, n;                 /* FULL shape: shape[0] x shape[1], times tp_size along a split dim */
    int split;                /* tensor parallel: 0 = not split (or tp_size 1), 1 rows, 2 columns */
    uint64_t off;             /* byte offset in the chunk */
    uint64_t s;               /* fp32 state index in the chunk (its m / v slots) */
    uint64_t aux;             /* word offset in the chunk's aux block */
    uint64_t aux_words;       /* pt_rekls_aux_words(m, n); split: the factor row blocks
                                 (m/P x m and n/P x n) of tensor-parallel REKLS. The
                                 words a state image holds for it */
    /* mode C (its chunk split across the ranks, rekls_dist.c): the rank that
     * keeps its state and steps it, -1 otherwise. The owner's aux block is
     * [L R Q_L Q_R lam_L lam_R | M | V] (aux_words + 2mn words; the moments
     * are whole, so they cannot use the chunk's m / v parts, which stay
     * unused); other ranks hold nothing for it (aux = UINT64_MAX). */
    int owner;
    int reg;                  /* its region in the chunk */
    uint64_t e0;              /* its first element in that region */
    uint64_t aux_view;        /* word offset in the chunk's state-image view */
} rk_param;

/* A chunk's REKLS state: the factor/basis blocks of its 2-D params, on the
 * device when persistent, in host memory otherwise; rk[first .. first +
 * count) of the store's are its REKLS params. */
typedef struct pt_rk_chunk {
    float *aux;
    uint64_t aux_words;
    int first, count;
    /* mode C: the REKLS state of every param of the chunk in the image layout
     * (aux_words each, at aux_view) while a state image is written or read,
     * else NULL; view_words its length */
    float *view;
    uint64_t view_words;
} pt_rk_chunk;

/* The store's REKLS state: its params in layout order, per param the index
 * into rk or -1, the device scratch of the largest resident one, the device
 * eigh status, and a failure a CPU task met (read after the tasks are waited
 * for); per chunk its pt_rk_chunk. */
typedef struct pt_rk_store {
    rk_param *rk;
    int n_rk;
    int *rk_of;               /* [n_params] */
    float *d_ws;
    int *d_status;
    int failed;               /* mutex: the store's acct_mu */
    pt_rk_chunk *ch;          /* [n_chunks], each chunk's opt points into it */
    /* mode C (rekls_dist.c): per param the owner rank (-1: not in a split
     * chunk, or not REKLS's); what the pass moved and how long it took
     * (exchange in, owners' steps, exchange out) */
    int *owner;               /* [n_params] */
    int sh_steps;
    double sh_s[3];
    double sh_bytes[2];       /* bytes this rank received: gradients, updates */
} pt_rk_store;

static inline pt_rk_store *pt_rk_of_store(const pt_store *st) { return (pt_rk_store *)st->opt; }
static inline pt_rk_chunk *pt_rk_of_chunk(const cs_chunk *c) { return (pt_rk_chunk *)c->opt; }

/* rekls_store.c */
/* The store's REKLS state, made on first use (NULL: out of host memory). */
pt_rk_store *pt_rk_store_get(pt_store *st);
/* The REKLS eligibility rule. */
int pt_rk_eligible(const pt_store *st, int i);
/* The REKLS hyper-parameters of step `step` (1-based) from the optimizer state
 * and the [optimizer] REKLS keys. */
pt_rekls_hyper pt_rk_hyper(const pt_store *st, float lr, float gs, int64_t step);
void pt_rk_plan_chunk(pt_store *st, cs_chunk *c);
int pt_rk_plan_store(pt_store *st, char *err, size_t errlen);
int pt_rk_init(pt_store *st, char *err, size_t errlen);
void pt_rk_fini(pt_store *st);
int pt_rk_whole_task(const cs_chunk *c);
/* The CPU step of chunk c: REKLS params by pt_rekls_step, the others by AdamW;
 * a chunk without REKLS params is AdamW's (pt_optk_adamw). */
void pt_rk_cpu_step(pt_store *st, cs_chunk *c, const pt_optim_cpu *a);
int pt_rk_dev_step(pt_store *st, cs_chunk *c, float lr, float gs, char *err, size_t errlen);
/* After the global norm: tensor-parallel REKLS of every split param (layout
 * order on the calling thread: every rank makes the same collectives in the
 * same order), then mode C's owners' pass. */
int pt_rk_pass(pt_store *st, float lr, float gs, char *err, size_t errlen);
int pt_rk_failed(pt_store *st);
float *pt_rk_param_state(pt_store *st, int i, uint64_t *words);

/* rekls_dist.c — REKLS in mode C. The owner of every REKLS param of a split
 * chunk (owner[]) and, when plan is set, each split chunk's terms.own_words =
 * the words this rank owns; after the chunks are set up. */
int pt_rk_sh_owners(pt_store *st, int plan, char *err, size_t errlen);
/* optimizer_step, after the global norm: every split REKLS param's reduced
 * gradient gathered whole at its owner, stepped there, and the update sent back
 * to every rank's part and applied (on the calling thread; a collective). */
int pt_rk_sh_pass(pt_store *st, float lr, float gs, char *err, size_t errlen);
/* Chunk c's AdamW over this rank's parts, skipping its REKLS params. */
void pt_rk_sh_adam(pt_store *st, cs_chunk *c, const pt_adamw_consts *k, int from_acc);
/* State images: every split chunk's REKLS state in image layout (view), from
 * the owners (gather = 1: a collective); close: the owners take theirs back
 * (scatter = 1) and the views are freed. */
int pt_rk_sh_views_open(pt_store *st, int gather, char *err, size_t errlen);
void pt_rk_sh_views_close(pt_store *st, int scatter);
/* Where an image finds param q's REKLS state words: the view while open, else
 * the chunk's own block; NULL when this rank holds none of it. */
float *pt_rk_state(pt_store *st, const rk_param *q);

#endif
