/*
 * protrain.h — the only header a host trainer needs to drive protrain_plugin.so.
 *
 * ABI rules (what keeps a host and a plugin built at different times working):
 *  - The plugin exports one const data object per ABI major version, named
 *    `protrain_plugin_v<N>` (this header: v1). Nothing else is exported.
 *  - The table, pt_host_v1, pt_model_v1, pt_optim_v1 and pt_stats_v1 carry a
 *    struct_size near their start (the table and pt_host_v1 after abi_version).
 *    A struct grows only at its end, and a reader uses a field only when the field
 *    lies inside struct_size.
 *  - Plugin table: the host calls a hook only when it lies inside the table's
 *    struct_size and is non-NULL (PT_HAS_HOOK below). A NULL hook means the plugin
 *    does not implement it; the plugin never fills a slot with a stub that only
 *    reports "unsupported".
 *  - Structs the host passes in (pt_host_v1, pt_model_v1, pt_optim_v1): a
 *    struct_size smaller than the v1 fields (everything before the trailing
 *    reserved slots) is refused with PT_ERR_INVALID_ARG and nothing changes, so
 *    the host can call again with a correct struct; a larger one is accepted and
 *    the plugin ignores the bytes past the fields it knows. pt_param_v1 has no
 *    struct_size: it is an array element whose stride is fixed for the major
 *    version, so it can grow only into its reserved slots.
 *  - Structs the plugin fills (pt_stats_v1): the plugin writes no more than the
 *    host's struct_size (0 stands for the plugin's own size) and sets struct_size
 *    to the bytes it wrote.
 *  - Only fixed-width types (intN_t, float, double) and pointers cross the
 *    boundary; enums travel as int32_t and every enum value is written out. No
 *    struct is passed by value. Every struct ends in reserved slots, which the
 *    host leaves zero. Enum values and status codes are never renumbered; a change
 *    that cannot follow these rules is a new major version.
 *
 * HOST CONTRACT (the plugin enforces what is cheap to check):
 *  1. Call order: init -> post_model_load -> create_optimizer -> per step {
 *       for each micro-batch m in [0, n_micro):
 *         pre_step(step, m, n_micro);
 *         forward:  for b in 0..n_blocks-1: block_pre_forward(b); <block b>; block_post_forward(b);
 *         backward: for b in n_blocks-1..0: block_pre_backward(b); <block b bwd>; block_post_backward(b);
 *       optimizer_step(lr) once after the last micro-batch; post_step(step, loss);
 *     } -> finalize. A hook called out of order returns PT_ERR_ORDER and
 *     last_error() names the hook and the state the plugin expected; so does
 *     any call (finalize included) with a context after its finalize, until a
 *     later init happens to hand the same pointer out again.
 *  2. Parameters: after post_model_load the plugin owns every parameter's storage.
 *     Read param->data / param->grad at each use, and only between the hooks of the
 *     owning block (between block_pre_forward(b) and block_post_forward(b), or between
 *     block_pre_backward(b) and block_post_backward(b)). Params with block == -1
 *     (embeddings, final norm, head) are always resident and may be used any time
 *     between pre_step and optimizer_step. Outside those windows the addresses may be
 *     NULL or point at poisoned (NaN) memory.
 *  3. Gradients: backward ACCUMULATES (+=) into param->grad. The plugin zeroes
 *     gradients after each optimizer_step; with n_micro > 1 they accumulate across
 *     micro-batches. Frozen params (trainable == 0) have grad == NULL.
 *  4. Device memory: every device byte the host uses (activations, scratch, inputs)
 *     comes from dev_alloc/dev_free so that accounting and prediction are exact.
 *     A block's saved activations come from activation_arena(b, bytes) (one call per
 *     block per micro-batch, after block_pre_forward(b)). The host keeps only the block
 *     input outside the arena, and re-reads the arena address (activation_arena_get)
 *     after block_pre_backward(b): the plugin may have freed and recomputed it (CKPT,
 *     through host->recompute_block) or moved it to pinned memory and back (SWAP).
 *     Evaluation (validation loss, text generation): pre_step(step, -1, 0) starts a
 *     forward-only pass: forward block hooks only, no backward, no gradients touched;
 *     it ends after block_post_forward(n_blocks-1). Non-block params are readable
 *     between pre_step and that last hook.
 *  5. Callbacks (pt_host_v1) are called only from inside a hook, on the host's thread.
 *  6. Every call returns pt_status; on non-zero, last_error(ctx) (or last_error(NULL)
 *     when init failed) gives one sentence naming the cause. The plugin never aborts
 *     the host process on a user error.
 */
