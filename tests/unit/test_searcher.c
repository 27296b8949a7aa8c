/*
 * test_searcher.c — runtime/searcher.h: the pruned search against a brute-force
 * enumeration of every knob set through pt_cost_eval, capacity and host limits,
 * monotonicity in capacity, overrides, and the infeasible message.
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
#include "planner/ds_estimates.h"
#include "planner/placement.h"
#include "protrain.h"
#include "planner/searcher.h"
#include "planner/trace_cache.h"

typedef struct synth {
    int n_block, cpb, engines;
    double tf, fwd, d2h;
    int share;     /* the last chunk of each block is also used by the next one */
    double cpu;    /* CPU Adam elements/s; 0 = 1e9 */
} synth;

/* Blocks with 2..3 chunks of varying size, mandatory embedding/head chunks. */
static void build(pt_trace *t, const synth *s) {
    pt_trace_init(t);
    int K = s->n_block * s->cpb + 2;
    assert_int_equal(pt_trace_alloc(t, s->n_block, K, NULL, 0), PT_OK);
    int k = 0;
    const uint64_t MB = 1 << 20;
    t->chunks[k++] = (pt_trace_chunk){8 * MB, 4 * MB, 4 * MB, -1, -1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < s->n_block; b++)
        for (int j = 0; j < s->cpb; j++) {
            uint64_t by = (6 + (uint64_t)((b * 3 + j) % 3)) * MB, el = by / 2;
            int last = (s->share && j == s->cpb - 1 && b + 1 < s->n_block) ? b + 1 : b;
            t->chunks[k++] = (pt_trace_chunk){by, el, (uint64_t)(s->tf * (double)el), b, last, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        }
    t->chunks[k++] = (pt_trace_chunk){4 * MB, 2 * MB, 2 * MB, -1, -1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < s->n_block; b++)
        t->blocks[b] = (pt_trace_block){s->fwd * (1 + 0.1 * (b % 2)), 2 * s->fwd, s->fwd, (20 + (uint64_t)b) * MB, MB,
                                        2 * MB, 3 * MB, 2 * MB, 0, 0};
    pt_trace_derive_ranges(t);
    t->chunk_size = 8 * MB;
    t->param_elem_bytes = t->grad_elem_bytes = 2;
    t->master_elem_bytes = t->adam_m_elem_bytes = t->adam_v_elem_bytes = t->host_grad_elem_bytes = 4;
    t->slot_bytes = 16 * MB;
    t->embed_fwd_s = t->embed_bwd_s = 0.001;
    t->head_fwd_s = 0.002;
    t->head_bwd_s = 0.004;
    t->nonblock_bytes = 5 * MB;
    t->nonblock_scratch_bytes = 4 * MB;
    t->hw = (pt_trace_hw){2e9, s->d2h, s->cpu > 0 ? s->cpu : 1e9, 2e10, 0, s->engines, 0, 0, 1ull << 30, 0, 0, 0, 0, 0, 0, 0, 0};
    t->key.world_size = 1;
    t->key.version = PT_TRACE_VERSION;
    snprintf(t->key.device, sizeof t->key.device, "test");
}

typedef struct best {
    int found;
    double T;
    pt_knobs k;
} best;

static int tie_better(const pt_knobs *x, double tx, const pt_knobs *y, double ty) {
    if (x->n_checkpoint != y->n_checkpoint) return x->n_checkpoint < y->n_checkpoint;
    if (x->n_swap != y->n_swap) return x->n_swap < y->n_swap;
    if (x->n_persist != y->n_persist) return x->n_persist > y->n_persist;
    if (x->n_buffer != y->n_buffer) return x->n_buffer < y->n_buffer;
    return tx < ty;
}

/* Every knob set through pt_cost_eval; the documented selection rule. */
static best brute(const pt_trace *t, const pt_search_opts *o) {
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(t, &cx, err, sizeof err), PT_OK);
    int N = t->n_block, K = t->n_chunk, cap = pt_place_swap_cap(N, pt_cost_swap_interval(cx));
    uint64_t budget = pt_cost_budget(o->capacity ? o->capacity : t->hw.device_capacity, &o->cost);
    uint64_t hb = o->host_ram ? o->host_ram : t->hw.host_ram_bytes;
    int n = 0, m = 0;
    double *T = malloc(200000 * sizeof *T);
    pt_knobs *ks = malloc(200000 * sizeof *ks);
    double Tmin = INFINITY;
    for (int c = 0; c <= N; c++)
        for (int s = 0; s <= cap && s + c <= N; s++)
            for (int p = 0; p <= K; p++)
                for (int nb = pt_cost_buffer_min_block(cx, p); nb <= K - p; nb++) {
                    pt_knobs k = {p, nb, s, c};
                    if ((o->n_persist >= 0 && p != o->n_persist) || (o->n_buffer >= 0 && nb != o->n_buffer) ||
                        (o->n_swap >= 0 && s != o->n_swap) || (o->n_checkpoint >= 0 && c != o->n_checkpoint))
                        continue;
                    pt_cost r;
                    assert_int_equal(pt_cost_eval(cx, &o->cost, &k, &r, err, sizeof err), PT_OK);
                    m++;
                    if (r.peak_bytes > budget || (hb && r.host_bytes > hb)) continue;
                    assert_true(n < 200000);
                    T[n] = r.iter_s;
                    ks[n++] = k;
                    if (r.iter_s < Tmin) Tmin = r.iter_s;
                }
    best b = {0, 0, {0, 0, 0, 0}};
    for (int i = 0; i < n; i++) {
        if (T[i] > 1.01 * Tmin) continue;
        if (!b.found || tie_better(&ks[i], T[i], &b.k, b.T)) {
            b.found = 1;
            b.T = T[i];
            b.k = ks[i];
        }
    }
    b.T = Tmin;
    assert_true(m > 0);
    free(T);
    free(ks);
    pt_cost_ctx_free(cx);
    return b;
}

