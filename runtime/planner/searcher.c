/*
 * searcher.c — exhaustive four-knob search with the sound pruning listed in
 * searcher.h.
 *
 * Why pt_cost_time_lb_small bounds every n_buffer nb in [one-block minimum,
 * top] by a prediction `at` at some n >= lookahead minimum m2 (cost_model.h):
 *  - forward: block b's new chunks are split into the part block b-1
 *    prefetched (async in window b-1) and the rest (sync in window b); one
 *    more slot moves d bytes from the second to the first, and
 *    win(c, x + d) <= win(c, x) + d, so the window sum never grows with
 *    nb: fwd(nb) >= fwd(top).
 *  - backward: below m2 every block uploads a superset of what it uploads at
 *    m2 (its cached chunks are cached at m2 too; a block that misses one chunk
 *    loses the rest; the shared-chunk re-uploads only add), split between the
 *    prefetch in window b+1 and the sync at gather(b); the same inequality
 *    gives bwd(nb) >= bwd(m2) >= bwd(n) (from m2 up every window only
 *    shrinks). With clipping that bounds everything.
 *  - OVERLAP: a window's end can come earlier than at m2 only by the sync of
 *    the next gather that moved out of it (telescoping the per-window
 *    differences), at most one block's bytes: the CPU chain starts each chunk
 *    at most max_block_bytes / h2d_Bps earlier, and it is non-increasing in
 *    n from m2 up.
 * tests/unit/test_cost_model.c checks these bounds exhaustively on small
 * traces and test_searcher.c checks the plans against brute force.
 */
#include "searcher.h"
#include "placement.h"
#include "protrain.h"
#include "base/base.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TIE 1.01   /* plans within 1% of the fastest are ties */

/* One (n_swap, n_checkpoint, n_persist) with its fastest n_buffer found so
 * far. lb <= the true fastest time; lb < T while the buffers [nb_lo, nb_hi]
 * (below the lookahead minimum) are not scored yet: they are scored at the
 * end only if lb reaches the final tie band. */
typedef struct cand {
    double T;
    int32_t s, c, p, nb;
    double lb;
    int32_t nb_lo, nb_hi;
} cand;

typedef struct search {
    const pt_trace *t;
    pt_cost_ctx *cx;
    const pt_search_opts *o;
    uint64_t budget, host_budget;
    double best_T;
    cand *list;            /* candidates within TIE of the best seen */
    size_t n, cap, n_at_compact;
    cand alt[PT_PLAN_MAX_ALT + 1];   /* best per (s, c), sorted by T */
    int n_alt_kept, alt_want;
    int64_t n_eval;
    int oom;
} search;


void pt_search_opts_default(pt_search_opts *o) {
    memset(o, 0, sizeof *o);
    o->cost.frag = 1.0;
    o->cost.defer = 1;   /* the runtime's default ([protrain] defer_cpu_steps) */
    o->cost.overlap_ar = 1;   /* the runtime's default ([dist] overlap_allreduce) */
    o->n_persist = o->n_buffer = o->n_swap = o->n_checkpoint = -1;
    o->n_alt = 3;
}

/* Do n_persist = p's pinned bytes fit the host budget, and with the disk
 * tier its file the disk budget? */
static int host_fits(const search *S, const pt_act_profile *a, int32_t p) {
    pt_tier_fig f;
    pt_cost_tier(S->cx, a, p, &S->o->cost, &f);
    if (S->host_budget && f.pinned > S->host_budget) return 0;
    return !(f.level && S->o->disk_budget && f.disk > S->o->disk_budget);
}

/* Does raw (without frag) fit the budget? */
static int fits(const search *S, uint64_t raw) { return pt_cost_frag_bytes(S->o->cost.frag, raw) <= S->budget; }

static void compact(search *S) {
    size_t m = 0;
    for (size_t i = 0; i < S->n; i++)
        if (S->list[i].lb <= TIE * S->best_T) S->list[m++] = S->list[i];
    S->n = m;
    S->n_at_compact = m;
}

static void add_cand(search *S, cand c) {
    if (c.T < S->best_T) S->best_T = c.T;
    if (c.lb > TIE * S->best_T) return;
    if (S->n == S->cap) {
        if (S->n > 2 * S->n_at_compact + 64) compact(S);
        if (S->n == S->cap) {
            size_t nc = S->cap ? 2 * S->cap : 256;
            cand *q = realloc(S->list, nc * sizeof *q);
            if (!q) {
                S->oom = 1;
                return;
            }
            S->list = q;
            S->cap = nc;
        }
    }
    S->list[S->n++] = c;
}

