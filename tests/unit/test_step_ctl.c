/*
 * test_step_ctl.c — the ABI 1.6 step controls: discard_step (a failed step
 * dropped) and replan (another batch shape planned).
 *
 * discard_step's oracle: a run that starts a step, fails somewhere in it
 * (inside a forward window, inside a backward window, after the whole
 * backward, after a forward without backward, in micro-batch 1 of 2, in an
 * evaluation pass), discards it and then trains on must end with exactly the
 * weights of a run that never started the failed step (the host's gradients
 * are deterministic, so bit-exact), resident and offloaded (with SWAP and
 * CKPT arenas), and hold no more device bytes between steps than before the
 * failure. Ordering: refused before create_optimizer, after optimizer_step,
 * from inside a host callback, and once the CPU optimizer stepped a chunk of
 * the step (overlap); each refusal changes nothing.
 *
 * replan's: the profile at the new shape raises the predicted peak, weights
 * and step count cross the rebuild unchanged, and a shape the device cannot
 * hold is refused naming bytes, with the old plan still training.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "hook_host.h"

/* The test's host: hook_host.h's model and math, with activation arenas of
 * ARENA_TOKEN bytes per token (batch x seq), and callbacks that can call
 * discard_step from inside. */
enum { ARENA_TOKEN = 4096 };

typedef struct sc_host {
    hh_host h;
    int64_t batch, seq;
    int discard_in_recompute;  /* recompute_block calls discard_step (ordering) */
    int inner_rc;              /* what that call returned */
} sc_host;

static int arena(sc_host *s, int b) {
    void *p = NULL;
    uint64_t bytes = (uint64_t)(ARENA_TOKEN * s->batch * s->seq);
    int rc = HH_P->activation_arena(s->h.ctx, b, bytes, &p);
    if (!rc) memset(p, 0x3c, (size_t)bytes);   /* the host's activations */
    return rc;
}

/* Forward of blocks [0, stop) (stop = HH_NB: all); stop_inside: also opens
 * block stop's window and leaves it open (a failure inside it). */
static int fwd(sc_host *s, int stop, int stop_inside) {
    hh_host *h = &s->h;
    for (int b = 0; b < HH_NB; b++) {
        if (b == stop && !stop_inside) return 0;
        int rc = HH_P->block_pre_forward(h->ctx, b);
        if (rc) return rc;
        if (b == stop) return 0;
        if (hh_fwd(h, b)) return PT_ERR_INTERNAL;
        if ((rc = arena(s, b))) return rc;
        if ((rc = HH_P->block_post_forward(h->ctx, b))) return rc;
    }
    return 0;
}

/* Backward of blocks down to `stop` (exclusive; -1: all), the last one left
 * open with half its gradient added when stop_inside. */
static int bwd_from(sc_host *s, int top, int stop, int stop_inside) {
    hh_host *h = &s->h;
    for (int b = top; b >= 0; b--) {
        if (b == stop && !stop_inside) return 0;
        int rc = HH_P->block_pre_backward(h->ctx, b);
        if (rc) return rc;
        if (b == stop) {   /* a failure half-way through the block's gradient */
            float *g = h->p[h->of_block[b]].grad;
            for (int k = 0; k < HH_NEL / 2; k++) g[k] += 7.0f;
            return 0;
        }
        hh_bwd(h, b);
        if ((rc = HH_P->block_post_backward(h->ctx, b))) return rc;
    }
    return 0;
}

static int bwd(sc_host *s, int stop, int stop_inside) {
    return bwd_from(s, HH_NB - 1, stop, stop_inside);
}

static int32_t sc_profile(void *user) {
    sc_host *s = user;
    s->h.profiling = 1;
    int rc = fwd(s, HH_NB, 0);
    if (!rc) rc = bwd(s, -1, 0);
    s->h.profiling = 0;
    return rc;
}

static int32_t sc_recompute(void *user, int32_t b) {
    sc_host *s = user;
    if (s->discard_in_recompute) s->inner_rc = HH_P->discard_step(s->h.ctx);
    double keep = s->h.loss;
    int rc = hh_fwd(&s->h, b);
    s->h.loss = keep;
    return rc;
}

