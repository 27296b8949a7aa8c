/*
 * profiler_hw.c — the profiler's hardware rates: copies (bytes/s and a fixed
 * cost per copy), CPU and device AdamW (the device one also between passes,
 * where training runs it), the collectives; and the timing buffers they use.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_ext.h"
#include "optim/optim.h"
#include "profiler_internal.h"

/* Gives a timing buffer back. After a failed op (failed != 0) the work queued
 * before it on the compute stream may still use the buffer: it goes back once
 * the stream is idle, or in the stream's order when even the wait fails. */
static void probe_free(pt_rt *rt, void *d, int failed) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    char e[256];
    if (!failed || !ops->stream_sync(pt_gpu_impl(rt->dev.gpu), rt->dev.s_compute)) pt_gpu_free(rt->dev.gpu, d);
    else pt_gpu_free_on_stream(rt->dev.gpu, d, rt->dev.s_compute, e, sizeof e);
}

/* AdamW arguments for the profiler's timing runs: fixed hyper-parameters (the
 * element math costs the same whatever they are), no 16-bit copy out. */
static pt_adamw_args timing_adamw(void) {
    pt_adamw_args a;
    memset(&a, 0, sizeof a);
    a.lr = 1e-3f;
    a.beta1 = 0.9f;
    a.beta2 = 0.999f;
    a.eps = 1e-8f;
    a.bc1 = 0.1f;
    a.bc2_rsqrt = 1.0f;
    a.grad_scale = 1.0f;
    return a;
}

/* Between two passes, what a training step runs between a backward and the
 * next forward: the device AdamW over the model's trainable elements as
 * optimizer_step issues it (one launch per chunk, each followed by the memset
 * zeroing that chunk's gradient), on scratch (param, grad, m, v per chunk; at
 * most 64 MiB in all), timed by events on the compute stream. Two reasons:
 *  - the AdamW is timed as the step runs it: right after a backward, chunk by
 *    chunk, with whatever each launch costs beyond its elements. On the host
 *    backend the stream idled 1-7 us after every chunk's AdamW in the step,
 *    against 0.1-0.7 us between the back-to-back 16-element launches that
 *    time dev_op_s;
 *  - each measured pass then starts as a training step's forward does, after
 *    the optimizer's sweep through memory, not straight after the previous
 *    pass's backward.
 * The scratch lives only between the windows: the caller folds the previous
 * window's fragmentation reading in first and the next window resets the
 * peak, so the profile's memory figures never see it. No room for it (a nearly full
 * device) or nothing trainable: no sample. A failed op is recorded like any
 * other. */
