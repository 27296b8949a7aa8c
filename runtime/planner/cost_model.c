/*
 * cost_model.c — the time and peak-memory models documented in cost_model.h.
 *
 * Everything chunk-related is answered from prefix sums over chunk index, so a
 * prediction costs O(n_block) whatever the chunk count: with n_persist = p the
 * non-persistent chunks are the non-mandatory ones with index >= p. Which of
 * them upload in which window comes from the buffer-pool walk of
 * pool_model.c (O(1) per block). The chunks first (last) used by a block form
 * one index range among the non-mandatory chunks (execution order,
 * validated). The lower bounds below use the simpler hit threshold h (the
 * last min(n_buffer, |Q|) streamed chunks are cached at the turn): chunks in
 * [p, h) must upload again in backward whatever the pool does.
 */
#include "cost_model.h"
#include "cost_internal.h"
#include "placement.h"
#include "protrain.h"
#include "base/base.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>



static inline uint64_t rsum(const uint64_t *pre, int32_t lo, int32_t hi) {
    return hi > lo ? pre[hi] - pre[lo] : 0;
}
static inline int32_t rcnt(const int32_t *pre, int32_t lo, int32_t hi) { return hi > lo ? pre[hi] - pre[lo] : 0; }
static inline int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }
static inline double dmax(double a, double b) { return a > b ? a : b; }

void pt_cost_ctx_free(pt_cost_ctx *cx) {
    if (!cx) return;
    free(cx->cnt);
    free(cx->bytes);
    free(cx->grad);
    free(cx->train);
    free(cx->rks);
    free(cx->dev);
    free(cx->host);
    free(cx->nm_pos);
    free(cx->fstart);
    free(cx->f_lo);
    free(cx->f_hi);
    free(cx->l_lo);
    free(cx->l_hi);
    free(cx->nbmin);
    free(cx->nbmin1);
    free(cx->nmb);
    free(cx->rlo);
    free(cx->rhi);
    free(cx->has);
    free(cx);
}

int pt_cost_swap_interval(const pt_cost_ctx *cx) { return cx->interval; }

