/*
 * test_cost_model.c — runtime/cost_model.h: exact numbers on a 2-block trace
 * computed by hand from the formulas in the header, then the monotonicity
 * properties the searcher relies on, swept over a larger synthetic trace.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "planner/cost_model.h"
#include "planner/placement.h"
#include "protrain.h"
#include "planner/trace_cache.h"

/* Uniform synthetic trace: optional mandatory first/last chunk, cpb chunks per block. */
typedef struct synth {
    int n_block, cpb, mand_first, mand_last, engines;
    uint64_t chunk_bytes, arena, input, fscr, bscr, gact;
    double fwd, bwd, h2d, d2h, cpu, dev, tf;
    double fr;   /* hw.free_Bps (0: frees cost nothing) */
} synth;

static void build(pt_trace *t, const synth *s) {
    pt_trace_init(t);
    int K = s->n_block * s->cpb + s->mand_first + s->mand_last;
    assert_int_equal(pt_trace_alloc(t, s->n_block, K, NULL, 0), PT_OK);
    int k = 0;
    uint64_t el = s->chunk_bytes / 2;
    if (s->mand_first) t->chunks[k++] = (pt_trace_chunk){s->chunk_bytes, el, el, -1, -1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < s->n_block; b++)
        for (int j = 0; j < s->cpb; j++)
            t->chunks[k++] = (pt_trace_chunk){s->chunk_bytes, el, (uint64_t)(s->tf * (double)el), b, b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (s->mand_last) t->chunks[k++] = (pt_trace_chunk){s->chunk_bytes, el, el, -1, -1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < s->n_block; b++)
        t->blocks[b] = (pt_trace_block){s->fwd, s->bwd, s->fwd, s->arena, s->input, s->fscr, s->bscr, s->gact, 0, 0};
    pt_trace_derive_ranges(t);
    t->chunk_size = s->chunk_bytes;
    t->param_elem_bytes = 2;
    t->grad_elem_bytes = 2;
    t->master_elem_bytes = 4;
    t->adam_m_elem_bytes = t->adam_v_elem_bytes = 4;
    t->host_grad_elem_bytes = 4;
    t->slot_bytes = 2 * s->chunk_bytes;
    t->hw = (pt_trace_hw){s->h2d, s->d2h, s->cpu, s->dev, 0, s->engines, 0, 0, 1ull << 40, 0, 0, 0, 0, 0, 0, s->fr, 0};
    t->key.world_size = 1;
    t->key.version = PT_TRACE_VERSION;
}

/* The 2-block trace of the hand computations below. */
static void tiny(pt_trace *t) {
    synth s = {.n_block = 2, .cpb = 1, .engines = 2, .chunk_bytes = 100, .arena = 1000, .input = 10, .fscr = 5, .bscr = 7, .gact = 20, .fwd = 1.0, .bwd = 2.0, .h2d = 100, .d2h = 50, .cpu = 25, .dev = 100, .tf = 1};
    build(t, &s);
    t->nonblock_bytes = 3;
    t->nonblock_scratch_bytes = 1;
    t->embed_fwd_s = 0.1;
    t->embed_bwd_s = 0.2;
    t->head_fwd_s = 0.3;
    t->head_bwd_s = 0.4;
}

/* cmocka here has no assert_double_equal: compare with a bound on rounding
 * of a handful of additions (no model tolerance involved). */
#define EPS 1e-9
#define assert_double_equal(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

/* One rank, no clipping: the cost of knobs k on trace t (a context of its own). */
static pt_cost hand_cost(const pt_trace *t, pt_knobs k) {
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(t, &cx, err, sizeof err), PT_OK);
    pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    pt_cost c;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    pt_cost_ctx_free(cx);
    return c;
}

/* Two ranks, every chunk resident: the all-reduce by hand. Each chunk's
 * gradient (50 fp32 elements, 200 bytes) takes 200 * 2(W-1)/W / rate. In
 * buckets chunk 1 starts when block 1's backward ends (head 0.7 + 2 = 2.7) and
 * chunk 0 when block 0's ends (4.7) or when chunk 1's is done, whichever is
 * later; backward ends at 4.9 (embedding 0.2), and only what outlasts it is
 * charged. Without buckets both follow backward. */
static void test_hand_buckets(void **state) {
    (void)state;
    static const struct {
        double rate, on, off;
    } cases[] = {
        /* 0.4 s per chunk: 2.7 + 0.4 = 3.1; max(3.1, 4.7) + 0.4 = 5.1 -> 0.2 */
        {500, 0.2, 0.8},
        /* 2 s per chunk: 2.7 + 2 = 4.7; max(4.7, 4.7) + 2 = 6.7 -> 1.8 (queued) */
        {100, 1.8, 4.0},
        /* 0.1 s per chunk: all hidden */
        {2000, 0.0, 0.2},
    };
    /* mand = 1: chunk 1 is resident by force (as an oversize chunk is) and
     * still a bucket of block 1; the same times */
    for (size_t i = 0; i < 2 * sizeof cases / sizeof cases[0]; i++) {
        int mand = i >= sizeof cases / sizeof cases[0];
        size_t ci = i % (sizeof cases / sizeof cases[0]);
        pt_trace t;
        tiny(&t);
        if (mand) t.chunks[1].mandatory = 1;
        t.key.world_size = 2;
        t.hw.allreduce_Bps = cases[ci].rate;
        pt_cost_ctx *cx;
        char err[256];
        assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
        pt_knobs k = {2, 0, 0, 0};
        pt_cost on, off;
        pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
        assert_int_equal(pt_cost_eval(cx, &o, &k, &on, err, sizeof err), PT_OK);
        o.overlap_ar = 0;
        assert_int_equal(pt_cost_eval(cx, &o, &k, &off, err, sizeof err), PT_OK);
        assert_double_equal(on.bwd_s, 4.9, EPS);
        assert_double_equal(on.allreduce_s, cases[ci].on, EPS);
        assert_double_equal(off.allreduce_s, cases[ci].off, EPS);
        /* the iteration carries exactly the difference */
        assert_double_equal(off.iter_s - on.iter_s, cases[ci].off - cases[ci].on, EPS);
        /* mode B (chunk 1 offloaded, a bucket once its copy lands): never more
         * than all of it after backward, which is exactly 4 * 100 elements */
        if (!mand) {
            pt_knobs kb = {1, 1, 0, 0};
            o.overlap_ar = 1;
            assert_int_equal(pt_cost_eval(cx, &o, &kb, &on, err, sizeof err), PT_OK);
            o.overlap_ar = 0;
            assert_int_equal(pt_cost_eval(cx, &o, &kb, &off, err, sizeof err), PT_OK);
            assert_double_equal(off.allreduce_s, 400.0 / cases[ci].rate, EPS);
            assert_true(on.allreduce_s <= off.allreduce_s + EPS);
            assert_true(on.allreduce_s >= 0);
        }
        pt_cost_ctx_free(cx);
        pt_trace_free(&t);
    }
}

