/*
 * test_host_backend.c — the simulated GPU (gpu/host/) through its vtable:
 * stream FIFO order, events (CUDA semantics), cross-stream ordering, the copy
 * throttle (the one timed test), the kernels against scalar references, and
 * failure injection of non-allocation ops.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu.h"
#include "kernels_hd.h"
#include "protrain.h"
#include "pt_util.h"

static const pt_gpu_backend *B = &pt_gpu_backend_host;

static void *open_hb(double bw) {
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    c.capacity = 64ull << 20;
    c.copy_bandwidth = bw;
    void *impl = NULL;
    char err[256] = "";
    assert_int_equal(B->open(&c, &impl, err, sizeof err), PT_OK);
    assert_non_null(impl);
    return impl;
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000l};
    while (nanosleep(&t, &t) != 0) {
    }
}

/* ---- helpers run on stream threads ---- */

typedef struct oplog {
    int entries[256];
    int n;                     /* touched only by the one stream thread, read after sync */
} oplog;

typedef struct logent {
    oplog *log;
    int value;
} logent;

static void append_fn(void *arg) {
    logent *e = arg;
    e->log->entries[e->log->n++] = e->value;
}

/* A gate a stream thread blocks on until the test opens it: makes "still
 * pending" states deterministic without timing. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
} gate;

static void gate_init(gate *g) {
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = 0;
}

static void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_fn(void *arg) {
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_destroy(gate *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

/* ---- tests ---- */

static void test_fifo_order(void **state) {
    (void)state;
    void *h = open_hb(0);
    pt_stream *s;
    assert_int_equal(B->stream_create(h, &s), PT_OK);
    oplog log = {.n = 0};
    logent ents[200];
    /* a memcpy chain a -> b -> c -> d interleaved with the log appends: each copy
     * reads what the previous op wrote, so any reordering changes d. */
    enum { N = 4096 };
    unsigned char *buf[4];
    for (int k = 0; k < 4; k++) {
        buf[k] = malloc(N);
        assert_non_null(buf[k]);
        memset(buf[k], 0, N);
    }
    for (int i = 0; i < N; i++) buf[0][i] = (unsigned char)(i * 7 + 3);
    for (int i = 0; i < 200; i++) {
        ents[i].log = &log;
        ents[i].value = i;
        assert_int_equal(B->host_fn(h, s, append_fn, &ents[i]), PT_OK);
        if (i == 50) assert_int_equal(B->memcpy_async(h, buf[1], buf[0], N, PT_GPU_H2D, s), PT_OK);
        if (i == 51) assert_int_equal(B->memset_async(h, buf[0], 0xAB, N, s), PT_OK);
        if (i == 90) assert_int_equal(B->memcpy_async(h, buf[2], buf[1], N, PT_GPU_D2D, s), PT_OK);
        if (i == 120) assert_int_equal(B->memcpy_async(h, buf[3], buf[2], N, PT_GPU_D2H, s), PT_OK);
    }
    assert_int_equal(B->stream_sync(h, s), PT_OK);
    assert_int_equal(log.n, 200);
    for (int i = 0; i < 200; i++) assert_int_equal(log.entries[i], i);
    for (int i = 0; i < N; i++) {
        assert_int_equal(buf[3][i], (unsigned char)(i * 7 + 3)); /* copied before the memset */
        assert_int_equal(buf[0][i], 0xAB);
    }
    B->stream_destroy(h, s);
    for (int k = 0; k < 4; k++) free(buf[k]);
    B->close(h);
}

typedef struct flagpair {
    int flag;                  /* set by stream A */
    int seen;                  /* what stream B read */
} flagpair;

static void slow_set_fn(void *arg) {
    sleep_ms(50);
    ((flagpair *)arg)->flag = 1;
}

static void read_flag_fn(void *arg) {
    flagpair *f = arg;
    f->seen = f->flag + 10;    /* +10: distinguishes "ran, read 0" (10) from "not run" (0) */
}

