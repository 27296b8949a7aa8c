/*
 * test_coll.c — the sharded collectives of gpu/coll/coll.h over MPI, run by
 * tests/dist.sh under mpirun with 2 and 3 ranks (alone, outside mpirun, it
 * says it is skipped: collectives need ranks).
 *
 * Oracles, for buffer lengths around every edge (empty, shorter than the rank
 * count, not a multiple of it, several 4 MiB segments with a ragged tail):
 *  - pt_coll_part: the parts tile [0, n) in rank order, each ceil(n/W) long but
 *    the tail ones;
 *  - all-gather: every element of every rank's part arrives, for 2-, 4- and
 *    8-byte elements (values are a function of rank and index, checked exactly);
 *  - all-gather of ranges: a window of a sharded buffer (its parts cut to the
 *    window) arrives whole on every rank, and the bytes around it stay;
 *  - reduce-scatter: this rank's part equals, bit for bit, the rank-order fp32
 *    sum times the scale computed here from every rank's values (each rank can
 *    generate them all), and equals what pt_coll_allreduce leaves there; the
 *    rest of the buffer is untouched;
 *  - personalised exchange (pt_coll_alltoallv, and pt_coll_alltoallv_gathered,
 *    the nccl transport's way, checked here over MPI): per pair of ranks its
 *    own byte count (zero, odd, and one pair above the 8 MiB message segment),
 *    sent from scattered offsets and received at others: every byte arrives
 *    where its receiver asked for it (values a function of sender, receiver and
 *    index), the gaps between receive ranges stay; and a count one rank
 *    disagrees with is refused with a sentence on every rank (gathered form).
 *  - sub-groups (pt_coll_split, mpi transport): ranks split by parity with keys
 *    that reverse their order; each sub-group's size and ranks follow the keys,
 *    its all-reduce is the fp32 sum over exactly its members in its own rank
 *    order (computed here), and its all-gather moves its members' parts; the
 *    parent still works after the split. On nccl the split is refused with a
 *    sentence (not built there).
 *  - keyed nonblocking all-reduce: every buffer length at once, started in
 *    ascending key order on even ranks and descending on odd ones, with a
 *    blocking all-reduce run while they are in flight: each buffer equals, bit
 *    for bit, the rank-order sum computed here and what pt_coll_allreduce
 *    leaves; a key out of range is refused before any message. (On NCCL the
 *    operation is a blocking all-reduce at the start, so the orders must agree
 *    there: this case runs with the MPI transport only.)
 *
 *  - the ranks' agreement (runtime/core/dist_agree.h, pt_agree_texts): equal
 *    texts pass; a text that differs on the last rank (a value, an extra
 *    line), on several ranks (the lowest one is named), or deep inside a long
 *    text (padding of the gathered texts) is refused on every rank with the
 *    same sentence naming the first differing field and both values.
 *
 * The same oracles check the NCCL transport on a machine with GPUs
 * (tests/gpu/nccl.sh): PT_TEST_COLL_TRANSPORT=nccl picks it (rank r on CUDA
 * device OMPI_COMM_WORLD_LOCAL_RANK, PT_TEST_COLL_INIT as init_method), and
 * PT_TEST_COLL_DEVICE=1 hands it buffers in device memory (opened through the
 * cuda backend) instead of host memory, so both of its paths (in place on the
 * device, staged from the host) meet the rank-order oracle. The MPI transport's
 * bits and NCCL's must be the same: both are compared with the sum formed here.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "core/dist_agree.h"
#include "gpu.h"
#include "protrain.h"

static pt_coll *C;
static int W, R;
static pt_gpu *G;   /* PT_TEST_COLL_DEVICE=1: device buffers from the cuda backend */

/* The collectives' view of a host buffer: itself, or (G) a device copy of it
 * that back() copies home and frees. */
static void *there(void *host, size_t bytes) {
    if (!G || !bytes) return host;
    void *d = NULL;
    char err[512];
    if (pt_gpu_alloc(G, bytes, PT_TAG_BUFFER, &d, err, sizeof err)) fail_msg("device alloc: %s", err);
    if (pt_gpu_memcpy(G, d, host, bytes, PT_GPU_H2D)) fail_msg("copy to the device failed");
    return d;
}
static void back(void *host, void *d, size_t bytes) {
    if (d == host) return;
    if (pt_gpu_memcpy(G, host, d, bytes, PT_GPU_D2H)) fail_msg("copy from the device failed");
    pt_gpu_free(G, d);
}