/* Tensor parallel, every chunk resident (the tiny trace's two chunks, 50
 * trainable elements each: this rank's shards, 400 fp32 gradient bytes in all).
 * All-reduce at rate 500 over the replicas of the shards, D = W / P of them:
 *   W 4, P 2: D 2, 400 * 2(D-1)/D / 500 = 0.8 s   (over all 4 ranks: 1.2 s)
 *   W 2, P 2: D 1, none                            (over both ranks: 0.8 s)
 *   W 4, P 4: D 1, none                            (1.2 s)
 * REKLS gathers: each chunk's split param is 10 x 10 in full, tp_grad_bytes
 * 400 and tp_factor_bytes 4 (100 + 100) = 800, 2400 bytes in all per step
 * (3200 with l2 decay: the weights' 800 more), at the all-gather rate 300:
 * 2400 (P-1)/P / 300 = 4 s for P = 2, 6 s for P = 4 (l2: 5.333.. s, 8 s).
 * The iteration (every rank: CPU steps after backward) is fwd 2.1 + bwd 4.9 +
 * the collectives + device Adam 1.0. The old formula (all-reduce over the
 * world, no gathers) gives other numbers in every case; buckets
 * (overlap_allreduce) are off under tensor parallel whatever the option. */
static void test_tp_terms(void **state) {
    (void)state;
    static const struct {
        int W, P, l2;
        double ar, tg;
    } cases[] = {
        {4, 2, 0, 0.8, 4.0}, {4, 2, 1, 0.8, 3200.0 / 600.0}, {2, 2, 0, 0.0, 4.0}, {4, 4, 0, 0.0, 6.0}, {4, 4, 1, 0.0, 8.0}, {4, 1, 0, 1.2, 0.0},   /* control: no tensor parallel, the old terms */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pt_trace t;
        tiny(&t);
        t.key.world_size = cases[i].W;
        t.tp_size = cases[i].P;
        t.hw.allreduce_Bps = 500;
        t.hw.allgather_Bps = 300;
        if (cases[i].P > 1)
            for (int k = 0; k < 2; k++) {
                t.chunks[k].tp_grad_bytes = 400;
                t.chunks[k].tp_factor_bytes = 800;
            }
        pt_cost_ctx *cx;
        char err[256];
        assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
        pt_knobs k = {2, 0, 0, 0};
        for (int ov = 0; ov < 2; ov++) {
            pt_cost c;
            pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, ov, cases[i].l2, 0, 0, 0, 0, 0, 0};
            assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
            if (ov && cases[i].P == 1) {   /* buckets hide part of it without tensor parallel */
                assert_true(c.allreduce_s < cases[i].ar - 0.1);
                continue;
            }
            assert_double_equal(c.allreduce_s, cases[i].ar, EPS);
            assert_double_equal(c.tp_gather_s, cases[i].tg, EPS);
            assert_double_equal(c.iter_s, 8.0 + cases[i].ar + cases[i].tg, EPS);
            assert_int_equal(c.schedule, PT_SCHED_AFTER_BWD);
        }
        /* without a measured all-gather rate the gathers are not modelled */
        t.hw.allgather_Bps = 0;
        pt_cost_ctx *c0;
        assert_int_equal(pt_cost_ctx_new(&t, &c0, err, sizeof err), PT_OK);
        pt_cost c;
        pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, 0, cases[i].l2, 0, 0, 0, 0, 0, 0};
        assert_int_equal(pt_cost_eval(c0, &o, &k, &c, err, sizeof err), PT_OK);
        assert_double_equal(c.tp_gather_s, 0.0, EPS);
        pt_cost_ctx_free(c0);
        pt_cost_ctx_free(cx);
        pt_trace_free(&t);
    }
}

static void test_hand_all_resident(void **state) {
    (void)state;
    pt_trace t;
    tiny(&t);
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    pt_knobs k = {2, 0, 0, 0};
    pt_cost c;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    /* persistent chunk: 100 param bytes + 50 elems * (2 grad + 4 master + 4 m + 4 v) = 800 */
    assert_int_equal(c.model_state_bytes, 1600);
    assert_int_equal(c.buffer_bytes, 0);
    /* peak window: backward of block 1 = inputs 20 + block 0 arena 1000 + own
     * arena 1000 + grad_act 20 (activations) + bwd scratch 7 */
    assert_int_equal(c.activation_bytes, 2040);
    assert_int_equal(c.scratch_bytes, 7);
    assert_int_equal(c.peak_phase, PT_PHASE_BWD);
    assert_int_equal(c.peak_block, 1);
    assert_int_equal(c.raw_peak_bytes, 1600 + 3 + 2047);
    assert_int_equal(c.peak_bytes, 3650);
    assert_int_equal(c.host_bytes, 0);
    /* time: fwd 0.1 + 1 + 1; bwd 0.7 + 2 + 2 + 0.2; device Adam 100 / 100 */
    assert_double_equal(c.fwd_s, 2.1, EPS);
    assert_double_equal(c.bwd_s, 4.9, EPS);
    assert_double_equal(c.dev_adam_s, 1.0, EPS);
    assert_double_equal(c.iter_s, 8.0, EPS);
    assert_double_equal(c.exposed_xfer_s, 0.0, EPS);
    assert_int_equal(c.schedule, PT_SCHED_OVERLAP);
    /* fragmentation multiplies the whole raw peak, rounded up */
    o.frag = 1.1;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_int_equal(c.peak_bytes, (uint64_t)ceil(1.1 * 3650));
    pt_cost_ctx_free(cx);
    pt_trace_free(&t);
}

/* REKLS: a chunk's optim_s is added to the CPU optimizer time when the chunk is
 * offloaded and to the device optimizer time when resident; its optim_bytes
 * (already inside the footprints, here given only by the formulas) shows in
 * the REKLS figures of the side it lives on. The AdamW-only trace is the
 * control: every difference below is exactly the REKLS term. */
static void test_rekls_terms(void **state) {
    (void)state;
    for (int q = 0; q < 4; q++) {
        int p = (q & 1) * 2, defer = q >> 1;
        pt_trace t0, t1;
        tiny(&t0);
        tiny(&t1);
        t1.chunks[0].optim_s = 0.25;
        t1.chunks[1].optim_s = 0.5;
        t1.chunks[0].optim_bytes = t1.chunks[1].optim_bytes = 100;
        pt_cost_ctx *c0, *c1;
        char err[256];
        assert_int_equal(pt_cost_ctx_new(&t0, &c0, err, sizeof err), PT_OK);
        assert_int_equal(pt_cost_ctx_new(&t1, &c1, err, sizeof err), PT_OK);
        /* clipping: optimizer after backward, or deferred into the next forward */
        pt_cost_opts o = {1.0, 0, 0, 1, 0, defer, 0, 0, 0, 0, 0, 0, 0, 0};
        pt_knobs k = {p, p == 2 ? 0 : 2, 0, 0};
        pt_cost a, b;
        assert_int_equal(pt_cost_eval(c0, &o, &k, &a, err, sizeof err), PT_OK);
        assert_int_equal(pt_cost_eval(c1, &o, &k, &b, err, sizeof err), PT_OK);
        assert_double_equal(a.optim_s, 0, EPS);
        assert_double_equal(b.optim_s, 0.75, EPS);
        assert_double_equal(b.cpu_adam_s - a.cpu_adam_s, p == 0 ? 0.75 : 0, EPS);
        assert_double_equal(b.dev_adam_s - a.dev_adam_s, p == 2 ? 0.75 : 0, EPS);
        /* deferred, the offloaded REKLS work may hide behind the next forward, but
         * not all 0.75 s of it behind this one's compute */
        if (defer && p == 0) assert_true(b.iter_s > a.iter_s && b.iter_s <= a.iter_s + 0.75 + EPS);
        else assert_true(b.iter_s > a.iter_s);
        assert_true(b.optim_dev_bytes == (p == 2 ? 200u : 0u));
        assert_true(b.optim_host_bytes == (p == 0 ? 200u : 0u));
        assert_true(b.model_state_bytes - a.model_state_bytes == (p == 2 ? 200u : 0u));
        pt_cost_ctx_free(c0);
        pt_cost_ctx_free(c1);
        pt_trace_free(&t0);
        pt_trace_free(&t1);
    }
    /* a negative or non-finite optim_s is refused by the trace check */
    pt_trace t;
    tiny(&t);
    t.chunks[0].optim_s = -1;
    char err[256];
    pt_cost_ctx *cx = NULL;
    assert_int_not_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    assert_non_null(strstr(err, "optim_s"));
    pt_trace_free(&t);
}

