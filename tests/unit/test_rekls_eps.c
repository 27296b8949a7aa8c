/*
 * test_rekls_eps.c — a host descriptor's eps reaches REKLS. A host porting
 * REKLS(eps=...) gives create_optimizer a descriptor with its eps; that eps must
 * be the one REKLS steps with (the descriptor wins over the INI, as for every
 * other field), not [optimizer] rekls_eps's default; the parameters REKLS does
 * not take (AdamW) use the same eps. Three runs of 4 steps on the same bf16
 * model and gradients: INI eps = rekls_eps = 0.1 (no descriptor), the default
 * INI with a descriptor eps = 0.1, and the default INI alone. The first two give
 * bit-identical parameters; the third differs (so eps was in effect).
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

static float gval(int i, int k, int s, int dtype) {
    float g = 0.05f * (float)((k * 3 + i + s * 5) % 11) - 0.25f + 0.001f * (float)(k % 7);
    (void)dtype;
    return pt_bf16_to_f32(pt_f32_to_bf16(g));
}

/* 4 REKLS steps; the parameters after them into out. desc_eps NaN: no descriptor. */
static void run(const char *optim, float desc_eps, uint16_t out[MX_NP][MX_MAXN]) {
    char text[512];
    snprintf(text, sizeof text,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 8MiB\n"
             "[optimizer]\ntype = rekls\nlr = 0.01\nbeta2 = 0.95\n%s\n" MX_RESIDENT,
             optim);
    void *ctx = hb_open(MX_P, text, NULL);
    mixed_model t;
    mixed_make(&t, PT_BF16, 1, "rekls-eps");
    assert_int_equal(MX_P->post_model_load(ctx, &t.m), PT_OK);
    pt_optim_v1 d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.type = PT_OPTIM_REKLS;
    d.lr = d.beta1 = d.beta2 = d.weight_decay = d.max_grad_norm = NAN;
    d.eps = desc_eps;
    assert_int_equal(MX_P->create_optimizer(ctx, isnan(desc_eps) ? NULL : &d), PT_OK);
    for (int s = 0; s < 4; s++) mixed_step(ctx, &t, s, PT_BF16, gval);
    for (int i = 0; i < MX_NP; i++)
        assert_int_equal(MX_P->read_param(ctx, i, out[i], (uint64_t)mixed_numel(i) * 2), PT_OK);
    assert_int_equal(MX_P->finalize(ctx), PT_OK);
}

static void test_descriptor_eps(void **s) {
    (void)s;
    static uint16_t ini_eps[MX_NP][MX_MAXN], desc_eps[MX_NP][MX_MAXN], dflt[MX_NP][MX_MAXN];
    memset(ini_eps, 0, sizeof ini_eps);
    memset(desc_eps, 0, sizeof desc_eps);
    memset(dflt, 0, sizeof dflt);
    run("eps = 0.1\nrekls_eps = 0.1", NAN, ini_eps);
    run("", 0.1f, desc_eps);
    run("", NAN, dflt);
    int differ = 0;
    for (int i = 0; i < MX_NP; i++)
        for (int k = 0; k < mixed_numel(i); k++) differ += ini_eps[i][k] != dflt[i][k];
    printf("  eps 0.1 vs the default 1e-8: %d of the parameters' elements differ after 4 steps\n",
           differ);
    assert_true(differ > 0);
    assert_memory_equal(ini_eps, desc_eps, sizeof ini_eps);
}

int main(void) {
    (void)mixed_open;   /* the shared model header's helpers this test does not use */
    (void)mixed_check;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptor_eps),
    };
    return cmocka_run_group_tests_name("REKLS takes the host descriptor's eps", tests, NULL, NULL);
}