#define SEG ((size_t)1 << 20)
static const size_t LENS[] = {0, 1, 2, 3, 5, 64, 1001, 3 * SEG + 7};
#define NLENS (sizeof LENS / sizeof LENS[0])

/* A float that depends on rank and index, with varied exponents so the sum
 * order matters. */
static float val(int rank, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    float m = (float)(h & 0xffff) / 65536.0f - 0.5f;
    return m * (float)(1u << (h >> 28));
}

static void test_parts(void **s) {
    (void)s;
    for (size_t k = 0; k < NLENS; k++)
        for (int w = 1; w <= 5; w++) {
            size_t n = LENS[k], next = 0, sz = (n + (size_t)w - 1) / (size_t)w;
            for (int p = 0; p < w; p++) {
                size_t lo, len;
                pt_coll_part(n, w, p, &lo, &len);
                if (len) assert_int_equal(lo, next);
                assert_true(len <= sz);
                next = len ? lo + len : next;
            }
            assert_int_equal(next, n);
        }
}

static void test_allgather(void **s) {
    (void)s;
    char err[512];
    static const size_t es[3] = {2, 4, 8};
    for (size_t k = 0; k < NLENS; k++)
        for (int e = 0; e < 3; e++) {
            size_t n = LENS[k], b = es[e];
            unsigned char *buf = malloc(n * b + 1);
            assert_non_null(buf);
            memset(buf, 0xEE, n * b);
            size_t lo, len;
            pt_coll_part(n, W, R, &lo, &len);
            for (size_t i = lo; i < lo + len; i++)
                for (size_t j = 0; j < b; j++) buf[i * b + j] = (unsigned char)(i * 31 + j * 7 + b);
            void *d = there(buf, n * b);
            int rc = pt_coll_allgather(C, d, n, b, "test all-gather", err, sizeof err);
            if (rc) fail_msg("all-gather of %zu x %zu bytes: %s", n, b, err);
            back(buf, d, n * b);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < b; j++)
                    bad += buf[i * b + j] != (unsigned char)(i * 31 + j * 7 + b);
            if (bad) fail_msg("all-gather of %zu x %zu bytes: %zu wrong bytes", n, b, bad);
            free(buf);
        }
}

/* The parts of a window [e0, e0 + m) of an n-element sharded buffer (what a
 * parameter inside a chunk's region is): each rank's pt_coll_part of n cut to
 * the window; every rank's elements of the window must arrive everywhere, and
 * nothing outside it may be written. */
static void test_allgather_ranges(void **s) {
    (void)s;
    char err[512];
    for (size_t k = 0; k < NLENS; k++)
        for (int cut = 0; cut < 3; cut++) {
            size_t n = LENS[k], e0 = cut == 0 ? 0 : cut == 1 ? n / 3
                                                             : n / 2 + (n > 2);
            size_t m = cut == 0 ? n : cut == 1 ? n / 2
                                               : n - (e0 < n ? e0 : n);
            if (e0 > n) e0 = n;
            if (e0 + m > n) m = n - e0;
            size_t *lo = malloc(2 * sizeof(size_t) * (size_t)W), *len = lo + W;
            float *buf = malloc(m * 4 + 8);   /* one guard float each side */
            assert_non_null(lo);
            assert_non_null(buf);
            float guard = -7.25f;
            buf[0] = buf[m + 1] = guard;
            for (size_t i = 0; i < m; i++) buf[1 + i] = NAN;
            for (int p = 0; p < W; p++) {
                size_t plo, plen;
                pt_coll_part(n, W, p, &plo, &plen);
                size_t a = e0 > plo ? e0 : plo, b = e0 + m < plo + plen ? e0 + m : plo + plen;
                lo[p] = b > a ? a - e0 : 0;
                len[p] = b > a ? b - a : 0;
            }
            for (size_t i = lo[R]; i < lo[R] + len[R]; i++) buf[1 + i] = val(7, e0 + i);
            int rc = pt_coll_allgather_ranges(C, buf + 1, lo, len, 4, "test ranges", err,
                                              sizeof err);
            if (rc) fail_msg("all-gather of the window [%zu, %zu) of %zu: %s", e0, e0 + m, n, err);
            size_t bad = 0;
            for (size_t i = 0; i < m; i++) {
                float want = val(7, e0 + i);
                bad += memcmp(&buf[1 + i], &want, 4) != 0;
            }
            if (bad || memcmp(&buf[0], &guard, 4) || memcmp(&buf[m + 1], &guard, 4))
                fail_msg("all-gather of the window [%zu, %zu) of %zu on rank %d of %d: %zu wrong "
                         "elements, guards %s",
                         e0, e0 + m, n, R, W, bad,
                         memcmp(&buf[0], &guard, 4) || memcmp(&buf[m + 1], &guard, 4)
                             ? "overwritten"
                             : "intact");
            free(lo);
            free(buf);
        }
}