/* Keep the best candidate per (s, c) among the alt_want+1 fastest pairs. */
static void add_alt(search *S, cand c) {
    int keep = S->alt_want + 1;
    for (int i = 0; i < S->n_alt_kept; i++)
        if (S->alt[i].s == c.s && S->alt[i].c == c.c) {
            if (c.T >= S->alt[i].T) return;
            memmove(&S->alt[i], &S->alt[i + 1], (size_t)(S->n_alt_kept - i - 1) * sizeof c);
            S->n_alt_kept--;
            break;
        }
    int i = S->n_alt_kept;
    while (i > 0 && S->alt[i - 1].T > c.T) i--;
    if (i >= keep) return;
    int last = S->n_alt_kept < keep ? S->n_alt_kept : keep - 1;
    memmove(&S->alt[i + 1], &S->alt[i], (size_t)(last - i) * sizeof c);
    S->alt[i] = c;
    if (S->n_alt_kept < keep) S->n_alt_kept++;
}

/* A pair can be skipped when its bound is beyond the tie band and every kept runner-up. */
static int prunable(const search *S, double lb) {
    if (lb <= TIE * S->best_T) return 0;
    if (S->n_alt_kept < S->alt_want + 1) return 0;
    return lb > S->alt[S->n_alt_kept - 1].T;
}

/* Largest n_persist whose persistent states alone fit next to dyn (bisection:
 * persist bytes are non-decreasing in n_persist). -1 when even 0 does not fit. */