static int32_t pt_cost_buffer_min_block_of(const pt_trace *t, int32_t p) {
    pt_cost_ctx *cx;
    char err[256];
    assert_int_equal(pt_cost_ctx_new(t, &cx, err, sizeof err), PT_OK);
    int32_t m = pt_cost_buffer_min_block(cx, p);
    pt_cost_ctx_free(cx);
    return m;
}

static int n_feasible, n_offloading, n_below_lookahead;

static void expect_same(const pt_trace *t, const pt_search_opts *o) {
    best b = brute(t, o);
    pt_plan plan;
    pt_plan_init(&plan);
    char err[512];
    int rc = pt_search(t, o, &plan, err, sizeof err);
    if (!b.found) {
        assert_int_equal(rc, PT_ERR_INFEASIBLE);
    } else {
        if (rc) fprintf(stderr, "search failed: %s\n", err);
        assert_int_equal(rc, PT_OK);
        if (memcmp(&plan.knobs, &b.k, sizeof b.k) != 0)
            fprintf(stderr, "searcher %d/%d/%d/%d (%.6f) vs brute %d/%d/%d/%d (best %.6f)\n", plan.knobs.n_persist,
                    plan.knobs.n_buffer, plan.knobs.n_swap, plan.knobs.n_checkpoint, plan.cost.iter_s, b.k.n_persist,
                    b.k.n_buffer, b.k.n_swap, b.k.n_checkpoint, b.T);
        assert_memory_equal(&plan.knobs, &b.k, sizeof b.k);
        assert_true(fabs(plan.best_iter_s - b.T) <= 1e-12 * b.T);
        assert_true(plan.cost.peak_bytes <= plan.budget);
        n_feasible++;
        if (plan.knobs.n_persist < t->n_chunk) n_offloading++;
        assert_int_equal(plan.cost.n_buffer_min_block, pt_cost_buffer_min_block_of(t, plan.knobs.n_persist));
        assert_true(plan.knobs.n_buffer >= plan.cost.n_buffer_min_block);
        if (plan.knobs.n_buffer < plan.cost.n_buffer_min) {
            n_below_lookahead++;
            assert_true(plan.cost.h2d_sync_bytes > 0);
        }
    }
    pt_plan_free(&plan);
}

