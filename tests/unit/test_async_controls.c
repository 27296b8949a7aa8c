/*
 * test_async_controls.c — negative controls for three of the plugin's
 * orderings after a host's asynchronous work (PT_HOST_ASYNC_COMPUTE, work given
 * to launch runs later on the compute stream's thread), which the whole-run
 * oracle of tests/integ/test_async.c cannot show with its host (its device runs
 * a whole pass behind, and its reads and frees land where the missing ordering
 * does no harm). Each case drives the plugin table directly with one launched
 * item that sleeps first, so the work is certainly still queued when the host's
 * next call arrives, and runs twice: with the ordering (the result must be
 * right) and with it skipped through [host_backend] debug_skip_ordering (the
 * result must be wrong: the test could fail).
 *  - 64, the host's memcpy after its launched work: a D2H copy of a buffer the
 *    launched item writes returns the item's values;
 *  - 16, frees in the compute stream's order: a buffer freed while a launched
 *    item that reads it is queued is read intact, not as the free's poison;
 *  - 32, optimizer_step's parameter reads after compute: read_param right after
 *    optimizer_step returns the stepped values, not the ones before the step.
 */
#include <math.h>
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

#include "protrain.h"
#include "host_builder.h"
#include "tiny_model.h"

static const pt_plugin_v1 *P = &protrain_plugin_v1;

/* long enough that the host's next call lands inside it even on a loaded machine */
enum { WAIT_MS = 200,
       N = 64 };

static void *start(tiny *t, int skip) {
    char ini[320];
    snprintf(ini, sizeof ini,
             "[plugin]\nbackend = host\nlog_level = error\n[memory]\ndevice_capacity = 4MiB\n"
             "[protrain]\nforce_all_persistent = true\n[host_backend]\nasync_compute = true\n"
             "[testing]\ndebug_skip_ordering = %d\n",
             skip);
    pt_host_v1 host = hb_host(NULL);
    host.flags = PT_HOST_ASYNC_COMPUTE;
    void *ctx = hb_open(P, ini, &host);
    tiny_make(t);
    assert_int_equal(P->post_model_load(ctx, &t->m), PT_OK);
    assert_int_equal(P->create_optimizer(ctx, NULL), PT_OK);
    return ctx;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A launched item: after the sleep, dst[0..N) = src[0..N) (src NULL: 1.0f). */
typedef struct job {
    float *dst;
    const float *src;
} job;

static void late_copy(void *arg) {
    job *j = arg;
    sleep_ms(WAIT_MS);
    for (int k = 0; k < N; k++) j->dst[k] = j->src ? j->src[k] : 1.0f;
}

/* 64: memcpy D2H of a buffer the launched work writes. Returns 1 when the copy
 * saw the launched item's values. */
static int hostio_case(int skip) {
    tiny t;
    void *ctx = start(&t, skip);
    float zero[N] = {0}, back[N];
    void *d = NULL;
    assert_int_equal(P->dev_alloc(ctx, sizeof zero, "input", &d), PT_OK);
    assert_int_equal(P->memcpy(ctx, d, zero, sizeof zero, PT_COPY_H2D), PT_OK);
    job j = {d, NULL};
    assert_int_equal(P->launch(ctx, late_copy, &j), PT_OK);
    assert_int_equal(P->memcpy(ctx, back, d, sizeof back, PT_COPY_D2H), PT_OK);
    int ok = back[0] == 1.0f && back[N - 1] == 1.0f;
    assert_int_equal(P->stream_sync(ctx), PT_OK);
    assert_int_equal(P->dev_free(ctx, d), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
    return ok;
}

/* 16: dev_free of a buffer a queued launched item still reads. Returns 1 when
 * the item read the buffer's values (not the poison a free writes). */
static int free_case(int skip) {
    tiny t;
    void *ctx = start(&t, skip);
    float vals[N], seen[N];
    for (int k = 0; k < N; k++) vals[k] = (float)k;
    void *d = NULL;
    assert_int_equal(P->dev_alloc(ctx, sizeof vals, "input", &d), PT_OK);
    assert_int_equal(P->memcpy(ctx, d, vals, sizeof vals, PT_COPY_H2D), PT_OK);
    job j = {seen, d};
    assert_int_equal(P->launch(ctx, late_copy, &j), PT_OK);
    assert_int_equal(P->dev_free(ctx, d), PT_OK);
    assert_int_equal(P->stream_sync(ctx), PT_OK);
    int ok = !memcmp(seen, vals, sizeof vals);
    assert_int_equal(P->finalize(ctx), PT_OK);
    return ok;
}

/* 32: read_param right after optimizer_step, the last backward's gradient
 * written by a late launched item. Returns 1 when that read equals the value
 * read once everything has run. */
static int step_case(int skip) {
    tiny t;
    void *ctx = start(&t, skip);
    assert_int_equal(P->pre_step(ctx, 0, 0, 1), PT_OK);
    for (int b = 0; b < TINY_NB; b++) {
        assert_int_equal(P->block_pre_forward(ctx, b), PT_OK);
        assert_int_equal(P->block_post_forward(ctx, b), PT_OK);
    }
    job j = {NULL, NULL};
    for (int b = TINY_NB - 1; b >= 0; b--) {
        assert_int_equal(P->block_pre_backward(ctx, b), PT_OK);
        if (b == 0) {
            j.dst = t.p[1].grad;   /* b0.w */
            assert_non_null(j.dst);
            assert_int_equal(P->launch(ctx, late_copy, &j), PT_OK);
        }
        assert_int_equal(P->block_post_backward(ctx, b), PT_OK);
    }
    assert_int_equal(P->optimizer_step(ctx, 0.1f), PT_OK);
    float early[TINY_NEL], late[TINY_NEL];
    assert_int_equal(P->read_param(ctx, 1, early, sizeof early), PT_OK);
    assert_int_equal(P->stream_sync(ctx), PT_OK);
    assert_int_equal(P->read_param(ctx, 1, late, sizeof late), PT_OK);
    /* the step moved the weight: the gradient of 1 reached it */
    assert_true(late[0] != t.init[1][0]);
    int ok = !memcmp(early, late, sizeof late);
    assert_int_equal(P->post_step(ctx, 0, 1.0f), PT_OK);
    assert_int_equal(P->finalize(ctx), PT_OK);
    return ok;
}

/* Under TSan the controls (an ordering skipped on purpose) are data races by
 * design, and TSan reports them as such; the ordered runs, which TSan checks,
 * still run. */
static int controls_run(void) {
    const char *san = getenv("PT_SAN");
    if (san && !strcmp(san, "tsan")) {
        printf("  control skipped under TSan: its data race is the point\n");
        return 0;
    }
    return 1;
}

static void test_hostio(void **state) {
    (void)state;
    assert_true(hostio_case(0));
    if (controls_run()) assert_false(hostio_case(64));
}

static void test_frees(void **state) {
    (void)state;
    assert_true(free_case(0));
    if (controls_run()) assert_false(free_case(16));
}

static void test_step(void **state) {
    (void)state;
    assert_true(step_case(0));
    if (controls_run()) assert_false(step_case(32));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostio),
        cmocka_unit_test(test_frees),
        cmocka_unit_test(test_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
