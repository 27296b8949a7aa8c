/*
 * test_mixed.c — 16-bit compute parameters through the plugin, with fp32
 * masters, against references that give the same bits.
 *
 * AdamW cases (test_bf16_*, test_fp16_*): bf16 and fp16 params with fp32
 * masters and moments, stepped by the device AdamW (resident chunks: the 16-bit
 * gradient is widened into fp32 scratch first) and by the CPU AdamW (streamed
 * chunks: it reads 16-bit gradients directly), against a reference that runs
 * the element body pt_adamw_elem on an fp32 master and rounds to the compute
 * dtype. Same arithmetic, so the 16-bit values the plugin returns must be
 * bit-identical to the reference.
 *
 * test_bf16_tier / test_fp16_tier: streamed through the disk tier ([nvme]), the
 * masters and moments in its file between steps: the same bits.
 *
 * REKLS cases (test_rekls_*): bf16 / fp16 2-D block weights with fp32 masters,
 * stepped by REKLS on the device (resident chunks: the 16-bit gradient is
 * widened by the step's gradient kernel) and on the CPU (streamed chunks: it
 * reads the staged 16-bit gradient), the rest (a non-block embedding, 1-D
 * biases) by AdamW. Reference: pt_rekls_step on an fp32 master with the same
 * 16-bit gradients, rounded to the compute dtype, and pt_adamw_elem for the
 * others. This checks the plumbing (which parameter gets which optimizer,
 * masters, widening, rounding, the step count) bit for bit; the REKLS math
 * itself is test_rekls's.
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
#include "optim/optim.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

/* ---- AdamW ---- */