void pt_prof_sweep(pt_rt *rt, int timed) {
    struct pt_prof *p = rt->plan.prof;
    const uint64_t cap = (uint64_t)4 << 20;   /* elements: 64 MiB of fp32 p, g, m, v */
    int nk = pt_store_n_chunks(rt->st), launches = 0;
    uint64_t E = 0;
    for (int k = 0; k < nk && E < cap; k++) {
        pt_store_chunk_info ci;
        pt_store_chunk_info_get(rt->st, k, &ci);
        if (!ci.n_state) continue;
        E += ci.n_state < cap - E ? ci.n_state : cap - E;
        launches++;
    }
    if (!E) return;
    void *d = NULL;
    char e[256];
    if (pt_gpu_try_alloc(rt->dev.gpu, (size_t)E * 16, PT_TAG_OTHER, &d, e, sizeof e)) return;
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    void *impl = pt_gpu_impl(rt->dev.gpu);
    pt_event *e0 = p->ev[E_PER_BLOCK * p->n + E_T0], *e1 = p->ev[E_PER_BLOCK * p->n + E_END];
    float *base = d;   /* [4][E]: param, grad, m, v */
    pt_adamw_args a = timing_adamw();
    const char *bad = NULL;
    if (ops->memset_async(impl, d, 0, (size_t)E * 16, rt->dev.s_compute)) bad = "memset";
    if (!bad && ops->event_record(impl, e0, rt->dev.s_compute)) bad = "event_record";
    uint64_t off = 0;
    for (int k = 0; k < nk && off < E && !bad; k++) {
        pt_store_chunk_info ci;
        pt_store_chunk_info_get(rt->st, k, &ci);
        if (!ci.n_state) continue;
        uint64_t n = ci.n_state < E - off ? ci.n_state : E - off;
        a.param = base + off;
        a.grad = base + E + off;
        a.m = base + 2 * E + off;
        a.v = base + 3 * E + off;
        a.n = (size_t)n;
        if (ops->adamw(impl, &a, rt->dev.s_compute)) bad = "adamw";
        else if (ops->memset_async(impl, base + E + off, 0, (size_t)n * 4, rt->dev.s_compute)) bad = "memset";
        off += n;
    }
    float ms = 0;
    if (!bad && ops->event_record(impl, e1, rt->dev.s_compute)) bad = "event_record";
    if (!bad && ops->event_sync(impl, e1)) bad = "event_sync";
    if (!bad && ops->event_elapsed_ms(impl, e0, e1, &ms)) bad = "event_elapsed_ms";
    probe_free(rt, d, bad != NULL);
    if (bad) {
        char why[128];
        snprintf(why, sizeof why, "%s of the device optimizer between profiled passes failed", bad);
        prof_failed(p, why);
        return;
    }
    if (!timed) return;
    p->sweep_t[p->n_sweep++] = ms * 1e-3;
    p->sweep_elems = E;
    p->sweep_launches = launches;
}

/* ---- hardware rates ---- */

/* Median of three timed copies of `bytes`, as bytes/s (0 after a failure, which
 * is kept in the profile's status). */
static double copy_rate(pt_rt *rt, void *dev, void *host, size_t bytes, int kind) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    pt_stream *s = kind == PT_GPU_H2D ? rt->dev.s_h2d : rt->dev.s_d2h;
    double dt[3];
    for (int r = 0; r < 3; r++) {
        double t0 = pt_now_s();
        void *d = kind == PT_GPU_H2D ? dev : host;
        const void *src = kind == PT_GPU_H2D ? host : dev;
        if (pt_gpu_memcpy_async(rt->dev.gpu, d, src, bytes, kind, s)) {
            prof_failed(rt->plan.prof, "memcpy timing a copy rate failed");
            return 0;
        }
        if (ops->stream_sync(pt_gpu_impl(rt->dev.gpu), s)) {
            prof_failed(rt->plan.prof, "stream_sync timing a copy rate failed");
            return 0;
        }
        dt[r] = pt_now_s() - t0;
    }
    double lo = dt[0] < dt[1] ? dt[0] : dt[1], hi = dt[0] < dt[1] ? dt[1] : dt[0];
    double med = dt[2] < lo ? lo : dt[2] > hi ? hi : dt[2];
    return med > 0 ? (double)bytes / med : 0;
}

/* Latency of one small dependent copy, as the runtime's synchronous chunk
 * uploads see it: the compute stream records e0, the copy stream waits for
 * it, copies `bytes`, and the compute stream waits for that copy before it
 * records e1. elapsed(e0, e1) - bytes / rate is the copy's fixed cost (the
 * engine's start, the cross-stream handoffs), which a layer's small norm and
 * bias chunks pay far above their bytes. Median of 5, >= 0; 0 after a
 * failure (recorded). */