int pt_cost_ctx_new(const pt_trace *t, pt_cost_ctx **out, char *err, size_t errlen) {
    *out = NULL;
    int rc = pt_trace_validate(t, err, errlen);
    if (rc) return rc;
    pt_cost_ctx *cx = calloc(1, sizeof *cx);
    if (!cx) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "cost model: out of memory");
    int32_t N = t->n_block, K = t->n_chunk;
    cx->t = t;
    cx->N = N;
    cx->K = K;
    size_t k1 = (size_t)K + 1;
    cx->cnt = calloc(k1, sizeof *cx->cnt);
    cx->bytes = calloc(k1, sizeof(uint64_t));
    cx->grad = calloc(k1, sizeof(uint64_t));
    cx->train = calloc(k1, sizeof(uint64_t));
    cx->rks = calloc(k1, sizeof(double));
    cx->dev = calloc(k1, sizeof(uint64_t));
    cx->host = calloc(k1, sizeof(uint64_t));
    cx->nm_pos = calloc(k1, sizeof *cx->nm_pos);
    cx->f_lo = malloc((size_t)N * sizeof(int32_t));
    cx->f_hi = malloc((size_t)N * sizeof(int32_t));
    cx->l_lo = malloc((size_t)N * sizeof(int32_t));
    cx->l_hi = malloc((size_t)N * sizeof(int32_t));
    cx->nbmin = calloc(k1, sizeof *cx->nbmin);
    cx->nbmin1 = calloc(k1, sizeof *cx->nbmin1);
    cx->nmb = calloc(k1, sizeof *cx->nmb);
    cx->rlo = malloc((size_t)N * sizeof(int32_t));
    cx->rhi = malloc((size_t)N * sizeof(int32_t));
    cx->has = malloc((size_t)N);
    cx->fstart = malloc((size_t)N * sizeof(double));
    if (!cx->fstart || !cx->cnt || !cx->bytes || !cx->grad || !cx->train || !cx->rks || !cx->dev || !cx->host || !cx->nm_pos || !cx->f_lo ||
        !cx->f_hi || !cx->l_lo || !cx->l_hi || !cx->nbmin || !cx->nbmin1 || !cx->nmb || !cx->rlo || !cx->rhi ||
        !cx->has) {
        pt_cost_ctx_free(cx);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "cost model: out of memory for %d chunks", K);
    }
    for (int32_t b = 0; b < N; b++) cx->f_lo[b] = cx->f_hi[b] = cx->l_lo[b] = cx->l_hi[b] = 0;
    for (int32_t k = 0; k < K; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        uint64_t g = c->trainable_elems * t->grad_elem_bytes;
        int nm = !c->mandatory;
        cx->cnt[k + 1] = cx->cnt[k] + nm;
        cx->bytes[k + 1] = cx->bytes[k] + (nm ? c->bytes : 0);
        cx->grad[k + 1] = cx->grad[k] + (nm ? g : 0);
        cx->train[k + 1] = cx->train[k] + (nm ? c->trainable_elems : 0);
        cx->rks[k + 1] = cx->rks[k] + (nm ? c->rekls_s : 0);
        cx->dev[k + 1] = cx->dev[k] + (nm ? pt_trace_chunk_dev_state(t, c) : 0);
        cx->host[k + 1] = cx->host[k] + (nm ? pt_trace_chunk_host_state(t, c) : 0);
        if (!nm) {
            cx->mand_dev += pt_trace_chunk_dev_state(t, c);
            cx->mand_train += c->trainable_elems;
            cx->mand_rks += c->rekls_s;
            cx->mand_grad += g;
            continue;
        }
        cx->nmb[cx->n_nm + 1] = cx->nmb[cx->n_nm] + c->bytes;
        cx->nm_pos[cx->n_nm++] = k;
        int32_t fb = c->first_block, lb = c->last_block;
        /* Ranges grow monotonically (validated execution order). */
        if (cx->f_hi[fb] == 0) cx->f_lo[fb] = k;
        cx->f_hi[fb] = k + 1;
        if (cx->l_hi[lb] == 0) cx->l_lo[lb] = k;
        cx->l_hi[lb] = k + 1;
    }
    cx->nm_pos[cx->n_nm] = K;
    for (int32_t b = 0; b < N; b++) {
        const pt_trace_block *B = &t->blocks[b];
        cx->has[b] = B->chunk_lo >= 0;
        cx->rlo[b] = cx->has[b] ? cx->cnt[B->chunk_lo] : 0;
        cx->rhi[b] = cx->has[b] ? cx->cnt[B->chunk_hi] : 0;
        uint64_t by = cx->nmb[cx->rhi[b]] - cx->nmb[cx->rlo[b]];
        if (by > cx->max_block_bytes) cx->max_block_bytes = by;
    }
    cx->all_have = 1;
    for (int32_t b = 0; b < N; b++) cx->all_have &= cx->has[b];
    for (int32_t b = 0; b < N; b++)
        cx->fstart[b] = b ? cx->fstart[b - 1] + t->blocks[b - 1].fwd_s : t->embed_fwd_s;
    /* One-block minimum: slots for the non-persistent chunks of the largest
     * block (the runtime refuses fewer). Lookahead minimum: those of any two
     * consecutive blocks (a single block when N == 1), so every prefetch fits;
     * >= 1 when any chunk is streamed. Count over the union of the ranges. */
    for (int32_t p = 0; p <= K; p++) {
        int32_t m = 0, m1 = 0;
        for (int32_t b = 0; b < N; b++) {
            const pt_trace_block *B = &t->blocks[b];
            int32_t lo = B->chunk_lo, hi = B->chunk_hi;
            if (b + 1 < N && t->blocks[b + 1].chunk_lo >= 0) {
                if (lo < 0) lo = t->blocks[b + 1].chunk_lo;
                hi = imax(hi, t->blocks[b + 1].chunk_hi);
            }
            if (B->chunk_lo >= 0) m1 = imax(m1, rcnt(cx->cnt, imax(B->chunk_lo, p), B->chunk_hi));
            if (lo < 0) continue;
            m = imax(m, rcnt(cx->cnt, imax(lo, p), hi));
        }
        if (m == 0 && rcnt(cx->cnt, p, K) > 0) m = 1;
        if (m1 == 0 && rcnt(cx->cnt, p, K) > 0) m1 = 1;
        cx->nbmin[p] = m;
        cx->nbmin1[p] = m1;
    }
    if (t->key.world_size > 1 && t->hw.allreduce_Bps > 0)
        cx->coll_f = 2.0 * (t->key.world_size - 1) / t->key.world_size / t->hw.allreduce_Bps;
    /* bus-bandwidth convention, as the all-reduce's: a buffer of B bytes takes
     * B (W-1)/W / rate (each rank sends or receives the other ranks' parts) */
    if (t->key.world_size > 1 && t->hw.allgather_Bps > 0)
        cx->ag_f = (double)(t->key.world_size - 1) / t->key.world_size / t->hw.allgather_Bps;
    if (t->key.world_size > 1 && t->hw.reduce_scatter_Bps > 0)
        cx->rs_f = (double)(t->key.world_size - 1) / t->key.world_size / t->hw.reduce_scatter_Bps;
    cx->interval = pt_swap_interval(t);
    pt_trace_phase_compute(t, &cx->comp_f, &cx->comp_b);
    *out = cx;
    return PT_OK;
}

uint64_t pt_cost_budget(uint64_t capacity, const pt_cost_opts *o) {
    uint64_t take = o->reserve_bytes + o->headroom_bytes;
    return capacity > take ? capacity - take : 0;
}

uint64_t pt_cost_frag_bytes(double frag, uint64_t raw) {
    if (!(frag > 0) || frag == 1.0) return raw;
    return (uint64_t)ceil(frag * (double)raw);
}

int32_t pt_cost_n_offloaded(const pt_cost_ctx *cx, int32_t p) { return rcnt(cx->cnt, p, cx->K); }
int32_t pt_cost_buffer_min(const pt_cost_ctx *cx, int32_t p) { return cx->nbmin[imin(imax(p, 0), cx->K)]; }
int32_t pt_cost_buffer_min_block(const pt_cost_ctx *cx, int32_t p) { return cx->nbmin1[imin(imax(p, 0), cx->K)]; }
uint64_t pt_cost_buffer_bytes(const pt_cost_ctx *cx, int32_t p, int32_t nb) {
    int32_t q = pt_cost_n_offloaded(cx, imin(imax(p, 0), cx->K));
    return nb <= 0 ? 0 : (uint64_t)imin(nb, q) * cx->t->slot_bytes;
}
void pt_cost_offload_sums(const pt_cost_ctx *cx, int32_t p, uint64_t *bytes, uint64_t *grad_bytes,
                          uint64_t *train_elems) {
    p = imin(imax(p, 0), cx->K);
    *bytes = rsum(cx->bytes, p, cx->K);
    *grad_bytes = rsum(cx->grad, p, cx->K);
    *train_elems = rsum(cx->train, p, cx->K);
}
uint64_t pt_cost_persist_bytes(const pt_cost_ctx *cx, int32_t p) { return cx->mand_dev + cx->dev[p]; }
int pt_cost_persist_redundant(const pt_cost_ctx *cx, int32_t p) {
    return p < cx->K && cx->t->chunks[p].mandatory;
}

