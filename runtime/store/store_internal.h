/*
 * store_internal.h — the chunk store's private state, shared by the files of
 * runtime/store only: model_state.c (layout, storage, load), footprint.c
 * (bytes per chunk, the pinned budget), param_access.c (one parameter's
 * values and home), chunk_runtime.c
 * (gather/release, prefetch, gradient offload), optim_step.c (optimizer_step:
 * clipping, device and CPU optimizer steps),
 * activations.c (arenas), state_io.c (images and files), dist_grad.c (gradients
 * across ranks) and dist_shard.c (mode C's parts); and by the optimizer kinds
 * in kinds/ (kinds/optim_kind.h: optim_kind.c, rekls_store.c, rekls_dist.c).
 * Other code outside runtime/store uses store.h.
 *
 * Storage per chunk (S = chunk capacity in bytes, E = fp32 state elements =
 * sum over its trainable regions of bytes / elem_size, padding included):
 * (U = bytes used by its params, <= S: resident and pinned copies are U long)
 *   persistent:  d_param [U] compute dtype, d_grad [U], d_m/d_v [E] fp32,
 *                d_master [E] fp32 only when a trainable region is 16-bit.
 *   offloaded:   h_param [U] pinned, compute dtype (fp32 regions ARE the master,
 *                16-bit regions are the staged copy the next upload reads),
 *                h_gstage [U] pinned (gradient landing zone, compute dtype),
 *                h_m/h_v [E], h_master [E] (16-bit regions), h_gacc [E] fp32
 *                (accumulated gradient, only when n_micro > 1).
 *   tiered (tier/tier.h, [nvme] path): h_m, h_v, h_master (level 2: every host
 *                buffer above) live in the tier's file and point into a staging
 *                slot only while the chunk is held there (or into a state view).
 *   Streamed chunks live on the device only inside a buffer-pool slot of 2*S_chunk
 *   bytes: [0, S) params, [S, 2S) gradients.
 *   sharded (mode C, dist_shard.c): an offloaded chunk keeps only this rank's part of
 *                every region (pt_coll_part: s = ceil(n / world) elements): h_param
 *                [sum of s*es, each region 64-byte aligned], h_gstage, h_m, h_v,
 *                h_gacc [E'] fp32 with E' = sum over trainable regions of s;
 *                reg_state[] then indexes those shard arrays.
 */
#ifndef PT_STORE_INTERNAL_H
#define PT_STORE_INTERNAL_H

#include <pthread.h>

#include "coll/coll.h"
#include "device_ext.h"
#include "buffer_pool.h"
#include "chunk_layout.h"
#include "kinds/optim_kind.h"
#include "optim/optim.h"
#include "ord_bits.h"
#include "store.h"
#include "tier/tier.h"

typedef struct pt_arena {
    int mode;             /* PT_ACT_* */
    void *ptr;            /* device bytes of the block's saved activations, or NULL */
    uint64_t bytes;       /* size the host asked for */
    int live;             /* forward saved it and its backward has not run yet */
    void *host;           /* SWAP: pinned copy */
    uint64_t host_bytes;
    int swapping_out, swapping_in;
    int32_t done_at;      /* SWAP: the last forward window holding the arena (plan), -1 = none */
    pt_event *ev_out, *ev_in;
} pt_arena;

/* Mode C: this rank's part of one region of an offloaded chunk (dist_shard.c). */
typedef struct cs_shreg {
    uint64_t n;          /* region elements */
    uint64_t s;          /* part length every rank stores: ceil(n / world) */
    uint64_t lo, own;    /* this rank's part: elements [lo, lo + own) of the region */
    uint64_t hp_off;     /* byte offset of the part in h_param */
    uint64_t st_full;    /* the region's state offset in the unsharded layout */
    uint64_t st_sh;      /* and in this rank's shard arrays (UINT64_MAX: frozen) */
} cs_shreg;

typedef struct cs_shard {
    cs_shreg *r;         /* [n_regions] */
    uint64_t p_bytes;    /* h_param bytes (the parts, each 64-byte aligned) */
    uint64_t n_state_full; /* fp32 state elements of the whole chunk */
    /* full-chunk views while a state image is written or read (dist_shard.c) */
    void *keep_param;
    float *keep_m, *keep_v;
} cs_shard;