static double copy_latency(pt_rt *rt, void *dev, void *host, size_t bytes, int kind, double rate) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    void *impl = pt_gpu_impl(rt->dev.gpu);
    pt_stream *s = kind == PT_GPU_H2D ? rt->dev.s_h2d : rt->dev.s_d2h;
    pt_event *e0 = NULL, *e1 = NULL, *ec = NULL;
    if (pt_gpu_event_create_timing(rt->dev.gpu, &e0) || pt_gpu_event_create_timing(rt->dev.gpu, &e1) ||
        ops->event_create(impl, &ec)) {
        prof_failed(rt->plan.prof, "event_create timing a copy latency failed");
        if (e0) ops->event_destroy(impl, e0);
        if (e1) ops->event_destroy(impl, e1);
        return 0;
    }
    double dt[5];
    int n = 0;
    for (int r = 0; r < 5; r++) {
        float ms = 0;
        void *d = kind == PT_GPU_H2D ? dev : host;
        const void *src = kind == PT_GPU_H2D ? host : dev;
        const char *op = NULL;
        if (ops->event_record(impl, e0, rt->dev.s_compute)) op = "event_record";
        else if (ops->stream_wait_event(impl, s, e0)) op = "stream_wait_event";
        else if (pt_gpu_memcpy_async(rt->dev.gpu, d, src, bytes, kind, s)) op = "memcpy";
        else if (ops->event_record(impl, ec, s)) op = "event_record";
        else if (ops->stream_wait_event(impl, rt->dev.s_compute, ec)) op = "stream_wait_event";
        else if (ops->event_record(impl, e1, rt->dev.s_compute)) op = "event_record";
        else if (ops->event_sync(impl, e1)) op = "event_sync";
        else if (ops->event_elapsed_ms(impl, e0, e1, &ms)) op = "event_elapsed_ms";
        if (op) {
            char why[128];
            snprintf(why, sizeof why, "%s timing a copy latency failed", op);
            prof_failed(rt->plan.prof, why);
            break;
        }
        double x = ms * 1e-3 - (rate > 0 ? (double)bytes / rate : 0);
        dt[n++] = x > 0 ? x : 0;
    }
    ops->event_destroy(impl, e0);
    ops->event_destroy(impl, e1);
    ops->event_destroy(impl, ec);
    return n < 5 ? 0 : pt_median(dt, n);
}

/* Copy rates at the size the plan moves most: the larger of a pool slot and the
 * largest activation arena (a per-copy latency makes small copies look slower;
 * measuring at a small size made swap-outs look twice as long as they are). */
