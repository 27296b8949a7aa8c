/*
 * trace.h — the profile trace: everything the planner's cost models need,
 * measured by the profiler (runtime) or synthesised by protrain-plan.
 *
 * The planner (placement, cost_model, searcher, plan) is pure logic over this
 * struct; it never touches a device. Units: seconds, bytes, elements.
 *
 * Block quantities (one pt_trace_block per transformer block, execution order).
 * "Window" below = the interval between block_pre_*(b) and block_post_*(b).
 *   fwd_s, bwd_s, recompute_s
 *       compute time of the block's forward, backward (without recompute) and of
 *       the recompute forward a CKPT block runs at the start of its backward.
 *   arena_bytes
 *       the block's saved activations when its mode is NONE (activation_arena).
 *   input_bytes
 *       the block input. The host keeps it OUTSIDE the arena in every mode (it is
 *       what CKPT recomputes from, and for NONE/SWAP it is simply the previous
 *       block's output the host holds anyway), so the models count it as an
 *       always-resident activation: allocated while block b-1 runs (as its
 *       output; for block 0 while the embedding runs) and freed after block b's
 *       backward. The last block's output belongs to nonblock_bytes.
 *   fwd_scratch_bytes
 *       highest transient bytes during the forward window above
 *       (bytes at window start + arena_bytes + next block's input_bytes).
 *       A CKPT block's recompute is charged the same transient.
 *   bwd_scratch_bytes
 *       highest transient bytes during the backward window above
 *       (bytes at window start + arena_bytes + grad_act_bytes).
 *   grad_act_bytes
 *       activation-gradient buffers alive during the block's backward: the
 *       incoming dL/d(output) and the outgoing dL/d(input).
 *   chunk_lo, chunk_hi
 *       the chunks [chunk_lo, chunk_hi) holding this block's params (derived
 *       from the chunks by pt_trace_derive_ranges; -1/-1 = none).
 *
 * Chunk quantities (execution order):
 *   bytes            param bytes in the compute dtype (<= chunk_size unless the
 *                    chunk holds one oversized tensor).
 *   elems            param elements; trainable_elems of them have a gradient and
 *                    optimizer state (frozen ones: params only).
 *   first_block, last_block
 *                    blocks using the chunk (-1/-1 for a chunk of non-block
 *                    params). Over non-mandatory chunks both must be
 *                    non-decreasing in chunk index (execution-order packing).
 *   mandatory        holds non-block params (embedding, final norm, head):
 *                    always persistent, whatever n_persist says.
 *   dev_bytes        exact device footprint of the chunk when persistent, as
 *                    the runtime allocates it (every allocation rounded up by
 *                    the device allocator); 0 = use the formula below. The
 *                    profiler fills it; synthesised traces may leave it 0.
 *   host_bytes       exact pinned host footprint when offloaded; 0 = formula.
 *                    Both validated: 0, or bytes <= x <= 2 * formula + 2048 (the
 *                    runtime's separate allocations — params, grads, m, v,
 *                    masters, each rounded to 256 — stay within that; a value
 *                    outside is a unit or corruption error).
 *
 * Device model-state bytes of a persistent chunk (compute dtype p), when
 * dev_bytes is 0:
 *   bytes + trainable_elems * (grad_elem_bytes + master_elem_bytes
 *                              + adam_m_elem_bytes + adam_v_elem_bytes)
 *   master_elem_bytes is 4 when p != fp32 (fp32 master copy), else 0.
 *   The formula ignores allocator rounding and a gradient buffer sized to the
 *   whole chunk when only part of it is trainable: dev_bytes is exact.
 *   A buffer-pool slot holds one chunk's params and, during backward, its
 *   gradients: slot_bytes (normally chunk_size * (1 + grad/param size) = 2 S),
 *   used exactly as given.
 * Host (pinned) bytes of an offloaded chunk, when host_bytes is 0
 * (the real cost of offloading, never 2 bytes per parameter):
 *   trainable: param_elem (staged param) + host_grad_elem (fp32 grad, 4)
 *              + 4 (fp32 master, also when p == fp32: the staged copy is what
 *              uploads while the master is updated) + m + v per element
 *   frozen:    param_elem only.
 */