typedef struct cs_chunk {
    const pt_chunk *lc;       /* layout chunk */
    int id;
    int persistent;
    int trainable;            /* any trainable region */
    int has16;                /* a trainable 16-bit region (needs fp32 masters) */
    uint64_t cap, used, n_state;
    uint64_t *reg_state;      /* [n_regions] state offset (elements), UINT64_MAX if frozen */
    /* persistent */
    void *d_param, *d_grad;
    float *d_master, *d_m, *d_v;
    /* offloaded */
    void *h_param, *h_gstage;
    float *h_master, *h_m, *h_v, *h_gacc;
    cs_shard *sh;             /* mode C: this rank's parts (dist_shard.c), else NULL */
    int tiered;               /* 0, or the disk tier's level (tier/tier.h): its host
                               * buffers there are NULL outside holds and views */
    int tier_ahead;           /* hook thread: a hold taken at block_pre_backward for
                               * the step offload_grad will queue */
    /* runtime (hook thread only, except where noted) */
    int slot;                 /* pool slot while leased, else -1 */
    int users;                /* gathers by blocks (pointers set while > 0) */
    int prefetched;           /* holds one lease taken by a prefetch */
    int bwd_zeroed;           /* grad half zeroed in this micro-batch's backward */
    int stepped;              /* the CPU optimizer stepped it this step */
    pt_event *ev_up;          /* upload into its slot done */
    pt_event *ev_d2h;         /* gradient copy to h_gstage done */
    pt_task_group tg;         /* its CPU task (accumulate / norm / step) */
    pt_task_group sg;         /* its deferred step alone: what its next upload waits for
                               * (never a gradient task, which waits for the device) */
    /* snapshot the CPU task works from (written before submit) */
    int t_micro, t_n_micro, t_step_now, t_norm;
    int t_rc;                 /* status of its last CPU task: written by the worker, read
                               * (pt_cs_wait_task) only after waiting for tg */
    pt_adamw_consts t_consts;
    float t_lr;               /* lr and 1-based step of an overlapped step */
    int64_t t_k;
    /* this step's CPU work on the chunk (host clock, written by the worker,
     * read after waiting for tg): the durations of the tasks of earlier
     * micro-batches, and the last task's interval */
    double t_early, t_start, t_end;
    /* the store, set once at setup: the host functions on the streams (a
     * deferred step's wait, the disk tier's) find it through the chunk */
    struct pt_store *owner;
    /* a step optimizer_step left running (deferred into the next forward): the
     * chunk's next upload waits for it on the h2d stream (written by the hook
     * thread before submit; the task reads them) */
    pt_adamw_consts s_consts;
    int s_acc;
    float s_lr, s_gs;         /* the same step's lr, clip scale and 1-based step */
    int64_t s_k;
    int step_pending;         /* hook thread: set at submit; cleared by the first lease
                               * (which queues the upload's wait) or a hook-thread wait */
    /* the optimizer kind's state beyond the Adam moments: its planner terms
     * (the kind planned for fills them at layout time, so the footprints below
     * and the planner count them), and its own per-chunk state (the kind in
     * force allocates and frees it; NULL for AdamW) */
    pt_optim_terms plan;
    void *opt;
} cs_chunk;