static void measure_copies(pt_rt *rt, pt_trace_hw *hw) {
    struct pt_prof *p = rt->plan.prof;
    size_t bytes = (size_t)(2 * pt_store_chunk_size(rt->st));
    for (int b = 0; b < p->n; b++)
        if (p->arena[b] > bytes) bytes = (size_t)p->arena[b];
    if (bytes < 65536) bytes = 65536;
    void *dev = NULL, *host = NULL;
    char e[256];
    int own = 0;
    if (!pt_gpu_try_alloc(rt->dev.gpu, bytes, PT_TAG_OTHER, &dev, e, sizeof e)) {
        own = 1;
    } else {
        /* no room for a block that size: time with an idle pool slot */
        uint64_t sb = 0;
        if (pt_store_borrow_slot(rt->st, &dev, &sb)) bytes = (size_t)sb;
    }
    int prc = dev ? pt_gpu_pinned_alloc(rt->dev.gpu, bytes, &host, e, sizeof e) : PT_ERR_OOM;
    /* the pinned budget leaves less than the wanted size (the arenas, which set
     * it, are not known when the chunks' pinned memory is checked against the
     * budget): time at what is left, down to 64 KiB, and say so. A smaller copy
     * carries more of the per-copy latency, so the rates come out low: the
     * plan errs towards overlapping less, never towards more memory. */
    pt_gpu_usage pu;
    pt_gpu_usage_get(rt->dev.gpu, &pu);
    uint64_t left = pu.pinned_budget > pu.pinned_current ? pu.pinned_budget - pu.pinned_current : 0;
    left -= left % PT_GPU_ALIGN;
    if (prc == PT_ERR_HOST_OOM && pu.pinned_budget && left >= 65536 && left < bytes &&
        !pt_gpu_pinned_alloc(rt->dev.gpu, (size_t)left, &host, e, sizeof e)) {
        PT_LOGW(&rt->lg, "profiler: timing the copy rates with %llu pinned bytes instead of %zu "
                         "(what [memory] pinned_budget leaves; %llu would time them at full "
                         "size): the rates may read low", (unsigned long long)left, bytes,
                (unsigned long long)(pu.pinned_current + bytes));
        bytes = (size_t)left;
        prc = PT_OK;
    }
    if (prc) {
        /* without a buffer the rates would stay 0 and the profile be refused
         * later with a sentence that does not say why */
        char why[320];
        pt_gpu_usage u;
        pt_gpu_usage_get(rt->dev.gpu, &u);
        if (dev)
            snprintf(why, sizeof why, "timing the copy rates needs %zu pinned bytes: %.140s; set "
                     "[memory] pinned_budget to at least %llu (the %llu in use + these)", bytes, e,
                     (unsigned long long)(u.pinned_current + bytes),
                     (unsigned long long)u.pinned_current);
        else snprintf(why, sizeof why, "timing the copy rates needs %zu device bytes or a free "
                      "buffer-pool slot, and neither is there", bytes);
        prof_failed_rc(p, prc, why);
    } else {
        memset(host, 0, bytes);
        hw->h2d_Bps = copy_rate(rt, dev, host, bytes, PT_GPU_H2D);
        /* after a failed wait the first copy may still run: no second copy
         * over the same bytes, and both copy streams drained (their own
         * failures are already recorded) before the buffers go */
        if (!p->rc) hw->d2h_Bps = copy_rate(rt, dev, host, bytes, PT_GPU_D2H);
        /* 256 bytes: a copy that small is all latency */
        if (!p->rc) hw->h2d_lat_s = copy_latency(rt, dev, host, 256, PT_GPU_H2D, hw->h2d_Bps);
        if (!p->rc) hw->d2h_lat_s = copy_latency(rt, dev, host, 256, PT_GPU_D2H, hw->d2h_Bps);
        if (!p->rc)
            PT_LOGI(&rt->lg, "profiler: copies H2D %.3g B/s + %.3g s per copy, D2H %.3g B/s + "
                             "%.3g s per copy", hw->h2d_Bps, hw->h2d_lat_s, hw->d2h_Bps,
                    hw->d2h_lat_s);
        if (p->rc) {
            const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
            (void)ops->stream_sync(pt_gpu_impl(rt->dev.gpu), rt->dev.s_h2d);
            (void)ops->stream_sync(pt_gpu_impl(rt->dev.gpu), rt->dev.s_d2h);
        }
        pt_gpu_pinned_free(rt->dev.gpu, host);
    }
    if (own) pt_gpu_free(rt->dev.gpu, dev);
}

/* Several ranks: the collectives' rates at chunk size, as bus bytes/s (the
 * cost model's convention: a B-byte all-reduce takes B 2(W-1)/W / rate, an
 * all-gather or reduce-scatter B (W-1)/W / rate). Every rank runs the same
 * calls here (profiling runs on all of them), the median of 3 after a warm-up.
 * On the host backend device memory is host memory, so a host buffer times
 * what the runtime's collectives on slots do. On cuda (NCCL) the slots are
 * device memory, which NCCL uses in place while a host buffer would be staged
 * through the device, so a device buffer is timed when the device has room for
 * one chunk (every rank asks for the same bytes; a rank without room times the
 * host buffer, and the log says so). Its contents are never read.
 * Here the ranks run the calls back to back, so each finds the other already
 * there. In training mode C's all-gathers and reduce-scatters run on the hook
 * thread between compute, and each waits for the slower rank to reach the same
 * chunk: that wait dominated (6 to 23 times the back-to-back time on the host
 * backend). When the profiled passes ran them (a sharded profile), their
 * observed rate, bytes * bus / seconds waited in them, is what training sees:
 * the slower of the two rates is kept. */