uint64_t pt_cost_host_bytes(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, int shard) {
    uint64_t h = rsum(cx->host, p, cx->K);
    if (shard && cx->t->key.world_size > 1) h = (h + (uint64_t)cx->t->key.world_size - 1) / (uint64_t)cx->t->key.world_size;
    return h + (a ? a->swap_pool : 0);
}

/* ---------------- activation profile ---------------- */

int pt_act_init(const pt_cost_ctx *cx, pt_act_profile *a) {
    memset(a, 0, sizeof *a);
    a->n_block = cx->N;
    a->modes = calloc((size_t)cx->N, 1);
    a->fwd_swap_s = calloc((size_t)cx->N + 1, sizeof *a->fwd_swap_s);
    a->bwd_swap_in = calloc((size_t)cx->N + 1, sizeof *a->bwd_swap_in);
    a->work = calloc((size_t)cx->N + 2, sizeof *a->work);
    a->swap_done = calloc((size_t)cx->N, sizeof *a->swap_done);
    if (!a->modes || !a->fwd_swap_s || !a->bwd_swap_in || !a->work || !a->swap_done) {
        pt_act_free(a);
        return PT_ERR_HOST_OOM;
    }
    return PT_OK;
}

void pt_act_free(pt_act_profile *a) {
    if (!a) return;
    free(a->modes);
    free(a->fwd_swap_s);
    free(a->bwd_swap_in);
    free(a->work);
    free(a->swap_done);
    memset(a, 0, sizeof *a);
}

/* Every window's dynamic bytes pass through here, so the per-window picture
 * (rec_*, pt_cost_mem_windows) and the peak are one computation. */
static void note_peak(pt_act_profile *a, int32_t win, uint64_t act, uint64_t scr, int phase, int block) {
    if (a->rec_act) {
        a->rec_act[win] = act;
        a->rec_scr[win] = scr;
    }
    if (act + scr > a->peak_dyn || (a->peak_phase < 0)) {
        a->peak_dyn = act + scr;
        a->act_at_peak = act;
        a->scratch_at_peak = scr;
        a->peak_phase = phase;
        a->peak_block = block;
    }
}

void pt_act_compute(const pt_cost_ctx *cx, const uint8_t *modes, pt_act_profile *a) {
    const pt_trace *t = cx->t;
    const pt_trace_block *B = t->blocks;
    int32_t N = cx->N;
    memcpy(a->modes, modes, (size_t)N);
    a->peak_dyn = a->act_at_peak = a->scratch_at_peak = 0;
    a->peak_phase = -1;
    a->peak_block = -1;
    a->swap_pool = 0;
    a->recompute_s = a->swap_out_s = a->swap_in_s = 0;
    for (int32_t w = 0; w <= N; w++) {
        a->fwd_swap_s[w] = 0;
        a->bwd_swap_in[w] = 0;
    }
    /* Swap-out as a FIFO fluid: window w can hide fwd_s[w] seconds of D2H;
     * done_at[j] is the last window (N = turn) holding part of j's D2H. The
     * done_at array reuses bwd_swap_in's storage until the walk below. */
    uint64_t *done_at = a->bwd_swap_in;
    int32_t w = 1;
    double left = N > 1 ? B[1].fwd_s : 0;   /* capacity left in window w */
    for (int32_t j = 0; j < N; j++) {
        a->swap_done[j] = -1;
        if (modes[j] == PT_BLOCK_CKPT) a->recompute_s += B[j].recompute_s;
        if (modes[j] != PT_BLOCK_SWAP) continue;
        a->swap_pool += B[j].arena_bytes;
        double need = (double)B[j].arena_bytes / t->hw.d2h_Bps;
        a->swap_out_s += need;
        a->swap_in_s += (double)B[j].arena_bytes / t->hw.h2d_Bps;
        if (w < j + 1) {
            w = j + 1;
            left = w < N ? B[w].fwd_s : 0;
        }
        int32_t last = j;
        while (need > 0) {
            if (w >= N) {
                a->fwd_swap_s[N] += need;
                last = N;
                break;
            }
            double take = need < left ? need : left;
            if (take > 0) {
                a->fwd_swap_s[w] += take;
                need -= take;
                left -= take;
                last = w;
            }
            /* relative tolerance: a drain that finishes exactly at a window end stays in it */
            if (need <= 1e-12 * (double)B[j].arena_bytes / t->hw.d2h_Bps) break;
            w++;
            left = w < N ? B[w].fwd_s : 0;
        }
        done_at[j] = (uint64_t)last;
        /* a copy done inside block j's own window (none is: it starts after it)
         * still holds the arena until window j+1 starts */
        a->swap_done[j] = last > j ? last : j;
    }
    /* Memory walk. inputs = sum of input_bytes alive; kept = NONE arenas of
     * finished blocks; flight(w) = SWAP arenas j < w with done_at[j] >= w,
     * kept as a difference array: +arena at window j+1, -arena after done_at[j]. */
    int64_t *diff = a->work;
    for (int32_t w2 = 0; w2 <= N + 1; w2++) diff[w2] = 0;
    for (int32_t j = 0; j < N; j++)
        if (modes[j] == PT_BLOCK_SWAP && done_at[j] >= (uint64_t)j + 1) {
            diff[j + 1] += (int64_t)B[j].arena_bytes;
            diff[done_at[j] + 1] -= (int64_t)B[j].arena_bytes;
        }
    uint64_t inputs = B[0].input_bytes, kept = 0;
    int64_t flight = 0;
    note_peak(a, 0, inputs, t->nonblock_scratch_bytes, PT_PHASE_EMBED_FWD, -1);
    for (int32_t b = 0; b < N; b++) {
        flight += diff[b];
        uint64_t next_in = b + 1 < N ? B[b + 1].input_bytes : 0;
        note_peak(a, 1 + b, inputs + next_in + kept + (uint64_t)flight + B[b].arena_bytes, B[b].fwd_scratch_bytes,
                  PT_PHASE_FWD, b);
        inputs += next_in;
        if (modes[b] == PT_BLOCK_NONE) kept += B[b].arena_bytes;
    }
    /* Turn: swaps still draining (a SWAP block N-1 always is: no forward window
     * follows it, and its swap-in is charged in time but its arena counted
     * once), head/loss scratch. */
    flight += diff[N];
    note_peak(a, N + 1, inputs + kept + (uint64_t)flight + B[N - 1].grad_act_bytes, t->nonblock_scratch_bytes,
              PT_PHASE_TURN, -1);
    /* The swap-in schedule replaces done_at from here on. */
    for (int32_t j = 0; j <= N; j++) a->bwd_swap_in[j] = 0;
    if (modes[N - 1] == PT_BLOCK_SWAP) a->bwd_swap_in[N] = B[N - 1].arena_bytes;
    for (int32_t b = N - 1; b >= 0; b--) {
        if (modes[b] == PT_BLOCK_NONE) kept -= B[b].arena_bytes;   /* now "this block's arena" */
        uint64_t ahead = 0;
        if (b >= 1 && modes[b - 1] == PT_BLOCK_SWAP) {
            ahead = B[b - 1].arena_bytes;
            a->bwd_swap_in[b] = ahead;
        }
        uint64_t scr = B[b].bwd_scratch_bytes;
        if (modes[b] == PT_BLOCK_CKPT && B[b].fwd_scratch_bytes > scr) scr = B[b].fwd_scratch_bytes;
        note_peak(a, 2 * N + 1 - b, inputs + kept + B[b].arena_bytes + ahead + B[b].grad_act_bytes, scr, PT_PHASE_BWD, b);
        inputs -= B[b].input_bytes;
    }
    note_peak(a, 2 * N + 2, B[0].grad_act_bytes, t->nonblock_scratch_bytes, PT_PHASE_EMBED_BWD, -1);
}