/* Bytes rank p sends rank q in case k (8 MiB is the MPI transport's segment). */
static size_t a2a_count(int k, int p, int q) {
    if (k == 0) return 0;
    if (k == 1) return (size_t)((p * W + q) % 4) * 37 + (p == q ? 5 : 0);
    return q == (p + 1) % W ? ((size_t)9 << 20) + 3 : 11 + (size_t)p;
}
static unsigned char a2a_byte(int p, int q, size_t i) {
    return (unsigned char)(i * 131 + (size_t)p * 17 + (size_t)q * 5 + 1);
}

static void a2a_case(int k, int gathered) {
    char err[512];
    size_t soff[64], scount[64], roff[64], rcount[64], sb = 0, rb = 3;
    assert_true(W <= 64);
    for (int q = 0; q < W; q++) {   /* send ranges in rank order, 5 bytes apart */
        soff[q] = sb;
        scount[q] = a2a_count(k, R, q);
        sb += scount[q] + 5;
    }
    for (int p = W - 1; p >= 0; p--) {   /* receive ranges in reverse order, 3 apart */
        roff[p] = rb;
        rcount[p] = a2a_count(k, p, R);
        rb += rcount[p] + 3;
    }
    unsigned char *snd = malloc(sb + 1), *rcv = malloc(rb + 1);
    assert_non_null(snd);
    assert_non_null(rcv);
    memset(snd, 0xAB, sb);
    memset(rcv, 0xCD, rb);
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < scount[q]; i++) snd[soff[q] + i] = a2a_byte(R, q, i);
    int rc = gathered ? pt_coll_alltoallv_gathered(C, snd, soff, scount, rcv, roff, rcount,
                                                   "test exchange", err, sizeof err)
                      : pt_coll_alltoallv(C, snd, soff, scount, rcv, roff, rcount,
                                          "test exchange", err, sizeof err);
    if (rc) fail_msg("exchange case %d (%s): %s", k, gathered ? "gathered" : "direct", err);
    size_t bad = 0, gap = 0;
    size_t pos = 0;
    for (int p = W - 1; p >= 0; p--) {
        for (; pos < roff[p]; pos++) gap += rcv[pos] != 0xCD;
        for (size_t i = 0; i < rcount[p]; i++) bad += rcv[roff[p] + i] != a2a_byte(p, R, i);
        pos = roff[p] + rcount[p];
    }
    for (; pos < rb; pos++) gap += rcv[pos] != 0xCD;
    if (bad || gap)
        fail_msg("exchange case %d (%s) on rank %d of %d: %zu wrong bytes, %zu gap bytes "
                 "written",
                 k, gathered ? "gathered" : "direct", R, W, bad, gap);
    free(snd);
    free(rcv);
}

static void test_alltoallv(void **s) {
    (void)s;
    for (int k = 0; k < 3; k++)
        for (int g = 0; g < 2; g++) a2a_case(k, g);
    /* rank 0 expects one byte more from rank 1 than rank 1 sends: every rank
     * refuses, naming the pair, before any byte moves */
    if (W < 2) return;
    size_t soff[64] = {0}, scount[64] = {0}, roff[64] = {0}, rcount[64] = {0};
    unsigned char snd[8] = {0}, rcv[8] = {0};
    scount[0] = R == 1 ? 2 : 0;
    rcount[1] = R == 0 ? 3 : 0;
    char err[512] = "";
    int rc = pt_coll_alltoallv_gathered(C, snd, soff, scount, rcv, roff, rcount,
                                        "test mismatch", err, sizeof err);
    assert_int_equal(rc, PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "rank 1 sends 2 bytes to rank 0, which expects 3"));
}

