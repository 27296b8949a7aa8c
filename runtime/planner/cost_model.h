/*
 * cost_model.h — predicted iteration time and peak device memory of a plan.
 *
 * Knobs: n_persist (prefix of chunks kept on the device; mandatory chunks are
 * persistent whatever it says), n_buffer (device slots streaming the other
 * chunks), n_swap and n_checkpoint (counts; placement.h turns them into a
 * per-block mode map).
 *
 * n_buffer range: [one-block minimum, n_chunk - n_persist]. The one-block
 * minimum (the non-persistent chunks of the largest block) is what the runtime
 * needs to run at all; the lookahead minimum (those of any two consecutive
 * blocks) is what lets every one-block-ahead prefetch find a slot. Between the
 * two the runtime skips the prefetch of the chunks that do not fit and the
 * next gather uploads them synchronously: exposed. The runtime allocates
 * min(n_buffer, |non-persistent|) slots; the model charges the same.
 *
 * Time: one iteration is a sequence of windows; each window lasts
 *   sync + max(compute, H2D + D2H)             with one shared copy engine, or
 *   sync + max(compute, H2D, D2H, all-reduce)  with one engine per direction
 * (all-reduce is its own resource, 0 when world_size == 1 or not measured),
 * i.e. a transfer is hidden when the window's compute covers it, except the
 * synchronous uploads of the window's gather ("sync", bytes / h2d_Bps), which
 * the block waits for. Which chunk uploads when is the buffer pool's own
 * behaviour, reproduced exactly by pool_model.c (prefetch one block ahead into
 * free slots, LRU eviction of released slots, the forward's last chunks still
 * cached in backward — but evicted before dead slots, see there); per window
 * it is available from pt_pool_uploads below.
 *   embed fwd   compute embed_fwd_s (nothing prefetches block 0).
 *   fwd b       sync: block b's chunks nobody prefetched (all of block 0);
 *               H2D: the prefetch of block b+1's new chunks that fit the free
 *               slots; D2H: swap-out of earlier SWAP arenas (see below).
 *   turn        compute head_fwd_s + head_bwd_s (loss); H2D: swap-in of block
 *               N-1; D2H: swap-out that did not fit in the forward windows.
 *   bwd b       compute bwd_s[b] (+ recompute_s[b] for CKPT); sync: block b's
 *               chunks neither prefetched nor cached; H2D: the prefetch of
 *               block b-1's chunks (misses only), swap-in of block b-1's arena;
 *               D2H: gradients (trainable_elems * grad_elem_bytes) of the
 *               non-persistent chunks whose gradients completed in block b+1;
 *               all-reduce: all chunks completed in block b+1.
 *   embed bwd   compute embed_bwd_s; D2H: gradients completed in block 0.
 * Swap-out: SWAP block j's arena (arena_bytes / d2h_Bps seconds) drains in FIFO
 * order through the forward windows j+1, j+2, ..., each window hiding at most
 * its own fwd_s of swap traffic; what is left spills into the turn window.
 * Optimizer: device Adam over persistent trainable elements; CPU Adam over the
 * others. The runtime steps offloaded chunks one after another, each spread
 * over every CPU worker thread, so k chunks' steps take their elements /
 * cpu_adam_elems_per_s (the profiler measures that rate on chunk-sized jobs
 * through the same pool, per-chunk dispatch included) whether k is 1 or 100. Schedule OVERLAP (no clipping): a chunk's CPU step starts when its
 * gradient landed (end of the window that copied it) and the CPU works through
 * chunks in that order, so
 *   T_iter = T_fwd + max(T_bwd + T_dev_adam, CPU finish time from bwd start).
 * Schedule AFTER_BWD (max_grad_norm > 0: the global norm needs every gradient):
 *   T_iter = T_fwd + T_bwd + max(T_dev_adam, T_cpu_adam).
 *
 * Peak memory: static + dynamic, walked window by window.
 *   static  = persistent chunk states (params + grads + master + m + v of the
 *             trainable part, or the trace's exact dev_bytes; trace.h)
 *             + min(n_buffer, |non-persistent|) * slot_bytes (a slot holds a
 *             chunk's params and, in backward, its gradients: counted at full
 *             size all iteration because slots are allocated once)
 *             + nonblock_bytes.
 *   dynamic = block inputs alive (every mode; trace.h) + NONE arenas of earlier
 *             blocks + SWAP arenas whose D2H has not finished + the running
 *             block's arena + scratch; in backward the running block's arena
 *             (kept for NONE, recomputed for CKPT — the one-block bump —,
 *             swapped back for SWAP), the next block's swapped-in arena (one
 *             block ahead), grad_act_bytes, and
 *             max(bwd_scratch, fwd_scratch if CKPT). Turn and embedding
 *             windows add nonblock_scratch_bytes.
 *   peak    = ceil(frag * (static + max dynamic)).
 * Feasible when peak <= capacity - reserve - headroom and the host bytes
 * (offloaded chunk states, trace.h, divided by world_size when sharded, plus
 * the pinned swap pool = sum of SWAP arenas) fit the host budget.
 *
 * Monotonicity the searcher relies on (proved in the comments of
 * searcher.c, tested):
 *   - from the lookahead minimum up, time is non-increasing in n_buffer (every
 *     prefetch fits; more slots only turn backward uploads into hits);
 *   - forward time is non-increasing in n_buffer from the one-block minimum
 *     up (a chunk prefetched instead of waited for saves at least what it adds
 *     to the prefetching window);
 *   - below the lookahead minimum the total time is NOT monotone in general;
 *     but the backward window sum is never below the one at the lookahead
 *     minimum (every block uploads a superset there), and the OVERLAP CPU
 *     finish time is at most max_block_bytes / h2d_Bps earlier (a synchronous
 *     upload can move out of the window that copies a gradient);
 *   - for a fixed n_buffer, peak is non-decreasing in n_persist (static grows,
 *     dynamic does not depend on chunk knobs);
 *   - peak is non-decreasing in n_buffer.
 * NOT monotone: the minimum n_buffer falls as n_persist grows, so the smallest
 * feasible peak is not monotone in n_persist (frozen chunks cost less
 * persistent than the slots they free); the searcher does not assume it.
 */