#ifndef PROTRAIN_H
#define PROTRAIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PT_ABI_VERSION 1u      /* newest table version this header describes */
#define PT_ABI_MIN_VERSION 1u  /* oldest table version a host built with it accepts */
#define PT_PLUGIN_SYMBOL "protrain_plugin_v1"

/* Stable status codes: never renumbered. */
typedef enum pt_status {
    PT_OK = 0,
    PT_ERR_INVALID_ARG = 1,   /* a NULL or out-of-range argument */
    PT_ERR_CONFIG = 2,        /* INI file: unknown key, bad value, duplicate */
    PT_ERR_OOM = 3,           /* device memory: bytes needed > available */
    PT_ERR_HOST_OOM = 4,      /* pinned/host memory budget exceeded */
    PT_ERR_ORDER = 5,         /* hook called out of order */
    PT_ERR_BACKEND = 6,       /* device backend failed (driver, library) */
    PT_ERR_IO = 7,            /* file I/O (state files, cache, plan file) */
    PT_ERR_UNSUPPORTED = 8,   /* feature not available with this build/config */
    PT_ERR_INTERNAL = 9,      /* a bug in the plugin */
    PT_ERR_CALLBACK = 10,     /* a host callback returned non-zero */
    PT_ERR_FORMAT = 11,       /* a file has the wrong magic/version/size */
    PT_ERR_INFEASIBLE = 12    /* no plan fits the memory limits */
} pt_status;

typedef enum pt_dtype {
    PT_F32 = 0,
    PT_BF16 = 1,
    PT_F16 = 2,
    /* ABI 1.4: opaque bytes, 1 per element (e.g. 4-bit or 8-bit quantized
     * weights packed with their scales by the host, which dequantizes them in its
     * own forward). Frozen parameters only (trainable = 0; a trainable one is
     * refused at post_model_load): stored, offloaded and streamed like any frozen
     * parameter, never modified, no gradient, no optimizer state; shape counts
     * bytes. Older plugins refuse dtype 3 as unknown. */
    PT_U8 = 3
} pt_dtype;

typedef enum pt_log_level {
    PT_LOG_ERROR = 0,
    PT_LOG_WARN = 1,
    PT_LOG_INFO = 2,
    PT_LOG_DEBUG = 3,
    PT_LOG_TRACE = 4
} pt_log_level;

typedef enum pt_device_kind {
    PT_DEVICE_AUTO = 0,
    PT_DEVICE_HOST = 1,       /* the simulated device (host backend) */
    PT_DEVICE_CUDA = 2
} pt_device_kind;

typedef enum pt_copy_kind {
    PT_COPY_H2D = 0,          /* host (malloc'd or pinned) -> device */
    PT_COPY_D2H = 1,
    PT_COPY_D2D = 2
} pt_copy_kind;

typedef enum pt_optim_type {
    PT_OPTIM_FROM_CONFIG = 0, /* use [optimizer] type from the INI */
    PT_OPTIM_ADAMW = 1,
    PT_OPTIM_REKLS = 2
} pt_optim_type;

/* ABI 1.6: collectives the host brings (pt_host_v1.coll). A host whose framework
 * already joined its ranks (PyTorch's process group under torchrun, gloo or
 * NCCL) hands the plugin byte-moving operations over that group, so the plugin
 * needs no launcher of its own (without a table, several ranks meet over MPI or
 * NCCL as [dist] configures).
 *
 * The ops only move bytes; the plugin forms every sum itself, in rank order
 * (0, 1, ..., W-1, the first addend taken as is), so every rank holds the same
 * bits and 2 ranks give what one rank accumulating 2 micro-batches in order
 * gives, whichever library moves the bytes.
 *  - Every rank calls the same op in the same order with the same bytes (the
 *    plugin guarantees it); each op is a collective of the host's whole group.
 *  - Calls come only from inside a plugin hook, on the host's thread.
 *  - send and recv are host memory (CPU-addressable) owned by the plugin, valid
 *    for the duration of the call only; they never overlap; bytes > 0. send is
 *    read-only to the host; recv is fully written.
 *  - Blocking: an op returns when recv holds the result. The plugin has
 *    finished its device work on the buffers before it calls (no stream is
 *    involved).
 *  - Returns 0 on success. Anything else fails the plugin's hook with
 *    PT_ERR_BACKEND and last_error() quoting the NUL-terminated sentence the op
 *    wrote into err (at most errlen bytes; empty: the code is quoted). After a
 *    failure the group is broken: the plugin makes no further call to the table.
 *  - Deadlines are the host's (its group's timeout): [dist] timeout does not
 *    apply to these ops.
 *  - The table and what its pointers reach stay valid from init to finalize.
 * The plugin refuses at init, with a sentence, a table whose struct_size does
 * not cover all_gather, whose all_gather is NULL, or whose rank / world_size
 * differ from pt_host_v1's; the ranks then check each other's view with one
 * all_gather. */
