/*
 * plan.h — a chosen ProTrain plan and its readable forms.
 *
 * The searcher (searcher.h) fills a pt_plan; the runtime executes
 * plan.knobs with the per-block map plan.modes; the plugin logs
 * pt_plan_text() and writes pt_plan_json() to `plan_file`.
 *
 * JSON object (flat; every key always present, numbers in bytes/seconds):
 *   version            1
 *   n_persist, n_buffer, n_swap, n_checkpoint       the knobs
 *   n_buffer_min_block, n_buffer_min   one-block and lookahead minimum of
 *                      n_buffer at this n_persist (cost_model.h)
 *   fixed_n_persist, fixed_n_buffer, fixed_n_swap, fixed_n_checkpoint
 *                      true when the knob came from an override (INI)
 *   n_block, n_chunk, chunk_size, swap_interval, swap_cap
 *   modes              block map string, 'S' swap, 'C' checkpoint, 'N' none
 *   peak_bytes, raw_peak_bytes, frag, model_state_bytes, buffer_bytes,
 *   frag_measured, frag_peak_bytes, frag_span_bytes, frag_largest_free_bytes,
 *   frag_rounding_bytes   the allocator's fragmentation in the profile
 *                      (pt_trace_frag; frag_measured 0 = not measured)
 *   activation_bytes, scratch_bytes, nonblock_bytes, peak_phase, peak_block
 *   capacity_bytes, reserve_bytes, headroom_bytes, budget_bytes
 *   host_bytes, swap_pool_bytes, host_budget_bytes (0 = unlimited)
 *   iter_s, fwd_s, bwd_s, opt_s, cpu_adam_s, dev_adam_s, compute_s,
 *   recompute_s, exposed_xfer_s, h2d_s, d2h_s, h2d_bytes, d2h_bytes,
 *   h2d_sync_bytes, sync_xfer_s (uploads a gather waited for), cpu_finish_s
 *   optimizer_schedule "overlapped" | "after_backward"
 *   exec_mode          "A" | "B" | "C" | "auto" (not decided yet)
 *   world_size, device, batch, seq
 *   best_iter_s        fastest feasible prediction (the plan is within 1%)
 *   n_evaluated, search_s
 *   runner_ups         array of {n_persist, n_buffer, n_swap, n_checkpoint,
 *                      modes, iter_s, peak_bytes}
 */
#ifndef PT_PLAN_H
#define PT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "cost_model.h"

#define PT_PLAN_MAX_ALT 4
enum { PT_KNOB_PERSIST = 1u,
       PT_KNOB_BUFFER = 2u,
       PT_KNOB_SWAP = 4u,
       PT_KNOB_CKPT = 8u };

typedef struct pt_plan_alt {
    pt_knobs knobs;
    pt_cost cost;
} pt_plan_alt;

typedef struct pt_plan {
    pt_knobs knobs;
    uint32_t fixed;             /* PT_KNOB_* bits fixed by overrides */
    int32_t n_block, n_chunk;
    uint64_t chunk_size;
    int32_t swap_interval, swap_cap;
    uint8_t *modes;             /* [n_block], owned */
    pt_cost cost;
    pt_cost_opts opts;          /* frag, reserve, headroom, clip, shard used */
    pt_trace_frag frag_meas;    /* what the profile measured (opts.frag starts from it) */
    uint64_t capacity;          /* device bytes */
    uint64_t budget;            /* capacity - reserve - headroom */
    uint64_t host_budget;       /* 0 = unlimited */
    int32_t exec_mode;          /* -1 = not decided, 0 = A, 1 = B, 2 = C */
    char mode_why[400];         /* why that mode (auto_mode with several ranks), or "" */
    char tier_rates[160];       /* with [nvme] path: where opts.tier_rd_Bps / tier_wr_Bps came
                                   from (probed, cached, assumed), or "" */
    int32_t world_size;
    int32_t tp_size;            /* tensor-parallel group size of the trace (0 or 1: none) */
    char device[64];
    int64_t batch, seq;
    /* TiledMLP: 0 = off; else the tiles each block's MLP runs in (N_eff), of
     * mlp_tile_len tokens (the last shorter), and whether the count was auto */
    int64_t mlp_tiles, mlp_tile_len;
    int32_t mlp_tiles_auto;
    int32_t n_alt;
    pt_plan_alt alt[PT_PLAN_MAX_ALT];
    double best_iter_s;         /* fastest feasible prediction; the chosen plan is within
                                   1% of it (tie rule, searcher.h) */
    int64_t n_evaluated;        /* candidates the search scored */
    double search_s;            /* wall time of the search */
    uint64_t min_capacity;      /* infeasible search: smallest device capacity that works */
} pt_plan;

void pt_plan_init(pt_plan *p);
void pt_plan_free(pt_plan *p);

/* Readable table / JSON object; malloc'd NUL-terminated string (caller frees),
 * NULL when out of memory. */
char *pt_plan_text(const pt_plan *p);
char *pt_plan_json(const pt_plan *p);
/* Write pt_plan_json atomically (temp + fsync + rename). 0 or PT_ERR_IO. */
int pt_plan_write_json(const pt_plan *p, const char *path, char *err, size_t errlen);

#endif /* PT_PLAN_H */
