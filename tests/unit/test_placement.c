/*
 * test_placement.c — the block-mode rule (runtime/placement.h) and the swap
 * interval, checked property by property over every (N, I, n_swap, n_ckpt).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "planner/placement.h"
#include "protrain.h"
#include "planner/trace_cache.h"

enum { S = PT_BLOCK_SWAP,
       C = PT_BLOCK_CKPT,
       N = PT_BLOCK_NONE };

static void check_map(int n, int s, int c, int I, const uint8_t *m) {
    int ns = 0, nc = 0, last_s = -1, first_n = n, first_s = n;
    for (int b = 0; b < n; b++) {
        assert_true(m[b] == S || m[b] == C || m[b] == N);
        if (m[b] == S) {
            ns++;
            last_s = b;
            if (first_s == n) first_s = b;
        }
        if (m[b] == C) nc++;
        if (m[b] == N && first_n == n) first_n = b;
    }
    /* counts respected */
    assert_int_equal(ns, s);
    assert_int_equal(nc, c);
    /* every SWAP precedes every NONE */
    assert_true(last_s < first_n);
    /* CKPT only between or after swaps: swapping starts at block 0 */
    if (s > 0) assert_int_equal(first_s, 0);
    /* gaps between consecutive swaps are CKPT-only and as even as possible;
     * exactly I when enough CKPT blocks exist to fill them */
    int prev = -1, gmin = n, gmax = -1;
    for (int b = 0; b < n; b++) {
        if (m[b] != S) continue;
        if (prev >= 0) {
            for (int j = prev + 1; j < b; j++) assert_int_equal(m[j], C);
            int gap = b - prev;
            if (gap < gmin) gmin = gap;
            if (gap > gmax) gmax = gap;
            if ((long)c >= (long)(s - 1) * (I - 1)) assert_int_equal(gap, I);
            if ((long)s * I <= n && (long)c >= (long)(s - 1) * (I - 1)) assert_true(gap >= I);
        }
        prev = b;
    }
    if (s >= 2) {
        assert_true(gmax - gmin <= 1);
        assert_true(gmax <= I);   /* never spread wider than the interval */
    }
}

static void test_all_combinations(void **state) {
    (void)state;
    uint8_t m[48];
    char err[256];
    long checked = 0;
    for (int n = 1; n <= 40; n++)
        for (int I = 1; I <= 6; I++)
            for (int s = 0; s <= n; s++)
                for (int c = 0; c + s <= n; c++) {
                    memset(m, 0xee, sizeof m);
                    assert_int_equal(pt_place_blocks(n, s, c, I, m, err, sizeof err), PT_OK);
                    check_map(n, s, c, I, m);
                    assert_int_equal(m[n], 0xee);   /* no write past n_block */
                    checked++;
                }
    assert_true(checked > 10000);
}

static void test_edge_cases(void **state) {
    (void)state;
    uint8_t m[8];
    char str[16];
    assert_int_equal(pt_place_blocks(8, 0, 0, 2, m, NULL, 0), PT_OK);
    pt_place_modes_string(m, 8, str, sizeof str);
    assert_string_equal(str, "NNNNNNNN");
    assert_int_equal(pt_place_blocks(8, 0, 8, 2, m, NULL, 0), PT_OK);
    pt_place_modes_string(m, 8, str, sizeof str);
    assert_string_equal(str, "CCCCCCCC");
    assert_int_equal(pt_place_blocks(8, 8, 0, 3, m, NULL, 0), PT_OK);
    pt_place_modes_string(m, 8, str, sizeof str);
    assert_string_equal(str, "SSSSSSSS");
    /* remaining CKPT centred: offsets floor((2k+1)*8/4) = 2, 6 */
    assert_int_equal(pt_place_blocks(8, 0, 2, 1, m, NULL, 0), PT_OK);
    pt_place_modes_string(m, 8, str, sizeof str);
    assert_string_equal(str, "NNCNNNCN");
    /* interval 3, two swaps, enough CKPT to fill the gap, the rest centred in
     * the 4 blocks after the swap region (offset floor(4/2) = 2) */
    assert_int_equal(pt_place_blocks(8, 2, 3, 3, m, NULL, 0), PT_OK);
    pt_place_modes_string(m, 8, str, sizeof str);
    assert_string_equal(str, "SCCSNNCN");
    /* not enough CKPT: swaps move closer, evenly */
    assert_int_equal(pt_place_blocks(8, 3, 2, 3, m, NULL, 0), PT_OK);
    pt_place_modes_string(m, 8, str, sizeof str);
    assert_string_equal(str, "SCSCSNNN");
    assert_int_equal(pt_place_blocks(1, 1, 0, 4, m, NULL, 0), PT_OK);
    assert_int_equal(m[0], S);
}

static void test_invalid(void **state) {
    (void)state;
    uint8_t m[8];
    char err[256] = {0};
    assert_int_equal(pt_place_blocks(8, 5, 4, 1, m, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "n_block=8"));
    assert_int_equal(pt_place_blocks(8, -1, 0, 1, m, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_place_blocks(0, 0, 0, 1, m, err, sizeof err), PT_ERR_INVALID_ARG);
}

static void test_modes_string_truncates(void **state) {
    (void)state;
    uint8_t m[10];
    char str[6];
    pt_place_blocks(10, 1, 0, 1, m, NULL, 0);
    pt_place_modes_string(m, 10, str, sizeof str);
    assert_int_equal(strlen(str), 5);
    assert_int_equal(str[4], '~');
    assert_int_equal(str[0], 'S');
}

static void make_trace(pt_trace *t, int n, double fwd, uint64_t arena, double d2h) {
    pt_trace_init(t);
    assert_int_equal(pt_trace_alloc(t, n, 1, NULL, 0), PT_OK);
    for (int b = 0; b < n; b++) {
        t->blocks[b].fwd_s = fwd;
        t->blocks[b].arena_bytes = arena;
    }
    t->hw.d2h_Bps = d2h;
}

static void test_swap_interval(void **state) {
    (void)state;
    pt_trace t;
    /* D2H 1 GB at 10 GB/s = 0.1 s; forward 0.04 s -> 2.5 -> I = 3 */
    make_trace(&t, 12, 0.04, 1000000000ull, 1e10);
    assert_int_equal(pt_place_swap_interval(&t), 3);
    assert_int_equal(pt_place_swap_cap(12, 3), 4);
    /* exactly 2 forwards: I = 2 (no rounding up past an exact multiple) */
    for (int b = 0; b < 12; b++) t.blocks[b].fwd_s = 0.05;
    assert_int_equal(pt_place_swap_interval(&t), 2);
    /* faster link than compute: I = 1 */
    for (int b = 0; b < 12; b++) t.blocks[b].fwd_s = 1.0;
    assert_int_equal(pt_place_swap_interval(&t), 1);
    /* one slow block dominates (every block's swap must be hidden) */
    t.blocks[5].fwd_s = 0.01;
    assert_int_equal(pt_place_swap_interval(&t), 10);
    /* never more than N */
    t.blocks[5].fwd_s = 1e-9;
    assert_int_equal(pt_place_swap_interval(&t), 12);
    assert_int_equal(pt_place_swap_cap(12, 12), 1);
    assert_int_equal(pt_place_swap_cap(13, 2), 7);
    pt_trace_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_combinations),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_modes_string_truncates),
        cmocka_unit_test(test_swap_interval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