static void test_matches_brute_force(void **state) {
    (void)state;
    const uint64_t MB = 1 << 20;
    synth cases[] = {
        {5, 2, 2, 1.0, 0.004, 2e9, 0, 0},
        {5, 2, 1, 1.0, 0.004, 2e9, 0, 0},
        {6, 2, 2, 0.0, 0.002, 1e9, 0, 0},
        {4, 3, 2, 0.3, 0.02, 8e9, 0, 0},
    };
    uint64_t caps[] = {150, 180, 220, 260, 330, 420, 600, 1000};
    long runs = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pt_trace t;
        build(&t, &cases[i]);
        for (size_t j = 0; j < sizeof caps / sizeof caps[0]; j++)
            for (int clip = 0; clip < 2; clip++) {
                pt_search_opts o;
                pt_search_opts_default(&o);
                o.capacity = caps[j] * MB;
                o.cost.clip = clip;
                o.cost.reserve_bytes = 3 * MB;
                o.cost.frag = j % 2 ? 1.05 : 1.0;
                expect_same(&t, &o);
                runs++;
            }
        /* a host budget that forbids offloading much */
        pt_search_opts o;
        pt_search_opts_default(&o);
        o.capacity = 260 * MB;
        o.host_ram = 120 * MB;
        expect_same(&t, &o);
        pt_trace_free(&t);
    }
    assert_int_equal(runs, 64);
    /* the sweep must exercise real decisions, not only trivial extremes */
    assert_true(n_feasible >= 40);
    assert_true(n_offloading >= 20);
    assert_true(n_feasible - n_offloading >= 4);
}

/* Layouts whose consecutive blocks share a chunk (lookahead minimum well
 * above the one-block minimum), transfer- and CPU-bound, under capacities
 * from tight to loose: the plans below the lookahead minimum, the deferred
 * scoring of small pools and the final fewest-buffers scan all face brute
 * force. */
static void test_matches_brute_force_small_pools(void **state) {
    (void)state;
    const uint64_t MB = 1 << 20;
    synth cases[] = {
        {5, 3, 2, 1.0, 0.004, 2e9, 1, 0},
        {5, 3, 1, 1.0, 0.004, 2e9, 1, 3e7},
        {4, 3, 2, 0.5, 0.01, 4e9, 1, 1e7},
        {6, 2, 2, 1.0, 0.002, 2e9, 1, 2e7},
    };
    uint64_t caps[] = {120, 140, 160, 180, 200, 230, 270, 330};
    int before_below = n_below_lookahead, before_feasible = n_feasible;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pt_trace t;
        build(&t, &cases[i]);
        for (size_t j = 0; j < sizeof caps / sizeof caps[0]; j++)
            for (int clip = 0; clip < 2; clip++) {
                pt_search_opts o;
                pt_search_opts_default(&o);
                o.capacity = caps[j] * MB;
                o.cost.clip = clip;
                o.cost.frag = j % 2 ? 1.05 : 1.0;
                expect_same(&t, &o);
                /* every small pool scored only at the end: the deferred path alone */
                o.defer_small = 1;
                expect_same(&t, &o);
            }
        pt_trace_free(&t);
    }
    assert_true(n_feasible - before_feasible >= 60);
    assert_true(n_below_lookahead - before_below >= 16);   /* small pools do win under tight capacity */
}

static unsigned rnd_state = 7;
static double unif(void) {
    rnd_state = rnd_state * 1103515245u + 12345u;
    return ((rnd_state >> 8) & 0xffffff) / 16777216.0;
}

/* Random layouts (shared chunks, frozen chunks, uneven sizes) and hardware
 * (either copy-engine count, CPU from starved to fast), random capacity and
 * clipping, with and without deferred scoring: always the brute-force plan. */
