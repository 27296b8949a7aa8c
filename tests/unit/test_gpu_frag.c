/*
 * test_gpu_frag.c — the device allocator's own fragmentation figures
 * (pt_gpu_usage span_peak / req_current / peak_req / peak_largest_free and
 * pt_gpu_frag_factor) on the host backend. The expected numbers are derived
 * here from the documented placement rule (best fit, lowest address on ties,
 * 256-byte blocks), not read back from the code under test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "device_ext.h"
#include "gpu.h"
#include "protrain.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

static uint64_t charge(uint64_t n) { return n == 0 ? 256 : (n + 255) / 256 * 256; }

static pt_gpu *open_dev(uint64_t cap) {
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    c.capacity = cap;
    pt_gpu *g = NULL;
    char err[512] = "";
    int rc = pt_gpu_open("host", &c, &g, err, sizeof err);
    if (rc != PT_OK) fprintf(stderr, "open failed: %s\n", err);
    assert_int_equal(rc, PT_OK);
    return g;
}

static pt_gpu_usage usage(const pt_gpu *g) {
    pt_gpu_usage u;
    pt_gpu_usage_get(g, &u);
    return u;
}

/* Blocks allocated back to back and freed in reverse leave no hole: the span
 * is the peak and the factor exactly 1; rounding is what the requests lost. */
static void test_packed_is_one(void **state) {
    (void)state;
    pt_gpu *g = open_dev(4 * MiB);
    const uint64_t req[5] = {1000, 64 * KiB, 3, 200 * KiB + 1, 4096};
    void *p[5];
    uint64_t sum_req = 0, sum_charge = 0;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(pt_gpu_alloc(g, req[i], PT_TAG_ACT, &p[i], NULL, 0), PT_OK);
        sum_req += req[i];
        sum_charge += charge(req[i]);
    }
    pt_gpu_usage u = usage(g);
    assert_int_equal(u.peak, sum_charge);
    assert_int_equal(u.span_peak, sum_charge);
    assert_int_equal(u.req_current, sum_req);
    assert_int_equal(u.peak_req, sum_req);
    assert_int_equal(u.peak_largest_free, 4 * MiB - sum_charge);  /* the tail */
    assert_true(pt_gpu_frag_factor(&u) == 1.0);
    for (int i = 4; i >= 0; i--) pt_gpu_free(g, p[i]);
    u = usage(g);
    assert_int_equal(u.req_current, 0);
    assert_int_equal(u.current, 0);
    pt_gpu_close(g);
}

/*
 * The classic fragmenting pattern: sixteen 64 KiB blocks, every other one
 * freed, then a 128 KiB request that no 64 KiB hole can take. Best fit puts it
 * in the tail at 1 MiB, so after a reset_peak at 512 KiB in use:
 *   peak      = 8 * 64 KiB + 128 KiB            = 640 KiB
 *   span      = 16 * 64 KiB + 128 KiB           = 1152 KiB
 *   factor    = 1152 / 640                      = 1.8
 *   largest free at the peak = the tail, capacity - 1152 KiB; the other free
 *   bytes (8 holes of 64 KiB) are the fragmentation
 * Each request is 100 bytes short of its block, so rounding at the peak is
 * 9 * 100 bytes.
 */
