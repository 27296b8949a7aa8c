/*
 * test_nccl_sim.c — the NCCL transport's own code (gpu/coll/nccl/coll_nccl.c,
 * compiled for this test against tests/nccl_sim/'s headers) run against a
 * simulated NCCL and CUDA runtime (tests/nccl_sim/nccl_sim.c): ranks are
 * threads of this process, "device" memory is host memory, streams run in
 * order when polled, sends meet receives as NCCL requires. What this proves: the transport's parts, segments, scratch slots, host staging, group
 * matching, deadlines, aborts and errors; what it cannot: NCCL's and the GPU's
 * behaviour (tests/gpu/nccl.sh on a GPU machine).
 *
 * Oracles:
 *  - W = 1..4 ranks, lengths around every edge (0, 1, < W, not a multiple of W,
 *    parts of several scratch segments with a ragged tail), host and device
 *    buffers: all-gather of 1/2/4/8-byte elements exact; reduce-scatter's own
 *    part bit-identical to the rank-order sum times scale formed here and the
 *    rest untouched; all-reduce (f32 and f64) bit-identical everywhere; the
 *    values make the order visible (the reversed-order sum differs somewhere,
 *    checked), and with NCCL answering ncclInProgress for a while;
 *  - negative control: the sum run outside stream order (before its receives
 *    land) is caught by the same oracle;
 *  - a rank that never joins, a peer that never arrives at a collective, an
 *    asynchronous NCCL error: errors naming the stage, the rank and the
 *    timeout (after at least the timeout), a broken group afterwards;
 *  - refusals: no device, a device index past the count, scratch that does not
 *    fit, a buffer on another device, bad dtype / element size; the caller's
 *    current device restored after every call.
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
#include <unistd.h>

#include "coll/coll.h"
#include "coll/coll_nccl.h"
#include "cuda_runtime_api.h"
#include "nccl.h"
#include "protrain.h"
#include "pt_util.h"
#include "sim.h"

extern const pt_nccl_coll_ops pt_nccl_coll_v1;   /* gpu/coll/nccl/coll_nccl.c, built in */
static const pt_nccl_coll_ops *T = &pt_nccl_coll_v1;
#define SEGN ((size_t)1 << 18)   /* the transport's scratch segment (SEG_ELEMS) */

static float valf(int rank, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h & 0xffff) / 65536.0f - 0.5f) * (float)(1u << (h >> 28));
}

typedef struct {
    int rank, world, device_buffers, skip_collectives;
    double timeout;
    const unsigned char *id;
    char msg[1024];   /* the first failure, or "" */
    size_t bad;       /* wrong elements seen (the negative control wants some) */
    int rc_open;
} rank_job;