static void test_matches_brute_force_random(void **state) {
    (void)state;
    const uint64_t MB = 1 << 20;
    int before = n_feasible, before_below = n_below_lookahead;
    for (int trial = 0; trial < 150; trial++) {
        int N = 2 + (int)(unif() * 4), cpb = 1 + (int)(unif() * 3), K = N * cpb + 2;
        pt_trace t;
        pt_trace_init(&t);
        assert_int_equal(pt_trace_alloc(&t, N, K, NULL, 0), PT_OK);
        int k = 0;
        t.chunks[k++] = (pt_trace_chunk){.bytes = 8 * MB, .elems = 4 * MB, .trainable_elems = 4 * MB, .first_block = -1, .last_block = -1, .mandatory = 1};
        for (int b = 0; b < N; b++)
            for (int j = 0; j < cpb; j++) {
                uint64_t by = (4 + (uint64_t)(unif() * 5)) * MB, el = by / 2;
                int last = (j == cpb - 1 && b + 1 < N && unif() < 0.7) ? b + 1 : b;
                t.chunks[k++] = (pt_trace_chunk){.bytes = by, .elems = el, .trainable_elems = unif() < 0.9 ? el : 0, .first_block = b, .last_block = last};
            }
        t.chunks[k++] = (pt_trace_chunk){.bytes = 4 * MB, .elems = 2 * MB, .trainable_elems = 2 * MB, .first_block = -1, .last_block = -1, .mandatory = 1};
        double fwd = 0.001 + unif() * 0.01;
        for (int b = 0; b < N; b++)
            t.blocks[b] = (pt_trace_block){fwd * (0.8 + 0.4 * unif()), 2 * fwd, fwd, (10 + (uint64_t)(unif() * 20)) * MB,
                                           MB, 2 * MB, 3 * MB, 2 * MB, 0, 0};
        pt_trace_derive_ranges(&t);
        t.chunk_size = 8 * MB;
        t.param_elem_bytes = t.grad_elem_bytes = 2;
        t.master_elem_bytes = t.adam_m_elem_bytes = t.adam_v_elem_bytes = t.host_grad_elem_bytes = 4;
        t.slot_bytes = 16 * MB;
        t.embed_fwd_s = t.embed_bwd_s = 0.001;
        t.head_fwd_s = 0.002;
        t.head_bwd_s = 0.004;
        t.nonblock_bytes = 5 * MB;
        t.nonblock_scratch_bytes = 4 * MB;
        t.hw = (pt_trace_hw){2e8 + unif() * 4e9, 2e8 + unif() * 4e9, 3e6 + unif() * 1e9, 2e10, 0, 1 + (unif() < 0.5),
                             0, 0, 1ull << 30, 0, 0, 0, 0, 0, 0, 0, 0};
        t.key.world_size = 1;
        t.key.version = PT_TRACE_VERSION;
        for (int d = 0; d < 2; d++) {
            pt_search_opts o;
            pt_search_opts_default(&o);
            o.capacity = (uint64_t)((60 + unif() * 200) * (double)MB);
            o.cost.clip = unif() < 0.3;
            o.defer_small = d;
            expect_same(&t, &o);
        }
        pt_trace_free(&t);
    }
    printf("random layouts: %d feasible searches, %d plans below the lookahead minimum\n", n_feasible - before,
           n_below_lookahead - before_below);
    assert_true(n_feasible - before >= 90);
    assert_true(n_below_lookahead - before_below >= 30);
}

/* A fixed n_buffer between the one-block and the lookahead minimum is a valid
 * plan: predicted with the synchronous uploads exposed. Below the one-block
 * minimum the search fails naming both numbers, not host RAM. */