#ifndef PT_COST_MODEL_H
#define PT_COST_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "trace.h"

typedef struct pt_knobs {
    int32_t n_persist, n_buffer, n_swap, n_checkpoint;
} pt_knobs;

typedef struct pt_cost_opts {
    double frag;              /* fragmentation factor from the allocator; <= 0 means 1.0 */
    uint64_t reserve_bytes;   /* device bytes the plan may not use (context, workspaces) */
    uint64_t headroom_bytes;  /* extra safety margin on top */
    int32_t clip;             /* max_grad_norm > 0: the CPU steps wait for the global norm */
    int32_t shard;            /* host state split over world_size ranks (mode C) */
    int32_t defer;            /* with clip: the CPU steps run into the next forward
                                 (DEFER) instead of before it (AFTER_BWD) */
    int32_t overlap_ar;       /* several ranks: resident block chunks' gradients are
                                 all-reduced in buckets while backward runs ([dist]
                                 overlap_allreduce) instead of after it; never with
                                 tensor parallel (the runtime reduces after backward) */
    int32_t tp_l2;            /* tensor parallel: REKLS's l2 weight decay is on
                                 (rekls_weight_decay_method = l2, weight_decay != 0), so
                                 each split param's weights are gathered too */
    int32_t tier_slots;       /* [nvme] path set: the disk tier's staging slots (0: no tier,
                                 -1: auto, sized as pt_cost_tier says) */
    uint64_t tier_above;      /* with tier_slots: the pinned budget; a plan whose pinned
                                 bytes exceed it puts the offloaded chunks' states on the
                                 disk tier (runtime/store/tier/tier.h; levels below) */
    uint64_t tier_block;      /* [nvme] block_size: every record section is padded to it
                                 (0: 4096) */
    double tier_rd_Bps;       /* the tier's read and write rates, bytes/s, with [nvme]
                                 io_threads requests in flight (the profiler's probe of the */
    double tier_wr_Bps;       /* folder, or given); 0: the I/O time is not modelled */
    int32_t tier_force;       /* tests ([testing] debug_tier_force / debug_tier_level), as the
                                 store: bit 0 the tier even where the states fit; bits 1-2 the
                                 level whenever the tier is used (0: the rule) */
} pt_cost_opts;

