/*
 * store.h — the chunk store's interface: everything the runtime keeps on the
 * device and in pinned memory for one model under one plan.
 *
 * It owns: the chunk layout (parameters grouped into fixed-size chunks in
 * execution order), the device buffer pool that streamed chunks pass through,
 * the persistent/offloaded storage of parameters, gradients and optimizer state,
 * chunk movement at the block hooks (gather with prefetch, release, gradient
 * offload with the CPU optimizer overlapping backward), the per-block
 * activation arenas (NONE / CKPT / SWAP), and state images and files
 * (save/resume, and carrying values across a rebuild under another plan).
 *
 * It does not decide anything: the knobs and the per-block activation modes
 * come from the caller (runtime/core, from the planner or the INI). It runs
 * with what the caller lends it (pt_store_env) and changes only its own
 * state, plus the optimizer's progress (t, last_norm) in env->opt and the
 * parameter pointers in env->model that the host reads.
 */
#ifndef PT_STORE_H
#define PT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "gpu.h"
#include "protrain.h"

enum { PT_ACT_NONE = 0, PT_ACT_CKPT = 1, PT_ACT_SWAP = 2 };

/* Optimizer hyper-parameters and progress (owned by the caller, lent to the store). */
typedef struct pt_optim_state {
    float lr, beta1, beta2, eps, weight_decay, max_grad_norm;
    float lr0;            /* lr as create_optimizer set it (lr follows each step's) */
    float rekls_eps;      /* REKLS's eps: the descriptor's eps when given, else [optimizer] rekls_eps */
    int64_t t;            /* optimizer steps taken (bias correction uses t+1) */
    double last_norm;     /* global grad norm before clipping, NaN when not computed */
    int type;             /* PT_OPTIM_ADAMW or PT_OPTIM_REKLS (0 reads as AdamW) */
} pt_optim_state;

/* The four knobs the store runs with (-1 = default: everything persistent,
 * lookahead buffers, no swap, no checkpoint). */
typedef struct pt_store_knobs {
    int32_t n_persist, n_buffer, n_swap, n_checkpoint;
    const char *source;   /* "INI", "searched", "bootstrap" — for the log */
} pt_store_knobs;

/* What the store runs with; every pointer outlives the store. */
enum { PT_STORE_MARK_RECOMPUTE = 0, PT_STORE_MARK_ARENA_FREE = 1, PT_STORE_MARK_ARENA_FREE_FWD = 2 };

typedef struct pt_store_env {
    const pt_config *cfg;
    const pt_logger *lg;
    const pt_host_v1 *host;         /* recompute_block for CKPT */
    pt_gpu *gpu;
    pt_stream *s_compute, *s_h2d, *s_d2h;
    pt_model_v1 *model;             /* validated by pt_store_validate */
    pt_optim_state *opt;
    const pt_step_state *sx;
    /* Called right before (after = 0) and after (after = 1) each CKPT recompute
     * callback (PT_STORE_MARK_RECOMPUTE) and each free of a block's arena
     * after its backward (PT_STORE_MARK_ARENA_FREE) or, CKPT, after its
     * forward (PT_STORE_MARK_ARENA_FREE_FWD), so the profiler can mark the
     * device's clock there; or NULL. */
    void (*mark)(void *user, int kind, int32_t block, int after);
    void *user;
    /* The host computes asynchronously on s_compute (PT_HOST_ASYNC_COMPUTE): the
     * store orders its copies, frees and kernels after the host's work with
     * events on s_compute instead of assuming that work is done at each hook, and
     * makes s_compute (not the host's thread) wait for its uploads. */
    int ordered;
    unsigned skip;       /* orderings not to honour, a test's negative control: the
                            PT_ORD_* bits of ord_bits.h ([testing] debug_skip_ordering) */
    /* Data parallel (world > 1): gradients are summed over the ranks in rank
     * order and scaled by 1/world before clipping and the optimizer; NULL with
     * one rank. */
    struct pt_coll *coll;
    /* Mode C (with coll): offloaded chunks are split across the ranks, each rank
     * keeping and stepping only its part (dist_shard.c). Every rank must run the same
     * knobs. 0: replicated (mode B). */
    int shard;
    /* Tensor parallel ([dist] tp_size = P > 1, with coll): tp_coll is this
     * rank's group of P consecutive ranks (the gathers of tensor-parallel
     * REKLS, the clipping sum of split shards); dp_coll the ranks holding the
     * same shard in the world / P replicas (gradients are averaged over it
     * instead of over coll), NULL when world == P. Both NULL with tp_size 1. */
    struct pt_coll *tp_coll, *dp_coll;
    /* Called on a CPU worker right after the CPU step of an offloaded chunk that
     * is not split across ranks, inside the step's task: the chunk's fp32 values
     * in pinned memory are final, and everything that waits for the step (the
     * chunk's next upload, param_home, read_param, snapshots) sees what the call
     * changed there. It must not wait for any chunk's task. NULL: none. */
    void (*chunk_stepped)(void *user, int32_t chunk);
} pt_store_env;

