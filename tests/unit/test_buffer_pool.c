/*
 * test_buffer_pool.c — the chunk buffer pool: forward->backward reuse, LRU eviction,
 * leases, the all-leased error, invalidation, accounting on the host device. Most
 * tests run the pool without a device (g == NULL: calloc'd slots) so the policy is
 * checked on its own; test_device_* use the simulated device.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "store/buffer_pool.h"
#include "device_ext.h"
#include "protrain.h"

static pt_bufpool *mk(int32_t n, uint64_t bytes) {
    pt_bufpool *bp = NULL;
    char err[256] = "";
    if (pt_bufpool_create(NULL, n, bytes, &bp, err, sizeof err)) fail_msg("%s", err);
    return bp;
}

static int32_t acq(pt_bufpool *bp, int32_t chunk, int32_t *hit) {
    int32_t s = -1, h = -1;
    char err[320] = "";
    if (pt_bufpool_acquire(bp, chunk, &s, &h, err, sizeof err)) fail_msg("acquire %d: %s", chunk, err);
    if (hit) *hit = h;
    return s;
}

/* Forward uses chunks 0..7 one at a time through 3 slots; backward walks 7..0.
 * The last 3 of forward (7, 6, 5) are hits with the same slots and intact data; the
 * rest miss. Data written on a miss (the "upload") is read back on the hit. */
static void test_forward_backward_reuse(void **st) {
    (void)st;
    enum { NS = 3,
           NC = 8 };
    pt_bufpool *bp = mk(NS, 256);
    int32_t fwd_slot[NC];
    for (int32_t c = 0; c < NC; c++) {
        int32_t hit;
        fwd_slot[c] = acq(bp, c, &hit);
        assert_int_equal(hit, 0);
        memset(pt_bufpool_slot_ptr(bp, fwd_slot[c]), 0x40 + c, 256);
        assert_int_equal(pt_bufpool_release(bp, fwd_slot[c], NULL, 0), PT_OK);
    }
    int hits = 0;
    for (int32_t c = NC - 1; c >= 0; c--) {
        int32_t hit, s = acq(bp, c, &hit);
        if (c >= NC - NS) {
            assert_int_equal(hit, 1);
            assert_int_equal(s, fwd_slot[c]);
            const unsigned char *d = pt_bufpool_slot_ptr(bp, s);
            for (int k = 0; k < 256; k++) assert_int_equal(d[k], 0x40 + c);
        } else {
            assert_int_equal(hit, 0);
        }
        hits += hit;
        assert_int_equal(pt_bufpool_release(bp, s, NULL, 0), PT_OK);
    }
    assert_int_equal(hits, NS);
    pt_bufpool_stats s;
    pt_bufpool_stats_get(bp, &s);
    assert_true(s.acquires == 2 * NC && s.hits == NS && s.misses == 2 * NC - NS);
    assert_true(s.evictions == 2 * NC - NS - NS);  /* every miss after the first 3 evicts */
    assert_int_equal(s.leased_slots, 0);
    pt_bufpool_destroy(bp);
}

/* Eviction takes the least recently released slot, whatever the acquire order. */
static void test_lru_order(void **st) {
    (void)st;
    pt_bufpool *bp = mk(3, 64);
    int32_t a = acq(bp, 10, NULL), b = acq(bp, 11, NULL), c = acq(bp, 12, NULL);
    pt_bufpool_release(bp, b, NULL, 0);
    pt_bufpool_release(bp, c, NULL, 0);
    pt_bufpool_release(bp, a, NULL, 0);
    int32_t s = acq(bp, 13, NULL);
    assert_int_equal(s, b);
    assert_int_equal(pt_bufpool_last_evicted(bp), 11);
    s = acq(bp, 14, NULL);
    assert_int_equal(s, c);
    assert_int_equal(pt_bufpool_last_evicted(bp), 12);
    /* Re-acquiring and releasing 10 makes it the most recent; 13 (released below
     * before 10) goes first. */
    int32_t h, a2 = acq(bp, 10, &h);
    assert_int_equal(h, 1);
    assert_int_equal(a2, a);
    pt_bufpool_release(bp, b, NULL, 0);   /* holds 13 */
    pt_bufpool_release(bp, a2, NULL, 0);  /* holds 10 */
    pt_bufpool_release(bp, c, NULL, 0);   /* holds 14 */
    assert_int_equal(acq(bp, 15, NULL), b);
    assert_int_equal(pt_bufpool_last_evicted(bp), 13);
    assert_int_equal(pt_bufpool_lookup(bp, 13), -1);
    assert_int_equal(pt_bufpool_lookup(bp, 10), a);
    pt_bufpool_destroy(bp);
}