/* OVERLAP: each chunk's CPU step starts as its gradient lands in backward.
 * AFTER_BWD (clipping): every CPU step after backward, before the next forward.
 * DEFER (clipping, defer_cpu_steps): after backward, in the order the next
 * forward gathers the chunks, while that forward runs: the forward is delayed
 * only where a chunk's step (plus its upload) ends after the time the forward
 * reaches its first block,
 *   delay = max(0, max_k (S_k - dev_s + up_k - F_k))
 * over offloaded trainable chunks k in execution order, S_k the CPU time of the
 * steps up to and including k, dev_s the device Adam that runs first on the
 * compute stream, up_k = bytes_k / h2d, F_k the forward's compute before chunk
 * k's first block (compute only: the earliest that block can start, so the
 * delay is never under-stated). iter = fwd + bwd + dev_s + delay. */
enum { PT_SCHED_OVERLAP = 0,
       PT_SCHED_AFTER_BWD = 1,
       PT_SCHED_DEFER = 2 };
enum { PT_PHASE_EMBED_FWD = 0,
       PT_PHASE_FWD = 1,
       PT_PHASE_TURN = 2,
       PT_PHASE_BWD = 3,
       PT_PHASE_EMBED_BWD = 4 };

typedef struct pt_cost {
    /* memory, bytes */
    uint64_t peak_bytes;         /* ceil(frag * raw_peak_bytes) */
    uint64_t raw_peak_bytes;     /* the sum of the five parts below */
    uint64_t model_state_bytes;  /* persistent chunks (mandatory included) */
    uint64_t optim_dev_bytes;    /* of those, the optimizer kind's state (trace optim_bytes:
                                    REKLS's factors, bases and scratch) */
    uint64_t optim_host_bytes;   /* the same of the offloaded chunks (pinned host) */
    double optim_s;              /* the kind's own work in cpu_adam_s + dev_adam_s (0 for
                                    AdamW) */
    double optim_xchg_s;         /* mode C: gradients to the params' owner ranks and updates
                                    back (REKLS; in opt_s; 0 otherwise) */
    uint64_t buffer_bytes;       /* n_buffer * slot_bytes */
    uint64_t nonblock_bytes;     /* trace nonblock_bytes */
    uint64_t activation_bytes;   /* at the peak: inputs, arenas, swaps in flight, act grads */
    uint64_t scratch_bytes;      /* at the peak: block or non-block scratch */
    int32_t peak_phase;          /* PT_PHASE_* of the peak window */
    int32_t peak_block;          /* its block (-1 for non-block windows) */
    uint64_t host_bytes;         /* pinned host bytes needed (per rank) */
    uint64_t swap_pool_bytes;    /* part of host_bytes: SWAP arenas */
    int32_t tier_slots;          /* with on_tier: its staging slots (auto resolved) */
    int32_t on_tier;             /* disk tier level (pt_cost_tier): 0 none, 1 the offloaded
                                    chunks' Adam states on disk, 2 their whole images;
                                    host_bytes is that level's pinned figure */
    uint64_t tier_disk_bytes;    /* the tier's file: the records of the tiered chunks */
    uint64_t tier_io_bytes;      /* read + written per iteration */
    double tier_io_s;            /* those bytes at the tier's rates (0: no tier or no rates) */
    double tier_exposed_s;       /* the part of tier_io_s outside its overlap window: in
                                    iter_s (the forward's share in fwd_s, the rest in opt_s) */
    /* time, seconds */
    double iter_s;               /* fwd_s + bwd_s + opt_s */
    double fwd_s;                /* embedding + block forwards (window times) */
    double bwd_s;                /* head/loss + block backwards + embedding backward */
    double opt_s;                /* optimizer time not hidden behind backward */
    double cpu_adam_s, dev_adam_s;  /* optimizer work */
    double compute_s;            /* pure compute incl. recompute */
    double recompute_s;
    double exposed_xfer_s;       /* sum over windows of (window - compute) */
    double sync_xfer_s;          /* part of it: uploads a gather waited for (not prefetched) */
    double cpu_finish_s;         /* CPU optimizer done, from backward start (OVERLAP: the landing-order chain) */
    double h2d_s, d2h_s;         /* total copy time at the measured bandwidths */
    uint64_t h2d_bytes, d2h_bytes;
    uint64_t h2d_sync_bytes;     /* part of h2d_bytes uploaded synchronously at a gather */
    int32_t schedule;            /* PT_SCHED_* */
    int32_t n_buffer_min;        /* lookahead minimum for this n_persist (every prefetch fits) */
    int32_t n_buffer_min_block;  /* one-block minimum (smallest n_buffer the runtime runs) */
    /* several ranks: the collectives' time on the iteration's critical path
     * (mode C's run on the hook thread; the all-reduce's part after backward,
     * buckets that outlast backward included), included in iter_s; 0 with one
     * rank */
    double allreduce_s, allgather_s, reduce_scatter_s;
    /* tensor parallel (trace tp_size = P > 1): the gradient all-reduce above
     * runs over the world / P replicas of this rank's shards, and every step
     * REKLS all-gathers each split param's full gradient and factors L, R
     * (and weights with l2 decay) over the group, one param after another on
     * the optimizer_step thread before the chunks' steps:
     *   tp_gather_s = (tp_grad (1 + l2) + tp_factor) (P-1)/P / allgather rate,
     * included in iter_s (after backward, like the all-reduce); 0 without */
    double tp_gather_s;
} pt_cost;