/* hook_host's model, in a context with this test's callbacks. */
static void sc_open(sc_host *s, const char *ini_extra, int64_t batch, int64_t seq) {
    memset(s, 0, sizeof *s);
    hh_opts o = {0};
    hh_make(&s->h, &o, "force_all_persistent = true\n");
    assert_int_equal(HH_P->finalize(s->h.ctx), PT_OK);
    s->batch = batch;
    s->seq = seq;
    s->h.m.batch = batch;
    s->h.m.seq = seq;
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = %s\n[protrain]\nchunk_size = 128KiB\n%s\n",
             getenv("HH_LOG") ? getenv("HH_LOG") : "error", ini_extra);
    pt_host_v1 hs = hb_host(s);
    hs.profile_step = sc_profile;
    hs.recompute_block = sc_recompute;
    hs.log = hh_log;
    s->h.ctx = hb_open(HH_P, text, &hs);
    if (HH_P->post_model_load(s->h.ctx, &s->h.m))
        fail_msg("post_model_load: %s", HH_P->last_error(s->h.ctx));
    pt_optim_v1 od = {.struct_size = sizeof od, .type = PT_OPTIM_ADAMW, .lr = 1e-2f,
                      .beta1 = NAN, .beta2 = NAN, .eps = NAN, .weight_decay = NAN,
                      .max_grad_norm = NAN};
    if (HH_P->create_optimizer(s->h.ctx, &od))
        fail_msg("create_optimizer: %s", HH_P->last_error(s->h.ctx));
}

static void ok(sc_host *s, int rc, const char *what) {
    if (rc) fail_msg("%s: %s", what, HH_P->last_error(s->h.ctx));
}

/* One good step of n_micro micro-batches. */
static void good_step(sc_host *s, int64_t step, int n_micro, int set_lr) {
    for (int m = 0; m < n_micro; m++) {
        ok(s, HH_P->pre_step(s->h.ctx, step, m, n_micro), "pre_step");
        if (set_lr && m == 0) ok(s, HH_P->set_lr(s->h.ctx, 1e-2f), "set_lr");
        hh_nonblock(&s->h, 0);
        ok(s, fwd(s, HH_NB, 0), "forward");
        ok(s, bwd(s, -1, 0), "backward");
        hh_nonblock(&s->h, 1);
    }
    ok(s, HH_P->optimizer_step(s->h.ctx, -1.0f), "optimizer_step");
    ok(s, HH_P->post_step(s->h.ctx, step, 0.0f), "post_step");
}

enum fail_at {
    F_NONE = 0,
    F_FWD_INSIDE,    /* inside block 3's forward window */
    F_FWD_BETWEEN,   /* between blocks 4 and 5 of the forward */
    F_NO_BACKWARD,   /* the whole forward, then no backward (a dropped loss) */
    F_BWD_INSIDE,    /* inside block 5's backward window, half its gradient added */
    F_BWD_DONE,      /* the whole backward, then no optimizer_step */
    F_MICRO1,        /* micro-batch 0 of 2 complete, micro-batch 1 fails in block 2 */
    F_EVAL           /* an evaluation pass fails inside block 4 */
};

/* The failed attempt: pre_step, the work up to the failure, discard_step. */
static void failed_step(sc_host *s, int64_t step, enum fail_at f, int n_micro, int set_lr) {
    void *ctx = s->h.ctx;
    if (f == F_EVAL) {
        ok(s, HH_P->pre_step(ctx, step, -1, 0), "pre_step (eval)");
        ok(s, fwd(s, 4, 1), "eval forward");
    } else {
        ok(s, HH_P->pre_step(ctx, step, 0, n_micro), "pre_step");
        if (set_lr) ok(s, HH_P->set_lr(ctx, 1e-2f), "set_lr");
        hh_nonblock(&s->h, 0);
        if (f == F_MICRO1) {
            ok(s, fwd(s, HH_NB, 0), "forward");
            ok(s, bwd(s, -1, 0), "backward");
            hh_nonblock(&s->h, 1);
            ok(s, HH_P->pre_step(ctx, step, 1, n_micro), "pre_step micro 1");
            ok(s, fwd(s, 2, 1), "forward micro 1");
        } else if (f == F_FWD_INSIDE || f == F_FWD_BETWEEN) {
            ok(s, fwd(s, f == F_FWD_INSIDE ? 3 : 5, f == F_FWD_INSIDE), "forward");
        } else {
            ok(s, fwd(s, HH_NB, 0), "forward");
            if (f == F_BWD_INSIDE) ok(s, bwd(s, 5, 1), "backward");
            if (f == F_BWD_DONE) {
                ok(s, bwd(s, -1, 0), "backward");
                hh_nonblock(&s->h, 1);
            }
        }
    }
    ok(s, HH_P->discard_step(ctx), "discard_step");
}

