/*
 * sh_gpt.h — the GPT-2 model of sample_host: parameter table (pt_param_v1, in the
 * order the plugin sees), initialisation, activation-arena layout and the per-block
 * forward/backward. The model never owns parameter storage: every kernel reads
 * params[i].data / params[i].grad at the moment of use (protrain.h contract 2).
 */
#ifndef SH_GPT_H
#define SH_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "protrain.h"
#include "sh_ops.h"
#include "sh_rng.h"

typedef struct sh_dims {
    int V;     /* vocabulary (loss/softmax range) */
    int Vp;    /* padded vocabulary: rows of wte, columns of the logits */
    int maxT;  /* rows of wpe */
    int L;     /* transformer blocks */
    int NH;    /* attention heads */
    int C;     /* channels */
} sh_dims;

/* Per-layer parameter slots, in declaration order inside a block. */
enum {
    SH_LN1W,
    SH_LN1B,
    SH_QKVW,
    SH_QKVB,
    SH_ATTPROJW,
    SH_ATTPROJB,
    SH_LN2W,
    SH_LN2B,
    SH_FCW,
    SH_FCB,
    SH_FCPROJW,
    SH_FCPROJB,
    SH_NLP
};
#define SH_P_WTE 0
#define SH_P_WPE 1
#define SH_P_LAYER(l, k) (2 + SH_NLP * (l) + (k))
#define SH_P_LNFW(L) (2 + SH_NLP * (L))
#define SH_P_LNFB(L) (3 + SH_NLP * (L))
#define SH_P_HEAD(L) (4 + SH_NLP * (L))
#define SH_N_PARAMS(L) (5 + SH_NLP * (L))

typedef struct sh_model {
    sh_dims d;
    int n_params;
    pt_param_v1 *params;   /* (n_params) descriptors handed to the plugin */
    char (*names)[24];     /* storage for params[i].name */
    size_t *off;           /* (n_params) float offset of param i in the flat layout;
                              the tied head has its target's offset */
    size_t n_floats;       /* total floats of all untied params (flat layout size) */
    float *init;           /* (n_floats) host initial values, NULL once handed over */
    const sh_layer_ops *ops; /* the layers the passes run on; NULL = the CPU layers */
    /* OSFT (the plugin reports osft_targets > 0): the plugin's table and ctx; a
     * projection weight whose data is NULL inside its block's window runs through
     * osft_linear_forward / _backward. NULL otherwise. */
    const pt_plugin_v1 *osft_tbl;
    void *osft_ctx;
    int32_t *osft_status;  /* the first failed hook's status (trainer-owned), or NULL */
} sh_model;

/* Validate dims (one sentence into err on failure) and round Vp up to 128 if 0. */
int sh_model_dims_check(sh_dims *d, char *err, size_t errlen);
/* Build the descriptor table and a zeroed init buffer. data/grad stay NULL. */
int sh_model_create(sh_model *m, const sh_dims *d, char *err, size_t errlen);
void sh_model_destroy(sh_model *m);
/* GPT-2 init into m->init: N(0, 0.02) weights and embeddings, residual projections
 * (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1, padded
 * wte rows 0. Deterministic in seed. */
void sh_model_init_random(sh_model *m, uint64_t seed);
size_t sh_model_param_numel(const pt_param_v1 *p);
/* Next token from one row of logits over the first V entries: the largest when
 * temperature <= 0, else drawn from softmax(logits / temperature) with rng
 * (inverse-CDF in double, one uniform per call). */
int sh_model_pick_token(const float *logits, int V, float temperature, sh_rng *rng);

/* Float offsets of the saved activations of one block inside its arena (N = B*T). */
typedef struct sh_arena_layout {
    size_t ln1, ln1_mean, ln1_rstd; /* (N,C) (N) (N) */
    size_t qkv;                     /* (N,3C) */
    size_t atty;                    /* (N,C) attention output before the projection */
    size_t att;                     /* (B,NH,T,T) softmax probabilities */
    size_t res2;                    /* (N,C) x + attproj: residual after attention */
    size_t ln2, ln2_mean, ln2_rstd; /* (N,C) (N) (N) */
    size_t fch, fch_gelu;           /* (N,4C) (N,4C) */
    size_t total;                   /* floats in the arena */
} sh_arena_layout;
void sh_model_arena_layout_make(sh_arena_layout *lay, const sh_dims *d, int B, int T);
/* tiled != 0: the layout when the MLP runs in tiles (TiledMLP): fch and fch_gelu
 * are not saved (size 0), everything else as above. */
