/*
 * cost_time.c — the time model documented in cost_model.h, and its lower bounds.
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
#include "protrain.h"

/* Seconds of n chunk copies moving `bytes` in all: bytes at the rate (inv =
 * 1 / rate) plus each copy's fixed latency. */
static inline double copy_s(uint64_t bytes, int64_t n, double inv, double lat) {
    return (double)bytes * inv + (double)n * lat;
}

static inline double win(double comp, double h2d, double d2h, double coll, int engines) {
    double x = engines == 1 ? h2d + d2h : dmax(h2d, d2h);
    return dmax(dmax(comp, x), coll);
}

typedef struct fwd_pass {
    double time;             /* window sum (embedding included) */
    uint64_t up, sync;       /* chunk bytes uploaded, of which at a gather */
    int64_t nsync;           /* the copies of those at a gather */
} fwd_pass;

/* The forward windows: pt_pool_fwd's rules, run with one block of lag —
 * block b's new chunks split into the part block b-1 prefetched (overlapping
 * window b-1) and the rest its gather uploads (exposed in window b), so
 * window b-1 closes once block b's split is known. */
static void fwd_windows(const pt_cost_ctx *cx, const pt_act_profile *a, const pt_pool_walk *w, fwd_pass *f) {
    const pt_trace *t = cx->t;
    const pt_trace_block *B = t->blocks;
    const double ih = 1.0 / t->hw.h2d_Bps, lu = t->hw.h2d_lat_s;
    const int eng = t->hw.copy_engines;
    const int32_t N = cx->N, base = w->base, nbe = w->nbe;
    const uint64_t *nmb = cx->nmb;
    if (w->simple) {
        /* every prefetch fits: block 0 waits for its chunks, window b hides
         * the chunks block b+1 uses first */
        double time = t->embed_fwd_s;
        uint64_t s0 = pt_pool_ibytes(w, cx->f_lo[0], cx->f_hi[0]), up = s0;
        time += copy_s(s0, pt_pool_icount(w, cx->f_lo[0], cx->f_hi[0]), ih, lu);
        for (int32_t b = 0; b < N; b++) {
            uint64_t ua = b + 1 < N ? pt_pool_ibytes(w, cx->f_lo[b + 1], cx->f_hi[b + 1]) : 0;
            int64_t na = b + 1 < N ? pt_pool_icount(w, cx->f_lo[b + 1], cx->f_hi[b + 1]) : 0;
            time += win(B[b].fwd_s + a->fwd_free_s[b], copy_s(ua, na, ih, lu), a->fwd_swap_s[b], 0, eng);
            up += ua;
        }
        f->time = time;
        f->up = up;
        f->sync = s0;
        f->nsync = pt_pool_icount(w, cx->f_lo[0], cx->f_hi[0]);
        return;
    }
    /* locals, not f->: stores through f could alias the trace's arrays */
    double time = t->embed_fwd_s;
    uint64_t up = 0, syn = 0;
    int64_t nsyn = 0;
    int32_t plo = 0, phi = 0, ph = 0;
    double pc = 0, psw = 0;
    uint64_t psync = 0;
    int64_t pnsync = 0;
    for (int32_t b = 0; b <= N; b++) {
        uint64_t us = 0, ua = 0;   /* block b's sync; what window b-1 prefetched for it */
        int64_t ns = 0, na = 0;    /* the same as copies */
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
                    pre = fr < 0 ? 0 : fr < hi - nlo ? fr
                                                     : hi - nlo;
                }
                ua = nmb[nlo + pre] - nmb[nlo];
                us = nmb[hi] - nmb[nlo + pre];
                na = pre;
                ns = hi - (nlo + pre);
            }
        }
        if (b > 0)
            time += copy_s(psync, pnsync, ih, lu) + win(pc, copy_s(ua, na, ih, lu), psw, 0, eng);
        up += us + ua;
        syn += us;
        nsyn += ns;
        if (b < N) {
            pc = B[b].fwd_s + a->fwd_free_s[b];
            psw = a->fwd_swap_s[b];
            psync = us;
            pnsync = ns;
        }
        plo = lo;
        phi = hi;
        ph = h;
    }
    f->time = time;
    f->up = up;
    f->sync = syn;
    f->nsync = nsyn;
}

