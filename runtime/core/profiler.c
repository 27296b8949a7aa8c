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
 * Then hardware rates: H2D/D2H over two sizes (the pool's slot and a quarter of
 * it), CPU AdamW elements/s on the worker pool, device AdamW elements/s.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_ext.h"
#include "optim/optim.h"
#include "profiler.h"


/* Timings are kept per pass: the first PROF_WARM passes warm caches, page
 * mappings, BLAS and the host's thread teams and are dropped; the trace takes
 * the median of the others per window. Two, because one was not enough: on a
 * 2-core VM (sample_host, 4 blocks) the second pass's forward still ran
 * 1.2-1.5x the later passes' in 13 of 14 processes (e.g. 11.4, 7.7, 8.1 ms),
 * and with it in a median of three the profile's compute came out slow. */
#define PROF_WARM 2
#define PROF_PASSES 7

/* Window edges of a pass: one event each, recorded on the compute stream. */
enum { E_XPF, E_EPO, E_XPB, E_EPB, E_FR0, E_FR1, E_FF0, E_FF1, E_RC0, E_RC1, E_PER_BLOCK };   /* [b] each */
enum { E_T0, E_PF0, E_HD0, E_HD1, E_EB0, E_END, E_GLOBAL };       /* after the blocks */

struct pt_prof {
    int n;
    int pass;                       /* current pass, 0-based */
    pt_event **ev;                  /* [E_PER_BLOCK * n + E_GLOBAL] */
    unsigned char *ev_set;          /* recorded in this pass */
    uint64_t c0;                    /* bytes at the current window's start */
    uint64_t head_c0;
    double *fwd, *bwd, *rec;        /* [PROF_PASSES][n] seconds */
    double *frb;                    /* [PROF_PASSES][n]: the free of the arena after
                                       the block's backward, E_FR0 .. E_FR1 */
    double *frf;                    /* [PROF_PASSES][n]: after its forward (every block
                                       is CKPT in the profile), E_FF0 .. E_FF1 */
    uint64_t *arena, *input, *fscr, *bscr;
    uint64_t nonblock, nonblock_scr;
    double embed_fwd[PROF_PASSES], embed_bwd[PROF_PASSES], head[PROF_PASSES];
    /* Fragmentation: every window resets the allocator's peak, so each window's
     * reading is folded in before the next reset. fr holds the reading of the
     * window with the highest peak; span the highest span of any window. */
    int win_open;
    pt_gpu_usage fr;
    uint64_t span;
    /* The first failed device op of the profile. The window marks run inside
     * block hooks that must not fail for the profiler's sake mid-pass, and a
     * missing edge would silently time a window as 0 s: the failure is kept
     * and returned by the next pt_prof_begin or by pt_prof_finish, both inside
     * the hook that runs the profile. */
    int rc;
    char why[200];
    /* mode C's collectives the store ran (seconds, bytes) when the measured
     * passes began */
    double cs0[3], cb0[3];
    /* between passes (sweep_between): the device AdamW over scratch as
     * optimizer_step runs it, its seconds after each pass that is not the first
     * (sweep_t[0..n_sweep)), over sweep_elems elements in sweep_launches
     * launches (each with its gradient memset) */
    double sweep_t[PROF_PASSES];
    int n_sweep, sweep_launches;
    uint64_t sweep_elems;
};

static void prof_failed_rc(struct pt_prof *p, int rc, const char *what) {
    if (p->rc) return;
    p->rc = rc;
    snprintf(p->why, sizeof p->why, "%s", what);
}
static void prof_failed(struct pt_prof *p, const char *what) {
    prof_failed_rc(p, PT_ERR_BACKEND, what);
}

static int prof_status(struct pt_prof *p, char *err, size_t errlen) {
    return p->rc ? pt_fail(err, errlen, p->rc, "profiler: %s", p->why) : PT_OK;
}

#define AT(arr, b) (arr)[(size_t)p->pass * (size_t)p->n + (size_t)(b)]


static uint64_t cur_bytes(pt_rt *rt) {
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->gpu, &u);
    return u.current;
}

static uint64_t peak_bytes(pt_rt *rt) {
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->gpu, &u);
    return u.peak;
}