void sh_model_arena_layout_make_t(sh_arena_layout *lay, const sh_dims *d, int B, int T, int tiled);

/* Backward scratch of one block (floats): dbig (N,4C), dsmall (N,C), datt of nslots
 * (T,T) attention slots (the layer table's attention_slots), and wtmp (4C,C) for weight
 * gradients. */
typedef struct sh_scratch {
    float *dbig, *dsmall, *datt, *wtmp;
    int nslots;
} sh_scratch;

/* Block l forward: x (N,C) -> arena, out (N,C) = block(x). out may not alias x. */
void sh_model_block_fwd(const sh_model *m, int l, float *arena, const float *x, float *out,
                        int B, int T);
/* Block l backward: dres (N,C) holds dL/d out on entry and dL/d x on return;
 * parameter gradients accumulate (+=). */
void sh_model_block_bwd(const sh_model *m, int l, const float *arena, const float *x, float *dres,
                        const sh_scratch *s, int B, int T);

/* The block split at the MLP, for TiledMLP (the whole-block functions above are
 * these run in order over all N rows).
 * sh_model_block_fwd_attn: x -> arena up to ln2 (ln1, qkv, attention, res2, ln2).
 * sh_model_mlp_fwd / sh_model_mlp_bwd: the MLP on n consecutive rows (tokens) of the (N,C)
 * activations — the MLP is token-wise, so any row range is exact:
 *   fch = inp fcw^T + fcb (n,4C); fch_gelu = gelu(fch); out = fch_gelu fcprojw^T +
 *   fcprojb + res (skipped when out is NULL: a tile's recompute);
 *   backward: dinp (n,C) = d inp (overwritten), weight gradients += (through wtmp,
 *   or straight into the gradient with beta = 1 when wtmp is NULL).
 * sh_model_block_bwd_attn: from dres = dL/d out and s->dsmall = d ln2: the rest. */
typedef struct sh_mlp_rows {
    int n;                  /* rows */
    const float *inp, *res; /* (n,C): ln2 rows, res2 rows */
    float *out;             /* (n,C) or NULL */
    float *fch, *fch_gelu;  /* (n,4C) */
    const float *dout;      /* (n,C) dL/d out */
    float *dinp;            /* (n,C) */
    float *dbig;            /* (n,4C) backward scratch */
    float *wtmp;            /* (4C,C) or NULL */
} sh_mlp_rows;
void sh_model_block_fwd_attn(const sh_model *m, int l, float *arena, const float *x, int B, int T,
                             int tiled);
void sh_model_mlp_fwd(const sh_model *m, int l, const sh_mlp_rows *r);
void sh_model_mlp_bwd(const sh_model *m, int l, const sh_mlp_rows *r);
void sh_model_block_bwd_attn(const sh_model *m, int l, const float *arena, const float *x, float *dres,
                             const sh_scratch *s, int B, int T, int tiled);

/* Non-block activations: final LayerNorm and logits. */
typedef struct sh_head_acts {
    float *lnf, *lnf_mean, *lnf_rstd; /* (N,C) (N) (N) */
    float *logits;                    /* (N,Vp): logits, then probabilities in place */
    float *losses;                    /* (N) */
} sh_head_acts;

/* Final LayerNorm + tied LM head on xL (N,C). With targets: softmax over V in place and
 * the mean cross-entropy is added to *loss_acc (when not NULL; memory of the device the
 * layers run on); without targets (NULL): raw logits are left. */
void sh_model_head_fwd(const sh_model *m, const sh_head_acts *a, const float *xL,
                       const int32_t *targets, int B, int T, double *loss_acc);
/* Head backward from the probabilities: dres (N,C) is OVERWRITTEN with dL/d xL;
 * dsmall (N,C) is scratch; dloss scales every position's loss gradient. */
void sh_model_head_bwd(const sh_model *m, const sh_head_acts *a, const float *xL,
                       const int32_t *targets, float dloss, float *dres, float *dsmall, int B, int T);

#endif /* SH_GPT_H */