typedef struct pt_host_coll_v1 {
    uint32_t struct_size;     /* sizeof(pt_host_coll_v1) */
    int32_t rank;             /* this process's rank in the host's group */
    int32_t world_size;       /* the group's size */
    int32_t reserved0;
    void *user;               /* first argument of every op */
    /* Every rank passes `bytes` bytes at send; recv (world_size * bytes) gets
     * rank p's bytes at recv + p * bytes, on every rank. Required. */
    int32_t (*all_gather)(void *user, const void *send, void *recv, uint64_t bytes, char *err,
                          uint64_t errlen);
    /* send holds world_size blocks of `bytes`: block q goes to rank q, which
     * receives it at recv + p * bytes (p: the sender). NULL: the plugin sends
     * every rank every block through all_gather (world_size times the bytes
     * received). */
    int32_t (*all_to_all)(void *user, const void *send, void *recv, uint64_t bytes, char *err,
                          uint64_t errlen);
    /* Returns once every rank has entered it. NULL: an all_gather of 8 bytes. */
    int32_t (*barrier)(void *user, char *err, uint64_t errlen);
    void *reserved[4];
} pt_host_coll_v1;

/* What the host gives the plugin at init. Filled by the host; read-only to the plugin. */
/* pt_host_v1.flags */
enum {
    /* The host runs its device work asynchronously on the device's compute stream:
     * through the plugin's launch hook (any backend), or as kernels on the
     * cudaStream_t it gives in compute_stream (cuda). Then a hook returns before
     * the work it follows has run, and the plugin orders every copy, free and
     * kernel of its own against that stream with events instead of blocking the
     * host's thread. Without this flag the plugin assumes the host's work is done
     * when it calls a hook and finishes its own work before a hook returns
     * (every ABI 1.0 host). */
    PT_HOST_ASYNC_COMPUTE = 1u << 0
};

typedef struct pt_host_v1 {
    uint32_t abi_version;     /* PT_ABI_VERSION the host was built with */
    uint32_t struct_size;     /* sizeof(pt_host_v1) */
    int32_t rank;             /* data-parallel rank, 0-based */
    int32_t world_size;       /* 1 when not distributed */
    int32_t local_rank;
    int32_t device_kind;      /* pt_device_kind wanted; AUTO = from the INI */
    int32_t device_index;
    uint32_t flags;           /* PT_HOST_* bits (was reserved, 0 in older hosts) */
    void *compute_stream;     /* cudaStream_t on cuda; NULL = plugin's own */
    void *user;               /* passed back as first argument of every callback */
    /* Logger; NULL = the plugin prints to stderr. */
    void (*log)(void *user, int32_t level, const char *msg);
    /* Re-run block b's forward from its saved input into a fresh arena (CKPT). */
    int32_t (*recompute_block)(void *user, int32_t block);
    /* One forward+backward on a representative batch, calling all block hooks. */
    int32_t (*profile_step)(void *user);
    /* TiledMLP (called only from inside tiled_mlp_forward / tiled_mlp_backward).
     * A token is one row of the block's (tokens, C) activations: with batch B and
     * sequence T the host flattens (B, T) row-major, so the token of sequence b, position s is b*T + s and a
     * tile [begin, begin+count) may span the end of one sequence and the start of
     * the next (the MLP is token-wise, so that is exact).
     *  - mlp_forward: compute the MLP on those tokens. Inside tiled_mlp_forward the
     *    host writes the tile's output rows; inside tiled_mlp_backward it is the
     *    tile's recompute: the intermediates the following mlp_backward needs go to
     *    the tile scratch (tiled_mlp_scratch), the output is not needed.
     *  - mlp_backward: back-propagate the same tile: the tile's input-gradient rows,
     *    and weight gradients ACCUMULATED (+=) into param->grad, re-read at the call
     *    (the plugin points the block's gradients at a zeroed fp32 accumulator for
     *    the tile loop and adds the sum into the real gradient once afterwards). */
    int32_t (*mlp_forward)(void *user, int32_t block, int64_t token_begin, int64_t token_count);
    int32_t (*mlp_backward)(void *user, int32_t block, int64_t token_begin, int64_t token_count);
    /* ABI 1.5 (the former reserved[0]; NULL from older hosts, so they stay valid
     * and their struct_size still covers every field a 1.4 host knew): what fixes
     * the host's side of the math, for ranks to agree on (world_size > 1). NULL,
     * or NUL-terminated text of at most PT_HOST_FINGERPRINT_MAX bytes, one
     * `name=value` per line, e.g. "seed=1337\nbatch=4\ngrad_accum=2\nlr=0.001\n
     * data.train_tokens=1003854\ndata.train_hash=..."; read only during init.
     * Several ranks exchange it with the plugin's own facts (configuration,
     * model, optimizer) at init and refuse to train when they differ, naming the
     * first differing line and both values. Put there what every rank must
     * share (the seed the data order comes from, the data set's identity, the
     * batch and accumulation, the learning-rate schedule), not what legitimately
     * differs per rank (its rank, its own data shard's position, paths that are
     * node-local but hold the same bytes). Lines named `run.` (e.g.
     * "run.seed=1337") also identify the run: save_state records their digest
     * in the state file and load_state refuses a file whose digest differs from
     * the running host's, so give there what a resume must share and no
     * setting a resume may change. The plugin keeps its own copy of the text. */
    const char *fingerprint;
    /* ABI 1.6 (the former reserved[0]; NULL from older hosts, which keep today's
     * transports): the host's own collectives (pt_host_coll_v1 above). With
     * world_size > 1 and a table, [dist] backend = auto (or host) runs every
     * collective of the plugin through it: no MPI, no NCCL communicator of the
     * plugin's own. Host backend only for now (the ops get host memory; the
     * cuda backend refuses a table with a sentence). Ignored with world_size 1
     * (nothing to exchange). */
    const pt_host_coll_v1 *coll;
    void *reserved[6];
} pt_host_v1;