static void measure_coll(pt_rt *rt, pt_trace_hw *hw) {
    if (!rt->dist.coll || pt_coll_world(rt->dist.coll) < 2 || rt->plan.prof->rc) return;
    size_t bytes = (size_t)pt_store_chunk_size(rt->st), n = bytes / 4 ? bytes / 4 : 1;
    float *buf = NULL, *dbuf = NULL;
    if (strcmp(pt_gpu_backend_name(rt->dev.gpu), "host")) {
        char why[256];
        if (pt_gpu_try_alloc(rt->dev.gpu, n * 4, PT_TAG_SCRATCH, (void **)&dbuf, why, sizeof why)) {
            dbuf = NULL;
            PT_LOGW(&rt->lg, "profiler: timing the collectives on a host buffer (a device "
                             "buffer of one chunk did not fit: %s)", why);
        }
    }
    buf = dbuf ? dbuf : calloc(n, 4);
    if (!buf) {
        prof_failed(rt->plan.prof, "out of host memory timing the collectives");
        return;
    }
    double W = pt_coll_world(rt->dist.coll), bus[3] = {2 * (W - 1) / W, (W - 1) / W, (W - 1) / W};
    double *rate[3] = {&hw->allreduce_Bps, &hw->allgather_Bps, &hw->reduce_scatter_Bps};
    static const char *const name[3] = {"all-reduce", "all-gather", "reduce-scatter"};
    char e[512];
    for (int k = 0; k < 3 && !rt->plan.prof->rc; k++) {
        double dt[4];
        for (int r = 0; r < 4; r++) {
            double t0 = pt_now_s();
            int rc = k == 0 ? pt_coll_allreduce(rt->dist.coll, buf, n, PT_COLL_F32, 1.0, name[k], e, sizeof e)
                   : k == 1 ? pt_coll_allgather(rt->dist.coll, buf, n, 4, name[k], e, sizeof e)
                            : pt_coll_reduce_scatter(rt->dist.coll, buf, n, PT_COLL_F32, 1.0, name[k], e,
                                                     sizeof e);
            if (rc) {
                char why[200];
                snprintf(why, sizeof why, "timing the %s failed: %.150s", name[k], e);
                prof_failed(rt->plan.prof, why);
                break;
            }
            dt[r] = pt_now_s() - t0;
        }
        if (rt->plan.prof->rc) break;
        double med = pt_median(dt + 1, 3);   /* the first is a warm-up */
        *rate[k] = med > 0 ? (double)(n * 4) * bus[k] / med : 0;
    }
    double cs[3], cb[3];
    pt_store_coll_seconds(rt->st, cs);
    pt_store_coll_bytes(rt->st, cb);
    for (int k = 1; k < 3 && !rt->plan.prof->rc; k++) {
        double ds = cs[k] - rt->plan.prof->cs0[k], db = cb[k] - rt->plan.prof->cb0[k];
        if (ds <= 0 || db <= 0) continue;
        double seen = db * bus[k] / ds;
        PT_LOGI(&rt->lg, "profile: %s at %.1f MB/s bus back to back, %.1f MB/s in the profiled "
                         "passes (waits for the other ranks included)%s", name[k],
                *rate[k] / 1e6, seen / 1e6, seen < *rate[k] ? ": the cost model uses the latter" : "");
        if (seen < *rate[k]) *rate[k] = seen;
    }
    if (dbuf) pt_gpu_free(rt->dev.gpu, dbuf);
    else free(buf);
}

/* Seconds on the compute stream, the best of 3, from timed events around the
 * work: `launches` back-to-back device AdamWs over n elements each, or (when
 * fill > 0) one memset of fill bytes. d holds 4 arrays of stride floats
 * (param, grad, m, v). 0 when the events or the work failed (recorded). */