static void test_fixed_small_buffer(void **state) {
    (void)state;
    const uint64_t MB = 1 << 20;
    synth s = {5, 3, 2, 1.0, 0.004, 2e9, 1, 0};
    pt_trace t;
    build(&t, &s);
    pt_cost_ctx *cx;
    char err[512];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    int lo1 = pt_cost_buffer_min_block(cx, 0), lo2 = pt_cost_buffer_min(cx, 0);
    assert_true(lo1 + 2 <= lo2);   /* shared chunks: a real gap between the two */
    pt_search_opts o;
    pt_search_opts_default(&o);
    o.capacity = 1ull << 30;
    o.n_persist = 0;
    o.host_ram = 20ull << 30;
    pt_plan plan, at2;
    pt_plan_init(&plan);
    pt_plan_init(&at2);
    o.n_buffer = lo2;
    assert_int_equal(pt_search(&t, &o, &at2, err, sizeof err), PT_OK);
    o.n_buffer = lo1;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_OK);
    assert_int_equal(plan.knobs.n_buffer, lo1);
    assert_int_equal(plan.cost.n_buffer_min_block, lo1);
    assert_int_equal(plan.cost.n_buffer_min, lo2);
    /* smaller pool, more waiting */
    assert_true(plan.cost.peak_bytes < at2.cost.peak_bytes);
    assert_true(plan.cost.h2d_sync_bytes > at2.cost.h2d_sync_bytes);
    assert_true(plan.cost.sync_xfer_s > 0);
    assert_true(plan.cost.exposed_xfer_s >= plan.cost.sync_xfer_s - 1e-12);
    assert_true(plan.cost.iter_s > at2.cost.iter_s);
    char *tx = pt_plan_text(&plan);
    assert_non_null(tx);
    char want[128];
    snprintf(want, sizeof want, "(one-block minimum %d, lookahead minimum %d)", lo1, lo2);
    assert_non_null(strstr(tx, want));
    assert_non_null(strstr(tx, "below the lookahead minimum"));
    free(tx);
    tx = pt_plan_json(&plan);
    assert_non_null(tx);
    assert_non_null(strstr(tx, "\"h2d_sync_bytes\""));
    free(tx);
    /* one below the one-block minimum: the runtime could not gather a block */
    o.n_buffer = lo1 - 1;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    char num[160];
    snprintf(num, sizeof num, "n_buffer=%d is below the one-block minimum %d for n_persist=0", lo1 - 1, lo1);
    if (!strstr(err, num)) fprintf(stderr, "%s\n", err);
    assert_non_null(strstr(err, num));
    assert_null(strstr(err, "host RAM"));
    /* n_persist searched: still the buffer, with the closest n_persist */
    o.n_persist = -1;
    o.n_buffer = 0;
    o.capacity = 40 * MB;   /* only all-resident would take 0 buffers, and it does not fit */
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    assert_null(strstr(err, "host RAM"));
    assert_non_null(strstr(err, "needs at least"));   /* n_persist = n_chunk accepts 0: the device is the reason */
    o.n_buffer = 1;
    o.n_persist = 2;   /* block 0's three chunks stream: one slot cannot hold them */
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    assert_non_null(strstr(err, "n_buffer=1 is below the one-block minimum"));
    pt_plan_free(&plan);
    pt_plan_free(&at2);
    pt_cost_ctx_free(cx);
    pt_trace_free(&t);
}