static void test_holes_measured(void **state) {
    (void)state;
    const uint64_t cap = 2 * MiB, piece = 64 * KiB;
    pt_gpu *g = open_dev(cap);
    void *p[16], *big = NULL;
    for (int i = 0; i < 16; i++)
        assert_int_equal(pt_gpu_alloc(g, piece - 100, PT_TAG_BUFFER, &p[i], NULL, 0), PT_OK);
    for (int i = 0; i < 16; i += 2) pt_gpu_free(g, p[i]);
    pt_gpu_reset_peak(g);
    pt_gpu_usage u = usage(g);
    /* after the reset: peak = current, span = the highest live block's end */
    assert_int_equal(u.peak, 8 * piece);
    assert_int_equal(u.span_peak, 16 * piece);
    assert_int_equal(u.peak_largest_free, cap - 16 * piece);
    assert_int_equal(u.peak_req, 8 * (piece - 100));
    assert_true(pt_gpu_frag_factor(&u) == 2.0);    /* 1 MiB range for 512 KiB */

    assert_int_equal(pt_gpu_alloc(g, 2 * piece - 100, PT_TAG_ACT, &big, NULL, 0), PT_OK);
    assert_int_equal((uint64_t)((char *)big - (char *)p[1]) + piece, 16 * piece);  /* in the tail */
    u = usage(g);
    assert_int_equal(u.peak, 10 * piece);
    assert_int_equal(u.span_peak, 18 * piece);
    assert_int_equal(u.peak_largest_free, cap - 18 * piece);
    assert_int_equal(u.peak - u.peak_req, 9 * 100);
    assert_true(u.peak_largest_free < cap - u.peak);   /* free space is fragmented */
    assert_true(pt_gpu_frag_factor(&u) == 18.0 / 10.0);

    /* a 64 KiB request fills a hole: the peak rises, the span does not */
    void *small = NULL;
    assert_int_equal(pt_gpu_alloc(g, piece, PT_TAG_ACT, &small, NULL, 0), PT_OK);
    assert_true((char *)small < (char *)p[15]);
    u = usage(g);
    assert_int_equal(u.peak, 11 * piece);
    assert_int_equal(u.span_peak, 18 * piece);
    assert_true(pt_gpu_frag_factor(&u) == 18.0 / 11.0);

    /* the span is a high water: freeing the tail block keeps it until a reset,
     * which measures what is live then (the highest live block ends at 1 MiB) */
    pt_gpu_free(g, big);
    assert_int_equal(usage(g).span_peak, 18 * piece);
    pt_gpu_reset_peak(g);
    u = usage(g);
    assert_int_equal(u.span_peak, 16 * piece);
    assert_int_equal(u.peak, 9 * piece);
    pt_gpu_free(g, small);
    for (int i = 1; i < 16; i += 2) pt_gpu_free(g, p[i]);
    pt_gpu_reset_peak(g);
    u = usage(g);
    assert_int_equal(u.span_peak, 0);
    assert_int_equal(u.req_current, 0);
    assert_true(pt_gpu_frag_factor(&u) == 1.0);    /* zero peak */
    assert_int_equal(pt_gpu_live_allocs(g), 0);
    pt_gpu_close(g);
}

/* The factor predicts what the pattern needs: replaying the same sequence on a
 * device of capacity factor * peak succeeds, one block smaller fails at the
 * tail request although the free bytes would cover it. */
static int replay(uint64_t cap) {
    pt_gpu *g = open_dev(cap);
    void *p[16], *big = NULL;
    int ok = 1;
    for (int i = 0; i < 16 && ok; i++)
        ok = pt_gpu_alloc(g, 64 * KiB, PT_TAG_BUFFER, &p[i], NULL, 0) == PT_OK;
    for (int i = 0; i < 16; i += 2) pt_gpu_free(g, p[i]);
    if (ok) ok = pt_gpu_alloc(g, 128 * KiB, PT_TAG_ACT, &big, NULL, 0) == PT_OK;
    pt_gpu_free(g, big);
    for (int i = 1; i < 16; i += 2) pt_gpu_free(g, p[i]);
    pt_gpu_close(g);
    return ok;
}

static void test_factor_is_what_fits(void **state) {
    (void)state;
    pt_gpu *g = open_dev(8 * MiB);
    void *p[16], *big = NULL;
    for (int i = 0; i < 16; i++)
        assert_int_equal(pt_gpu_alloc(g, 64 * KiB, PT_TAG_BUFFER, &p[i], NULL, 0), PT_OK);
    for (int i = 0; i < 16; i += 2) pt_gpu_free(g, p[i]);
    assert_int_equal(pt_gpu_alloc(g, 128 * KiB, PT_TAG_ACT, &big, NULL, 0), PT_OK);
    pt_gpu_usage u = usage(g);
    double f = pt_gpu_frag_factor(&u);
    pt_gpu_free(g, big);
    for (int i = 1; i < 16; i += 2) pt_gpu_free(g, p[i]);
    pt_gpu_close(g);
    /* the whole run's peak is the 16 blocks (1 MiB), the range 1152 KiB */
    assert_int_equal(u.peak, 16 * 64 * KiB);
    uint64_t need = (uint64_t)(f * (double)u.peak + 0.5);
    assert_int_equal(need, 1152 * KiB);
    assert_true(replay(need));
    assert_false(replay(need - 256));
    assert_true(u.peak < need - 256);     /* the bytes alone would have fitted */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_is_one),
        cmocka_unit_test(test_holes_measured),
        cmocka_unit_test(test_factor_is_what_fits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
