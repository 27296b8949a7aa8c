/*
 * test_write_param.c — the write_param hook (ABI 1.6, appended to the table):
 * written values read back, the next step starts from them with the moments
 * it had (against a reference AdamW), resident and offloaded chunks alike; a
 * bf16 parameter's fp32 master takes the value (a step at lr 0 keeps it);
 * refusals inside a step, with a wrong size, before post_model_load.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "host_builder.h"
#include "kernels_hd.h"
#include "protrain.h"
#include "tiny_model.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

#define STREAMED "[protrain]\nn_persist = 0\nn_buffer = 1\nchunk_size = 4KiB\n"

static void *start(tiny *t, const char *extra, int bf16) {
    char text[512];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n"
             "[optimizer]\nlr = 0.01\nweight_decay = 0.1\n%s",
             extra ? extra : "");
    void *ctx = hb_open(P, text, NULL);
    tiny_make(t);
    if (bf16) {   /* param 1 in bf16: its init is 64 bf16 values in the same buffer */
        uint16_t *h = (uint16_t *)t->init[1];
        for (int k = 0; k < TINY_NEL; k++) h[k] = pt_f32_to_bf16(0.01f * (float)(k % 13));
        t->p[1].dtype = PT_BF16;
    }
    assert_int_equal(P->post_model_load(ctx, &t->m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    return ctx;
}

static float grad_of(int i, int k, float gval) { return gval * (float)(k + 1 + i); }

static void step(void *ctx, tiny *t, int64_t s, float gval, float lr) {
    assert_int_equal(P->pre_step(ctx, s, 0, 1), PT_OK);
    for (int b = 0; b < TINY_NB; b++) {
        assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
        assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
    }
    for (int b = TINY_NB - 1; b >= 0; b--) {
        assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
        if (t->p[b + 1].dtype == PT_F32) {
            float *g = t->p[b + 1].grad;
            for (int k = 0; k < TINY_NEL; k++) g[k] += grad_of(b + 1, k, gval);
        }
        assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
    }
    float *ge = t->p[0].grad;
    for (int k = 0; k < TINY_NEL; k++) ge[k] += grad_of(0, k, gval);
    assert_int_equal(P->optimizer_step(ctx, lr), PT_OK);
    assert_int_equal(P->post_step(ctx, s, 1.0f), PT_OK);
}

static void ref_step(float ref[TINY_NP][TINY_NEL], float m[TINY_NP][TINY_NEL],
                     float v[TINY_NP][TINY_NEL], int64_t s, float gval) {
    float bc1, bc2r;
    pt_adamw_bias(0.9f, 0.999f, s + 1, &bc1, &bc2r);
    pt_adamw_consts c = pt_adamw_make_consts(0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2r, 1.0f);
    for (int i = 0; i < TINY_NP; i++)
        for (int k = 0; k < TINY_NEL; k++)
            ref[i][k] = pt_adamw_elem(&c, ref[i][k], grad_of(i, k, gval), &m[i][k], &v[i][k]);
}

static void written_then_stepped(const char *extra) {
    tiny t;
    void *ctx = start(&t, extra, 0);
    float ref[TINY_NP][TINY_NEL], m[TINY_NP][TINY_NEL], v[TINY_NP][TINY_NEL];
    memcpy(ref, t.init, sizeof ref);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int64_t s = 0; s < 2; s++) {
        step(ctx, &t, s, 0.3f, 0.01f);
        ref_step(ref, m, v, s, 0.3f);
    }
    for (int i = 0; i < TINY_NP; i++) {
        float w[TINY_NEL], back[TINY_NEL];
        for (int k = 0; k < TINY_NEL; k++) w[k] = ref[i][k] = 0.5f - 0.01f * (float)(k + i);
        assert_int_equal(P->write_param(ctx, i, w, sizeof w), PT_OK);
        assert_int_equal(P->read_param(ctx, i, back, sizeof back), PT_OK);
        assert_memory_equal(back, w, sizeof w);
    }
    step(ctx, &t, 2, 0.3f, 0.01f);   /* from the written values, the moments it had */
    ref_step(ref, m, v, 2, 0.3f);
    for (int i = 0; i < TINY_NP; i++) {
        float out[TINY_NEL];
        assert_int_equal(P->read_param(ctx, i, out, sizeof out), PT_OK);
        assert_memory_equal(out, ref[i], sizeof out);   /* the same element body */
    }
    assert_int_equal(P->finalize(ctx), PT_OK);
}

