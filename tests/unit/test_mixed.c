/*
 * test_mixed.c — 16-bit compute parameters through the plugin: bf16 and fp16
 * params with fp32 masters and moments, stepped by the device AdamW (resident
 * chunks: the 16-bit gradient is widened into fp32 scratch first) and by the
 * CPU AdamW (streamed chunks: it reads 16-bit gradients directly), against a
 * reference that runs the element body pt_adamw_elem on an fp32 master and
 * rounds to the compute dtype. Same arithmetic, so the 16-bit values the
 * plugin returns must be bit-identical to the reference.
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

#include "kernels_hd.h"
#include "protrain.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

enum { NP = 5, NB = 2, MAXN = 96 };
static const char *NAMES[NP] = {"emb", "b0.w", "b0.b", "b1.w", "b1.b"};
static const int64_t NUMEL[NP] = {64, 96, 8, 96, 8};
static const int BLOCK[NP] = {-1, 0, 0, 1, 1};

typedef struct model {
    pt_param_v1 p[NP];
    pt_model_v1 m;
    uint16_t init[NP][MAXN];
} model;

static void make(model *t, int dtype) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < NP; i++) {
        t->p[i].name = NAMES[i];
        t->p[i].dtype = dtype;
        t->p[i].ndim = 1;
        t->p[i].shape[0] = NUMEL[i];
        t->p[i].block = BLOCK[i];
        t->p[i].trainable = 1;
        t->p[i].tie = -1;
        for (int k = 0; k < NUMEL[i]; k++)
            t->init[i][k] = (uint16_t)(dtype == PT_BF16
                                           ? pt_f32_to_bf16(0.013f * (float)((i * 31 + k * 7) % 29) - 0.18f)
                                           : pt_f32_to_f16(0.013f * (float)((i * 31 + k * 7) % 29) - 0.18f));
        t->p[i].init = t->init[i];
    }
    t->m.struct_size = sizeof t->m;
    t->m.n_params = NP;
    t->m.params = t->p;
    t->m.n_blocks = NB;
    t->m.batch = 1;
    t->m.seq = 1;
    t->m.arch = "mixed";
}

/* gradient value of element k of param i at step s (exactly representable in 16 bits) */
static float gval(int i, int k, int s, int dtype) {
    float g = 0.05f * (float)((k * 3 + i + s * 5) % 11) - 0.25f;
    return dtype == PT_BF16 ? pt_bf16_to_f32(pt_f32_to_bf16(g)) : pt_f16_to_f32(pt_f32_to_f16(g));
}

static void add_grad(pt_param_v1 *p, int i, int s, int dtype) {
    uint16_t *g = p->grad;
    assert_non_null(g);
    for (int k = 0; k < p->shape[0]; k++)
        pt_store_elem(g, dtype, (size_t)k, pt_load_elem(g, dtype, (size_t)k) + gval(i, k, s, dtype));
}

static void run_case(int dtype, const char *protrain) {
    char path[128], text[512];
    snprintf(path, sizeof path, "/tmp/pt_mixed_%d.ini", (int)getpid());
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n"
             "[optimizer]\nlr = 0.01\nweight_decay = 0.1\n%s", protrain);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    void *ctx = NULL;
    if (P->init(path, NULL, &ctx)) fail_msg("init: %s", P->last_error(NULL));
    unlink(path);
    model t;
    make(&t, dtype);
    assert_int_equal(P->post_model_load(ctx, &t.m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);

    float master[NP][MAXN], m[NP][MAXN], v[NP][MAXN];
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int i = 0; i < NP; i++)
        for (int k = 0; k < NUMEL[i]; k++) master[i][k] = pt_load_elem(t.init[i], dtype, (size_t)k);

    for (int s = 0; s < 4; s++) {
        assert_int_equal(P->set_lr(ctx, 0.01f), PT_OK);
        assert_int_equal(P->pre_step(ctx, s, 0, 1), PT_OK);
        for (int b = 0; b < NB; b++) {
            assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
            assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
        }
        for (int b = NB - 1; b >= 0; b--) {
            assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
            for (int i = 0; i < NP; i++)
                if (BLOCK[i] == b) add_grad(&t.p[i], i, s, dtype);
            assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
        }
        add_grad(&t.p[0], 0, s, dtype);
        assert_int_equal(P->optimizer_step(ctx, -1.0f), PT_OK);
        assert_int_equal(P->post_step(ctx, s, 1.0f), PT_OK);
        float bc1, bc2r;
        pt_adamw_bias(0.9f, 0.999f, s + 1, &bc1, &bc2r);
        pt_adamw_consts c = pt_adamw_make_consts(0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2r, 1.0f);
        for (int i = 0; i < NP; i++)
            for (int k = 0; k < NUMEL[i]; k++)
                master[i][k] = pt_adamw_elem(&c, master[i][k], gval(i, k, s, dtype), &m[i][k], &v[i][k]);
    }
    int moved = 0;
    for (int i = 0; i < NP; i++) {
        uint16_t got[MAXN], want[MAXN];
        assert_int_equal(P->read_param(ctx, i, got, (uint64_t)NUMEL[i] * 2), PT_OK);
        for (int k = 0; k < NUMEL[i]; k++) {
            pt_store_elem(want, dtype, (size_t)k, master[i][k]);
            moved += got[k] != t.init[i][k];
        }
        assert_memory_equal(got, want, (size_t)NUMEL[i] * 2);
    }
    assert_true(moved > 0);
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_OK);
    printf("  %s, %s: %d chunks, %d resident, mode %d: 16-bit params bit-identical to the "
           "fp32-master reference after 4 steps\n", dtype == PT_BF16 ? "bf16" : "fp16",
           strstr(protrain, "n_persist = 0") ? "streamed (CPU AdamW)" : "resident (device AdamW)",
           st.n_chunk, st.n_persist, st.mode);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

#define RESIDENT "[protrain]\nforce_all_persistent = true\n"
#define STREAMED "[protrain]\nauto_memory = false\nn_persist = 0\nn_buffer = 1\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 4KiB\n"

static void test_bf16_resident(void **s) { (void)s; run_case(PT_BF16, RESIDENT); }
static void test_bf16_streamed(void **s) { (void)s; run_case(PT_BF16, STREAMED); }
static void test_fp16_resident(void **s) { (void)s; run_case(PT_F16, RESIDENT); }
static void test_fp16_streamed(void **s) { (void)s; run_case(PT_F16, STREAMED); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_resident),
        cmocka_unit_test(test_bf16_streamed),
        cmocka_unit_test(test_fp16_resident),
        cmocka_unit_test(test_fp16_streamed),
    };
    return cmocka_run_group_tests_name("mixed precision through the plugin", tests, NULL, NULL);
}
