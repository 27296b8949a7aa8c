/*
 * coll_nccl.c — coll.h's collectives over NCCL, for the cuda backend
 * (libprotrain_nccl.so; the plugin loads it through coll_nccl.h only when
 * [dist] picks nccl, so nothing else needs NCCL installed).
 *
 * Determinism. Not ncclAllReduce/ncclReduceScatter: their reduction order is
 * NCCL's (ring, tree, NVLS..., chosen per size and topology), so sums would not
 * match one rank accumulating micro-batches in order, nor a rerun on another
 * machine. Instead:
 *   reduce-scatter: every rank sends peer p the segment of p's part
 *     (pt_coll_part) of its buffer (ncclSend/ncclRecv in one group) into p's
 *     scratch slot for it; the owner then adds the W copies in rank order with
 *     one kernel (nccl/cuda/rank_sum.cu), in place in its own part;
 *   all-gather: every rank sends its part to every peer and receives theirs in
 *     place (bytes: any element type);
 *   all-reduce = reduce-scatter then all-gather of the summed parts.
 * Each element's sum is formed by exactly one rank, in rank order, with the
 * MPI transport's arithmetic (first addend copied, f32 sums in f32, one
 * multiply by scale), so every rank holds the same bits, meant to be the bits
 * the MPI transport gives (IEEE adds in the same order; not yet run on a GPU). Traffic per rank is 2(W-1)/W of the buffer for an
 * all-reduce, what a ring all-reduce moves, though as point-to-point messages
 * NCCL may schedule less well than its own collectives.
 *
 * Deadlines. The communicator is non-blocking (config.blocking = 0): an NCCL
 * call that answers ncclInProgress is polled through ncclCommGetAsyncError,
 * and the enqueued work through cudaStreamQuery, until [dist] timeout has
 * passed since the collective began; then the communicator is aborted
 * (ncclCommAbort ends its kernels), the group is broken and the error names
 * the collective, this rank and the timeout. NCCL does not say which peer is
 * missing, so unlike the MPI transport the error cannot name it.
 *
 * Buffers. The runtime has finished writing a buffer before it calls (it
 * synchronises first), and a call returns only when the result is in the
 * buffer, so the transport's own stream needs no ordering with the backend's
 * streams. Device buffers (of the communicator's device) are used in place;
 * host buffers (the runtime's pinned accumulators, a few doubles on the stack)
 * go through a device mirror that grows to the largest such buffer and is kept.
 * Device memory outside the plugin's reservation: the scratch slots
 * (W x SEG_ELEMS x 8 bytes), the mirror, and NCCL's own buffers.
 *
 * All calls come from the thread that calls the plugin's hooks. Each call sets
 * the communicator's device and restores the caller's current device.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "coll/coll_nccl.h"
#include "protrain.h"
#include "pt_util.h"
#include "rank_sum.h"

/* non-blocking communicators, ncclCommGetAsyncError and ncclConfig_t */
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the NCCL transport needs NCCL >= 2.18 (non-blocking communicators)"
#endif
_Static_assert(sizeof(ncclUniqueId) == PT_NCCL_ID_BYTES, "ncclUniqueId changed size");

/* Elements per scratch slot: a reduce-scatter goes in segments of this many
 * elements of each part, so the scratch is W slots of 2 MiB (f64) whatever
 * the chunk size. */
#define SEG_ELEMS ((size_t)1 << 18)

typedef struct nc {
    int rank, world, device;
    int broken;          /* a collective failed: no further collective; close aborts */
    double timeout_s;
    unsigned seq;        /* collectives so far (error text) */
    ncclComm_t comm;
    cudaStream_t stream;
    void *scratch;       /* [world][SEG_ELEMS] x 8 bytes: peers' segments of our part */
    void *mirror;        /* device copy of a host buffer, mirror_cap bytes */
    size_t mirror_cap;
} nc;