static int32_t persist_hi(const search *S, uint64_t dyn) {
    const pt_trace *t = S->t;
    int32_t lo = -1, hi = t->n_chunk;   /* invariant: fits(lo) (or lo = -1), !fits(hi + 1) */
    if (fits(S, pt_cost_persist_bytes(S->cx, hi) + t->nonblock_bytes + dyn)) return hi;
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        if (fits(S, pt_cost_persist_bytes(S->cx, mid) + t->nonblock_bytes + dyn))
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Lower bound on the iteration time of any plan for this activation map when
 * at most p_hi chunks can be persistent. */
static double lower_bound(const search *S, const pt_act_profile *a, int32_t p_hi) {
    const pt_trace *t = S->t;
    double cf = t->embed_fwd_s, cb = t->head_fwd_s + t->head_bwd_s + t->embed_bwd_s + a->recompute_s;
    for (int32_t b = 0; b < t->n_block; b++) {
        cf += t->blocks[b].fwd_s;
        cb += t->blocks[b].bwd_s;
    }
    /* Unavoidable traffic: non-mandatory chunks >= p_hi go up once and their grads down once. */
    uint64_t up, gd, tr;   /* prefix sums: O(1) per pair instead of O(n_chunk) */
    pt_cost_offload_sums(S->cx, p_hi, &up, &gd, &tr);
    double h2d = (double)up / t->hw.h2d_Bps + a->swap_in_s, d2h = (double)gd / t->hw.d2h_Bps + a->swap_out_s;
    double x = t->hw.copy_engines == 1 ? h2d + d2h : (h2d > d2h ? h2d : d2h);
    double shard = (S->o->cost.shard && t->key.world_size > 1) ? t->key.world_size : 1;
    double cpu = (double)tr / t->hw.cpu_adam_elems_per_s / shard;
    double lb = cf + cb;
    if (x > lb) lb = x;
    /* clipped: the CPU steps wait for the end of backward; deferred, they may run
     * into the next forward, but not into its backward (every offloaded chunk's
     * upload in that forward waits for its step), so cb + cpu still holds */
    double opt = S->o->cost.clip ? (S->o->cost.defer ? cb + cpu : cf + cb + cpu) : cf + cpu;
    return opt > lb ? opt : lb;
}

/* Can n_persist = p of this mode map be skipped? Yes when a bound on all of
 * its n_buffer values is prunable, or at least best_p, the fastest time found
 * for a larger n_persist of the same (n_swap, n_checkpoint): that candidate
 * y then is in the final tie band whenever p could be, the tie rule prefers
 * y (more persistent chunks), and p can lower neither the best time nor the
 * pair's runner-up entry (both need a strictly faster time). */
static int dominated(const search *S, const pt_act_profile *a, int32_t p, double best_p) {
    if (!(best_p < INFINITY)) return 0;   /* the pair's first: its bound is usually below */
    double lb = pt_cost_time_lb_any(S->cx, a, p, &S->o->cost);
    return lb >= best_p || prunable(S, lb);
}

/* Largest n_buffer in [lo, q] whose peak fits, or -1. */
static int32_t buffer_max(const search *S, uint64_t raw_fixed, int32_t lo, int32_t q) {
    uint64_t slot = S->t->slot_bytes;
    if (q <= lo) return fits(S, raw_fixed + (uint64_t)lo * slot) ? lo : -1;
    int32_t x = q;
    double frag = S->o->cost.frag > 0 ? S->o->cost.frag : 1.0;
    double room = (double)S->budget / frag - (double)raw_fixed;
    if (slot && room < (double)q * (double)slot) x = room < 0 ? lo - 1 : (int32_t)(room / (double)slot);
    if (x > q) x = q;
    if (x < lo - 1) x = lo - 1;
    while (x >= lo && !fits(S, raw_fixed + (uint64_t)x * slot)) x--;
    while (x < q && fits(S, raw_fixed + (uint64_t)(x + 1) * slot)) x++;
    return x >= lo ? x : -1;
}

static void range(int32_t fixed, int32_t lo, int32_t hi, int32_t *a, int32_t *b) {
    if (fixed >= 0) {
        *a = fixed;
        *b = fixed;
    } else {
        *a = lo;
        *b = hi;
    }
}

/* Better under the tie rule (both within the tie band). */
static int tie_better(const cand *x, const cand *y) {
    if (x->c != y->c) return x->c < y->c;
    if (x->s != y->s) return x->s < y->s;
    if (x->p != y->p) return x->p > y->p;
    if (x->nb != y->nb) return x->nb < y->nb;
    return x->T < y->T;
}

static double time_of(const search *S, pt_act_profile *a, int32_t p, int32_t nb) {
    pt_cost c;
    pt_cost_time(S->cx, a, p, nb, &S->o->cost, &c);
    return c.iter_s;
}

/* Time of n_buffer = nb, or INFINITY when its O(1) bound prunes it (the bound
 * is non-increasing in nb: a pruned nb prunes every smaller one). */
static double eval_nb(search *S, pt_act_profile *a, int32_t p, int32_t nb, pt_cost *out) {
    if (prunable(S, pt_cost_time_lb(S->cx, a, p, nb, &S->o->cost))) return INFINITY;
    pt_cost_time(S->cx, a, p, nb, &S->o->cost, out);
    S->n_eval++;
    return out->iter_s;
}

/* Every nb in [lo, hi]; the fastest into *c. */
static void eval_range(search *S, pt_act_profile *a, int32_t lo, int32_t hi, cand *c) {
    pt_cost tmp;
    for (int32_t nb = lo; nb <= hi; nb++) {
        double T = eval_nb(S, a, c->p, nb, &tmp);
        if (T < c->T) {
            c->T = T;
            c->nb = nb;
        }
    }
    c->lb = c->T;
    c->nb_lo = 1;
    c->nb_hi = 0;
}

/* Values [lo, hi] of r not scored: r.lb = min(r.T, lb) bounds them. */
static cand defer(cand r, double lb, int32_t lo, int32_t hi) {
    r.lb = lb < r.T ? lb : r.T;
    r.nb_lo = lo;
    r.nb_hi = hi;
    return r;
}

/* Score [lo, hi] (all below the lookahead minimum) too, keeping the faster,
 * from hi down: forward time only grows as n_buffer falls, so once the bound
 * pt_cost_time_lb_small(nb) reaches the best time so far it holds for every
 * smaller nb as well, and those are deferred. `at` is a prediction at or
 * above the lookahead minimum. */
static cand score_down(search *S, pt_act_profile *a, cand r, int32_t lo, int32_t hi, const pt_cost *at) {
    pt_cost tmp;
    for (int32_t nb = hi; nb >= lo; nb--) {
        double lbn = pt_cost_time_lb_small(S->cx, a, r.p, nb, at);
        if (lbn >= S->best_T || S->o->defer_small) return defer(r, lbn, lo, nb);
        double T = eval_nb(S, a, r.p, nb, &tmp);
        if (T < r.T) {
            r.T = T;
            r.nb = nb;
        }
    }
    r.lb = r.T;
    return r;
}

/* The candidate of one (s, c, p) whose buffers can be anything in
 * [lo1, nbmax] (lo1 = one-block minimum, lo2 = lookahead minimum; T is
 * INFINITY when everything was pruned).
 * From lo2 up, time is non-increasing in n_buffer, so there only nbmax can be
 * fastest. Below lo2 it is not monotone; the values there are scored now only
 * when a lower bound on all of them (pt_cost_time_lb_small, cheap form first;
 * pt_cost_time_lb, non-increasing in n_buffer) is below the best time so far,
 * i.e. one of them could become the best. Otherwise they are deferred
 * (cand.lb) and pick_plan scores them only if that could change the pick. */
static cand score_p(search *S, pt_act_profile *a, int32_t s, int32_t c, int32_t p, int32_t lo1, int32_t lo2,
                    int32_t nbmax) {
    cand r = {.T = INFINITY, .s = s, .c = c, .p = p, .nb = nbmax, .lb = INFINITY, .nb_lo = 1, .nb_hi = 0};
    pt_cost at;
    if (nbmax < lo2 && nbmax - lo1 < 2) {
        eval_range(S, a, lo1, nbmax, &r);
        return r;
    }
    r.T = r.lb = eval_nb(S, a, p, nbmax, &at);
    if (!(r.T < INFINITY)) return r;   /* pruned: every smaller n_buffer is too */
    if (nbmax >= lo2) {
        if (lo1 >= lo2) return r;
        double lbs = pt_cost_time_lb_small(S->cx, a, p, -1, &at);
        if (!(lbs < r.T)) return r;   /* none below lo2 can be faster */
        if (lbs >= S->best_T || S->o->defer_small) return defer(r, lbs, lo1, lo2 - 1);
        return score_down(S, a, r, lo1, lo2 - 1, &at);
    }
    /* several values, all below lo2 */
    double lb0 = pt_cost_time_lb(S->cx, a, p, nbmax - 1, &S->o->cost);
    if (lb0 >= S->best_T || S->o->defer_small) return defer(r, lb0, lo1, nbmax - 1);
    /* a prediction at lo2 (not feasible here) bounds their time */
    pt_cost_time(S->cx, a, p, lo2, &S->o->cost, &at);
    S->n_eval++;
    return score_down(S, a, r, lo1, nbmax - 1, &at);
}

/* Score a deferred candidate's remaining buffers. */
static void resolve(search *S, pt_act_profile *a, uint8_t *modes, cand *x) {
    pt_place_blocks(S->t->n_block, x->s, x->c, pt_cost_swap_interval(S->cx), modes, NULL, 0);
    pt_act_compute(S->cx, modes, a);
    cand low = *x;
    eval_range(S, a, x->nb_lo, x->nb_hi, &low);
    if (low.T < x->T) *x = low;
    x->lb = x->T;
    x->nb_lo = 1;
    x->nb_hi = 0;
    add_alt(S, *x);
}

/* The tie rule over the final band. First every deferred candidate whose
 * bound is below the best time is scored (it could be the best: the band
 * depends on it; none is when deferral only happens at bound >= best, as in
 * score_p, except under opts.defer_small). Then a deferred candidate is
 * scored only when its bound reaches the band, it is above the band so far,
 * and it would beat the current pick: a candidate already in the band needs
 * no exact time. */
static cand *pick_plan(search *S, pt_act_profile *a, uint8_t *modes) {
    /* one pass: best_T only falls, so a candidate passed over earlier had its
     * bound above a best that was already higher than the new one */
    for (size_t i = 0; i < S->n; i++) {
        cand *x = &S->list[i];
        if (x->nb_lo > x->nb_hi || !(x->lb < S->best_T)) continue;
        resolve(S, a, modes, x);
        if (x->T < S->best_T) S->best_T = x->T;
    }
    double band = TIE * S->best_T;
    cand *pick = NULL;
    for (size_t i = 0; i < S->n; i++)
        if (S->list[i].T <= band && (!pick || tie_better(&S->list[i], pick))) pick = &S->list[i];
    for (size_t i = 0; i < S->n; i++) {
        cand *x = &S->list[i];
        if (x->nb_lo > x->nb_hi || x->lb > band || x->T <= band || (pick && !tie_better(x, pick))) continue;
        resolve(S, a, modes, x);
        if (x->T <= band && (!pick || tie_better(x, pick))) pick = x;
    }
    return pick;
}

/* Fill a plan entry's full prediction. */
static void full_cost(const search *S, pt_act_profile *a, uint8_t *modes, const cand *c, pt_cost *out) {
    pt_place_blocks(S->t->n_block, c->s, c->c, pt_cost_swap_interval(S->cx), modes, NULL, 0);
    pt_act_compute(S->cx, modes, a);
    memset(out, 0, sizeof *out);
    pt_cost_time(S->cx, a, c->p, c->nb, &S->o->cost, out);
    pt_cost_memory(S->cx, &S->o->cost, a, c->p, c->nb, out);
}

static int check_overrides(const pt_trace *t, const pt_search_opts *o, char *err, size_t errlen) {
    if (o->n_persist > t->n_chunk)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "override n_persist=%d exceeds the %d chunks", o->n_persist,
                       t->n_chunk);
    if (o->n_buffer > t->n_chunk)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "override n_buffer=%d exceeds the %d chunks", o->n_buffer,
                       t->n_chunk);
    if (o->n_persist >= 0 && o->n_buffer >= 0 && o->n_persist + o->n_buffer > t->n_chunk)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "overrides n_persist=%d + n_buffer=%d exceed the %d chunks",
                       o->n_persist, o->n_buffer, t->n_chunk);
    int s = o->n_swap > 0 ? o->n_swap : 0, c = o->n_checkpoint > 0 ? o->n_checkpoint : 0;
    if (s + c > t->n_block)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "overrides n_swap=%d + n_checkpoint=%d exceed the %d blocks",
                       s, c, t->n_block);
    return PT_OK;
}