/* The device optimizer step of the resident trainable chunks (mandatory ones
 * and the first p): its elements at the AdamW rate, plus per chunk its device
 * ops at dev_op_s each (an AdamW launch and the memset zeroing its gradient;
 * a 16-bit chunk also widens its gradient first) and that zeroing at the
 * memset rate. Both terms are 0 in a trace that does not measure them.
 *   dev = E / r_adam + n_chunks (2 + [16-bit]) t_op + G / r_memset */
double pt_cost_dev_opt_s(const pt_cost_ctx *cx, int32_t p) {
    const pt_trace *t = cx->t;
    double s = (double)(cx->mand_train + cx->train[p]) / t->hw.dev_adam_elems_per_s;
    int32_t n = cx->mand_ntc + cx->ntc[p];
    s += (double)n * (2 + (t->master_elem_bytes ? 1 : 0)) * t->hw.dev_op_s;
    if (t->hw.dev_memset_Bps > 0) s += (double)(cx->mand_grad + cx->grad[p]) / t->hw.dev_memset_Bps;
    return s;
}

/* DEFER: how much the next forward waits for the deferred CPU steps (the
 * formula in cost_model.h). Chunks [p, K) are offloaded; mandatory ones carry
 * no train/bytes in the prefix sums. */
static double defer_delay(const pt_cost_ctx *cx, int32_t p, double dev_s, double icpu,
                          double shard_div, int rk_deferred) {
    const pt_trace *t = cx->t;
    const double ih = 1.0 / t->hw.h2d_Bps;
    double S = 0, d = 0;
    for (int32_t k = p; k < cx->K; k++) {
        uint64_t tr = cx->train[k + 1] - cx->train[k];
        if (!tr) continue;
        /* a REKLS chunk's eigendecompositions and GEMMs come on top */
        S += (double)tr * icpu + (rk_deferred ? (cx->rks[k + 1] - cx->rks[k]) / shard_div : 0);
        double up = (double)(cx->bytes[k + 1] - cx->bytes[k]) * ih;
        double late = S - dev_s + up - cx->fstart[t->chunks[k].first_block];
        if (late > d) d = late;
    }
    return d;
}

/* Backward's inputs and what it adds up. In: buckets (the all-reduce overlaps
 * backward), shard (mode C), shard_div (ranks sharing the CPU steps), icpu
 * (CPU Adam seconds per element, already divided by shard_div). Out: the
 * windows' time, the copies, and the clocks of the all-reduce queue and of the
 * CPU optimizer (both from the start of backward). */
typedef struct bwd_pass {
    int buckets, shard;
    double shard_div, icpu;
    double time, ar_clock, cpu_clock;
    uint64_t up, chunk_up, down, sync;
    int64_t nsync;
} bwd_pass;

/* Turn + backward; the CPU Adam of the gradients copied in a window starts
 * when that window ends (OVERLAP), chunks in landing order. */