static void test_overrides(void **state) {
    (void)state;
    const uint64_t MB = 1 << 20;
    synth s = {6, 2, 2, 1.0, 0.004, 2e9, 0, 0};
    pt_trace t;
    build(&t, &s);
    pt_search_opts o;
    pt_search_opts_default(&o);
    o.capacity = 260 * MB;
    pt_plan plan;
    pt_plan_init(&plan);
    char err[512];
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_OK);
    pt_knobs free_k = plan.knobs;
    assert_int_equal(plan.fixed, 0);
    /* values to pin: not the searched ones where possible, still feasible */
    pt_knobs pin = {free_k.n_persist > 0 ? free_k.n_persist - 1 : 1, free_k.n_buffer + 1, 1, 2};
    for (unsigned mask = 1; mask < 16; mask++) {
        pt_search_opts f = o;
        if (mask & PT_KNOB_PERSIST) f.n_persist = pin.n_persist;
        if (mask & PT_KNOB_BUFFER) f.n_buffer = pin.n_buffer;
        if (mask & PT_KNOB_SWAP) f.n_swap = pin.n_swap;
        if (mask & PT_KNOB_CKPT) f.n_checkpoint = pin.n_checkpoint;
        best b = brute(&t, &f);
        int rc = pt_search(&t, &f, &plan, err, sizeof err);
        if (!b.found) {
            assert_int_equal(rc, PT_ERR_INFEASIBLE);
            continue;
        }
        assert_int_equal(rc, PT_OK);
        assert_int_equal(plan.fixed, mask);
        if (mask & PT_KNOB_PERSIST) assert_int_equal(plan.knobs.n_persist, pin.n_persist);
        if (mask & PT_KNOB_BUFFER) assert_int_equal(plan.knobs.n_buffer, pin.n_buffer);
        if (mask & PT_KNOB_SWAP) assert_int_equal(plan.knobs.n_swap, pin.n_swap);
        if (mask & PT_KNOB_CKPT) assert_int_equal(plan.knobs.n_checkpoint, pin.n_checkpoint);
        assert_memory_equal(&plan.knobs, &b.k, sizeof b.k);
        char *tx = pt_plan_text(&plan);
        assert_non_null(tx);
        assert_non_null(strstr(tx, "fixed by INI"));
        if (mask != 15) assert_non_null(strstr(tx, "searched"));
        free(tx);
    }
    /* out of range overrides are named */
    pt_search_opts f = o;
    f.n_persist = t.n_chunk + 1;
    assert_int_equal(pt_search(&t, &f, &plan, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "n_persist"));
    f = o;
    f.n_swap = 4;
    f.n_checkpoint = 3;
    assert_int_equal(pt_search(&t, &f, &plan, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "n_checkpoint=3"));
    pt_plan_free(&plan);
    pt_trace_free(&t);
}

static void test_capacity_monotone(void **state) {
    (void)state;
    pt_trace t;
    synth s = {8, 2, 2, 1.0, 0.003, 3e9, 0, 0};
    build(&t, &s);
    pt_plan plan;
    pt_plan_init(&plan);
    char err[512];
    double prev_best = INFINITY, prev_iter = INFINITY;
    int feasible = 0;
    for (uint64_t cap = 100ull << 20; cap <= 1600ull << 20; cap += 10ull << 20) {
        pt_search_opts o;
        pt_search_opts_default(&o);
        o.capacity = cap;
        o.cost.headroom_bytes = 2 << 20;
        int rc = pt_search(&t, &o, &plan, err, sizeof err);
        if (rc == PT_ERR_INFEASIBLE) {
            assert_int_equal(feasible, 0);   /* once feasible, more capacity stays feasible */
            continue;
        }
        assert_int_equal(rc, PT_OK);
        feasible++;
        assert_true(plan.cost.peak_bytes <= cap - (2 << 20));
        /* the fastest feasible time never grows with capacity (the feasible set grows) */
        assert_true(plan.best_iter_s <= prev_best * (1 + 1e-12));
        /* the chosen plan may trade up to 1% for fewer CKPT blocks (tie rule):
         * iter(B) <= 1.01 best(B) <= 1.01 best(A) <= 1.01 iter(A) */
        assert_true(plan.cost.iter_s <= 1.01 * prev_iter * (1 + 1e-12));
        assert_true(plan.cost.iter_s <= 1.01 * plan.best_iter_s * (1 + 1e-12));
        prev_best = plan.best_iter_s;
        prev_iter = plan.cost.iter_s;
    }
    assert_true(feasible > 20);
    /* at the top everything is resident */
    assert_int_equal(plan.knobs.n_persist, t.n_chunk);
    assert_int_equal(plan.knobs.n_buffer, 0);
    pt_plan_free(&plan);
    pt_trace_free(&t);
}