/* A fixed n_buffer that no allowed n_persist accepts: the sentence names the
 * closest miss with both numbers. 0 when some n_persist accepts it. */
static int buffer_unusable(search *S, int32_t p0, int32_t p1, char *err, size_t errlen) {
    const pt_search_opts *o = S->o;
    int32_t K = S->t->n_chunk, nb = o->n_buffer, worst = -1, gap = INT32_MAX;
    if (nb < 0) return 0;
    for (int32_t p = p0; p <= p1; p++) {
        int32_t lo1 = pt_cost_buffer_min_block(S->cx, p);
        if (nb >= lo1 && nb <= K - p) return 0;
        if (nb < lo1 && lo1 - nb < gap) {
            gap = lo1 - nb;
            worst = p;
        }
    }
    if (worst < 0)   /* only n_persist + n_buffer > n_chunk (check_overrides names a fixed pair) */
        return pt_fail(err, errlen, PT_ERR_INFEASIBLE,
                       "no n_persist works with the fixed n_buffer=%d: n_persist + n_buffer must stay within the %d chunks "
                       "and n_persist=%d is the smallest allowed",
                       nb, K, p0);
    int32_t lo1 = pt_cost_buffer_min_block(S->cx, worst), lo2 = pt_cost_buffer_min(S->cx, worst);
    if (p0 == p1)
        return pt_fail(err, errlen, PT_ERR_INFEASIBLE,
                       "n_buffer=%d is below the one-block minimum %d for n_persist=%d: the largest block streams %d "
                       "non-persistent chunks and each needs a slot while the block runs (the lookahead minimum, at "
                       "which every prefetch overlaps, is %d); raise n_buffer to at least %d or n_persist",
                       nb, lo1, worst, lo1, lo2, lo1);
    return pt_fail(err, errlen, PT_ERR_INFEASIBLE,
                   "no n_persist in [%d, %d] works with the fixed n_buffer=%d: it is below the one-block minimum (the "
                   "non-persistent chunks of the largest block) wherever n_persist + n_buffer fits the %d chunks; the "
                   "closest is n_persist=%d with a one-block minimum of %d (lookahead minimum %d)",
                   p0, p1, nb, K, worst, lo1, lo2);
}

