/*
 * test_gpu_device.c — the device wrapper (gpu/device.c) on the host backend:
 * capacity and OOM sentences, exact accounting, fragmentation, poison, checked
 * frees, pinned budget, failure injection, backend selection, thread safety;
 * and the version checks on a cuda backend library, against the fake backend
 * libraries built from tests/plugins/fakebk_*.c into $PT_BUILD/tests/plugins.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "device_ext.h"
#include "gpu.h"
#include "kernels_hd.h"
#include "protrain.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

/* The charge for a request, derived here from the documented rule (256-byte
 * multiples, 0 -> 256) rather than from the code under test. */
static uint64_t charge(uint64_t n) { return n == 0 ? 256 : (n + 255) / 256 * 256; }

static pt_gpu *open_dev(uint64_t cap, int poison, uint64_t pinned_budget, int fail_at) {
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    c.capacity = cap;
    c.poison = poison;
    c.pinned_budget = pinned_budget;
    c.fail_alloc_at = fail_at;
    pt_gpu *g = NULL;
    char err[512] = "";
    int rc = pt_gpu_open("host", &c, &g, err, sizeof err);
    if (rc != PT_OK) fprintf(stderr, "open failed: %s\n", err);
    assert_int_equal(rc, PT_OK);
    assert_non_null(g);
    return g;
}

static void close_dev(pt_gpu *g) {
    assert_int_equal(pt_gpu_live_allocs(g), 0);
    pt_gpu_close(g);
}

static char num[32];
static const char *u64s(uint64_t v) {
    snprintf(num, sizeof num, "%llu", (unsigned long long)v);
    return num;
}

static void test_oom_changes_nothing(void **state) {
    (void)state;
    pt_gpu *g = open_dev(8 * MiB, 0, 0, 0);
    void *a = NULL, *b = (void *)1;
    char err[512] = "";
    assert_int_equal(pt_gpu_alloc(g, 4 * MiB, PT_TAG_ACT, &a, err, sizeof err), PT_OK);
    pt_gpu_usage before, after;
    pt_gpu_usage_get(g, &before);
    assert_int_equal(before.capacity, 8 * MiB);
    assert_int_equal(pt_gpu_alloc(g, 4 * MiB + 1, PT_TAG_ACT, &b, err, sizeof err), PT_ERR_OOM);
    assert_null(b);
    pt_gpu_usage_get(g, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_non_null(strstr(err, "device out of memory"));
    assert_non_null(strstr(err, "tag act"));
    assert_non_null(strstr(err, u64s(4 * MiB + 1)));      /* bytes needed */
    assert_non_null(strstr(err, u64s(4 * MiB)));          /* free */
    assert_non_null(strstr(err, u64s(8 * MiB)));          /* capacity */
    /* a request past the whole capacity fails the same way */
    assert_int_equal(pt_gpu_alloc(g, 9 * MiB, PT_TAG_PARAM, &b, err, sizeof err), PT_ERR_OOM);
    pt_gpu_usage_get(g, &after);
    assert_memory_equal(&before, &after, sizeof before);
    /* the last failure is kept for the error explanation; a try_alloc that
     * does not fit fails the same way but leaves that record as it was */
    uint64_t tags[PT_TAG_COUNT];
    assert_int_equal(pt_gpu_last_oom(g, tags), 4 * MiB + 9 * MiB);
    assert_int_equal(pt_gpu_try_alloc(g, 6 * MiB, PT_TAG_OTHER, &b, err, sizeof err), PT_ERR_OOM);
    assert_null(b);
    assert_int_equal(pt_gpu_last_oom(g, tags), 4 * MiB + 9 * MiB);
    pt_gpu_oom_reset(g);
    assert_int_equal(pt_gpu_try_alloc(g, 6 * MiB, PT_TAG_OTHER, &b, err, sizeof err), PT_ERR_OOM);
    assert_int_equal(pt_gpu_last_oom(g, tags), 0);
    /* exactly the remaining bytes still fit */
    assert_int_equal(pt_gpu_alloc(g, 4 * MiB, PT_TAG_ACT, &b, err, sizeof err), PT_OK);
    pt_gpu_free(g, a);
    pt_gpu_free(g, b);
    close_dev(g);
}

static void test_peak_accounting(void **state) {
    (void)state;
    pt_gpu *g = open_dev(64 * MiB, 0, 0, 0);
    const uint64_t sa = 3 * MiB + 17, sb = 2 * MiB + 1000, sc = 5 * MiB + 3;
    void *a, *b, *c, *d;
    assert_int_equal(pt_gpu_alloc(g, sa, PT_TAG_PARAM, &a, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_alloc(g, sb, PT_TAG_GRAD, &b, NULL, 0), PT_OK);
    pt_gpu_free(g, a);
    assert_int_equal(pt_gpu_alloc(g, sc, PT_TAG_PARAM, &c, NULL, 0), PT_OK);
    pt_gpu_usage u;
    pt_gpu_usage_get(g, &u);
    uint64_t ab = charge(sa) + charge(sb), bc = charge(sb) + charge(sc);
    assert_int_equal(u.current, bc);
    assert_int_equal(u.peak, ab > bc ? ab : bc);
    assert_int_equal(u.tag_current[PT_TAG_PARAM], charge(sc));
    assert_int_equal(u.tag_peak[PT_TAG_PARAM], charge(sa) > charge(sc) ? charge(sa) : charge(sc));
    assert_int_equal(u.tag_peak[PT_TAG_GRAD], charge(sb));
    assert_int_equal(u.tag_peak[PT_TAG_ACT], 0);
    assert_int_equal(u.n_allocs, 3);
    assert_int_equal(pt_gpu_alloc_size(g, b), sb);
    assert_int_equal(pt_gpu_alloc_size(g, (char *)b + 256), 0); /* interior pointer */
    assert_int_equal(pt_gpu_alloc_size(g, a), 0);               /* freed */

    pt_gpu_reset_peak(g);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.peak, bc);
    assert_int_equal(u.tag_peak[PT_TAG_PARAM], charge(sc));
    /* zero-byte requests get distinct 256-byte blocks */
    assert_int_equal(pt_gpu_alloc(g, 0, PT_TAG_OTHER, &a, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_alloc(g, 0, PT_TAG_OTHER, &d, NULL, 0), PT_OK);
    assert_ptr_not_equal(a, d);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.tag_current[PT_TAG_OTHER], 2 * charge(0));
    assert_int_equal(u.peak, bc + 2 * charge(0));
    pt_gpu_free(g, a);
    pt_gpu_free(g, d);
    pt_gpu_free(g, b);
    pt_gpu_free(g, c);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.current, 0);
    for (int t = 0; t < PT_TAG_COUNT; t++) assert_int_equal(u.tag_current[t], 0);
    close_dev(g);
}

