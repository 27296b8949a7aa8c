/*
 * searcher.h — the four-knob search.
 *
 * Minimise predicted iteration time subject to
 *   predicted peak <= capacity - reserve - headroom     (cost_model.h)
 *   host bytes     <= host budget (when one is set)
 * over n_checkpoint in [0, N], n_swap in [0, min(N - n_checkpoint, ceil(N/I))],
 * n_persist in [0, N_chunk] (mandatory chunks always persistent), n_buffer in
 * [one-block minimum, non-persistent chunk count] (cost_model.h: below the
 * lookahead minimum some prefetches are synchronous, but the pool is smaller,
 * which is what fits under a tight capacity).
 *
 * Pruning, all sound in this cost model:
 *  - the activation profile depends only on (n_swap, n_checkpoint): computed
 *    once per pair;
 *  - for a pair, the peak grows with n_persist at any fixed n_buffer, so once
 *    persistent states alone no longer fit, larger n_persist cannot fit:
 *    stop (the buffer minimum falls with n_persist, so a plan that fails
 *    only for lack of buffers does NOT stop the scan);
 *  - from the lookahead minimum up, time is non-increasing in n_buffer and
 *    peak increasing, so there only the largest feasible n_buffer can be
 *    fastest; below it time is not monotone and each feasible value is
 *    scored, unless the largest feasible is at or above the lookahead minimum
 *    and pt_cost_time_lb_small shows none below can beat it; the tie rule's
 *    "fewest buffers within 1%" scans below the lookahead minimum and
 *    bisects above it;
 *  - a pair is skipped when a lower bound on its time (pure compute,
 *    unavoidable copy traffic for the chunks that cannot be persistent, CPU
 *    Adam) exceeds both 1.01 x the best time and every kept runner-up; the
 *    same test with pt_cost_time_lb (cost_model.h) skips single candidates
 *    before their O(n_block) evaluation;
 *  - within a pair, an n_persist whose pt_cost_time_lb_any (every n_buffer:
 *    forward at the full pool, backward windows at compute, the CPU Adam
 *    chain) is at least the fastest time of a larger n_persist is skipped:
 *    the tie rule prefers the larger one whenever both could be in the band,
 *    and only a strictly faster time changes the best or the runner-ups.
 * Ties: among plans within 1% of the fastest, prefer fewer CKPT blocks, then
 * fewer SWAP blocks, then more persistent chunks, then fewer buffers.
 *
 * No feasible plan: the error sentence names the real reason, first match of
 *  - a fixed n_buffer below the one-block minimum of every allowed n_persist
 *    (both numbers given);
 *  - host RAM: no plan's pinned footprint fits the host budget (smallest given;
 *    with the disk tier, at its level 2, with the bytes it would put on disk);
 *  - the disk: every plan whose pinned bytes fit needs more disk than
 *    disk_budget (the smallest given);
 *  - the device: the search is repeated with unlimited device capacity
 *    minimising the peak (host budget and fixed knobs still apply) and the
 *    sentence states the smallest capacity that works; plan->min_capacity
 *    holds it and plan->knobs the plan that achieves it.
 */
#ifndef PT_SEARCHER_H
#define PT_SEARCHER_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "trace.h"

typedef struct pt_search_opts {
    pt_cost_opts cost;          /* frag, reserve, headroom, clip, shard */
    uint64_t capacity;          /* device bytes; 0 = trace hw.device_capacity */
    uint64_t host_ram;          /* host budget; 0 = trace hw.host_ram_bytes (0 there = unlimited) */
    uint64_t disk_budget;       /* with the disk tier (cost.tier_slots): bytes its file may take
                                   ([nvme] budget, or the folder's free space); 0 = unlimited */
    int32_t n_persist, n_buffer, n_swap, n_checkpoint;   /* >= 0 fixes the knob, -1 searches it */
    int32_t n_alt;              /* runner-ups to keep, <= PT_PLAN_MAX_ALT */
    int32_t defer_small;        /* tests: score the n_buffer values below the lookahead minimum only
                                   at the end (the deferred path); same plan, usually slower */
} pt_search_opts;

/* Defaults: frag 1.0, no reserve/headroom, no clipping, every knob searched, 3 runner-ups. */
void pt_search_opts_default(pt_search_opts *o);

/* Returns PT_OK with plan filled; PT_ERR_INFEASIBLE (err states the smallest
 * capacity, or the host RAM shortfall); PT_ERR_INVALID_ARG (bad trace or an
 * override out of range, named in err). plan must be pt_plan_init'ed; it is
 * overwritten. */
int pt_search(const pt_trace *t, const pt_search_opts *o, pt_plan *plan, char *err, size_t errlen);

#endif /* PT_SEARCHER_H */