/* Precomputed sums over one trace. The trace must outlive the context and not
 * change while it is used. */
typedef struct pt_cost_ctx pt_cost_ctx;
int pt_cost_ctx_new(const pt_trace *t, pt_cost_ctx **out, char *err, size_t errlen);
void pt_cost_ctx_free(pt_cost_ctx *cx);
int pt_cost_swap_interval(const pt_cost_ctx *cx);   /* pt_place_swap_interval of the trace */

/* Whole prediction for one knob set (placement by placement.h). 0, or
 * PT_ERR_INVALID_ARG with err naming the knob out of range (n_persist >
 * n_chunk, n_swap + n_checkpoint > n_block, n_buffer below the one-block
 * minimum or above n_chunk - n_persist). */
int pt_cost_eval(const pt_cost_ctx *cx, const pt_cost_opts *o, const pt_knobs *k, pt_cost *out,
                 char *err, size_t errlen);
/* Usable device bytes: capacity - reserve - headroom (0 if negative). */
uint64_t pt_cost_budget(uint64_t capacity, const pt_cost_opts *o);

/* ---- pieces the searcher combines (all O(1) or O(n_block)) ---- */

/* Activation-side profile of one mode map: independent of the chunk knobs. */
typedef struct pt_act_profile {
    uint64_t peak_dyn;           /* max dynamic bytes over all windows */
    uint64_t act_at_peak, scratch_at_peak;
    int32_t peak_phase, peak_block;
    uint64_t swap_pool;          /* sum of SWAP arenas (pinned host) */
    double recompute_s;          /* sum of recompute_s over CKPT blocks */
    double swap_out_s, swap_in_s;   /* total swap traffic time */
    int32_t n_block;
    uint8_t *modes;              /* [n_block] copy of the map */
    double *fwd_swap_s;          /* [n_block + 1] swap-out seconds charged to fwd window b (n_block = turn) */
    uint64_t *bwd_swap_in;       /* [n_block + 1] swap-in bytes in bwd window b (n_block = turn) */
    int64_t *work;               /* [n_block + 2] internal */
    int32_t *swap_done;          /* [n_block] SWAP block j: the last forward window (n_block =
                                    turn) still holding its arena; the runtime frees the arena
                                    at the start of the next window, waiting for its copy if
                                    needed, so the measured peak is the predicted one. -1 for
                                    other blocks. */
    /* The poison fills of the step's device frees (hw.free_Bps; all 0 when
     * frees cost nothing), compute-stream seconds charged to the window that
     * frees: fwd_free_s[b] forward window b (n_block = turn), bwd_free_s[b]
     * backward window b; free_f_s the forward windows' sum (turn excluded),
     * free_b_s the rest. */
    double *fwd_free_s;          /* [n_block + 1] */
    double *bwd_free_s;          /* [n_block] */
    double free_f_s, free_b_s;
    uint64_t *rec_act, *rec_scr; /* NULL (pt_act_init), or [pt_cost_n_windows] arrays the caller
                                    owns: pt_act_compute then stores each window's activation and
                                    scratch bytes too (pt_cost_mem_windows; the searcher leaves
                                    them NULL) */
} pt_act_profile;