/* An untagged slot is taken before any tagged one is evicted. */
static void test_untagged_first(void **st) {
    (void)st;
    pt_bufpool *bp = mk(3, 64);
    int32_t s0 = acq(bp, 0, NULL), s1 = acq(bp, 1, NULL), s2 = acq(bp, 2, NULL);
    pt_bufpool_release(bp, s0, NULL, 0);
    pt_bufpool_release(bp, s1, NULL, 0);
    pt_bufpool_release(bp, s2, NULL, 0);
    assert_int_equal(pt_bufpool_invalidate(bp, 2, NULL, 0), PT_OK);     /* s2 newest but untagged */
    assert_int_equal(pt_bufpool_slot_chunk(bp, s2), -1);
    assert_int_equal(pt_bufpool_invalidate(bp, 99, NULL, 0), PT_OK);    /* not cached: no-op */
    int32_t h, s = acq(bp, 2, &h);
    assert_int_equal(h, 0);                                      /* stale copy not reused */
    assert_int_equal(s, s2);
    assert_int_equal(pt_bufpool_last_evicted(bp), -1);
    assert_int_equal(pt_bufpool_lookup(bp, 0), s0);
    pt_bufpool_release(bp, s, NULL, 0);
    pt_bufpool_destroy(bp);
}

/* Leases: a chunk acquired twice needs two releases before it can be evicted; while
 * every slot is leased, acquire fails with PT_ERR_INTERNAL and changes nothing. */
static void test_leases_and_all_leased(void **st) {
    (void)st;
    pt_bufpool *bp = mk(2, 64);
    int32_t h, a = acq(bp, 5, &h), a2 = acq(bp, 5, &h);
    assert_int_equal(a, a2);
    assert_int_equal(h, 1);
    assert_int_equal(pt_bufpool_slot_leases(bp, a), 2);
    int32_t b = acq(bp, 6, NULL);
    pt_bufpool_release(bp, a, NULL, 0);            /* one lease left on chunk 5 */
    int32_t s = -1;
    h = -1;
    char e[320] = "";
    assert_int_equal(pt_bufpool_acquire(bp, 7, &s, &h, e, sizeof e), PT_ERR_INTERNAL);
    assert_non_null(strstr(e, "all 2 slots are leased"));
    assert_non_null(strstr(e, "chunk 7"));
    assert_int_equal(pt_bufpool_slot_chunk(bp, a), 5);
    assert_int_equal(pt_bufpool_slot_chunk(bp, b), 6);
    pt_bufpool_stats stt;
    pt_bufpool_stats_get(bp, &stt);
    assert_true(stt.acquires == 3 && stt.misses == 2);
    assert_int_equal(stt.leased_slots, 2);
    /* Invalidating a leased chunk is refused. */
    assert_int_equal(pt_bufpool_invalidate(bp, 5, NULL, 0), PT_ERR_INTERNAL);
    assert_int_equal(pt_bufpool_slot_chunk(bp, a), 5);
    pt_bufpool_release(bp, b, NULL, 0);            /* 6 evictable now, 5 still leased */
    assert_int_equal(acq(bp, 7, &h), b);
    assert_int_equal(h, 0);
    assert_int_equal(pt_bufpool_last_evicted(bp), 6);
    pt_bufpool_release(bp, a, NULL, 0);
    pt_bufpool_release(bp, b, NULL, 0);
    /* Release errors: no lease left, slot out of range. */
    assert_int_equal(pt_bufpool_release(bp, a, e, sizeof e), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(e, "double release"));
    assert_int_equal(pt_bufpool_release(bp, 9, NULL, 0), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_bufpool_release(bp, -1, NULL, 0), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_bufpool_acquire(bp, -3, &s, &h, NULL, 0), PT_ERR_INVALID_ARG);
    /* invalidate_all drops unleased tags and counts the leased ones it keeps. */
    int32_t k = acq(bp, 8, NULL);         /* evicts 5 (released before 7) */
    assert_int_equal(k, a);
    assert_int_equal(pt_bufpool_invalidate_all(bp), 1);
    assert_int_equal(pt_bufpool_lookup(bp, 8), k);
    assert_int_equal(pt_bufpool_lookup(bp, 7), -1);
    assert_int_equal(pt_bufpool_lookup(bp, 5), -1);
    pt_bufpool_release(bp, k, NULL, 0);
    pt_bufpool_destroy(bp);
}

