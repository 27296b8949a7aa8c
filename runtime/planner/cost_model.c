/*
 * cost_model.c — the cost-model context (prefix sums over chunk index, built
 * once per trace), the chunk sums and memory model documented in
 * cost_model.h, and pt_cost_eval, which runs the activation profile
 * (cost_act.c) and the time model (cost_time.c) for one set of knobs.
 */
#include "cost_model.h"
#include "cost_internal.h"
#include "placement.h"
#include "protrain.h"
#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pt_cost_ctx_free(pt_cost_ctx *cx) {
    if (!cx) return;
    free(cx->cnt);
    free(cx->bytes);
    free(cx->grad);
    free(cx->train);
    free(cx->ntc);
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
    free(cx->mand_blk);
    pt_cost_rekls_ctx_free(cx);
    free(cx);
}

int pt_cost_swap_interval(const pt_cost_ctx *cx) { return cx->interval; }

/* The context's arrays (prefix sums over chunks, per-block ranges); 0 or -1. */
static int ctx_alloc(pt_cost_ctx *cx) {
    const int32_t N = cx->N, K = cx->K;
    size_t k1 = (size_t)K + 1;
    cx->cnt = calloc(k1, sizeof *cx->cnt);
    cx->bytes = calloc(k1, sizeof(uint64_t));
    cx->grad = calloc(k1, sizeof(uint64_t));
    cx->train = calloc(k1, sizeof(uint64_t));
    cx->ntc = calloc(k1, sizeof(int32_t));
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
    cx->mand_blk = calloc((size_t)N + 1, sizeof(uint64_t));
    return (!cx->fstart || !cx->mand_blk || !cx->cnt || !cx->bytes || !cx->grad || !cx->train || !cx->ntc || !cx->rks || !cx->dev || !cx->host || !cx->nm_pos || !cx->f_lo ||
            !cx->f_hi || !cx->l_lo || !cx->l_hi || !cx->nbmin || !cx->nbmin1 || !cx->nmb || !cx->rlo || !cx->rhi ||
            !cx->has || pt_cost_rekls_ctx(cx))
               ? -1
               : 0;
}

/* Prefix sums over the chunks in layout order (the streamable ones; the
 * mandatory ones' figures in the mand_* totals), and each block's first and
 * last chunk ranges. */