/* Mode C with REKLS by hand (runtime/planner/cost_rekls.c). Two ranks, both
 * chunks offloaded. Chunk 0 holds one REKLS param with 40 aux words and m n = 5
 * (its owner keeps 40 + 2 x 5 = 50 words), chunk 1 one with 60 and 10 (80).
 * Replicated pinned bytes H = 2 x 900 + 4 x 100 (the factors, in the formula
 * through optim_bytes) = 2200, of which A = 400 are the factors; per rank:
 * ceil((2200 - 400) / 2) = 900 of parts, plus the owner bound
 * 4 (ceil(130 / 2) + 80) = 580: 1480. Without REKLS: ceil(1800 / 2) = 900.
 * Time: the owners' steps (0.75 s over 2 ranks) and the exchange, 8 x 15 bytes
 * at the all-gather's 0.5 / 1000 s per byte = 0.06 s, are exposed: the
 * iteration grows by exactly 0.435 s, deferred or not. Mode B charges no
 * exchange. */
static void test_rekls_shard(void **state) {
    (void)state;
    for (int defer = 0; defer < 2; defer++) {
        pt_trace t0, t1;
        tiny(&t0);
        tiny(&t1);
        pt_trace *ts[2] = {&t0, &t1};
        for (int i = 0; i < 2; i++) {
            ts[i]->key.world_size = 2;
            ts[i]->hw.allgather_Bps = ts[i]->hw.reduce_scatter_Bps = 1000;
        }
        t1.chunks[0].optim_s = 0.25;
        t1.chunks[1].optim_s = 0.5;
        t1.chunks[0].optim_aux_words = 40;
        t1.chunks[0].optim_mn = 5;
        t1.chunks[0].optim_own_max = 50;
        t1.chunks[1].optim_aux_words = 60;
        t1.chunks[1].optim_mn = 10;
        t1.chunks[1].optim_own_max = 80;
        t1.chunks[0].optim_bytes = 160;
        t1.chunks[1].optim_bytes = 240;
        pt_cost_ctx *c0, *c1;
        char err[256];
        assert_int_equal(pt_cost_ctx_new(&t0, &c0, err, sizeof err), PT_OK);
        assert_int_equal(pt_cost_ctx_new(&t1, &c1, err, sizeof err), PT_OK);
        pt_cost_opts o = {1.0, 0, 0, 1, 1, defer, 0, 0, 0, 0, 0, 0, 0, 0};
        pt_knobs k = {0, 2, 0, 0};
        pt_cost a, b;
        assert_int_equal(pt_cost_eval(c0, &o, &k, &a, err, sizeof err), PT_OK);
        assert_int_equal(pt_cost_eval(c1, &o, &k, &b, err, sizeof err), PT_OK);
        assert_int_equal(a.host_bytes, 900);
        assert_int_equal(b.host_bytes, 1480);
        assert_int_equal(b.optim_host_bytes, 580);
        assert_double_equal(b.optim_xchg_s, 0.06, EPS);
        assert_double_equal(a.optim_xchg_s, 0, EPS);
        assert_double_equal(b.iter_s - a.iter_s, 0.375 + 0.06, EPS);
        /* mode B: the whole state on every rank, no exchange */
        o.shard = 0;
        assert_int_equal(pt_cost_eval(c1, &o, &k, &b, err, sizeof err), PT_OK);
        assert_int_equal(b.host_bytes, 2200);
        assert_double_equal(b.optim_xchg_s, 0, EPS);
        pt_cost_ctx_free(c0);
        pt_cost_ctx_free(c1);
        pt_trace_free(&t0);
        pt_trace_free(&t1);
    }
    /* one param's state larger than its chunk's sum: refused by the trace check */
    pt_trace t;
    tiny(&t);
    t.chunks[0].optim_aux_words = 10;
    t.chunks[0].optim_mn = 1;
    t.chunks[0].optim_own_max = 13;
    char err[256];
    pt_cost_ctx *cx = NULL;
    assert_int_not_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    assert_non_null(strstr(err, "REKLS words"));
    pt_trace_free(&t);
}