/* ---------------- time ---------------- */

static inline double win(double comp, double h2d, double d2h, double coll, int engines) {
    double x = engines == 1 ? h2d + d2h : dmax(h2d, d2h);
    return dmax(dmax(comp, x), coll);
}

typedef struct fwd_pass {
    double time;             /* window sum (embedding included) */
    uint64_t up, sync;       /* chunk bytes uploaded, of which at a gather */
} fwd_pass;

/* The forward windows: pt_pool_fwd's rules, run with one block of lag —
 * block b's new chunks split into the part block b-1 prefetched (overlapping
 * window b-1) and the rest its gather uploads (exposed in window b), so
 * window b-1 closes once block b's split is known. */
static void fwd_windows(const pt_cost_ctx *cx, const pt_act_profile *a, const pt_pool_walk *w, fwd_pass *f) {
    const pt_trace *t = cx->t;
    const pt_trace_block *B = t->blocks;
    const double ih = 1.0 / t->hw.h2d_Bps;
    const int eng = t->hw.copy_engines;
    const int32_t N = cx->N, base = w->base, nbe = w->nbe;
    const uint64_t *nmb = cx->nmb;
    if (w->simple) {
        /* every prefetch fits: block 0 waits for its chunks, window b hides
         * the chunks block b+1 uses first */
        double time = t->embed_fwd_s;
        uint64_t s0 = pt_pool_ibytes(w, cx->f_lo[0], cx->f_hi[0]), up = s0;
        time += (double)s0 * ih;
        for (int32_t b = 0; b < N; b++) {
            uint64_t ua = b + 1 < N ? pt_pool_ibytes(w, cx->f_lo[b + 1], cx->f_hi[b + 1]) : 0;
            time += win(B[b].fwd_s, (double)ua * ih, a->fwd_swap_s[b], 0, eng);
            up += ua;
        }
        f->time = time;
        f->up = up;
        f->sync = s0;
        return;
    }
    /* locals, not f->: stores through f could alias the trace's arrays */
    double time = t->embed_fwd_s;
    uint64_t up = 0, syn = 0;
    int32_t plo = 0, phi = 0, ph = 0;
    double pc = 0, psw = 0;
    uint64_t psync = 0;
    for (int32_t b = 0; b <= N; b++) {
        uint64_t us = 0, ua = 0;   /* block b's sync; what window b-1 prefetched for it */
        int32_t lo = 0, hi = 0, h = 0;
        if (b < N) {
            h = cx->has[b];
            lo = cx->rlo[b] > base ? cx->rlo[b] : base;
            hi = cx->rhi[b] > base ? cx->rhi[b] : base;
            if (nbe && h) {
                int32_t nlo = lo, pre = 0;
                if (ph) {
                    int32_t fr = nbe - (phi - plo);
                    nlo = lo > phi ? lo : phi;
                    pre = fr < 0 ? 0 : fr < hi - nlo ? fr : hi - nlo;
                }
                ua = nmb[nlo + pre] - nmb[nlo];
                us = nmb[hi] - nmb[nlo + pre];
            }
        }
        if (b > 0) time += (double)psync * ih + win(pc, (double)ua * ih, psw, 0, eng);
        up += us + ua;
        syn += us;
        if (b < N) {
            pc = B[b].fwd_s;
            psw = a->fwd_swap_s[b];
            psync = us;
        }
        plo = lo;
        phi = hi;
        ph = h;
    }
    f->time = time;
    f->up = up;
    f->sync = syn;
}