static double dev_time(pt_rt *rt, void *d, size_t n, size_t stride, int launches, size_t fill) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    void *impl = pt_gpu_impl(rt->dev.gpu);
    pt_event *e0 = NULL, *e1 = NULL;
    if (pt_gpu_event_create_timing(rt->dev.gpu, &e0) || pt_gpu_event_create_timing(rt->dev.gpu, &e1)) {
        prof_failed(rt->plan.prof, "event_create timing the device optimizer failed");
        if (e0) ops->event_destroy(impl, e0);
        return 0;
    }
    pt_adamw_args a = timing_adamw();
    a.param = d;
    a.grad = (float *)d + stride;
    a.m = (float *)d + 2 * stride;
    a.v = (float *)d + 3 * stride;
    a.n = n;
    double best = 0;
    for (int r = 0; r < 3 && !rt->plan.prof->rc; r++) {
        float ms = 0;
        const char *op = NULL;
        if (ops->event_record(impl, e0, rt->dev.s_compute)) op = "event_record";
        for (int k = 0; !op && fill == 0 && k < launches; k++)
            if (ops->adamw(impl, &a, rt->dev.s_compute)) op = "adamw";
        if (!op && fill && ops->memset_async(impl, d, 0, fill, rt->dev.s_compute)) op = "memset";
        if (!op && ops->event_record(impl, e1, rt->dev.s_compute)) op = "event_record";
        if (!op && ops->event_sync(impl, e1)) op = "event_sync";
        if (!op && ops->event_elapsed_ms(impl, e0, e1, &ms)) op = "event_elapsed_ms";
        if (op) {
            char why[128];
            snprintf(why, sizeof why, "%s timing the device optimizer failed", op);
            prof_failed(rt->plan.prof, why);
            break;
        }
        double dt = ms * 1e-3;
        if (dt > 0 && (best == 0 || dt < best)) best = dt;
    }
    ops->event_destroy(impl, e0);
    ops->event_destroy(impl, e1);
    return best;
}

/* CPU AdamW rate the way the runtime steps an offloaded chunk: a job of the
 * largest offloadable chunk's trainable elements (n) in the model's dtype (a 16-bit model
 * steps fp32 masters from a 16-bit gradient and writes a 16-bit copy), its
 * runners queued on the store's own pool and waited for, exactly as
 * optimizer_step queues a deferred step. Steps rotate over as many chunk-sized
 * buffer sets as the model has state (at most 64 MiB of them), so the caches
 * hold what they hold in training: everything for a small model, nothing for
 * a large one. The per-chunk costs (queueing, waking the workers, the last
 * slice's imbalance) are thus inside the rate, amortised over one chunk:
 *   rate = sets * n / sum over the sets of its fastest step in 5 passes.
 * (Measured before the step ran each chunk on every thread: one array of 1M
 * elements with all threads, optimistic for few large chunks.) */