static void test_infeasible_states_capacity(void **state) {
    (void)state;
    pt_trace t;
    synth s = {6, 2, 2, 1.0, 0.004, 2e9, 0, 0};
    build(&t, &s);
    pt_plan plan;
    pt_plan_init(&plan);
    char err[512];
    pt_search_opts o;
    pt_search_opts_default(&o);
    o.capacity = 40ull << 20;
    o.cost.reserve_bytes = 1 << 20;
    o.cost.headroom_bytes = 3 << 20;
    o.cost.frag = 1.07;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    uint64_t need = plan.min_capacity;
    assert_true(need > o.capacity);
    char num[32];
    snprintf(num, sizeof num, "%llu bytes", (unsigned long long)need);
    assert_non_null(strstr(err, num));
    assert_non_null(strstr(err, "needs at least"));
    /* that capacity works, one byte less does not */
    o.capacity = need;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_OK);
    assert_true(plan.cost.peak_bytes <= plan.budget);
    o.capacity = need - 1;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    /* fixed knobs are honoured by the explanation too */
    o.capacity = 40ull << 20;
    o.n_checkpoint = 0;
    o.n_swap = 0;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    assert_true(plan.min_capacity > need);
    o.capacity = plan.min_capacity;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_OK);
    /* host RAM that cannot hold the fixed offload */
    pt_search_opts_default(&o);
    o.capacity = 1ull << 30;
    o.n_persist = 0;
    o.host_ram = 1 << 20;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    assert_non_null(strstr(err, "host RAM"));
    pt_plan_free(&plan);
    pt_trace_free(&t);
}

/* The disk tier ([nvme] path): a fixed offload whose states exceed the pinned
 * budget is infeasible without a tier and planned with one, its pinned bytes
 * then within the budget and below the full states'; at a budget that holds
 * the states the tier is not used. */
static void test_tier_only_when_needed(void **state) {
    (void)state;
    pt_trace t;
    synth s = {6, 2, 2, 1.0, 0.004, 2e9, 0, 0};
    build(&t, &s);
    pt_plan plan;
    pt_plan_init(&plan);
    char err[512];
    pt_search_opts o;
    pt_search_opts_default(&o);
    o.capacity = 1ull << 30;
    o.n_persist = 0;
    o.host_ram = 1ull << 40;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_OK);
    uint64_t full = plan.cost.host_bytes;
    assert_int_equal(plan.cost.on_tier, 0);
    o.host_ram = full - 1;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    o.cost.tier_slots = 3;
    o.cost.tier_above = o.host_ram;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_OK);
    assert_int_equal(plan.cost.on_tier, 1);
    assert_true(plan.cost.host_bytes <= o.host_ram);
    assert_true(plan.cost.host_bytes < full);
    char *txt = pt_plan_text(&plan);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "disk tier"));
    free(txt);
    o.host_ram = o.cost.tier_above = full;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_OK);
    assert_int_equal(plan.cost.on_tier, 0);
    assert_int_equal(plan.cost.host_bytes, full);
    pt_plan_free(&plan);
    pt_trace_free(&t);
}

/* A fixed offload that fits no level of the disk tier is refused with a
 * sentence naming its pinned and disk bytes (level 2's, computed here by
 * pt_cost_tier); a disk budget below level 2's file likewise; one byte more
 * of either and the plan is made, at level 2, with its I/O in the plan's
 * text and JSON. */
