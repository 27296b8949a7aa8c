/*
 * test_exec_order.c — chunks follow the order the hooks use the blocks in, not
 * the order the host declared its parameters in.
 *
 * The hook contract runs forward over blocks 0, 1, ..., n-1, so that is the
 * order of first use. A host that declares its block weights interleaved
 * (0, 4, 1, 5, 2, 6, 3, 7: say, two stacks declared side by side) must not get
 * chunks packed in that order: a chunk of two blocks would hold blocks 0 and
 * 4, a forward through two buffer slots would switch chunks at every block and
 * gather each chunk twice (5505024 bytes uploaded in 3 steps against 2359296),
 * and a profiled plan under a small device would fail (the bootstrap layout
 * needs more than the device). Here both hosts train the same
 * model through the hooks:
 *  - with the knobs fixed (everything streamed through two slots), the interleaved
 *    host uploads exactly the bytes per step the ordered host uploads;
 *  - with the plan searched under a small device, the interleaved host profiles and
 *    plans;
 *  - both end with bit-identical parameters (the layout changes where bytes
 *    live, never the math).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "hook_host.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

/* Trains HH_STEPS steps; returns the H2D bytes of the last HH_STEPS-1 and copies each
 * block's final weight (by block, not by declaration slot) into w[HH_NB][HH_NEL]. */
static uint64_t train(hh_host *h, float (*w)[HH_NEL], float *emb) {
    pt_stats_v1 s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    hh_step(h, 0);
    assert_int_equal(P->get_stats(h->ctx, &s0), PT_OK);
    for (int s = 1; s < HH_STEPS; s++) hh_step(h, s);
    assert_int_equal(P->get_stats(h->ctx, &s1), PT_OK);
    for (int b = 0; b < HH_NB; b++)
        assert_int_equal(P->read_param(h->ctx, h->of_block[b], w[b], HH_NEL * sizeof(float)), PT_OK);
    assert_int_equal(P->read_param(h->ctx, 0, emb, HH_NEL * sizeof(float)), PT_OK);
    return s1.h2d_bytes - s0.h2d_bytes;
}

static float wa[HH_NB][HH_NEL], wb[HH_NB][HH_NEL], ea[HH_NEL], eb[HH_NEL];

static void test_streamed_fixed_knobs(void **st) {
    (void)st;
    const char *knobs = "auto_memory = false\nn_persist = 0\nn_buffer = 2\nn_swap = 0\n"
                        "n_checkpoint = 0";
    hh_host a, b;
    hh_make(&a, &(hh_opts){0}, knobs);
    uint64_t ha = train(&a, wa, ea);
    hh_done(&a);
    hh_make(&b, &(hh_opts){.interleave = 1}, knobs);
    uint64_t hb = train(&b, wb, eb);
    hh_done(&b);
    /* every block chunk streams: two gathers per step per chunk at least */
    assert_true(ha >= (uint64_t)(HH_STEPS - 1) * HH_NB * HH_NEL * sizeof(float));
    if (hb != ha)
        fail_msg("interleaved host uploaded %llu bytes in %d steps, ordered host %llu",
                 (unsigned long long)hb, HH_STEPS - 1, (unsigned long long)ha);
    assert_memory_equal(wa, wb, sizeof wa);
    assert_memory_equal(ea, eb, sizeof ea);
}

/* A searched plan under a device too small for everything: profiles, plans,
 * trains, and matches the ordered host's plan and values. */
static void test_profiled_plan(void **st) {
    (void)st;
    const char *cfg = "[memory]\ndevice_capacity = 1MiB";
    hh_host a, b;
    hh_make(&a, &(hh_opts){0}, cfg);
    pt_stats_v1 sa = {.struct_size = sizeof sa}, sb = {.struct_size = sizeof sb};
    assert_int_equal(P->get_stats(a.ctx, &sa), PT_OK);
    uint64_t ha = train(&a, wa, ea);
    hh_done(&a);
    hh_make(&b, &(hh_opts){.interleave = 1}, cfg);
    assert_int_equal(P->get_stats(b.ctx, &sb), PT_OK);
    uint64_t hb = train(&b, wb, eb);
    hh_done(&b);
    assert_true(sa.n_persist < sa.n_chunk);   /* the capacity forced streaming */
    assert_int_equal(sb.n_persist, sa.n_persist);
    assert_int_equal(sb.n_buffer, sa.n_buffer);
    assert_int_equal(sb.n_chunk, sa.n_chunk);
    assert_true(sb.pred_peak == sa.pred_peak);
    assert_true(hb == ha);
    assert_memory_equal(wa, wb, sizeof wa);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streamed_fixed_knobs),
        cmocka_unit_test(test_profiled_plan),
    };
    return cmocka_run_group_tests_name("exec_order", tests, NULL, NULL);
}