static void pause_briefly(void) {
    /* 100 us: low latency without taking a core from the CPU optimizer */
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

static void describe(char *buf, size_t cap) {
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) v = 0;
    /* NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9 */
    snprintf(buf, cap, "NCCL %d.%d.%d (built against %d.%d.%d)", v / 10000, v / 100 % 100,
             v % 100, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

static int cuda_fail(nc *c, cudaError_t e, const char *call, const char *what, char *err,
                     size_t errlen) {
    if (c) c->broken = 1;
    return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist] %s (NCCL transport, rank %d): %s failed: "
                                                "%s",
                   what, c ? c->rank : -1, call, cudaGetErrorString(e));
}

/* The deadline passed: abort the communicator (its kernels end) and say so. */
static int timed_out(nc *c, const char *stage, const char *what, char *err, size_t errlen) {
    c->broken = 1;
    if (c->comm) ncclCommAbort(c->comm);
    c->comm = NULL;
    return pt_fail(err, errlen, PT_ERR_BACKEND,
                   "[dist] %s (collective %u, NCCL): %s did not complete within [dist] timeout "
                   "= %g s on rank %d of %d; a peer rank exited, hung or fell behind (NCCL does "
                   "not say which); the communicator was aborted and this rank stops",
                   what, c->seq, stage, c->timeout_s, c->rank, c->world);
}

static int nccl_failed(nc *c, ncclResult_t r, const char *call, const char *what, char *err,
                       size_t errlen) {
    const char *last = c->comm ? ncclGetLastError(c->comm) : NULL;
    char detail[256];
    snprintf(detail, sizeof detail, "%s", last && *last ? last : "no detail");
    c->broken = 1;
    if (c->comm) ncclCommAbort(c->comm);
    c->comm = NULL;
    return pt_fail(err, errlen, PT_ERR_BACKEND,
                   "[dist] %s (collective %u, NCCL, rank %d of %d): %s failed: %s (%s)", what,
                   c->seq, c->rank, c->world, call, ncclGetErrorString(r), detail);
}

/* An NCCL call on the non-blocking communicator returned r: ncclInProgress
 * means it is still being enqueued; poll until it is, or the deadline. */
static int nccl_done(nc *c, ncclResult_t r, const char *call, double deadline, const char *what,
                     char *err, size_t errlen) {
    while (r == ncclInProgress) {
        if (pt_now_s() > deadline) return timed_out(c, call, what, err, errlen);
        pause_briefly();
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &r);
        if (q != ncclSuccess) r = q;
    }
    return r == ncclSuccess ? PT_OK : nccl_failed(c, r, call, what, err, errlen);
}

/* Everything enqueued on the stream has run, or the deadline passed, or NCCL
 * reported an asynchronous error (a peer's connection dropped). */
static int finish(nc *c, double deadline, const char *what, char *err, size_t errlen) {
    for (;;) {
        /* NCCL's error first: a stream that drained does not vouch for data a
         * failed connection was to deliver */
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c->comm, &st);
        if (r != ncclSuccess) st = r;
        if (st != ncclSuccess && st != ncclInProgress)
            return nccl_failed(c, st, "the enqueued collective", what, err, errlen);
        cudaError_t q = cudaStreamQuery(c->stream);
        if (q == cudaSuccess) return PT_OK;
        if (q != cudaErrorNotReady) return cuda_fail(c, q, "cudaStreamQuery", what, err, errlen);
        if (pt_now_s() > deadline) return timed_out(c, "the enqueued collective", what, err, errlen);
        pause_briefly();
    }
}

static int unique_id(unsigned char id[PT_NCCL_ID_BYTES], char *err, size_t errlen) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist] ncclGetUniqueId failed on rank 0: %s",
                       ncclGetErrorString(r));
    memcpy(id, u.internal, PT_NCCL_ID_BYTES);
    return PT_OK;
}

static void nc_close(void *h) {
    nc *c = h;
    if (!c) return;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(c->device);
    if (c->comm) {
        if (c->broken) {
            ncclCommAbort(c->comm);
        } else {
            /* flush, then free; bounded by the timeout like every other wait */
            double deadline = pt_now_s() + c->timeout_s;
            ncclResult_t r = ncclCommFinalize(c->comm), st = r;
            while (st == ncclInProgress && pt_now_s() < deadline) {
                pause_briefly();
                if (ncclCommGetAsyncError(c->comm, &st) != ncclSuccess) break;
            }
            if (st == ncclSuccess) ncclCommDestroy(c->comm);
            else ncclCommAbort(c->comm);
        }
    }
    if (c->stream) cudaStreamDestroy(c->stream);
    cudaFree(c->scratch);
    cudaFree(c->mirror);
    cudaSetDevice(prev);
    free(c);
}