static int ev_index(const struct pt_prof *p, int kind, int b) {
    return b >= 0 ? kind * p->n + b : E_PER_BLOCK * p->n + kind;
}

/* A window edge: the device's clock when the compute stream reaches this point. */
static void mark(pt_rt *rt, int kind, int b) {
    struct pt_prof *p = rt->prof;
    int i = ev_index(p, kind, b);
    if (!pt_gpu_ops(rt->gpu)->event_record(pt_gpu_impl(rt->gpu), p->ev[i], rt->s_compute))
        p->ev_set[i] = 1;
    else
        prof_failed(p, "event_record of a window edge on the compute stream failed");
}

/* Seconds between two edges of this pass (0 when either was not recorded). */
static double span(pt_rt *rt, int ka, int ba, int kb, int bb) {
    struct pt_prof *p = rt->prof;
    int a = ev_index(p, ka, ba), b = ev_index(p, kb, bb);
    float ms = 0.0f;
    if (!p->ev_set[a] || !p->ev_set[b]) return 0.0;
    if (pt_gpu_ops(rt->gpu)->event_elapsed_ms(pt_gpu_impl(rt->gpu), p->ev[a], p->ev[b], &ms)) {
        prof_failed(p, "event_elapsed_ms between two window edges failed");
        return 0.0;
    }
    return ms > 0 ? 1e-3 * (double)ms : 0.0;
}

/* The pass has been launched: wait for the device, turn its edges into times. */
static void resolve_pass(pt_rt *rt) {
    struct pt_prof *p = rt->prof;
    if (pt_gpu_ops(rt->gpu)->stream_sync(pt_gpu_impl(rt->gpu), rt->s_compute))
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
    struct pt_prof *p = rt->prof;
    if (!p->win_open) return;
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->gpu, &u);
    if (u.peak > p->fr.peak) p->fr = u;
    if (u.span_peak > p->span) p->span = u.span_peak;
}

static void window_start(pt_rt *rt) {
    fold_frag(rt);
    rt->prof->c0 = cur_bytes(rt);
    pt_gpu_reset_peak(rt->gpu);
    rt->prof->win_open = 1;
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

/* A timing buffer the profiler may do without: a request that does not fit
 * fails quietly (0 or -1, why in e), and leaves no record of an out-of-memory
 * that the run's error explanation (pt_rt_explain_oom) would otherwise
 * describe as the reason a later, unrelated failure happened. */
static int probe_alloc(pt_rt *rt, size_t bytes, int tag, void **d, char *e, size_t elen) {
    uint64_t tags[PT_TAG_COUNT];
    int had = pt_gpu_last_oom(rt->gpu, tags) != 0;
    if (!pt_gpu_alloc(rt->gpu, bytes, tag, d, e, elen)) return 0;
    *d = NULL;
    if (!had) pt_gpu_oom_reset(rt->gpu);
    return -1;
}

/* Gives a timing buffer back. After a failed op (failed != 0) the work queued
 * before it on the compute stream may still use the buffer: it goes back once
 * the stream is idle, or in the stream's order when even the wait fails. */
static void probe_free(pt_rt *rt, void *d, int failed) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
    char e[256];
    if (!failed || !ops->stream_sync(pt_gpu_impl(rt->gpu), rt->s_compute)) pt_gpu_free(rt->gpu, d);
    else pt_gpu_free_on_stream(rt->gpu, d, rt->s_compute, e, sizeof e);
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
 * The scratch lives only between the windows: the previous window's
 * fragmentation reading is folded in first and the next one resets the peak,
 * so the profile's memory figures never see it. No room for it (a nearly full
 * device) or nothing trainable: no sample. A failed op is recorded like any
 * other. */