static void note(rank_job *j, const char *fmt, ...) {
    if (j->msg[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->msg, sizeof j->msg, fmt, ap);
    va_end(ap);
}

/* A buffer the collectives get: host memory, or simulated device memory. */
static void *buf_new(rank_job *j, size_t bytes) {
    void *p = NULL;
    if (j->device_buffers) {
        int d = 0;
        cudaGetDevice(&d);
        cudaSetDevice(j->rank);   /* the communicator's device */
        cudaMalloc(&p, bytes);
        cudaSetDevice(d);
    } else {
        p = malloc(bytes ? bytes : 1);
    }
    return p;
}
static void buf_free(rank_job *j, void *p) {
    if (j->device_buffers) cudaFree(p);
    else free(p);
}

static void lens_for(int W, size_t *lens, int *nl) {
    size_t big = (size_t)W * (SEGN + 3) + 1;   /* parts of two segments, ragged */
    size_t l[] = {0, 1, 2, 3, 5, 64, 1001, big};
    *nl = (int)(sizeof l / sizeof l[0]);
    memcpy(lens, l, sizeof l);
}

static void *rank_main(void *arg) {
    rank_job *j = arg;
    char err[512];
    void *h = NULL;
    int dev0 = 3 - j->rank % 4, now = -1;   /* the caller's current device: kept by every call */
    cudaSetDevice(dev0);
    j->rc_open = T->open(j->id, j->rank, j->world, j->rank, j->timeout, &h, err, sizeof err);
    if (j->rc_open) {
        note(j, "%s", err);
        return NULL;
    }
    cudaGetDevice(&now);
    if (now != dev0) note(j, "open changed the current device %d to %d", dev0, now);
    if (j->skip_collectives) {
        T->close(h);
        return NULL;
    }
    size_t lens[8];
    int nl;
    lens_for(j->world, lens, &nl);
    int W = j->world, R = j->rank;
    for (int k = 0; k < nl; k++) {
        size_t n = lens[k], lo, len;
        pt_coll_part(n, W, R, &lo, &len);
        /* all-gather, 1..8-byte elements */
        for (size_t b = 1; b <= 8; b *= 2) {
            unsigned char *x = buf_new(j, n * b);
            memset(x, 0xEE, n * b);
            for (size_t i = lo; i < lo + len; i++)
                for (size_t q = 0; q < b; q++) x[i * b + q] = (unsigned char)(i * 31 + q * 7 + b);
            if (T->allgather(h, x, n, b, "sim all-gather", err, sizeof err))
                note(j, "all-gather %zu x %zu: %s", n, b, err);
            for (size_t i = 0; i < n * b; i++)
                if (x[i] != (unsigned char)((i / b) * 31 + (i % b) * 7 + b)) {
                    j->bad++;
                    note(j, "all-gather %zu x %zu: byte %zu wrong", n, b, i);
                }
            buf_free(j, x);
        }
        /* reduce-scatter and all-reduce, f32, scale 1/W */
        float *x = buf_new(j, n * 4), *y = buf_new(j, n * 4);
        for (size_t i = 0; i < n; i++) x[i] = y[i] = valf(R, i);
        double scale = 1.0 / W;
        if (T->reduce_scatter(h, x, n, PT_COLL_F32, scale, "sim reduce-scatter", err, sizeof err))
            note(j, "reduce-scatter %zu: %s", n, err);
        if (T->allreduce(h, y, n, PT_COLL_F32, scale, "sim all-reduce", err, sizeof err))
            note(j, "all-reduce %zu: %s", n, err);
        for (size_t i = 0; i < n; i++) {
            float want = valf(0, i);
            for (int q = 1; q < W; q++) want += valf(q, i);
            want *= (float)scale;
            int own = i >= lo && i < lo + len;
            float xv = own ? want : valf(R, i);
            if (memcmp(&x[i], &xv, 4) || memcmp(&y[i], &want, 4)) {
                j->bad++;
                note(j, "%zu floats, element %zu (%s part): reduce-scatter %a all-reduce %a, "
                        "want %a / %a",
                     n, i, own ? "own" : "other", x[i], y[i], xv, want);
            }
        }
        buf_free(j, x);
        buf_free(j, y);
        /* f64 all-reduce, scale 1 */
        double *z = buf_new(j, n * 8);
        for (size_t i = 0; i < n; i++) z[i] = (double)valf(R, i) * 1.000000119;
        if (T->allreduce(h, z, n, PT_COLL_F64, 1.0, "sim f64 all-reduce", err, sizeof err))
            note(j, "f64 all-reduce %zu: %s", n, err);
        for (size_t i = 0; i < n; i++) {
            double want = (double)valf(0, i) * 1.000000119;
            for (int q = 1; q < W; q++) want += (double)valf(q, i) * 1.000000119;
            if (memcmp(&z[i], &want, 8)) {
                j->bad++;
                note(j, "f64 all-reduce of %zu: element %zu is %a, want %a", n, i, z[i], want);
            }
        }
        buf_free(j, z);
        cudaGetDevice(&now);
        if (now != dev0) note(j, "a collective changed the current device to %d", now);
    }
    if (T->barrier(h, err, sizeof err)) note(j, "barrier: %s", err);
    T->close(h);
    return NULL;
}

/* W rank threads on a fresh id; returns the total of wrong elements and
 * fails the test on any other failure unless want_bad. */
static size_t run_world(int W, int device_buffers, int want_bad) {
    unsigned char id[PT_NCCL_ID_BYTES];
    char err[256];
    assert_int_equal(T->unique_id(id, err, sizeof err), PT_OK);
    rank_job jobs[4];
    pthread_t th[4];
    for (int r = 0; r < W; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r] = (rank_job){r, W, device_buffers, 0, 30.0, id, "", 0, 0};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    size_t bad = 0;
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < W; r++) {
        bad += jobs[r].bad;
        if (jobs[r].msg[0] && !want_bad)
            fail_msg("W = %d (%s buffers), rank %d: %s", W, device_buffers ? "device" : "host", r,
                     jobs[r].msg);
    }
    return bad;
}

static void test_values_show_order(void **s) {
    (void)s;
    /* the oracle would be blind if every rank order gave the same bits */
    size_t diff = 0;
    for (size_t i = 0; i < 4096; i++) {
        float f = valf(0, i) + valf(1, i) + valf(2, i), b = valf(2, i) + valf(1, i) + valf(0, i);
        diff += memcmp(&f, &b, 4) != 0;
    }
    assert_true(diff > 0);
}