/* Longest pt_host_v1.fingerprint text, without its NUL; a longer one is refused
 * at init with PT_ERR_INVALID_ARG. */
#define PT_HOST_FINGERPRINT_MAX 4096u

/* One parameter tensor. The host fills the inputs; the plugin writes data/grad. */
typedef struct pt_param_v1 {
    const char *name;
    int32_t dtype;            /* pt_dtype of the compute copy */
    int32_t ndim;             /* 1..4 */
    int64_t shape[4];
    int32_t block;            /* owning block, or -1 for non-block params */
    int32_t trainable;        /* 0 = frozen: no grad, no optimizer state */
    int32_t tie;              /* index of the param this one shares storage with, or -1 */
    /* ABI 1.4 (the former reserved0; 0 from older hosts, so they stay valid):
     * tensor parallelism ([dist] tp_size = P > 1). 0 = not split: every rank of
     * the tensor-parallel group holds the whole tensor. 1 = split along dim 0
     * (rows), 2 = along dim 1 (columns; 2-D only): shape[] is this rank's shard,
     * the full tensor is P times longer along that dim, and rank r of the group
     * holds the r-th equal block. A split 2-D weight under REKLS gets exactly
     * the update REKLS gives the full matrix (its factors stored in row blocks;
     * both full sides must divide by P). Split gradients are never averaged over
     * the group (each rank holds another block); clipping counts each block once.
     * With tp_size = 1 a split is ignored (the shard is the whole tensor). */
    int32_t tp_split;
    const void *init;         /* host memory with initial values (ignored when tie >= 0);
                                 read only during post_model_load */
    /* written by the plugin: */
    void *data;               /* device address of the compute copy (see contract 2) */
    void *grad;               /* device address of the gradient, same dtype (contract 3) */
    void *reserved[2];
} pt_param_v1;

typedef struct pt_model_v1 {
    uint32_t struct_size;     /* sizeof(pt_model_v1) */
    int32_t n_params;
    pt_param_v1 *params;      /* n_params entries, owned by the host, must outlive ctx */
    int32_t n_blocks;
    int32_t reserved0;
    int64_t batch;            /* micro-batch size B (profiler cache key, planner) */
    int64_t seq;              /* sequence length T */
    const char *arch;         /* free text describing the architecture (cache key) */
    void *reserved[4];
} pt_model_v1;

/* Optimizer description. NaN (or negative where noted) fields mean "from the INI". */
typedef struct pt_optim_v1 {
    uint32_t struct_size;     /* sizeof(pt_optim_v1) */
    int32_t type;             /* pt_optim_type */
    float lr, beta1, beta2, eps, weight_decay;
    float max_grad_norm;      /* <= 0 disables clipping; NaN = from the INI */
    int32_t reserved[8];
} pt_optim_v1;