static void chunk_sums(pt_cost_ctx *cx) {
    const pt_trace *t = cx->t;
    const int32_t N = cx->N, K = cx->K;
    for (int32_t b = 0; b < N; b++) cx->f_lo[b] = cx->f_hi[b] = cx->l_lo[b] = cx->l_hi[b] = 0;
    for (int32_t k = 0; k < K; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        uint64_t g = c->trainable_elems * t->grad_elem_bytes;
        int nm = !c->mandatory;
        cx->cnt[k + 1] = cx->cnt[k] + nm;
        cx->bytes[k + 1] = cx->bytes[k] + (nm ? c->bytes : 0);
        cx->grad[k + 1] = cx->grad[k] + (nm ? g : 0);
        cx->train[k + 1] = cx->train[k] + (nm ? c->trainable_elems : 0);
        cx->ntc[k + 1] = cx->ntc[k] + (nm && c->trainable_elems > 0);
        cx->rks[k + 1] = cx->rks[k] + (nm ? c->optim_s : 0);
        cx->dev[k + 1] = cx->dev[k] + (nm ? pt_trace_chunk_dev_state(t, c) : 0);
        cx->host[k + 1] = cx->host[k] + (nm ? pt_trace_chunk_host_state(t, c) : 0);
        if (!nm) {
            cx->mand_dev += pt_trace_chunk_dev_state(t, c);
            cx->mand_train += c->trainable_elems;
            cx->mand_ntc += c->trainable_elems > 0;
            if (c->first_block >= 0) cx->mand_blk[c->first_block] += c->trainable_elems;
            else cx->mand_nb += c->trainable_elems;
            cx->mand_rks += c->optim_s;
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
}

/* Per block: its streamable chunk range, the largest block's bytes, the forward
 * start times. */
static void block_ranges(pt_cost_ctx *cx) {
    const pt_trace *t = cx->t;
    const int32_t N = cx->N;
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
}

/* One-block minimum: slots for the non-persistent chunks of the largest
 * block (the runtime refuses fewer). Lookahead minimum: those of any two
 * consecutive blocks (a single block when N == 1), so every prefetch fits;
 * >= 1 when any chunk is streamed. Count over the union of the ranges. */
static void buffer_mins(pt_cost_ctx *cx) {
    const pt_trace *t = cx->t;
    const int32_t N = cx->N, K = cx->K;
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
}

/* Seconds per byte of each collective the step runs. */
static void coll_rates(pt_cost_ctx *cx) {
    const pt_trace *t = cx->t;
    const int32_t K = cx->K;
    /* The gradient all-reduce runs over the ranks holding the same shards: all
     * W of them, or with tensor parallel (groups of P) the D = W / P replicas,
     * each reducing its own shard bytes (what the trace's chunks hold):
     * 2 (D-1)/D / rate seconds per byte, none with D = 1. */
    int32_t P = t->tp_size > 1 ? t->tp_size : 1, D = t->key.world_size / P;
    if (D > 1 && t->hw.allreduce_Bps > 0)
        cx->coll_f = 2.0 * (D - 1) / D / t->hw.allreduce_Bps;
    /* Tensor-parallel REKLS gathers each split param's full gradient, L and R
     * (and W in l2 mode) over its group of P every step: B full bytes take
     * B (P-1)/P / rate at the measured all-gather rate. */
    if (P > 1 && t->hw.allgather_Bps > 0) cx->tpg_f = (double)(P - 1) / P / t->hw.allgather_Bps;
    for (int32_t k = 0; k < K; k++) {
        cx->tp_grad += (double)t->chunks[k].tp_grad_bytes;
        cx->tp_fac += (double)t->chunks[k].tp_factor_bytes;
    }
    /* bus-bandwidth convention, as the all-reduce's: a buffer of B bytes takes
     * B (W-1)/W / rate (each rank sends or receives the other ranks' parts) */
    if (t->key.world_size > 1 && t->hw.allgather_Bps > 0)
        cx->ag_f = (double)(t->key.world_size - 1) / t->key.world_size / t->hw.allgather_Bps;
    if (t->key.world_size > 1 && t->hw.reduce_scatter_Bps > 0)
        cx->rs_f = (double)(t->key.world_size - 1) / t->key.world_size / t->hw.reduce_scatter_Bps;
}

int pt_cost_ctx_new(const pt_trace *t, pt_cost_ctx **out, char *err, size_t errlen) {
    *out = NULL;
    int rc = pt_trace_validate(t, err, errlen);
    if (rc) return rc;
    pt_cost_ctx *cx = calloc(1, sizeof *cx);
    if (!cx) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "cost model: out of memory");
    cx->t = t;
    cx->N = t->n_block;
    cx->K = t->n_chunk;
    if (ctx_alloc(cx)) {
        pt_cost_ctx_free(cx);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "cost model: out of memory for %d chunks", cx->K);
    }
    chunk_sums(cx);
    block_ranges(cx);
    buffer_mins(cx);
    coll_rates(cx);
    cx->interval = pt_place_swap_interval(t);
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
    /* split over the ranks, REKLS's state at its owners (without REKLS: ceil(h / W)) */
    if (shard && cx->t->key.world_size > 1) h = pt_cost_rekls_shard_host(cx, p, h);
    return h + (a ? a->swap_pool : 0);
}

static uint64_t pad(uint64_t x, uint64_t blk) { return (x + blk - 1) / blk * blk; }
static uint64_t r64(uint64_t x) { return (x + 63) / 64 * 64; }