/* Infeasible: name the real reason — a fixed n_buffer no n_persist accepts,
 * then host RAM, then the device (the smallest capacity, i.e. the minimum peak
 * under the host budget and the fixed knobs). */
static int explain_infeasible(search *S, pt_act_profile *a, uint8_t *modes, pt_plan *plan, char *err,
                              size_t errlen) {
    const pt_trace *t = S->t;
    const pt_search_opts *o = S->o;
    int32_t N = t->n_block, K = t->n_chunk, I = pt_cost_swap_interval(S->cx);
    int32_t c0, c1, s0, s1, p0, p1;
    range(o->n_checkpoint, 0, N, &c0, &c1);
    range(o->n_persist, 0, K, &p0, &p1);
    int rc = buffer_unusable(S, p0, p1, err, errlen);
    if (rc) return rc;
    uint64_t best_need = UINT64_MAX, min_host = UINT64_MAX, min_disk = UINT64_MAX;
    pt_tier_fig host_fig = {0}, disk_fig = {0};
    cand best = {.T = 0}, host_at = {.T = 0}, disk_at = {.T = 0};
    for (int32_t c = c0; c <= c1; c++) {
        range(o->n_swap, 0, N - c < pt_place_swap_cap(N, I) ? N - c : pt_place_swap_cap(N, I), &s0, &s1);
        for (int32_t s = s0; s <= s1 && s + c <= N; s++) {
            pt_place_blocks(N, s, c, I, modes, NULL, 0);
            pt_act_compute(S->cx, modes, a);
            for (int32_t p = p0; p <= p1; p++) {
                int32_t nb = pt_cost_buffer_min_block(S->cx, p);   /* fewest slots: smallest peak */
                if (o->n_buffer >= 0) {
                    if (o->n_buffer < nb || o->n_buffer > K - p) continue;
                    nb = o->n_buffer;
                }
                pt_tier_fig f;
                pt_cost_tier(S->cx, a, p, &o->cost, &f);
                if (f.pinned < min_host) {
                    min_host = f.pinned;
                    host_fig = f;
                    host_at = (cand){.s = s, .c = c, .p = p, .nb = nb};
                }
                if (S->host_budget && f.pinned > S->host_budget) continue;
                if (f.level && o->disk_budget && f.disk > o->disk_budget) {
                    if (f.disk < min_disk) {
                        min_disk = f.disk;
                        disk_fig = f;
                        disk_at = (cand){.s = s, .c = c, .p = p, .nb = nb};
                    }
                    continue;
                }
                uint64_t raw = pt_cost_persist_bytes(S->cx, p) + pt_cost_buffer_bytes(S->cx, p, nb) +
                               t->nonblock_bytes + a->peak_dyn;
                uint64_t need = pt_cost_frag_bytes(o->cost.frag, raw) + o->cost.reserve_bytes + o->cost.headroom_bytes;
                if (need < best_need) {
                    best_need = need;
                    best = (cand){.s = s, .c = c, .p = p, .nb = nb};
                }
            }
        }
    }
    if (best_need == UINT64_MAX && min_disk < UINT64_MAX)
        return pt_fail(err, errlen, PT_ERR_INFEASIBLE,
                       "no plan fits the disk tier: the plans whose pinned bytes fit the budget of %llu need the disk "
                       "tier, and the smallest (n_persist=%d n_swap=%d, level %d: %llu pinned bytes) puts %llu bytes "
                       "(%.2f GiB) on disk, over the %llu bytes (%.2f GiB) [nvme] budget or the folder's free space allows",
                       (unsigned long long)S->host_budget, disk_at.p, disk_at.s, disk_fig.level,
                       (unsigned long long)disk_fig.pinned, (unsigned long long)min_disk, min_disk / 1073741824.0,
                       (unsigned long long)o->disk_budget, o->disk_budget / 1073741824.0);
    if (best_need == UINT64_MAX && host_fig.level)
        return pt_fail(err, errlen, PT_ERR_INFEASIBLE,
                       "no plan fits host RAM, even with the disk tier: the smallest pinned host footprint (n_persist=%d "
                       "n_swap=%d, the tier at level %d%s: %d staging slots of the largest record, the %s and the swap "
                       "pool) is %llu bytes (%.2f GiB) with %llu bytes (%.2f GiB) on disk; "
                       "the pinned budget is %llu bytes (%.2f GiB)",
                       host_at.p, host_at.s, host_fig.level,
                       host_fig.level == 1 && t->key.world_size > 1 ? " (level 2 is built for one rank and mode C)" : "",
                       host_fig.slots,
                       host_fig.level == 1 ? "offloaded chunks' params and gradients" : "chunks' images on disk",
                       (unsigned long long)min_host,
                       min_host / 1073741824.0, (unsigned long long)host_fig.disk, host_fig.disk / 1073741824.0,
                       (unsigned long long)S->host_budget, S->host_budget / 1073741824.0);
    if (best_need == UINT64_MAX)
        return pt_fail(err, errlen, PT_ERR_INFEASIBLE,
                       "no plan fits host RAM: the smallest pinned host footprint (n_persist=%d n_swap=%d: offloaded "
                       "chunk states plus swap pool) is %llu bytes (%.2f GiB), the budget is %llu bytes (%.2f GiB)",
                       host_at.p, host_at.s, (unsigned long long)min_host, min_host / 1073741824.0,
                       (unsigned long long)S->host_budget, S->host_budget / 1073741824.0);
    plan->min_capacity = best_need;
    plan->knobs = (pt_knobs){best.p, best.nb, best.s, best.c};
    full_cost(S, a, modes, &best, &plan->cost);
    memcpy(plan->modes, modes, (size_t)N);
    char disk[300] = "";
    if (min_disk < UINT64_MAX)
        snprintf(disk, sizeof disk,
                 " (plans offloading more fit the pinned budget only with more disk than the %llu bytes allowed: the "
                 "smallest, n_persist=%d, puts %llu bytes on disk)",
                 (unsigned long long)o->disk_budget, disk_at.p, (unsigned long long)min_disk);
    return pt_fail(err, errlen, PT_ERR_INFEASIBLE,
                   "no plan fits the device: capacity %llu bytes minus reserve %llu and headroom %llu leaves %llu; the smallest "
                   "peak (n_persist=%d n_buffer=%d n_swap=%d n_checkpoint=%d) is %llu bytes, so the device needs at least "
                   "%llu bytes (%.2f GiB)%s",
                   (unsigned long long)plan->capacity, (unsigned long long)o->cost.reserve_bytes,
                   (unsigned long long)o->cost.headroom_bytes, (unsigned long long)S->budget, best.p, best.nb, best.s,
                   best.c, (unsigned long long)plan->cost.peak_bytes, (unsigned long long)best_need,
                   best_need / 1073741824.0, disk);
}