static void test_reduce_scatter(void **s) {
    (void)s;
    char err[512];
    for (size_t k = 0; k < NLENS; k++) {
        size_t n = LENS[k];
        float *buf = malloc(n * 4 + 4), *ar = malloc(n * 4 + 4);
        assert_non_null(buf);
        assert_non_null(ar);
        for (size_t i = 0; i < n; i++) buf[i] = ar[i] = val(R, i);
        double scale = 1.0 / W;
        void *d = there(buf, n * 4);
        int rc = pt_coll_reduce_scatter(C, d, n, PT_COLL_F32, scale, "test reduce-scatter", err,
                                        sizeof err);
        if (rc) fail_msg("reduce-scatter of %zu floats: %s", n, err);
        back(buf, d, n * 4);
        d = there(ar, n * 4);
        rc = pt_coll_allreduce(C, d, n, PT_COLL_F32, scale, "test all-reduce", err, sizeof err);
        if (rc) fail_msg("all-reduce of %zu floats: %s", n, err);
        back(ar, d, n * 4);
        size_t lo, len, bad_sum = 0, bad_ar = 0, bad_rest = 0;
        pt_coll_part(n, W, R, &lo, &len);
        for (size_t i = 0; i < n; i++) {
            if (i < lo || i >= lo + len) {
                float v = val(R, i);
                bad_rest += memcmp(&buf[i], &v, 4) != 0;
                continue;
            }
            float want = val(0, i);
            for (int q = 1; q < W; q++) want += val(q, i);
            want *= (float)scale;
            bad_sum += memcmp(&buf[i], &want, 4) != 0;
            bad_ar += memcmp(&buf[i], &ar[i], 4) != 0;
        }
        if (bad_sum || bad_ar || bad_rest)
            fail_msg("reduce-scatter of %zu floats on rank %d of %d: %zu elements differ from the "
                     "rank-order sum, %zu from the all-reduce, %zu outside the part changed",
                     n, R, W, bad_sum, bad_ar, bad_rest);
        free(buf);
        free(ar);
    }
}

static void test_split(void **s) {
    (void)s;
    char err[512];
    pt_coll *sub = NULL;
    int color = R % 2;
    /* key -R: the group's ranks in reverse order of their world ranks */
    int rc = pt_coll_split(C, color, -R, &sub, err, sizeof err);
    if (!strcmp(pt_coll_transport(C), "nccl")) {
        assert_int_equal(rc, PT_ERR_UNSUPPORTED);
        assert_non_null(strstr(err, "nccl"));
        return;
    }
    if (rc) fail_msg("split: %s", err);
    int members[64], nm = 0;   /* world ranks of this group, in group rank order */
    for (int q = W - 1; q >= 0; q--)
        if (q % 2 == color) members[nm++] = q;
    assert_int_equal(pt_coll_world(sub), nm);
    assert_int_equal(members[pt_coll_rank(sub)], R);
    size_t n = 1001;
    float *buf = malloc(n * 4);
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++) buf[i] = val(R, i);
    double scale = 1.0 / nm;
    rc = pt_coll_allreduce(sub, buf, n, PT_COLL_F32, scale, "test sub all-reduce", err, sizeof err);
    if (rc) fail_msg("sub all-reduce: %s", err);
    size_t bad = 0, other = 0;
    for (size_t i = 0; i < n; i++) {
        float want = val(members[0], i);
        for (int q = 1; q < nm; q++) want += val(members[q], i);
        want *= (float)scale;
        bad += memcmp(&buf[i], &want, 4) != 0;
        /* control: the mean over every rank is another value (3+ ranks) */
        float all = val(0, i);
        for (int q = 1; q < W; q++) all += val(q, i);
        all *= (float)(1.0 / W);
        other += memcmp(&buf[i], &all, 4) != 0;
    }
    if (bad) fail_msg("sub all-reduce on rank %d: %zu of %zu elements differ", R, bad, n);
    if (W >= 3) assert_true(other > n / 2);
    /* all-gather: part p of the group comes from its member p */
    for (size_t i = 0; i < n; i++) buf[i] = -1.0f;
    size_t lo, len;
    pt_coll_part(n, nm, pt_coll_rank(sub), &lo, &len);
    for (size_t i = lo; i < lo + len; i++) buf[i] = (float)(R * 10000 + (int)i);
    rc = pt_coll_allgather(sub, buf, n, 4, "test sub all-gather", err, sizeof err);
    if (rc) fail_msg("sub all-gather: %s", err);
    bad = 0;
    for (int p = 0; p < nm; p++) {
        pt_coll_part(n, nm, p, &lo, &len);
        for (size_t i = lo; i < lo + len; i++) bad += buf[i] != (float)(members[p] * 10000 + (int)i);
    }
    if (bad) fail_msg("sub all-gather on rank %d: %zu wrong elements", R, bad);
    free(buf);
    pt_coll_close(sub);
    /* the parent still sums over everyone */
    double one = 1.0;
    rc = pt_coll_allreduce(C, &one, 1, PT_COLL_F64, 1.0, "test parent after split", err, sizeof err);
    if (rc) fail_msg("parent after split: %s", err);
    assert_true(one == (double)W);
}