/* staging_slots = auto (o->tier_slots < 0), as the store sizes them: the
 * most offloaded trainable chunks whose first block is one block, plus 2, in
 * [3, 64], and no more than the budget leaves beside base pinned bytes at
 * per bytes a slot; else the fixed count. */
static int32_t auto_slots(const pt_trace *t, int32_t p, const pt_cost_opts *o, uint64_t base, uint64_t per,
                          int32_t fixed) {
    /* base: the level's other pinned bytes (one rank's gradient sums of several
     * micro-batches come later: the store gives slots back for them) */
    if (o->tier_slots > 0) return fixed;
    int32_t want = 0;
    for (int32_t b = 0; b < t->n_block; b++) {
        int32_t n = 0;
        for (int32_t k = imax(p, 0); k < t->n_chunk; k++)
            n += !t->chunks[k].mandatory && t->chunks[k].trainable_elems && t->chunks[k].first_block == b;
        want = imax(want, n);
    }
    want = imin(imax(want + 2, 3), 64);
    uint64_t prof = 2 * t->chunk_size > 65536 ? 2 * t->chunk_size : 65536;   /* profiling's copies */
    uint64_t fit = o->tier_above > base + prof && per ? (o->tier_above - base - prof) / per : 3;
    return fit < 3 ? 3 : imin(want, (int32_t)(fit > 64 ? 64 : fit));
}

void pt_cost_tier(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, const pt_cost_opts *o,
                  pt_tier_fig *f) {
    memset(f, 0, sizeof *f);
    const uint64_t sw = a ? a->swap_pool : 0;
    f->pinned = pt_cost_host_bytes(cx, a, p, o ? o->shard : 0);
    /* the store decides on the chunks' bytes alone: the swap pool is allocated
     * later, under the same cap */
    if (!o || !o->tier_slots || (f->pinned - sw <= o->tier_above && !(o->tier_force & 1))) return;
    const pt_trace *t = cx->t;
    const uint64_t blk = o->tier_block ? o->tier_block : 4096;
    /* mode C: this rank's parts (about 1/W of each chunk; no masters, the
     * landing zone fp32); several ranks below level 2 also pin the fp32
     * gradient sums (4E a chunk) */
    const uint64_t W = t->key.world_size > 1 ? (uint64_t)t->key.world_size : 1;
    const int sh = o->shard && W > 1;
    const uint64_t w = !sh && t->param_elem_bytes != 4 ? 3 : 2;
    uint64_t pin1 = 0, big1 = 0, big2 = 0, disk1 = 0, disk2 = 0, wr2 = 0, fwd2 = 0;
    for (int32_t k = imax(p, 0); k < cx->K; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        if (c->mandatory) continue;
        if (c->optim_bytes) return;   /* a kind with its own state (REKLS): no tier */
        const uint64_t E = sh ? (c->trainable_elems + W - 1) / W : c->trainable_elems;
        const uint64_t U = sh ? (c->bytes + W - 1) / W : c->bytes, G = sh ? 4 * E : U;
        if (!E) {   /* frozen: h_param pinned at level 1, its image on disk at level 2 */
            uint64_t r2 = pad(r64(U), blk);
            pin1 += U;
            disk2 += r2;
            fwd2 += r2;
            if (r2 > big2) big2 = r2;
            continue;
        }
        uint64_t r1 = pad(w * r64(4 * E), blk);
        uint64_t r2 = pad(r64(U) + r64(G) + (w + 1) * r64(4 * E), blk);
        pin1 += U + G + (W > 1 ? 4 * E : 0);
        disk1 += r1;
        disk2 += r2;
        fwd2 += pad(r64(U), blk) < r2 ? pad(r64(U), blk) : r2;   /* an upload: the params' blocks */
        wr2 += r2;
        if (r1 > big1) big1 = r1;
        if (r2 > big2) big2 = r2;
    }
    /* the level is chosen with 3 slots when they are auto, as the store does */
    const uint64_t slots = o->tier_slots > 0 ? (uint64_t)o->tier_slots : 3;
    const uint64_t base1 = pin1;
    pin1 += slots * (big1 + blk);
    const int32_t force = (o->tier_force >> 1) & 3;
    if (force == 1 || (!force && (pin1 <= o->tier_above || (W > 1 && !sh)))) {
        int32_t n = auto_slots(t, p, o, base1, big1 + blk, (int32_t)slots);
        *f = (pt_tier_fig){.level = 1, .pinned = base1 + (uint64_t)n * (big1 + blk) + sw, .disk = disk1, .rd = disk1, .wr = disk1, .slots = n};
        return;
    }
    int32_t n = auto_slots(t, p, o, 0, big2 + blk, (int32_t)slots);
    *f = (pt_tier_fig){.level = 2, .pinned = (uint64_t)n * (big2 + blk) + sw, .disk = disk2, .fwd_rd = fwd2, .rd = disk2, .wr = wr2, .slots = n};
}