static void test_hand_streamed(void **state) {
    (void)state;
    pt_trace t;
    tiny(&t);
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    assert_int_equal(pt_cost_buffer_min(cx, 0), 2);   /* chunks of blocks 0 and 1 */
    assert_int_equal(pt_cost_buffer_min(cx, 1), 1);
    assert_int_equal(pt_cost_buffer_min(cx, 2), 0);
    assert_int_equal(pt_cost_buffer_min_block(cx, 0), 1);   /* one chunk per block */
    assert_int_equal(pt_cost_buffer_min_block(cx, 1), 1);
    assert_int_equal(pt_cost_buffer_min_block(cx, 2), 0);
    pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    pt_knobs k = {0, 2, 0, 0};
    pt_cost c;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    /* forward: nothing prefetches block 0, so its gather waits 1 s for its
     * 100-byte upload at 100 B/s; block 0's 1 s of compute hides block 1's
     * prefetch: 0.1 + (1 + 1) + 1 */
    assert_double_equal(c.fwd_s, 3.1, EPS);
    assert_int_equal(c.h2d_sync_bytes, 100);
    assert_double_equal(c.sync_xfer_s, 1.0, EPS);
    /* backward: turn 0.7, block 1: 2 (both chunks cached), block 0: max(2,
     * grad D2H 100 B / 50 B/s = 2), embedding: max(0.2, 2) */
    assert_double_equal(c.bwd_s, 6.7, EPS);
    /* CPU Adam 2 s per chunk: chunk 1 lands at 4.7 -> 6.7, chunk 0 at 6.7 -> 8.7 */
    assert_double_equal(c.iter_s, 3.1 + 8.7, EPS);
    assert_double_equal(c.cpu_finish_s, 8.7, EPS);
    /* exposed: block 0's sync 1 s, embedding backward's D2H 2 - 0.2 */
    assert_double_equal(c.exposed_xfer_s, 1.0 + 1.8, EPS);
    assert_double_equal(c.cpu_adam_s, 4.0, EPS);
    assert_int_equal(c.h2d_bytes, 200);
    assert_int_equal(c.d2h_bytes, 200);
    assert_int_equal(c.model_state_bytes, 0);
    assert_int_equal(c.buffer_bytes, 400);
    assert_int_equal(c.peak_bytes, 400 + 3 + 2047);
    /* host: 100 staged + 50 * (4 grad + 4 master + 4 m + 4 v) per chunk */
    assert_int_equal(c.host_bytes, 1800);
    /* clipping: all CPU steps after backward */
    o.clip = 1;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_int_equal(c.schedule, PT_SCHED_AFTER_BWD);
    assert_double_equal(c.iter_s, 3.1 + 6.7 + 4.0, EPS);
    /* one slot: below the lookahead minimum (2), at the one-block minimum (1).
     * Forward: block 0 cannot prefetch block 1 (its own chunk holds the only
     * slot), so both gathers upload synchronously: 0.1 + (1 + 1) + (1 + 1).
     * At the turn the slot holds chunk 1 (hit); block 1's prefetch of chunk 0
     * finds no free slot, so block 0's gather uploads it: window 0 =
     * 1 + max(2, grad D2H 2) = 3. bwd = 0.7 + 2 + 3 + 2 */
    o.clip = 0;
    k.n_buffer = 1;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_double_equal(c.fwd_s, 4.1, EPS);
    assert_double_equal(c.bwd_s, 7.7, EPS);
    /* chunk 1's gradient lands at 0.7 + 2 + 3 = 5.7 -> 7.7, chunk 0's at 7.7 -> 9.7 */
    assert_double_equal(c.cpu_finish_s, 9.7, EPS);
    assert_double_equal(c.iter_s, 4.1 + 9.7, EPS);
    assert_int_equal(c.h2d_bytes, 300);
    assert_int_equal(c.h2d_sync_bytes, 300);
    assert_double_equal(c.sync_xfer_s, 3.0, EPS);
    assert_double_equal(c.exposed_xfer_s, 1 + 1 + 1 + 1.8, EPS);
    assert_int_equal(c.n_buffer_min, 2);
    assert_int_equal(c.n_buffer_min_block, 1);
    assert_int_equal(c.buffer_bytes, 200);
    assert_int_equal(c.peak_bytes, 200 + 3 + 2047);
    /* zero slots cannot run block 0 at all: refused with both minimums named */
    k.n_buffer = 0;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "n_buffer=0 is below the one-block minimum 1"));
    assert_non_null(strstr(err, "lookahead minimum, which lets every prefetch overlap, is 2"));
    pt_cost_ctx_free(cx);
    pt_trace_free(&t);
}

/* Fixed per-copy and per-device-op costs, by hand on the trace above.
 * Streamed (n_persist 0, 2 slots), copy latency 0.25 s up and 0.5 s down:
 * forward 0.1 + (1 + 0.25 sync) + max(1, 1 + 0.25 prefetch) + 1 = 3.6;
 * backward 0.7 + 2 + max(2, 2 + 0.5) + max(0.2, 2 + 0.5) = 7.7; chunk 1's
 * gradient lands at 5.2 -> CPU Adam to 7.2, chunk 0's at 7.7 -> 9.7.
 * All resident, 0.05 s per device op and memsets at 200 B/s: 2 chunks x
 * (AdamW + zeroing memset + the 16-bit widening) x 0.05 + 200 gradient
 * bytes / 200 = 1.3 on top of the 1 s of AdamW. With every fixed cost 0
 * (the control) the results are test_hand_streamed's and
 * test_hand_all_resident's. */
static void test_hand_fixed_costs(void **state) {
    (void)state;
    pt_trace t;
    tiny(&t);
    t.hw.h2d_lat_s = 0.25;
    t.hw.d2h_lat_s = 0.5;
    t.hw.dev_op_s = 0.05;
    t.hw.dev_memset_Bps = 200;
    pt_cost c = hand_cost(&t, (pt_knobs){0, 2, 0, 0});
    assert_double_equal(c.fwd_s, 3.6, EPS);
    assert_double_equal(c.sync_xfer_s, 1.0 + 0.25, EPS);   /* block 0's gather: bytes + one copy */
    assert_double_equal(c.bwd_s, 7.7, EPS);
    assert_double_equal(c.cpu_finish_s, 9.7, EPS);
    assert_double_equal(c.iter_s, 3.6 + 9.7, EPS);
    assert_int_equal(c.h2d_bytes, 200);   /* bytes stay bytes */
    c = hand_cost(&t, (pt_knobs){2, 0, 0, 0});
    assert_double_equal(c.dev_adam_s, 1.0 + 1.3, EPS);
    assert_double_equal(c.iter_s, 2.1 + 4.9 + 2.3, EPS);
    pt_trace_free(&t);
}

/* The poison fills of the step's frees, by hand on the trace above with
 * frees at 1000 B/s (arena 1000 B: 1 s; forward scratch 5 B: 0.005 s;
 * backward scratch 7 B: 0.007 s), every chunk resident.
 * NONE: each forward window frees its scratch, each backward window the
 * arena and its scratch: forward 2.1 + 2 x 0.005, backward 4.9 + 2 x 1.007.
 * CKPT: the arena goes after the forward too, and the recompute frees its
 * forward scratch again: forward 2.1 + 2 x 1.005, backward 4.9 + 2 (the
 * recomputes) + 2 x 1.012. Device Adam 1 s after backward either way. The
 * control (free_Bps 0) is test_hand_all_resident's 2.1 / 4.9. */
static void test_hand_free_fill(void **state) {
    (void)state;
    pt_trace t;
    tiny(&t);
    t.hw.free_Bps = 1000;
    const pt_knobs none = {2, 0, 0, 0}, ckpt = {2, 0, 0, 2};
    pt_cost c = hand_cost(&t, none);
    assert_double_equal(c.fwd_s, 2.11, EPS);
    assert_double_equal(c.bwd_s, 6.914, EPS);
    assert_double_equal(c.iter_s, 2.11 + 6.914 + 1.0, EPS);
    assert_double_equal(c.exposed_xfer_s, 0.0, EPS);   /* the fills are compute-stream time */
    c = hand_cost(&t, ckpt);
    assert_double_equal(c.fwd_s, 4.11, EPS);
    assert_double_equal(c.bwd_s, 8.924, EPS);
    assert_double_equal(c.iter_s, 4.11 + 8.924 + 1.0, EPS);
    /* a CKPT arena freed right after its forward at its own rate (2000 B/s:
     * 0.5 s): forward 2.1 + 2 x 0.505; NONE frees none there (unchanged) */
    t.hw.free_fwd_Bps = 2000;
    c = hand_cost(&t, ckpt);
    assert_double_equal(c.fwd_s, 3.11, EPS);
    assert_double_equal(c.bwd_s, 8.924, EPS);
    c = hand_cost(&t, none);
    assert_double_equal(c.fwd_s, 2.11, EPS);
    /* a negative rate is refused */
    char err[256];
    t.hw.free_Bps = -1;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    pt_trace_free(&t);
}