static int nc_open(const unsigned char id[PT_NCCL_ID_BYTES], int rank, int world, int device,
                   double timeout_s, void **out, char *err, size_t errlen) {
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] NCCL: rank %d of %d is not a rank",
                       rank, world);
    int ndev = 0, prev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess)
        return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist] NCCL on rank %d: no CUDA device "
                                                    "(cudaGetDeviceCount: %s)",
                       rank, cudaGetErrorString(e));
    if (device < 0 || device >= ndev)
        return pt_fail(err, errlen, PT_ERR_CONFIG, "[dist] NCCL on rank %d: CUDA device %d does "
                                                   "not exist (this machine has %d)",
                       rank, device, ndev);
    nc *c = calloc(1, sizeof *c);
    if (!c) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    c->rank = rank;
    c->world = world;
    c->device = device;
    c->timeout_s = timeout_s;
    cudaGetDevice(&prev);
    const char *what = "communicator set-up";
    int rc = PT_OK;
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        rc = cuda_fail(c, e, "cudaSetDevice", what, err, errlen);
    } else if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        c->stream = NULL;
        rc = cuda_fail(c, e, "cudaStreamCreateWithFlags", what, err, errlen);
    } else if ((e = cudaMalloc(&c->scratch, (size_t)world * SEG_ELEMS * 8)) != cudaSuccess) {
        c->scratch = NULL;
        rc = pt_fail(err, errlen, PT_ERR_OOM, "[dist] NCCL on rank %d: cudaMalloc of %zu "
                                              "bytes of collective scratch failed (%s); leave that much device memory "
                                              "outside [memory] capacity, plus NCCL's own buffers",
                     rank, (size_t)world * SEG_ELEMS * 8, cudaGetErrorString(e));
    } else {
        ncclUniqueId u;
        memcpy(u.internal, id, PT_NCCL_ID_BYTES);
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;   /* every wait is ours, so it can have a deadline */
        double deadline = pt_now_s() + timeout_s;
        ncclResult_t r = ncclCommInitRankConfig(&c->comm, world, u, rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            c->comm = NULL;
            rc = nccl_failed(c, r, "ncclCommInitRankConfig", what, err, errlen);
        } else {
            rc = nccl_done(c, r, "ncclCommInitRankConfig (every rank must join)", deadline, what,
                           err, errlen);
        }
    }
    cudaSetDevice(prev);
    if (rc) {
        nc_close(c);
        return rc;
    }
    *out = c;
    return PT_OK;
}

/* Device pointer for buf: buf itself when it is memory of our device, else
 * the mirror (grown to `bytes`) with buf's bytes copied in on the stream.
 * *staged says which, so the result can be copied back. */
static int stage_in(nc *c, void *buf, size_t bytes, void **dbuf, int *staged, const char *what,
                    char *err, size_t errlen) {
    struct cudaPointerAttributes a;
    *staged = 0;
    *dbuf = buf;
    if (!bytes) return PT_OK;
    if (cudaPointerGetAttributes(&a, buf) != cudaSuccess) {
        (void)cudaGetLastError();   /* an unknown host pointer is not an error for us */
        a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type == cudaMemoryTypeManaged) return PT_OK;
    if (a.type == cudaMemoryTypeDevice) {
        if (a.device != c->device)
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: the buffer is on CUDA "
                                                            "device %d but this rank's communicator is on device %d",
                           what,
                           a.device, c->device);
        return PT_OK;
    }
    if (bytes > c->mirror_cap) {
        cudaFree(c->mirror);
        c->mirror_cap = 0;
        cudaError_t e = cudaMalloc(&c->mirror, bytes);
        if (e != cudaSuccess) {
            c->mirror = NULL;
            return pt_fail(err, errlen, PT_ERR_OOM, "[dist] %s: cudaMalloc of %zu bytes "
                                                    "to stage a host buffer for NCCL failed (%s); leave that much device "
                                                    "memory outside [memory] capacity",
                           what, bytes, cudaGetErrorString(e));
        }
        c->mirror_cap = bytes;
    }
    cudaError_t e = cudaMemcpyAsync(c->mirror, buf, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) return cuda_fail(c, e, "cudaMemcpyAsync (host to device)", what, err, errlen);
    *dbuf = c->mirror;
    *staged = 1;
    return PT_OK;
}