typedef struct pt_store pt_store;

/* Checks a model descriptor (names, dtypes, shapes, blocks, ties). */
int pt_store_validate(const pt_model_v1 *m, char *err, size_t errlen);
uint64_t pt_store_param_numel(const pt_param_v1 *p);   /* product of the shape */
/* A hash of everything that shapes the layout and the profile (cache key). */
uint64_t pt_store_arch_hash(const pt_model_v1 *m, const pt_config *cfg);

/* Lays out chunks, allocates storage under the knobs, sets the activation mode
 * of each block (modes[n_blocks], PT_ACT_*; swap_done[n_blocks] the last forward
 * window that holds each swapped arena, or NULL for "one window after its copy
 * starts"), and uploads the host's initial values unless from_image (the caller
 * restores a state image next). */
int pt_store_create(const pt_store_env *env, const pt_store_knobs *kn, const int32_t *modes,
                    const int32_t *swap_done, int from_image, pt_store **out, char *err,
                    size_t errlen);
/* Frees everything, after waiting for the work queued on the three streams
 * (which may still touch what is freed). Returns that wait's status: a failed
 * wait (PT_ERR_BACKEND, one sentence in err) means the device is failing, and
 * a caller in the middle of a run must not go on as if nothing happened; with
 * err NULL it is logged. The store is freed either way. */
int pt_store_destroy(pt_store *st, char *err, size_t errlen);

/* Optimizer state (moments, masters) for every trainable chunk. */
int pt_store_optimizer_init(pt_store *st, char *err, size_t errlen);
int pt_store_optimizer_ready(const pt_store *st);

/* Waits for everything queued on the store's streams (the host's compute
 * included): before the CPU reads device memory outside the hooks. */
int pt_store_sync(pt_store *st, char *err, size_t errlen);

/* Hooks. */
int pt_store_pre_step(pt_store *st, char *err, size_t errlen);
int pt_store_pre_forward(pt_store *st, int32_t b, char *err, size_t errlen);
int pt_store_post_forward(pt_store *st, int32_t b, char *err, size_t errlen);
int pt_store_pre_backward(pt_store *st, int32_t b, char *err, size_t errlen);
int pt_store_post_backward(pt_store *st, int32_t b, char *err, size_t errlen);
/* lr < 0: the lr given to set_lr for this step, else the optimizer's. */
int pt_store_optimizer_step(pt_store *st, float lr, char *err, size_t errlen);
/* The host's profile_step is running: no optimizer exists yet, and that is fine. */
void pt_store_set_profiling(pt_store *st, int on);
int pt_store_set_lr(pt_store *st, float lr);
/* The host's gradient clipping for the current step (the clip_grad_norm hook).
 * norm NULL: announced ahead (before the step's backward ends): the CPU tasks
 * compute the norm and no offloaded chunk steps before optimizer_step when
 * max_norm > 0 (nothing clips without the call below). norm non-NULL: after the last backward, before optimizer_step:
 * the gradients are waited for (reduced across ranks), *norm = the global norm
 * before clipping, and optimizer_step clips at max_norm (> 0) or at the
 * optimizer's max_grad_norm (max_norm <= 0). */