int pt_act_init(const pt_cost_ctx *cx, pt_act_profile *a);
void pt_act_free(pt_act_profile *a);
void pt_act_compute(const pt_cost_ctx *cx, const uint8_t *modes, pt_act_profile *a);

int32_t pt_cost_n_offloaded(const pt_cost_ctx *cx, int32_t n_persist);  /* |non-persistent| */
/* Lookahead minimum: slots for the non-persistent chunks of any two
 * consecutive blocks (every prefetch fits). */
int32_t pt_cost_buffer_min(const pt_cost_ctx *cx, int32_t n_persist);
/* One-block minimum: those of the largest block; the smallest n_buffer the
 * runtime (and the model) accepts. <= pt_cost_buffer_min. */
int32_t pt_cost_buffer_min_block(const pt_cost_ctx *cx, int32_t n_persist);
/* Device bytes of the pool: min(n_buffer, |non-persistent|) * slot_bytes. */
uint64_t pt_cost_buffer_bytes(const pt_cost_ctx *cx, int32_t n_persist, int32_t n_buffer);
/* Chunk uploads of (n_persist, n_buffer) per block window, bytes, into the
 * caller's [n_block] arrays: fwd_sync[b] at block b's forward gather,
 * fwd_prefetch[b] during block b's forward (block b+1's chunks), bwd_sync[b]
 * at block b's backward gather, bwd_prefetch[b] during its backward (block
 * b-1's). PT_ERR_INVALID_ARG when n_persist is out of range or n_buffer is
 * below the one-block minimum. */
int pt_pool_uploads(const pt_cost_ctx *cx, int32_t n_persist, int32_t n_buffer, uint64_t *fwd_sync,
                    uint64_t *fwd_prefetch, uint64_t *bwd_sync, uint64_t *bwd_prefetch);
uint64_t pt_cost_persist_bytes(const pt_cost_ctx *cx, int32_t n_persist);
/* Sums over the non-mandatory chunks of index >= n_persist (clamped to
 * [0, n_chunk]), O(1): param bytes, gradient bytes (trainable elements x
 * grad_elem_bytes) and trainable elements. */
void pt_cost_offload_sums(const pt_cost_ctx *cx, int32_t n_persist, uint64_t *bytes, uint64_t *grad_bytes,
                          uint64_t *train_elems);
/* 1 when chunk n_persist is mandatory: n_persist and n_persist+1 are the same
 * plan, and the searcher reports the larger (so "all resident" reads N_chunk). */
int pt_cost_persist_redundant(const pt_cost_ctx *cx, int32_t n_persist);
uint64_t pt_cost_host_bytes(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t n_persist, int shard);
/* The disk tier ([nvme] path, o->tier_slots > 0) for the offloaded chunks
 * [n_persist, K), as the store lays it out (runtime/store/tier/tier.c). Per
 * offloaded chunk with U param bytes and, when trainable, E fp32 state
 * elements; w = 3 with 16-bit params (their fp32 masters) else 2; r() rounds
 * a record section up to 64 bytes, pad() a record up to tier_block:
 *   level 0 (no tier): the profile's pinned bytes (pt_cost_host_bytes);
 *   level 1: pinned 2U per trainable chunk (staged params, gradient landing),
 *            U per frozen one, plus tier_slots x (largest R1 + block);
 *            R1 = pad(w r(4E)) ([m|v|masters]) per trainable chunk;
 *   level 2: pinned only tier_slots x (largest R2 + block); every offloaded
 *            chunk's whole image on disk, R2 = pad(r(U) + r(U) + w r(4E) +
 *            r(4E)) ([params|gradient landing|m|v|masters|fp32 gradient sum])
 *            for a trainable chunk, pad(r(U)) for a frozen one.
 * Each level's pinned figure adds the swap pool, but the rule, as the
 * store's, weighs the chunks' bytes alone (the pool is allocated later under
 * the same cap): level 0 when they fit o->tier_above; else level 1 when its
 * bytes (with 3 slots) do, or in mode B on several ranks (level 2 is built
 * for one rank and mode C); else level 2 (o->tier_force overrides both
 * steps, as the store's testing keys do). Mode C (o->shard on several
 * ranks) uses this rank's parts: E and U about 1/W, the landing zone 4E, no
 * masters; several ranks below level 2 pin the fp32 gradient sums (4E) too.
 * tier_slots < 0 (auto) then sizes the slots as the store does: the most
 * offloaded trainable chunks one block's backward completes plus 2, in
 * [3, 64], no more than the budget leaves beside the level's other bytes and
 * max(2 S, 64 KiB) for profiling. The level's figure may not fit either: the
 * searcher refuses such a plan. No tier when a chunk has its own optimizer
 * kind's state (REKLS).
 * Per iteration a level-1 chunk reads and writes R1; at level 2 every chunk
 * reads its parameters' blocks, pad(r(U)), for the forward's upload and R2
 * for the backward (its upload, then the rest for its gradient and step; a
 * chunk still in a staging slot is not re-read, counted as read anyway), and
 * a trainable one writes R2 after its step (a frozen image is never dirty). */