struct pt_store {
    pt_store_env env;         /* lent by the caller */
    int n_blocks;
    pt_store_knobs kn;
    int no_init_upload;       /* values come from a state image, not the host's tensors */
    int opt_ready;            /* optimizer state allocated */
    pt_event *ev_compute;     /* recorded on s_compute where a copy stream must wait for it */
    pt_event *ev_bwd;         /* recorded on s_compute behind the end-of-backward stamp */
    double bwd_done;          /* host clock when the device finished this step's backward
                               * (the stamp runs on the stream; mutex: acct_mu) */
    int profiling;            /* pt_store_set_profiling */
    int shard;                /* mode C: offloaded chunks split across the ranks */
    int rank, world;          /* of the data-parallel group (0, 1 without one) */
    double coll_b[3];         /* mode C: bytes of the buffers all-gathered / reduce-scattered */
    double coll_s[3];         /* seconds in all-reduce, all-gather, reduce-scatter (hook thread;
                               * the all-reduce's counted after backward: what is exposed) */
    /* several ranks (dist_grad.c): resident gradients all-reduced in buckets during backward */
    pt_coll_op **gop;         /* [lay.n_regions] this step's started all-reduce of a region */
    pt_event **ev_bkt;        /* [n_chunks] a resident chunk's backward ended on s_compute */
    int *bq;                  /* [n_chunks] chunks whose backward ended, in that order */
    int bq_n, bq_started;     /* queued this step; the first bq_started have their all-reduces */
    int bk_hook, bk_drain;    /* buckets started at a block hook / in optimizer_step (this step) */
    int bk_off;               /* of them offloaded chunks (mode B) */
    int bk_logged;            /* the first step's buckets were logged */
    /* activations */
    pt_arena *arena;          /* [n_blocks] */
    uint64_t swap_out_bytes;  /* cumulative */
    int64_t recomputes;       /* cumulative recompute_block calls */
    /* chunks */
    pt_layout lay;
    int n_chunks, n_persist, n_buffer, n_offloaded;
    int np_fixed, nb_fixed;   /* knobs fixed by the INI (1) or chosen (0) */
    cs_chunk *ch;
    int n_params;
    int *root;                /* [n_params] storage owner */
    int *root_tr;             /* [n_params] for roots: 1 when any member is trainable */
    int *tied;                /* [n_tied] params whose storage is another's */
    int n_tied;
    double *psq;              /* [n_params] squared grad norm per root (clipping) */
    pt_bufpool *pool;
    pt_event **slot_free;     /* [n_buffer] last D2H out of the slot done */
    pt_event **slot_used;     /* [n_buffer] the compute stream's last use of the slot */
    pt_pool *workers;
    double *norm_dev;         /* [n_params] device squared norms (clipping) */
    void *d_gtmp;             /* fp32 scratch for 16-bit persistent grads */
    uint64_t gtmp_elems;
    int gacc_ready;           /* h_gacc allocated */
    int lr_set;               /* set_lr called for the coming step */
    float lr_next;
    int overlapped;           /* CPU steps that already ran with lr_next */
    /* clip_grad_norm (optim_step.c), reset by optimizer_step: */
    int want_norm;            /* the host asked for this step's norm: tasks compute it */
    int clip_ann;             /* the host announced clipping: no CPU step before the norm */
    float clip_step;          /* this step's max norm from the host (0: the optimizer's) */
    int reduced;              /* this step's gradients are waited for and reduced */
    int normed;               /* this step's norm and clip scale are computed (step_gs) */
    float step_gs;
    uint64_t pinned_bytes, persist_bytes, buffer_bytes;
    double pin_seconds;
    double cpu_optim_s;       /* CPU optimizer work, summed over tasks (mutex: workers add) */
    double optim_wait_s;      /* optimizer_step's wait for the CPU tasks, plus the time
                               * uploads waited for deferred steps (acct_mu) */
    double cpu_hidden_s;      /* CPU optimizer work done before the device finished backward */
    pthread_mutex_t acct_mu;
    /* the optimizer kind in force (kinds/optim_kind.h: the one planned for until
     * create_optimizer, then the one it chose) and its per-store state, which
     * it allocates and frees (NULL for AdamW) */
    const pt_optim_kind *ok;
    void *opt;
    pt_tier *tier;            /* the disk tier ([nvme] path) when some chunk is tiered */
    int tier_slots;           /* its staging slots ([nvme] staging_slots, auto resolved) */
    int tier_want;            /* auto: the slots that read a whole block ahead (0: fixed) */
};

/* footprint.c: device bytes of a resident chunk, pinned bytes of an offloaded
 * one (rounded: each allocation as the pinned arena carves it), the optimizer
 * kind's device share, and the pinned budget check of `need` bytes. */
uint64_t pt_ms_chunk_dev_bytes(const cs_chunk *c);
uint64_t pt_ms_chunk_host_bytes(const cs_chunk *c);
uint64_t pt_ms_chunk_pinned(const cs_chunk *c, int rounded);
uint64_t pt_ms_chunk_optim_dev_bytes(const cs_chunk *c);
int pt_ms_check_pinned(pt_store *st, uint64_t need, char *err, size_t errlen);
/* The pinned bytes the chunks may take: [memory] pinned_budget, or auto 90% of
 * MemAvailable. */