/* The plan's description of the search: budgets, options, the trace's shape. */
static void plan_header(const search *S, int32_t I, int32_t cap, pt_plan *plan) {
    const pt_trace *t = S->t;
    const pt_search_opts *o = S->o;
    const int32_t N = t->n_block, K = t->n_chunk;
    plan->budget = S->budget;
    plan->host_budget = S->host_budget;
    plan->opts = o->cost;
    if (!(plan->opts.frag > 0)) plan->opts.frag = 1.0;
    plan->frag_meas = t->frag;
    plan->n_block = N;
    plan->n_chunk = K;
    plan->chunk_size = t->chunk_size;
    plan->swap_interval = I;
    plan->swap_cap = cap;
    plan->world_size = t->key.world_size;
    plan->tp_size = t->tp_size;
    memcpy(plan->device, t->key.device, sizeof plan->device);
    plan->batch = t->key.batch;
    plan->seq = t->key.seq;
    plan->fixed = (o->n_persist >= 0 ? PT_KNOB_PERSIST : 0) | (o->n_buffer >= 0 ? PT_KNOB_BUFFER : 0) |
                  (o->n_swap >= 0 ? PT_KNOB_SWAP : 0) | (o->n_checkpoint >= 0 ? PT_KNOB_CKPT : 0);
}