static void test_fragmentation(void **state) {
    (void)state;
    const uint64_t cap = 1 * MiB, piece = 64 * KiB;
    pt_gpu *g = open_dev(cap, 0, 0, 0);
    void *p[16];
    for (int i = 0; i < 16; i++) {
        assert_int_equal(pt_gpu_alloc(g, piece, PT_TAG_BUFFER, &p[i], NULL, 0), PT_OK);
        assert_int_equal((uintptr_t)(p[i] - p[0]) % 256, 0);   /* 256-byte blocks */
        assert_int_equal((uintptr_t)p[i] % 64, 0);
    }
    assert_int_equal(pt_gpu_largest_free(g), 0);
    for (int i = 0; i < 16; i += 2) pt_gpu_free(g, p[i]);
    /* 512 KiB free in eight separate 64 KiB holes */
    assert_int_equal(pt_gpu_free_extents(g), 8);
    assert_int_equal(pt_gpu_largest_free(g), piece);
    char err[512] = "";
    void *big = NULL;
    pt_gpu_usage before, after;
    pt_gpu_usage_get(g, &before);
    assert_int_equal(pt_gpu_alloc(g, 2 * piece, PT_TAG_ACT, &big, err, sizeof err), PT_ERR_OOM);
    pt_gpu_usage_get(g, &after);
    assert_memory_equal(&before, &after, sizeof before);
    char want[64];
    snprintf(want, sizeof want, "largest free block %llu", (unsigned long long)piece);
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(err, u64s(cap / 2))); /* total free would suffice */
    /* a hole is reused exactly (best fit) */
    assert_int_equal(pt_gpu_alloc(g, piece, PT_TAG_ACT, &big, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_free_extents(g), 7);
    pt_gpu_free(g, big);
    /* freeing the rest coalesces everything back into one extent */
    for (int i = 1; i < 16; i += 2) pt_gpu_free(g, p[i]);
    assert_int_equal(pt_gpu_free_extents(g), 1);
    assert_int_equal(pt_gpu_largest_free(g), cap);
    assert_int_equal(pt_gpu_alloc(g, cap, PT_TAG_ACT, &big, NULL, 0), PT_OK);
    pt_gpu_free(g, big);
    close_dev(g);
}

static void test_poison_on_free(void **state) {
    (void)state;
    pt_gpu *g = open_dev(4 * MiB, 1, 0, 0);
    enum { N = 1000 };
    float *x = NULL;
    assert_int_equal(pt_gpu_alloc(g, N * sizeof(float), PT_TAG_PARAM, (void **)&x, NULL, 0), PT_OK);
    for (int i = 0; i < N; i++) x[i] = (float)i;
    pt_gpu_free(g, x);
    /* the stale pointer still lies inside the reservation: it reads NaN */
    const unsigned char *bytes = (const unsigned char *)x;
    for (size_t i = 0; i < charge(N * sizeof(float)); i++) assert_int_equal(bytes[i], 0xFF);
    for (int i = 0; i < N; i++) assert_true(isnan(x[i]));
    const uint16_t *h = (const uint16_t *)x;
    assert_true(isnan(pt_bf16_to_f32(h[0])));
    assert_true(isnan(pt_f16_to_f32(h[1])));
    close_dev(g);

    /* without poison the bytes are left alone */
    g = open_dev(4 * MiB, 0, 0, 0);
    assert_int_equal(pt_gpu_alloc(g, N * sizeof(float), PT_TAG_PARAM, (void **)&x, NULL, 0), PT_OK);
    for (int i = 0; i < N; i++) x[i] = (float)i;
    pt_gpu_free(g, x);
    assert_true(x[7] == 7.0f);
    close_dev(g);
}

/* A reader queued on a stream, held back until the test releases it. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
    const float *x;
    float seen;
} gate;
static void gate_wait(void *arg) {
    gate *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->open) pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}
static void gate_read(void *arg) {
    gate *t = arg;
    t->seen = t->x[7];
}
static void gate_open(gate *t) {
    pthread_mutex_lock(&t->mu);
    t->open = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Stream-ordered free: the bytes return to the allocator at once (accounting
 * exact), but the NaN fill lands after the work already queued on the stream,
 * so a queued reader still sees the data. Negative control: the plain free
 * poisons under the queued reader. */
static void test_free_on_stream(void **state) {
    (void)state;
    for (int ordered = 1; ordered >= 0; ordered--) {
        pt_gpu *g = open_dev(4 * MiB, 1, 0, 0);
        const pt_gpu_backend *o = pt_gpu_ops(g);
        void *impl = pt_gpu_impl(g);
        pt_stream *s = NULL;
        assert_int_equal(o->stream_create(impl, &s), PT_OK);
        float *x = NULL;
        assert_int_equal(pt_gpu_alloc(g, 1000 * sizeof(float), PT_TAG_ACT, (void **)&x, NULL, 0),
                         PT_OK);
        for (int i = 0; i < 1000; i++) x[i] = (float)i;
        gate t = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, x, 0.0f};
        assert_int_equal(o->host_fn(impl, s, gate_wait, &t), PT_OK);
        assert_int_equal(o->host_fn(impl, s, gate_read, &t), PT_OK);
        pt_gpu_usage u;
        pt_gpu_usage_get(g, &u);
        uint64_t before = u.current;
        if (ordered) assert_int_equal(pt_gpu_free_on_stream(g, x, s, NULL, 0), PT_OK);
        else pt_gpu_free(g, x);
        pt_gpu_usage_get(g, &u);
        assert_true(u.current < before);     /* free for the allocator now */
        gate_open(&t);
        assert_int_equal(o->stream_sync(impl, s), PT_OK);
        if (ordered) {
            assert_true(t.seen == 7.0f);      /* the reader ran before the fill */
            assert_true(isnan(x[7]));         /* and the fill came after it */
        } else {
            assert_true(isnan(t.seen));       /* poisoned under the queued reader */
        }
        o->stream_destroy(impl, s);
        close_dev(g);
    }
}