static int stage_out(nc *c, void *buf, size_t bytes, int staged, const char *what, char *err,
                     size_t errlen) {
    if (!staged) return PT_OK;
    cudaError_t e = cudaMemcpyAsync(buf, c->mirror, bytes, cudaMemcpyDeviceToHost, c->stream);
    return e == cudaSuccess ? PT_OK
                            : cuda_fail(c, e, "cudaMemcpyAsync (device to host)", what, err, errlen);
}

/* Inside a group a call may answer ncclInProgress on a non-blocking
 * communicator; the group's end says how it went. */
static int queued(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

static size_t seg_len(size_t part_len, size_t off) {
    if (off >= part_len) return 0;
    return part_len - off < SEG_ELEMS ? part_len - off : SEG_ELEMS;
}

/* Enqueues the reduce-scatter of d (n elements of dtype) on the stream. */
static int enqueue_reduce_scatter(nc *c, char *d, size_t n, int32_t dtype, double scale,
                                  double deadline, const char *what, char *err, size_t errlen) {
    size_t es = dtype == PT_COLL_F64 ? 8 : 4, z, s, lo_me, len_me;
    ncclDataType_t t = dtype == PT_COLL_F64 ? ncclFloat64 : ncclFloat32;
    pt_coll_part(n, c->world, 0, &z, &s);   /* rank 0 holds the longest part */
    pt_coll_part(n, c->world, c->rank, &lo_me, &len_me);
    for (size_t off = 0; off < s; off += SEG_ELEMS) {
        size_t m = seg_len(len_me, off);   /* this segment of our part, from every peer */
        ncclResult_t r = ncclGroupStart();
        for (int p = 0; p < c->world && queued(r); p++) {
            if (p == c->rank) continue;
            size_t lo, len;
            pt_coll_part(n, c->world, p, &lo, &len);
            size_t mp = seg_len(len, off);   /* peer p's part of our buffer goes to p */
            if (mp) r = ncclSend(d + (lo + off) * es, mp, t, p, c->comm, c->stream);
            if (m && queued(r))
                r = ncclRecv((char *)c->scratch + (size_t)p * SEG_ELEMS * es, m, t, p, c->comm,
                             c->stream);
        }
        ncclResult_t g = ncclGroupEnd();
        if (queued(r)) r = g;
        int rc = nccl_done(c, r, "ncclSend/ncclRecv (reduce-scatter)", deadline, what, err, errlen);
        if (rc) return rc;
        /* stream order: the sum reads the slots after the receives, and the next
         * segment's receives overwrite them after the sum */
        int ce = pt_nccl_rank_sum(d + (lo_me + off) * es, c->scratch, SEG_ELEMS, c->rank, c->world,
                                  m, dtype, scale, c->stream);
        if (ce) return cuda_fail(c, (cudaError_t)ce, "the rank-order sum kernel", what, err, errlen);
    }
    return PT_OK;
}

/* Enqueues the all-gather of d's parts (n elements of es bytes). */
static int enqueue_allgather(nc *c, char *d, size_t n, size_t es, double deadline,
                             const char *what, char *err, size_t errlen) {
    size_t lo_me, len_me;
    pt_coll_part(n, c->world, c->rank, &lo_me, &len_me);
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < c->world && queued(r); p++) {
        if (p == c->rank) continue;
        size_t lo, len;
        pt_coll_part(n, c->world, p, &lo, &len);
        /* bytes: a copy does not care about the element type */
        if (len_me) r = ncclSend(d + lo_me * es, len_me * es, ncclUint8, p, c->comm, c->stream);
        if (len && queued(r))
            r = ncclRecv(d + lo * es, len * es, ncclUint8, p, c->comm, c->stream);
    }
    ncclResult_t g = ncclGroupEnd();
    if (queued(r)) r = g;
    return nccl_done(c, r, "ncclSend/ncclRecv (all-gather)", deadline, what, err, errlen);
}