/* Every (n_checkpoint, n_swap) pair, and under it n_persist downwards and the
 * buffer count: the candidates kept in S (list, alternatives, best time). */
static void scan(search *S, pt_act_profile *a, uint8_t *modes, int32_t I, int32_t cap) {
    const pt_trace *t = S->t;
    const pt_search_opts *o = S->o;
    const int32_t N = t->n_block, K = t->n_chunk;
    int32_t c0, c1, s0, s1, p0, p1;
    range(o->n_checkpoint, 0, N, &c0, &c1);
    range(o->n_persist, 0, K, &p0, &p1);
    for (int32_t c = c0; c <= c1; c++) {
        range(o->n_swap, 0, N - c < cap ? N - c : cap, &s0, &s1);
        for (int32_t s = s0; s <= s1 && s + c <= N; s++) {
            pt_place_blocks(N, s, c, I, modes, NULL, 0);
            pt_act_compute(S->cx, modes, a);
            int32_t p_hi = persist_hi(S, a->peak_dyn);
            if (p_hi < p0) continue;   /* nothing fits next to these activations */
            if (prunable(S, lower_bound(S, a, o->n_persist >= 0 ? o->n_persist : p_hi))) continue;
            cand pair_best = {.T = INFINITY, .s = s, .c = c};
            /* n_persist downwards from the largest that fits: the bound below
             * only grows as n_persist falls, so the first miss ends the scan. */
            for (int32_t p = p1 < p_hi ? p1 : p_hi; p >= p0; p--) {
                if (prunable(S, pt_cost_time_lb_persist(S->cx, a, p, &o->cost))) break;
                if (o->n_persist < 0 && pt_cost_persist_redundant(S->cx, p)) continue;
                if (!host_fits(S, a, p)) continue;
                uint64_t raw_fixed = pt_cost_persist_bytes(S->cx, p) + t->nonblock_bytes + a->peak_dyn;
                int32_t lo1 = pt_cost_buffer_min_block(S->cx, p), lo2 = pt_cost_buffer_min(S->cx, p);
                int32_t q = pt_cost_n_offloaded(S->cx, p);
                cand cd;
                if (o->n_buffer >= 0) {
                    int32_t nb = o->n_buffer;
                    if (nb < lo1 || nb > K - p || !fits(S, raw_fixed + pt_cost_buffer_bytes(S->cx, p, nb))) continue;
                    if (dominated(S, a, p, pair_best.T)) continue;
                    cd = (cand){.T = INFINITY, .s = s, .c = c, .p = p, .nb = nb};
                    eval_range(S, a, nb, nb, &cd);
                } else {
                    int32_t nb = buffer_max(S, raw_fixed, lo1, q);
                    if (nb < 0 || dominated(S, a, p, pair_best.T)) continue;
                    /* O(1) bounds inside: most candidates of a transfer-bound model stop there */
                    cd = score_p(S, a, s, c, p, lo1, lo2, nb);
                }
                if (!(cd.T < INFINITY)) continue;
                add_cand(S, cd);
                if (cd.T < pair_best.T) pair_best = cd;
            }
            if (pair_best.T < INFINITY) add_alt(S, pair_best);
        }
    }
}