uint64_t pt_ms_pinned_limit(const pt_store *st);
/* Pinned bytes a profiling run times the copy rates with, at chunk size s:
 * max(2 s, 64 KiB) (profiler_hw.c; where the budget leaves less it times at
 * what is left). */
uint64_t pt_ms_profile_pinned(uint64_t s);

/* The device backend's op table and its instance (one helper for the store). */
static inline const pt_gpu_backend *OPS(pt_store *st) { return pt_gpu_ops(st->env.gpu); }
static inline void *IMPL(pt_store *st) { return pt_gpu_impl(st->env.gpu); }

/* chunk_runtime.c: gather, release, and the CPU side of a chunk's gradient
 * during backward; helpers optim_step.c shares with it. */
/* After chunk c's CPU step, inside its task: the caller's chunk_stepped. */
void pt_cs_stepped(pt_store *st, cs_chunk *c);
/* Negative control of PT_ORD_STEPPED: chunk_stepped runs before the step. */
int pt_cs_stepped_first(const pt_store *st);
/* This step clips (the optimizer's max_grad_norm or the host's clip_grad_norm);
 * this step's gradient norm is computed (clipping, or the host asked for it). */
int pt_store_clips(const pt_store *st);
int pt_store_want_norms(const pt_store *st);
/* Accounting (stats): CPU optimizer seconds, and seconds waited for them. */
void pt_cs_add_optim_time(pt_store *ms, double dt);
void pt_cs_add_optim_wait(pt_store *ms, double dt);
/* The CPU optimizer work of this step that ran before the device finished
 * backward, into cpu_hidden_s (after every task is done). */
int pt_cs_account_hidden(pt_store *st, char *err, size_t errlen);
/* AdamW constants of the next step (t + 1) at lr with gradient scale gs. */
void pt_cs_step_consts(pt_store *st, float lr, float gs, pt_adamw_consts *k);
/* After the last block's backward of the step's last micro-batch: note (on the
 * compute stream) when the device is done with backward, so optimizer_step can
 * tell how much CPU optimizer work ran before that. */
int pt_cs_note_backward_end(pt_store *st, char *err, size_t errlen);
/* Ordering `bit` (PT_ORD_*) is in force: ordered and not skipped by a test. */
static inline int pt_cs_ord(const pt_store *st, unsigned bit) {
    return st->env.ordered && !(st->env.skip & bit);
}
/* Ordered: copy stream s waits for everything queued on s_compute so far. */
int pt_cs_after_compute(pt_store *st, pt_stream *s, unsigned bit);
/* Ordered: s_compute waits for event e (an upload); else the host's thread does. */
int pt_cs_compute_waits(pt_store *st, pt_event *e);
/* Free device bytes the host's compute may still use (stream-ordered when ordered);
 * a failed poison fill is logged. */
void pt_cs_free(pt_store *st, void *p);
/* Wait for chunk c's CPU task and return the status it left (once), with a
 * sentence naming `hook` and what failed on the worker. */
int pt_cs_wait_task(pt_store *st, cs_chunk *c, const char *hook, char *err, size_t errlen);
/* Device AdamW arguments for n state elements of chunk c at state offset s:
 * moments, hyper-parameters, bias corrections of step t+1 and grad scale gs
 * (param, grad and param_out are the caller's). */
pt_adamw_args pt_store_adamw_args(const pt_store *st, cs_chunk *c, uint64_t s, size_t n, float lr,
                                  float gs);
int pt_cs_init_runtime(pt_store *st, char *err, size_t errlen);
void pt_cs_fini_runtime(pt_store *st);
void pt_cs_set_pointers(pt_store *st, cs_chunk *c, void *param_base, void *grad_base);
int pt_cs_gather(pt_store *st, int32_t b, int backward, char *err, size_t errlen);
/* Tensor parallel ([dist] tp_size > 1): the group size, else 1 (dist_grad.c). */
int pt_cs_tp_size(const pt_store *st);

/* Squared norms of chunk c's parameters into psq[], from the fp32 accumulator
 * (from_acc) or the staged gradient. */
void pt_cs_chunk_norms(pt_store *st, cs_chunk *c, int from_acc);
/* The same on the hook thread after the chunk's tasks: a whole image on the
 * disk tier is held in a staging slot meanwhile. Non-zero: the tier failed. */
