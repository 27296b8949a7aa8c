/*
 * test_coll_host.c — coll.h over the host's own collectives (pt_host_v1.coll,
 * gpu/coll/host/), with an in-process stand-in for the host's group: W
 * threads, one per rank, whose all_gather / all_to_all copy between the
 * threads' buffers behind a barrier.
 *  - 3 ranks, f32 and f64, over more than one segment: all-reduce (with a
 *    scale), reduce-scatter (own part summed, the rest untouched) and
 *    all-gather (2-byte elements, a length W does not divide) leave on every
 *    rank exactly the bits of the rank-order sum (x0 + x1) + x2 times scale;
 *    the values are chosen so that any other order gives other bits;
 *  - the same without the table's all_to_all (struct_size short of it, and
 *    NULL), and without its barrier;
 *  - the front's personalised exchange (pt_coll_alltoallv) and barrier;
 *  - a table whose slots come back in the wrong order (rank p's bytes at
 *    slot W-1-p) is refused at open naming the slot, on every rank;
 *  - a failing op: the error quotes the host's sentence and code, the group
 *    is broken and the next call fails without reaching the host;
 *  - refusals at open: no table, a short struct_size, a NULL all_gather, a
 *    rank or world that differs from pt_host_v1's, debug_hang_rank;
 *  - pt_coll_pick_table over backend x device x init_method with and without
 *    a table, and the plugin's init refusing backend = mpi beside a table and
 *    quoting the host's failure from the start-up exchange.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "host_builder.h"
#include "protrain.h"
#include "pt_util.h"

#define W 3
#define SEG ((size_t)1 << 18)   /* the transport's segment (elements of a part) */

static int has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ---- the stand-in group: W threads, one shared exchange area ---- */
typedef struct group {
    pthread_barrier_t bar;
    const void *send[W];
    int reversed;         /* testing: rank p's bytes land at slot W-1-p */
    int a2a_calls;        /* all_to_all calls (rank 0 counts) */
} group;

typedef struct member {
    group *g;
    int rank;
    pt_host_coll_v1 t;
    int fail_at;          /* testing: the fail_at-th op fails on this rank; 0 never */
    int ops;
} member;

static int32_t g_gather(void *user, const void *send, void *recv, uint64_t bytes, char *err,
                        uint64_t errlen) {
    member *m = user;
    group *g = m->g;
    if (++m->ops == m->fail_at) {
        snprintf(err, errlen, "the peer hung up");
        return 7;
    }
    g->send[m->rank] = send;
    pthread_barrier_wait(&g->bar);
    for (int p = 0; p < W; p++) {
        int slot = g->reversed ? W - 1 - p : p;
        memcpy((char *)recv + (size_t)slot * bytes, g->send[p], bytes);
    }
    pthread_barrier_wait(&g->bar);   /* the senders' buffers stay until all copied */
    return 0;
}

static int32_t g_a2a(void *user, const void *send, void *recv, uint64_t bytes, char *err,
                     uint64_t errlen) {
    (void)err;
    (void)errlen;
    member *m = user;
    group *g = m->g;
    m->ops++;
    if (m->rank == 0) g->a2a_calls++;
    g->send[m->rank] = send;
    pthread_barrier_wait(&g->bar);
    for (int p = 0; p < W; p++)
        memcpy((char *)recv + (size_t)p * bytes,
               (const char *)g->send[p] + (size_t)m->rank * bytes, bytes);
    pthread_barrier_wait(&g->bar);
    return 0;
}

static int32_t g_barrier(void *user, char *err, uint64_t errlen) {
    (void)err;
    (void)errlen;
    member *m = user;
    m->ops++;
    pthread_barrier_wait(&m->g->bar);
    return 0;
}

static void member_init(member *m, group *g, int rank, int a2a, int bar) {
    memset(m, 0, sizeof *m);
    m->g = g;
    m->rank = rank;
    m->t.struct_size = sizeof m->t;
    m->t.rank = rank;
    m->t.world_size = W;
    m->t.user = m;
    m->t.all_gather = g_gather;
    m->t.all_to_all = a2a ? g_a2a : NULL;
    m->t.barrier = bar ? g_barrier : NULL;
}

static pt_coll_config host_cfg(const pt_host_coll_v1 *t, int rank, int world) {
    pt_coll_config c = {world, rank, "env", 60.0, -1, "host", 0, NULL, t};
    return c;
}

