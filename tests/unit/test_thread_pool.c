/*
 * test_thread_pool.c — worker pool: FIFO order, wait semantics, helping
 * waiters, nested fork-join, many small tasks, concurrent submitters,
 * parallel-for coverage, drain on destroy; the idle spin (workers and
 * waiters that poll before sleeping: no sleep while work keeps coming, a
 * sleep per idle gap with the spin off as the negative control, no lost
 * submission when spinners give up at every moment).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "protrain.h"
#include "optim/thread_pool.h"

/* cmocka's assert macros must not run on pool threads (they longjmp to the
 * test's stack); tasks count problems here and the test asserts on it. */
static atomic_int task_errors;

static void nap_us(long us) {
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

static void add_one(void *arg) { atomic_fetch_add((atomic_long *)arg, 1); }

/* A task that blocks its worker until the test opens the gate. */
typedef struct gate {
    atomic_int open;
    atomic_int entered;
} gate;
static void gate_task(void *arg) {
    gate *g = arg;
    atomic_store(&g->entered, 1);
    while (!atomic_load(&g->open)) nap_us(100);
}
static void gate_wait_entered(gate *g) {
    while (!atomic_load(&g->entered)) nap_us(100);
}

static pt_pool *mk_pool(int nt) {
    pt_pool *p = NULL;
    char err[200] = "";
    if (pt_pool_create(nt, &p, err, sizeof err)) fail_msg("pt_pool_create: %s", err);
    return p;
}

static void test_create_default_threads(void **state) {
    (void)state;
    char err[200] = "";
    pt_pool *p = NULL;
    assert_int_equal(pt_pool_create(0, &p, err, sizeof err), PT_OK);
    assert_non_null(p);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    assert_true(pt_pool_threads(p) >= 1);
    assert_true(pt_pool_threads(p) <= online); /* affinity count never exceeds online cores */
    pt_pool_destroy(p);
    assert_int_equal(pt_pool_create(-3, &p, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_null(p);
    assert_non_null(strstr(err, "-3"));
    pt_pool_destroy(NULL);
}

static void test_many_small_tasks(void **state) {
    (void)state;
    for (int nt = 1; nt <= 3; nt++) {
        pt_pool *p = mk_pool(nt);
        assert_non_null(p);
        atomic_long count = 0;
        pt_task_group g = PT_TASK_GROUP_INIT;
        const long N = 20000;
        for (long i = 0; i < N; i++) assert_int_equal(pt_pool_submit(p, add_one, &count, &g, NULL, 0), PT_OK);
        assert_int_equal(pt_pool_wait(p, &g), PT_OK);
        assert_int_equal(atomic_load(&count), N);
        assert_int_equal(pt_pool_pending(p, &g), 0);
        assert_int_equal(g.submitted, (size_t)N);
        pt_pool_destroy(p);
    }
}

/* One worker, tasks queued behind a gate, no helping waiter: they must run
 * in submission order. */
typedef struct order_ctx {
    int log[200];
    atomic_int n;
} order_ctx;
typedef struct order_arg {
    order_ctx *ctx;
    int id;
} order_arg;
static void order_task(void *arg) {
    order_arg *a = arg;
    int k = atomic_fetch_add(&a->ctx->n, 1);
    a->ctx->log[k] = a->id;
}

static void test_fifo_order(void **state) {
    (void)state;
    pt_pool *p = mk_pool(1);
    gate gt = {0, 0};
    pt_task_group gg = PT_TASK_GROUP_INIT, ga = PT_TASK_GROUP_INIT;
    assert_int_equal(pt_pool_submit(p, gate_task, &gt, &gg, NULL, 0), PT_OK);
    gate_wait_entered(&gt);
    order_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    order_arg args[200];
    for (int i = 0; i < 200; i++) {
        args[i] = (order_arg){&ctx, i};
        assert_int_equal(pt_pool_submit(p, order_task, &args[i], &ga, NULL, 0), PT_OK);
    }
    assert_int_equal(pt_pool_pending(p, &ga), 200);
    atomic_store(&gt.open, 1);
    /* poll instead of waiting, so only the worker runs them */
    while (pt_pool_pending(p, &ga) > 0) nap_us(200);
    assert_int_equal(atomic_load(&ctx.n), 200);
    for (int i = 0; i < 200; i++) assert_int_equal(ctx.log[i], i);
    assert_int_equal(pt_pool_wait(p, &gg), PT_OK);
    pt_pool_destroy(p);
}

/* wait returns only after every task of the group has finished, and not
 * before; a group never used returns at once. */
typedef struct slow_arg {
    atomic_int done;
} slow_arg;
static void slow_task(void *arg) {
    nap_us(2000);
    atomic_store(&((slow_arg *)arg)->done, 1);
}

static void test_wait_semantics(void **state) {
    (void)state;
    pt_pool *p = mk_pool(2);
    pt_task_group empty = PT_TASK_GROUP_INIT;
    assert_int_equal(pt_pool_wait(p, &empty), PT_OK);
    assert_int_equal(pt_pool_pending(p, &empty), 0);
    slow_arg a[8];
    pt_task_group g = PT_TASK_GROUP_INIT;
    for (int i = 0; i < 8; i++) {
        atomic_init(&a[i].done, 0);
        assert_int_equal(pt_pool_submit(p, slow_task, &a[i], &g, NULL, 0), PT_OK);
    }
    assert_true(pt_pool_pending(p, &g) > 0); /* each task sleeps 2 ms */
    assert_int_equal(pt_pool_wait(p, &g), PT_OK);
    for (int i = 0; i < 8; i++) assert_int_equal(atomic_load(&a[i].done), 1);
    /* the group is reusable after a wait */
    atomic_store(&a[0].done, 0);
    assert_int_equal(pt_pool_submit(p, slow_task, &a[0], &g, NULL, 0), PT_OK);
    assert_int_equal(pt_pool_wait(p, &g), PT_OK);
    assert_int_equal(atomic_load(&a[0].done), 1);
    /* a group belongs to the pool of its first submission */
    pt_pool *q = mk_pool(1);
    atomic_long c = 0;
    char err[200] = "";
    assert_int_equal(pt_pool_submit(q, add_one, &c, &g, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "another pool"));
    assert_int_equal(pt_pool_wait(q, &g), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_pool_submit(NULL, add_one, &c, NULL, NULL, 0), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_pool_submit(p, NULL, &c, NULL, NULL, 0), PT_ERR_INVALID_ARG);
    pt_pool_destroy(q);
    pt_pool_destroy(p);
}

/* The only worker is blocked; the waiter must run its own group's task. */
typedef struct who_arg {
    pthread_t ran_on;
    atomic_int ran;
} who_arg;
static void who_task(void *arg) {
    who_arg *w = arg;
    w->ran_on = pthread_self();
    atomic_store(&w->ran, 1);
}

static void test_waiter_helps_own_group_only(void **state) {
    (void)state;
    pt_pool *p = mk_pool(1);
    gate gt = {0, 0};
    pt_task_group gg = PT_TASK_GROUP_INIT, mine = PT_TASK_GROUP_INIT, other = PT_TASK_GROUP_INIT;
    assert_int_equal(pt_pool_submit(p, gate_task, &gt, &gg, NULL, 0), PT_OK);
    gate_wait_entered(&gt);
    atomic_long oc = 0;
    assert_int_equal(pt_pool_submit(p, add_one, &oc, &other, NULL, 0), PT_OK); /* queued before mine */
    who_arg w;
    atomic_init(&w.ran, 0);
    assert_int_equal(pt_pool_submit(p, who_task, &w, &mine, NULL, 0), PT_OK);
    assert_int_equal(pt_pool_wait(p, &mine), PT_OK); /* would hang without helping */
    assert_int_equal(atomic_load(&w.ran), 1);
    assert_true(pthread_equal(w.ran_on, pthread_self()));
    assert_int_equal(atomic_load(&oc), 0); /* the other group's task was not touched */
    assert_int_equal(pt_pool_pending(p, &other), 1);
    atomic_store(&gt.open, 1);
    assert_int_equal(pt_pool_wait(p, &other), PT_OK);
    assert_int_equal(atomic_load(&oc), 1);
    assert_int_equal(pt_pool_wait(p, &gg), PT_OK);
    pt_pool_destroy(p);
}

/* Recursive fork-join: sum of [lo, hi) by splitting into 4 sub-tasks that
 * are waited on from inside a task, depth 5 (4^5 leaves). */
typedef struct sum_arg {
    pt_pool *p;
    long lo, hi;
    long result;
} sum_arg;
static void sum_task(void *arg) {
    sum_arg *a = arg;
    if (a->hi - a->lo <= 16) {
        long s = 0;
        for (long i = a->lo; i < a->hi; i++) s += i;
        a->result = s;
        return;
    }
    sum_arg kids[4];
    pt_task_group g = PT_TASK_GROUP_INIT;
    long step = (a->hi - a->lo) / 4;
    for (int k = 0; k < 4; k++) {
        kids[k] = (sum_arg){a->p, a->lo + k * step, k == 3 ? a->hi : a->lo + (k + 1) * step, 0};
        if (pt_pool_submit(a->p, sum_task, &kids[k], &g, NULL, 0) != PT_OK) atomic_fetch_add(&task_errors, 1);
    }
    if (pt_pool_wait(a->p, &g) != PT_OK) atomic_fetch_add(&task_errors, 1);
    a->result = kids[0].result + kids[1].result + kids[2].result + kids[3].result;
}

static void test_nested_waits(void **state) {
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        pt_pool *p = mk_pool(nt);
        const long n = 16 * 1024 + 5;
        sum_arg root = {p, 0, n, 0};
        pt_task_group g = PT_TASK_GROUP_INIT;
        assert_int_equal(pt_pool_submit(p, sum_task, &root, &g, NULL, 0), PT_OK);
        assert_int_equal(pt_pool_wait(p, &g), PT_OK);
        assert_int_equal(root.result, n * (n - 1) / 2);
        assert_int_equal(atomic_load(&task_errors), 0);
        pt_pool_destroy(p);
    }
}

/* Several external threads submit and wait at the same time. */
typedef struct sub_arg {
    pt_pool *p;
    atomic_long count;
} sub_arg;
static void *submitter(void *arg) {
    sub_arg *s = arg;
    pt_task_group g = PT_TASK_GROUP_INIT;
    for (int i = 0; i < 2000; i++)
        if (pt_pool_submit(s->p, add_one, &s->count, &g, NULL, 0) != PT_OK) return (void *)1;
    return pt_pool_wait(s->p, &g) == PT_OK && atomic_load(&s->count) == 2000 ? NULL : (void *)1;
}

static void test_concurrent_submitters(void **state) {
    (void)state;
    pt_pool *p = mk_pool(2);
    pthread_t th[4];
    sub_arg s[4];
    for (int i = 0; i < 4; i++) {
        s[i].p = p;
        atomic_init(&s[i].count, 0);
        assert_int_equal(pthread_create(&th[i], NULL, submitter, &s[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *rv = (void *)1;
        pthread_join(th[i], &rv);
        assert_null(rv);
        assert_int_equal(atomic_load(&s[i].count), 2000);
    }
    pt_pool_destroy(p);
}

/* parallel_for covers [0, n) exactly once for odd n and grains. */
static void mark(void *arg, size_t b, size_t e) {
    atomic_int *hits = arg;
    if (b >= e) atomic_fetch_add(&task_errors, 1);
    for (size_t i = b; i < e; i++) atomic_fetch_add(&hits[i], 1);
}

static void test_parallel_for_coverage(void **state) {
    (void)state;
    const size_t n = 100003;
    atomic_int *hits = calloc(n, sizeof *hits);
    assert_non_null(hits);
    size_t grains[] = {1, 64, 1000, 0, 200000};
    for (int nt = 0; nt <= 3; nt++) { /* nt 0 = no pool, inline */
        pt_pool *p = nt ? mk_pool(nt) : NULL;
        for (size_t gi = 0; gi < sizeof grains / sizeof grains[0]; gi++) {
            size_t len = grains[gi] == 1 ? 5003 : n; /* grain 1 is slow: fewer elements */
            for (size_t i = 0; i < n; i++) atomic_store(&hits[i], 0);
            assert_int_equal(pt_pool_parallel_for(p, len, grains[gi], mark, hits), PT_OK);
            for (size_t i = 0; i < n; i++) assert_int_equal(atomic_load(&hits[i]), i < len ? 1 : 0);
        }
        assert_int_equal(atomic_load(&task_errors), 0);
        assert_int_equal(pt_pool_parallel_for(p, 0, 64, mark, hits), PT_OK);
        assert_int_equal(pt_pool_parallel_for(p, 10, 64, NULL, hits), PT_ERR_INVALID_ARG);
        pt_pool_destroy(p);
    }
    free(hits);
}

/* Destroy with pending fire-and-forget tasks drains them, including tasks
 * submitted by tasks while draining. */
typedef struct spawn_arg {
    pt_pool *p;
    atomic_long *count;
    atomic_int *submit_fail;
} spawn_arg;
static void spawn_task(void *arg) {
    spawn_arg *a = arg;
    nap_us(50);
    atomic_fetch_add(a->count, 1);
    if (pt_pool_submit(a->p, add_one, a->count, NULL, NULL, 0) != PT_OK) atomic_fetch_add(a->submit_fail, 1);
}

static void test_destroy_drains(void **state) {
    (void)state;
    for (int nt = 1; nt <= 2; nt++) {
        pt_pool *p = mk_pool(nt);
        gate gt = {0, 0};
        assert_int_equal(pt_pool_submit(p, gate_task, &gt, NULL, NULL, 0), PT_OK);
        gate_wait_entered(&gt);
        atomic_long count = 0;
        atomic_int fails = 0;
        spawn_arg a = {p, &count, &fails};
        for (int i = 0; i < 300; i++) assert_int_equal(pt_pool_submit(p, spawn_task, &a, NULL, NULL, 0), PT_OK);
        atomic_store(&gt.open, 1);
        pt_pool_destroy(p); /* must run all 300 + the 300 they submit */
        assert_int_equal(atomic_load(&count), 600);
        assert_int_equal(atomic_load(&fails), 0);
    }
}

/* ---- idle spin ---- */

static void set_flag(void *arg) { atomic_store((atomic_int *)arg, 1); }
static void nap_1ms(void *arg) {
    atomic_store((atomic_int *)arg, 1);
    nap_us(1000);
}

/* One worker; 40 rounds of: submit a task (fire and forget), poll until it
 * ran, nap 100 us. Spinning for up to 0.5 s, the worker never sleeps between
 * rounds (each gap is far shorter); with the spin off (the negative control)
 * it sleeps in nearly every gap. Then the waiter: a group whose task is
 * already running on the worker (1 ms); spinning, the wait never sleeps;
 * off, it sleeps in every round. Counts, not times: the margins are orders of
 * magnitude (a gap of ~0.2 ms against a 0.5 s window). A stall of the
 * submitting thread longer than the window lets the spinning worker sleep once,
 * so the spinning side is bounded at 5 of 40 rounds (not 0), far below the
 * control's 30 or more, which a stall cannot lower. */
static size_t idle_sleeps(pt_pool *p, int waiter) {
    size_t s0 = pt_pool_sleeps(p);
    for (int r = 0; r < 40; r++) {
        atomic_int flag = 0;
        pt_task_group g = PT_TASK_GROUP_INIT;
        assert_int_equal(pt_pool_submit(p, waiter ? nap_1ms : set_flag, &flag, waiter ? &g : NULL, NULL, 0),
                         PT_OK);
        while (!atomic_load(&flag)) nap_us(20);   /* it runs on the worker */
        if (waiter) assert_int_equal(pt_pool_wait(p, &g), PT_OK);
        nap_us(100);
    }
    return pt_pool_sleeps(p) - s0;
}

static void test_spin_avoids_sleeps(void **state) {
    (void)state;
    pt_pool *p = mk_pool(1);
    assert_true(pt_pool_get_spin(p) > 0);   /* on by default */
    /* settle: the worker's first idle period after creation */
    atomic_int f0 = 0;
    assert_int_equal(pt_pool_set_spin(p, 0.5), PT_OK);
    assert_int_equal(pt_pool_submit(p, set_flag, &f0, NULL, NULL, 0), PT_OK);
    while (!atomic_load(&f0)) nap_us(20);
    size_t spin0 = idle_sleeps(p, 0), spin1 = idle_sleeps(p, 1);
    if (spin0 || spin1) printf("  spinning: %zu and %zu sleeps in 40 rounds (stalls)\n", spin0, spin1);
    assert_true(spin0 <= 5);
    assert_true(spin1 <= 5);
    assert_int_equal(pt_pool_set_spin(p, 0), PT_OK);
    assert_true(idle_sleeps(p, 0) >= 30);
    assert_true(idle_sleeps(p, 1) >= 30);
    /* out of range */
    assert_int_equal(pt_pool_set_spin(p, -1e-6), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_pool_set_spin(p, 2.0), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_pool_set_spin(p, NAN), PT_ERR_INVALID_ARG);
    assert_int_equal(pt_pool_set_spin(NULL, 0), PT_ERR_INVALID_ARG);
    assert_true(pt_pool_get_spin(p) == 0);
    pt_pool_destroy(p);
}

/* Spin windows so short that workers give up spinning at every moment while
 * four threads submit fire-and-forget tasks in bursts: every task must run
 * without anyone waiting for it (a submission lost between a spinner's last
 * poll and its sleep would leave the counter short until the deadline). */
typedef struct burst_arg {
    pt_pool *p;
    atomic_long *count;
} burst_arg;
static void *burster(void *arg) {
    burst_arg *b = arg;
    for (int i = 0; i < 400; i++) {
        if (pt_pool_submit(b->p, add_one, b->count, NULL, NULL, 0) != PT_OK) return (void *)1;
        if (i % 7 == 0) nap_us(1 + i % 13);
    }
    return NULL;
}

static void test_spin_no_lost_submit(void **state) {
    (void)state;
    const double spins[] = {0, 1e-6, 5e-6, 1e-4};
    for (int si = 0; si < 4; si++)
        for (int nt = 1; nt <= 3; nt++) {
            pt_pool *p = mk_pool(nt);
            assert_int_equal(pt_pool_set_spin(p, spins[si]), PT_OK);
            atomic_long count = 0;
            pthread_t th[4];
            burst_arg b = {p, &count};
            for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, burster, &b), 0);
            for (int i = 0; i < 4; i++) {
                void *rv = (void *)1;
                pthread_join(th[i], &rv);
                assert_null(rv);
            }
            /* the workers alone must finish them: poll up to 10 s */
            for (int w = 0; w < 100000 && atomic_load(&count) < 1600; w++) nap_us(100);
            assert_int_equal(atomic_load(&count), 1600);
            pt_pool_destroy(p);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_default_threads),
        cmocka_unit_test(test_many_small_tasks),
        cmocka_unit_test(test_fifo_order),
        cmocka_unit_test(test_wait_semantics),
        cmocka_unit_test(test_waiter_helps_own_group_only),
        cmocka_unit_test(test_nested_waits),
        cmocka_unit_test(test_concurrent_submitters),
        cmocka_unit_test(test_parallel_for_coverage),
        cmocka_unit_test(test_destroy_drains),
        cmocka_unit_test(test_spin_avoids_sleeps),
        cmocka_unit_test(test_spin_no_lost_submit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