/* DEFER: how much the next forward waits for the deferred CPU steps (the
 * formula in cost_model.h). Chunks [p, K) are offloaded; mandatory ones carry
 * no train/bytes in the prefix sums. */
static double defer_delay(const pt_cost_ctx *cx, int32_t p, double dev_s, double icpu,
                          double shard_div) {
    const pt_trace *t = cx->t;
    const double ih = 1.0 / t->hw.h2d_Bps;
    double S = 0, d = 0;
    for (int32_t k = p; k < cx->K; k++) {
        uint64_t tr = cx->train[k + 1] - cx->train[k];
        if (!tr) continue;
        /* a REKLS chunk's eigendecompositions and GEMMs come on top */
        S += (double)tr * icpu + (cx->rks[k + 1] - cx->rks[k]) / shard_div;
        double up = (double)(cx->bytes[k + 1] - cx->bytes[k]) * ih;
        double late = S - dev_s + up - cx->fstart[t->chunks[k].first_block];
        if (late > d) d = late;
    }
    return d;
}

void pt_cost_time(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, int32_t nb, const pt_cost_opts *o,
                  pt_cost *out) {
    const pt_trace *t = cx->t;
    const pt_trace_block *B = t->blocks;
    const int clip = o ? o->clip : 0;
    /* reciprocals: this loop runs for every candidate the searcher scores */
    const double ih = 1.0 / t->hw.h2d_Bps, id = 1.0 / t->hw.d2h_Bps;
    /* Several ranks: this build's collectives do not overlap compute. The
     * all-reduce of the replicated gradients runs in optimizer_step after
     * backward (and the CPU steps wait for it), mode C's all-gather at each chunk
     * upload and its reduce-scatter at each chunk's last backward run on the
     * hook thread. So they are charged as exposed time after backward, and the
     * CPU optimizer as deferred (after backward) whatever the clipping. */
    const int ranks = t->key.world_size > 1;
    const int shard = ranks && o && o->shard;
    const int eng = t->hw.copy_engines;
    const int32_t N = cx->N, K = cx->K;
    const uint64_t *gr = cx->grad, *trn = cx->train;
    /* Chunk uploads come from the buffer-pool walk (pool_model.c): a window
     * starts with the synchronous uploads of its gather (exposed), then its
     * compute overlaps the prefetch of the next block. */
    pt_pool_walk pw;
    pt_pool_walk_init(cx, p, nb, &pw);
    uint64_t up_bytes = 0, down_bytes = 0, sync_bytes = 0;
    /* pure compute is fixed by the mode map; exposed = windows - compute */
    const double comp = cx->comp_f + cx->comp_b + a->recompute_s;

    /* forward: the embedding window uploads nothing (nobody prefetches block 0) */
    fwd_pass f;
    fwd_windows(cx, a, &pw, &f);
    double fwd = f.time;
    up_bytes += f.up;
    uint64_t chunk_up = f.up;   /* chunk uploads only (each an all-gather in mode C) */
    sync_bytes += f.sync;
    /* turn + backward; the CPU Adam of the gradients copied in a window starts
     * when that window ends (OVERLAP), chunks in landing order. */
    /* Replicated offload: every rank steps the whole non-persistent set; sharded
     * (mode C): its 1/W share. Uploads are charged at full chunk size either
     * way, so the time is never under-predicted. */
    double shard_div = (o && o->shard && t->key.world_size > 1) ? t->key.world_size : 1;
    const double icpu = 1.0 / t->hw.cpu_adam_elems_per_s / shard_div;
    double clock = 0, cpu_clock = 0;
    {
        /* head/loss: block N-1's swap-in; its chunks come at its gather */
        uint64_t u = a->bwd_swap_in[N];
        double c = t->head_fwd_s + t->head_bwd_s, x = win(c, (double)u * ih, a->fwd_swap_s[N], 0, eng);
        up_bytes += u;
        clock += x;
    }
    for (int32_t b = N - 1; b >= -1; b--) {
        /* window b (b == -1: embedding backward) */
        double c;
        uint64_t u = 0, us = 0;
        if (b >= 0) {
            c = B[b].bwd_s + (a->modes[b] == PT_BLOCK_CKPT ? B[b].recompute_s : 0);
            pt_pool_xfer x2 = pt_pool_bwd(&pw, b);
            us = x2.sync;
            u = x2.prefetch;
            up_bytes += u + us;
            chunk_up += u + us;
            sync_bytes += us;
            u += a->bwd_swap_in[b];
            up_bytes += a->bwd_swap_in[b];
        } else {
            c = t->embed_bwd_s;
        }
        int32_t g = b + 1;   /* gradients completed in block g are copied now */
        uint64_t d = 0, tr = 0;
        double rk = 0;
        if (g < N) {
            int32_t lo = imax(cx->f_lo[g], p), hi = cx->f_hi[g];
            d = rsum(gr, lo, hi);
            tr = rsum(trn, lo, hi);
            if (hi > lo) rk = (cx->rks[hi] - cx->rks[lo]) / shard_div;
        }
        double x = (double)us * ih + win(c, (double)u * ih, (double)d * id, 0, eng);
        down_bytes += d;
        clock += x;
        /* REKLS chunks: their eigendecompositions and GEMMs on top (one worker
         * per chunk, counted serially: an upper bound when chunks overlap) */
        if (tr) cpu_clock = dmax(cpu_clock, clock) + (double)tr * icpu + rk;
    }
    double bwd = clock;
    uint64_t cpu_elems = rsum(trn, p, K);
    uint64_t dev_elems = cx->mand_train + trn[p];
    /* REKLS of resident chunks runs on the device's stream; its time there is
     * estimated at the CPU rates (what the host backend runs) */
    double rk_cpu = (cx->rks[K] - cx->rks[p]) / shard_div, rk_dev = cx->mand_rks + cx->rks[p];
    double cpu_s = (double)cpu_elems * icpu + rk_cpu,
           dev_s = (double)dev_elems / t->hw.dev_adam_elems_per_s + rk_dev;
    double iter;
    /* fp32 gradients: resident ones all-reduced in place, offloaded ones in their
     * fp32 sums (mode B) or reduce-scattered (mode C) */
    out->allreduce_s = ranks ? 4.0 * (double)(dev_elems + (shard ? 0 : cpu_elems)) * cx->coll_f : 0;
    out->reduce_scatter_s = shard ? 4.0 * (double)cpu_elems * cx->rs_f : 0;
    out->allgather_s = shard ? (double)chunk_up * cx->ag_f : 0;
    double coll_s = out->allreduce_s + out->reduce_scatter_s + out->allgather_s;
    if (ranks && o && o->defer) {
        /* with several ranks every CPU step waits for the collectives, then is
         * deferred like a clipped one */
        iter = fwd + bwd + coll_s + dev_s + defer_delay(cx, p, dev_s, icpu, shard_div);
        out->schedule = PT_SCHED_DEFER;
    } else if (ranks) {
        iter = fwd + bwd + coll_s + dmax(dev_s, cpu_s);
        out->schedule = PT_SCHED_AFTER_BWD;
    } else if (clip && o->defer) {
        iter = fwd + bwd + dev_s + defer_delay(cx, p, dev_s, icpu, shard_div);
        out->schedule = PT_SCHED_DEFER;
    } else if (clip) {
        iter = fwd + bwd + dmax(dev_s, cpu_s);
        out->schedule = PT_SCHED_AFTER_BWD;
    } else {
        iter = fwd + dmax(bwd + dev_s, cpu_clock);
        out->schedule = PT_SCHED_OVERLAP;
    }
    out->iter_s = iter;
    out->fwd_s = fwd;
    out->bwd_s = bwd;
    out->opt_s = iter - fwd - bwd - coll_s;
    out->cpu_adam_s = cpu_s;
    out->dev_adam_s = dev_s;
    out->rekls_s = rk_cpu + rk_dev;
    out->cpu_finish_s = clip || ranks ? bwd + coll_s + cpu_s : cpu_clock;
    out->compute_s = comp;
    out->recompute_s = a->recompute_s;
    out->exposed_xfer_s = fwd + bwd - comp;
    /* swap traffic: out in forward/turn, back in backward/turn (in up_bytes) */
    out->h2d_bytes = up_bytes;
    out->h2d_sync_bytes = sync_bytes;
    out->sync_xfer_s = (double)sync_bytes * ih;
    out->d2h_bytes = down_bytes + a->swap_pool;
    out->h2d_s = (double)out->h2d_bytes * ih;
    out->d2h_s = (double)out->d2h_bytes * id;
    out->n_buffer_min = pt_cost_buffer_min(cx, p);
    out->n_buffer_min_block = pt_cost_buffer_min_block(cx, p);
}