static void sweep_between(pt_rt *rt, int timed) {
    struct pt_prof *p = rt->prof;
    fold_frag(rt);
    p->win_open = 0;
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
    if (probe_alloc(rt, (size_t)E * 16, PT_TAG_OTHER, &d, e, sizeof e)) return;
    const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
    void *impl = pt_gpu_impl(rt->gpu);
    pt_event *e0 = p->ev[E_PER_BLOCK * p->n + E_T0], *e1 = p->ev[E_PER_BLOCK * p->n + E_END];
    float *base = d;   /* [4][E]: param, grad, m, v */
    pt_adamw_args a = timing_adamw();
    const char *bad = NULL;
    if (ops->memset_async(impl, d, 0, (size_t)E * 16, rt->s_compute)) bad = "memset";
    if (!bad && ops->event_record(impl, e0, rt->s_compute)) bad = "event_record";
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
        if (ops->adamw(impl, &a, rt->s_compute)) bad = "adamw";
        else if (ops->memset_async(impl, base + E + off, 0, (size_t)n * 4, rt->s_compute)) bad = "memset";
        off += n;
    }
    float ms = 0;
    if (!bad && ops->event_record(impl, e1, rt->s_compute)) bad = "event_record";
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

int pt_prof_passes(void) { return PROF_PASSES; }

int pt_prof_begin(pt_rt *rt, char *err, size_t errlen) {
    if (rt->prof) {                  /* a further pass: keep the earlier passes' timings */
        struct pt_prof *p = rt->prof;
        resolve_pass(rt);
        /* the first sweep warms up (page mappings of the scratch); none after a
         * failure (this begin returns it) */
        if (!p->rc && p->n_sweep < PROF_PASSES) sweep_between(rt, p->pass > 0);
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
        rt->prof = p;
        pt_prof_free(rt);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    p->n = rt->n_blocks;
    rt->prof = p;
    pt_store_coll_seconds(rt->st, p->cs0);
    pt_store_coll_bytes(rt->st, p->cb0);
    for (int i = 0; i < E_PER_BLOCK * p->n + E_GLOBAL; i++)
        if (pt_gpu_event_create_timing(rt->gpu, &p->ev[i])) {
            pt_prof_free(rt);
            return pt_fail(err, errlen, PT_ERR_BACKEND, "profiler: event_create failed: cannot create device events");
        }
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->gpu, &u);
    /* what the host holds outside blocks (inputs, residual streams, logits, scratch)
     * and the plugin's own small device buffers (norm accumulator) */
    p->nonblock = u.tag_current[PT_TAG_ACT] + u.tag_current[PT_TAG_SCRATCH] +
                  u.tag_current[PT_TAG_HOSTUSE] + u.tag_current[PT_TAG_OTHER];
    mark(rt, E_T0, -1);
    window_start(rt);
    return prof_status(p, err, errlen);
}

void pt_prof_free(pt_rt *rt) {
    struct pt_prof *p = rt->prof;
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
        if (p->ev[i]) pt_gpu_ops(rt->gpu)->event_destroy(pt_gpu_impl(rt->gpu), p->ev[i]);
    free(p->ev);
    free(p->ev_set);
    free(p);
    rt->prof = NULL;
}

static void nonblock_window_end(pt_rt *rt) {
    struct pt_prof *p = rt->prof;
    uint64_t pk = peak_bytes(rt);
    if (pk > p->c0 && pk - p->c0 > p->nonblock_scr) p->nonblock_scr = pk - p->c0;
}