int pt_store_clip_grad_norm(pt_store *st, float max_norm, double *norm, char *err,
                            size_t errlen);
/* The step in progress dropped (discard.c): windows, leases, arenas and its
 * gradients, back to the state after the last optimizer_step; eval: an
 * evaluation pass (no gradients). Refused (PT_ERR_ORDER, nothing changed)
 * when the CPU optimizer already stepped a chunk of this step. */
int pt_store_discard(pt_store *st, int eval, char *err, size_t errlen);

/* Host services. */
int pt_acts_arena(pt_store *st, int32_t b, uint64_t bytes, void **ptr, char *err, size_t errlen);
int pt_acts_arena_get(pt_store *st, int32_t b, void **ptr, char *err, size_t errlen);
int pt_store_is_arena(const pt_store *st, const void *ptr);   /* block index, or -1 */
uint64_t pt_store_arena_bytes(const pt_store *st, int32_t b); /* device bytes held now */
int pt_store_read_param(pt_store *st, int32_t index, void *dst, uint64_t bytes, char *err,
                        size_t errlen);
/* The inverse, between steps: the compute copy and, for a trainable 16-bit
 * param with optimizer state, its fp32 master (widened); moments untouched. */
int pt_store_write_param(pt_store *st, int32_t index, const void *src, uint64_t bytes,
                         char *err, size_t errlen);
/* Where fp32 param `index` lives between steps: the resident copy (device, its
 * last device AdamW may still be queued on s_compute) or the pinned master of an
 * offloaded chunk (after its CPU step). A caller that changes the values there
 * changes the parameter: the next gather uploads them. */
int pt_store_param_home(pt_store *st, int32_t index, float **p, int *on_device, char *err,
                        size_t errlen);
/* Mode C as well: this rank's elements of fp32 param `index` after its last
 * step (waited for). Unsplit: as pt_store_param_home, *lo = 0 and *len = the
 * param's elements. In a chunk split across the ranks (*split = 1): *p holds
 * the param's elements [*lo, *lo + *len) in pinned memory (*len may be 0; the
 * other ranks hold the rest). */
typedef struct pt_store_part {
    float *p;
    int on_device, split;
    uint64_t lo, len;
} pt_store_part;
int pt_store_param_part(pt_store *st, int32_t index, pt_store_part *out, char *err,
                        size_t errlen);
/* A param in a chunk split across the ranks: every rank's elements of it, rank
 * p's being [lo[p], lo[p] + len[p]) (world entries each; len 0: none), for
 * pt_coll_allgather_ranges. Returns -1 for a param that is not split. */
int pt_store_param_parts(const pt_store *st, int32_t index, size_t *lo, size_t *len);
/* Without waiting for anything: the chunk holding param `index`, and its
 * pinned copy when that chunk is offloaded and not split across ranks (the
 * bytes its CPU step writes; else NULL). For chunk_stepped. */
int pt_store_param_chunk(const pt_store *st, int32_t index, float **pinned);
/* Fills the plan, optimizer-time and activation fields of s. */
void pt_store_stats(const pt_store *st, pt_stats_v1 *s);

/* For the profiler: chunk geometry and exact footprints, a buffer slot to time
 * copies with, the CPU optimizer's workers. */