/* ---- what each rank computes ---- */
#define NF ((size_t)2 * W * SEG + 7)   /* parts of > SEG elements: 2 segments each */
#define NH 1001                        /* 2-byte elements, not divisible by W */

/* Rank p's value of element e. Element e of rank 0 is 2^24 (f32) or 2^53
 * (f64), of rank 1 is 1, of rank 2 is -2^24 (-2^53) on even e, and small
 * distinct values on odd e: (x0 + x1) + x2 = 0 on the even elements while
 * x0 + (x1 + x2) or (x0 + x2) + x1 = 1, so an order other than 0, 1, 2 shows. */
static double val(int p, size_t e, int f64) {
    double big = f64 ? 9007199254740992.0 : 16777216.0;
    if (e % 2 == 0) return p == 0 ? big : p == 1 ? 1.0
                                                 : -big;
    return (double)((e * 7 + (size_t)p * 13) % 1000) / 64.0 - 7.0;
}

typedef struct job {
    member *m;
    int rc;
    char err[512];
    void *ar32, *ar64, *rs64;   /* results: all-reduce f32 x0.5, f64; reduce-scatter f64 */
    uint16_t *ag;
    unsigned char a2a_recv[W * 8];
} job;

static void *rank_main(void *arg) {
    job *j = arg;
    int r = j->m->rank;
    pt_coll *c = NULL;
    pt_coll_config cfg = host_cfg(&j->m->t, r, W);
    j->rc = pt_coll_open(&cfg, &c, j->err, sizeof j->err);
    if (j->rc) return NULL;
    float *a = malloc(NF * sizeof *a);
    double *b = malloc(NF * sizeof *b), *d = malloc(NF * sizeof *d);
    uint16_t *h = malloc(NH * sizeof *h);
    for (size_t e = 0; e < NF; e++) {
        a[e] = (float)val(r, e, 0);
        b[e] = d[e] = val(r, e, 1);
    }
    size_t lo, len;
    for (int p = 0; p < W; p++) {
        pt_coll_part(NH, W, p, &lo, &len);
        for (size_t e = lo; e < lo + len; e++) h[e] = p == r ? (uint16_t)(e * 31 + 5) : 0xdead;
    }
    /* personalised exchange: rank r sends rank q (q + 1) bytes of value 16 r + q */
    unsigned char snd[W * 8];
    size_t soff[W], sc[W], roff[W], rcnt[W];
    for (int q = 0; q < W; q++) {
        soff[q] = roff[q] = (size_t)q * 8;
        sc[q] = (size_t)q + 1;
        rcnt[q] = (size_t)r + 1;
        memset(snd + q * 8, 16 * r + q, 8);
    }
    memset(j->a2a_recv, 0xee, sizeof j->a2a_recv);
    j->rc = pt_coll_allreduce(c, a, NF, PT_COLL_F32, 0.5, "a", j->err, sizeof j->err);
    if (!j->rc) j->rc = pt_coll_allreduce(c, b, NF, PT_COLL_F64, 1.0, "b", j->err, sizeof j->err);
    if (!j->rc)
        j->rc = pt_coll_reduce_scatter(c, d, NF, PT_COLL_F64, 0.25, "d", j->err, sizeof j->err);
    if (!j->rc) j->rc = pt_coll_allgather(c, h, NH, 2, "h", j->err, sizeof j->err);
    if (!j->rc)
        j->rc = pt_coll_alltoallv(c, snd, soff, sc, j->a2a_recv, roff, rcnt, "x", j->err,
                                  sizeof j->err);
    if (!j->rc) j->rc = pt_coll_barrier(c, j->err, sizeof j->err);
    if (!j->rc && strcmp(pt_coll_transport(c), "host"))
        j->rc = pt_fail(j->err, sizeof j->err, PT_ERR_INTERNAL, "transport %s",
                        pt_coll_transport(c));
    pt_coll_close(c);
    j->ar32 = a;
    j->ar64 = b;
    j->rs64 = d;
    j->ag = h;
    return NULL;
}