static uint64_t dev_current(sc_host *s) {
    pt_stats_v1 st = {.struct_size = sizeof st};
    ok(s, HH_P->get_stats(s->h.ctx, &st), "get_stats");
    return st.dev_current;
}

/* Trains 3 good steps (the failed attempt before step 2 when f != F_NONE) and
 * returns every weight, concatenated, in out[HH_NPAR * HH_NEL]. */
static void run(const char *ini, enum fail_at f, int n_micro, int set_lr, float *out) {
    sc_host s;
    sc_open(&s, ini, 1, 8);
    good_step(&s, 1, n_micro, set_lr);
    uint64_t before = dev_current(&s);
    if (f != F_NONE) {
        failed_step(&s, 2, f, n_micro, set_lr);
        /* every arena, lease and window of the dropped step is gone */
        assert_true(dev_current(&s) <= before);
    }
    good_step(&s, 2, n_micro, set_lr);
    good_step(&s, 3, n_micro, set_lr);
    for (int i = 0; i < HH_NPAR; i++)
        ok(&s, HH_P->read_param(s.h.ctx, i, out + (size_t)i * HH_NEL, HH_NEL * sizeof(float)),
           "read_param");
    pt_stats_v1 st = {.struct_size = sizeof st};
    ok(&s, HH_P->get_stats(s.h.ctx, &st), "get_stats");
    assert_int_equal(st.steps, 3);   /* the dropped step took no optimizer step */
    hh_done(&s.h);
}

static const char *const INI_RESIDENT = "force_all_persistent = true\n";
/* every chunk streamed, two SWAP and two CKPT blocks */
static const char *const INI_OFFLOAD =
    "auto_memory = false\nn_persist = 0\nn_buffer = 3\nn_swap = 2\nn_checkpoint = 2\n";

static void check_all(const char *ini, int set_lr) {
    static float ref[HH_NPAR * HH_NEL], got[HH_NPAR * HH_NEL];
    static const enum fail_at fs[] = {F_FWD_INSIDE, F_FWD_BETWEEN, F_NO_BACKWARD,
                                      F_BWD_INSIDE, F_BWD_DONE, F_EVAL};
    run(ini, F_NONE, 1, set_lr, ref);
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        if (set_lr && (fs[i] == F_BWD_INSIDE || fs[i] == F_BWD_DONE)) continue;  /* refused */
        run(ini, fs[i], 1, set_lr, got);
        if (memcmp(ref, got, sizeof ref)) fail_msg("failure kind %d: weights differ", (int)fs[i]);
    }
    /* accumulation: the whole step (both micro-batches) is dropped and redone */
    run(ini, F_NONE, 2, set_lr, ref);
    run(ini, F_MICRO1, 2, set_lr, got);
    if (memcmp(ref, got, sizeof ref)) fail_msg("micro-batch 1 of 2: weights differ");
}

static void test_discard_resident(void **state) {
    (void)state;
    check_all(INI_RESIDENT, 0);
}

static void test_discard_offloaded(void **state) {
    (void)state;
    check_all(INI_OFFLOAD, 0);
}

/* set_lr early: failures before any chunk's gradient is complete discard. */
static void test_discard_offloaded_set_lr(void **state) {
    (void)state;
    check_all(INI_OFFLOAD, 1);
}

/* The host's clipping of a dropped step is dropped with it: a step whose norm
 * was taken with a tiny max_norm (clip_grad_norm), then discarded, leaves the
 * next steps unclipped, equal to the run that never started it. */