/* The one formula behind pt_cost_time_lb and pt_cost_time_lb_persist: the
 * searcher prunes with both, so a change here must hold for both or neither.
 * Chunks of index [p, h) go up a second time in backward (h = p: all cached);
 * with_dev adds the device Adam over the persistent trainable elements. */
static double time_lb(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, int32_t h, int with_dev,
                      const pt_cost_opts *o) {
    const pt_trace *t = cx->t;
    const double bh = t->hw.h2d_Bps, bd = t->hw.d2h_Bps;
    double up_f = (double)rsum(cx->bytes, p, cx->K) / bh;
    double up_b = (double)rsum(cx->bytes, p, h) / bh + a->swap_in_s;
    double down = (double)rsum(cx->grad, p, cx->K) / bd;
    double tf = dmax(cx->comp_f, up_f), tb = dmax(dmax(cx->comp_b + a->recompute_s, up_b), down);
    if (t->hw.copy_engines == 1) tb = dmax(tb, up_b + down);
    /* all windows together vs the engines' total busy time (swap-out lands in
     * forward or turn windows, so only the sum is bounded by it) */
    double eng = t->hw.copy_engines == 1 ? up_f + up_b + down + a->swap_out_s
                                         : dmax(up_f + up_b, down + a->swap_out_s);
    double w = dmax(tf + tb, eng);
    double shard = (o && o->shard && t->key.world_size > 1) ? t->key.world_size : 1;
    double cpu = (double)rsum(cx->train, p, cx->K) / t->hw.cpu_adam_elems_per_s / shard;
    double dev = with_dev ? (double)(cx->mand_train + cx->train[p]) / t->hw.dev_adam_elems_per_s : 0.0;
    /* several ranks: every CPU step runs after backward (and the collectives) */
    if ((o && o->clip) || t->key.world_size > 1)
        return w + (o && o->defer ? dev : dmax(dev, cpu));   /* DEFER: delay >= 0 */
    return dmax(w + dev, tf + cpu);
}