/* Counters the host may show (progress bar, metrics). */
typedef struct pt_stats_v1 {
    uint32_t struct_size;
    int32_t reserved0;
    uint64_t dev_capacity;    /* bytes the plugin may use on the device */
    uint64_t dev_current;     /* bytes allocated now */
    uint64_t dev_peak;        /* high-water mark since init or the last reset */
    uint64_t pinned_current;  /* pinned host bytes allocated now */
    uint64_t h2d_bytes, d2h_bytes; /* cumulative copy traffic */
    double last_grad_norm;    /* global norm before clipping at the last step; NaN if not computed */
    int64_t steps;            /* optimizer steps taken */
    int32_t n_persist, n_buffer, n_swap, n_checkpoint, n_chunk; /* the active plan */
    int32_t mode;             /* 0 = A (resident), 1 = B (replicated offload), 2 = C (sharded) */
    double cpu_optim_s;       /* cumulative seconds of CPU optimizer work: per chunk task, its
                               * wall time (a chunk's step runs on every worker thread) */
    double optim_wait_s;      /* cumulative seconds spent waiting for that work: optimizer_step
                               * waiting for CPU tasks once the gradient copies were in, and
                               * uploads waiting for steps deferred into the next forward */
    int64_t recomputes;       /* cumulative recompute_block calls (CKPT) */
    uint64_t swap_bytes;      /* cumulative activation bytes swapped out (SWAP) */
    uint64_t pred_peak;       /* the plan's predicted device peak (0: no plan) */
    double pred_iter_s;       /* the plan's predicted iteration time (0: no plan) */
    /* ABI 1.1, from the reserved space (0 from older plugins): */
    uint64_t pinned_arena;    /* bytes of the one pinned arena offloaded chunks live in */
    uint64_t pinned_own_allocs; /* pinned allocations that did not fit the arena (each its own) */
    double cpu_optim_hidden_s;  /* of cpu_optim_s: the part done before the device finished
                                 * the step's backward (host clock; the rest was exposed) */
    /* ABI 1.2: TiledMLP. 0 = off (the host runs its MLP itself); otherwise the host
     * runs each block's MLP through tiled_mlp_forward/backward. From init on it is
     * the configured tile count (auto: 1); after post_model_load the tiles each
     * MLP really runs in (N_eff). */
    uint64_t mlp_tiles;
    /* ABI 1.4: OSFT. 0 = off. From init until post_model_load: 1 when OSFT is
     * configured; after it, the number of parameters decomposed. A decomposed
     * parameter's data and grad stay NULL, inside its block's windows too (that is
     * how the host tells which ones they are); the host runs its linear layer
     * through osft_linear_forward / osft_linear_backward. */
    uint64_t osft_targets;
    /* ABI 1.7, the former reserved[3] (0 from older plugins). pinned_peak: the
     * high-water mark of pinned_current since init or the last reset (as dev_peak),
     * what [memory] pinned_budget caps. The disk tier ([nvme] path), cumulative since
     * it last opened (post_model_load; each re-plan opens a new one; 0 without it):
     * tier_io_us, microseconds its I/O threads spent reading and writing its
     * records (a chunk's states; where the tier holds whole chunk images, the
     * image; summed over threads); tier_wait_us, microseconds the steps, uploads
     * and gradient copies waited for a chunk's record (the read, and a free
     * staging slot before it), summed over the waiting threads: the tier's
     * exposed time. The share of its I/O
     * hidden under other work is at least 1 - tier_wait_us / tier_io_us. */
    uint64_t pinned_peak;
    uint64_t tier_io_us;
    uint64_t tier_wait_us;
} pt_stats_v1;

/* The plugin's table. The struct tag differs from the exported object's name
 * (protrain_plugin_v1): in C++ a variable and a class of one name hide each other. */