typedef struct pt_tier_fig {
    int32_t level;
    uint64_t pinned;        /* the level's pinned bytes (swap pool included) */
    uint64_t disk;          /* the file: sum of the tiered chunks' records */
    uint64_t fwd_rd;        /* bytes read for the forward (level 2) */
    uint64_t rd, wr;        /* bytes read and written after the forward */
    int32_t slots;          /* staging slots (auto resolved) */
} pt_tier_fig;
void pt_cost_tier(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t n_persist, const pt_cost_opts *o,
                  pt_tier_fig *f);
/* pt_cost_tier's pinned bytes; *tier (may be NULL) its level. */
uint64_t pt_cost_pinned(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t n_persist,
                        const pt_cost_opts *o, int32_t *tier);
/* The tier's I/O seconds and its exposed part given the time fields of c (no
 * tier, or no rates: zeros). The I/O runs on io_threads beside the compute
 * (the rates are measured with that many requests in flight; reads and
 * writes share the disk):
 *   io_f = fwd_rd / rd_Bps                       (level 2's forward reads)
 *   io_b = rd / rd_Bps + wr / wr_Bps             (the rest)
 * io_f overlaps the forward (F = c->fwd_s): its reads run ahead of the
 * uploads while earlier blocks compute. io_b overlaps a window B that
 * follows the store's schedule:
 *   level 2, or level 1 with the steps overlapping backward (PT_SCHED_OVERLAP:
 *     a chunk's read is queued at the backward of the block that queues its
 *     step): B = c->iter_s - c->fwd_s (backward, the CPU optimizer of other
 *     chunks, collectives);
 *   level 1 with the steps after backward (clipping or several ranks: the
 *     reads are queued in optimizer_step): B = max(c->cpu_adam_s, c->opt_s),
 *     the steps' own span (deferred into the next forward) or the tail after
 *     backward, whichever is longer.
 * What does not fit its window is exposed:
 *   exposed = max(0, io_f - F) + max(0, io_b - B),
 * so the iteration grows by the disk's time where it is the slower resource.
 * Not charged: a request's latency, and the slots' limit on read-ahead (with
 * fewer slots than a block has chunks, a block's later reads wait for an
 * earlier step's write-back, which a window sum cannot see). */
void pt_cost_tier_time(const pt_tier_fig *f, const pt_cost_opts *o, const pt_cost *c, double *io_s,
                       double *exposed_f, double *exposed_b);
/* Time part of the prediction: fills the time fields of out. */
void pt_cost_time(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t n_persist, int32_t n_buffer,
                  const pt_cost_opts *o, pt_cost *out);
/* A lower bound on pt_cost_time(...).iter_s in O(1): every window lasts at
 * least its compute, the copy engine(s) at least their total traffic (every
 * non-persistent chunk goes up once in forward, every non-cached one once more
 * in backward, every non-persistent gradient down once, plus swaps), and the
 * optimizer at least its work. Used by the searcher to skip candidates. */
double pt_cost_time_lb(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t n_persist, int32_t n_buffer,
                       const pt_cost_opts *o);
/* A lower bound valid for every n_buffer and non-increasing in n_persist
 * (all backward fetches taken as cached; the device Adam term, which grows
 * with n_persist, left out): lets the searcher stop scanning n_persist
 * downwards. */