static void test_iallreduce(void **s) {
    (void)s;
    /* NCCL runs it as a blocking all-reduce at the start: opposite orders would
     * deadlock there by design (the store never buckets on NCCL) */
    if (strcmp(pt_coll_transport(C), "mpi")) skip();
    char err[512];
    float *buf[NLENS], *ar[NLENS];
    pt_coll_op *op[NLENS];
    double scale = 1.0 / W;
    for (size_t k = 0; k < NLENS; k++) {
        size_t n = LENS[k];
        buf[k] = malloc(n * 4 + 4);
        ar[k] = malloc(n * 4 + 4);
        assert_non_null(buf[k]);
        assert_non_null(ar[k]);
        for (size_t i = 0; i < n; i++) buf[k][i] = ar[k][i] = val(R, i) * (float)(k + 1);
    }
    /* the ranks start them in opposite orders: matched by key, not by order */
    for (size_t j = 0; j < NLENS; j++) {
        size_t k = R % 2 ? NLENS - 1 - j : j;
        int rc = pt_coll_iallreduce(C, buf[k], LENS[k], PT_COLL_F32, scale, (int32_t)(100 + k),
                                    "test iallreduce", &op[k], err, sizeof err);
        if (rc) fail_msg("iallreduce of %zu floats: %s", LENS[k], err);
    }
    /* a blocking collective in between (its own tags) */
    double one = 1;
    if (pt_coll_allreduce(C, &one, 1, PT_COLL_F64, 1.0, "test in between", err, sizeof err))
        fail_msg("blocking all-reduce among nonblocking ones: %s", err);
    assert_true(one == W);
    for (size_t k = 0; k < NLENS; k++) {
        int done = 0;
        if (pt_coll_op_test(C, op[k], &done, err, sizeof err)) fail_msg("test: %s", err);
        if (!done && pt_coll_op_wait(C, op[k], err, sizeof err)) fail_msg("wait: %s", err);
        pt_coll_op_free(C, op[k]);
        size_t n = LENS[k];
        if (pt_coll_allreduce(C, ar[k], n, PT_COLL_F32, scale, "test all-reduce", err, sizeof err))
            fail_msg("all-reduce of %zu floats: %s", n, err);
        size_t bad_sum = 0, bad_ar = 0;
        for (size_t i = 0; i < n; i++) {
            float want = val(0, i) * (float)(k + 1);
            for (int q = 1; q < W; q++) want += val(q, i) * (float)(k + 1);
            want *= (float)scale;
            bad_sum += memcmp(&buf[k][i], &want, 4) != 0;
            bad_ar += memcmp(&buf[k][i], &ar[k][i], 4) != 0;
        }
        if (bad_sum || bad_ar)
            fail_msg("iallreduce of %zu floats on rank %d of %d: %zu elements differ from the "
                     "rank-order sum, %zu from the blocking all-reduce",
                     n, R, W, bad_sum, bad_ar);
        free(buf[k]);
        free(ar[k]);
    }
    /* bad input is refused with a sentence, before any message */
    pt_coll_op *o = NULL;
    assert_int_equal(pt_coll_iallreduce(C, NULL, 0, PT_COLL_F32, 1.0, PT_COLL_KEYS, "bad key", &o,
                                        err, sizeof err),
                     PT_ERR_INVALID_ARG);
    assert_null(o);
    assert_non_null(strstr(err, "key"));
}

/* Every rank must get rc and a sentence containing want. */
static void agree_case(const char *label, const char *text, int rc_want, const char *want) {
    char err[1024] = "";
    int rc = pt_agree_texts(C, "test", text, err, sizeof err);
    if (rc != rc_want) fail_msg("agreement, %s: rc %d, want %d (%s)", label, rc, rc_want, err);
    if (want && !strstr(err, want))
        fail_msg("agreement, %s: '%s' does not say '%s'", label, err, want);
}

