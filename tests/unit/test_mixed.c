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

#include "mixed_model.h"

/* gradient value of element k of param i at step s (exactly representable in 16 bits) */
static float gval(int i, int k, int s, int dtype) {
    float g = 0.05f * (float)((k * 3 + i + s * 5) % 11) - 0.25f;
    return dtype == PT_BF16 ? pt_bf16_to_f32(pt_f32_to_bf16(g)) : pt_f16_to_f32(pt_f32_to_f16(g));
}

/* The plan the case asked for took effect: streamed runs keep fewer chunks
 * resident than there are, in mode B, and step them on the CPU after their
 * gradients went to the host; resident runs keep every chunk, in mode A. */
static void expect_plan(const pt_stats_v1 *st, const char *protrain) {
    if (strstr(protrain, "n_persist = 0")) {
        assert_int_equal(st->mode, 1);
        assert_true(st->n_persist < st->n_chunk);
        assert_true(st->d2h_bytes > 0);
        assert_true(st->cpu_optim_s > 0);
    } else {
        assert_int_equal(st->mode, 0);
        assert_int_equal(st->n_persist, st->n_chunk);
    }
}

static void run_case(int dtype, const char *protrain) {
    char text[512];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n"
             "[optimizer]\nlr = 0.01\nweight_decay = 0.1\n%s", protrain);
    model t;
    void *ctx = mixed_open(&t, dtype, 0, "mixed", text);

    float master[NP][MAXN], m[NP][MAXN], v[NP][MAXN];
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int i = 0; i < NP; i++)
        for (int k = 0; k < numel(i); k++) master[i][k] = pt_load_elem(t.init[i], dtype, (size_t)k);

    for (int s = 0; s < 4; s++) {
        mixed_step(ctx, &t, s, dtype, gval);
        float bc1, bc2r;
        pt_adamw_bias(0.9f, 0.999f, s + 1, &bc1, &bc2r);
        pt_adamw_consts c = pt_adamw_make_consts(0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2r, 1.0f);
        for (int i = 0; i < NP; i++)
            for (int k = 0; k < numel(i); k++)
                master[i][k] = pt_adamw_elem(&c, master[i][k], gval(i, k, s, dtype), &m[i][k], &v[i][k]);
    }
    mixed_check(ctx, &t, dtype, master);
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_OK);
    expect_plan(&st, protrain);
    printf("  %s, %s: %d chunks, %d resident, mode %d: 16-bit params bit-identical to the "
           "fp32-master reference after 4 steps\n", dtype == PT_BF16 ? "bf16" : "fp16",
           strstr(protrain, "n_persist = 0") ? "streamed (CPU AdamW)" : "resident (device AdamW)",
           st.n_chunk, st.n_persist, st.mode);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

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