/* What every collective does first: refuse on a broken group, count it, take
 * the device. */
static int begin(nc *c, const char *what, int *prev, char *err, size_t errlen) {
    if (c->broken || !c->comm)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] %s: an earlier collective failed; the group is broken", what);
    c->seq++;
    cudaGetDevice(prev);
    cudaError_t e = cudaSetDevice(c->device);
    return e == cudaSuccess ? PT_OK : cuda_fail(c, e, "cudaSetDevice", what, err, errlen);
}

enum { OP_ALLREDUCE,
       OP_ALLGATHER,
       OP_REDUCE_SCATTER };

static int run(nc *c, int op, void *buf, size_t n, int32_t dtype, size_t elem_size, double scale,
               const char *what, char *err, size_t errlen) {
    if (op != OP_ALLGATHER && dtype != PT_COLL_F32 && dtype != PT_COLL_F64)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: dtype %d is not f32 or f64",
                       what, (int)dtype);
    if (op == OP_ALLGATHER && (!elem_size || elem_size > 8))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: all-gather of %zu-byte "
                                                        "elements",
                       what, elem_size);
    if (n && !buf)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: %zu elements from NULL", what,
                       n);
    size_t es = op == OP_ALLGATHER ? elem_size : dtype == PT_COLL_F64 ? 8
                                                                      : 4;
    int prev = 0, staged = 0;
    int rc = begin(c, what, &prev, err, errlen);
    if (rc) return rc;
    double deadline = pt_now_s() + c->timeout_s;
    void *d = NULL;
    rc = stage_in(c, buf, n * es, &d, &staged, what, err, errlen);
    if (!rc && op != OP_ALLGATHER)
        rc = enqueue_reduce_scatter(c, d, n, dtype, scale, deadline, what, err, errlen);
    if (!rc && op != OP_REDUCE_SCATTER)
        rc = enqueue_allgather(c, d, n, es, deadline, what, err, errlen);
    if (!rc) rc = stage_out(c, buf, n * es, staged, what, err, errlen);
    if (!rc) rc = finish(c, deadline, what, err, errlen);
    cudaSetDevice(prev);
    return rc;
}

static int nc_allreduce(void *h, void *buf, size_t n, int32_t dtype, double scale,
                        const char *what, char *err, size_t errlen) {
    return run(h, OP_ALLREDUCE, buf, n, dtype, 0, scale, what, err, errlen);
}

static int nc_allgather(void *h, void *buf, size_t n, size_t elem_size, const char *what,
                        char *err, size_t errlen) {
    return run(h, OP_ALLGATHER, buf, n, 0, elem_size, 1.0, what, err, errlen);
}

static int nc_reduce_scatter(void *h, void *buf, size_t n, int32_t dtype, double scale,
                             const char *what, char *err, size_t errlen) {
    return run(h, OP_REDUCE_SCATTER, buf, n, dtype, 0, scale, what, err, errlen);
}

/* One element all-reduced in the scratch: rank 0 hears from every rank before
 * it sends the sum back, so no rank returns before all have arrived. */
static int nc_barrier(void *h, char *err, size_t errlen) {
    nc *c = h;
    if (c->broken || !c->scratch)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] barrier: an earlier collective failed; the group is broken");
    float *one = (float *)((char *)c->scratch + (size_t)c->rank * SEG_ELEMS * 8);
    return run(c, OP_ALLREDUCE, one, 1, PT_COLL_F32, 0, 1.0, "barrier", err, errlen);
}

__attribute__((visibility("default"))) const pt_nccl_coll_ops pt_nccl_coll_v1 = {
    PT_NCCL_COLL_VERSION,
    (uint32_t)sizeof(pt_nccl_coll_ops),
    describe,
    unique_id,
    nc_open,
    nc_close,
    nc_allreduce,
    nc_allgather,
    nc_reduce_scatter,
    nc_barrier,
};