static void test_agree(void **s) {
    (void)s;
    char want[256];
    agree_case("equal texts", "a=1\nb=2\nc=3\n", PT_OK, NULL);
    const int last = W - 1;
    snprintf(want, sizeof want, "test: rank %d disagrees with rank 0 on b: 7 vs 2", last);
    agree_case("a value on the last rank, named",
               R == last ? "a=1\nb=7\nc=3\n" : "a=1\nb=2\nc=3\n", PT_ERR_CONFIG, want);
    snprintf(want, sizeof want, "rank %d disagrees with rank 0 on d: rank %d has d=4, rank 0 has "
                                "no such field",
             last, last);
    agree_case("an extra line", R == last ? "a=1\nb=2\nc=3\nd=4\n" : "a=1\nb=2\nc=3\n",
               PT_ERR_CONFIG, want);
    /* every rank r > 0 differs in its own line: rank 1, the lowest, is named */
    char t[64];
    snprintf(t, sizeof t, "a=1\nb=2\nline%d=%d\n", R > 0 ? R : 0, R > 0 ? R + 10 : 0);
    agree_case("several ranks", t, PT_ERR_CONFIG,
               "rank 1 disagrees with rank 0 on line1: rank 1 has line1=11 where rank 0 has "
               "line0=0");
    /* 5000 lines, the last rank's line 4321 changed: the texts are padded to
     * the longest when gathered */
    size_t cap = 5000 * 24, o = 0;
    char *big = malloc(cap);
    assert_non_null(big);
    for (int i = 0; i < 5000; i++)
        o += (size_t)snprintf(big + o, cap - o, "p[%d]=%d\n", i,
                              i == 4321 && R == last ? 999999 : i);
    snprintf(want, sizeof want, "rank %d disagrees with rank 0 on p[4321]: 999999 vs 4321", last);
    agree_case("a long text", big, PT_ERR_CONFIG, want);
    free(big);
}

int main(void) {
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *rs = getenv("OMPI_COMM_WORLD_RANK");
    if (!ws || !rs) {
        printf("test_coll: skipped: run under mpirun (tests/dist.sh does)\n");
        return 0;
    }
    const char *tr = getenv("PT_TEST_COLL_TRANSPORT"), *init = getenv("PT_TEST_COLL_INIT");
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK"), *b = getenv("PT_BUILD");
    const char *dev = getenv("PT_TEST_COLL_DEVICE");
    /* overrides for the GPU script's failure checks: the deadline, and every
     * rank on one device (NCCL must refuse that with an error, not hang) */
    const char *to = getenv("PT_TEST_COLL_TIMEOUT"), *di = getenv("PT_TEST_COLL_DEVICE_INDEX");
    char lib[4096];
    snprintf(lib, sizeof lib, "%s/libprotrain_nccl.so", b ? b : "build");
    pt_coll_config cfg = {atoi(ws), atoi(rs), init && *init ? init : "env",
                          to && *to ? atof(to) : 60.0, -1, tr && *tr ? tr : "mpi",
                          di && *di ? atoi(di) : local ? atoi(local)
                                                       : 0,
                          lib, NULL};
    char err[512];
    if (dev && !strcmp(dev, "1")) {
        pt_gpu_config gc = {0};
        gc.device_index = cfg.device_index;
        gc.capacity = (uint64_t)256 << 20;   /* 3 x (3 MiB x 4 + 7) floats at most at once */
        if (pt_gpu_open("cuda", &gc, &G, err, sizeof err)) {
            fprintf(stderr, "test_coll: PT_TEST_COLL_DEVICE=1: %s\n", err);
            return 1;
        }
    }
    if (pt_coll_open(&cfg, &C, err, sizeof err)) {
        fprintf(stderr, "test_coll: %s\n", err);
        pt_gpu_close(G);
        return 1;
    }
    printf("test_coll: rank %d of %d over %s, %s buffers\n", pt_coll_rank(C), pt_coll_world(C),
           pt_coll_transport(C), G ? "device" : "host");
    W = pt_coll_world(C);
    R = pt_coll_rank(C);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parts),
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_allgather_ranges),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_alltoallv),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_iallreduce),
        cmocka_unit_test(test_agree),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pt_coll_close(C);
    pt_gpu_close(G);
    return rc;
}
