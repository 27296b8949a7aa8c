/*
 * profiler.c — the memory-aware profiler. It times the host's profile_step on the
 * device's clock under the bootstrap plan (every
 * chunk streamed through the minimal pool, every block CKPT: the configuration
 * that fits if anything does) and reads the plugin's own allocator around each
 * hook window, so the trace holds exact bytes, not estimates:
 *   forward window b   = exit of block_pre_forward(b) .. entry of block_post_forward(b)
 *   backward window b  = exit of block_pre_backward(b) (recompute done) .. entry of
 *                        block_post_backward(b); the recompute inside
 *                        block_pre_backward is timed separately
 *   embedding forward  = profile start .. entry of block_pre_forward(0)
 *   head (+loss)       = exit of block_post_forward(L-1) .. entry of block_pre_backward(L-1)
 *   embedding backward = exit of block_post_backward(0) .. profile end
 * Per window: start bytes c0 (then the peak is reset), peak p, end bytes c1.
 *   forward:  arena = rounded arena request; next input = max(0, c1 - c0 - arena);
 *             fwd_scratch = p - c0 - arena - next input
 *   backward: bwd_scratch = p - c0 (the arena is already in c0)
 * Times are on the device's clock: each window edge records an event on the
 * compute stream, and a window is the elapsed time between its two events,
 * read once the pass has run (a host that launches its work asynchronously
 * returns from the hooks long before the device reaches them; the host's wall
 * clock between hook calls would time its launches).
 * Between passes and after them, the hardware rates (profiler_hw.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_ext.h"
#include "optim/optim.h"
#include "profiler_internal.h"


#define AT(arr, b) (arr)[(size_t)p->pass * (size_t)p->n + (size_t)(b)]


static uint64_t cur_bytes(pt_rt *rt) {
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    return u.current;
}

static uint64_t peak_bytes(pt_rt *rt) {
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    return u.peak;
}

static int ev_index(const struct pt_prof *p, int kind, int b) {
    return b >= 0 ? kind * p->n + b : E_PER_BLOCK * p->n + kind;
}

/* A window edge: the device's clock when the compute stream reaches this point. */
static void mark(pt_rt *rt, int kind, int b) {
    struct pt_prof *p = rt->plan.prof;
    int i = ev_index(p, kind, b);
    if (!pt_gpu_ops(rt->dev.gpu)->event_record(pt_gpu_impl(rt->dev.gpu), p->ev[i], rt->dev.s_compute))
        p->ev_set[i] = 1;
    else
        prof_failed(p, "event_record of a window edge on the compute stream failed");
}

/* Seconds between two edges of this pass (0 when either was not recorded). */
static double span(pt_rt *rt, int ka, int ba, int kb, int bb) {
    struct pt_prof *p = rt->plan.prof;
    int a = ev_index(p, ka, ba), b = ev_index(p, kb, bb);
    float ms = 0.0f;
    if (!p->ev_set[a] || !p->ev_set[b]) return 0.0;
    if (pt_gpu_ops(rt->dev.gpu)->event_elapsed_ms(pt_gpu_impl(rt->dev.gpu), p->ev[a], p->ev[b], &ms)) {
        prof_failed(p, "event_elapsed_ms between two window edges failed");
        return 0.0;
    }
    return ms > 0 ? 1e-3 * (double)ms : 0.0;
}

/* The pass has been launched: wait for the device, turn its edges into times. */
static void resolve_pass(pt_rt *rt) {
    struct pt_prof *p = rt->plan.prof;
    if (pt_gpu_ops(rt->dev.gpu)->stream_sync(pt_gpu_impl(rt->dev.gpu), rt->dev.s_compute))
        prof_failed(p, "stream_sync of the compute stream at the end of a pass failed");
    for (int b = 0; b < p->n; b++) {
        AT(p->fwd, b) = span(rt, E_XPF, b, E_EPO, b);
        AT(p->bwd, b) = span(rt, E_XPB, b, E_EPB, b);
        AT(p->rec, b) = span(rt, E_RC0, b, E_RC1, b);
        AT(p->frb, b) = span(rt, E_FR0, b, E_FR1, b);
        AT(p->frf, b) = span(rt, E_FF0, b, E_FF1, b);
    }
    p->embed_fwd[p->pass] = span(rt, E_T0, -1, E_PF0, -1);
    p->head[p->pass] = span(rt, E_HD0, -1, E_HD1, -1);
    p->embed_bwd[p->pass] = span(rt, E_EB0, -1, E_END, -1);
    memset(p->ev_set, 0, (size_t)(E_PER_BLOCK * p->n + E_GLOBAL));
}