double pt_cost_time_lb(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, int32_t nb,
                       const pt_cost_opts *o) {
    /* backward re-uploads every non-persistent chunk but the nb last ones,
     * which forward leaves cached in the slots */
    int32_t q = rcnt(cx->cnt, p, cx->K);
    int32_t h = nb >= q ? p : cx->nm_pos[cx->n_nm - nb];
    return time_lb(cx, a, p, h, 1, o);
}

double pt_cost_time_lb_persist(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, const pt_cost_opts *o) {
    /* pt_cost_time_lb with n_buffer = |Q| (no backward re-upload) and without
     * the device Adam term; every remaining term only shrinks as p grows. */
    return time_lb(cx, a, p, p, 0, o);
}

/* Forward windows of pt_cost_time alone. */
static double fwd_time(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, int32_t nb) {
    pt_pool_walk pw;
    pt_pool_walk_init(cx, p, nb, &pw);
    fwd_pass f;
    fwd_windows(cx, a, &pw, &f);
    return f.time;
}

double pt_cost_time_lb_small(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, int32_t nb_top,
                             const pt_cost *at) {
    /* forward time is non-increasing in n_buffer from the one-block minimum
     * up: fwd(nb) >= fwd(nb_top) */
    double fwd = nb_top < 0 ? at->fwd_s : fwd_time(cx, a, p, nb_top);
    if (at->schedule == PT_SCHED_AFTER_BWD) return fwd + at->bwd_s + dmax(at->dev_adam_s, at->cpu_adam_s);
    if (at->schedule == PT_SCHED_DEFER) return fwd + at->bwd_s + at->dev_adam_s;
    double slack = (double)cx->max_block_bytes / cx->t->hw.h2d_Bps;
    return fwd + dmax(at->bwd_s + at->dev_adam_s, at->cpu_finish_s - slack);
}

double pt_cost_time_lb_any(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, const pt_cost_opts *o) {
    /* A chunk-less block breaks the simple walk at n_buffer = |Q|. */
    if (!cx->all_have) return pt_cost_time_lb_persist(cx, a, p, o);
    const pt_trace *t = cx->t;
    const pt_trace_block *B = t->blocks;
    const int32_t N = cx->N, K = cx->K;
    const uint64_t *trn = cx->train;
    p = imin(imax(p, 0), K);
    /* forward: F(nb) >= F(|Q|) for every n_buffer (pt_cost_time_lb_small) */
    double fwd = fwd_time(cx, a, p, rcnt(cx->cnt, p, K));
    /* backward with every window at its compute alone, the same operations
     * in the same order as pt_cost_time: rounded addition and dmax are
     * monotone, so clock <= its clock and cpu <= its cpu_clock exactly */
    double shard_div = (o && o->shard && t->key.world_size > 1) ? t->key.world_size : 1;
    const double icpu = 1.0 / t->hw.cpu_adam_elems_per_s / shard_div;
    double clock = 0, cpu = 0;
    clock += t->head_fwd_s + t->head_bwd_s;
    for (int32_t b = N - 1; b >= -1; b--) {
        double c = b >= 0 ? B[b].bwd_s + (a->modes[b] == PT_BLOCK_CKPT ? B[b].recompute_s : 0) : t->embed_bwd_s;
        clock += c;
        int32_t g = b + 1;
        uint64_t tr = g < N ? rsum(trn, imax(cx->f_lo[g], p), cx->f_hi[g]) : 0;
        if (tr) cpu = dmax(cpu, clock) + (double)tr * icpu;
    }
    double cpu_s = (double)rsum(trn, p, K) * icpu;
    double dev_s = (double)(cx->mand_train + trn[p]) / t->hw.dev_adam_elems_per_s;
    if (o && o->clip) return fwd + clock + (o->defer ? dev_s : dmax(dev_s, cpu_s));
    return fwd + dmax(clock + dev_s, cpu);
}

void pt_cost_memory(const pt_cost_ctx *cx, const pt_cost_opts *o, const pt_act_profile *a, int32_t p, int32_t nb,
                    pt_cost *out) {
    const pt_trace *t = cx->t;
    out->model_state_bytes = pt_cost_persist_bytes(cx, p);
    out->rekls_dev_bytes = out->rekls_host_bytes = 0;
    for (int32_t k = 0; k < t->n_chunk; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        if (c->mandatory || k < p) out->rekls_dev_bytes += c->rekls_bytes;
        else out->rekls_host_bytes += c->rekls_bytes;
    }
    out->buffer_bytes = pt_cost_buffer_bytes(cx, p, nb);   /* the runtime allocates min(nb, |Q|) slots */
    out->nonblock_bytes = t->nonblock_bytes;
    out->activation_bytes = a->act_at_peak;
    out->scratch_bytes = a->scratch_at_peak;
    out->raw_peak_bytes =
        out->model_state_bytes + out->buffer_bytes + out->nonblock_bytes + out->activation_bytes + out->scratch_bytes;
    out->peak_bytes = pt_cost_frag_bytes(o ? o->frag : 1.0, out->raw_peak_bytes);
    out->peak_phase = a->peak_phase;
    out->peak_block = a->peak_block;
    out->swap_pool_bytes = a->swap_pool;
    out->host_bytes = pt_cost_host_bytes(cx, a, p, o ? o->shard : 0);
}