static void test_worlds(void **s) {
    (void)s;
    for (int W = 1; W <= 4; W++)
        for (int dev = 0; dev < 2; dev++) assert_int_equal(run_world(W, dev, 0), 0);
}

static void test_in_progress(void **s) {
    (void)s;
    sim_inprogress = 3;
    size_t bad = run_world(3, 1, 0);
    sim_inprogress = 0;
    assert_int_equal(bad, 0);
}

static void test_negative_control_stream_order(void **s) {
    (void)s;
    sim_sum_early = 1;
    size_t bad = run_world(2, 1, 1);
    sim_sum_early = 0;
    if (!bad) fail_msg("sums run before their receives landed went unnoticed: the oracle is blind");
}

/* Rank 0 of 2 alone: set-up must give up after the timeout, naming it. */
static void test_missing_rank(void **s) {
    (void)s;
    unsigned char id[PT_NCCL_ID_BYTES];
    char err[512];
    assert_int_equal(T->unique_id(id, err, sizeof err), PT_OK);
    void *h = NULL;
    int a0 = sim_aborts();
    double t0 = pt_now_s();
    int rc = T->open(id, 0, 2, 0, 0.3, &h, err, sizeof err);
    double dt = pt_now_s() - t0;
    assert_int_equal(rc, PT_ERR_BACKEND);
    assert_null(h);
    if (dt < 0.3) fail_msg("gave up after %.3f s, before the timeout", dt);
    if (!strstr(err, "communicator set-up") || !strstr(err, "every rank must join") ||
        !strstr(err, "did not complete within [dist] timeout = 0.3 s on rank 0 of 2"))
        fail_msg("'%s'", err);
    assert_int_equal(sim_aborts(), a0 + 1);   /* the half-made communicator was aborted */
}

/* Rank 1 joins but never calls the collective. */
static void *quiet_rank(void *arg) {
    rank_job *j = arg;
    char err[256];
    void *h = NULL;
    j->rc_open = T->open(j->id, 1, 2, 1, j->timeout, &h, err, sizeof err);
    if (!j->rc_open) {
        /* stay joined until rank 0 has given up */
        while (!__atomic_load_n(&j->skip_collectives, __ATOMIC_ACQUIRE)) usleep(1000);
        T->close(h);
    }
    return NULL;
}

static void test_peer_never_arrives(void **s) {
    (void)s;
    unsigned char id[PT_NCCL_ID_BYTES];
    char err[512];
    assert_int_equal(T->unique_id(id, err, sizeof err), PT_OK);
    rank_job q = {1, 2, 0, 0, 5.0, id, "", 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, quiet_rank, &q), 0);
    void *h = NULL;
    assert_int_equal(T->open(id, 0, 2, 0, 0.4, &h, err, sizeof err), PT_OK);
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double t0 = pt_now_s();
    int rc = T->allreduce(h, v, 8, PT_COLL_F32, 1.0, "gradient of chunk 3", err, sizeof err);
    double dt = pt_now_s() - t0;
    assert_int_equal(rc, PT_ERR_BACKEND);
    if (dt < 0.4) fail_msg("gave up after %.3f s, before the timeout", dt);
    if (!strstr(err, "gradient of chunk 3 (collective 1, NCCL)") ||
        !strstr(err, "within [dist] timeout = 0.4 s on rank 0 of 2") ||
        !strstr(err, "communicator was aborted"))
        fail_msg("'%s'", err);
    rc = T->allreduce(h, v, 8, PT_COLL_F32, 1.0, "next", err, sizeof err);
    assert_int_equal(rc, PT_ERR_BACKEND);
    if (!strstr(err, "group is broken")) fail_msg("after a failure: '%s'", err);
    T->close(h);
    __atomic_store_n(&q.skip_collectives, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    assert_int_equal(q.rc_open, PT_OK);
}

/* NCCL reports an asynchronous error (a peer's connection dropped). */
static void test_async_error(void **s) {
    (void)s;
    unsigned char id[PT_NCCL_ID_BYTES];
    char err[512];
    assert_int_equal(T->unique_id(id, err, sizeof err), PT_OK);
    void *h = NULL;
    assert_int_equal(T->open(id, 0, 1, 0, 5.0, &h, err, sizeof err), PT_OK);
    sim_fail_comms(ncclRemoteError);
    float v[4] = {1, 2, 3, 4};
    int rc = T->allreduce(h, v, 4, PT_COLL_F32, 1.0, "squared gradient norms", err, sizeof err);
    assert_int_equal(rc, PT_ERR_BACKEND);
    if (!strstr(err, "squared gradient norms") || !strstr(err, "remote process exited") ||
        !strstr(err, "rank 0 of 1"))
        fail_msg("'%s'", err);
    T->close(h);
}