static void test_hand_ckpt_swap(void **state) {
    (void)state;
    pt_trace t;
    tiny(&t);
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    pt_cost c;
    /* both CKPT: only inputs stay; peak = backward of block 1 with its
     * recomputed arena: 20 + 1000 + 20 + max(7, 5) */
    pt_knobs k = {2, 0, 0, 2};
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_int_equal(c.activation_bytes + c.scratch_bytes, 1047);
    assert_double_equal(c.recompute_s, 2.0, EPS);
    assert_double_equal(c.bwd_s, 4.9 + 2.0, EPS);
    /* block 0 SWAP: D2H 1000 B at 50 B/s = 20 s; block 1's forward hides 1 s,
     * 19 s spill into the turn; swap-in 1000 B at 100 B/s = 10 s in block 1's
     * backward. I = min(ceil(20 / 1), N) = 2. */
    assert_int_equal(pt_cost_swap_interval(cx), 2);
    k = (pt_knobs){2, 0, 1, 0};
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_double_equal(c.fwd_s, 2.1, EPS);
    assert_double_equal(c.bwd_s, 19.0 + 10.0 + 2.0 + 0.2, EPS);
    assert_double_equal(c.iter_s, 2.1 + 31.2 + 1.0, EPS);
    assert_int_equal(c.swap_pool_bytes, 1000);
    assert_int_equal(c.host_bytes, 1000);
    assert_int_equal(c.h2d_bytes, 1000);
    assert_int_equal(c.d2h_bytes, 1000);
    /* block 0's arena still drains at the turn (counted), and comes back one
     * block ahead: backward of block 1 = 20 + 1000 + 1000 (ahead) + 20 + 7 */
    assert_int_equal(c.activation_bytes + c.scratch_bytes, 2047);
    /* both SWAP: block 1's D2H (20 s) starts after its forward, so 19 + 20 s
     * drain at the turn, and block 1 comes back from those bytes: its swap-in
     * (10 s) follows them, 39 + 10 at the turn (charging the two copies side
     * by side on their two engines, max(39, 10), would under-charge); block
     * 0's swap-in (10 s) in block 1's window, then 2 + 0.2 */
    k = (pt_knobs){2, 0, 2, 0};
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_double_equal(c.bwd_s, 39.0 + 10.0 + 10.0 + 2.0 + 0.2, EPS);
    pt_cost_ctx_free(cx);
    /* each swap copy pays the per-copy latency like a chunk copy (0.5 s down,
     * 0.25 s up): block 0 SWAP drains 20.5 s, 19.5 at the turn; its swap-in
     * 10.25 s in block 1's backward */
    t.hw.d2h_lat_s = 0.5;
    t.hw.h2d_lat_s = 0.25;
    c = hand_cost(&t, (pt_knobs){2, 0, 1, 0});
    assert_double_equal(c.fwd_s, 2.1, EPS);
    assert_double_equal(c.bwd_s, 19.5 + 10.25 + 2.0 + 0.2, EPS);
    /* both SWAP: 19.5 + 20.5 drain at the turn, then block 1's swap-in 10.25 */
    c = hand_cost(&t, (pt_knobs){2, 0, 2, 0});
    assert_double_equal(c.bwd_s, 40.0 + 10.25 + 10.25 + 2.0 + 0.2, EPS);
    pt_trace_free(&t);
}

static synth big(void) {
    synth s = {.n_block = 8, .cpb = 2, .mand_first = 1, .mand_last = 1, .engines = 2, .chunk_bytes = 1 << 20, .arena = 40 << 20, .input = 1 << 20, .fscr = 3 << 20, .bscr = 5 << 20, .gact = 2 << 20, .fwd = 0.010, .bwd = 0.020, .h2d = 1e9, .d2h = 1e10, .cpu = 2e8, .dev = 1e10, .tf = 1};
    return s;
}

static uint64_t peak_of(pt_cost_ctx *cx, int p, int nb, int s, int c) {
    pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    pt_knobs k = {p, nb, s, c};
    pt_cost r;
    char err[256];
    assert_int_equal(pt_cost_eval(cx, &o, &k, &r, err, sizeof err), PT_OK);
    return r.peak_bytes;
}

static void test_peak_monotone_in_ckpt_and_swap(void **state) {
    (void)state;
    pt_trace t;
    synth s = big();
    build(&t, &s);
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    /* fast D2H: I = 1, every swap drains within the next block */
    assert_int_equal(pt_cost_swap_interval(cx), 1);
    int N = t.n_block, K = t.n_chunk;
    int lo = pt_cost_buffer_min(cx, 0);
    for (int sw = 0; sw <= 2; sw++) {
        uint64_t prev = UINT64_MAX;
        for (int c = 0; c + sw <= N; c++) {
            uint64_t pk = peak_of(cx, 0, lo, sw, c);
            assert_true(pk <= prev);
            prev = pk;
        }
        assert_true(prev < peak_of(cx, 0, lo, sw, 0));
    }
    uint64_t none = peak_of(cx, K, 0, 0, 0), prev = none;
    for (int sw = 1; sw <= N; sw++) {
        uint64_t pk = peak_of(cx, K, 0, sw, 0);
        assert_true(pk <= prev);
        prev = pk;
    }
    assert_true(peak_of(cx, K, 0, N / 2, 0) < none);   /* SWAP lowers the peak */
    pt_cost_ctx_free(cx);
    pt_trace_free(&t);
}

static void test_peak_monotone_in_persist(void **state) {
    (void)state;
    for (int frozen = 0; frozen < 2; frozen++) {
        pt_trace t;
        synth s = big();
        s.tf = frozen ? 0.0 : 1.0;   /* frozen chunks: persisting costs less than a slot */
        build(&t, &s);
        pt_cost_ctx *cx;
        char err[256];
        assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
        int nb = pt_cost_buffer_min(cx, 0);
        for (int c = 0; c <= 4; c += 2) {
            uint64_t prev = 0;
            /* while the pool really has nb slots (the runtime allocates at most |Q|) */
            for (int p = 0; nb <= pt_cost_n_offloaded(cx, p); p++) {
                uint64_t pk = peak_of(cx, p, nb, 1, c);
                assert_true(pk >= prev);
                prev = pk;
            }
        }
        pt_cost_ctx_free(cx);
        pt_trace_free(&t);
    }
}

static void test_time_monotone_in_buffers(void **state) {
    (void)state;
    for (int engines = 1; engines <= 2; engines++) {
        pt_trace t;
        synth s = big();
        s.engines = engines;
        s.d2h = 2e9;   /* slower swaps: some transfers exposed */
        build(&t, &s);
        pt_cost_ctx *cx;
        char err[256];
        assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
        int K = t.n_chunk;
        long checked = 0, strictly = 0;
        for (int p = 0; p <= K; p++)
            for (int sw = 0; sw <= 2; sw++)
                for (int c = 0; c <= 3; c++)
                    for (int clip = 0; clip < 3; clip++) /* 2: clipping, steps deferred */ {
                        pt_cost_opts o = {1.0, 0, 0, clip > 0, 0, clip == 2, 0, 0, 0, 0, 0, 0, 0, 0};
                        double prev = INFINITY;
                        uint64_t prev_peak = 0;
                        for (int nb = pt_cost_buffer_min(cx, p); nb <= K - p; nb++) {
                            pt_knobs k = {p, nb, sw, c};
                            pt_cost r;
                            assert_int_equal(pt_cost_eval(cx, &o, &k, &r, err, sizeof err), PT_OK);
                            assert_true(r.iter_s <= prev + 1e-12);
                            assert_true(r.peak_bytes >= prev_peak);
                            if (r.iter_s < prev - 1e-9 && prev < INFINITY) strictly++;
                            prev = r.iter_s;
                            prev_peak = r.peak_bytes;
                            checked++;
                        }
                    }
        assert_true(checked > 500);
        assert_true(strictly > 0);   /* buffers do buy time somewhere */
        pt_cost_ctx_free(cx);
        pt_trace_free(&t);
    }
}