/* Fewest buffers within the band: below the lookahead minimum time is not
 * monotone (scan), from it up it is (bisection). */
static void fewest_buffers(search *S, pt_act_profile *a, uint8_t *modes, int32_t I, cand *ch) {
    pt_place_blocks(S->t->n_block, ch->s, ch->c, I, modes, NULL, 0);
    pt_act_compute(S->cx, modes, a);
    int32_t lo = pt_cost_buffer_min_block(S->cx, ch->p), lo2 = pt_cost_buffer_min(S->cx, ch->p);
    int32_t hi = ch->nb;   /* time(hi) is within the band */
    for (; lo < hi && lo < lo2; lo++) {
        S->n_eval++;
        if (time_of(S, a, ch->p, lo) <= TIE * S->best_T) {
            hi = lo;
            break;
        }
    }
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (time_of(S, a, ch->p, mid) <= TIE * S->best_T)
            hi = mid;
        else
            lo = mid + 1;
        S->n_eval++;
    }
    ch->nb = hi;
}

/* The chosen candidate and the alternatives into the plan, each fully costed. */
static void fill_plan(search *S, pt_act_profile *a, uint8_t *modes, cand *chp, pt_plan *plan) {
    const int32_t N = S->t->n_block;
    cand ch = *chp;
    plan->knobs = (pt_knobs){ch.p, ch.nb, ch.s, ch.c};
    plan->best_iter_s = S->best_T;
    full_cost(S, a, modes, &ch, &plan->cost);
    memcpy(plan->modes, modes, (size_t)N);
    for (int i = 0; i < S->n_alt_kept && plan->n_alt < S->alt_want; i++) {
        if (S->alt[i].s == ch.s && S->alt[i].c == ch.c) continue;
        pt_plan_alt *al = &plan->alt[plan->n_alt++];
        al->knobs = (pt_knobs){S->alt[i].p, S->alt[i].nb, S->alt[i].s, S->alt[i].c};
        full_cost(S, a, modes, &S->alt[i], &al->cost);
    }
}

int pt_search(const pt_trace *t, const pt_search_opts *o, pt_plan *plan, char *err, size_t errlen) {
    double t0 = pt_now_s();
    pt_plan_free(plan);
    pt_plan_init(plan);
    int rc = check_overrides(t, o, err, errlen);
    if (rc) return rc;
    search S;
    memset(&S, 0, sizeof S);
    S.t = t;
    S.o = o;
    rc = pt_cost_ctx_new(t, &S.cx, err, errlen);
    if (rc) return rc;
    int32_t N = t->n_block, I = pt_cost_swap_interval(S.cx), cap = pt_place_swap_cap(N, I);
    plan->capacity = o->capacity ? o->capacity : t->hw.device_capacity;
    S.budget = pt_cost_budget(plan->capacity, &o->cost);
    S.host_budget = o->host_ram ? o->host_ram : t->hw.host_ram_bytes;
    S.best_T = INFINITY;
    S.alt_want = o->n_alt < 0 ? 0 : o->n_alt > PT_PLAN_MAX_ALT ? PT_PLAN_MAX_ALT
                                                               : o->n_alt;
    plan_header(&S, I, cap, plan);
    plan->modes = calloc((size_t)N, 1);
    uint8_t *modes = malloc((size_t)N);
    pt_act_profile a;
    if (!plan->modes || !modes || pt_act_init(S.cx, &a)) {
        free(modes);
        pt_cost_ctx_free(S.cx);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "searcher: out of memory");
    }
    if (plan->capacity == 0) {
        rc = pt_fail(err, errlen, PT_ERR_INVALID_ARG, "searcher: device capacity is 0 (set it in the trace or the options)");
        goto out;
    }
    scan(&S, &a, modes, I, cap);
    if (S.oom) {
        rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "searcher: out of memory keeping candidates");
        goto out;
    }
    if (S.n == 0) {
        rc = explain_infeasible(&S, &a, modes, plan, err, errlen);
        goto out;
    }

    /* Tie rule over the final band, then the fewest buffers within it. */
    cand ch = *pick_plan(&S, &a, modes);
    if (o->n_buffer < 0) fewest_buffers(&S, &a, modes, I, &ch);
    fill_plan(&S, &a, modes, &ch, plan);
    rc = PT_OK;
out:
    plan->n_evaluated = S.n_eval;
    plan->search_s = pt_now_s() - t0;
    free(S.list);
    free(modes);
    pt_act_free(&a);
    pt_cost_ctx_free(S.cx);
    return rc;
}