static void test_event_orders_streams(void **state) {
    (void)state;
    void *h = open_hb(0);
    pt_stream *a, *b;
    pt_event *e;
    assert_int_equal(B->stream_create(h, &a), PT_OK);
    assert_int_equal(B->stream_create(h, &b), PT_OK);
    assert_int_equal(B->event_create(h, &e), PT_OK);
    flagpair f = {0, 0};
    assert_int_equal(B->host_fn(h, a, slow_set_fn, &f), PT_OK);
    assert_int_equal(B->event_record(h, e, a), PT_OK);
    assert_int_equal(B->stream_wait_event(h, b, e), PT_OK);
    assert_int_equal(B->host_fn(h, b, read_flag_fn, &f), PT_OK);
    assert_int_equal(B->stream_sync(h, b), PT_OK);
    assert_int_equal(f.seen, 11);
    assert_int_equal(B->event_query(h, e), 1);
    B->event_destroy(h, e);
    B->stream_destroy(h, a);
    B->stream_destroy(h, b);
    B->close(h);
}

static void set_int_fn(void *arg) { *(int *)arg = 1; }

static void test_event_semantics(void **state) {
    (void)state;
    void *h = open_hb(0);
    pt_stream *a, *b, *c;
    pt_event *e, *never;
    assert_int_equal(B->stream_create(h, &a), PT_OK);
    assert_int_equal(B->stream_create(h, &b), PT_OK);
    assert_int_equal(B->stream_create(h, &c), PT_OK);
    assert_int_equal(B->event_create(h, &e), PT_OK);
    assert_int_equal(B->event_create(h, &never), PT_OK);

    /* never recorded: done, waiting on it is a no-op, elapsed is refused */
    assert_int_equal(B->event_query(h, never), 1);
    assert_int_equal(B->event_sync(h, never), PT_OK);
    assert_int_equal(B->stream_wait_event(h, b, never), PT_OK);
    float ms = -1.0f;
    assert_int_not_equal(B->event_elapsed_ms(h, never, never, &ms), PT_OK);

    gate g;
    gate_init(&g);
    int b_ran = 0;
    assert_int_equal(B->host_fn(h, a, gate_fn, &g), PT_OK);
    assert_int_equal(B->event_record(h, e, a), PT_OK);
    assert_int_equal(B->event_query(h, e), 0);             /* a is blocked on the gate */
    assert_int_not_equal(B->event_elapsed_ms(h, e, e, &ms), PT_OK); /* not ready */
    assert_int_equal(B->stream_wait_event(h, b, e), PT_OK);
    assert_int_equal(B->host_fn(h, b, set_int_fn, &b_ran), PT_OK);
    /* Re-recording on an idle stream must not release b's earlier wait (the wait
     * captured the record on a). */
    assert_int_equal(B->event_record(h, e, c), PT_OK);
    assert_int_equal(B->event_sync(h, e), PT_OK);
    assert_int_equal(B->event_query(h, e), 1);
    sleep_ms(20); /* give a wrong implementation time to run b's host_fn */
    assert_int_equal(b_ran, 0); /* (a wrong implementation also shows up as a TSan race) */
    gate_open(&g);
    assert_int_equal(B->stream_sync(h, b), PT_OK);
    assert_int_equal(b_ran, 1);

    /* elapsed: two records around a 50 ms host function on one stream. A sleep
     * never returns early, so this lower bound is not timing-fragile. */
    pt_event *e2;
    assert_int_equal(B->event_create(h, &e2), PT_OK);
    assert_int_equal(B->event_record(h, e, a), PT_OK);
    int dummy = 0;
    flagpair slow = {0, 0};
    assert_int_equal(B->host_fn(h, a, slow_set_fn, &slow), PT_OK);
    assert_int_equal(B->host_fn(h, a, set_int_fn, &dummy), PT_OK);
    assert_int_equal(B->event_record(h, e2, a), PT_OK);
    assert_int_equal(B->event_sync(h, e2), PT_OK);
    assert_int_equal(B->event_query(h, e), 1);
    assert_int_equal(B->event_elapsed_ms(h, e, e2, &ms), PT_OK);
    assert_true(ms >= 49.9f); /* slow_set_fn sleeps 50 ms */
    assert_int_equal(dummy, 1);
    assert_int_equal(slow.flag, 1);

    /* NULL stream: runs on the caller, its events are complete at once */
    assert_int_equal(B->event_record(h, e2, NULL), PT_OK);
    assert_int_equal(B->event_query(h, e2), 1);

    B->event_destroy(h, e);
    B->event_destroy(h, e2);
    B->event_destroy(h, never);
    B->stream_destroy(h, a);
    B->stream_destroy(h, b);
    B->stream_destroy(h, c);
    gate_destroy(&g);
    B->close(h);
}

static void count_fn(void *arg) { (*(int *)arg)++; }