static void test_bad_trace_rejected(void **state) {
    (void)state;
    pt_trace t;
    synth s = big();
    build(&t, &s);
    pt_cost_ctx *cx = NULL;
    char err[256] = {0};
    /* out of execution order */
    t.chunks[3].first_block = t.chunks[3].last_block = 0;
    t.chunks[2].first_block = t.chunks[2].last_block = 1;
    pt_trace_derive_ranges(&t);
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_null(cx);
    assert_non_null(strstr(err, "execution order"));
    pt_trace_free(&t);
    build(&t, &s);
    t.slot_bytes = s.chunk_bytes - 1;
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "slot_bytes"));
    pt_trace_free(&t);
}

/* Exact footprints from the profiler replace the formulas, chunk by chunk. */
static void test_exact_footprints(void **state) {
    (void)state;
    pt_trace t;
    synth s = big();
    build(&t, &s);
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    pt_cost_opts o = {1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    int K = t.n_chunk;
    pt_knobs all = {K, 0, 0, 0}, half = {K / 2, pt_cost_buffer_min(cx, K / 2), 0, 0};
    pt_cost c0, h0, c1, h1;
    assert_int_equal(pt_cost_eval(cx, &o, &all, &c0, err, sizeof err), PT_OK);
    assert_int_equal(pt_cost_eval(cx, &o, &half, &h0, err, sizeof err), PT_OK);
    pt_cost_ctx_free(cx);
    /* every device allocation of a persistent chunk rounded up to 256 bytes
     * (5 of them: param, grad, m, v, master), like the runtime's allocator;
     * offloaded chunks' pinned copies 100 bytes over the formula */
    uint64_t dev_extra = 0, host_extra = 0;
    for (int k = 0; k < K; k++) {
        pt_trace_chunk *ch = &t.chunks[k];
        uint64_t f = pt_trace_chunk_dev_state(&t, ch), n = ch->trainable_elems;
        uint64_t r = 2 * ((ch->bytes + 255) / 256 * 256) + 3 * ((n * 4 + 255) / 256 * 256);
        ch->dev_bytes = r + 256 * (uint64_t)(k % 3);   /* something the formula cannot know */
        dev_extra += ch->dev_bytes - f;
        if (k >= K / 2 && !ch->mandatory) {
            ch->host_bytes = pt_trace_chunk_host_state(&t, ch) + 100;
            host_extra += 100;
        }
    }
    assert_true(dev_extra > 0);
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_OK);
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    assert_int_equal(pt_cost_eval(cx, &o, &all, &c1, err, sizeof err), PT_OK);
    assert_int_equal(pt_cost_eval(cx, &o, &half, &h1, err, sizeof err), PT_OK);
    /* all resident: the model states are exactly the sum of dev_bytes */
    uint64_t want = 0;
    for (int k = 0; k < K; k++) want += t.chunks[k].dev_bytes;
    assert_int_equal(c1.model_state_bytes, want);
    assert_int_equal(c1.model_state_bytes - c0.model_state_bytes, dev_extra);
    assert_int_equal(c1.peak_bytes - c0.peak_bytes, dev_extra);
    /* half offloaded: pinned host bytes use host_bytes, time is unchanged */
    assert_int_equal(h1.host_bytes - h0.host_bytes, host_extra);
    assert_true(h1.model_state_bytes > h0.model_state_bytes);
    assert_true(h1.iter_s == h0.iter_s);
    pt_cost_ctx_free(cx);
    /* values the runtime cannot produce are refused, naming the field */
    uint64_t keep = t.chunks[3].dev_bytes;
    t.chunks[3].dev_bytes = t.chunks[3].bytes - 1;   /* cannot even hold the params */
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "chunk 3 dev_bytes"));
    t.chunks[3].dev_bytes = 1ull << 40;                /* units mixed up */
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    t.chunks[3].dev_bytes = keep;
    t.chunks[K - 2].host_bytes = 7;
    assert_int_equal(pt_trace_validate(&t, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "host_bytes"));
    pt_trace_free(&t);
}

/* Below the lookahead minimum time is not monotone in general, but the
 * bounds the searcher prunes with must hold: forward time non-increasing in
 * n_buffer from the one-block minimum, and pt_cost_time_lb_small below the
 * time of every n_buffer under the lookahead minimum; pt_cost_time_lb_any
 * below the time of every n_buffer. */
static void test_bounds_below_lookahead(void **state) {
    (void)state;
    long checked = 0, below = 0, any_checked = 0, any_tight = 0, any_stronger = 0;
    for (int variant = 0; variant < 4; variant++) {
        pt_trace t;
        synth s = big();
        s.cpb = 3;
        s.engines = 1 + variant % 2;
        s.cpu = variant < 2 ? 2e8 : 2e6;   /* transfer-bound, then CPU-bound */
        s.fr = variant % 2 ? 4e9 : 0;       /* frees' fills: 10 ms per 40 MiB arena */
        build(&t, &s);
        /* share the boundary chunk of every block pair (a chunk used by both) */
        for (int k = 1; k + 1 < t.n_chunk; k++)
            if (t.chunks[k].first_block >= 0 && k % 3 == 0 && t.chunks[k].first_block + 1 < t.n_block)
                t.chunks[k].last_block = t.chunks[k].first_block + 1;
        pt_trace_derive_ranges(&t);
        pt_cost_ctx *cx;
        char err[256];
        assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
        uint8_t *modes = malloc((size_t)t.n_block);
        pt_act_profile a;
        assert_int_equal(pt_act_init(cx, &a), PT_OK);
        for (int clip = 0; clip < 3; clip++)   /* 2: clipping, steps deferred */
            for (int sc = 0; sc < 3; sc++) {
                assert_int_equal(pt_place_blocks(t.n_block, sc == 2, sc, pt_cost_swap_interval(cx), modes, NULL, 0),
                                 PT_OK);
                pt_act_compute(cx, modes, &a);
                pt_cost_opts o = {1.0, 0, 0, clip > 0, 0, clip == 2, 0, 0, 0, 0, 0, 0, 0, 0};
                for (int p = 0; p <= t.n_chunk; p++) {
                    int lo1 = pt_cost_buffer_min_block(cx, p), lo2 = pt_cost_buffer_min(cx, p);
                    int q = pt_cost_n_offloaded(cx, p);
                    double prev_fwd = INFINITY;
                    pt_cost at, c;
                    double lb_any = pt_cost_time_lb_any(cx, &a, p, &o);
                    any_stronger += lb_any > pt_cost_time_lb_persist(cx, &a, p, &o);
                    for (int nb = lo1; nb <= q; nb++) {
                        pt_cost_time(cx, &a, p, nb, &o, &c);
                        assert_true(c.fwd_s <= prev_fwd + 1e-12);
                        prev_fwd = c.fwd_s;
                        assert_true(c.iter_s >= pt_cost_time_lb(cx, &a, p, nb, &o) - 1e-12);
                        /* exact: same operations in the same order, transfers dropped
                         * (only the forward's monotonicity in n_buffer is math, as above) */
                        assert_true(c.iter_s >= lb_any - 1e-12);
                        any_checked++;
                        any_tight += lb_any > c.iter_s * 0.999;
                    }
                    if (lo1 >= lo2) continue;
                    for (int ref = lo2; ref <= q; ref++) {
                        pt_cost_time(cx, &a, p, ref, &o, &at);
                        double cheap = pt_cost_time_lb_small(cx, &a, p, -1, &at);
                        for (int top = lo1; top < lo2; top++) {
                            double lb = pt_cost_time_lb_small(cx, &a, p, top, &at);
                            assert_true(lb >= cheap - 1e-12);
                            for (int nb = lo1; nb <= top; nb++) {
                                pt_cost_time(cx, &a, p, nb, &o, &c);
                                assert_true(c.iter_s >= lb - 1e-9);
                                checked++;
                                below += c.h2d_sync_bytes > 0;
                            }
                        }
                    }
                }
            }
        pt_act_free(&a);
        free(modes);
        pt_cost_ctx_free(cx);
        pt_trace_free(&t);
    }
    assert_true(checked > 1000);
    assert_true(below == checked);   /* below the lookahead minimum some gather always waits */
    /* pt_cost_time_lb_any (the searcher's n_persist skip) holds for every
     * n_buffer, is often within 0.1% (CPU-bound variants) and beats the O(1)
     * bound it falls back to */
    assert_true(any_checked > 1000);
    assert_true(any_tight > 0);
    assert_true(any_stronger > 0);
}

