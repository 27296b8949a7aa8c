/*
 * test_optim_kind.c — the optimizer kinds' tables (runtime/store/kinds/optim_kind.h)
 * as the generic code uses them: a state file's kind id finds its table and
 * name (an id no kind has finds none), and cpu_seconds, the planner's CPU time
 * of a chunk's optimizer-own work, against the time model written out here
 * (rekls.h: per step PT_REKLS_GEMM_CALLS GEMM calls and PT_REKLS_EIGH_CALLS
 * eigh calls, each a fixed cost, plus FLOPs at a rate), with rates set by hand
 * so the expected seconds are exact; and that the probes run only on need.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "optim/optim.h"
#include "store/kinds/optim_kind.h"
#include "protrain.h"

static void test_find_by_id(void **state) {
    (void)state;
    assert_ptr_equal(pt_optk_find(PT_OPTIM_ADAMW), &pt_optk_adamw);
    assert_ptr_equal(pt_optk_find(PT_OPTIM_REKLS), &pt_optk_rekls);
    assert_string_equal(pt_optk_find(PT_OPTIM_ADAMW)->name, "AdamW");
    assert_string_equal(pt_optk_find(PT_OPTIM_REKLS)->name, "REKLS");
    /* 0 is "from the config", not a kind; 3 and -1 are no kind */
    assert_null(pt_optk_find(PT_OPTIM_FROM_CONFIG));
    assert_null(pt_optk_find(3));
    assert_null(pt_optk_find(-1));
    /* the running type's table: 0 and unknown read as AdamW */
    assert_ptr_equal(pt_optk_of(0), &pt_optk_adamw);
    assert_ptr_equal(pt_optk_of(PT_OPTIM_REKLS), &pt_optk_rekls);
    assert_int_equal(pt_optk_of(PT_OPTIM_REKLS)->id, PT_OPTIM_REKLS);
}

static void test_cpu_seconds(void **state) {
    (void)state;
    /* AdamW adds no work beyond the Adam update */
    assert_null(pt_optk_adamw.cpu_seconds);
    assert_non_null(pt_optk_rekls.cpu_seconds);
    pt_optim_rates r;
    memset(&r, 0, sizeof r);
    pt_optim_terms t;
    memset(&t, 0, sizeof t);
    /* a chunk without REKLS params: 0 s and no probes run */
    assert_true(pt_optk_rekls.cpu_seconds(&r, &t) == 0.0);
    assert_int_equal(r.measured, 0);
    /* rates given: 1 ms per GEMM call at 1 GFLOP/s, 5 ms per eigh call at
     * 0.5 GFLOP/s; 3 params with 6e9 GEMM and 2e9 eigh FLOPs in all */
    pt_rekls_rates k = {.gemm_call_s = 1e-3, .gemm_flops_per_s = 1e9, .eigh_call_s = 5e-3, .eigh_flops_per_s = 0.5e9};
    memcpy(r.w, &k, sizeof k);
    r.measured = 1;
    t.n_params = 3;
    t.gemm_flops = 6e9;
    t.eigh_flops = 2e9;
    double want = 3 * (PT_REKLS_GEMM_CALLS * 1e-3 + PT_REKLS_EIGH_CALLS * 5e-3) + 6.0 + 4.0;
    assert_true(fabs(pt_optk_rekls.cpu_seconds(&r, &t) - want) < 1e-12 * want);
    /* first need with nothing measured: the probes fill the rates (positive
     * rates, so a positive time), and a second chunk reuses them */
    memset(&r, 0, sizeof r);
    double s1 = pt_optk_rekls.cpu_seconds(&r, &t);
    assert_int_equal(r.measured, 1);
    assert_true(s1 > 0 && isfinite(s1));
    pt_rekls_rates got;
    memcpy(&got, r.w, sizeof got);
    assert_true(got.gemm_flops_per_s > 0 && got.eigh_flops_per_s > 0);
    t.n_params = 6;
    t.gemm_flops *= 2;
    t.eigh_flops *= 2;
    double s2 = pt_optk_rekls.cpu_seconds(&r, &t);
    assert_true(fabs(s2 - 2 * s1) < 1e-9 * s2);   /* the same rates: linear in the terms */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_by_id),
        cmocka_unit_test(test_cpu_seconds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