static void test_destroy_and_close_drain(void **state) {
    (void)state;
    void *h = open_hb(0);
    pt_stream *s, *forgotten;
    int n1 = 0, n2 = 0;
    assert_int_equal(B->stream_create(h, &s), PT_OK);
    assert_int_equal(B->stream_create(h, &forgotten), PT_OK);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(B->host_fn(h, s, count_fn, &n1), PT_OK);
        assert_int_equal(B->host_fn(h, forgotten, count_fn, &n2), PT_OK);
    }
    pt_event *e;
    assert_int_equal(B->event_create(h, &e), PT_OK);
    assert_int_equal(B->event_record(h, e, s), PT_OK);
    B->stream_destroy(h, s); /* drains first */
    assert_int_equal(n1, 100);
    assert_int_equal(B->event_query(h, e), 1); /* its stream is gone; still answerable */
    B->event_destroy(h, e);
    B->close(h); /* joins the stream we never destroyed */
    assert_int_equal(n2, 100);
}

static void test_copy_throttle(void **state) {
    (void)state;
    /* 8 MiB at 40 MB/s = 209.7 ms. Only bounds a loaded machine cannot break
     * are asserted: the throttle's sleeps never end early, so the copy takes at
     * least N / bandwidth (1% for clock granularity); a stall can only make it
     * longer, so the upper bound is gross (10x: a wrong unit, not jitter). The
     * accuracy itself is measured by the benchmarks. */
    const double bw = 40e6;
    const size_t n = 8u << 20;
    const double expect_ms = (double)n / bw * 1e3;
    void *h = open_hb(bw);
    pt_stream *s;
    pt_event *e0, *e1;
    assert_int_equal(B->stream_create(h, &s), PT_OK);
    assert_int_equal(B->event_create(h, &e0), PT_OK);
    assert_int_equal(B->event_create(h, &e1), PT_OK);
    unsigned char *src = malloc(n), *dst = malloc(n);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 13u);
    memset(dst, 0, n);

    double t0 = 1e3 * pt_now_s();
    assert_int_equal(B->event_record(h, e0, s), PT_OK);
    assert_int_equal(B->memcpy_async(h, dst, src, n, PT_GPU_H2D, s), PT_OK);
    assert_int_equal(B->event_record(h, e1, s), PT_OK);
    assert_int_equal(B->event_sync(h, e1), PT_OK);
    double wall = 1e3 * pt_now_s() - t0;
    float ms = 0;
    assert_int_equal(B->event_elapsed_ms(h, e0, e1, &ms), PT_OK);
    assert_memory_equal(dst, src, n);
    if (getenv("PT_TEST_VERBOSE")) fprintf(stderr, "throttle: expect %.2f ms, event %.2f ms, wall %.2f ms\n", expect_ms, ms, wall);
    assert_true(ms >= 0.99 * expect_ms && ms <= 10 * expect_ms);
    assert_true(wall >= 0.99 * expect_ms && wall <= 10 * expect_ms);

    /* Same direction on two streams shares one link: two n/4 H2D copies cannot
     * both finish sooner than (n/2)/bw after they start (a lower bound only: sleeps
     * never end early, so this cannot flake). */
    pt_stream *s2;
    assert_int_equal(B->stream_create(h, &s2), PT_OK);
    t0 = 1e3 * pt_now_s();
    assert_int_equal(B->memcpy_async(h, dst, src, n / 4, PT_GPU_H2D, s), PT_OK);
    assert_int_equal(B->memcpy_async(h, dst + n / 4, src + n / 4, n / 4, PT_GPU_H2D, s2), PT_OK);
    assert_int_equal(B->stream_sync(h, s), PT_OK);
    assert_int_equal(B->stream_sync(h, s2), PT_OK);
    wall = 1e3 * pt_now_s() - t0;
    assert_true(wall >= 0.999 * expect_ms / 2);

    /* H2H is not a device copy: never throttled (the copy ran; no timing claim). */
    memset(dst, 0, n);
    assert_int_equal(B->memcpy_async(h, dst, src, 4096, PT_GPU_H2H, NULL), PT_OK);
    assert_memory_equal(dst, src, 4096);

    B->event_destroy(h, e0);
    B->event_destroy(h, e1);
    B->stream_destroy(h, s);
    B->stream_destroy(h, s2);
    free(src);
    free(dst);
    B->close(h);
}