/* The allocator's fragmentation over the window that ends now. */
static void fold_frag(pt_rt *rt) {
    struct pt_prof *p = rt->plan.prof;
    if (!p->win_open) return;
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    if (u.peak > p->fr.peak) p->fr = u;
    if (u.span_peak > p->span) p->span = u.span_peak;
}

static void window_start(pt_rt *rt) {
    fold_frag(rt);
    rt->plan.prof->c0 = cur_bytes(rt);
    pt_gpu_reset_peak(rt->dev.gpu);
    rt->plan.prof->win_open = 1;
}

/* The step's fragmentation for the trace: the address range its pattern
 * needed (highest span of any window) over its highest peak. */
static void frag_figures(const struct pt_prof *p, pt_trace_frag *f) {
    pt_gpu_usage u = p->fr;
    memset(f, 0, sizeof *f);
    if (!u.peak) return;
    u.span_peak = p->span > u.peak ? p->span : u.peak;
    f->factor = pt_gpu_frag_factor(&u);
    f->peak_bytes = u.peak;
    f->span_bytes = u.span_peak;
    f->largest_free = u.peak_largest_free;
    f->rounding_bytes = u.peak - u.peak_req;
}

int pt_prof_passes(void) { return PROF_PASSES; }

int pt_prof_begin(pt_rt *rt, char *err, size_t errlen) {
    if (rt->plan.prof) {                  /* a further pass: keep the earlier passes' timings */
        struct pt_prof *p = rt->plan.prof;
        resolve_pass(rt);
        /* the first sweep warms up (page mappings of the scratch); none after a
         * failure (this begin returns it) */
        if (!p->rc && p->n_sweep < PROF_PASSES) {
            fold_frag(rt);   /* the scratch stays out of every window's reading */
            p->win_open = 0;
            pt_prof_sweep(rt, p->pass > 0);
        }
        if (p->pass + 1 < PROF_PASSES) p->pass++;
        if (p->pass == PROF_WARM) {   /* the first measured pass */
            pt_store_coll_seconds(rt->st, p->cs0);
            pt_store_coll_bytes(rt->st, p->cb0);
        }
        mark(rt, E_T0, -1);
        window_start(rt);
        return prof_status(p, err, errlen);
    }
    struct pt_prof *p = calloc(1, sizeof *p);
    int n = rt->n_blocks > 0 ? rt->n_blocks : 1;
    size_t tn = (size_t)n * PROF_PASSES;
    if (!p || !(p->fwd = calloc(tn, sizeof(double))) ||
        !(p->bwd = calloc(tn, sizeof(double))) || !(p->rec = calloc(tn, sizeof(double))) ||
        !(p->frb = calloc(tn, sizeof(double))) || !(p->frf = calloc(tn, sizeof(double))) ||
        !(p->arena = calloc((size_t)n, 8)) || !(p->input = calloc((size_t)n + 1, 8)) ||
        !(p->fscr = calloc((size_t)n, 8)) || !(p->bscr = calloc((size_t)n, 8)) ||
        !(p->ev = calloc((size_t)(E_PER_BLOCK * n + E_GLOBAL), sizeof *p->ev)) ||
        !(p->ev_set = calloc((size_t)(E_PER_BLOCK * n + E_GLOBAL), 1))) {
        rt->plan.prof = p;
        pt_prof_free(rt);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    p->n = rt->n_blocks;
    rt->plan.prof = p;
    pt_store_coll_seconds(rt->st, p->cs0);
    pt_store_coll_bytes(rt->st, p->cb0);
    for (int i = 0; i < E_PER_BLOCK * p->n + E_GLOBAL; i++)
        if (pt_gpu_event_create_timing(rt->dev.gpu, &p->ev[i])) {
            pt_prof_free(rt);
            return pt_fail(err, errlen, PT_ERR_BACKEND, "profiler: event_create failed: cannot create device events");
        }
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    /* what the host holds outside blocks (inputs, residual streams, logits, scratch)
     * and the plugin's own small device buffers (norm accumulator) */
    p->nonblock = u.tag_current[PT_TAG_ACT] + u.tag_current[PT_TAG_SCRATCH] +
                  u.tag_current[PT_TAG_HOSTUSE] + u.tag_current[PT_TAG_OTHER];
    mark(rt, E_T0, -1);
    window_start(rt);
    return prof_status(p, err, errlen);
}

void pt_prof_free(pt_rt *rt) {
    struct pt_prof *p = rt->plan.prof;
    if (!p) return;
    free(p->fwd);
    free(p->bwd);
    free(p->rec);
    free(p->frb);
    free(p->frf);
    free(p->arena);
    free(p->input);
    free(p->fscr);
    free(p->bscr);
    for (int i = 0; p->ev && i < E_PER_BLOCK * p->n + E_GLOBAL; i++)
        if (p->ev[i]) pt_gpu_ops(rt->dev.gpu)->event_destroy(pt_gpu_impl(rt->dev.gpu), p->ev[i]);
    free(p->ev);
    free(p->ev_set);
    free(p);
    rt->plan.prof = NULL;
}

static void nonblock_window_end(pt_rt *rt) {
    struct pt_prof *p = rt->plan.prof;
    uint64_t pk = peak_bytes(rt);
    if (pk > p->c0 && pk - p->c0 > p->nonblock_scr) p->nonblock_scr = pk - p->c0;
}

void pt_prof_hook(pt_rt *rt, int which, int32_t b, int exit) {
    struct pt_prof *p = rt->plan.prof;
    if (!p || b < 0 || b >= p->n) return;
    if (!exit) {               /* hook entry: a window ends */
        switch (which) {
        case PT_PROF_PRE_FWD:
            if (b == 0) {
                mark(rt, E_PF0, -1);
                nonblock_window_end(rt);
            }
            break;
        case PT_PROF_POST_FWD: {
            mark(rt, E_EPO, b);
            uint64_t pk = peak_bytes(rt), c1 = cur_bytes(rt);
            uint64_t ar = pt_store_arena_bytes(rt->st, b);
            uint64_t grown = c1 > p->c0 + ar ? c1 - p->c0 - ar : 0;
            p->arena[b] = ar;
            p->input[b + 1] = grown;
            uint64_t base = p->c0 + ar + grown;
            p->fscr[b] = pk > base ? pk - base : 0;
            break;
        }
        case PT_PROF_PRE_BWD:
            if (b == p->n - 1) {
                mark(rt, E_HD1, -1);
                nonblock_window_end(rt);
            }
            break;
        case PT_PROF_POST_BWD: {
            mark(rt, E_EPB, b);
            uint64_t pk = peak_bytes(rt);
            p->bscr[b] = pk > p->c0 ? pk - p->c0 : 0;
            break;
        }
        }
        return;
    }
    /* hook exit: a window starts */
    if (which == PT_PROF_PRE_FWD) mark(rt, E_XPF, b);
    if (which == PT_PROF_PRE_BWD) mark(rt, E_XPB, b);
    if (which == PT_PROF_POST_FWD && b == p->n - 1) mark(rt, E_HD0, -1);
    if (which == PT_PROF_POST_BWD && b == 0) mark(rt, E_EB0, -1);
    window_start(rt);
}

void pt_prof_store_mark(pt_rt *rt, int kind, int32_t b, int after) {
    struct pt_prof *p = rt->plan.prof;
    if (!p || b < 0 || b >= p->n) return;
    if (kind == PT_STORE_MARK_RECOMPUTE) mark(rt, after ? E_RC1 : E_RC0, b);
    else if (kind == PT_STORE_MARK_ARENA_FREE) mark(rt, after ? E_FR1 : E_FR0, b);
    else if (kind == PT_STORE_MARK_ARENA_FREE_FWD) mark(rt, after ? E_FF1 : E_FF0, b);
}

/* Median over the measured passes (PROF_WARM..pass; the last pass alone before those)
 * of v[k * stride + off]. */
static double med_passes(const struct pt_prof *p, const double *v, size_t stride, size_t off) {
    double x[PROF_PASSES];
    int lo = p->pass >= PROF_WARM ? PROF_WARM : p->pass, k = 0;
    for (int q = lo; q <= p->pass; q++) x[k++] = v[(size_t)q * stride + off];
    return pt_median(x, k);
}

/* What a device free costs the compute stream (hw.free_Bps, free_fwd_Bps),
 * measured where it happens: post_backward frees the block's activation arena
 * in the stream's order (and in the profile, where every block is CKPT,
 * post_forward too), and where the device poisons freed memory (the simulated
 * device always, cuda with [cuda] poison) the NaN fill is a memset queued
 * there, outside every window the passes time (the windows end at the hook's
 * entry). The store's marks around those frees (PT_STORE_MARK_ARENA_FREE,
 * _FWD) time them on the compute stream with the arena as the step leaves it:
 * after the backward it has been read back from a forward long ago, after the
 * forward it was just written (on the host backend 110-190 us and 50-60 us
 * for 2.2 MB; a synthetic fill of a block just written, 24-34 us, predicted
 * neither, and the whole of post_backward's span also held the gradient
 * copies' waits of a streamed profile, 3.3 ms a pass).
 * With A_b the arenas and T_b the spans (medians over the measured passes):
 *   rate = sum A_b / sum T_b,
 * 0 when no arena was freed or no time was seen (no fill). */
static double free_rate_of(const struct pt_prof *p, const double *spans) {
    double A = 0, T = 0;
    for (int b = 0; b < p->n; b++) {
        A += (double)p->arena[b];
        T += med_passes(p, spans, (size_t)p->n, (size_t)b);
    }
    return A > 0 && T > 0 ? A / T : 0;
}

static void free_rate(pt_rt *rt, pt_trace *t) {
    struct pt_prof *p = rt->plan.prof;
    t->hw.free_Bps = free_rate_of(p, p->frb);
    t->hw.free_fwd_Bps = free_rate_of(p, p->frf);
    PT_LOGI(&rt->lg, "profiler: freeing an activation arena costs the compute stream %.3g "
                     "bytes/s after its backward, %.3g after its forward", t->hw.free_Bps,
            t->hw.free_fwd_Bps);
}

/* Everything besides the model that changes what a profile measured: the chunk
 * size in force (chunk boundaries, slot size, the chunk table itself), the
 * device capacity (the device name does not say it on cuda; the timing buffers
 * shrink on a full device), the backend and its copy throttle and compute
 * jitter (every copy rate and window time), the optimizer kind and the
 * OSFT/TiledMLP settings (what a block computes and keeps). A cache keyed on
 * less handed a trace for other chunks to a run with another chunk_size, which
 * then failed ("n_buffer = 1 is too small"). */
/* The tensor-parallel group size the store runs under (1: none, as the store
 * counts it: a group needs the collectives). */
static int32_t tp_size(const pt_rt *rt) {
    return rt->dist.coll && rt->cfg.tp_size > 1 ? rt->cfg.tp_size : 1;
}

static uint64_t measured_inputs(pt_rt *rt) {
    const pt_config *c = &rt->cfg;
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    struct {
        uint64_t chunk, chunk_cfg, capacity;
        double copy_bw, jitter;
        int32_t optim, async, tp;
    } in;
    memset(&in, 0, sizeof in);   /* padding hashed as zeros */
    in.chunk = rt->st ? pt_store_chunk_size(rt->st) : 0;
    in.chunk_cfg = c->chunk_size;
    in.capacity = u.capacity;
    in.copy_bw = c->copy_bandwidth;
    in.jitter = c->compute_jitter;
    in.optim = c->optim_type;
    in.async = c->async_compute;
    in.tp = tp_size(rt);   /* a split param's chunk holds its shard */
    const char *be = pt_gpu_backend_name(rt->dev.gpu);
    uint64_t h = pt_fnv1a64(&in, sizeof in);
    h ^= pt_fnv1a64(be, strlen(be)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return pt_rt_ext_cache_key(c, h);   /* the features' settings */
}

void pt_prof_key(pt_rt *rt, pt_trace_key *k) {
    memset(k, 0, sizeof *k);
    pt_gpu_device_name(rt->dev.gpu, k->device, sizeof k->device);
    k->batch = rt->model->batch;
    k->seq = rt->model->seq;
    k->world_size = rt->host.world_size > 0 ? rt->host.world_size : 1;
    k->version = PT_TRACE_VERSION;
    uint64_t m = measured_inputs(rt);
    k->arch_hash = pt_store_arch_hash(rt->model, &rt->cfg) ^ (m + 0x9e3779b97f4a7c15ull);
}

int pt_prof_finish(pt_rt *rt, pt_trace *t, char *err, size_t errlen) {
    struct pt_prof *p = rt->plan.prof;
    pt_model_v1 *m = rt->model;
    int n_chunks = pt_store_n_chunks(rt->st);
    pt_trace_init(t);   /* the caller frees it on failure too */
    mark(rt, E_END, -1);
    resolve_pass(rt);
    /* After a failed op (a wait that did not happen included) the compute
     * stream may still run the last pass: the timing buffers below could land
     * on the bytes it still uses. */
    if (p->rc) return prof_status(p, err, errlen);
    nonblock_window_end(rt);
    fold_frag(rt);
    int rc = pt_trace_alloc(t, rt->n_blocks, n_chunks, err, errlen);
    if (rc) return rc;
    pt_prof_key(rt, &t->key);
    t->chunk_size = pt_store_chunk_size(rt->st);
    t->tp_size = tp_size(rt);
    for (int b = 0; b < rt->n_blocks; b++) {
        pt_trace_block *tb = &t->blocks[b];
        size_t n = (size_t)p->n;
        tb->fwd_s = med_passes(p, p->fwd, n, (size_t)b);
        tb->bwd_s = med_passes(p, p->bwd, n, (size_t)b);
        double rec = med_passes(p, p->rec, n, (size_t)b);
        tb->recompute_s = rec > 0 ? rec : tb->fwd_s;
        tb->arena_bytes = p->arena[b];
        tb->input_bytes = p->input[b];
        tb->fwd_scratch_bytes = p->fscr[b];
        tb->bwd_scratch_bytes = p->bscr[b];
        tb->grad_act_bytes = 0;    /* the host's activation grads live in its own scratch */
    }
    free_rate(rt, t);
    pt_optim_rates rates;   /* the optimizer kind's, measured on its first need */
    memset(&rates, 0, sizeof rates);
    for (int k = 0; k < n_chunks; k++) {
        pt_store_chunk_info ci;
        pt_store_chunk_info_get(rt->st, k, &ci);
        pt_trace_chunk *tc = &t->chunks[k];
        tc->bytes = ci.used;
        tc->elems = ci.elems;
        tc->trainable_elems = ci.n_state;
        tc->first_block = ci.first_block;
        tc->last_block = ci.last_block;
        tc->mandatory = ci.mandatory;
        tc->dev_bytes = ci.dev_bytes;
        tc->host_bytes = ci.host_bytes;
        /* the trace names the optimizer's own terms after REKLS, the one
         * kind with any (a file format: trace_cache.c) */
        tc->optim_bytes = ci.optim_bytes;
        tc->tp_grad_bytes = ci.optim_tp_grad_bytes;
        tc->tp_factor_bytes = ci.optim_tp_factor_bytes;
        tc->optim_aux_words = ci.optim_aux_words;
        tc->optim_mn = ci.optim_mn;
        tc->optim_own_max = ci.optim_own_max;
        tc->optim_s = pt_store_chunk_optim_cpu_s(rt->st, k, &rates);
    }
    pt_trace_derive_ranges(t);
    /* the head window holds the loss and the head's backward: split 1:2 like a
     * linear layer's forward:backward FLOPs */
    double head = med_passes(p, p->head, 1, 0);
    t->embed_fwd_s = med_passes(p, p->embed_fwd, 1, 0);
    t->embed_bwd_s = med_passes(p, p->embed_bwd, 1, 0);
    t->head_fwd_s = head / 3.0;
    t->head_bwd_s = head - t->head_fwd_s;
    t->nonblock_bytes = p->nonblock;
    t->nonblock_scratch_bytes = p->nonblock_scr;
    frag_figures(p, &t->frag);
    /* the per-element sizes of gradients and optimizer state follow the
     * trainable parameters (frozen byte parameters have neither; every chunk's
     * exact bytes are in dev_bytes / host_bytes) */
    int dt = PT_F32;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].trainable) {
            dt = m->params[i].dtype;
            break;
        }
    t->param_elem_bytes = (uint32_t)pt_dtype_size(dt);
    t->grad_elem_bytes = t->param_elem_bytes;
    t->master_elem_bytes = dt == PT_F32 ? 0 : 4;
    t->adam_m_elem_bytes = 4;
    t->adam_v_elem_bytes = 4;
    t->host_grad_elem_bytes = 4;
    t->slot_bytes = 2 * pt_store_chunk_size(rt->st);
    pt_prof_measure_hw(rt, t, dt);
    if ((rc = prof_status(p, err, errlen))) return rc;
    t->hw.copy_engines = 2;
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    t->hw.device_capacity = u.capacity;
    t->hw.host_ram_bytes = rt->cfg.pinned_budget;
    return pt_trace_validate(t, err, errlen);
}