uint64_t pt_cost_pinned(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p,
                        const pt_cost_opts *o, int32_t *tier) {
    pt_tier_fig f;
    pt_cost_tier(cx, a, p, o, &f);
    if (tier) *tier = f.level;
    return f.pinned;
}

void pt_cost_tier_time(const pt_tier_fig *f, const pt_cost_opts *o, const pt_cost *c, double *io_s,
                       double *exposed_f, double *exposed_b) {
    *io_s = *exposed_f = *exposed_b = 0;
    if (!f->level || !o || !(o->tier_rd_Bps > 0) || !(o->tier_wr_Bps > 0)) return;
    double io_f = (double)f->fwd_rd / o->tier_rd_Bps;
    double io_b = (double)f->rd / o->tier_rd_Bps + (double)f->wr / o->tier_wr_Bps;
    double F = c->fwd_s, B = c->iter_s - c->fwd_s;
    if (f->level == 1 && c->schedule != PT_SCHED_OVERLAP) B = c->cpu_adam_s > c->opt_s ? c->cpu_adam_s : c->opt_s;
    *io_s = io_f + io_b;
    *exposed_f = io_f > F ? io_f - F : 0;
    *exposed_b = io_b > B ? io_b - B : 0;
}

void pt_cost_memory(const pt_cost_ctx *cx, const pt_cost_opts *o, const pt_act_profile *a, int32_t p, int32_t nb,
                    pt_cost *out) {
    const pt_trace *t = cx->t;
    out->model_state_bytes = pt_cost_persist_bytes(cx, p);
    out->optim_dev_bytes = out->optim_host_bytes = 0;
    for (int32_t k = 0; k < t->n_chunk; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        if (c->mandatory || k < p) out->optim_dev_bytes += c->optim_bytes;
        else out->optim_host_bytes += c->optim_bytes;
    }
    if (o && o->shard && t->key.world_size > 1)   /* mode C: what the busiest owner keeps */
        out->optim_host_bytes = pt_cost_rekls_owner_bytes(cx, p);
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
    pt_tier_fig f;
    pt_cost_tier(cx, a, p, o, &f);
    out->host_bytes = f.pinned;
    out->on_tier = f.level;
    out->tier_slots = f.slots;
    out->tier_disk_bytes = f.disk;
    out->tier_io_bytes = f.fwd_rd + f.rd + f.wr;
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
            w->phase = i == 0 ? PT_PHASE_EMBED_FWD : i <= cx->N   ? PT_PHASE_FWD
                                                 : i == cx->N + 1 ? PT_PHASE_TURN
                                                 : i < n - 1      ? PT_PHASE_BWD
                                                                  : PT_PHASE_EMBED_BWD;
            w->block = w->phase == PT_PHASE_FWD ? i - 1 : w->phase == PT_PHASE_BWD ? 2 * cx->N + 1 - i
                                                                                   : -1;
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