static void test_discard_forgets_clipping(void **state) {
    (void)state;
    static float ref[HH_NPAR * HH_NEL], got[HH_NPAR * HH_NEL];
    const char *inis[2] = {INI_RESIDENT, INI_OFFLOAD};
    for (int k = 0; k < 2; k++) {
        run(inis[k], F_NONE, 1, 0, ref);
        sc_host s;
        sc_open(&s, inis[k], 1, 8);
        good_step(&s, 1, 1, 0);
        ok(&s, HH_P->pre_step(s.h.ctx, 2, 0, 1), "pre_step");
        ok(&s, HH_P->clip_grad_norm(s.h.ctx, 1e-3f, NULL), "clip_grad_norm (announce)");
        hh_nonblock(&s.h, 0);
        ok(&s, fwd(&s, HH_NB, 0), "forward");
        ok(&s, bwd(&s, -1, 0), "backward");
        hh_nonblock(&s.h, 1);
        double norm = 0;
        ok(&s, HH_P->clip_grad_norm(s.h.ctx, 1e-3f, &norm), "clip_grad_norm");
        assert_true(norm > 1e-3);
        ok(&s, HH_P->discard_step(s.h.ctx), "discard_step");
        good_step(&s, 2, 1, 0);
        good_step(&s, 3, 1, 0);
        for (int i = 0; i < HH_NPAR; i++)
            ok(&s, HH_P->read_param(s.h.ctx, i, got + (size_t)i * HH_NEL, HH_NEL * sizeof(float)),
               "read_param");
        hh_done(&s.h);
        if (memcmp(ref, got, sizeof ref)) fail_msg("%s: weights differ", inis[k]);
    }
}

/* Overlap: once the CPU optimizer stepped a chunk of this step, the discard is
 * refused and changes nothing: the host can still finish the step. */
static void test_discard_refused_after_cpu_step(void **state) {
    (void)state;
    sc_host s;
    sc_open(&s, INI_OFFLOAD, 1, 8);
    good_step(&s, 1, 1, 1);
    ok(&s, HH_P->pre_step(s.h.ctx, 2, 0, 1), "pre_step");
    ok(&s, HH_P->set_lr(s.h.ctx, 1e-2f), "set_lr");
    hh_nonblock(&s.h, 0);
    ok(&s, fwd(&s, HH_NB, 0), "forward");
    ok(&s, bwd(&s, 2, 0), "backward of blocks 7..3");
    assert_int_equal(HH_P->discard_step(s.h.ctx), PT_ERR_ORDER);
    const char *e = HH_P->last_error(s.h.ctx);
    assert_non_null(strstr(e, "already stepped"));
    assert_non_null(strstr(e, "cannot be undone"));
    /* nothing changed: the backward goes on from block 2 */
    ok(&s, bwd_from(&s, 2, -1, 0), "rest of backward");
    hh_nonblock(&s.h, 1);
    ok(&s, HH_P->optimizer_step(s.h.ctx, -1.0f), "optimizer_step");
    ok(&s, HH_P->post_step(s.h.ctx, 2, 0.0f), "post_step");
    hh_done(&s.h);
}

/* Out of order: before post_model_load, after optimizer_step, from inside a
 * host callback; between steps it does nothing. */
static void test_discard_order(void **state) {
    (void)state;
    pt_host_v1 hs = hb_host(NULL);
    void *ctx = hb_open(HH_P, "[plugin]\nbackend = host\nlog_level = error\n", &hs);
    assert_int_equal(HH_P->discard_step(ctx), PT_ERR_ORDER);
    assert_non_null(strstr(HH_P->last_error(ctx), "create_optimizer"));
    assert_int_equal(HH_P->finalize(ctx), PT_OK);

    sc_host s;
    sc_open(&s, INI_RESIDENT, 1, 8);
    ok(&s, HH_P->discard_step(s.h.ctx), "discard_step between steps");
    ok(&s, HH_P->pre_step(s.h.ctx, 1, 0, 1), "pre_step");
    ok(&s, fwd(&s, HH_NB, 0), "forward");
    ok(&s, bwd(&s, -1, 0), "backward");
    ok(&s, HH_P->optimizer_step(s.h.ctx, -1.0f), "optimizer_step");
    assert_int_equal(HH_P->discard_step(s.h.ctx), PT_ERR_ORDER);
    assert_non_null(strstr(HH_P->last_error(s.h.ctx), "call post_step"));
    ok(&s, HH_P->post_step(s.h.ctx, 1, 0.0f), "post_step after the refusal");
    hh_done(&s.h);

    /* from inside recompute_block (a CKPT block's backward) */
    sc_open(&s, "auto_memory = false\nforce_all_persistent = false\nn_persist = 0\n"
                "n_buffer = 3\nn_swap = 0\nn_checkpoint = 8\n", 1, 8);
    s.discard_in_recompute = 1;
    s.inner_rc = -1;
    ok(&s, HH_P->pre_step(s.h.ctx, 1, 0, 1), "pre_step");
    ok(&s, fwd(&s, HH_NB, 0), "forward");
    ok(&s, bwd(&s, -1, 0), "backward (recomputes)");
    assert_int_equal(s.inner_rc, PT_ERR_ORDER);
    ok(&s, HH_P->optimizer_step(s.h.ctx, -1.0f), "optimizer_step");
    ok(&s, HH_P->post_step(s.h.ctx, 1, 0.0f), "post_step");
    hh_done(&s.h);
}