/* gradient value of element k of param i at step s (exactly representable in 16 bits) */
static float adamw_gval(int i, int k, int s, int dtype) {
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

static void adamw_case(int dtype, const char *protrain) {
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n"
             "[optimizer]\nlr = 0.01\nweight_decay = 0.1\n%s", protrain);
    mixed_model t;
    void *ctx = mixed_open(&t, dtype, 0, "mixed", text);

    float master[MX_NP][MX_MAXN], m[MX_NP][MX_MAXN], v[MX_NP][MX_MAXN];
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int i = 0; i < MX_NP; i++)
        for (int k = 0; k < mixed_numel(i); k++) master[i][k] = pt_load_elem(t.init[i], dtype, (size_t)k);

    for (int s = 0; s < 4; s++) {
        mixed_step(ctx, &t, s, dtype, adamw_gval);
        float bc1, bc2r;
        pt_adamw_bias(0.9f, 0.999f, s + 1, &bc1, &bc2r);
        pt_adamw_consts c = pt_adamw_make_consts(0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2r, 1.0f);
        for (int i = 0; i < MX_NP; i++)
            for (int k = 0; k < mixed_numel(i); k++)
                master[i][k] = pt_adamw_elem(&c, master[i][k], adamw_gval(i, k, s, dtype), &m[i][k], &v[i][k]);
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

/* Streamed through the disk tier ([nvme]): the fp32 masters and moments live in
 * the tier's file between steps (forced: this model's states are smaller than
 * the staging slots), the same bits. */
static void tier_case(int dtype) {
    char dir[] = "/tmp/test_mixed_tier.XXXXXX", ini[512];
    assert_non_null(mkdtemp(dir));
    snprintf(ini, sizeof ini, "%s[nvme]\npath = %s\nblock_size = 512\n[testing]\n"
             "debug_tier_force = true\n", MX_STREAMED, dir);
    adamw_case(dtype, ini);
    assert_int_equal(rmdir(dir), 0);   /* finalize removed the tier's files */
}
static void test_bf16_tier(void **s) { (void)s; tier_case(PT_BF16); }
static void test_fp16_tier(void **s) { (void)s; tier_case(PT_F16); }
static void test_bf16_resident(void **s) { (void)s; adamw_case(PT_BF16, MX_RESIDENT); }
static void test_bf16_streamed(void **s) { (void)s; adamw_case(PT_BF16, MX_STREAMED); }
static void test_fp16_resident(void **s) { (void)s; adamw_case(PT_F16, MX_RESIDENT); }
static void test_fp16_streamed(void **s) { (void)s; adamw_case(PT_F16, MX_STREAMED); }

/* ---- REKLS ---- */

static int is2d(int i) { return MX_COLS[i] > 1; }

static float rekls_gval(int i, int k, int s, int dtype) {
    float g = 0.05f * (float)((k * 3 + i + s * 5) % 11) - 0.25f + 0.001f * (float)(k % 7);
    return dtype == PT_BF16 ? pt_bf16_to_f32(pt_f32_to_bf16(g)) : pt_f16_to_f32(pt_f32_to_f16(g));
}

static void rekls_case(int dtype, const char *protrain) {
    char text[512];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 8MiB\n"
             "[optimizer]\ntype = rekls\nlr = 0.01\nbeta2 = 0.95\nweight_decay = 0.1\n"
             "rekls_eps = 1e-6\n%s", protrain);
    mixed_model t;
    void *ctx = mixed_open(&t, dtype, 1, "rekls-mixed", text);

    /* reference state */
    float master[MX_NP][MX_MAXN], m[MX_NP][MX_MAXN], v[MX_NP][MX_MAXN];
    float *aux[MX_NP] = {0}, *ws[MX_NP] = {0};
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int i = 0; i < MX_NP; i++) {
        for (int k = 0; k < mixed_numel(i); k++) master[i][k] = pt_load_elem(t.init[i], dtype, (size_t)k);
        if (!is2d(i)) continue;
        aux[i] = malloc(pt_rekls_aux_words(MX_ROWS[i], MX_COLS[i]) * 4);
        ws[i] = malloc(pt_rekls_ws_words(MX_ROWS[i], MX_COLS[i]) * 4);
        pt_rekls_aux_init_host(aux[i], (int)MX_ROWS[i], (int)MX_COLS[i]);
    }
    for (int s = 0; s < 4; s++) {
        mixed_step(ctx, &t, s, dtype, rekls_gval);
        float bc1, bc2r;
        pt_adamw_bias(0.9f, 0.95f, s + 1, &bc1, &bc2r);
        pt_adamw_consts c = pt_adamw_make_consts(0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2r, 1.0f);
        for (int i = 0; i < MX_NP; i++) {
            if (!is2d(i) || MX_BLOCK[i] < 0) {
                for (int k = 0; k < mixed_numel(i); k++)
                    master[i][k] = pt_adamw_elem(&c, master[i][k], rekls_gval(i, k, s, dtype), &m[i][k], &v[i][k]);
                continue;
            }
            uint16_t g16[MX_MAXN];
            for (int k = 0; k < mixed_numel(i); k++) pt_store_elem(g16, dtype, (size_t)k, rekls_gval(i, k, s, dtype));
            pt_rekls_hyper h = {0.01f, 0.9f, 0.95f, 1e-6f, 0.1f, 0.95f, 0, s + 1, 1.0f, PT_REKLS_WD_DECOUPLED};
            pt_rekls_tensors x = {(int)MX_ROWS[i], (int)MX_COLS[i], g16, dtype, master[i], NULL, 0, m[i],
                                  v[i], aux[i], ws[i]};
            char err[256];
            assert_int_equal(pt_rekls_step(&pt_rekls_la_cpu, &h, &x, err, sizeof err), 0);
        }
    }
    mixed_check(ctx, &t, dtype, master);
    for (int i = 0; i < MX_NP; i++) {
        free(aux[i]);
        free(ws[i]);
    }
    pt_stats_v1 st = {.struct_size = sizeof st};
    assert_int_equal(P->get_stats(ctx, &st), PT_OK);
    expect_plan(&st, protrain);
    printf("  %s, %s: %d chunks, %d resident: 16-bit params bit-identical to the fp32-master "
           "reference after 4 steps\n", dtype == PT_BF16 ? "bf16" : "fp16",
           strstr(protrain, "n_persist = 0") ? "streamed (CPU REKLS)" : "resident (device REKLS)",
           st.n_chunk, st.n_persist);
    assert_int_equal(P->finalize(ctx), PT_OK);
}

static void test_rekls_bf16_resident(void **s) { (void)s; rekls_case(PT_BF16, MX_RESIDENT); }
static void test_rekls_bf16_streamed(void **s) { (void)s; rekls_case(PT_BF16, MX_STREAMED); }
static void test_rekls_fp16_resident(void **s) { (void)s; rekls_case(PT_F16, MX_RESIDENT); }
static void test_rekls_fp16_streamed(void **s) { (void)s; rekls_case(PT_F16, MX_STREAMED); }

int main(void) {
    const struct CMUnitTest adamw[] = {
        cmocka_unit_test(test_bf16_resident),
        cmocka_unit_test(test_bf16_streamed),
        cmocka_unit_test(test_fp16_resident),
        cmocka_unit_test(test_fp16_streamed),
        cmocka_unit_test(test_bf16_tier),
        cmocka_unit_test(test_fp16_tier),
    };
    const struct CMUnitTest rekls[] = {
        cmocka_unit_test(test_rekls_bf16_resident),
        cmocka_unit_test(test_rekls_bf16_streamed),
        cmocka_unit_test(test_rekls_fp16_resident),
        cmocka_unit_test(test_rekls_fp16_streamed),
    };
    int failed = cmocka_run_group_tests_name("mixed precision through the plugin", adamw, NULL, NULL);
    failed += cmocka_run_group_tests_name("REKLS with 16-bit parameters through the plugin", rekls,
                                          NULL, NULL);
    return failed;
}