static void test_tier_refusal_names_bytes(void **state) {
    (void)state;
    pt_trace t;
    synth s = {6, 2, 2, 1.0, 0.004, 2e9, 0, 0};
    build(&t, &s);
    pt_search_opts o;
    pt_search_opts_default(&o);
    o.capacity = 1ull << 30;
    o.n_persist = 0;
    o.n_swap = 0;   /* no swap pool: the pinned bytes are the tier's alone */
    o.cost.tier_slots = 3;
    o.cost.tier_block = 4096;
    o.cost.tier_rd_Bps = 2e9;
    o.cost.tier_wr_Bps = 1e9;
    pt_cost_ctx *cx;
    char err[1024];
    assert_int_equal(pt_cost_ctx_new(&t, &cx, err, sizeof err), PT_OK);
    pt_tier_fig f;
    o.cost.tier_above = 1;
    pt_cost_tier(cx, NULL, 0, &o.cost, &f);
    pt_cost_ctx_free(cx);
    assert_int_equal(f.level, 2);
    char pin[32], disk[32];
    snprintf(pin, sizeof pin, "%llu", (unsigned long long)f.pinned);
    snprintf(disk, sizeof disk, "%llu", (unsigned long long)f.disk);
    pt_plan plan;
    pt_plan_init(&plan);

    o.host_ram = o.cost.tier_above = f.pinned - 1;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    assert_non_null(strstr(err, "even with the disk tier"));
    assert_non_null(strstr(err, "level 2"));
    assert_non_null(strstr(err, pin));
    assert_non_null(strstr(err, disk));

    o.host_ram = o.cost.tier_above = f.pinned;
    o.disk_budget = f.disk - 1;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_ERR_INFEASIBLE);
    assert_non_null(strstr(err, "no plan fits the disk tier"));
    assert_non_null(strstr(err, pin));
    assert_non_null(strstr(err, disk));

    o.disk_budget = f.disk;
    assert_int_equal(pt_search(&t, &o, &plan, err, sizeof err), PT_OK);
    assert_int_equal(plan.cost.on_tier, 2);
    assert_int_equal(plan.cost.host_bytes, f.pinned);
    assert_int_equal(plan.cost.tier_disk_bytes, f.disk);
    assert_true(plan.cost.tier_io_s > 0);
    char *txt = pt_plan_text(&plan), *js = pt_plan_json(&plan);
    assert_non_null(txt);
    assert_non_null(js);
    assert_non_null(strstr(txt, "whole images on [nvme] path (level 2"));
    assert_non_null(strstr(txt, "exposed"));
    assert_non_null(strstr(js, "\"tier_exposed_s\""));
    assert_non_null(strstr(js, "\"tier_io_s\""));
    assert_non_null(strstr(js, "\"nvme_tier\": 2"));
    free(txt);
    free(js);
    pt_plan_free(&plan);
    pt_trace_free(&t);
}

static void test_shape_trace_respects_capacity(void **state) {
    (void)state;
    /* GPT-2 124M, bf16, batch 8: a realistic layout from the shape synthesiser */
    pt_model_shape m = {PT_ARCH_GPT, 12, 768, 12, 0, 0, 50257, 1024, 8, 1024, PT_BF16, 1, 0, 1.0};
    pt_hw_shape hw = {8ull << 30, 16e9, 16e9, 2, 1, 1e9, 3e10, 50e12, 0, 0, "test", 0, 0};
    pt_trace t;
    pt_trace_init(&t);
    char err[512];
    assert_int_equal(pt_shape_trace(&m, &hw, 0, &t, err, sizeof err), PT_OK);
    pt_plan plan;
    pt_plan_init(&plan);
    for (uint64_t gib4 = 8; gib4 <= 64; gib4 += 4) {   /* 2 .. 16 GiB */
        pt_search_opts o;
        pt_search_opts_default(&o);
        o.capacity = gib4 << 28;
        o.cost.reserve_bytes = 256 << 20;
        int rc = pt_search(&t, &o, &plan, err, sizeof err);
        if (rc == PT_ERR_INFEASIBLE) continue;
        assert_int_equal(rc, PT_OK);
        assert_true(plan.cost.peak_bytes <= o.capacity - o.cost.reserve_bytes);
        char *js = pt_plan_json(&plan);
        assert_non_null(js);
        free(js);
    }
    pt_plan_free(&plan);
    pt_trace_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_brute_force),
        cmocka_unit_test(test_matches_brute_force_small_pools),
        cmocka_unit_test(test_matches_brute_force_random),
        cmocka_unit_test(test_fixed_small_buffer),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_capacity_monotone),
        cmocka_unit_test(test_infeasible_states_capacity),
        cmocka_unit_test(test_shape_trace_respects_capacity),
        cmocka_unit_test(test_tier_only_when_needed),
        cmocka_unit_test(test_tier_refusal_names_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