uint64_t pt_store_chunk_size(const pt_store *st);
int pt_store_n_chunks(const pt_store *st);
typedef struct pt_store_chunk_info {
    uint64_t used;        /* bytes its parameters occupy (<= chunk size) */
    uint64_t elems;       /* parameter elements */
    uint64_t n_state;     /* fp32 optimizer elements (trainable, padding included) */
    int32_t first_block, last_block;  /* blocks using it; -1 for non-block chunks */
    int mandatory;        /* must stay resident (non-block params, oversize) */
    uint64_t dev_bytes;   /* exact device footprint while persistent */
    uint64_t host_bytes;  /* exact pinned footprint while offloaded */
    /* The optimizer kind's own state and work beyond the Adam moments, for
     * the planner (every one 0 for a kind without, AdamW; REKLS's meaning in
     * parentheses). optim_bytes: of dev_bytes / host_bytes, the kind's state
     * (its factors and bases, + its scratch on the device). */
    uint64_t optim_bytes;
    /* one step of the params the kind steps with its own state: its FLOPs by
     * kind of work (the GEMMs; the eigendecompositions) and how many params */
    double optim_gemm_flops, optim_eigh_flops;
    int32_t optim_params;
    /* tensor parallel: fp32 bytes the kind all-gathers over the group every
     * step for its split params (their full gradients, sum 4 m n, also the
     * weights' in l2 mode; their factors, sum 4 (m^2 + n^2)) */
    uint64_t optim_tp_grad_bytes, optim_tp_factor_bytes;
    /* mode C (each param's state at one owner rank): the state words its
     * params hold in host_bytes (REKLS: 2m^2 + 2n^2 + m + n each), the sum of
     * their m n, and the largest one param's state + 2 m n (an owner keeps
     * the moments too) */
    uint64_t optim_aux_words, optim_mn, optim_own_max;
} pt_store_chunk_info;
void pt_store_chunk_info_get(const pt_store *st, int k, pt_store_chunk_info *out);
/* Seconds of one CPU step of chunk k's optimizer-own work (the part the
 * optimizer kind adds to the Adam update, on one thread), from the kind's
 * time model; 0 when the kind has none. r: the caller's rates, zeroed before
 * the first chunk, measured by the kind on first need and reused for the
 * rest (store/kinds/optim_kind.h). */
struct pt_optim_rates;
double pt_store_chunk_optim_cpu_s(const pt_store *st, int k, struct pt_optim_rates *r);
/* A free buffer-pool slot to time copies with (its cached chunk is dropped),
 * or 0 when none is free. */
int pt_store_borrow_slot(pt_store *st, void **dev, uint64_t *bytes);
struct pt_pool *pt_store_workers(pt_store *st);
/* Seconds spent so far in the collectives: [0] all-reduce (gradients and
 * norms), [1] all-gather, [2] reduce-scatter (mode C); zeros with one rank. */
void pt_store_coll_seconds(const pt_store *st, double out[3]);
/* Bytes of the buffers those collectives carried so far ([1] and [2]; [0] 0). */
void pt_store_coll_bytes(const pt_store *st, double out[3]);

/* State: images (in memory, across a rebuild) and files (save/resume). */
typedef struct pt_state_image {
    unsigned char *data;
    size_t bytes;
    int64_t step;       /* optimizer steps taken */
    int has_opt;        /* holds fp32 masters and Adam moments (optimizer existed) */
} pt_state_image;
int pt_store_snapshot(pt_store *st, pt_state_image *img, char *err, size_t errlen);
int pt_store_restore(pt_store *st, const pt_state_image *img, char *err, size_t errlen);
void pt_store_image_free(pt_state_image *img);
/* <dir>/protrain_state_rank<r>.bin, written atomically (temp, fsync, rename);
 * load checks magic, version, size, checksum and every parameter's name, dtype
 * and size before it changes anything. */
int pt_store_save(pt_store *st, const char *dir, char *err, size_t errlen);
int pt_store_load(pt_store *st, const char *dir, char *err, size_t errlen);

#endif