/* ---- replan ---- */

static pt_stats_v1 stats(sc_host *s) {
    pt_stats_v1 st = {.struct_size = sizeof st};
    ok(s, HH_P->get_stats(s->h.ctx, &st), "get_stats");
    return st;
}

static void read_all(sc_host *s, float *out) {
    for (int i = 0; i < HH_NPAR; i++)
        ok(s, HH_P->read_param(s->h.ctx, i, out + (size_t)i * HH_NEL, HH_NEL * sizeof(float)),
           "read_param");
}

/* A longer sequence: profiled again (the predicted peak grows with the
 * arenas), the weights and the step count carried, training goes on at it. */
static void test_replan_larger(void **state) {
    (void)state;
    static float a[HH_NPAR * HH_NEL], b[HH_NPAR * HH_NEL];
    sc_host s;
    sc_open(&s, "[memory]\ndevice_capacity = 64MiB\n", 1, 8);
    good_step(&s, 1, 1, 0);
    pt_stats_v1 s0 = stats(&s);
    read_all(&s, a);
    s.seq = 64;
    ok(&s, HH_P->replan(s.h.ctx, 1, 64), "replan");
    assert_int_equal(s.h.m.seq, 64);
    pt_stats_v1 s1 = stats(&s);
    read_all(&s, b);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(s1.steps, s0.steps);
    assert_true(s1.pred_peak > s0.pred_peak);
    good_step(&s, 2, 1, 0);
    good_step(&s, 3, 1, 0);
    /* a smaller batch needs no replan: the plan holds it */
    s.seq = 4;
    good_step(&s, 4, 1, 0);
    assert_int_equal(stats(&s).steps, 4);
    hh_done(&s.h);
}

/* A shape the device cannot hold: refused naming bytes; the old shape and
 * plan stay and train. Ordering: not inside a step; shapes >= 1. */
static void test_replan_refused(void **state) {
    (void)state;
    static float a[HH_NPAR * HH_NEL], b[HH_NPAR * HH_NEL];
    sc_host s;
    sc_open(&s, "[memory]\ndevice_capacity = 4MiB\n", 1, 8);
    good_step(&s, 1, 1, 0);
    pt_stats_v1 s0 = stats(&s);
    read_all(&s, a);
    s.seq = 4096;   /* 16 MiB arenas per block */
    int rc = HH_P->replan(s.h.ctx, 1, 4096);
    const char *e = HH_P->last_error(s.h.ctx);
    if (rc != PT_ERR_OOM && rc != PT_ERR_INFEASIBLE && rc != PT_ERR_CALLBACK)
        fail_msg("replan returned %d: %s", rc, e);
    if (getenv("HH_LOG")) fprintf(stderr, "refusal: %s\n", e);
    assert_non_null(strstr(e, "replan(batch 1, sequence 4096)"));
    assert_non_null(strstr(e, "bytes"));
    assert_int_equal(s.h.m.seq, 8);
    s.seq = 8;
    pt_stats_v1 s1 = stats(&s);
    assert_int_equal(s1.pred_peak, s0.pred_peak);
    read_all(&s, b);
    assert_memory_equal(a, b, sizeof a);
    good_step(&s, 2, 1, 0);
    assert_int_equal(HH_P->replan(s.h.ctx, 0, 8), PT_ERR_INVALID_ARG);
    ok(&s, HH_P->pre_step(s.h.ctx, 3, 0, 1), "pre_step");
    assert_int_equal(HH_P->replan(s.h.ctx, 1, 16), PT_ERR_ORDER);
    ok(&s, HH_P->discard_step(s.h.ctx), "discard_step");
    hh_done(&s.h);
}

int main(void) {
    (void)hh_step;   /* hook_host.h's own step; this test runs its own */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discard_resident),
        cmocka_unit_test(test_discard_offloaded),
        cmocka_unit_test(test_discard_offloaded_set_lr),
        cmocka_unit_test(test_discard_forgets_clipping),
        cmocka_unit_test(test_discard_refused_after_cpu_step),
        cmocka_unit_test(test_discard_order),
        cmocka_unit_test(test_replan_larger),
        cmocka_unit_test(test_replan_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