static void bwd_windows(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, pt_pool_walk *pw,
                        bwd_pass *r) {
    const pt_trace *t = cx->t;
    const pt_trace_block *B = t->blocks;
    const double ih = 1.0 / t->hw.h2d_Bps, id = 1.0 / t->hw.d2h_Bps;
    const double lu = t->hw.h2d_lat_s, ld = t->hw.d2h_lat_s;
    const int eng = t->hw.copy_engines;
    const int32_t N = cx->N;
    const uint64_t *gr = cx->grad, *trn = cx->train;
    double clock = 0;
    r->ar_clock = r->cpu_clock = 0;
    {
        /* head/loss: block N-1's swap-in; its chunks come at its gather. A
         * SWAP block N-1 comes back from the bytes it just sent out, so its
         * swap-in starts when the turn's swap-outs (FIFO, N-1's last) have
         * drained, whatever the engines: the two copies are in series. */
        uint64_t u = a->bwd_swap_in[N];
        double c = t->head_fwd_s + t->head_bwd_s + a->fwd_free_s[N],
               x = u ? dmax(c, a->fwd_swap_s[N] + copy_s(u, 1, ih, lu))
                     : win(c, 0, a->fwd_swap_s[N], 0, eng);
        r->up += u;
        clock += x;
    }
    for (int32_t b = N - 1; b >= -1; b--) {
        /* window b (b == -1: embedding backward) */
        double c;
        uint64_t u = 0, us = 0;
        int64_t nu = 0, nus = 0, nd = 0;   /* copies: prefetched, synchronous, gradients */
        if (b >= 0) {
            c = B[b].bwd_s + (a->modes[b] == PT_BLOCK_CKPT ? B[b].recompute_s : 0) + a->bwd_free_s[b];
            pt_pool_xfer x2 = pt_pool_bwd(pw, b);
            us = x2.sync;
            u = x2.prefetch;
            nus = x2.nsync;
            nu = x2.nprefetch;
            r->up += u + us;
            r->chunk_up += u + us;
            r->sync += us;
            r->nsync += nus;
            u += a->bwd_swap_in[b];   /* the swap-in of block b-1: one more copy */
            nu += a->bwd_swap_in[b] > 0;
            r->up += a->bwd_swap_in[b];
        } else {
            c = t->embed_bwd_s;
        }
        int32_t g = b + 1;   /* gradients completed in block g are copied now */
        uint64_t d = 0, tr = 0;
        double rk = 0;
        if (r->buckets && g < N) {   /* clock: block g's backward just ended */
            uint64_t e = cx->mand_blk[g];
            if (cx->f_hi[g] > cx->f_lo[g] && cx->f_lo[g] < p)
                e += rsum(trn, cx->f_lo[g], imin(cx->f_hi[g], p));
            if (e) r->ar_clock = dmax(r->ar_clock, clock) + 4.0 * (double)e * cx->coll_f;
        }
        if (g < N) {
            int32_t lo = imax(cx->f_lo[g], p), hi = cx->f_hi[g];
            d = rsum(gr, lo, hi);
            tr = rsum(trn, lo, hi);
            nd = rcnt(cx->ntc, lo, hi);
            if (hi > lo) rk = (cx->rks[hi] - cx->rks[lo]) / r->shard_div;
        }
        double x = copy_s(us, nus, ih, lu) + win(c, copy_s(u, nu, ih, lu), copy_s(d, nd, id, ld), 0, eng);
        r->down += d;
        clock += x;
        /* mode B's offloaded chunks of block g are buckets once their copies
         * (this window) landed and the CPU formed their fp32 sums */
        if (r->buckets && !r->shard && tr)
            r->ar_clock = dmax(r->ar_clock, clock) + 4.0 * (double)tr * cx->coll_f;
        /* REKLS chunks: their eigendecompositions and GEMMs on top (one worker
         * per chunk, counted serially: an upper bound when chunks overlap) */
        if (tr) r->cpu_clock = dmax(r->cpu_clock, clock) + (double)tr * r->icpu + rk;
    }
    r->time = clock;
}

/* The collectives' terms into out (all-reduce, reduce-scatter, all-gather, the
 * tensor-parallel gathers); returns their sum. */
static double coll_terms(const pt_cost_ctx *cx, const pt_cost_opts *o, const bwd_pass *bw,
                         uint64_t chunk_up, uint64_t dev_elems, uint64_t cpu_elems, pt_cost *out) {
    const pt_trace *t = cx->t;
    const int ranks = t->key.world_size > 1;
    /* fp32 gradients: resident ones all-reduced in place, offloaded ones in their
     * fp32 sums (mode B) or reduce-scattered (mode C) */
    if (bw->buckets) {
        uint64_t after = cx->mand_nb;
        out->allreduce_s = dmax(bw->ar_clock - bw->time, 0) + 4.0 * (double)after * cx->coll_f;
    } else {
        out->allreduce_s = ranks ? 4.0 * (double)(dev_elems + (bw->shard ? 0 : cpu_elems)) * cx->coll_f : 0;
    }
    out->reduce_scatter_s = bw->shard ? 4.0 * (double)cpu_elems * cx->rs_f : 0;
    out->allgather_s = bw->shard ? (double)chunk_up * cx->ag_f : 0;
    out->tp_gather_s = (cx->tp_grad * (o && o->tp_l2 ? 2.0 : 1.0) + cx->tp_fac) * cx->tpg_f;
    return out->allreduce_s + out->reduce_scatter_s + out->allgather_s + out->tp_gather_s;
}