#ifndef PT_TRACE_H
#define PT_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define PT_TRACE_VERSION 12u   /* bump when a field's meaning changes (not for a new name); 2: chunk dev_bytes/host_bytes;
                                 3: calibration learned from runs (pt_trace_calib);
                                 4: chunk optim_bytes, optim_s;
                                 5: the allocator's fragmentation measured (pt_trace_frag);
                                 6: all-gather and reduce-scatter rates;
                                 7: cpu_adam_elems_per_s measured as the runtime steps a
                                    chunk (one chunk-sized job sliced over every worker);
                                 8: all-gather / reduce-scatter rates: the slower of back
                                    to back and as observed in a sharded profiled pass;
                                 9: tp_size, chunk tp_grad_bytes / tp_factor_bytes;
                                 10: hw dev_op_s and dev_memset_Bps (the device optimizer's
                                    launches and gradient zeroing), h2d_lat_s and
                                    d2h_lat_s (per-copy latency);
                                 11: chunk optim_aux_words, optim_mn, optim_own_max (mode C
                                    REKLS: each param's state at one owner rank);
                                 12: hw free_Bps, free_fwd_Bps (the poison fill of a device free), the
                                    device AdamW rate timed between profiled passes, two
                                    warm-up passes */

/* The most blocks and chunks a trace may have (pt_trace_alloc, the validator and
 * the cache's reader refuse more): bounds on what a corrupt file can allocate. */
#define PT_TRACE_MAX_BLOCKS (1 << 20)
#define PT_TRACE_MAX_CHUNKS (1 << 24)

/* Per-block activation modes (the plan's mode map). */
enum { PT_BLOCK_NONE = 0,
       PT_BLOCK_CKPT = 1,
       PT_BLOCK_SWAP = 2 };

/* Cache key: a trace is reusable only for the same model, shapes, device, world. */
typedef struct pt_trace_key {
    uint64_t arch_hash;       /* the architecture, combined with everything else that changes
                                 what was measured (chunk size, capacity, backend, throttle, ...) */
    int64_t batch;            /* micro-batch size */
    int64_t seq;              /* sequence length */
    int32_t world_size;       /* data-parallel ranks */
    uint32_t version;         /* PT_TRACE_VERSION of the producer */
    char device[64];          /* device name, NUL-terminated */
} pt_trace_key;

typedef struct pt_trace_block {
    double fwd_s, bwd_s, recompute_s;
    uint64_t arena_bytes;
    uint64_t input_bytes;
    uint64_t fwd_scratch_bytes;
    uint64_t bwd_scratch_bytes;
    uint64_t grad_act_bytes;
    int32_t chunk_lo, chunk_hi;
} pt_trace_block;

typedef struct pt_trace_chunk {
    uint64_t bytes;
    uint64_t elems;
    uint64_t trainable_elems;
    int32_t first_block, last_block;
    int32_t mandatory;
    int32_t reserved0;
    uint64_t dev_bytes;  /* exact device footprint when persistent (allocator-rounded); 0 = use the formula */
    uint64_t host_bytes; /* exact pinned footprint when offloaded; 0 = formula */
    /* The optimizer kind's own state and work beyond the Adam moments (0 for a
     * kind without, AdamW; REKLS's meaning in the comments). */
    uint64_t optim_bytes; /* the kind's state (REKLS: factors, bases, and the device
                             scratch) in the footprints above; the formulas add it too */
    double optim_s;       /* seconds of one step of the kind's own work on its params
                             on one CPU thread (REKLS: FLOPs at the profiler's GEMM and
                             eigh rates); the cost model adds it to the optimizer time */
    /* Tensor parallel (pt_trace.tp_size = P > 1), REKLS: its params split over
     * the group, as fp32 bytes of the FULL m x n shapes, summed over them:
     *   tp_grad_bytes   = sum 4 m n        (the gradient; the weights in l2 mode)
     *   tp_factor_bytes = sum 4 (m^2 + n^2) (the Kronecker factors L and R)
     * Every step all-gathers each split param's gradient and both factors
     * (and its weights with l2 decay) over the group. 0 without TP or REKLS. */
    uint64_t tp_grad_bytes, tp_factor_bytes;
    /* mode C, each param's kind state at one owner rank (cost_rekls.c): the fp32
     * words of the kind's state inside host_bytes (REKLS: factors, bases and
     * eigenvalues, 2m^2 + 2n^2 + m + n each), the sum of its params' m n, and
     * the largest one param's state + 2 m n (the owner rank keeps the whole
     * state, moments included) */
    uint64_t optim_aux_words, optim_mn, optim_own_max;
} pt_trace_chunk;

/* Measured hardware rates and limits. */
typedef struct pt_trace_hw {
    double h2d_Bps;               /* pinned host -> device bytes/s */
    double d2h_Bps;               /* device -> pinned host bytes/s */
    double cpu_adam_elems_per_s;  /* CPU AdamW, elements/s: chunk-sized jobs, each on every
                                   * worker thread, as the runtime steps offloaded chunks */
    double dev_adam_elems_per_s;  /* device AdamW, elements/s */
    double allreduce_Bps;         /* gradient all-reduce bus bytes/s; 0 = not modelled */
    int32_t copy_engines;         /* 1: H2D and D2H share one engine; 2: one per direction */
    int32_t reserved0;
    uint64_t host_ram_bytes;      /* pinned host budget for this rank; 0 = unlimited */
    uint64_t device_capacity;     /* device bytes the plugin may use */
    /* mode C's collectives, bus bytes/s (time of a buffer of B bytes =
     * B (W-1)/W / rate), waits for the slower rank included when a sharded
     * profile saw them; 0 = not modelled */
    double allgather_Bps, reduce_scatter_Bps;
    /* The device optimizer step of resident chunks, beyond elements / rate:
     * each resident trainable chunk costs an AdamW launch and a memset zeroing
     * its gradient (a 16-bit one also a widening convert), each a device op of
     * dev_op_s fixed cost, and the zeroing moves its gradient bytes at
     * dev_memset_Bps. 0 = not modelled (synthesised traces). */
    double dev_op_s;
    double dev_memset_Bps;
    /* Per-copy latency on top of bytes / rate: a chunk copy takes
     * lat + bytes / Bps. For an upload, lat is what a dependent one costs the
     * compute stream: from the compute stream's event, through the copy
     * engine, back to the compute stream (queueing, the engine's start, the
     * wake of the waiting stream). It dominates small chunks: a layer's norm
     * and bias chunks of a few KiB each cost ~10 us on a GPU and 20-100 us on
     * the host backend, far above their bytes / Bps. 0 = not modelled. */
    double h2d_lat_s, d2h_lat_s;
    /* A device free on the compute stream, bytes/s: where the device fills
     * freed memory with NaN (the simulated device always, cuda with [cuda]
     * poison), the fill is a memset queued on the stream, and a step frees
     * every block's activation arena (after its backward; a CKPT one after
     * its forward too, a SWAP one once its copy is out) and the host's
     * scratch. 0 = frees cost nothing (no fill, or not modelled).
     * free_fwd_Bps: the same for a CKPT arena freed right after the forward
     * that wrote it (still in cache: 2-3x faster on the host backend); 0 =
     * free_Bps. */
    double free_Bps, free_fwd_Bps;
} pt_trace_hw;

/* What running plans made from this profile taught (stored with it in the
 * profile cache, so the next run plans with it from the start). 0 = nothing
 * learned (the factor is 1). Every factor is measured / predicted under the
 * plan that ran, folded into the previous factor:
 *   peak   the device peak the allocator saw over the predicted peak, when it
 *          was higher (memory the profile could not see: fragmentation, a
 *          host's allocations outside profile_step); the cost model's frag.
 *   fwd    forward phase (pre_step .. first block_pre_backward) on the device
 *          clock; scales the forward compute (embedding, block forwards,
 *          recomputes: they are forward passes).
 *   bwd    backward phase (.. optimizer_step); scales head/loss, block and
 *          embedding backward compute.
 *   opt    optimizer_step .. post_step, only when the plan predicted a visible
 *          optimizer tail; scales the CPU and device optimizer rates (/ opt). */
typedef struct pt_trace_calib {
    double peak, fwd, bwd, opt;
} pt_trace_calib;

/* The device allocator's fragmentation as the profiler measured it, at the
 * highest peak of the profiled step (the plugin owns the allocator, so this is
 * a measurement, not an assumption):
 *   factor         span_bytes / peak_bytes (>= 1): the device range the step's
 *                  allocation pattern needed, holes between live blocks
 *                  included, over the bytes it had in use. The planner's
 *                  fragmentation factor starts here (times calib.peak).
 *                  0 = not measured (a synthesised trace): 1.
 *   peak_bytes     the highest device bytes in use (rounded blocks) in the step
 *   span_bytes     the highest end offset a live block reached
 *   largest_free   the largest free block at that peak; of the free bytes then
 *                  (capacity - peak_bytes) the rest sat in holes too small for
 *                  it
 *   rounding_bytes of peak_bytes, what the allocator's 256-byte alignment added
 *                  to the requests (already in every exact byte count above, so
 *                  not part of the factor). */
typedef struct pt_trace_frag {
    double factor;
    uint64_t peak_bytes, span_bytes, largest_free, rounding_bytes;
} pt_trace_frag;

typedef struct pt_trace {
    pt_trace_key key;
    int32_t n_block;
    int32_t n_chunk;
    uint64_t chunk_size;          /* S_chunk */
    int32_t tp_size;              /* tensor-parallel group size P the chunks were measured
                                     under ([dist] tp_size: a split param's chunk holds its
                                     1/P shard); 0 or 1 = none. The gradient all-reduce runs
                                     over the key.world_size / P replicas of each shard */
    pt_trace_block *blocks;       /* [n_block], owned (pt_trace_free) */
    pt_trace_chunk *chunks;       /* [n_chunk], owned */

    /* Non-block work and memory. head_* includes the loss. */
    double embed_fwd_s, embed_bwd_s, head_fwd_s, head_bwd_s;
    uint64_t nonblock_bytes;          /* host allocations alive all iteration:
                                         tokens, logits, residual/final output */
    uint64_t nonblock_scratch_bytes;  /* transient peak of embedding/head/loss */

    /* Model-state bytes per element (see the header comment). */
    uint32_t param_elem_bytes;
    uint32_t grad_elem_bytes;
    uint32_t master_elem_bytes;
    uint32_t adam_m_elem_bytes;
    uint32_t adam_v_elem_bytes;
    uint32_t host_grad_elem_bytes;
    uint64_t slot_bytes;              /* one buffer-pool slot on the device */

    pt_trace_hw hw;
    pt_trace_calib calib;
    pt_trace_frag frag;
} pt_trace;

/* ---- helpers (trace.c) ---- */

/* 64-bit FNV-1a over bytes, and over a NUL-terminated architecture description. */
uint64_t pt_trace_arch_hash(const char *description);

/* Zero a trace (no allocation). */
void pt_trace_init(pt_trace *t);
/* Allocate zeroed blocks/chunks arrays (frees previous ones). 0 or PT_ERR_HOST_OOM. */
int pt_trace_alloc(pt_trace *t, int32_t n_block, int32_t n_chunk, char *err, size_t errlen);
void pt_trace_free(pt_trace *t);
/* Deep copy; dst must be initialised (pt_trace_init) or hold a trace to replace. */
int pt_trace_copy(pt_trace *dst, const pt_trace *src, char *err, size_t errlen);
/* A copy of src with its time calibration applied: compute times multiplied by
 * calib.fwd / calib.bwd, optimizer rates divided by calib.opt (0 = 1). The
 * calib fields are kept; dst as for pt_trace_copy. */
int pt_trace_calibrated(pt_trace *dst, const pt_trace *src, char *err, size_t errlen);
/* The profile's compute per phase as the cost model splits it: *fwd = embedding
 * + every block's forward; *bwd = head and loss (forward and backward) + every
 * block's backward + embedding backward. Recomputes are left out (which blocks
 * recompute depends on the plan). No calibration applied. */
void pt_trace_phase_compute(const pt_trace *t, double *fwd, double *bwd);
/* Fill every block's chunk_lo/chunk_hi from the chunks' first/last block. */
void pt_trace_derive_ranges(pt_trace *t);
/* Check every invariant the models rely on. 0 or PT_ERR_INVALID_ARG with the
 * first violated one named (field, index, value). */
int pt_trace_validate(const pt_trace *t, char *err, size_t errlen);
/* Bytes a persistent chunk keeps on the device / an offloaded chunk keeps on the
 * host: dev_bytes / host_bytes when non-zero, else the formulas above. */
uint64_t pt_trace_chunk_dev_state(const pt_trace *t, const pt_trace_chunk *c);
uint64_t pt_trace_chunk_host_state(const pt_trace *t, const pt_trace_chunk *c);

#endif /* PT_TRACE_H */