static void run_group(group *g, member *m, job *jobs) {
    pthread_t th[W];
    for (int r = 0; r < W; r++) {
        jobs[r].m = &m[r];
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    (void)g;
}

static void check_results(job *jobs) {
    for (int r = 0; r < W; r++) {
        if (jobs[r].rc) fail_msg("rank %d: %s", r, jobs[r].err);
        const float *a = jobs[r].ar32;
        const double *b = jobs[r].ar64, *d = jobs[r].rs64;
        size_t lo, len;
        pt_coll_part(NF, W, r, &lo, &len);
        for (size_t e = 0; e < NF; e++) {
            float fa = ((float)val(0, e, 0) + (float)val(1, e, 0)) + (float)val(2, e, 0);
            fa *= 0.5f;
            double fb = (val(0, e, 1) + val(1, e, 1)) + val(2, e, 1);
            if (memcmp(&a[e], &fa, 4)) fail_msg("rank %d f32 [%zu]: %.9g != %.9g", r, e, a[e], fa);
            if (memcmp(&b[e], &fb, 8)) fail_msg("rank %d f64 [%zu]: %.17g != %.17g", r, e, b[e], fb);
            double fd = e >= lo && e < lo + len ? fb * 0.25 : val(r, e, 1);
            if (memcmp(&d[e], &fd, 8))
                fail_msg("rank %d reduce-scatter [%zu] (part %zu+%zu): %.17g != %.17g", r, e, lo,
                         len, d[e], fd);
        }
        for (size_t e = 0; e < NH; e++)
            if (jobs[r].ag[e] != (uint16_t)(e * 31 + 5))
                fail_msg("rank %d all-gather [%zu]: %u", r, e, jobs[r].ag[e]);
        for (int p = 0; p < W; p++)
            for (int k = 0; k < 8; k++) {
                int want = k < r + 1 ? 16 * p + r : 0xee;
                if (jobs[r].a2a_recv[p * 8 + k] != want)
                    fail_msg("rank %d exchange from %d byte %d: %d != %d", r, p, k,
                             jobs[r].a2a_recv[p * 8 + k], want);
            }
        free(jobs[r].ar32);
        free(jobs[r].ar64);
        free(jobs[r].rs64);
        free(jobs[r].ag);
    }
}

static void run_variant(int a2a, int bar, int short_size) {
    group g = {0};
    pthread_barrier_init(&g.bar, NULL, W);
    member m[W];
    job jobs[W];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < W; r++) {
        member_init(&m[r], &g, r, a2a, bar);
        /* an older host's table ends before all_to_all: the plugin must not read it */
        if (short_size) {
            m[r].t.struct_size = offsetof(pt_host_coll_v1, all_to_all);
            m[r].t.all_to_all = g_a2a;   /* past struct_size: must be ignored */
        }
    }
    run_group(&g, m, jobs);
    check_results(jobs);
    /* all_to_all is used exactly when the table has it inside struct_size */
    assert_int_equal(g.a2a_calls > 0, a2a && !short_size);
    pthread_barrier_destroy(&g.bar);
}

static void test_sums_with_all_to_all(void **s) {
    (void)s;
    run_variant(1, 1, 0);
}

static void test_sums_with_all_gather_only(void **s) {
    (void)s;
    run_variant(0, 0, 0);
    run_variant(0, 1, 1);
}

/* rank p's bytes at slot W-1-p: every rank refuses at open */
static void test_wrong_slots_refused(void **s) {
    (void)s;
    group g = {0};
    g.reversed = 1;
    pthread_barrier_init(&g.bar, NULL, W);
    member m[W];
    job jobs[W];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < W; r++) member_init(&m[r], &g, r, 1, 1);
    run_group(&g, m, jobs);
    for (int r = 0; r < W; r++) {
        assert_int_equal(jobs[r].rc, PT_ERR_CONFIG);
        if (!has(jobs[r].err, "disagree on the group") || !has(jobs[r].err, "slot 0 "))
            fail_msg("rank %d: '%s'", r, jobs[r].err);
    }
    pthread_barrier_destroy(&g.bar);
}

/* A 1-rank group: every call is local (the scale applied), the table is never
 * called after the start-up exchange. */
static int32_t solo_gather(void *user, const void *send, void *recv, uint64_t bytes, char *err,
                           uint64_t errlen) {
    (void)err;
    (void)errlen;
    ++*(int *)user;
    memcpy(recv, send, bytes);
    return 0;
}

