/*
 * test_clip_hook.c — the clip_grad_norm hook (ABI 1.6) against a reference
 * AdamW on host copies: the norm it returns is the global norm before
 * clipping, the step it clips matches the reference clipped at the host's max
 * norm, resident and offloaded (CPU-stepped) chunks alike, announced ahead or
 * not; the refusals (steps that already ran unclipped, a second max norm,
 * out of order) leave the run valid.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "host_builder.h"
#include "kernels_hd.h"
#include "protrain.h"
#include "tiny_model.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;
static char last_refusal[512];   /* run_case's last refused call's sentence */

#define STREAMED "[protrain]\nn_persist = 0\nn_buffer = 1\nchunk_size = 4KiB\n"
enum { STEPS = 3 };

typedef struct clip_case {
    const char *protrain;   /* [protrain] lines: NULL resident */
    float ini_max;          /* the optimizer's max_grad_norm */
    int set_lr;             /* set_lr before backward: offloaded chunks step during it */
    int announce;           /* clip_grad_norm(max, NULL) after pre_step */
    float call_max;         /* the call after backward; NAN: no call */
    float ann_max;          /* the announced max (0: call_max) */
} clip_case;

static void *start(tiny *t, const clip_case *cc) {
    char text[512];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n"
             "[optimizer]\nlr = 0.01\nweight_decay = 0.1\nmax_grad_norm = %g\n%s",
             (double)cc->ini_max, cc->protrain ? cc->protrain : "");
    void *ctx = hb_open(P, text, NULL);
    tiny_make(t);
    assert_int_equal(P->post_model_load(ctx, &t->m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    return ctx;
}

static float grad_of(int i, int k, float gval) {
    return i == 0 ? gval : gval * (float)(k + 1) * (i == 1 ? 1.0f : -0.5f);
}

/* Forward and backward of one micro-batch; the block windows add the grads. */
static void pass(void *ctx, tiny *t, int64_t step, float gval) {
    for (int b = 0; b < TINY_NB; b++) {
        assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
        assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
    }
    for (int b = TINY_NB - 1; b >= 0; b--) {
        assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
        float *g = t->p[b + 1].grad;
        for (int k = 0; k < TINY_NEL; k++) g[k] += grad_of(b + 1, k, gval);
        assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
    }
    float *ge = t->p[0].grad;
    for (int k = 0; k < TINY_NEL; k++) ge[k] += grad_of(0, k, gval);
    (void)step;
}

/* Runs the case; returns the last step's hook status. ref: the weights the
 * reference reaches clipping at ref_max (0: unclipped). */
static int run_case(const clip_case *cc, float ref_max, int check_weights) {
    tiny t;
    void *ctx = start(&t, cc);
    float ref[TINY_NP][TINY_NEL], m[TINY_NP][TINY_NEL], v[TINY_NP][TINY_NEL];
    memcpy(ref, t.init, sizeof ref);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    int rc = PT_OK;
    for (int64_t step = 0; step < STEPS; step++) {
        float gval = 0.3f * (float)(step + 1);
        assert_int_equal(P->pre_step(ctx, step, 0, 1), PT_OK);
        if (cc->set_lr) assert_int_equal(P->set_lr(ctx, 0.01f), PT_OK);
        if (cc->announce)
            assert_int_equal(P->clip_grad_norm(ctx, cc->ann_max > 0 ? cc->ann_max : cc->call_max,
                                               NULL),
                             PT_OK);
        pass(ctx, &t, step, gval);
        double sq = 0;
        for (int i = 0; i < TINY_NP; i++)
            for (int k = 0; k < TINY_NEL; k++) sq += (double)grad_of(i, k, gval) * grad_of(i, k, gval);
        double want = sqrt(sq), norm = -1;
        if (!isnan(cc->call_max)) {
            rc = P->clip_grad_norm(ctx, cc->call_max, &norm);
            if (rc) snprintf(last_refusal, sizeof last_refusal, "%s", P->last_error(ctx));
            if (rc == PT_OK) {
                if (fabs(norm - want) > 1e-12 * want)
                    fail_msg("step %lld: norm %.17g, want %.17g", (long long)step, norm, want);
            }
        }
        assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
        assert_int_equal(P->post_step(ctx, step, 1.0f), PT_OK);
        pt_stats_v1 st = {.struct_size = sizeof st};
        assert_int_equal(P->get_stats(ctx, &st), PT_OK);
        if (rc == PT_OK && !isnan(cc->call_max)) assert_true(st.last_grad_norm == norm);
        float gs = ref_max > 0 && want > ref_max ? (float)(ref_max / (want + 1e-6)) : 1.0f;
        float bc1, bc2r;
        pt_adamw_bias(0.9f, 0.999f, step + 1, &bc1, &bc2r);
        pt_adamw_consts c = pt_adamw_make_consts(0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2r, gs);
        for (int i = 0; i < TINY_NP; i++)
            for (int k = 0; k < TINY_NEL; k++)
                ref[i][k] = pt_adamw_elem(&c, ref[i][k], grad_of(i, k, gval), &m[i][k], &v[i][k]);
    }
    for (int i = 0; check_weights && i < TINY_NP; i++) {
        float out[TINY_NEL];
        assert_int_equal(P->read_param(ctx, i, out, sizeof out), PT_OK);
        for (int k = 0; k < TINY_NEL; k++)
            if (fabsf(out[k] - ref[i][k]) > 1e-6f * fmaxf(1.0f, fabsf(ref[i][k])))
                fail_msg("param %d element %d: %.9g, reference %.9g (clip at %g)", i, k,
                         (double)out[k], (double)ref[i][k], (double)ref_max);
    }
    assert_int_equal(P->finalize(ctx), PT_OK);
    return rc;
}

/* Resident chunks: the device steps wait for the norm. */
static void test_resident_clip(void **s) {
    (void)s;
    clip_case cc = {NULL, 0.0f, 0, 0, 1.0f, 0.0f};
    assert_int_equal(run_case(&cc, 1.0f, 1), PT_OK);
}

/* Offloaded chunks announced ahead: set_lr given, yet no chunk steps before
 * the norm; the CPU tasks computed the norms during backward. */
static void test_offloaded_announced(void **s) {
    (void)s;
    clip_case cc = {STREAMED, 0.0f, 1, 1, 1.0f, 0.0f};
    assert_int_equal(run_case(&cc, 1.0f, 1), PT_OK);
}

/* Offloaded, not announced, no set_lr: the CPU steps wait for
 * optimizer_step anyway; the hook computes the norms the tasks did not. */
static void test_offloaded_late(void **s) {
    (void)s;
    clip_case cc = {STREAMED, 0.0f, 0, 0, 1.0f, 0.0f};
    assert_int_equal(run_case(&cc, 1.0f, 1), PT_OK);
}

/* The norm only (max 0): no clipping, the weights of the unclipped reference. */
static void test_norm_only(void **s) {
    (void)s;
    clip_case a = {STREAMED, 0.0f, 1, 1, 0.0f, 0.0f};
    assert_int_equal(run_case(&a, 0.0f, 1), PT_OK);
    clip_case b = {NULL, 0.0f, 0, 0, 0.0f, 0.0f};
    assert_int_equal(run_case(&b, 0.0f, 1), PT_OK);
}

/* Announced, then no call: nothing clips (the steps only waited). */
static void test_announced_without_call(void **s) {
    (void)s;
    clip_case cc = {STREAMED, 0.0f, 1, 1, NAN, 1.0f};
    assert_int_equal(run_case(&cc, 0.0f, 1), PT_OK);
}

/* Steps that already ran unclipped (set_lr, no announcement): refused with a
 * sentence, and the run goes on unclipped. */
static void test_stepped_refused(void **s) {
    (void)s;
    clip_case cc = {STREAMED, 0.0f, 1, 0, 1.0f, 0.0f};
    assert_int_equal(run_case(&cc, 0.0f, 1), PT_ERR_ORDER);
    if (!strstr(last_refusal, "clip_grad_norm: the CPU optimizer already stepped chunk") ||
        !strstr(last_refusal, "announce it before the step's backward"))
        fail_msg("'%s'", last_refusal);
}

/* A max norm beside the optimizer's own: the same one clips once, another is
 * refused. */
static void test_configured_clip(void **s) {
    (void)s;
    clip_case same = {STREAMED, 1.0f, 1, 1, 1.0f, 0.0f};
    assert_int_equal(run_case(&same, 1.0f, 1), PT_OK);
    tiny t;
    clip_case other = {NULL, 1.0f, 0, 0, 2.0f, 0.0f};
    void *ctx = start(&t, &other);
    assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_OK);
    assert_int_equal(P->clip_grad_norm(ctx, 2.0f, NULL), PT_ERR_INVALID_ARG);
    if (!strstr(P->last_error(ctx), "differs from the optimizer's max_grad_norm 1"))
        fail_msg("'%s'", P->last_error(ctx));
    assert_int_equal(P->clip_grad_norm(ctx, NAN, NULL), PT_ERR_INVALID_ARG);
    pass(ctx, &t, 0, 0.3f);
    assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

/* With a norm: only where optimizer_step may come; announcing: inside a step. */
static void test_order(void **s) {
    (void)s;
    tiny t;
    clip_case cc = {NULL, 0.0f, 0, 0, 1.0f, 0.0f};
    void *ctx = start(&t, &cc);
    double norm;
    assert_int_equal(P->clip_grad_norm(ctx, 1.0f, &norm), PT_ERR_ORDER);
    assert_int_equal(P->pre_step(ctx, 0, 0, 2), PT_OK);
    assert_int_equal(P->block_pre_forward(ctx, 0), PT_OK);
    assert_int_equal(P->clip_grad_norm(ctx, 1.0f, &norm), PT_ERR_ORDER);
    if (!strstr(P->last_error(ctx), "clip_grad_norm called out of order"))
        fail_msg("'%s'", P->last_error(ctx));
    assert_int_equal(P->block_post_forward(ctx, 0), PT_OK);
    assert_int_equal(P->block_pre_forward(ctx, 1), PT_OK);
    assert_int_equal(P->block_post_forward(ctx, 1), PT_OK);
    for (int b = TINY_NB - 1; b >= 0; b--) {
        assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
        assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
    }
    /* micro-batch 0 of 2 done: the norm is not complete yet */
    assert_int_equal(P->clip_grad_norm(ctx, 1.0f, &norm), PT_ERR_ORDER);
    assert_int_equal(P->clip_grad_norm(ctx, 1.0f, NULL), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
    /* before create_optimizer */
    void *c2 = hb_open(P, "[plugin]\nbackend = host\nlog_level = error\n", NULL);
    tiny_make(&t);
    assert_int_equal(P->post_model_load(c2, &t.m), PT_OK);
    assert_int_equal(P->clip_grad_norm(c2, 1.0f, NULL), PT_ERR_ORDER);
    assert_int_equal(P->finalize(c2), PT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident_clip),
        cmocka_unit_test(test_offloaded_announced),
        cmocka_unit_test(test_offloaded_late),
        cmocka_unit_test(test_norm_only),
        cmocka_unit_test(test_stepped_refused),
        cmocka_unit_test(test_configured_clip),
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_announced_without_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