/* A host's native compute stream is taken only by a backend that has native
 * streams; the simulated device refuses it with a sentence saying what to do. */
static void test_adopt_stream(void **state) {
    (void)state;
    pt_gpu *g = open_dev(4 * MiB, 1, 0, 0);
    pt_stream *s = NULL;
    char err[256] = "";
    int dummy = 0;
    assert_int_equal(pt_gpu_adopt_stream(g, &dummy, &s, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_null(s);
    assert_non_null(strstr(err, "no native streams"));
    assert_int_equal(pt_gpu_adopt_stream(g, NULL, &s, err, sizeof err), PT_ERR_INVALID_ARG);
    close_dev(g);
}

static void test_checked_free(void **state) {
    (void)state;
    pt_gpu *g = open_dev(4 * MiB, 1, 0, 0);
    void *a;
    char err[512] = "";
    assert_int_equal(pt_gpu_alloc(g, 1000, PT_TAG_HOSTUSE, &a, NULL, 0), PT_OK);
    pt_gpu_usage before, after;
    pt_gpu_usage_get(g, &before);
    int local = 0;
    assert_int_equal(pt_gpu_free_checked(g, &local, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "not a live device allocation"));
    err[0] = 0;
    assert_int_equal(pt_gpu_free_checked(g, (char *)a + 256, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_true(err[0] != 0);
    pt_gpu_free(g, &local); /* unchecked: silent no-op */
    pt_gpu_usage_get(g, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(pt_gpu_free_checked(g, NULL, err, sizeof err), PT_OK);
    assert_int_equal(pt_gpu_free_checked(g, a, err, sizeof err), PT_OK);
    assert_int_equal(pt_gpu_free_checked(g, a, err, sizeof err), PT_ERR_INVALID_ARG); /* twice */
    pt_gpu_usage_get(g, &after);
    assert_int_equal(after.current, 0);
    assert_int_equal(pt_gpu_alloc(g, 1, -1, &a, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_gpu_alloc(g, 1, PT_TAG_COUNT, &a, err, sizeof err), PT_ERR_INVALID_ARG);
    close_dev(g);
}

/* The host's access checks (dev_access.c): a copy's device range must lie,
 * whole, in one block the host may use, and only the host's blocks can be
 * freed through pt_gpu_free_host. */
static void test_host_range(void **state) {
    (void)state;
    pt_gpu *g = open_dev(4 * MiB, 1, 0, 0);
    void *h, *next, *prm, *opt;
    char why[320] = "";
    assert_int_equal(pt_gpu_alloc_host(g, 4096, PT_TAG_HOSTUSE, &h, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_alloc_host(g, 4096, PT_TAG_HOSTUSE, &next, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_alloc(g, 1000, PT_TAG_PARAM, &prm, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_alloc(g, 1000, PT_TAG_OPTIM, &opt, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_host_range(g, h, 4096, why, sizeof why), 1);
    assert_int_equal(pt_gpu_host_range(g, (char *)h + 4000, 96, why, sizeof why), 1);
    /* one byte past the requested size: refused, and says how many fit */
    assert_int_equal(pt_gpu_host_range(g, (char *)h + 4000, 97, why, sizeof why), 0);
    assert_non_null(strstr(why, "runs past the end"));
    assert_non_null(strstr(why, "so 96 bytes fit"));
    /* 1 MiB from the start of a 4 KiB block: lies in the reservation, refused */
    assert_int_equal(pt_gpu_host_range(g, h, MiB, why, sizeof why), 0);
    assert_non_null(strstr(why, "4096 bytes"));
    /* rounding slack (1000 requested, 1024 carved) is not the host's */
    assert_int_equal(pt_gpu_host_range(g, prm, 1000, why, sizeof why), 1);
    assert_int_equal(pt_gpu_host_range(g, prm, 1001, why, sizeof why), 0);
    assert_int_equal(pt_gpu_host_range(g, opt, 4, why, sizeof why), 0);
    assert_non_null(strstr(why, "optimizer state"));
    int local = 0;
    assert_int_equal(pt_gpu_host_range(g, &local, 4, why, sizeof why), 0);
    assert_non_null(strstr(why, "not device memory"));
    /* a freed block is no longer the host's to copy into */
    assert_int_equal(pt_gpu_free_host(g, next, NULL, why, sizeof why), PT_OK);
    assert_int_equal(pt_gpu_host_range(g, next, 4, why, sizeof why), 0);
    /* only the host's own blocks, by their start, go through pt_gpu_free_host */
    pt_gpu_usage before, after;
    pt_gpu_usage_get(g, &before);
    assert_int_equal(pt_gpu_free_host(g, prm, NULL, why, sizeof why), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(why, "parameter storage"));
    assert_int_equal(pt_gpu_free_host(g, (char *)h + 256, NULL, why, sizeof why),
                     PT_ERR_INVALID_ARG);
    assert_non_null(strstr(why, "256 bytes into a dev_alloc block"));
    pt_gpu_usage_get(g, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(pt_gpu_free_host(g, h, NULL, why, sizeof why), PT_OK);
    assert_int_equal(pt_gpu_free_checked(g, prm, why, sizeof why), PT_OK);
    assert_int_equal(pt_gpu_free_checked(g, opt, why, sizeof why), PT_OK);
    close_dev(g);
}

/* Measuring (the plugin's setup on a device too small): a recorded allocation
 * past the capacity lands in the overflow range and is usable like any other
 * (range checks, frees); a caller's optional buffer does not, nor a host request
 * larger than the whole capacity (a host may rely on that refusal); the size returned
 * is the highest end offset with the overflow counted right after the capacity. */
static void test_measure_overflow(void **state) {
    (void)state;
    pt_gpu *g = open_dev(1 * MiB, 1, 0, 0);
    char why[320] = "";
    void *a, *b, *c = NULL;
    assert_int_equal(pt_gpu_measure_end(g), 0);   /* never begun: nothing measured */
    assert_int_equal(pt_gpu_measure_begin(g), 1); /* the simulated device can */
    assert_int_equal(pt_gpu_measuring(g), 1);
    assert_int_equal(pt_gpu_alloc_host(g, 768 * 1024, PT_TAG_ACT, &a, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_try_alloc(g, 768 * 1024, PT_TAG_SCRATCH, &c, NULL, 0), PT_ERR_OOM);
    assert_null(c);
    /* a host request larger than the whole device: refused as always, naming
     * the size it needs at least */
    assert_int_equal(pt_gpu_alloc_host(g, 2 * MiB, PT_TAG_ACT, &c, why, sizeof why), PT_ERR_OOM);
    assert_null(c);
    assert_non_null(strstr(why, "more than the whole capacity"));
    assert_non_null(strstr(why, "needs at least 2883584 bytes"));   /* 768 KiB + 2 MiB */
    assert_int_equal(pt_gpu_alloc_host(g, 768 * 1024, PT_TAG_ACT, &b, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_in_device(g, b, 768 * 1024), 1);
    assert_int_equal(pt_gpu_host_range(g, b, 768 * 1024, why, sizeof why), 1);
    assert_int_equal(pt_gpu_host_range(g, b, 768 * 1024 + 1, why, sizeof why), 0);
    memset(b, 1, 768 * 1024);
    pt_gpu_usage u;
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.current, 2 * 768 * 1024);
    assert_int_equal(pt_gpu_measure_end(g), 1 * MiB + 768 * 1024);
    assert_int_equal(pt_gpu_measuring(g), 0);
    /* measuring over: past the capacity fails again; the overflow block frees */
    assert_int_equal(pt_gpu_alloc(g, 768 * 1024, PT_TAG_ACT, &c, NULL, 0), PT_ERR_OOM);
    assert_int_equal(pt_gpu_free_host(g, b, NULL, why, sizeof why), PT_OK);
    assert_int_equal(pt_gpu_free_host(g, a, NULL, why, sizeof why), PT_OK);
    close_dev(g);
}

static void test_pinned_budget(void **state) {
    (void)state;
    const uint64_t budget = 1 * MiB;
    pt_gpu *g = open_dev(4 * MiB, 0, budget, 0);
    void *a, *b = (void *)1;
    char err[512] = "";
    assert_int_equal(pt_gpu_pinned_alloc(g, 600 * KiB, &a, err, sizeof err), PT_OK);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 3, 600 * KiB);
    pt_gpu_usage before, after;
    pt_gpu_usage_get(g, &before);
    assert_int_equal(before.pinned_current, 600 * KiB);
    assert_int_equal(before.pinned_budget, budget);
    assert_int_equal(pt_gpu_pinned_alloc(g, 600 * KiB, &b, err, sizeof err), PT_ERR_HOST_OOM);
    assert_null(b);
    pt_gpu_usage_get(g, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_non_null(strstr(err, u64s(600 * KiB)));
    assert_non_null(strstr(err, u64s(budget)));
    assert_non_null(strstr(err, "budget"));
    /* exactly the rest fits (exact sizes, no rounding) */
    assert_int_equal(pt_gpu_pinned_alloc(g, budget - 600 * KiB, &b, err, sizeof err), PT_OK);
    assert_int_equal(pt_gpu_live_pinned(g), 2);
    pt_gpu_pinned_free(g, a);
    pt_gpu_pinned_free(g, (void *)&before); /* unknown: ignored */
    pt_gpu_usage_get(g, &after);
    assert_int_equal(after.pinned_current, budget - 600 * KiB);
    assert_int_equal(after.pinned_peak, budget);
    pt_gpu_pinned_free(g, b);
    assert_int_equal(pt_gpu_live_pinned(g), 0);
    close_dev(g);
}

/* The pinned arena: allocations are carved from one reservation (no own
 * backend allocation), frees return blocks to it, what does not fit gets its
 * own allocation and is counted, and the arena is replaced only while empty. */
static void test_pinned_arena(void **state) {
    (void)state;
    pt_gpu *g = open_dev(4 * MiB, 0, 2 * MiB, 0);
    char err[512] = "";
    pt_gpu_usage u;
    assert_int_equal(pt_gpu_pinned_reserve(g, 3 * MiB, err, sizeof err), PT_ERR_HOST_OOM);
    assert_non_null(strstr(err, "budget"));
    assert_int_equal(pt_gpu_pinned_reserve(g, 1 * MiB, err, sizeof err), PT_OK);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.pinned_arena, 1 * MiB);
    assert_int_equal(u.pinned_current, 0);   /* reserved is not in use */
    uint8_t *p[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pt_gpu_pinned_alloc(g, 200 * KiB + 1, (void **)&p[i], err, sizeof err), PT_OK);
        assert_int_equal((uintptr_t)(p[i] - p[0]) % 256, 0);   /* 256-byte blocks */
        assert_int_equal((uintptr_t)p[i] % 64, 0);
        memset(p[i], i + 1, 200 * KiB + 1);
    }
    for (int i = 1; i < 4; i++) assert_true(p[i] >= p[0] + i * (200 * KiB + 1));   /* disjoint */
    assert_true(p[3] + 200 * KiB + 1 <= p[0] + 1 * MiB);                             /* inside */
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.pinned_own_allocs, 0);
    assert_int_equal(u.pinned_current, 4 * (200 * KiB + 1));
    /* 300 KiB no longer fits the arena: its own allocation, counted */
    void *big = NULL;
    assert_int_equal(pt_gpu_pinned_alloc(g, 300 * KiB, &big, err, sizeof err), PT_OK);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.pinned_own_allocs, 1);
    assert_int_equal(pt_gpu_live_pinned(g), 5);
    /* replacing the arena while blocks live is refused, nothing changes */
    assert_int_equal(pt_gpu_pinned_reserve(g, 2 * MiB, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "live"));
    /* a freed block is reused in place (best fit, lowest address) */
    pt_gpu_pinned_free(g, p[1]);
    uint8_t *again = NULL;
    assert_int_equal(pt_gpu_pinned_alloc(g, 100 * KiB, (void **)&again, err, sizeof err), PT_OK);
    assert_ptr_equal(again, p[1]);
    for (size_t k = 0; k < 200 * KiB + 1; k++) assert_int_equal(p[2][k], 3);  /* neighbours intact */
    pt_gpu_pinned_free(g, again);
    for (int i = 0; i < 4; i++) if (i != 1) pt_gpu_pinned_free(g, p[i]);
    pt_gpu_pinned_free(g, big);
    assert_int_equal(pt_gpu_live_pinned(g), 0);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.pinned_current, 0);
    /* empty again: it can be replaced, and 0 drops it */
    assert_int_equal(pt_gpu_pinned_reserve(g, 2 * MiB, err, sizeof err), PT_OK);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.pinned_arena, 2 * MiB);
    assert_int_equal(pt_gpu_pinned_reserve(g, 0, err, sizeof err), PT_OK);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.pinned_arena, 0);
    /* an arena left with a live block at close is reported and freed */
    assert_int_equal(pt_gpu_pinned_reserve(g, 64 * KiB, err, sizeof err), PT_OK);
    void *left = NULL;
    assert_int_equal(pt_gpu_pinned_alloc(g, 1000, &left, err, sizeof err), PT_OK);
    assert_int_equal(pt_gpu_live_pinned(g), 1);
    pt_gpu_pinned_free(g, left);
    close_dev(g);
}

static void test_failure_injection(void **state) {
    (void)state;
    pt_gpu *g = open_dev(4 * MiB, 0, 0, 3);
    void *p[5] = {0};
    char err[512] = "";
    assert_int_equal(pt_gpu_alloc(g, 100, PT_TAG_ACT, &p[0], err, sizeof err), PT_OK);
    assert_int_equal(pt_gpu_alloc(g, 100, PT_TAG_ACT, &p[1], err, sizeof err), PT_OK);
    pt_gpu_usage before, after;
    pt_gpu_usage_get(g, &before);
    assert_int_equal(pt_gpu_alloc(g, 100, PT_TAG_ACT, &p[2], err, sizeof err), PT_ERR_OOM);
    assert_null(p[2]);
    assert_non_null(strstr(err, "injected"));
    pt_gpu_usage_get(g, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(pt_gpu_alloc(g, 100, PT_TAG_ACT, &p[3], err, sizeof err), PT_OK);
    assert_int_equal(pt_gpu_alloc(g, 100, PT_TAG_ACT, &p[4], err, sizeof err), PT_OK);
    for (int i = 0; i < 5; i++) pt_gpu_free(g, p[i]);
    close_dev(g);
}

static void test_backend_selection(void **state) {
    (void)state;
    pt_gpu *g = NULL;
    char err[768] = "";
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    c.capacity = 2 * MiB;
    assert_int_equal(pt_gpu_open("tpu", &c, &g, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_null(g);
    assert_non_null(strstr(err, "tpu"));

    /* Whether a cuda backend can open here: only when its library loads and a GPU
     * answers. The test asserts what must follow in either case; on a GPU
     * machine (make test-gpu sets PT_TEST_REQUIRE_CUDA=1) it must open, or this
     * test would pass without having touched the device. */
    int rc = pt_gpu_open("cuda", &c, &g, err, sizeof err);
    const char *req = getenv("PT_TEST_REQUIRE_CUDA");
    if (rc != PT_OK && req && !strcmp(req, "1"))
        fail_msg("PT_TEST_REQUIRE_CUDA=1 but the cuda backend did not open: %s", err);
    if (rc == PT_OK) {
        assert_string_equal(pt_gpu_backend_name(g), "cuda");
        pt_gpu_close(g);
        g = NULL;
    } else {
        assert_int_equal(rc, PT_ERR_BACKEND);
        assert_null(g);
        assert_true(strlen(err) > 20);
        assert_non_null(strstr(err, "cuda"));
        void *dl = dlopen(PT_CUDA_BACKEND_LIB, RTLD_NOW | RTLD_LOCAL);
        char beside[4096];
        ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - 64);
        int have_beside = 0;
        if (n > 0) {
            beside[n] = 0;
            char *slash = strrchr(beside, '/');
            if (slash) {
                strcpy(slash + 1, PT_CUDA_BACKEND_LIB);
                have_beside = access(beside, F_OK) == 0;
            }
        }
        if (dl) dlclose(dl);
        if (!dl && !have_beside) assert_non_null(strstr(err, "not found"));
        /* auto falls back to host silently */
        err[0] = 0;
        assert_int_equal(pt_gpu_open("auto", &c, &g, err, sizeof err), PT_OK);
        assert_string_equal(pt_gpu_backend_name(g), "host");
        pt_gpu_close(g);
    }
    assert_int_equal(pt_gpu_open(NULL, &c, &g, err, sizeof err), PT_OK); /* NULL = auto */
    pt_gpu_close(g);

    /* host: name, default capacity */
    assert_int_equal(pt_gpu_open("host", NULL, &g, err, sizeof err), PT_OK);
    char name[128];
    pt_gpu_device_name(g, name, sizeof name);
    assert_non_null(strstr(name, "simulated"));
    pt_gpu_usage u;
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.capacity, 1ull << 30);
    pt_gpu_close(g);
    c.fail_alloc_at = -1;
    assert_int_equal(pt_gpu_open("host", &c, &g, err, sizeof err), PT_ERR_INVALID_ARG);
}

static void test_tags(void **state) {
    (void)state;
    for (int t = 0; t < PT_TAG_COUNT; t++) assert_int_equal(pt_mem_tag_parse(pt_mem_tag_name(t)), t);
    assert_int_equal(pt_mem_tag_parse("ACT"), PT_TAG_ACT);
    assert_int_equal(pt_mem_tag_parse("scratch"), PT_TAG_SCRATCH);
    assert_int_equal(pt_mem_tag_parse("input"), PT_TAG_HOSTUSE);
    assert_int_equal(pt_mem_tag_parse(NULL), PT_TAG_HOSTUSE);
    assert_string_equal(pt_mem_tag_name(99), "invalid");
}

static void test_copies_counted(void **state) {
    (void)state;
    pt_gpu *g = open_dev(4 * MiB, 0, 0, 0);
    char host[3000], back[3000];
    for (size_t i = 0; i < sizeof host; i++) host[i] = (char)(i * 31);
    void *d, *d2;
    assert_int_equal(pt_gpu_alloc(g, sizeof host, PT_TAG_HOSTUSE, &d, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_alloc(g, sizeof host, PT_TAG_HOSTUSE, &d2, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_memcpy(g, d, host, sizeof host, PT_GPU_H2D), PT_OK);
    assert_int_equal(pt_gpu_memcpy(g, d2, d, sizeof host, PT_GPU_D2D), PT_OK);
    const pt_gpu_backend *ops = pt_gpu_ops(g);
    pt_stream *s;
    assert_int_equal(ops->stream_create(pt_gpu_impl(g), &s), PT_OK);
    assert_int_equal(pt_gpu_memcpy_async(g, back, d2, 1000, PT_GPU_D2H, s), PT_OK);
    assert_int_equal(pt_gpu_memcpy_async(g, back + 1000, (char *)d2 + 1000, 2000, PT_GPU_D2H, s),
                     PT_OK);
    assert_int_equal(ops->stream_sync(pt_gpu_impl(g), s), PT_OK);
    ops->stream_destroy(pt_gpu_impl(g), s);
    assert_memory_equal(back, host, sizeof host);
    pt_gpu_usage u;
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.h2d_bytes, sizeof host);
    assert_int_equal(u.d2h_bytes, sizeof host);
    assert_int_equal(pt_gpu_memcpy(g, d, host, 10, 42), PT_ERR_INVALID_ARG);
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.h2d_bytes, sizeof host); /* a refused copy is not counted */
    pt_gpu_free(g, d);
    pt_gpu_free(g, d2);
    close_dev(g);
}

/* ---- randomized allocator invariants ---- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct live { unsigned char *p; uint64_t n; unsigned char fill; } live;

static int cmp_live(const void *a, const void *b) {
    const live *x = a, *y = b;
    return x->p < y->p ? -1 : x->p > y->p;
}

static void test_random_invariants(void **state) {
    (void)state;
    const uint64_t cap = 8 * MiB;
    pt_gpu *g = open_dev(cap, 0, 0, 0);
    enum { MAXL = 200 };
    live L[MAXL];
    int nl = 0;
    for (int it = 0; it < 4000; it++) {
        if (nl < MAXL && (nl == 0 || rnd() % 100 < 55)) {
            uint64_t n = rnd() % 100 < 10 ? rnd() % (512 * KiB) : rnd() % (16 * KiB);
            void *p = NULL;
            int rc = pt_gpu_alloc(g, n, (int)(rnd() % PT_TAG_COUNT), &p, NULL, 0);
            if (rc == PT_ERR_OOM) continue;
            assert_int_equal(rc, PT_OK);
            assert_int_equal((uintptr_t)p % 256, 0);
            L[nl].p = p;
            L[nl].n = n;
            L[nl].fill = (unsigned char)(it & 0xFF);
            memset(p, L[nl].fill, n);
            nl++;
        } else {
            int k = (int)(rnd() % (uint64_t)nl);
            /* contents intact: no other block overlapped this one */
            for (uint64_t i = 0; i < L[k].n; i += 97) assert_int_equal(L[k].p[i], L[k].fill);
            pt_gpu_free(g, L[k].p);
            L[k] = L[--nl];
        }
        if (it % 500 == 0 || it == 3999) {
            qsort(L, (size_t)nl, sizeof L[0], cmp_live);
            uint64_t sum = 0;
            for (int i = 0; i < nl; i++) {
                sum += charge(L[i].n);
                if (i) assert_true(L[i - 1].p + charge(L[i - 1].n) <= L[i].p);
                assert_int_equal(pt_gpu_alloc_size(g, L[i].p), L[i].n);
            }
            pt_gpu_usage u;
            pt_gpu_usage_get(g, &u);
            assert_int_equal(u.current, sum);
            assert_true(u.peak >= u.current && u.peak <= cap);
            assert_int_equal(pt_gpu_live_allocs(g), (size_t)nl);
            assert_true(pt_gpu_largest_free(g) <= cap - sum);
        }
    }
    for (int i = 0; i < nl; i++) pt_gpu_free(g, L[i].p);
    assert_int_equal(pt_gpu_free_extents(g), 1);
    assert_int_equal(pt_gpu_largest_free(g), cap);
    close_dev(g);
}

/* ---- concurrency (run under TSan) ---- */

typedef struct worker_arg { pt_gpu *g; int seed; int failures; } worker_arg;

static void *alloc_worker(void *arg) {
    worker_arg *w = arg;
    void *mine[32] = {0};
    uint32_t s = (uint32_t)w->seed * 2654435761u + 1u;
    for (int it = 0; it < 2000; it++) {
        s = s * 1664525u + 1013904223u;
        int k = (int)((s >> 8) % 32);
        if (mine[k]) {
            if (pt_gpu_free_checked(w->g, mine[k], NULL, 0) != PT_OK) w->failures++;
            mine[k] = NULL;
        } else if (pt_gpu_alloc(w->g, (s >> 12) % 8192, PT_TAG_SCRATCH, &mine[k], NULL, 0) != PT_OK) {
            mine[k] = NULL; /* OOM is allowed; the pool is shared */
        } else {
            memset(mine[k], w->seed, 16);
        }
    }
    for (int k = 0; k < 32; k++)
        if (mine[k] && pt_gpu_free_checked(w->g, mine[k], NULL, 0) != PT_OK) w->failures++;
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    pt_gpu *g = open_dev(1 * MiB, 1, 0, 0);
    pthread_t th[3];
    worker_arg wa[3];
    for (int i = 0; i < 3; i++) {
        wa[i] = (worker_arg){g, i + 1, 0};
        assert_int_equal(pthread_create(&th[i], NULL, alloc_worker, &wa[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(wa[i].failures, 0);
    }
    pt_gpu_usage u;
    pt_gpu_usage_get(g, &u);
    assert_int_equal(u.current, 0);
    assert_int_equal(pt_gpu_free_extents(g), 1);
    close_dev(g);
}

/* ---- leak report at close ---- */

typedef struct captured { int calls; char msg[512]; } captured;

static void capture_log(void *user, int32_t level, const char *msg) {
    captured *c = user;
    (void)level;
    c->calls++;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
}

static void test_leak_report(void **state) {
    (void)state;
    pt_gpu *g = open_dev(1 * MiB, 0, 0, 0);
    captured cap = {0, ""};
    pt_gpu_set_log(g, capture_log, &cap);
    void *a, *b;
    assert_int_equal(pt_gpu_alloc(g, 4096, PT_TAG_ACT, &a, NULL, 0), PT_OK);
    assert_int_equal(pt_gpu_alloc(g, 512, PT_TAG_ACT, &b, NULL, 0), PT_OK);
    pt_gpu_free(g, b);
    assert_int_equal(pt_gpu_live_allocs(g), 1);
    pt_gpu_close(g); /* must report, and must not leak host memory itself (ASan) */
    assert_int_equal(cap.calls, 1);
    assert_non_null(strstr(cap.msg, "1 device allocations"));
    assert_non_null(strstr(cap.msg, "4096"));
    assert_non_null(strstr(cap.msg, "act"));
}

/* ---- the cuda backend library: version checks ---- */

static void fake_lib(char *buf, size_t len, const char *name) {
    const char *b = getenv("PT_BUILD");
    if (!b || !b[0]) fail_msg("PT_BUILD is not set (run through `make test`)");
    snprintf(buf, len, "%s/tests/plugins/%s.so", b, name);
    if (access(buf, R_OK) != 0) fail_msg("fake backend %s is missing (build tests/plugins first)", buf);
}

static void assert_contains(const char *hay, const char *needle) {
    if (!strstr(hay, needle)) fail_msg("expected \"%s\" in \"%s\"", needle, hay);
}

static pt_gpu_config small_cfg(void) {
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    c.capacity = 2 * MiB;
    return c;
}

/* The library at `path` is refused by kind "cuda" with PT_ERR_BACKEND and a
 * sentence holding every given substring (NULL-terminated), without the open
 * of a refused table having run; kind "auto" then opens the host backend and
 * keeps that same sentence as the fallback reason. */
static void expect_refused(const char *path, ...) {
    pt_gpu_config c = small_cfg();
    pt_gpu *g = (pt_gpu *)&c; /* must come back NULL */
    char err[1024] = "";
    assert_int_equal(pt_gpu_open_lib("cuda", path, &c, &g, err, sizeof err), PT_ERR_BACKEND);
    assert_null(g);
    va_list ap;
    va_start(ap, path);
    for (const char *n = va_arg(ap, const char *); n; n = va_arg(ap, const char *))
        assert_contains(err, n);
    va_end(ap);
    assert_null(strstr(err, "open was called"));

    char err2[1024] = "";
    assert_int_equal(pt_gpu_open_lib("auto", path, &c, &g, err2, sizeof err2), PT_OK);
    assert_string_equal(pt_gpu_backend_name(g), "host");
    assert_string_equal(pt_gpu_fallback_reason(g), err);
    close_dev(g);
}

static void test_backend_lib_refused(void **state) {
    (void)state;
    char path[PATH_MAX], ours[64], sizes[2][96];
    snprintf(ours, sizeof ours, "this plugin speaks version %u", PT_GPU_BACKEND_VERSION);

    /* the versioned name, but a head saying version 0 */
    fake_lib(path, sizeof path, "fakebk_oldver");
    expect_refused(path, path, "exports " PT_CUDA_BACKEND_SYMBOL, "table says version 0", ours,
                   NULL);

    /* only a later version's symbol */
    fake_lib(path, sizeof path, "fakebk_newver");
    expect_refused(path, path, "too new", PT_CUDA_BACKEND_SYMBOL_STEM "_v2", "version 2", ours,
                   NULL);

    /* only the name from before versions */
    fake_lib(path, sizeof path, "fakebk_unversioned");
    expect_refused(path, path, "too old", "unversioned " PT_CUDA_BACKEND_SYMBOL_STEM, "version 0",
                   ours, NULL);

    /* the right version, but a table shorter than this build's */
    fake_lib(path, sizeof path, "fakebk_small");
    snprintf(sizes[0], sizeof sizes[0], "version %u table is %zu bytes", PT_GPU_BACKEND_VERSION,
             offsetof(pt_gpu_backend, convert));
    snprintf(sizes[1], sizeof sizes[1], "version %u table of %zu bytes", PT_GPU_BACKEND_VERSION,
             sizeof(pt_gpu_backend));
    expect_refused(path, path, sizes[0], sizes[1], NULL);

    /* a shared object with no backend table at all (a test plugin) */
    fake_lib(path, sizeof path, "nosym");
    expect_refused(path, path, "does not export " PT_CUDA_BACKEND_SYMBOL, NULL);

    /* no such file */
    char missing[PATH_MAX + 32];
    snprintf(missing, sizeof missing, "%s.absent.so", path);
    expect_refused(missing, missing, "failed to load", NULL);
}

/* A library that passes every check has its open called; its failure sentence
 * comes through, and auto still falls back to host. */
static void test_backend_lib_open_error(void **state) {
    (void)state;
    char path[PATH_MAX];
    fake_lib(path, sizeof path, "fakebk_openfail");
    expect_refused(path, "fake-openfail backend failed to open",
                   "fakebk_openfail: no device behind this fake", NULL);
}

/* A table longer than this build's, of the same version, is accepted; the
 * backend's failure reports reach the hook set with pt_gpu_set_log after open,
 * and, when the reservation at open fails, the error sentence. */
static void test_backend_lib_accepted(void **state) {
    (void)state;
    char path[PATH_MAX], err[1024] = "";
    fake_lib(path, sizeof path, "fakebk_works");
    pt_gpu_config c = small_cfg();
    const char *kinds[] = {"cuda", "auto"};
    for (int k = 0; k < 2; k++) {
        pt_gpu *g = NULL;
        int rc = pt_gpu_open_lib(kinds[k], path, &c, &g, err, sizeof err);
        if (rc != PT_OK) fail_msg("%s: %s", kinds[k], err);
        assert_string_equal(pt_gpu_backend_name(g), "fake-works");
        assert_string_equal(pt_gpu_fallback_reason(g), "");
        char name[64];
        pt_gpu_device_name(g, name, sizeof name);
        assert_string_equal(name, "fakebk_works");
        void *p = NULL;
        assert_int_equal(pt_gpu_alloc(g, 1000, PT_TAG_ACT, &p, err, sizeof err), PT_OK);

        captured cap = {0, ""};
        pt_gpu_set_log(g, capture_log, &cap);
        assert_int_equal(pt_gpu_ops(g)->memset_async(pt_gpu_impl(g), p, 0, 64, NULL),
                         PT_ERR_BACKEND);
        assert_int_equal(cap.calls, 1);
        assert_string_equal(cap.msg, "fakebk_works: memset_async of 64 bytes refused");
        pt_gpu_free(g, p);
        close_dev(g);
    }
    /* the fake has 4 MiB: a larger reservation fails with the fake's own words */
    c.capacity = 8 * MiB;
    pt_gpu *g = (pt_gpu *)&c;
    assert_int_equal(pt_gpu_open_lib("cuda", path, &c, &g, err, sizeof err), PT_ERR_OOM);
    assert_null(g);
    assert_contains(err, "could not reserve 8388608 bytes");
    assert_contains(err, "fakebk_works: no room for 8388608 bytes");
    /* a capacity below one allocation unit is the configuration's fault, and
     * says so (it read "could not reserve 0 bytes", blaming the device) */
    c.capacity = 1;
    assert_int_equal(pt_gpu_open_lib("cuda", path, &c, &g, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_null(g);
    assert_contains(err, "device_capacity = 1 bytes is less than one 256-byte allocation unit");

    /* the built-in host table carries the same head */
    assert_int_equal(pt_gpu_backend_host.abi_version, PT_GPU_BACKEND_VERSION);
    assert_int_equal(pt_gpu_backend_host.struct_size, sizeof(pt_gpu_backend));

    /* the host backend opened directly has no fallback reason */
    pt_gpu *h = open_dev(1 * MiB, 0, 0, 0);
    assert_string_equal(pt_gpu_fallback_reason(h), "");
    close_dev(h);
}

/* The cuda library of this build passes the version checks: kind "cuda" either
 * opens a GPU or reaches the library's own open, whose sentence comes through. */
static void test_built_cuda_lib_accepted(void **state) {
    (void)state;
    const char *b = getenv("PT_BUILD");
    if (!b || !b[0]) fail_msg("PT_BUILD is not set (run through `make test`)");
    char path[PATH_MAX], err[1024] = "";
    snprintf(path, sizeof path, "%s/%s", b, PT_CUDA_BACKEND_LIB);
    if (access(path, R_OK) != 0) {
        printf("note: %s not built (no nvcc, or a sanitizer build); skipping\n", path);
        skip();
    }
    pt_gpu_config c = small_cfg();
    pt_gpu *g = NULL;
    int rc = pt_gpu_open_lib("cuda", path, &c, &g, err, sizeof err);
    if (rc == PT_OK) {
        assert_string_equal(pt_gpu_backend_name(g), "cuda");
        close_dev(g);
        return;
    }
    assert_int_equal(rc, PT_ERR_BACKEND);
    assert_contains(err, "cuda backend failed to open: ");
    assert_null(strstr(err, "speaks version"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_changes_nothing),
        cmocka_unit_test(test_peak_accounting),
        cmocka_unit_test(test_fragmentation),
        cmocka_unit_test(test_poison_on_free),
        cmocka_unit_test(test_free_on_stream),
        cmocka_unit_test(test_adopt_stream),
        cmocka_unit_test(test_checked_free),
        cmocka_unit_test(test_host_range),
        cmocka_unit_test(test_measure_overflow),
        cmocka_unit_test(test_pinned_budget),
        cmocka_unit_test(test_pinned_arena),
        cmocka_unit_test(test_failure_injection),
        cmocka_unit_test(test_backend_selection),
        cmocka_unit_test(test_tags),
        cmocka_unit_test(test_copies_counted),
        cmocka_unit_test(test_random_invariants),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_leak_report),
        cmocka_unit_test(test_backend_lib_refused),
        cmocka_unit_test(test_backend_lib_open_error),
        cmocka_unit_test(test_backend_lib_accepted),
        cmocka_unit_test(test_built_cuda_lib_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