/* pt_cost_eval with an explicit mode map (modes[n_block]); rec_act/rec_scr
 * (NULL, or [pt_cost_n_windows]) receive the per-window dynamic bytes. */
static int eval_modes(const pt_cost_ctx *cx, const pt_cost_opts *o, const uint8_t *modes, int32_t p, int32_t nb,
                      pt_cost *out, uint64_t *rec_act, uint64_t *rec_scr, char *err, size_t errlen) {
    if (p < 0 || p > cx->K)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "n_persist=%d out of range [0, %d chunks]", p, cx->K);
    int32_t lo = pt_cost_buffer_min_block(cx, p);
    if (nb < lo)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                    "n_buffer=%d is below the one-block minimum %d for n_persist=%d (the largest block streams %d "
                    "chunks; the lookahead minimum, which lets every prefetch overlap, is %d)",
                    nb, lo, p, lo, pt_cost_buffer_min(cx, p));
    if (nb > cx->K - p)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                    "n_buffer=%d exceeds n_chunk - n_persist = %d - %d = %d", nb, cx->K, p, cx->K - p);
    pt_act_profile a;
    if (pt_act_init(cx, &a)) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "cost model: out of memory");
    a.rec_act = rec_act;
    a.rec_scr = rec_scr;
    pt_act_compute(cx, modes, &a);
    a.rec_act = a.rec_scr = NULL;   /* the caller's: pt_act_free must not free them */
    memset(out, 0, sizeof *out);
    pt_cost_time(cx, &a, p, nb, o, out);
    pt_cost_memory(cx, o, &a, p, nb, out);
    pt_act_free(&a);
    return PT_OK;
}

int pt_cost_eval(const pt_cost_ctx *cx, const pt_cost_opts *o, const pt_knobs *k, pt_cost *out, char *err,
                 size_t errlen) {
    uint8_t *modes = malloc((size_t)cx->N);
    if (!modes) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "cost model: out of memory");
    int rc = pt_place_blocks(cx->N, k->n_swap, k->n_checkpoint, cx->interval, modes, err, errlen);
    if (!rc) rc = eval_modes(cx, o, modes, k->n_persist, k->n_buffer, out, NULL, NULL, err, errlen);
    free(modes);
    return rc;
}

/* ---------------- per-window picture ---------------- */

int32_t pt_cost_n_windows(const pt_cost_ctx *cx) { return 2 * cx->N + 3; }

int32_t pt_cost_window_index(const pt_cost_ctx *cx, int32_t phase, int32_t block) {
    int32_t N = cx->N;
    int in = block >= 0 && block < N;
    switch (phase) {
    case PT_PHASE_EMBED_FWD: return 0;
    case PT_PHASE_FWD: return in ? 1 + block : -1;
    case PT_PHASE_TURN: return N + 1;
    case PT_PHASE_BWD: return in ? 2 * N + 1 - block : -1;
    case PT_PHASE_EMBED_BWD: return 2 * N + 2;
    default: return -1;
    }
}

int pt_cost_mem_windows(const pt_cost_ctx *cx, const pt_cost_opts *o, const pt_knobs *k, const uint8_t *modes,
                        pt_mem_window *win, int32_t n_win, pt_cost *out, char *err, size_t errlen) {
    int32_t n = pt_cost_n_windows(cx);
    if (n_win < n)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "memory timeline: %d windows needed, room for %d", n, n_win);
    uint8_t *own = NULL;
    uint64_t *rec = calloc((size_t)n * 2, sizeof *rec);
    pt_cost c;
    int rc = rec ? PT_OK : pt_fail(err, errlen, PT_ERR_HOST_OOM, "cost model: out of memory");
    if (!rc && !modes) {
        own = malloc((size_t)cx->N);
        rc = own ? pt_place_blocks(cx->N, k->n_swap, k->n_checkpoint, cx->interval, own, err, errlen)
                 : pt_fail(err, errlen, PT_ERR_HOST_OOM, "cost model: out of memory");
        modes = own;
    }
    if (!rc) rc = eval_modes(cx, o, modes, k->n_persist, k->n_buffer, &c, rec, rec + n, err, errlen);
    if (!rc) {
        /* The static part is c's own (what the peak adds the maximum to), and
         * each total goes through the same rounding as the peak: ceil(frag * x)
         * is monotone, so the largest total is ceil(frag * (static + max)) =
         * c.peak_bytes exactly. */
        uint64_t stat = c.model_state_bytes + c.buffer_bytes + c.nonblock_bytes;
        for (int32_t i = 0; i < n; i++) {
            pt_mem_window *w = &win[i];
            w->phase = i == 0 ? PT_PHASE_EMBED_FWD : i <= cx->N ? PT_PHASE_FWD : i == cx->N + 1 ? PT_PHASE_TURN
                     : i < n - 1 ? PT_PHASE_BWD : PT_PHASE_EMBED_BWD;
            w->block = w->phase == PT_PHASE_FWD ? i - 1 : w->phase == PT_PHASE_BWD ? 2 * cx->N + 1 - i : -1;
            w->model_state_bytes = c.model_state_bytes;
            w->buffer_bytes = c.buffer_bytes;
            w->nonblock_bytes = c.nonblock_bytes;
            w->activation_bytes = rec[i];
            w->scratch_bytes = rec[n + i];
            w->raw_bytes = stat + rec[i] + rec[n + i];
            w->total_bytes = pt_cost_frag_bytes(o ? o->frag : 1.0, w->raw_bytes);
            w->frag_bytes = w->total_bytes - w->raw_bytes;
        }
        if (out) *out = c;
    }
    free(own);
    free(rec);
    return rc;
}
