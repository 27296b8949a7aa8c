/*
 * test_mlp_tiles.c — the TiledMLP tile arithmetic (runtime/base/base.h): tile
 * length c = ceil(tokens / n), N_eff = ceil(tokens / c) tiles, every tile
 * non-empty, only the last one shorter, the tiles covering [0, tokens) once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/base.h"

static void test_examples(void **st) {
    (void)st;
    /* 5 tokens asked in 4 tiles: tiles of 2, only 3 of them (2, 2, 1) */
    assert_int_equal(pt_mlp_tile_len(5, 4), 2);
    assert_int_equal(pt_mlp_tiles_eff(5, 4), 3);
    /* more tiles than tokens: one-token tiles */
    assert_int_equal(pt_mlp_tile_len(20, 25), 1);
    assert_int_equal(pt_mlp_tiles_eff(20, 25), 20);
    assert_int_equal(pt_mlp_tiles_eff(1, 1), 1);
    assert_int_equal(pt_mlp_tiles_eff(125, 4), 4); /* 32, 32, 32, 29 */
    assert_int_equal(pt_mlp_tile_len(125, 4), 32);
    /* n = 0 (what tiles = auto profiles with): tiles of at most PT_MLP_AUTO_TILE */
    const int64_t A = PT_MLP_AUTO_TILE;
    assert_int_equal(pt_mlp_tiles_eff(A, 0), 1);
    assert_int_equal(pt_mlp_tiles_eff(A + 1, 0), 2);
    assert_int_equal(pt_mlp_tile_len(A + 1, 0), A / 2 + 1);
    assert_int_equal(pt_mlp_tiles_eff(32 * A, 0), 32);
}

static void test_partition(void **st) {
    (void)st;
    for (int64_t t = 1; t <= 300; t++) {
        for (int64_t n = 0; n <= 320; n++) {
            int64_t c = pt_mlp_tile_len(t, n), ne = pt_mlp_tiles_eff(t, n), covered = 0, k = 0;
            assert_true(c >= 1);
            if (n > 0) assert_true(ne <= n && ne >= 1);
            for (int64_t b = 0; b < t; b += c, k++) {
                int64_t cnt = t - b < c ? t - b : c;
                assert_true(cnt >= 1);
                if (b + c < t) assert_int_equal(cnt, c); /* only the last is shorter */
                covered += cnt;
            }
            assert_int_equal(k, ne);
            assert_int_equal(covered, t);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_partition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
