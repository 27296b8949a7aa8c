/*
 * test_rt_ext.c — the runtime object's feature table (core/rt_ext.c): what the
 * core asks the features through it instead of naming them. The refusals of
 * combinations (and that pt_rt_create says them), the INI keys the ranks agree
 * on (their exact text), the profile cache key (every feature setting moves
 * it, an unrelated one does not), the search a feature runs in place of the
 * planner's, its plan fields, and the state slots.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/rt_internal.h"
#include "osft/osft.h"
#include "planner/planner.h"
#include "protrain.h"
#include "tiled/tiled.h"

static void test_refuse(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    assert_null(pt_rt_ext_refuse(&c));
    c.osft_enabled = 1;
    assert_null(pt_rt_ext_refuse(&c));
    c.tiled_mlp_enabled = 1;
    const char *w = pt_rt_ext_refuse(&c);
    assert_non_null(w);
    assert_non_null(strstr(w, "[osft] enabled with [tiled_mlp] enabled"));
    c.tiled_mlp_enabled = 0;
    c.tp_size = 2;
    w = pt_rt_ext_refuse(&c);
    assert_non_null(w);
    assert_non_null(strstr(w, "[dist] tp_size > 1 with [osft] enabled"));
    /* pt_rt_create refuses with the feature's sentence before opening anything */
    c.tp_size = 1;
    c.tiled_mlp_enabled = 1;
    pt_logger lg;
    memset(&lg, 0, sizeof lg);
    pt_rt *rt = NULL;
    char err[512] = "";
    assert_int_equal(pt_rt_create(&c, NULL, &lg, NULL, &rt, err, sizeof err), PT_ERR_UNSUPPORTED);
    assert_null(rt);
    assert_non_null(strstr(err, "TiledMLP's per-tile gradient accumulator"));
}

typedef struct text {
    char s[1024];
    size_t n;
} text;

static void put(void *t, const char *name, const char *value) {
    text *x = t;
    x->n += (size_t)snprintf(x->s + x->n, sizeof x->s - x->n, "%s=%s\n", name, value);
}

static void test_agree_keys(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    c.osft_enabled = 1;
    c.osft_urr = 0.4f;
    snprintf(c.osft_targets, sizeof c.osft_targets, "qkvw,fcw");
    c.osft_cache_frozen = 1;
    c.tiled_mlp_enabled = 0;
    c.tiled_mlp_tiles = 3;
    text t = {.n = 0};
    pt_rt_ext_agree_keys(&c, &(pt_rt_keys){&t, put});
    /* the features in order, a float as the bits' %.9g */
    assert_string_equal(t.s, "osft.enabled=1\nosft.unfreeze_rank_ratio=0.400000006\n"
                             "osft.targets=qkvw,fcw\nosft.cache_frozen=1\n"
                             "tiled_mlp.enabled=0\ntiled_mlp.tiles=3\n");
    c.osft_urr = NAN;
    t.n = 0;
    pt_rt_ext_agree_keys(&c, &(pt_rt_keys){&t, put});
    assert_non_null(strstr(t.s, "osft.unfreeze_rank_ratio=auto\n"));
}

static void test_cache_key(void **state) {
    (void)state;
    pt_config c;
    pt_config_defaults(&c);
    const uint64_t h0 = 12345, k0 = pt_rt_ext_cache_key(&c, h0);
    assert_int_not_equal(k0, h0);
    assert_int_equal(pt_rt_ext_cache_key(&c, h0), k0);   /* a function of its inputs */
    pt_config d = c;
    d.lr = 0.5f;   /* not a feature's setting */
    assert_int_equal(pt_rt_ext_cache_key(&d, h0), k0);
    assert_int_not_equal(pt_rt_ext_cache_key(&c, h0 + 1), k0);
    for (int k = 0; k < 5; k++) {
        d = c;
        switch (k) {
        case 0: d.osft_enabled = !c.osft_enabled; break;
        case 1: d.osft_urr = c.osft_urr + 0.125f; break;
        case 2: d.osft_targets[0] = d.osft_targets[0] == 'x' ? 'y' : 'x'; break;
        case 3: d.tiled_mlp_enabled = !c.tiled_mlp_enabled; break;
        case 4: d.tiled_mlp_tiles = c.tiled_mlp_tiles + 2; break;
        }
        if (pt_rt_ext_cache_key(&d, h0) == k0) fail_msg("feature setting %d leaves the key", k);
    }
}

static void test_search_and_plan(void **state) {
    (void)state;
    pt_rt *rt = calloc(1, sizeof *rt);
    assert_non_null(rt);
    pt_config_defaults(&rt->cfg);
    assert_null(pt_rt_ext_searcher(rt));   /* TiledMLP off */
    rt->cfg.tiled_mlp_enabled = 1;
    rt->cfg.tiled_mlp_tiles = 3;
    assert_null(pt_rt_ext_searcher(rt));   /* a fixed count: the plain search */
    pt_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.batch = 2;
    plan.seq = 10;
    pt_rt_ext_plan_fill(rt, &plan);
    assert_int_equal(plan.mlp_tiles, 3);   /* 20 rows in tiles of 7, 7, 6 */
    assert_int_equal(plan.mlp_tile_len, 7);
    assert_int_equal(plan.mlp_tiles_auto, 0);
    rt->cfg.tiled_mlp_tiles = 0;   /* auto */
    const pt_rt_ext *se = pt_rt_ext_searcher(rt);
    assert_ptr_equal(se, &pt_tiled_ext);
    assert_non_null(se->search);
    assert_string_equal(se->search_what, "[tiled_mlp] tiles = auto");
    memset(&plan, 0, sizeof plan);
    plan.batch = 2;
    plan.seq = 10;
    pt_rt_ext_plan_fill(rt, &plan);
    assert_int_equal(plan.mlp_tiles_auto, 1);
    free(rt);
}

static void test_state_slots(void **state) {
    (void)state;
    pt_rt *rt = calloc(1, sizeof *rt);
    assert_non_null(rt);
    int a, b;
    assert_null(pt_rt_ext_state(rt, &pt_osft_ext));
    pt_rt_ext_set_state(rt, &pt_osft_ext, &a);
    pt_rt_ext_set_state(rt, &pt_tiled_ext, &b);
    assert_ptr_equal(pt_rt_ext_state(rt, &pt_osft_ext), &a);
    assert_ptr_equal(pt_rt_ext_state(rt, &pt_tiled_ext), &b);
    /* a table that is not in the list has no slot: set does nothing, get is NULL */
    static const pt_rt_ext other = {.name = "other"};
    pt_rt_ext_set_state(rt, &other, &a);
    assert_null(pt_rt_ext_state(rt, &other));
    assert_ptr_equal(pt_rt_ext_state(rt, &pt_osft_ext), &a);
    assert_ptr_equal(pt_rt_ext_state(rt, &pt_tiled_ext), &b);
    free(rt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refuse),
        cmocka_unit_test(test_agree_keys),
        cmocka_unit_test(test_cache_key),
        cmocka_unit_test(test_search_and_plan),
        cmocka_unit_test(test_state_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