void pt_prof_hook(pt_rt *rt, int which, int32_t b, int exit) {
    struct pt_prof *p = rt->prof;
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
    struct pt_prof *p = rt->prof;
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

/* ---- hardware rates ---- */

/* Median of three timed copies of `bytes`, as bytes/s (0 after a failure, which
 * is kept in the profile's status). */
static double copy_rate(pt_rt *rt, void *dev, void *host, size_t bytes, int kind) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
    pt_stream *s = kind == PT_GPU_H2D ? rt->s_h2d : rt->s_d2h;
    double dt[3];
    for (int r = 0; r < 3; r++) {
        double t0 = pt_now_s();
        void *d = kind == PT_GPU_H2D ? dev : host;
        const void *src = kind == PT_GPU_H2D ? host : dev;
        if (pt_gpu_memcpy_async(rt->gpu, d, src, bytes, kind, s)) {
            prof_failed(rt->prof, "memcpy timing a copy rate failed");
            return 0;
        }
        if (ops->stream_sync(pt_gpu_impl(rt->gpu), s)) {
            prof_failed(rt->prof, "stream_sync timing a copy rate failed");
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
    const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
    void *impl = pt_gpu_impl(rt->gpu);
    pt_stream *s = kind == PT_GPU_H2D ? rt->s_h2d : rt->s_d2h;
    pt_event *e0 = NULL, *e1 = NULL, *ec = NULL;
    if (pt_gpu_event_create_timing(rt->gpu, &e0) || pt_gpu_event_create_timing(rt->gpu, &e1) ||
        ops->event_create(impl, &ec)) {
        prof_failed(rt->prof, "event_create timing a copy latency failed");
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
        if (ops->event_record(impl, e0, rt->s_compute)) op = "event_record";
        else if (ops->stream_wait_event(impl, s, e0)) op = "stream_wait_event";
        else if (pt_gpu_memcpy_async(rt->gpu, d, src, bytes, kind, s)) op = "memcpy";
        else if (ops->event_record(impl, ec, s)) op = "event_record";
        else if (ops->stream_wait_event(impl, rt->s_compute, ec)) op = "stream_wait_event";
        else if (ops->event_record(impl, e1, rt->s_compute)) op = "event_record";
        else if (ops->event_sync(impl, e1)) op = "event_sync";
        else if (ops->event_elapsed_ms(impl, e0, e1, &ms)) op = "event_elapsed_ms";
        if (op) {
            char why[128];
            snprintf(why, sizeof why, "%s timing a copy latency failed", op);
            prof_failed(rt->prof, why);
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
    struct pt_prof *p = rt->prof;
    size_t bytes = (size_t)(2 * pt_store_chunk_size(rt->st));
    for (int b = 0; b < p->n; b++)
        if (p->arena[b] > bytes) bytes = (size_t)p->arena[b];
    if (bytes < 65536) bytes = 65536;
    void *dev = NULL, *host = NULL;
    char e[256];
    int own = 0;
    if (!probe_alloc(rt, bytes, PT_TAG_OTHER, &dev, e, sizeof e)) {
        own = 1;
    } else {
        /* no room for a block that size: time with an idle pool slot */
        uint64_t sb = 0;
        if (pt_store_borrow_slot(rt->st, &dev, &sb)) bytes = (size_t)sb;
    }
    int prc = dev ? pt_gpu_pinned_alloc(rt->gpu, bytes, &host, e, sizeof e) : PT_ERR_OOM;
    if (prc) {
        /* without a buffer the rates would stay 0 and the profile be refused
         * later with a sentence that does not say why */
        char why[200];
        if (dev) snprintf(why, sizeof why, "timing the copy rates needs %zu pinned bytes: %.140s", bytes, e);
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
            const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
            (void)ops->stream_sync(pt_gpu_impl(rt->gpu), rt->s_h2d);
            (void)ops->stream_sync(pt_gpu_impl(rt->gpu), rt->s_d2h);
        }
        pt_gpu_pinned_free(rt->gpu, host);
    }
    if (own) pt_gpu_free(rt->gpu, dev);
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
    if (!rt->coll || pt_coll_world(rt->coll) < 2 || rt->prof->rc) return;
    size_t bytes = (size_t)pt_store_chunk_size(rt->st), n = bytes / 4 ? bytes / 4 : 1;
    float *buf = NULL, *dbuf = NULL;
    if (strcmp(pt_gpu_backend_name(rt->gpu), "host")) {
        char why[256];
        if (probe_alloc(rt, n * 4, PT_TAG_SCRATCH, (void **)&dbuf, why, sizeof why)) {
            dbuf = NULL;
            PT_LOGW(&rt->lg, "profiler: timing the collectives on a host buffer (a device "
                             "buffer of one chunk did not fit: %s)", why);
        }
    }
    buf = dbuf ? dbuf : calloc(n, 4);
    if (!buf) {
        prof_failed(rt->prof, "out of host memory timing the collectives");
        return;
    }
    double W = pt_coll_world(rt->coll), bus[3] = {2 * (W - 1) / W, (W - 1) / W, (W - 1) / W};
    double *rate[3] = {&hw->allreduce_Bps, &hw->allgather_Bps, &hw->reduce_scatter_Bps};
    static const char *const name[3] = {"all-reduce", "all-gather", "reduce-scatter"};
    char e[512];
    for (int k = 0; k < 3 && !rt->prof->rc; k++) {
        double dt[4];
        for (int r = 0; r < 4; r++) {
            double t0 = pt_now_s();
            int rc = k == 0 ? pt_coll_allreduce(rt->coll, buf, n, PT_COLL_F32, 1.0, name[k], e, sizeof e)
                   : k == 1 ? pt_coll_allgather(rt->coll, buf, n, 4, name[k], e, sizeof e)
                            : pt_coll_reduce_scatter(rt->coll, buf, n, PT_COLL_F32, 1.0, name[k], e,
                                                     sizeof e);
            if (rc) {
                char why[200];
                snprintf(why, sizeof why, "timing the %s failed: %.150s", name[k], e);
                prof_failed(rt->prof, why);
                break;
            }
            dt[r] = pt_now_s() - t0;
        }
        if (rt->prof->rc) break;
        double med = pt_median(dt + 1, 3);   /* the first is a warm-up */
        *rate[k] = med > 0 ? (double)(n * 4) * bus[k] / med : 0;
    }
    double cs[3], cb[3];
    pt_store_coll_seconds(rt->st, cs);
    pt_store_coll_bytes(rt->st, cb);
    for (int k = 1; k < 3 && !rt->prof->rc; k++) {
        double ds = cs[k] - rt->prof->cs0[k], db = cb[k] - rt->prof->cb0[k];
        if (ds <= 0 || db <= 0) continue;
        double seen = db * bus[k] / ds;
        PT_LOGI(&rt->lg, "profile: %s at %.1f MB/s bus back to back, %.1f MB/s in the profiled "
                         "passes (waits for the other ranks included)%s", name[k],
                *rate[k] / 1e6, seen / 1e6, seen < *rate[k] ? ": the cost model uses the latter" : "");
        if (seen < *rate[k]) *rate[k] = seen;
    }
    if (dbuf) pt_gpu_free(rt->gpu, dbuf);
    else free(buf);
}

/* Seconds on the compute stream, the best of 3, from timed events around the
 * work: `launches` back-to-back device AdamWs over n elements each, or (when
 * fill > 0) one memset of fill bytes. d holds 4 arrays of stride floats
 * (param, grad, m, v). 0 when the events or the work failed (recorded). */
static double dev_time(pt_rt *rt, void *d, size_t n, size_t stride, int launches, size_t fill) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
    void *impl = pt_gpu_impl(rt->gpu);
    pt_event *e0 = NULL, *e1 = NULL;
    if (pt_gpu_event_create_timing(rt->gpu, &e0) || pt_gpu_event_create_timing(rt->gpu, &e1)) {
        prof_failed(rt->prof, "event_create timing the device optimizer failed");
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
    for (int r = 0; r < 3 && !rt->prof->rc; r++) {
        float ms = 0;
        const char *op = NULL;
        if (ops->event_record(impl, e0, rt->s_compute)) op = "event_record";
        for (int k = 0; !op && fill == 0 && k < launches; k++)
            if (ops->adamw(impl, &a, rt->s_compute)) op = "adamw";
        if (!op && fill && ops->memset_async(impl, d, 0, fill, rt->s_compute)) op = "memset";
        if (!op && ops->event_record(impl, e1, rt->s_compute)) op = "event_record";
        if (!op && ops->event_sync(impl, e1)) op = "event_sync";
        if (!op && ops->event_elapsed_ms(impl, e0, e1, &ms)) op = "event_elapsed_ms";
        if (op) {
            char why[128];
            snprintf(why, sizeof why, "%s timing the device optimizer failed", op);
            prof_failed(rt->prof, why);
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
                        prof_failed(rt->prof, why);
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
    struct pt_prof *p = rt->prof;
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
    while (dn >= 4096 && probe_alloc(rt, dn * 16, PT_TAG_OTHER, &d, e, sizeof e)) dn /= 4;
    if (d) {
        const pt_gpu_backend *ops = pt_gpu_ops(rt->gpu);
        void *impl = pt_gpu_impl(rt->gpu);
        if (ops->memset_async(impl, d, 0, dn * 16, NULL))
            prof_failed(rt->prof, "memset of the device AdamW timing buffer failed");
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
        probe_free(rt, d, rt->prof->rc != 0);
    } else {
        /* no room at all: assume the CPU rate (the host backend runs the same loop) */
        hw->dev_adam_elems_per_s = hw->cpu_adam_elems_per_s;
        PT_LOGW(&rt->lg, "profiler: no device memory left to time the device AdamW; "
                         "assuming the CPU rate");
    }
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
    struct pt_prof *p = rt->prof;
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
    return rt->coll && rt->cfg.tp_size > 1 ? rt->cfg.tp_size : 1;
}

static uint64_t measured_inputs(pt_rt *rt) {
    const pt_config *c = &rt->cfg;
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->gpu, &u);
    struct {
        uint64_t chunk, chunk_cfg, capacity;
        double copy_bw, jitter;
        int32_t optim, osft, tiled, tiles, async, tp;
        float osft_ratio;
    } in;
    memset(&in, 0, sizeof in);   /* padding hashed as zeros */
    in.chunk = rt->st ? pt_store_chunk_size(rt->st) : 0;
    in.chunk_cfg = c->chunk_size;
    in.capacity = u.capacity;
    in.copy_bw = c->copy_bandwidth;
    in.jitter = c->compute_jitter;
    in.optim = c->optim_type;
    in.osft = c->osft_enabled;
    in.tiled = c->tiled_mlp_enabled;
    in.tiles = c->tiled_mlp_tiles;
    in.async = c->async_compute;
    in.tp = tp_size(rt);   /* a split param's chunk holds its shard */
    in.osft_ratio = c->osft_urr;
    const char *be = pt_gpu_backend_name(rt->gpu);
    uint64_t h = pt_fnv1a64(&in, sizeof in);
    h ^= pt_fnv1a64(be, strlen(be)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= pt_fnv1a64(c->osft_targets, strlen(c->osft_targets)) + (h << 6) + (h >> 2);
    return h;
}

void pt_prof_key(pt_rt *rt, pt_trace_key *k) {
    memset(k, 0, sizeof *k);
    pt_gpu_device_name(rt->gpu, k->device, sizeof k->device);
    k->batch = rt->model->batch;
    k->seq = rt->model->seq;
    k->world_size = rt->host.world_size > 0 ? rt->host.world_size : 1;
    k->version = PT_TRACE_VERSION;
    uint64_t m = measured_inputs(rt);
    k->arch_hash = pt_store_arch_hash(rt->model, &rt->cfg) ^ (m + 0x9e3779b97f4a7c15ull);
}

int pt_prof_finish(pt_rt *rt, pt_trace *t, char *err, size_t errlen) {
    struct pt_prof *p = rt->prof;
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
    pt_rekls_rates rk;
    int rk_have = 0;
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
        tc->rekls_bytes = ci.rekls_bytes;
        tc->tp_grad_bytes = ci.rekls_tp_grad_bytes;
        tc->tp_factor_bytes = ci.rekls_tp_factor_bytes;
        tc->rekls_aux_words = ci.rekls_aux_words;
        tc->rekls_mn = ci.rekls_mn;
        tc->rekls_own_max = ci.rekls_own_max;
        if (ci.rekls_params > 0) {   /* REKLS's CPU step time, from its own probes */
            if (!rk_have) pt_rekls_measure_rates(&rk), rk_have = 1;
            tc->rekls_s = pt_rekls_predict_s(&rk, ci.rekls_params, ci.rekls_gemm_flops,
                                             ci.rekls_eigh_flops);
        }
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
    measure_copies(rt, &t->hw);
    measure_adam(rt, t, dt, &t->hw);
    measure_dev_adam(rt, &t->hw);
    measure_coll(rt, &t->hw);
    if ((rc = prof_status(p, err, errlen))) return rc;
    t->hw.copy_engines = 2;
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->gpu, &u);
    t->hw.device_capacity = u.capacity;
    t->hw.host_ram_bytes = rt->cfg.pinned_budget;
    return pt_trace_validate(t, err, errlen);
}