static void test_bad_args_and_accessors(void **st) {
    (void)st;
    pt_bufpool *bp = NULL;
    char err[256] = "";
    assert_int_equal(pt_bufpool_create(NULL, -1, 64, &bp, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_null(bp);
    assert_int_equal(pt_bufpool_create(NULL, 2, 0, &bp, err, sizeof err), PT_ERR_INVALID_ARG);
    /* Zero slots is legal (everything persistent); any acquire then fails clearly. */
    bp = mk(0, 0);
    int32_t s, h;
    assert_int_equal(pt_bufpool_acquire(bp, 0, &s, &h, NULL, 0), PT_ERR_INTERNAL);
    pt_bufpool_destroy(bp);
    bp = mk(2, 64);
    assert_null(pt_bufpool_slot_ptr(bp, 5));   /* no such slot */
    assert_int_equal(pt_bufpool_n_slots(bp), 2);
    assert_true(pt_bufpool_slot_bytes(bp) == 64);
    assert_true(pt_bufpool_slot_ptr(bp, 0) != pt_bufpool_slot_ptr(bp, 1));
    pt_bufpool_destroy(bp);
}

/* Two threads (the hook thread and a stream callback, say) acquire and release
 * disjoint chunk sets concurrently; leases must balance. Run under TSan too. */
typedef struct thr_arg {
    pt_bufpool *bp;
    int32_t base;
    int fails;
} thr_arg;
static void *worker(void *p) {
    thr_arg *a = p;
    for (int i = 0; i < 2000; i++) {
        int32_t s, h;
        if (pt_bufpool_acquire(a->bp, a->base + i % 5, &s, &h, NULL, 0)) {
            a->fails++;
            continue;
        }
        if (pt_bufpool_slot_chunk(a->bp, s) != a->base + i % 5) a->fails++;
        if (pt_bufpool_release(a->bp, s, NULL, 0)) a->fails++;
    }
    return NULL;
}
static void test_threads(void **st) {
    (void)st;
    pt_bufpool *bp = mk(4, 64);
    thr_arg a = {bp, 0, 0}, b = {bp, 100, 0};
    pthread_t t1, t2;
    assert_int_equal(pthread_create(&t1, NULL, worker, &a), 0);
    assert_int_equal(pthread_create(&t2, NULL, worker, &b), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(a.fails + b.fails, 0);
    pt_bufpool_stats s;
    pt_bufpool_stats_get(bp, &s);
    assert_true(s.acquires == 4000 && s.hits + s.misses == 4000);
    assert_int_equal(s.leased_slots, 0);
    pt_bufpool_destroy(bp);
}


static pt_gpu *open_host(uint64_t capacity) {
    pt_gpu_config cfg = {.capacity = capacity, .poison = 1};
    pt_gpu *g = NULL;
    char err[256] = "";
    if (pt_gpu_open("host", &cfg, &g, err, sizeof err)) fail_msg("pt_gpu_open: %s", err);
    return g;
}

/* On the simulated device: slots are PT_TAG_BUFFER allocations made once; traffic
 * allocates nothing; destroy frees everything. */
static void test_device_accounting(void **st) {
    (void)st;
    pt_gpu *g = open_host(1 << 20);
    pt_bufpool *bp = NULL;
    char err[256] = "";
    assert_int_equal(pt_bufpool_create(g, 4, 4096, &bp, err, sizeof err), PT_OK);
    pt_gpu_usage u;
    pt_gpu_usage_get(g, &u);
    assert_true(u.tag_current[PT_TAG_BUFFER] == 4 * pt_gpu_round_size(4096));
    assert_true(u.n_allocs == 4);
    for (int32_t c = 0; c < 10; c++) {    /* steady-state traffic allocates nothing */
        int32_t s, h;
        assert_int_equal(pt_bufpool_acquire(bp, c, &s, &h, NULL, 0), PT_OK);
        assert_true(pt_bufpool_slot_ptr(bp, s) != NULL);
        assert_true(pt_gpu_alloc_size(g, pt_bufpool_slot_ptr(bp, s)) == 4096);
        pt_bufpool_release(bp, s, NULL, 0);
    }
    pt_gpu_usage_get(g, &u);
    assert_true(u.n_allocs == 4);
    assert_true(u.tag_current[PT_TAG_BUFFER] == 4 * pt_gpu_round_size(4096));
    pt_bufpool_destroy(bp);
    assert_int_equal(pt_gpu_live_allocs(g), 0);
    pt_gpu_close(g);
}

/* Capacity: a pool that does not fit fails with PT_ERR_OOM naming the slot and leaves
 * nothing allocated; one that fits holds exactly its slots. */
static void test_device_oom(void **st) {
    (void)st;
    pt_gpu *g = open_host(64 * 1024);
    pt_bufpool *bp = NULL;
    char err[512] = "";
    assert_int_equal(pt_bufpool_create(g, 5, 16 * 1024, &bp, err, sizeof err), PT_ERR_OOM);
    assert_null(bp);
    assert_non_null(strstr(err, "slot 4 of 5"));
    assert_int_equal(pt_gpu_live_allocs(g), 0);
    assert_int_equal(pt_bufpool_create(g, 2, 16 * 1024, &bp, err, sizeof err), PT_OK);
    int32_t s = -1, h = -1;
    pt_bufpool_stats stt;
    pt_bufpool_stats_get(bp, &stt);
    assert_int_equal(stt.leased_slots, 0);
    assert_true(stt.bytes_held == 2 * 16 * 1024);
    assert_int_equal(pt_bufpool_acquire(bp, 3, &s, &h, NULL, 0), PT_OK);
    pt_bufpool_release(bp, s, NULL, 0);
    pt_bufpool_destroy(bp);
    assert_int_equal(pt_gpu_live_allocs(g), 0);
    pt_gpu_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_backward_reuse),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_untagged_first),
        cmocka_unit_test(test_leases_and_all_leased),
        cmocka_unit_test(test_bad_args_and_accessors),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_device_accounting),
        cmocka_unit_test(test_device_oom),
    };
    return cmocka_run_group_tests_name("buffer_pool", tests, NULL, NULL);
}