static void test_resident(void **s) {
    (void)s;
    written_then_stepped(NULL);
}
static void test_offloaded(void **s) {
    (void)s;
    written_then_stepped(STREAMED);
}
/* Streamed through the disk tier in folder dir at its level (1: the states,
 * the masters with them; 2: the whole chunk images). */
static void tier_ini(char *buf, size_t n, const char *dir, int level) {
    snprintf(buf, n, STREAMED "[nvme]\npath = %s\nblock_size = 512\n[testing]\n"
                              "debug_tier_force = true\ndebug_tier_level = %d\n",
             dir, level);
}

/* the whole chunk images on the disk tier (level 2): the written values and
 * their read back go through views of the records */
static void test_tier_images(void **s) {
    (void)s;
    char dir[] = "/tmp/test_write_param.XXXXXX", ini[512];
    assert_non_null(mkdtemp(dir));
    tier_ini(ini, sizeof ini, dir, 2);
    written_then_stepped(ini);
    assert_int_equal(rmdir(dir), 0);
}

/* A bf16 param's master takes the written value: at lr 0 the step writes the
 * master back into the compute copy, which must still be the written value. */
static void test_bf16_master(void **state) {
    (void)state;
    char dir[] = "/tmp/test_write_param.XXXXXX", tier[512], tier2[512];
    assert_non_null(mkdtemp(dir));
    /* and streamed through the disk tier: the master lives in its file (level
     * 2: the bf16 param itself too) */
    tier_ini(tier, sizeof tier, dir, 1);
    tier_ini(tier2, sizeof tier2, dir, 2);
    const char *cases[] = {NULL, STREAMED, tier, tier2};
    for (int c = 0; c < 4; c++) {
        tiny t;
        void *ctx = start(&t, cases[c], 1);
        step(ctx, &t, 0, 0.3f, 0.01f);
        uint16_t w[TINY_NEL], back[TINY_NEL];
        for (int k = 0; k < TINY_NEL; k++) w[k] = pt_f32_to_bf16(-0.25f + 0.003f * (float)k);
        assert_int_equal(P->write_param(ctx, 1, w, sizeof w), PT_OK);
        step(ctx, &t, 1, 0.0f, 0.0f);
        assert_int_equal(P->read_param(ctx, 1, back, sizeof back), PT_OK);
        assert_memory_equal(back, w, sizeof w);
        assert_int_equal(P->finalize(ctx), PT_OK);
    }
    assert_int_equal(rmdir(dir), 0);
}

static void test_refusals(void **state) {
    (void)state;
    tiny t;
    void *ctx = hb_open(P, "[plugin]\nbackend = host\nlog_level = error\n", NULL);
    float w[TINY_NEL] = {0};
    assert_int_equal(P->write_param(ctx, 0, w, sizeof w), PT_ERR_ORDER);
    assert_int_equal(P->finalize(ctx), PT_OK);
    ctx = start(&t, NULL, 0);
    assert_int_equal(P->write_param(ctx, 0, w, sizeof w - 4), PT_ERR_INVALID_ARG);
    if (!strstr(P->last_error(ctx), "holds 256 bytes, caller passed 252"))
        fail_msg("'%s'", P->last_error(ctx));
    assert_int_equal(P->write_param(ctx, 9, w, sizeof w), PT_ERR_INVALID_ARG);
    assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_OK);
    assert_int_equal(P->write_param(ctx, 0, w, sizeof w), PT_ERR_ORDER);
    if (!strstr(P->last_error(ctx), "write_param (between steps only)"))
        fail_msg("'%s'", P->last_error(ctx));
    assert_int_equal(P->finalize(ctx), PT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident),
        cmocka_unit_test(test_offloaded),
        cmocka_unit_test(test_tier_images),
        cmocka_unit_test(test_bf16_master),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