typedef struct pt_plugin_table_v1 {
    uint32_t abi_version;     /* == 1 */
    uint32_t struct_size;     /* sizeof(pt_plugin_v1) as the plugin was built */
    const char *name;         /* "protrain" */
    const char *version;      /* plugin release, e.g. "0.1.0" */

    /* Lifecycle. ini_path may be NULL: then $PROTRAIN_CONFIG, else built-in defaults. */
    int32_t (*init)(const char *ini_path, const pt_host_v1 *host, void **ctx);
    const char *(*last_error)(void *ctx);  /* never NULL; ctx may be NULL */
    int32_t (*post_model_load)(void *ctx, pt_model_v1 *model);
    int32_t (*create_optimizer)(void *ctx, const pt_optim_v1 *desc);
    int32_t (*pre_step)(void *ctx, int64_t step, int32_t micro, int32_t n_micro);
    int32_t (*block_pre_forward)(void *ctx, int32_t block);
    int32_t (*block_post_forward)(void *ctx, int32_t block);
    int32_t (*block_pre_backward)(void *ctx, int32_t block);
    int32_t (*block_post_backward)(void *ctx, int32_t block);
    /* Clip (if configured), step every trainable param, zero grads.
     * lr < 0: the lr given to set_lr for this step, else the last one used (INI at first). */
    int32_t (*optimizer_step)(void *ctx, float lr);
    int32_t (*post_step)(void *ctx, int64_t step, float loss);
    int32_t (*finalize)(void *ctx);        /* frees every byte, joins every thread */

    /* Memory services. tag is free text for accounting ("act", "scratch", "input"). */
    int32_t (*dev_alloc)(void *ctx, uint64_t bytes, const char *tag, void **ptr);
    int32_t (*dev_free)(void *ctx, void *ptr);
    int32_t (*activation_arena)(void *ctx, int32_t block, uint64_t bytes, void **ptr);
    int32_t (*activation_arena_get)(void *ctx, int32_t block, void **ptr);
    /* Synchronous copy on the plugin's compute stream (host buffers are ordinary memory). */
    int32_t (*memcpy)(void *ctx, void *dst, const void *src, uint64_t bytes, int32_t kind);
    int32_t (*get_stats)(void *ctx, pt_stats_v1 *out);
    /* Copy the current fp32/compute value of param i to host memory (bytes = numel*dtype
     * size: 4, 2, or 1 for PT_U8, whose bytes come back as the host gave them).
     * Several ranks in mode C: a parameter split across the ranks is gathered from
     * them, so every rank must call read_param for the same parameters in the same
     * order. */
    int32_t (*read_param)(void *ctx, int32_t index, void *host_dst, uint64_t bytes);

    /* State save/restore: one file per rank in dir, written atomically. */
    int32_t (*save_state)(void *ctx, const char *dir);
    int32_t (*load_state)(void *ctx, const char *dir);

    /* OSFT (pt_stats_v1.osft_targets > 0): the linear layer of a decomposed
     * parameter `param` (a host index whose data/grad are NULL), shapes from its
     * descriptor (N out x M in), everything fp32 device memory, rows = tokens:
     *  - forward: y (rows x N) = x (rows x M) W^T, WRITTEN (not added); the bias,
     *    if the layer has one, stays an ordinary parameter and the host adds it.
     *  - backward: dx (rows x M) = dy W, WRITTEN (dx may be NULL when the input
     *    needs no gradient), and the gradients of the trainable factors are
     *    ACCUMULATED; the bias gradient is the host's.
     * Call it in the owning block's forward (backward) window, from the host's
     * thread or from inside work given to launch (then, like the rest of that work,
     * it runs on the compute stream with the factor addresses of the launch).
     * Errors inside launched work are returned by the next stream_sync,
     * block_post_backward or optimizer_step. */
    int32_t (*osft_linear_forward)(void *ctx, int32_t param, const void *x, void *y, int64_t rows);
    int32_t (*osft_linear_backward)(void *ctx, int32_t param, const void *x, const void *dy,
                                    void *dx, int64_t rows);
    /* TiledMLP: block b's MLP over `tokens` rows in tiles of c = ceil(tokens/N)
     * rows (N from [tiled_mlp] tiles), N_eff = ceil(tokens/c) tiles, the last one
     * shorter. Forward: called inside block b's forward window, in place of the
     * host's MLP; calls host->mlp_forward per tile. Backward: inside block b's
     * backward window; per tile host->mlp_forward (recompute) then
     * host->mlp_backward; the block's weight gradients of all tiles are summed in
     * fp32 and added to the gradients once (so with accumulation: G0 + dW). */
    int32_t (*tiled_mlp_forward)(void *ctx, int32_t block, int64_t tokens);
    int32_t (*tiled_mlp_backward)(void *ctx, int32_t block, int64_t tokens);

    /* Learning rate of the coming optimizer step, told early (e.g. right after
     * pre_step of micro-batch 0). Offloaded chunks are stepped by the CPU optimizer
     * while backward still runs (as each chunk's gradient lands), which needs lr
     * before optimizer_step. Without set_lr for a step, the CPU steps all run inside
     * optimizer_step (no overlap). optimizer_step(lr >= 0) after set_lr must pass the
     * same lr (or a negative lr = "as set"). */
    int32_t (*set_lr)(void *ctx, float lr);

    /* The device's compute stream (ABI 1.1, in the former reserved slots; NULL in
     * older plugins). With PT_HOST_ASYNC_COMPUTE, a host runs each piece of device
     * work (a block's forward, its backward, a recompute, the head) as
     * launch(ctx, fn, arg): fn(arg) runs on the compute stream after everything
     * launched before it and after every plugin operation the hooks ordered before
     * it (uploads of gathered chunks, swap-ins), and before the plugin's later
     * uses of the memory it touches (gradient copies, swap-outs, buffer reuse,
     * frees), which wait for it on the device.
     *  - On the host backend fn runs later, on the simulated device's compute
     *    thread, possibly after the hook that followed the launch has returned:
     *    like a kernel's arguments, every address fn uses (param->data, ->grad, the
     *    arena) must be read when launching, not inside fn.
     *  - On cuda, fn runs at once on the calling thread and enqueues its kernels on
     *    the host's compute stream (compute_stream, or the plugin's own when NULL).
     * One host source therefore drives both. launch returns PT_OK, or an error
     * (fn is not run). stream_sync(ctx) blocks until all launched work has run:
     * call it before the CPU reads a value the device computed (a loss, logits). */
    int32_t (*launch)(void *ctx, void (*fn)(void *arg), void *arg);
    int32_t (*stream_sync)(void *ctx);

    /* ABI 1.2 (NULL in older plugins). Inside host->mlp_forward / mlp_backward only:
     * the device scratch for one tile's MLP intermediates, at least `bytes`. The
     * plugin allocates it at the first tile (the largest) and keeps the same
     * address for every tile of one tiled_mlp_forward/backward call, so a tile's
     * recompute and its backward see the same bytes; it is freed when the call
     * returns. Only one tile's worth ever exists and it is counted like every
     * device byte. */
    int32_t (*tiled_mlp_scratch)(void *ctx, uint64_t bytes, void **ptr);

    /* ABI 1.3 (NULL in older plugins). Data parallel (pt_host_v1.world_size > 1):
     * values[0..n) becomes the sum over the ranks, added in rank order (so every
     * rank gets the same bits, and 2 ranks give what one rank adding the same
     * values in that order gives). Every rank must call it at the same point with
     * the same n (e.g. after optimizer_step, for the step's loss). Fails naming
     * the rank that did not arrive within [dist] timeout. One rank: unchanged. */
    int32_t (*dist_allreduce)(void *ctx, double *values, int32_t n);

    /* ABI 1.6 (the former reserved[0]; NULL in older plugins): the host's
     * gradient clipping, e.g. torch.nn.utils.clip_grad_norm_ on the plugin's
     * parameters. With norm != NULL: after the last micro-batch's backward and
     * before optimizer_step; waits for the step's gradients (reduced across
     * ranks), writes the global L2 norm before clipping into *norm (also
     * pt_stats_v1.last_grad_norm) and makes this step's optimizer_step clip at
     * max_norm: scale min(1, max_norm / (norm + 1e-6)). max_norm <= 0 only
     * computes the norm (the optimizer's own max_grad_norm, if any, still
     * clips); a max_norm > 0 that differs from a configured max_grad_norm > 0 is
     * refused (PT_ERR_INVALID_ARG: clipping twice). With norm == NULL, from
     * pre_step to the end of the step's backward: announces the call, so the
     * CPU optimizer computes the norm while backward runs and (max_norm > 0)
     * steps no offloaded chunk before optimizer_step (clipping itself comes
     * only from the call with a norm). Without an announcement,
     * offloaded chunks that set_lr let the CPU step during backward used the
     * unclipped gradient: a clipping call is then refused with PT_ERR_ORDER
     * (the step stays valid, unclipped). Everything is reset by optimizer_step. */
    int32_t (*clip_grad_norm)(void *ctx, float max_norm, double *norm);

    /* ABI 1.6 (the former reserved[1]; NULL in older plugins). Drops the step
     * in progress after a failure in the host's forward or backward (an
     * exception, a bad input) or a forward whose loss was never back-propagated:
     * every micro-batch since the last optimizer_step (their gradients are
     * summed in place, so one cannot be told from another), the open block
     * windows, leased buffers and activation arenas; the next call is
     * pre_step(step, 0, n_micro), and training goes on as if the step had never
     * started (optimizer state, weights and step count as after the last
     * optimizer_step). Dropping an evaluation pass (pre_step(step, -1, 0))
     * closes it. Between steps it does nothing. Refused with PT_ERR_ORDER and
     * nothing changed: before create_optimizer; after optimizer_step (call
     * post_step); from inside a host callback; when the CPU optimizer already
     * stepped an offloaded chunk of this step during its backward (set_lr told
     * the lr early, so steps overlap backward and moved weights and moments:
     * finish the step or load a saved state). PT_ERR_UNSUPPORTED with several
     * ranks. Addresses the host read in the dropped step's windows are invalid. */
    int32_t (*discard_step)(void *ctx);

    /* ABI 1.6 (the former reserved[2]; NULL in older plugins). Profile and plan
     * again for micro-batches of batch x seq (pt_model_v1.batch / .seq are
     * updated), between steps (after create_optimizer or post_step): the plugin
     * calls the host's profile_step as at post_model_load (the host runs it on a
     * batch of that shape), searches a plan and rebuilds under it, carrying
     * weights and optimizer state. A plan holds any smaller micro-batch (its
     * activations take less memory); call replan before a larger one. When the
     * device cannot hold the shape (PT_ERR_OOM, PT_ERR_INFEASIBLE: the sentence
     * names the bytes) or profiling fails, the old shape and plan stay in force.
     * Refused with PT_ERR_ORDER inside a step or a callback, PT_ERR_UNSUPPORTED
     * with several ranks. Without profiling ([protrain] auto_memory = false or
     * force_all_persistent) it only records the shape. */
    int32_t (*replan)(void *ctx, int64_t batch, int64_t seq);

    /* ABI 1.6 (the former reserved[3]; NULL in older plugins). Several ranks:
     * this rank stops, for the reason `why` (one sentence; NULL: none given).
     * Call it when the host ends a multi-rank run with an error, before
     * finalize: every other rank's collective that waits for this one, now or
     * later, fails within a poll with "rank r stopped: why" instead of waiting
     * [dist] timeout, so every rank reports the first rank's cause. Afterwards
     * only finalize (and last_error, get_stats) make sense; hooks that need the
     * other ranks fail at once. Sent once (a rank that already heard another
     * rank's abort sends nothing: that rank told everyone); one rank: a no-op.
     * Returns PT_OK. On the mpi transport; over NCCL the other ranks still
     * wait [dist] timeout. */
    int32_t (*dist_abort)(void *ctx, const char *why);

    /* ABI 1.6, appended after the former reserved slots (a 1.5 table's struct_size
     * ends before it; PT_HAS_HOOK checks): the inverse of read_param. Copies
     * bytes (= numel * dtype size) of host memory into param `index`: its
     * compute copy and, for a trainable 16-bit param once create_optimizer ran,
     * its fp32 master (widened from the 16-bit value); an fp32 param's compute
     * copy is its master. The optimizer's moments and step stay, as a host's
     * own load of weights into a model leaves its optimizer alone. Between
     * steps only (after post_model_load or post_step; PT_ERR_ORDER inside a
     * step). Several ranks: every rank writes the same value (the parameters
     * are replicated); a parameter mode C splits across the ranks, or one a
     * feature owns (OSFT), is refused (PT_ERR_UNSUPPORTED). */
    int32_t (*write_param)(void *ctx, int32_t index, const void *host_src, uint64_t bytes);
} pt_plugin_v1;