static void test_one_rank(void **s) {
    (void)s;
    int calls = 0;
    pt_host_coll_v1 t = {sizeof t, 0, 1, 0, &calls, solo_gather, NULL, NULL, {0}};
    pt_coll_config cfg = host_cfg(&t, 0, 1);
    pt_coll *c = NULL;
    char err[512];
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_OK);
    assert_int_equal(calls, 1);
    double v[3] = {1, 2, 3};
    assert_int_equal(pt_coll_allreduce(c, v, 3, PT_COLL_F64, 0.5, "v", err, sizeof err), PT_OK);
    assert_true(v[0] == 0.5 && v[1] == 1 && v[2] == 1.5);
    assert_int_equal(pt_coll_barrier(c, err, sizeof err), PT_OK);
    assert_int_equal(calls, 1);
    pt_coll_close(c);
}

/* The start-up exchange: a group of one answering for a world of 2 leaves
 * slot 1 empty (refused); a first op that fails is quoted with its code. */
static void test_open_exchange(void **s) {
    (void)s;
    int calls = 0;
    pt_host_coll_v1 t = {sizeof t, 0, 2, 0, &calls, solo_gather, NULL, NULL, {0}};
    pt_coll_config cfg = host_cfg(&t, 0, 2);
    pt_coll *c = NULL;
    char err[512];
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_CONFIG);
    if (!has(err, "slot 1 of the start-up exchange holds rank 0 of 0")) fail_msg("'%s'", err);
    assert_null(c);
    group g = {0};
    member m;
    member_init(&m, &g, 0, 0, 0);
    m.t.world_size = 2;
    m.fail_at = 1;
    cfg = host_cfg(&m.t, 0, 2);
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_BACKEND);
    if (!has(err, "the peer hung up") || !has(err, "code 7") || !has(err, "all_gather"))
        fail_msg("'%s'", err);
    assert_null(c);
}

/* After a failure inside a collective, the next call never reaches the host. */
static int fail_count;
static int32_t fail_second(void *user, const void *send, void *recv, uint64_t bytes, char *err,
                           uint64_t errlen) {
    (void)user;
    if (++fail_count >= 2) {
        snprintf(err, errlen, "gloo: connection closed by peer");
        return 3;
    }
    /* the start-up exchange, answered for both ranks as rank 1 would */
    int32_t *o = recv;
    memcpy(o, send, bytes);
    o[2] = 1;
    o[3] = 2;
    return 0;
}

static void test_broken_after_failure(void **s) {
    (void)s;
    fail_count = 0;
    pt_host_coll_v1 t = {sizeof t, 0, 2, 0, NULL, fail_second, NULL, NULL, {0}};
    pt_coll_config cfg = host_cfg(&t, 0, 2);
    pt_coll *c = NULL;
    char err[512];
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_OK);
    float v[4] = {1, 2, 3, 4};
    int rc = pt_coll_allreduce(c, v, 4, PT_COLL_F32, 1.0, "the loss", err, sizeof err);
    assert_int_equal(rc, PT_ERR_BACKEND);
    if (!has(err, "the loss") || !has(err, "gloo: connection closed by peer") ||
        !has(err, "code 3"))
        fail_msg("'%s'", err);
    int before = fail_count;
    rc = pt_coll_allgather(c, v, 4, 4, "again", err, sizeof err);
    assert_int_equal(rc, PT_ERR_BACKEND);
    if (!has(err, "group is broken")) fail_msg("'%s'", err);
    assert_int_equal(fail_count, before);
    pt_coll_close(c);
}

static void test_open_refusals(void **s) {
    (void)s;
    pt_host_coll_v1 t = {sizeof t, 1, 2, 0, NULL, solo_gather, NULL, NULL, {0}};
    pt_coll *c = NULL;
    char err[512];
    pt_coll_config cfg = host_cfg(NULL, 1, 2);
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_INVALID_ARG);
    if (!has(err, "pt_host_v1.coll is NULL")) fail_msg("'%s'", err);
    cfg = host_cfg(&t, 1, 2);
    t.struct_size = offsetof(pt_host_coll_v1, all_gather);
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_INVALID_ARG);
    if (!has(err, "struct_size")) fail_msg("'%s'", err);
    t.struct_size = sizeof t;
    t.all_gather = NULL;
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_INVALID_ARG);
    if (!has(err, "all_gather NULL")) fail_msg("'%s'", err);
    t.all_gather = solo_gather;
    cfg = host_cfg(&t, 0, 2);
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_CONFIG);
    if (!has(err, "table says rank 1 of 2 but pt_host_v1 says rank 0 of 2")) fail_msg("'%s'", err);
    cfg = host_cfg(&t, 1, 3);
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_CONFIG);
    cfg = host_cfg(&t, 1, 2);
    cfg.debug_hang_rank = 0;
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_UNSUPPORTED);
    if (!has(err, "debug_hang_rank")) fail_msg("'%s'", err);
    assert_null(c);
}