/* ---- kernels ---- */

static uint32_t rng_state = 12345u;
static float frand(void) { /* xorshift32 -> [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return (float)((double)rng_state / 2147483648.0 - 1.0);
}

static int bits_equal(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_adamw_matches_reference(void **state) {
    (void)state;
    void *h = open_hb(0);
    pt_stream *s;
    assert_int_equal(B->stream_create(h, &s), PT_OK);
    enum { N = 1003 };
    float *p = malloc(N * 4), *g = malloc(N * 4), *m = calloc(N, 4), *v = calloc(N, 4);
    float *rp = malloc(N * 4), *rm = calloc(N, 4), *rv = calloc(N, 4);
    uint16_t *out = malloc(N * 2);
    assert_true(p && g && m && v && rp && rm && rv && out);
    for (int i = 0; i < N; i++) rp[i] = p[i] = frand();
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < N; i++) g[i] = frand() * 3.0f;
        float bc1, bc2r;
        pt_adamw_bias(b1, b2, t, &bc1, &bc2r);
        pt_adamw_args a = {.param = p, .grad = g, .m = m, .v = v, .param_out = out, .out_dtype = PT_BF16, .n = N, .lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd, .bc1 = bc1, .bc2_rsqrt = bc2r, .grad_scale = gs};
        /* t = 2 runs on the NULL stream, the others on a worker stream */
        assert_int_equal(B->adamw(h, &a, t == 2 ? NULL : s), PT_OK);
        assert_int_equal(B->stream_sync(h, s), PT_OK);
        /* scalar reference written out from the AdamW definition, same float order */
        for (int i = 0; i < N; i++) {
            float gg = g[i] * gs;
            rm[i] = b1 * rm[i] + (1.0f - b1) * gg;
            rv[i] = b2 * rv[i] + (1.0f - b2) * gg * gg;
            float q = rp[i] - (lr * wd) * rp[i];
            rp[i] = q - (lr / bc1) * rm[i] / (sqrtf(rv[i]) * bc2r + eps);
        }
        for (int i = 0; i < N; i++) {
            assert_true(bits_equal(p[i], rp[i]));
            assert_true(bits_equal(m[i], rm[i]));
            assert_true(bits_equal(v[i], rv[i]));
            assert_int_equal(out[i], pt_f32_to_bf16(rp[i]));
        }
    }
    B->stream_destroy(h, s);
    free(p);
    free(g);
    free(m);
    free(v);
    free(rp);
    free(rm);
    free(rv);
    free(out);
    B->close(h);
}