/* ---- the disk tier (pt_cost_tier, pt_cost_tier_time) ----
 * 8 blocks of 2 chunks, none mandatory: 16 offloaded chunks of U = 1000 bytes
 * (bf16, so w = 3: masters on the record), E = 500, n_persist = 0, no swap
 * (no swap pool), 3 slots, block 512, sections rounded to 64 bytes
 * (r(4E) = r(2000) = 2048, r(U) = 1024). By hand:
 *   level 0: the profile's 16 x (U + 16 E) = 16 x 9000 = 144000
 *   level 1: R1 = pad(3 x 2048 = 6144) = 6144; pinned 16 x 2U + 3 x (6144 + 512)
 *            = 32000 + 19968 = 51968; disk 16 x 6144 = 98304; I/O 2 x 98304
 *   level 2: R2 = pad(2 x 1024 + 4 x 2048 = 10240) = 10240; pinned 3 x (10240 +
 *            512) = 32256; disk 16 x 10240 = 163840; I/O 3 x 163840
 * Chunk 0 frozen: level 0 15 x 9000 + 1000 = 136000; level 1 pinned 15 x 2000
 * + 1000 + 19968 = 50968, disk 15 x 6144 = 92160; level 2 pinned 32256, disk
 * 15 x 10240 + pad(1024) = 154624, read twice, written 153600 (a frozen image
 * is never dirty): I/O 2 x 154624 + 153600 = 462848. */
static void tier_trace(pt_trace *t) {
    synth s = {.n_block = 8, .cpb = 2, .engines = 2, .chunk_bytes = 1000, .arena = 100, .input = 10, .fscr = 5, .bscr = 7, .gact = 20, .fwd = 0.001, .bwd = 0.002, .h2d = 1e9, .d2h = 1e9, .cpu = 1e8, .dev = 1e9, .tf = 1};
    build(t, &s);
}

static pt_cost_opts tier_opts(uint64_t budget) {
    pt_cost_opts o = {.frag = 1.0, .tier_slots = 3, .tier_above = budget, .tier_block = 512};
    return o;
}

/* Level 0/1/2 at three budgets, and the pinned and disk figures of each. */
static void test_tier_levels(void **state) {
    (void)state;
    pt_trace t;
    tier_trace(&t);
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    static const struct {
        int frozen, world;
        uint64_t budget;
        int level;
        uint64_t pinned, disk, io;
    } cases[] = {
        {0, 1, 144000, 0, 144000, 0, 0},             /* the states fit: no tier */
        {0, 1, 143999, 1, 51968, 98304, 2 * 98304},  /* one byte short: level 1 */
        {0, 1, 51968, 1, 51968, 98304, 2 * 98304},   /* level 1 exactly at the budget */
        /* below level 1: level 2; the forward reads the params' blocks (16 x
         * 1024), the backward and the write-back whole records */
        {0, 1, 51967, 2, 32256, 163840, 16384 + 2 * 163840},
        {0, 1, 20000, 2, 32256, 163840, 16384 + 2 * 163840}, /* level 2 does not fit either: still its figure */
        /* two ranks (mode B): level 2 is not built for them; level 1 pins the
         * fp32 gradient sums too (4E a chunk, 32000 bytes in all) */
        {0, 2, 51967, 1, 51968 + 32000, 98304, 2 * 98304},
        {1, 1, 136000, 0, 136000, 0, 0},             /* chunk 0 frozen */
        {1, 1, 135999, 1, 50968, 92160, 2 * 92160},  /* ... its params pinned at level 1 */
        {1, 1, 50967, 2, 32256, 154624, 324608},     /* ... its image on disk at level 2 (never written) */
    };
    pt_knobs k = {0, 2, 0, 0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pt_trace_free(&t);
        tier_trace(&t);
        if (cases[i].frozen) t.chunks[0].trainable_elems = 0;
        t.key.world_size = cases[i].world;
        pt_cost_ctx_free(cx);
        assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
        pt_cost_opts o = tier_opts(cases[i].budget);
        pt_cost c;
        assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
        assert_int_equal(c.on_tier, cases[i].level);
        assert_int_equal(c.host_bytes, cases[i].pinned);
        assert_int_equal(c.tier_disk_bytes, cases[i].disk);
        assert_int_equal(c.tier_io_bytes, cases[i].io);
        int32_t lvl = -1;
        assert_int_equal(pt_cost_pinned(cx, NULL, 0, &o, &lvl), cases[i].pinned);
        assert_int_equal(lvl, cases[i].level);
    }
    /* mode C on two ranks: this rank's parts, level 2 when level 1 (with the
     * gradient sums) does not fit; its records are about half the chunk's */
    {
        pt_trace_free(&t);
        tier_trace(&t);
        t.key.world_size = 2;
        pt_cost_ctx_free(cx);
        assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
        pt_cost_opts o = tier_opts(20000);
        o.shard = 1;
        int32_t lvl = -1;
        uint64_t pin = pt_cost_pinned(cx, NULL, 0, &o, &lvl);
        assert_int_equal(lvl, 2);
        assert_true(pin < 32256);   /* one rank's level-2 staging is larger */
    }
    pt_trace_free(&t);
    tier_trace(&t);
    pt_cost_ctx_free(cx);
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    /* a swap pool counts in the plan's pinned bytes but not in the store's
     * choice of level (it is allocated later, under the same cap): at level
     * 1's exact figure, one SWAP block keeps level 1 and its pool on top */
    {
        pt_knobs ks = {0, 2, 1, 0};
        pt_cost_opts o = tier_opts(51968);
        pt_cost c;
        assert_int_equal(pt_cost_eval(cx, &o, &ks, &c, err, sizeof err), PT_OK);
        assert_true(c.swap_pool_bytes > 0);
        assert_int_equal(c.on_tier, 1);
        assert_int_equal(c.host_bytes, 51968 + c.swap_pool_bytes);
        o = tier_opts(144000);   /* and the states that fit alone stay pinned */
        assert_int_equal(pt_cost_eval(cx, &o, &ks, &c, err, sizeof err), PT_OK);
        assert_int_equal(c.on_tier, 0);
        assert_int_equal(c.host_bytes, 144000 + c.swap_pool_bytes);
    }
    /* the store's testing keys: the tier where the states fit (bit 0), a forced level (bits 1-2) */
    static const struct {
        uint64_t budget;
        int32_t force, level;
        uint64_t pinned;
    } forced[] = {{144000, 1, 1, 51968}, {144000, 1 | 2 << 1, 2, 32256}, {20000, 1 << 1, 1, 51968}};
    for (size_t i = 0; i < sizeof forced / sizeof forced[0]; i++) {
        pt_cost_opts o = tier_opts(forced[i].budget);
        o.tier_force = forced[i].force;
        int32_t lvl = -1;
        assert_int_equal(pt_cost_pinned(cx, NULL, 0, &o, &lvl), forced[i].pinned);
        assert_int_equal(lvl, forced[i].level);
    }
    /* mode C asked on one rank is not sharded: the tier as usual; no [nvme]
     * path: never a tier */
    pt_cost_opts o = tier_opts(1000);
    o.shard = 1;
    assert_int_equal(pt_cost_pinned(cx, NULL, 0, &o, NULL), 32256);
    o = tier_opts(1000);
    o.tier_slots = 0;
    int32_t lvl = -1;
    assert_int_equal(pt_cost_pinned(cx, NULL, 0, &o, &lvl), 144000);
    assert_int_equal(lvl, 0);
    pt_cost_ctx_free(cx);
    pt_trace_free(&t);
}