static void test_pick_table(void **s) {
    (void)s;
    struct {
        const char *dist, *dev, *init;
        int table;
        const char *want, *why;
    } cases[] = {
        {"auto", "host", "env", 1, "host", NULL},
        {"host", "host", "env", 1, "host", NULL},
        {"auto", "host", "env", 0, "mpi", NULL},
        {"auto", "cuda", "env", 0, "nccl", NULL},
        {"host", "host", "env", 0, NULL, "backend = host needs a host"},
        {"mpi", "host", "env", 1, NULL, "backend = mpi, but the host hands"},
        {"nccl", "host", "env", 1, NULL, "backend = nccl, but the host hands"},
        {"none", "host", "env", 1, NULL, "backend = none, but the host hands"},
        {"auto", "cuda", "env", 1, NULL, "host backend only"},
        {"host", "cuda", "env", 1, NULL, "host backend only"},
        {"auto", "host", "mpi", 1, NULL, "init_method = mpi, but"},
        {"auto", "host", "file:///tmp/x", 1, NULL, "init_method = file:///tmp/x, but"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *tr = "x";
        char err[512] = "";
        int rc = pt_coll_pick_table(cases[i].dist, cases[i].dev, cases[i].init, cases[i].table,
                                    &tr, err, sizeof err);
        if (cases[i].want) {
            if (rc || !tr || strcmp(tr, cases[i].want))
                fail_msg("case %zu: rc %d tr %s (%s)", i, rc, tr ? tr : "NULL", err);
        } else if (!rc || tr || !has(err, cases[i].why)) {
            fail_msg("case %zu: rc %d, '%s'", i, rc, err);
        }
    }
}

/* The plugin's init with world_size 2 and a table: backend = mpi is refused
 * before anything opens; with auto, the host's failure in the start-up
 * exchange reaches last_error. */
static int32_t refuse_gather(void *user, const void *send, void *recv, uint64_t bytes, char *err,
                             uint64_t errlen) {
    (void)user;
    (void)send;
    (void)recv;
    (void)bytes;
    snprintf(err, errlen, "the process group is gone");
    return 1;
}

static int init_with_table(const char *dist, const pt_host_coll_v1 *t, char *msg, size_t cap) {
    char text[512];
    snprintf(text, sizeof text, "[plugin]\nbackend = host\nlog_level = error\n[memory]\n"
                                "device_capacity = 4MiB\n[dist]\n%s",
             dist);
    pt_host_v1 host = hb_host(NULL);
    host.world_size = 2;
    host.rank = 0;
    host.device_kind = PT_DEVICE_HOST;
    host.coll = t;
    void *ctx = NULL;
    int rc = hb_init(&protrain_plugin_v1, text, &host, &ctx);
    snprintf(msg, cap, "%s", protrain_plugin_v1.last_error(ctx));
    if (ctx) protrain_plugin_v1.finalize(ctx);
    return rc;
}

static void test_plugin_init(void **s) {
    (void)s;
    pt_host_coll_v1 t = {sizeof t, 0, 2, 0, NULL, refuse_gather, NULL, NULL, {0}};
    char msg[1024];
    int rc = init_with_table("backend = mpi\n", &t, msg, sizeof msg);
    assert_int_equal(rc, PT_ERR_UNSUPPORTED);
    if (!has(msg, "backend = mpi, but the host hands")) fail_msg("'%s'", msg);
    rc = init_with_table("backend = auto\n", &t, msg, sizeof msg);
    assert_int_equal(rc, PT_ERR_BACKEND);
    if (!has(msg, "the process group is gone")) fail_msg("'%s'", msg);
    t.rank = 1;
    rc = init_with_table("", &t, msg, sizeof msg);
    assert_int_equal(rc, PT_ERR_CONFIG);
    if (!has(msg, "table says rank 1 of 2")) fail_msg("'%s'", msg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums_with_all_to_all),
        cmocka_unit_test(test_sums_with_all_gather_only),
        cmocka_unit_test(test_wrong_slots_refused),
        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_open_exchange),
        cmocka_unit_test(test_broken_after_failure),
        cmocka_unit_test(test_open_refusals),
        cmocka_unit_test(test_pick_table),
        cmocka_unit_test(test_plugin_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