static void test_refusals(void **s) {
    (void)s;
    unsigned char id[PT_NCCL_ID_BYTES];
    char err[512];
    void *h = NULL;
    assert_int_equal(T->unique_id(id, err, sizeof err), PT_OK);
    sim_ndev = 0;
    assert_int_equal(T->open(id, 0, 1, 0, 1.0, &h, err, sizeof err), PT_ERR_BACKEND);
    if (!strstr(err, "no CUDA device")) fail_msg("no device: '%s'", err);
    sim_ndev = 2;
    assert_int_equal(T->open(id, 0, 1, 5, 1.0, &h, err, sizeof err), PT_ERR_CONFIG);
    if (!strstr(err, "CUDA device 5 does not exist (this machine has 2)")) fail_msg("'%s'", err);
    assert_int_equal(T->open(id, 2, 2, 0, 1.0, &h, err, sizeof err), PT_ERR_INVALID_ARG);
    sim_malloc_limit = 1024;
    assert_int_equal(T->open(id, 0, 1, 0, 1.0, &h, err, sizeof err), PT_ERR_OOM);
    if (!strstr(err, "collective scratch") || !strstr(err, "outside [memory] capacity"))
        fail_msg("scratch: '%s'", err);
    sim_malloc_limit = (size_t)1 << 40;
    sim_ndev = 4;
    assert_null(h);
    assert_int_equal(T->open(id, 0, 1, 1, 1.0, &h, err, sizeof err), PT_OK);
    float host[4] = {1, 2, 3, 4};
    assert_int_equal(T->allreduce(h, host, 4, 5, 1.0, "x", err, sizeof err), PT_ERR_INVALID_ARG);
    assert_int_equal(T->allgather(h, host, 4, 0, "x", err, sizeof err), PT_ERR_INVALID_ARG);
    assert_int_equal(T->allgather(h, host, 4, 16, "x", err, sizeof err), PT_ERR_INVALID_ARG);
    assert_int_equal(T->allreduce(h, NULL, 4, PT_COLL_F32, 1.0, "x", err, sizeof err),
                     PT_ERR_INVALID_ARG);
    /* a buffer on device 2 for a communicator on device 1 */
    void *d = NULL;
    cudaSetDevice(2);
    cudaMalloc(&d, 64);
    cudaSetDevice(0);
    assert_int_equal(T->allreduce(h, d, 4, PT_COLL_F32, 1.0, "misplaced", err, sizeof err),
                     PT_ERR_INVALID_ARG);
    if (!strstr(err, "on CUDA device 2 but this rank's communicator is on device 1"))
        fail_msg("'%s'", err);
    int now = -1;
    cudaGetDevice(&now);
    assert_int_equal(now, 0);   /* restored after the refusal */
    cudaFree(d);
    /* the mirror that stages a host buffer does not fit */
    sim_malloc_limit = 8;
    assert_int_equal(T->allreduce(h, host, 4, PT_COLL_F32, 1.0, "big host buffer", err,
                                  sizeof err),
                     PT_ERR_OOM);
    if (!strstr(err, "stage a host buffer")) fail_msg("mirror: '%s'", err);
    sim_malloc_limit = (size_t)1 << 40;
    /* and after that refusal (nothing was enqueued) the group still works */
    assert_int_equal(T->allreduce(h, host, 4, PT_COLL_F32, 0.5, "ok", err, sizeof err), PT_OK);
    assert_true(host[0] == 0.5f && host[3] == 2.0f);
    T->close(h);
    assert_int_equal(sim_live_allocs(), 0);   /* scratch and mirror freed at close */
}

int main(void) {
    char v[64];
    T->describe(v, sizeof v);
    printf("test_nccl_sim: the NCCL transport against a simulated %s\n", v);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_show_order),
        cmocka_unit_test(test_worlds),
        cmocka_unit_test(test_in_progress),
        cmocka_unit_test(test_negative_control_stream_order),
        cmocka_unit_test(test_missing_rank),
        cmocka_unit_test(test_peer_never_arrives),
        cmocka_unit_test(test_async_error),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