/* The I/O term: the bytes above at read 1e6 and write 5e5 bytes/s.
 *   level 1: io = 98304 / 1e6 + 98304 / 5e5 = 0.098304 + 0.196608 = 0.294912 s,
 *            all after the forward: exposed = max(0, 0.294912 - B); with
 *            clipping the reads wait for optimizer_step: B = max(CPU Adam, tail)
 *   level 2: io_f = 163840 / 1e6 = 0.16384 s (forward reads),
 *            io_b = 0.16384 + 163840 / 5e5 = 0.16384 + 0.32768 = 0.49152 s,
 *            exposed = max(0, io_f - F) + max(0, io_b - B)
 * with F, B the forward and the rest of the same plan without the tier. At
 * rates 1e12 every byte hides: the iteration is the untiered one. */
static void test_tier_io_time(void **state) {
    (void)state;
    pt_trace t;
    tier_trace(&t);
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    pt_knobs k = {0, 2, 0, 0};
    pt_cost_opts o0 = {.frag = 1.0};
    pt_cost c0, c;
    assert_int_equal(pt_cost_eval(cx, &o0, &k, &c0, err, sizeof err), PT_OK);
    double F = c0.fwd_s, B = c0.iter_s - c0.fwd_s;
    /* the windows are small next to the I/O: a real exposed part */
    assert_true(F < 0.16384 && B < 0.294912);

    pt_cost_opts o = tier_opts(100000);
    o.tier_rd_Bps = 1e6;
    o.tier_wr_Bps = 5e5;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_int_equal(c.on_tier, 1);
    assert_double_equal(c.tier_io_s, 0.294912, EPS);
    assert_double_equal(c.tier_exposed_s, 0.294912 - B, EPS);
    assert_double_equal(c.iter_s, c0.iter_s + 0.294912 - B, EPS);
    assert_double_equal(c.fwd_s, c0.fwd_s, EPS);   /* level 1 reads nothing for the forward */
    assert_double_equal(c.opt_s, c0.opt_s + 0.294912 - B, EPS);
    assert_double_equal(c.iter_s, c.fwd_s + c.bwd_s + c.opt_s, EPS);

    /* clipping: the reads are queued in optimizer_step, after backward; only
     * the steps' span (or the tail) hides them */
    pt_cost cc0, cc;
    o0.clip = o.clip = 1;
    assert_int_equal(pt_cost_eval(cx, &o0, &k, &cc0, err, sizeof err), PT_OK);
    assert_int_equal(pt_cost_eval(cx, &o, &k, &cc, err, sizeof err), PT_OK);
    assert_int_equal(cc.schedule, PT_SCHED_AFTER_BWD);
    double Bc = cc0.cpu_adam_s > cc0.opt_s ? cc0.cpu_adam_s : cc0.opt_s;
    assert_true(Bc < B);
    assert_double_equal(cc.tier_exposed_s, 0.294912 - Bc, EPS);
    assert_double_equal(cc.iter_s, cc0.iter_s + 0.294912 - Bc, EPS);
    o0.clip = o.clip = 0;

    o.tier_above = 40000;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_int_equal(c.on_tier, 2);
    /* the forward's uploads read only the params' blocks: 16 x pad(r(1000)) */
    const double iof = 0.016384, fw = F > iof ? F : iof;
    assert_double_equal(c.tier_io_s, iof + 0.49152, EPS);
    assert_double_equal(c.tier_exposed_s, (fw - F) + (0.49152 - B), EPS);
    assert_double_equal(c.fwd_s, fw, EPS);                /* max(F, io_f) */
    assert_double_equal(c.iter_s, fw + 0.49152, EPS);     /* max(F, io_f) + max(B, io_b) */

    o.tier_rd_Bps = o.tier_wr_Bps = 1e12;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_int_equal(c.on_tier, 2);
    assert_double_equal(c.tier_exposed_s, 0, EPS);
    assert_double_equal(c.iter_s, c0.iter_s, EPS);
    assert_true(c.tier_io_s > 0);

    /* no rates: the bytes are known, their time is not modelled */
    o.tier_rd_Bps = o.tier_wr_Bps = 0;
    assert_int_equal(pt_cost_eval(cx, &o, &k, &c, err, sizeof err), PT_OK);
    assert_int_equal(c.tier_io_bytes, 16384 + 2 * 163840);
    assert_double_equal(c.tier_io_s, 0, EPS);
    assert_double_equal(c.iter_s, c0.iter_s, EPS);
    pt_cost_ctx_free(cx);
    pt_trace_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_terms),
        cmocka_unit_test(test_hand_all_resident),
        cmocka_unit_test(test_hand_buckets),
        cmocka_unit_test(test_hand_streamed),
        cmocka_unit_test(test_hand_fixed_costs),
        cmocka_unit_test(test_rekls_terms),
        cmocka_unit_test(test_rekls_shard),
        cmocka_unit_test(test_hand_free_fill),
        cmocka_unit_test(test_hand_ckpt_swap),
        cmocka_unit_test(test_peak_monotone_in_ckpt_and_swap),
        cmocka_unit_test(test_peak_monotone_in_persist),
        cmocka_unit_test(test_time_monotone_in_buffers),
        cmocka_unit_test(test_bad_trace_rejected),
        cmocka_unit_test(test_exact_footprints),
        cmocka_unit_test(test_bounds_below_lookahead),
        cmocka_unit_test(test_tier_levels),
        cmocka_unit_test(test_tier_io_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