int pt_cs_chunk_norms_held(pt_store *st, cs_chunk *c, int from_acc, char *err, size_t errlen);
/* Data parallel (env.coll): every trainable gradient becomes the mean over the
 * ranks, before clipping and the optimizer (dist_grad.c). */
int pt_cs_dist_reduce(pt_store *st, char *err, size_t errlen);
/* Buckets: after block b's backward of the step's last micro-batch, every
 * resident chunk whose gradient that completed is queued (an event on the
 * compute stream marks the end of its backward); queued chunks' all-reduces
 * start as their events complete, checked at every later hook (poll) and in
 * optimizer_step (drain: until every queued one has started); pt_cs_dist_reduce
 * then waits for them in layout order. */
int pt_cs_dist_bucket(pt_store *st, int32_t b, char *err, size_t errlen);
int pt_cs_dist_poll(pt_store *st, char *err, size_t errlen);
int pt_cs_dist_drain(pt_store *st, char *err, size_t errlen);
/* Drops every started all-reduce (teardown, or a step abandoned between its
 * backward and optimizer_step: the group is broken then) and the events. */
void pt_cs_dist_fini(pt_store *st);
int pt_cs_release(pt_store *st, int32_t b, int backward, char *err, size_t errlen);
/* Before block b's backward: the disk tier's reads of the chunks whose CPU step
 * the release after it will queue (lowest block b, stepping during backward),
 * in the order it queues them, so each read runs during the block's backward. */
void pt_cs_tier_ahead(pt_store *st, int32_t b);

/* dist_shard.c — mode C. Geometry of chunk c's parts (after reg_state is set for the
 * unsharded layout; rewrites reg_state and n_state for the parts). */
int pt_sh_setup(pt_store *st, cs_chunk *c, char *err, size_t errlen);
void pt_sh_free(cs_chunk *c);
/* Pinned bytes of a sharded chunk as allocated (rounded: as the arena carves). */
uint64_t pt_sh_pinned(const cs_chunk *c, int rounded);
/* The host's initial values: this rank's parts of chunk c into h_param. */
void pt_sh_init_values(pt_store *st, cs_chunk *c);
/* Gather: upload this rank's parts into the slot at dst (h2d stream), record
 * ev_up, wait for it, all-gather the rest from the other ranks. */
int pt_sh_upload(pt_store *st, cs_chunk *c, void *dst, char *err, size_t errlen);
/* After the chunk's backward: reduce-scatter the slot's gradient (g) across the
 * ranks and copy this rank's parts into h_gstage (d2h stream, ev_d2h and the
 * slot's slot_free recorded). */
int pt_sh_grad_out(pt_store *st, cs_chunk *c, void *g, char *err, size_t errlen);
void pt_sh_accumulate(cs_chunk *c, int first);
void pt_sh_adam(cs_chunk *c, const pt_adamw_consts *k, int from_acc);
void pt_sh_norms(pt_store *st, cs_chunk *c, int from_acc);
/* Clipping: the sharded params' partial squared norms summed across the ranks
 * (one all-reduce). */
int pt_sh_norm_reduce(pt_store *st, char *err, size_t errlen);
/* State images: full-chunk views of every sharded chunk's params and moments
 * swapped in (gather = 1 fills them from every rank: a collective), and out
 * again (scatter = 1 first copies this rank's parts back from them). */
int pt_sh_views_open(pt_store *st, int gather, char *err, size_t errlen);
void pt_sh_views_close(pt_store *st, int scatter);
/* read_param of a parameter in a sharded chunk: the chunk's parameters
 * all-gathered into a temporary, so a collective: every rank reads the same
 * parameters in the same order. */
int pt_sh_read_param(pt_store *st, cs_chunk *c, uint64_t off, void *dst, size_t bytes,
                     char *err, size_t errlen);
/* activations.c */
const char *pt_acts_mode_name(int m);
int pt_acts_init(pt_store *st, const int32_t *modes, const int32_t *swap_done, char *err,
                 size_t errlen);
void pt_acts_fini(pt_store *st);
int pt_acts_pre_forward(pt_store *st, int32_t w, char *err, size_t errlen);
int pt_acts_post_forward(pt_store *st, int32_t b, char *err, size_t errlen);
int pt_acts_pre_backward(pt_store *st, int32_t b, char *err, size_t errlen);
int pt_acts_post_backward(pt_store *st, int32_t b);

#endif
