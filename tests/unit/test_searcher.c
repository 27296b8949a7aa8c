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

#include "cost_model.h"
#include "ds_estimates.h"
#include "placement.h"
#include "protrain.h"
#include "searcher.h"
#include "trace_cache.h"

typedef struct synth {
    int n_block, cpb, engines;
    double tf, fwd, d2h;
} synth;

/* Blocks with 2..3 chunks of varying size, mandatory embedding/head chunks. */
static void build(pt_trace *t, const synth *s) {
    pt_trace_init(t);
    int K = s->n_block * s->cpb + 2;
    assert_int_equal(pt_trace_alloc(t, s->n_block, K, NULL, 0), PT_OK);
    int k = 0;
    const uint64_t MB = 1 << 20;
    t->chunks[k++] = (pt_trace_chunk){8 * MB, 4 * MB, 4 * MB, -1, -1, 1, 0};
    for (int b = 0; b < s->n_block; b++)
        for (int j = 0; j < s->cpb; j++) {
            uint64_t by = (6 + (uint64_t)((b * 3 + j) % 3)) * MB, el = by / 2;
            t->chunks[k++] = (pt_trace_chunk){by, el, (uint64_t)(s->tf * (double)el), b, b, 0, 0};
        }
    t->chunks[k++] = (pt_trace_chunk){4 * MB, 2 * MB, 2 * MB, -1, -1, 1, 0};
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
    t->hw = (pt_trace_hw){2e9, s->d2h, 1e9, 2e10, 0, s->engines, 0, 0, 1ull << 30};
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
    int N = t->n_block, K = t->n_chunk, cap = pt_swap_cap(N, pt_cost_swap_interval(cx));
    uint64_t budget = pt_cost_budget(o->capacity ? o->capacity : t->hw.device_capacity, &o->cost);
    uint64_t hb = o->host_ram ? o->host_ram : t->hw.host_ram_bytes;
    int n = 0, m = 0;
    double *T = malloc(200000 * sizeof *T);
    pt_knobs *ks = malloc(200000 * sizeof *ks);
    double Tmin = INFINITY;
    for (int c = 0; c <= N; c++)
        for (int s = 0; s <= cap && s + c <= N; s++)
            for (int p = 0; p <= K; p++)
                for (int nb = pt_cost_buffer_min(cx, p); nb <= K - p; nb++) {
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

static int n_feasible, n_offloading;

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
    }
    pt_plan_free(&plan);
}

static void test_matches_brute_force(void **state) {
    (void)state;
    const uint64_t MB = 1 << 20;
    synth cases[] = {
        {5, 2, 2, 1.0, 0.004, 2e9}, {5, 2, 1, 1.0, 0.004, 2e9}, {6, 2, 2, 0.0, 0.002, 1e9}, {4, 3, 2, 0.3, 0.02, 8e9},
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

static void test_overrides(void **state) {
    (void)state;
    const uint64_t MB = 1 << 20;
    synth s = {6, 2, 2, 1.0, 0.004, 2e9};
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
    synth s = {8, 2, 2, 1.0, 0.003, 3e9};
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
    synth s = {6, 2, 2, 1.0, 0.004, 2e9};
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

static void test_shape_trace_respects_capacity(void **state) {
    (void)state;
    /* GPT-2 124M, bf16, batch 8: a realistic layout from the shape synthesiser */
    pt_model_shape m = {PT_ARCH_GPT, 12, 768, 12, 0, 0, 50257, 1024, 8, 1024, PT_BF16, 1, 0, 1.0};
    pt_hw_shape hw = {8ull << 30, 16e9, 16e9, 2, 1, 1e9, 3e10, 50e12, 0, 0, "test"};
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
        cmocka_unit_test(test_matches_brute_force),       cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_capacity_monotone),         cmocka_unit_test(test_infeasible_states_capacity),
        cmocka_unit_test(test_shape_trace_respects_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