static void test_convert_sqnorm(void **state) {
    (void)state;
    void *h = open_hb(0);
    pt_stream *s;
    assert_int_equal(B->stream_create(h, &s), PT_OK);
    enum { N = 777 };
    float x[N], back[N], acc[N];
    uint16_t hb16[N], h16[N];
    for (int i = 0; i < N; i++) x[i] = frand() * 100.0f;
    /* fp32 -> bf16 -> fp32 and fp32 -> f16 -> fp32 */
    assert_int_equal(B->convert(h, hb16, PT_BF16, x, PT_F32, N, 0, s), PT_OK);
    assert_int_equal(B->convert(h, back, PT_F32, hb16, PT_BF16, N, 0, s), PT_OK);
    assert_int_equal(B->convert(h, h16, PT_F16, x, PT_F32, N, 0, s), PT_OK);
    assert_int_equal(B->stream_sync(h, s), PT_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(hb16[i], pt_f32_to_bf16(x[i]));
        assert_true(bits_equal(back[i], pt_bf16_to_f32(hb16[i])));
        assert_int_equal(h16[i], pt_f32_to_f16(x[i]));
        /* bf16 keeps 8 significant bits: round-to-nearest relative error <= 2^-8 */
        assert_true(fabsf(back[i] - x[i]) <= fabsf(x[i]) * (1.0f / 256.0f));
    }
    /* a value already in bf16 survives the round trip exactly */
    assert_int_equal(B->convert(h, hb16, PT_BF16, back, PT_F32, N, 0, NULL), PT_OK);
    assert_int_equal(B->convert(h, acc, PT_F32, hb16, PT_BF16, N, 0, NULL), PT_OK);
    assert_memory_equal(acc, back, sizeof acc);

    /* accumulate: f16 dst += fp32 src, the sum rounded once to f16 */
    uint16_t d16[N], ref16[N];
    for (int i = 0; i < N; i++) d16[i] = ref16[i] = pt_f32_to_f16(frand());
    assert_int_equal(B->convert(h, d16, PT_F16, x, PT_F32, N, 1, s), PT_OK);
    assert_int_equal(B->stream_sync(h, s), PT_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(d16[i], pt_f32_to_f16(pt_f16_to_f32(ref16[i]) + x[i]));

    /* sqnorm adds sum(x^2) (formed in double) to *out */
    double out = 2.5;
    double ref = 0.0;
    for (int i = 0; i < N; i++) ref += (double)x[i] * (double)x[i];
    assert_int_equal(B->sqnorm(h, x, PT_F32, N, &out, s), PT_OK);
    assert_int_equal(B->stream_sync(h, s), PT_OK);
    assert_true(out == 2.5 + ref);   /* the same double sum, same order: exact */
    double outb = 0.0;
    double refb = 0.0;
    for (int i = 0; i < N; i++) refb += (double)pt_bf16_to_f32(hb16[i]) * pt_bf16_to_f32(hb16[i]);
    assert_int_equal(B->sqnorm(h, hb16, PT_BF16, N, &outb, NULL), PT_OK);
    assert_true(outb == refb);

    /* bad arguments are refused, not crashed on */
    float y[N];
    assert_int_equal(B->convert(h, y, 7, x, PT_F32, N, 0, s), PT_ERR_INVALID_ARG);
    assert_int_equal(B->sqnorm(h, x, PT_F32, N, NULL, s), PT_ERR_INVALID_ARG);
    assert_int_equal(B->memcpy_async(h, y, x, 4, 9, s), PT_ERR_INVALID_ARG);
    B->stream_destroy(h, s);
    B->close(h);
}

static void test_memory_and_name(void **state) {
    (void)state;
    void *h = open_hb(0);
    assert_int_equal(B->total_memory(h), 64ull << 20);
    char name[128];
    B->device_name(h, name, sizeof name);
    assert_non_null(strstr(name, "host"));
    void *d = NULL, *pin = NULL;
    assert_int_equal(B->dev_alloc(h, 1 << 20, &d), PT_OK);
    assert_non_null(d);
    memset(d, 0x5A, 1 << 20); /* addressable on the host backend */
    B->dev_free(h, d, 1 << 20);
    assert_int_equal(B->host_alloc(h, 1000, &pin), PT_OK);
    assert_int_equal((uintptr_t)pin % 64, 0);
    memset(pin, 1, 1000);
    B->host_free(h, pin, 1000);
    B->close(h);
    /* default capacity is 1 GiB */
    void *h2 = NULL;
    assert_int_equal(B->open(NULL, &h2, NULL, 0), PT_OK);
    assert_int_equal(B->total_memory(h2), 1ull << 30);
    B->close(h2);
}

static void count_log(void *user, int32_t level, const char *msg) {
    (void)level;
    if (strstr(msg, "injected failure") && strstr(msg, "memset call #2")) ++*(int *)user;
}

/* fail_op / fail_op_at: exactly the n-th call of that op fails, once, with
 * PT_ERR_BACKEND and without doing its work; other ops are not counted; the
 * backend says so through set_log; a bad op number is refused at open. */
static void test_fail_op_injection(void **state) {
    (void)state;
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    c.capacity = 64ull << 20;
    c.fail_op = PT_GPU_OP_MEMSET;
    c.fail_op_at = 2;
    void *h = NULL;
    assert_int_equal(B->open(&c, &h, NULL, 0), PT_OK);
    int notices = 0;
    B->set_log(h, count_log, &notices);
    unsigned char buf[64];
    memset(buf, 0, sizeof buf);
    assert_int_equal(B->memset_async(h, buf, 1, 16, NULL), PT_OK);
    assert_int_equal(B->stream_sync(h, NULL), PT_OK);            /* another op: not counted */
    assert_int_equal(B->memset_async(h, buf + 16, 2, 16, NULL), PT_ERR_BACKEND);
    assert_int_equal(buf[16], 0);                                 /* the failed call did nothing */
    assert_int_equal(B->memset_async(h, buf + 32, 3, 16, NULL), PT_OK);   /* once only */
    assert_int_equal(buf[0], 1);
    assert_int_equal(buf[32], 3);
    assert_int_equal(notices, 1);
    B->close(h);
    c.fail_op = PT_GPU_OP_COUNT;
    char err[256] = "";
    assert_int_equal(B->open(&c, &h, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "fail_op"));
}

/* [host_backend] trace_file: every op of every stream, with its size and its
 * start/end, in the file written at close. A compute stream gated shut makes
 * a second stream's wait measurable without timing assumptions beyond order:
 * the wait ends after the gated host_fn ends. Control: without the key no file
 * appears; a path that cannot be written fails the open naming it. */
static void test_op_trace(void **state) {
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "/tmp/pt_hb_trace.%ld.txt", (long)getpid());
    remove(path);
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    c.capacity = 1 << 20;
    snprintf(c.trace_file, sizeof c.trace_file, "%s", path);
    void *h = NULL;
    char err[256];
    assert_int_equal(B->open(&c, &h, err, sizeof err), PT_OK);
    pt_stream *s1, *s2;
    pt_event *e;
    assert_int_equal(B->stream_create(h, &s1), PT_OK);
    assert_int_equal(B->stream_create(h, &s2), PT_OK);
    assert_int_equal(B->event_create(h, &e), PT_OK);
    void *d = NULL;
    assert_int_equal(B->dev_alloc(h, 4096, &d), PT_OK);
    static char src[4096];
    gate g;
    gate_init(&g);
    assert_int_equal(B->host_fn(h, s1, gate_fn, &g), PT_OK);
    assert_int_equal(B->memcpy_async(h, d, src, 3000, PT_GPU_H2D, s1), PT_OK);
    assert_int_equal(B->event_record(h, e, s1), PT_OK);
    assert_int_equal(B->stream_wait_event(h, s2, e), PT_OK);
    assert_int_equal(B->memset_async(h, d, 0, 1000, s2), PT_OK);
    sleep_ms(20);
    gate_open(&g);
    assert_int_equal(B->stream_sync(h, s2), PT_OK);
    B->dev_free(h, d, 4096);
    B->event_destroy(h, e);
    B->stream_destroy(h, s1);
    B->stream_destroy(h, s2);
    gate_destroy(&g);
    B->close(h);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256], op[32];
    int st, n = 0, seen = 0;
    unsigned long long size;
    double t0, t1, gate_end = -1, wait_end = -1, set_start = -1;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        assert_int_equal(sscanf(line, "%d\t%31s\t%llu\t%lf\t%lf", &st, op, &size, &t0, &t1), 5);
        assert_true(t0 >= 0 && t1 >= t0);
        n++;
        if (!strcmp(op, "host_fn")) seen |= 1, gate_end = t1, assert_int_equal(st, 1);
        if (!strcmp(op, "memcpy_h2d")) seen |= 2, assert_int_equal(size, 3000), assert_int_equal(st, 1);
        if (!strcmp(op, "record")) seen |= 4, assert_int_equal(st, 1);
        if (!strcmp(op, "wait")) seen |= 8, wait_end = t1, assert_int_equal(st, 2);
        if (!strcmp(op, "memset")) seen |= 16, set_start = t0, assert_int_equal(size, 1000), assert_int_equal(st, 2);
    }
    fclose(f);
    remove(path);
    assert_int_equal(seen, 31);
    assert_int_equal(n, 5);
    assert_true(wait_end >= gate_end);   /* stream 2 blocked until stream 1's work ran */
    assert_true(set_start >= wait_end);
    /* off: no file */
    c.trace_file[0] = 0;
    assert_int_equal(B->open(&c, &h, err, sizeof err), PT_OK);
    B->close(h);
    assert_null(fopen(path, "r"));
    /* a path that cannot be written */
    snprintf(c.trace_file, sizeof c.trace_file, "/nonexistent-dir/trace.txt");
    h = NULL;
    assert_int_equal(B->open(&c, &h, err, sizeof err), PT_ERR_CONFIG);
    assert_null(h);
    assert_non_null(strstr(err, "/nonexistent-dir/trace.txt"));
    assert_non_null(strstr(err, "trace_file"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_order),
        cmocka_unit_test(test_event_orders_streams),
        cmocka_unit_test(test_event_semantics),
        cmocka_unit_test(test_destroy_and_close_drain),
        cmocka_unit_test(test_copy_throttle),
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_convert_sqnorm),
        cmocka_unit_test(test_memory_and_name),
        cmocka_unit_test(test_fail_op_injection),
        cmocka_unit_test(test_op_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