/* The exported table (symbol name PT_PLUGIN_SYMBOL). A host normally does not
 * link against it: it finds the table at run time with dlsym, through
 * pt_plugin_load below, which also checks the version and size. The declaration
 * is here for code linked with the plugin itself (its tests, static builds). */
extern const pt_plugin_v1 protrain_plugin_v1;

/* ---- host-side loader (host_api/loader.c with host_api/util.c; link both into the host) ---- */

/* What a loaded plugin looks like to the host: always the newest table shape. */
typedef struct pt_loaded_plugin {
    void *dl;                          /* dlopen handle (NULL for `none`) */
    const pt_plugin_v1 *table;         /* NULL for `none` */
    uint32_t abi_version;              /* version the plugin speaks */
    char path[512];
} pt_loaded_plugin;

/*
 * Load a plugin. `spec` is a path (contains '/' or ends in .so), a short name, or
 * "none" (success, table == NULL). A short name NAME ("protrain") is looked up as
 * NAME_plugin.so, then libNAME.so, in: (1) each directory of $PROTRAIN_PLUGIN_PATH
 * (colon-separated), (2) the host executable's directory, (3) the library directory
 * the loader was installed into by `make install` (libprotrain_loader.a; a loader
 * built in the tree has none), then (4) libNAME.so and NAME_plugin.so on the dynamic
 * loader's path. The first existing file is used: one that exists but does not load
 * is reported, not skipped. On failure
 * returns non-zero and writes one sentence into err: file not found, not a
 * protrain plugin, ABI too new / too old (both numbers), table truncated.
 * Never aborts.
 */
int pt_plugin_load(const char *spec, pt_loaded_plugin *out, char *err, uint64_t errlen);
void pt_plugin_unload(pt_loaded_plugin *p);

/* True when the hook lies inside the table's struct_size and is non-NULL. */
#define PT_HAS_HOOK(tbl, field) \
    ((tbl) != 0 && \
     (uint64_t)((const char *)&(tbl)->field - (const char *)(tbl)) + sizeof((tbl)->field) <= \
         (tbl)->struct_size && \
     (tbl)->field != 0)

#ifdef __cplusplus
}
#endif
#endif /* PROTRAIN_H */