void pt_cost_time(const pt_cost_ctx *cx, const pt_act_profile *a, int32_t p, int32_t nb, const pt_cost_opts *o,
                  pt_cost *out) {
    const pt_trace *t = cx->t;
    const int clip = o ? o->clip : 0;
    /* reciprocals: this loop runs for every candidate the searcher scores */
    const double ih = 1.0 / t->hw.h2d_Bps, id = 1.0 / t->hw.d2h_Bps, lu = t->hw.h2d_lat_s;
    /* Several ranks. Mode C's all-gather at each chunk upload and its
     * reduce-scatter at each chunk's last backward run on the hook thread: charged
     * as exposed time. The all-reduce: with buckets (overlap_ar) each resident
     * block chunk's starts when its lowest block's backward ends, one after
     * another while backward goes on,
     *   ar = max(ar, end of that window) + 4 * elements * coll_f,
     * and what outlasts backward is exposed; mode B's offloaded chunks join the
     * queue when their gradient copy lands; chunks of non-block parameters
     * (final only after backward) follow backward. The CPU optimizer waits for all of it: charged as
     * deferred (after backward) whatever the clipping. Tensor parallel: the
     * all-reduce over the replicas only (coll_f), after backward, then REKLS's
     * gathers of the split params (tp_gather_s in cost_model.h). */
    const int ranks = t->key.world_size > 1;
    const int shard = ranks && o && o->shard;
    const int32_t K = cx->K;
    const uint64_t *trn = cx->train;
    /* Chunk uploads come from the buffer-pool walk (pool_model.c): a window
     * starts with the synchronous uploads of its gather (exposed), then its
     * compute overlaps the prefetch of the next block. */
    pt_pool_walk pw;
    pt_pool_walk_init(cx, p, nb, &pw);
    uint64_t up_bytes = 0, down_bytes = 0, sync_bytes = 0;
    /* pure compute is fixed by the mode map; exposed = windows - compute */
    const double comp = cx->comp_f + cx->comp_b + a->recompute_s + a->free_f_s + a->free_b_s;

    /* forward: the embedding window uploads nothing (nobody prefetches block 0) */
    fwd_pass f;
    fwd_windows(cx, a, &pw, &f);
    double fwd = f.time;
    up_bytes += f.up;
    uint64_t chunk_up = f.up;   /* chunk uploads only (each an all-gather in mode C) */
    sync_bytes += f.sync;
    int64_t sync_copies = f.nsync;
    /* Replicated offload: every rank steps the whole non-persistent set; sharded
     * (mode C): its 1/W share. Uploads are charged at full chunk size either
     * way, so the time is never under-predicted. */
    double shard_div = (o && o->shard && t->key.world_size > 1) ? t->key.world_size : 1;
    const double icpu = 1.0 / t->hw.cpu_adam_elems_per_s / shard_div;
    /* tensor parallel: the runtime reduces after backward, no buckets */
    const int buckets = ranks && o && o->overlap_ar && t->tp_size <= 1;
    bwd_pass bw = {.buckets = buckets, .shard = shard, .shard_div = shard_div, .icpu = icpu};
    bwd_windows(cx, a, p, &pw, &bw);
    double bwd = bw.time, cpu_clock = bw.cpu_clock;
    up_bytes += bw.up;
    chunk_up += bw.chunk_up;
    down_bytes += bw.down;
    sync_bytes += bw.sync;
    sync_copies += bw.nsync;
    uint64_t cpu_elems = rsum(trn, p, K);
    uint64_t dev_elems = cx->mand_train + trn[p];
    /* REKLS of resident chunks runs on the device's stream; its time there is
     * estimated at the CPU rates (what the host backend runs) */
    double rk_cpu = (cx->rks[K] - cx->rks[p]) / shard_div, rk_dev = cx->mand_rks + cx->rks[p];
    double cpu_s = (double)cpu_elems * icpu + rk_cpu,
           dev_s = pt_cost_dev_opt_s(cx, p) + rk_dev;
    double iter;
    double coll_s = coll_terms(cx, o, &bw, chunk_up, dev_elems, cpu_elems, out);
    /* mode C REKLS (cost_rekls.c): the owners' exchange and steps run inside
     * optimizer_step, not deferred */
    double rk_x = shard && rk_cpu > 0 ? pt_cost_rekls_shard_xchg_s(cx, p) : 0;
    double rk_now = shard ? rk_cpu + rk_x : 0;
    out->optim_xchg_s = rk_x;
    if (ranks && o && o->defer) {
        /* with several ranks every CPU step waits for the collectives, then is
         * deferred like a clipped one */
        iter = fwd + bwd + coll_s + rk_now + dev_s +
               defer_delay(cx, p, dev_s, icpu, shard_div, !shard);
        out->schedule = PT_SCHED_DEFER;
    } else if (ranks) {
        iter = fwd + bwd + coll_s + rk_now + dmax(dev_s, shard ? cpu_s - rk_cpu : cpu_s);
        out->schedule = PT_SCHED_AFTER_BWD;
    } else if (clip && o->defer) {
        iter = fwd + bwd + dev_s + defer_delay(cx, p, dev_s, icpu, shard_div, 1);
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
    out->optim_s = rk_cpu + rk_dev;
    out->cpu_finish_s = clip || ranks ? bwd + coll_s + rk_x + cpu_s : cpu_clock;
    out->compute_s = comp;
    out->recompute_s = a->recompute_s;
    out->exposed_xfer_s = fwd + bwd - comp;
    /* swap traffic: out in forward/turn, back in backward/turn (in up_bytes) */
    out->h2d_bytes = up_bytes;
    out->h2d_sync_bytes = sync_bytes;
    out->sync_xfer_s = copy_s(sync_bytes, sync_copies, ih, lu);
    out->d2h_bytes = down_bytes + a->swap_pool;
    out->h2d_s = (double)out->h2d_bytes * ih;
    out->d2h_s = (double)out->d2h_bytes * id;
    out->n_buffer_min = pt_cost_buffer_min(cx, p);
    out->n_buffer_min_block = pt_cost_buffer_min_block(cx, p);
    /* the disk tier's I/O where the plan's pinned bytes need it (cost_model.h:
     * pt_cost_tier_time); the lower bounds below leave it out (it only adds) */
    if (o && o->tier_slots) {
        pt_tier_fig tf;
        double ef, eb;
        pt_cost_tier(cx, a, p, o, &tf);
        pt_cost_tier_time(&tf, o, out, &out->tier_io_s, &ef, &eb);
        out->tier_exposed_s = ef + eb;
        out->iter_s += ef + eb;
        out->fwd_s += ef;
        out->opt_s += eb;
    }
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
    double tf = dmax(cx->comp_f + a->free_f_s, up_f),
           tb = dmax(dmax(cx->comp_b + a->recompute_s + a->free_b_s, up_b), down);
    if (t->hw.copy_engines == 1) tb = dmax(tb, up_b + down);
    /* all windows together vs the engines' total busy time (swap-out lands in
     * forward or turn windows, so only the sum is bounded by it) */
    double eng = t->hw.copy_engines == 1 ? up_f + up_b + down + a->swap_out_s
                                         : dmax(up_f + up_b, down + a->swap_out_s);
    double w = dmax(tf + tb, eng);
    double shard = (o && o->shard && t->key.world_size > 1) ? t->key.world_size : 1;
    double cpu = (double)rsum(cx->train, p, cx->K) / t->hw.cpu_adam_elems_per_s / shard;
    double dev = with_dev ? pt_cost_dev_opt_s(cx, p) : 0.0;
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
    clock += t->head_fwd_s + t->head_bwd_s + a->fwd_free_s[N];
    for (int32_t b = N - 1; b >= -1; b--) {
        double c = b >= 0 ? B[b].bwd_s + (a->modes[b] == PT_BLOCK_CKPT ? B[b].recompute_s : 0) + a->bwd_free_s[b]
                          : t->embed_bwd_s;
        clock += c;
        int32_t g = b + 1;
        uint64_t tr = g < N ? rsum(trn, imax(cx->f_lo[g], p), cx->f_hi[g]) : 0;
        if (tr) cpu = dmax(cpu, clock) + (double)tr * icpu;
    }
    double cpu_s = (double)rsum(trn, p, K) * icpu;
    double dev_s = pt_cost_dev_opt_s(cx, p);
    if (o && o->clip) return fwd + clock + (o->defer ? dev_s : dmax(dev_s, cpu_s));
    return fwd + dmax(clock + dev_s, cpu);
}