double pt_cost_time_lb_persist(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t n_persist,
                               const pt_cost_opts *o);
/* A lower bound on pt_cost_time(...).iter_s valid for every n_buffer, in
 * O(n_block) but without the pool walk: the forward windows at n_buffer =
 * |Q| (the smallest forward time), the backward windows at their compute
 * alone, the CPU Adam chain over those windows. Tight when the CPU optimizer
 * or the forward uploads set the time: the searcher uses it to skip an
 * n_persist that cannot beat a larger one of the same mode map. Falls back
 * to pt_cost_time_lb_persist when some block has no chunk. */
double pt_cost_time_lb_any(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t n_persist, const pt_cost_opts *o);
/* A lower bound on the time of every n_buffer in [one-block minimum, nb_top],
 * nb_top below the lookahead minimum, given the prediction `at` of the same
 * n_persist and mode map at an n_buffer at or above the lookahead minimum
 * (monotonicity notes above; F = forward time at nb_top, O(n_block)):
 *   clipping: F + at.bwd + max(dev_adam, cpu_adam)
 *   OVERLAP:  F + max(at.bwd + dev_adam, at.cpu_finish - max_block_bytes / h2d_Bps)
 * nb_top < 0: F = at's forward time (O(1), weaker). */
double pt_cost_time_lb_small(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t n_persist, int32_t nb_top,
                             const pt_cost *at);
/* Memory part: fills the memory fields of out (host_bytes included). */
void pt_cost_memory(const pt_cost_ctx *cx, const pt_cost_opts *o, const pt_act_profile *a,
                    int32_t n_persist, int32_t n_buffer, pt_cost *out);
/* ---- the memory picture of one step, window by window ----
 *
 * The peak above is a maximum over the windows of one step; this hands out
 * every term of that maximum, so a picture of it (timeline_svg.h) has exactly
 * the plan's peak as its highest point. Window order, n = 2 * n_block + 3:
 *   0 embed fwd, 1 + b fwd block b, n_block + 1 turn (head/loss),
 *   2 * n_block + 1 - b bwd block b, 2 * n_block + 2 embed bwd.
 * The optimizer step is not a window: the memory model charges it nothing
 * beyond the static part (CPU Adam works on host copies, device Adam in the
 * persistent states already counted). */
typedef struct pt_mem_window {
    int32_t phase;              /* PT_PHASE_* */
    int32_t block;              /* -1 for the embedding and turn windows */
    uint64_t model_state_bytes; /* persistent chunks: the same in every window */
    uint64_t buffer_bytes;      /* chunk buffer slots: allocated once, the same in every window */
    uint64_t nonblock_bytes;    /* embedding / head / loss states: the same in every window */
    uint64_t activation_bytes;  /* inputs, arenas, swaps in flight, activation grads */
    uint64_t scratch_bytes;     /* block or non-block scratch of this window */
    uint64_t frag_bytes;        /* total - raw: the allocator's fragmentation on top */
    uint64_t raw_bytes;         /* the five parts above frag_bytes */
    uint64_t total_bytes;       /* ceil(frag * raw_bytes); the peak is the largest */
} pt_mem_window;

int32_t pt_cost_n_windows(const pt_cost_ctx *cx);
/* Fills win[pt_cost_n_windows(cx)] (n_win must be at least that) and, when
 * out is not NULL, the whole prediction as pt_cost_eval does — through the
 * same walk, so max(win[i].total_bytes) == out->peak_bytes and the first
 * window reaching it is out->peak_phase / peak_block. modes: the plan's
 * per-block map, or NULL for placement.h's map of k. Errors as pt_cost_eval,
 * PT_ERR_INVALID_ARG when n_win is too small. */
int pt_cost_mem_windows(const pt_cost_ctx *cx, const pt_cost_opts *o, const pt_knobs *k, const uint8_t *modes,
                        pt_mem_window *win, int32_t n_win, pt_cost *out, char *err, size_t errlen);
/* Index of window (phase, block) in the order above, -1 if there is none. */
int32_t pt_cost_window_index(const pt_cost_ctx *cx, int32_t phase, int32_t block);

/* ceil(frag * raw) as the feasibility checks compute it. */
uint64_t pt_cost_frag_bytes(double frag, uint64_t raw);

#endif /* PT_COST_MODEL_H */