static void measure_adam(pt_rt *rt, const pt_trace *t, int dtype, pt_trace_hw *hw) {
    uint64_t n = 0, total = 0;
    for (int k = 0; k < t->n_chunk; k++) {
        if (t->chunks[k].mandatory) continue;   /* never offloaded: stepped on the device */
        uint64_t e = t->chunks[k].trainable_elems;
        total += e;
        if (e > n) n = e;
    }
    const uint64_t n_max = (uint64_t)4 << 20;   /* beyond it the rate is DRAM's: no per-chunk cost left */
    if (n == 0) n = (uint64_t)1 << 20;          /* nothing trainable: any size; the rate is unused */
    if (n > n_max) n = n_max;
    if (dtype != PT_BF16 && dtype != PT_F16) dtype = PT_F32;   /* only these are ever stepped */
    size_t es = dtype == PT_F32 ? 0 : pt_dtype_size(dtype);   /* 16-bit: gradient and copy */
    size_t set_bytes = (size_t)n * (16 + 2 * es);   /* p, m, v fp32 + g (fp32 or 16-bit) + copy */
    size_t cap = (size_t)64 << 20;
    size_t sets = (size_t)((total + n - 1) / n);
    if (sets * set_bytes > cap) sets = cap / set_bytes;
    if (sets < 1) sets = 1;
    char *buf = calloc(sets, set_bytes);
    pt_cpu_adam_args *a = calloc(sets, sizeof *a);
    if (buf && a) {
        for (size_t i = 0; i < sets; i++) {
            char *b = buf + i * set_bytes;
            a[i].p = (float *)b;
            a[i].m = (float *)(b + 4 * n);
            a[i].v = (float *)(b + 8 * n);
            a[i].g = b + 12 * n;
            a[i].g_dtype = es ? dtype : PT_F32;
            a[i].out = es ? b + (12 + es) * n : NULL;
            a[i].out_dtype = es ? dtype : PT_F32;
            a[i].n = (size_t)n;
            a[i].c = pt_adamw_make_consts(1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.1f, 1.0f, 1.0f);
        }
        pt_pool *pool = pt_store_workers(rt->st);
        /* per set, the fastest of 5 passes: a pass is long enough (the model's
         * whole state) that the scheduler of a shared machine often cuts into
         * it, and the minimum per step keeps one preemption out of the rate */
        double *tmin = malloc(sets * sizeof *tmin);
        double best = 0;
        if (tmin) {
            for (int r = -1; r < 5; r++)   /* r = -1: first touch of the pages, untimed */
                for (size_t i = 0; i < sets; i++) {
                    pt_task_group g = PT_TASK_GROUP_INIT;
                    char why[150];
                    double t0 = pt_now_s();
                    if (pt_cpu_adam_step_many(pool, &a[i], 1, pool ? &g : NULL, NULL, why, sizeof why))
                        prof_failed(rt->plan.prof, why);
                    if (pool) pt_pool_wait(pool, &g);
                    double dt = pt_now_s() - t0;
                    if (r == 0 || (r > 0 && dt < tmin[i])) tmin[i] = dt;
                }
            double sum = 0;
            for (size_t i = 0; i < sets; i++) sum += tmin[i];
            if (sum > 0) best = (double)(sets * n) / sum;
            free(tmin);
        }
        hw->cpu_adam_elems_per_s = best;
        PT_LOGI(&rt->lg, "profiler: CPU AdamW %.3g elements/s (%zu steps of %llu elements, %s, %d threads)", best,
                sets, (unsigned long long)n, es ? "16-bit gradient and copy" : "fp32", pt_pool_threads(pool));
    }
    free(buf);
    free(a);
}

/* The AdamW rate from the sweeps between passes (sweep_between): with T their
 * median over E elements in L launches, the rate that makes the cost model's
 * device step (pt_cost_dev_opt_s: elements, 2 ops per chunk, the gradient
 * memsets) come out at T:
 *   rate = E / (T - 2 L t_op - 4 E / r_memset)
 * Kept when positive; otherwise the one-array rate stands. */
static void swept_rate(pt_rt *rt, pt_trace_hw *hw) {
    struct pt_prof *p = rt->plan.prof;
    if (!p->n_sweep) return;
    double t[PROF_PASSES];
    memcpy(t, p->sweep_t, (size_t)p->n_sweep * sizeof t[0]);
    double T = pt_median(t, p->n_sweep), E = (double)p->sweep_elems;
    double rest = 2.0 * p->sweep_launches * hw->dev_op_s;
    if (hw->dev_memset_Bps > 0) rest += 4.0 * E / hw->dev_memset_Bps;
    if (!(T > rest)) return;
    double rate = E / (T - rest);
    PT_LOGI(&rt->lg, "profiler: device AdamW between passes %.3g elements/s (%d launches, %.0f "
                     "elements, %.3g s, median of %d), against %.3g on one array alone: the cost "
                     "model uses the former", rate, p->sweep_launches, E, T, p->n_sweep,
            hw->dev_adam_elems_per_s);
    hw->dev_adam_elems_per_s = rate;
}

static void measure_dev_adam(pt_rt *rt, pt_trace_hw *hw) {
    /* Device AdamW rate from two sizes, each timed by events on the compute
     * stream (the device's clock): rate = (n2 - n1) / (t2 - t1). One size
     * timed from the host would include the launch and the wait (about 10-20 us
     * on a GPU, more than a 64K-element kernel takes), and the planner,
     * extrapolating it to whole chunks, judged device AdamW 20x too slow and
     * offloaded models that fit (measured on an H100). n2: up to 4M elements
     * (64 MiB), fewer when the device is nearly full; n1 = n2 / 16.
     *
     * The step runs more than elements: per resident trainable chunk an AdamW
     * launch and a memset zeroing its gradient, each a device op with a fixed
     * cost (a kernel launch's gap on a GPU; on the host backend the stream
     * thread's dispatch, measured 0.15-0.7 us on a 2-core VM, so small there).
     * So also: dev_op_s = the time of OPS launches of 16 elements / OPS, and
     * the memset rate over the whole buffer. */
    enum { OPS = 32 };
    size_t dn = (size_t)4 << 20;
    void *d = NULL;
    char e[256];
    while (dn >= 4096 && pt_gpu_try_alloc(rt->dev.gpu, dn * 16, PT_TAG_OTHER, &d, e, sizeof e)) dn /= 4;
    if (d) {
        const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
        void *impl = pt_gpu_impl(rt->dev.gpu);
        if (ops->memset_async(impl, d, 0, dn * 16, NULL))
            prof_failed(rt->plan.prof, "memset of the device AdamW timing buffer failed");
        size_t n1 = dn / 16, n2 = dn;
        double t1 = dev_time(rt, d, n1, dn, 1, 0), t2 = dev_time(rt, d, n2, dn, 1, 0);
        double rate = 0;
        if (t2 > t1 && t1 > 0) rate = (double)(n2 - n1) / (t2 - t1);
        else if (t2 > 0) rate = (double)n2 / t2;   /* timer too coarse to split: the big size alone */
        /* a failure is already recorded; never leave the planner a zero rate */
        hw->dev_adam_elems_per_s = rate > 0 ? rate : hw->cpu_adam_elems_per_s;
        double to = dev_time(rt, d, 16, dn, OPS, 0);
        double op = to / OPS - 16.0 / hw->dev_adam_elems_per_s;
        hw->dev_op_s = op > 0 ? op : 0;
        double tm = dev_time(rt, d, 0, dn, 0, dn * 16);
        hw->dev_memset_Bps = tm > 0 ? (double)(dn * 16) / tm : 0;
        PT_LOGI(&rt->lg, "profiler: device AdamW %.3g elements/s, %.3g s per device op, memset "
                         "%.3g bytes/s", hw->dev_adam_elems_per_s, hw->dev_op_s,
                hw->dev_memset_Bps);
        swept_rate(rt, hw);
        probe_free(rt, d, rt->plan.prof->rc != 0);
    } else {
        /* no room at all: assume the CPU rate (the host backend runs the same loop) */
        hw->dev_adam_elems_per_s = hw->cpu_adam_elems_per_s;
        PT_LOGW(&rt->lg, "profiler: no device memory left to time the device AdamW; "
                         "assuming the CPU rate");
    }
}

void pt_prof_measure_hw(pt_rt *rt, pt_trace *t, int dtype) {
    measure_copies(rt, &t->hw);
    measure_adam(rt, t, dtype, &t->hw);
    measure_dev_adam(rt, &t->hw);
    measure_coll(rt, &t->hw);
}
