/*
 * backend.cu — pt_gpu_backend on the CUDA runtime (libprotrain_cuda.so).
 *
 * Thin by design: accounting, capacity and error sentences for allocations live
 * in the shared pt_gpu layer (gpu/); this file maps each op to one CUDA call, and
 * the kernels run the element bodies of gpu/kernels_hd.h so the GPU computes what
 * the host-backend tests check.
 *
 * Conventions:
 *  - pt_stream* is a cudaStream_t, pt_event* a cudaEvent_t (both are pointers).
 *  - A NULL pt_stream means "synchronous": the work goes on the calling thread's
 *    per-thread default stream and the op waits for it before returning.
 *  - Ops return 0 or a pt_status: PT_ERR_OOM / PT_ERR_HOST_OOM for failed device /
 *    pinned allocations, PT_ERR_BACKEND for any other CUDA error. A status code
 *    cannot say which CUDA call failed or why, so each failure also sends one
 *    sentence naming the call and CUDA's error to the log sink the device wrapper
 *    installs with set_log (its pt_gpu log hook). Never aborts.
 *  - Every op selects the opened device on the calling thread for its own calls
 *    (the runtime's current device is per host thread, and the plugin's workers
 *    are other threads) and puts the caller's current device back before it
 *    returns: the host's CUDA state stays the host's.
 *  - A sticky error (an illegal address, a kernel fault: the CUDA context cannot
 *    be used again) is reported once as fatal; every later op then fails at once
 *    with PT_ERR_BACKEND naming it instead of retrying on a dead context.
 *  - Arguments are checked as the host backend checks them (NULL pointers with a
 *    non-zero size, unknown dtypes or copy kinds: PT_ERR_INVALID_ARG), so a bad
 *    call fails the same way on both devices.
 *  - Built with -fmad=false: nvcc would otherwise contract a*b+c into one
 *    rounding (FMA), and the AdamW body would give other bits than the CPU's,
 *    which never contracts. With it, every kernel here gives the CPU's bits.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <atomic>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "gpu.h"
#include "protrain.h"
}
#include "kernels_hd.h"
#include "pt_util.h"

#define PT_EXPORT __attribute__((visibility("default")))

namespace {

struct cuda_impl {
    int dev;
    int n_sm;             /* multiprocessors: sizes the grid of grid-stride kernels */
    size_t total;         /* totalGlobalMem */
    char name[320];       /* "<prop.name> (cuda:N, sm_XY)"; prop.name is 256 bytes */
    pt_gpu_log_fn log;    /* set_log: where failures are reported; NULL = nowhere yet */
    void *log_user;
    std::atomic<int> dead;  /* 1 once a sticky error was seen (dead_msg written first) */
    char dead_msg[200];
    /* sqnorm's per-block partial sums: one buffer of max_blocks doubles per stream
     * that ever ran a sqnorm (work on one stream is FIFO, so its calls can share
     * one), allocated at first use and freed at close */
    std::mutex mu;
    static constexpr int kMaxScratch = 64;
    int n_scratch;
    cudaStream_t scratch_stream[kMaxScratch];
    double *scratch[kMaxScratch];
    std::mutex null_mu;     /* NULL-stream sqnorms of different threads share a buffer */
    /* cuBLAS / cuSOLVER handles (created at first use; a handle is bound to one
     * stream at a time, so calls through it hold la_mu) */
    std::mutex la_mu;
    cublasHandle_t blas;
    cusolverDnHandle_t solver;
};

constexpr int kThreads = 256;

/* Hand one failure sentence to the wrapper's log and pass its status through. */
int report(void *impl, int code, const char *msg) {
    const cuda_impl *c = (const cuda_impl *)impl;
    if (c && c->log) c->log(c->log_user, PT_LOG_ERROR, msg);
    return code;
}

/* Errors after which the context is unusable: every later CUDA call in the
 * process returns them again. */
bool sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorUnknown:
        return true;
    default:
        return false;
    }
}

/* Report a CUDA failure and map it to a pt_status. A plain error is cleared so
 * the next call does not see it again; a sticky one marks the context dead. */
int fail(void *impl, const char *op, cudaError_t e) {
    (void)cudaGetLastError();
    cuda_impl *c = (cuda_impl *)impl;
    char msg[320];
    int rc;
    if (sticky(e) && c) {
        rc = pt_fail(msg, sizeof msg, PT_ERR_BACKEND,
                     "cuda backend: %s failed: %s (%s); the CUDA context cannot be used again "
                     "in this process",
                     op, cudaGetErrorString(e), cudaGetErrorName(e));
        int was = 0;
        if (c->dead.load(std::memory_order_acquire) == 0) {
            snprintf(c->dead_msg, sizeof c->dead_msg, "%s in %s", cudaGetErrorName(e), op);
            was = c->dead.exchange(1, std::memory_order_acq_rel);
        } else {
            was = 1;
        }
        if (was) return rc;   /* reported once, by the first to see it */
        if (c->log) c->log(c->log_user, PT_LOG_ERROR, msg);
        return rc;
    }
    rc = pt_fail(msg, sizeof msg, PT_ERR_BACKEND, "cuda backend: %s failed: %s (%s)", op,
                 cudaGetErrorString(e), cudaGetErrorName(e));
    return report(impl, rc, msg);
}

#define CK(impl, op, call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) return fail(impl, op, e_); \
    } while (0)

cudaStream_t st(pt_stream *s) { return s ? (cudaStream_t)s : cudaStreamPerThread; }

/* After queueing work: a NULL stream means the caller wants it done on return. */
int finish(void *impl, const char *op, pt_stream *s) {
    cudaError_t e = cudaGetLastError();   /* launch-configuration errors */
    if (e != cudaSuccess) return fail(impl, op, e);
    if (!s) CK(impl, op, cudaStreamSynchronize(cudaStreamPerThread));
    return 0;
}

/* One op's device scope: refuses a dead context, selects the opened device for
 * the op's calls and restores the caller's current device when it ends. */
struct dev_scope {
    int prev = -1, dev = -1, rc = 0;
    explicit dev_scope(void *impl) {
        cuda_impl *c = (cuda_impl *)impl;
        if (!c) {
            rc = PT_ERR_INVALID_ARG;
            return;
        }
        if (c->dead.load(std::memory_order_acquire)) {
            rc = PT_ERR_BACKEND;   /* the first failure was reported when it happened */
            return;
        }
        dev = c->dev;
        if (cudaGetDevice(&prev) != cudaSuccess) {
            (void)cudaGetLastError();
            prev = -1;
        }
        if (prev != dev) {
            cudaError_t e = cudaSetDevice(dev);
            if (e != cudaSuccess) rc = fail(impl, "cudaSetDevice", e);
        }
    }
    ~dev_scope() {
        if (prev >= 0 && prev != dev && cudaSetDevice(prev) != cudaSuccess) (void)cudaGetLastError();
    }
    dev_scope(const dev_scope &) = delete;
    dev_scope &operator=(const dev_scope &) = delete;
};
#define USE(impl) \
    dev_scope scope_(impl); \
    if (scope_.rc) return scope_.rc

/* Enough blocks to fill the device a few times over; the loops stride the rest. */
unsigned grid_for(void *impl, size_t n) {
    size_t want = (n + kThreads - 1) / kThreads;
    size_t cap = (size_t)((cuda_impl *)impl)->n_sm * 8;
    if (cap == 0) cap = 1024;
    return (unsigned)(want < cap ? want : cap);
}

/* ---- kernels ---- */

__global__ void k_adamw(float *p, const float *g, float *m, float *v, void *out, int out_dtype,
                        size_t n, pt_adamw_consts c) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float mi = m[i], vi = v[i];
        float pi = pt_adamw_elem(&c, p[i], g[i], &mi, &vi);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (out) pt_store_elem(out, out_dtype, i, pi);
    }
}

/* Block sum of one value per thread: a shared-memory tree (blockDim == kThreads,
 * a power of two), fixed order, so the result is deterministic. */
__device__ double block_sum(double acc) {
    __shared__ double part[kThreads];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    return part[0];
}

/* Pass 1 of sum(x^2): grid-stride per-thread sums, block tree, one partial per
 * block into part[blockIdx.x]. */
__global__ void k_sqnorm(const void *x, int dtype, size_t n, double *part) {
    double acc = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double a = (double)pt_load_elem(x, dtype, i);
        acc += a * a;
    }
    double b = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = b;
}

/* Pass 2: one block adds the nb partials in a fixed order: *out += sum(part). */
__global__ void k_sum_into(const double *part, unsigned nb, double *out) {
    double acc = 0.0;
    for (unsigned i = threadIdx.x; i < nb; i += blockDim.x) acc += part[i];
    double b = block_sum(acc);
    if (threadIdx.x == 0) *out += b;
}

__global__ void k_convert(void *dst, int dd, const void *src, int sd, size_t n, int acc) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float a = pt_load_elem(src, sd, i);
        if (acc) a += pt_load_elem(dst, dd, i);
        pt_store_elem(dst, dd, i, a);
    }
}

/* the floating-point pt_dtypes; u8 (frozen opaque bytes) has no element op */
int dtype_ok(int d) { return d == PT_F32 || d == PT_BF16 || d == PT_F16; }

/* ---- lifecycle ---- */

/* "12.4" from CUDA's 1000*major + 10*minor encoding */
void cuda_version(int v, char *buf, size_t len) { snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10); }

int be_open(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen) {
    if (impl) *impl = nullptr;
    if (!cfg || !impl)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "cuda backend open: NULL config or impl pointer");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        int drv = 0, rt = 0;
        char dv[16] = "none", rv[16];
        if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0) cuda_version(drv, dv, sizeof dv);
        (void)cudaRuntimeGetVersion(&rt);
        cuda_version(rt, rv, sizeof rv);
        /* with no driver at all the runtime also says "insufficient driver": a
         * driver version of 0 tells the two apart */
        if (drv == 0)
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "no CUDA device: no NVIDIA driver is loaded (%s)",
                           cudaGetErrorName(e));
        if (e == cudaErrorInsufficientDriver)
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "the NVIDIA driver is too old for this build: it supports CUDA %s, "
                           "libprotrain_cuda.so was built with CUDA %s (update the driver)",
                           dv, rv);
        if (e == cudaErrorNoDevice || e == cudaSuccess)
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "no CUDA device: the driver (CUDA %s) sees no GPU", dv);
        return pt_fail(err, errlen, PT_ERR_BACKEND, "no CUDA device: %s (%s; driver CUDA %s)",
                       cudaGetErrorString(e), cudaGetErrorName(e), dv);
    }
    if (cfg->device_index < 0 || cfg->device_index >= count)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "CUDA device index %d out of range: this machine has %d device(s)",
                       cfg->device_index, count);
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) {
        (void)cudaGetLastError();
        prev = -1;
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, cfg->device_index);
    if (prev != cfg->device_index && e == cudaSuccess) e = cudaSetDevice(cfg->device_index);
    /* the context is created here, on the opening thread (it is the primary
     * context, shared with the host) */
    if (e == cudaSuccess) e = cudaFree(nullptr);
    if (prev >= 0 && prev != cfg->device_index) (void)cudaSetDevice(prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return pt_fail(err, errlen, PT_ERR_BACKEND, "cannot open CUDA device %d: %s",
                       cfg->device_index, cudaGetErrorString(e));
    }
    cuda_impl *c = new (std::nothrow) cuda_impl();
    if (!c)
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "cuda backend open: out of host memory (%zu bytes)", sizeof *c);
    c->dev = cfg->device_index;
    c->n_sm = prop.multiProcessorCount;
    c->total = prop.totalGlobalMem;
    snprintf(c->name, sizeof c->name, "%s (cuda:%d, sm_%d%d)", prop.name, c->dev, prop.major, prop.minor);
    *impl = c;
    return 0;
}

/* No cudaDeviceReset: the host process may use CUDA itself. */
void be_close(void *impl) {
    cuda_impl *c = (cuda_impl *)impl;
    if (!c) return;
    if (!c->dead.load()) {
        dev_scope scope_(impl);
        for (int i = 0; i < c->n_scratch; i++)
            if (c->scratch[i] && cudaFree(c->scratch[i]) != cudaSuccess) (void)cudaGetLastError();
        if (c->blas) (void)cublasDestroy(c->blas);
        if (c->solver) (void)cusolverDnDestroy(c->solver);
    }
    delete c;
}

/* Called only by the opening thread before other threads use impl (see gpu.h),
 * so no lock is needed. */
void be_set_log(void *impl, pt_gpu_log_fn fn, void *user) {
    cuda_impl *c = (cuda_impl *)impl;
    if (!c) return;
    c->log = fn;
    c->log_user = user;
}

void be_device_name(void *impl, char *buf, size_t len) {
    if (buf && len) snprintf(buf, len, "%s", ((cuda_impl *)impl)->name);
}

/* What the plugin may reserve: the memory free now (other processes and the CUDA
 * context already hold the rest), never more than the device total. */
uint64_t be_total_memory(void *impl) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return ((cuda_impl *)impl)->total;
    return free_b < ((cuda_impl *)impl)->total ? free_b : ((cuda_impl *)impl)->total;
}

/* ---- memory ---- */

int be_dev_alloc(void *impl, size_t bytes, void **p) {
    if (!p) return PT_ERR_INVALID_ARG;
    USE(impl);
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *p = nullptr;
        return PT_ERR_OOM;
    }
    CK(impl, "cudaMalloc", e);
    return 0;
}

void be_dev_free(void *impl, void *p, size_t bytes) {
    (void)bytes;
    if (!p) return;
    dev_scope scope_(impl);
    if (scope_.rc) return;
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) fail(impl, "cudaFree", e);
}

/* Portable: pinned for every context, so copies from any thread are DMA. */
int be_host_alloc(void *impl, size_t bytes, void **p) {
    if (!p) return PT_ERR_INVALID_ARG;
    USE(impl);
    cudaError_t e = cudaHostAlloc(p, bytes, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *p = nullptr;
        return PT_ERR_HOST_OOM;
    }
    CK(impl, "cudaHostAlloc", e);
    return 0;
}

void be_host_free(void *impl, void *p, size_t bytes) {
    (void)bytes;
    if (!p) return;
    cudaError_t e = cudaFreeHost(p);
    if (e != cudaSuccess) fail(impl, "cudaFreeHost", e);
}

/* ---- streams and events ---- */

int be_stream_create(void *impl, pt_stream **s) {
    if (!s) return PT_ERR_INVALID_ARG;
    USE(impl);
    cudaStream_t cs;
    CK(impl, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    *s = (pt_stream *)cs;
    return 0;
}

void be_stream_destroy(void *impl, pt_stream *s) {
    if (!s) return;
    cudaError_t e = cudaStreamDestroy((cudaStream_t)s);
    if (e != cudaSuccess) fail(impl, "cudaStreamDestroy", e);
}

int be_stream_sync(void *impl, pt_stream *s) {
    USE(impl);
    CK(impl, "cudaStreamSynchronize", cudaStreamSynchronize(st(s)));
    return 0;
}

/* Ordering events: no timestamp (recording one is cheaper and waits on it
 * need none), and a host thread that waits on one sleeps (blocking sync)
 * instead of spinning on a core the CPU optimizer needs. */
int be_event_create(void *impl, pt_event **ev) {
    if (!ev) return PT_ERR_INVALID_ARG;
    USE(impl);
    cudaEvent_t e;
    CK(impl, "cudaEventCreateWithFlags",
       cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
    *ev = (pt_event *)e;
    return 0;
}

/* The profiler's edge events: timed, also blocking-sync. */
int be_event_create_timing(void *impl, pt_event **ev) {
    if (!ev) return PT_ERR_INVALID_ARG;
    USE(impl);
    cudaEvent_t e;
    CK(impl, "cudaEventCreateWithFlags", cudaEventCreateWithFlags(&e, cudaEventBlockingSync));
    *ev = (pt_event *)e;
    return 0;
}

void be_event_destroy(void *impl, pt_event *ev) {
    if (!ev) return;
    cudaError_t e = cudaEventDestroy((cudaEvent_t)ev);
    if (e != cudaSuccess) fail(impl, "cudaEventDestroy", e);
}

int be_event_record(void *impl, pt_event *ev, pt_stream *s) {
    if (!ev) return PT_ERR_INVALID_ARG;
    USE(impl);
    CK(impl, "cudaEventRecord", cudaEventRecord((cudaEvent_t)ev, st(s)));
    return 0;
}

/* NULL stream = the calling thread itself waits (later synchronous work is then
 * ordered after the event too). */
int be_stream_wait_event(void *impl, pt_stream *s, pt_event *ev) {
    if (!ev) return PT_ERR_INVALID_ARG;
    USE(impl);
    if (!s) CK(impl, "cudaEventSynchronize", cudaEventSynchronize((cudaEvent_t)ev));
    else CK(impl, "cudaStreamWaitEvent", cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0));
    return 0;
}

int be_event_sync(void *impl, pt_event *ev) {
    if (!ev) return PT_ERR_INVALID_ARG;
    USE(impl);
    CK(impl, "cudaEventSynchronize", cudaEventSynchronize((cudaEvent_t)ev));
    return 0;
}

/* 1 done, 0 pending, negative pt_status on error. */
int be_event_query(void *impl, pt_event *ev) {
    if (!ev) return -PT_ERR_INVALID_ARG;
    dev_scope scope_(impl);
    if (scope_.rc) return -scope_.rc;
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    return -fail(impl, "cudaEventQuery", e);
}

int be_event_elapsed_ms(void *impl, pt_event *a, pt_event *b, float *ms) {
    if (!a || !b || !ms) return PT_ERR_INVALID_ARG;
    USE(impl);
    CK(impl, "cudaEventElapsedTime", cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b));
    return 0;
}

/* ---- copies ---- */

int be_memset_async(void *impl, void *p, int value, size_t bytes, pt_stream *s) {
    if (bytes == 0) return 0;
    if (!p) return PT_ERR_INVALID_ARG;
    USE(impl);
    CK(impl, "cudaMemsetAsync", cudaMemsetAsync(p, value, bytes, st(s)));
    return finish(impl, "cudaMemsetAsync", s);
}

int be_memcpy_async(void *impl, void *dst, const void *src, size_t bytes, int kind, pt_stream *s) {
    static const cudaMemcpyKind map[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                         cudaMemcpyDeviceToDevice, cudaMemcpyHostToHost};
    if (bytes && (!dst || !src)) return PT_ERR_INVALID_ARG;
    if (kind < PT_GPU_H2D || kind > PT_GPU_H2H) {
        char msg[128];
        return report(impl, pt_fail(msg, sizeof msg, PT_ERR_INVALID_ARG, "cuda backend: memcpy_async: bad copy kind %d", kind),
                      msg);
    }
    USE(impl);
    if (bytes == 0) return 0;
    CK(impl, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, map[kind], st(s)));
    return finish(impl, "cudaMemcpyAsync", s);
}

/* On a real stream fn runs on a CUDA-internal thread and, by cudaLaunchHostFunc's
 * rules, must not call CUDA itself (it may signal a host thread that does). */
int be_host_fn(void *impl, pt_stream *s, void (*fn)(void *), void *arg) {
    if (!fn) return PT_ERR_INVALID_ARG;
    USE(impl);
    if (!s) {   /* synchronous: drain this thread's stream, then run fn here */
        CK(impl, "cudaStreamSynchronize", cudaStreamSynchronize(cudaStreamPerThread));
        fn(arg);
        return 0;
    }
    CK(impl, "cudaLaunchHostFunc", cudaLaunchHostFunc((cudaStream_t)s, fn, arg));
    return 0;
}

/* ---- kernels ---- */

int be_adamw(void *impl, const pt_adamw_args *a, pt_stream *s) {
    if (!a) return PT_ERR_INVALID_ARG;
    if (a->n && (!a->param || !a->grad || !a->m || !a->v)) return PT_ERR_INVALID_ARG;
    if (a->param_out && !dtype_ok(a->out_dtype)) return PT_ERR_INVALID_ARG;
    USE(impl);
    if (a->n == 0) return 0;
    pt_adamw_consts c = pt_adamw_make_consts(a->lr, a->beta1, a->beta2, a->eps, a->weight_decay,
                                             a->bc1, a->bc2_rsqrt, a->grad_scale);
    k_adamw<<<grid_for(impl, a->n), kThreads, 0, st(s)>>>(a->param, a->grad, a->m, a->v,
                                                          a->param_out, a->out_dtype, a->n, c);
    return finish(impl, "adamw kernel", s);
}

/* The partial-sum buffer of stream cs (created at its first sqnorm). */
int scratch_for(void *impl, cudaStream_t cs, double **out) {
    cuda_impl *c = (cuda_impl *)impl;
    std::lock_guard<std::mutex> lock(c->mu);
    for (int i = 0; i < c->n_scratch; i++)
        if (c->scratch_stream[i] == cs) {
            *out = c->scratch[i];
            return 0;
        }
    if (c->n_scratch == cuda_impl::kMaxScratch) {
        char msg[160];
        return report(impl, pt_fail(msg, sizeof msg, PT_ERR_BACKEND, "cuda backend: sqnorm used on more than %d streams", cuda_impl::kMaxScratch), msg);
    }
    size_t bytes = sizeof(double) * (size_t)c->n_sm * 8;
    double *p = nullptr;
    cudaError_t e = cudaMalloc((void **)&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return PT_ERR_OOM;
    }
    CK(impl, "cudaMalloc (sqnorm partials)", e);
    c->scratch_stream[c->n_scratch] = cs;
    c->scratch[c->n_scratch++] = p;
    *out = p;
    return 0;
}

/* Two passes through a per-stream buffer of one double per block (at most 8 per
 * SM: ~8 KiB per stream, allocated once, outside the wrapper's capacity which
 * keeps 5% of the device free): pass 1 writes each block's sum, pass 2 adds
 * them in a fixed order, so the global grad norm is bit-reproducible run to run. */
int be_sqnorm(void *impl, const void *x, int dtype, size_t n, double *out, pt_stream *s) {
    if (!dtype_ok(dtype) || !out || (n && !x)) return PT_ERR_INVALID_ARG;
    if (n == 0) return 0;
    USE(impl);
    unsigned nb = grid_for(impl, n);
    double *part = nullptr;
    /* NULL stream: this thread's default stream; calls of several threads share
     * the NULL buffer, so they run one at a time (each syncs before returning) */
    std::unique_lock<std::mutex> null_lock;
    if (!s) null_lock = std::unique_lock<std::mutex>(((cuda_impl *)impl)->null_mu);
    if (int rc = scratch_for(impl, s ? (cudaStream_t)s : nullptr, &part)) return rc;
    k_sqnorm<<<nb, kThreads, 0, st(s)>>>(x, dtype, n, part);
    k_sum_into<<<1, kThreads, 0, st(s)>>>(part, nb, out);
    return finish(impl, "sqnorm kernel", s);
}

int be_convert(void *impl, void *dst, int dst_dtype, const void *src, int src_dtype, size_t n,
               int accumulate, pt_stream *s) {
    if (!dtype_ok(dst_dtype) || !dtype_ok(src_dtype) || (n && (!dst || !src)))
        return PT_ERR_INVALID_ARG;
    USE(impl);
    if (n == 0) return 0;
    k_convert<<<grid_for(impl, n), kThreads, 0, st(s)>>>(dst, dst_dtype, src, src_dtype, n,
                                                         accumulate);
    return finish(impl, "convert kernel", s);
}

/* ---- dense linear algebra (OSFT) ---- */

int la_fail(void *impl, const char *what, int code) {
    char msg[200];
    return report(impl, pt_fail(msg, sizeof msg, PT_ERR_BACKEND, "cuda backend: %s failed (status %d)", what, code), msg);
}

/* Row-major C = alpha op(A) op(B) + beta C is column-major C^T = alpha op(B)^T op(A)^T +
 * beta C^T: cuBLAS gets B first, with m and n swapped. */
int be_gemm_f32(void *impl, const pt_gemm_args *a, pt_stream *s) {
    if (!a || a->m < 0 || a->n < 0 || a->k < 0 || a->m > INT32_MAX || a->n > INT32_MAX ||
        a->k > INT32_MAX || a->ldc < a->n || a->lda < (a->trans_a ? a->m : a->k) ||
        a->ldb < (a->trans_b ? a->k : a->n))
        return PT_ERR_INVALID_ARG;
    if (a->m && a->n && (!a->c || (a->k && (!a->a || !a->b)))) return PT_ERR_INVALID_ARG;
    if (!a->m || !a->n) return 0;
    USE(impl);
    cuda_impl *c = (cuda_impl *)impl;
    std::lock_guard<std::mutex> lock(c->la_mu);
    if (!c->blas && cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = nullptr;
        return la_fail(impl, "cublasCreate", 0);
    }
    cublasStatus_t e = cublasSetStream(c->blas, st(s));
    if (e == CUBLAS_STATUS_SUCCESS && !a->k) {
        /* C = beta C: scale each row (k = 0 has no product to add) */
        CK(impl, "cudaMemset2DAsync", a->beta == 0.0f ? cudaMemset2DAsync(a->c, (size_t)a->ldc * 4, 0, (size_t)a->n * 4, (size_t)a->m, st(s)) : cudaSuccess);
        if (a->beta != 0.0f)
            for (int64_t i = 0; i < a->m && e == CUBLAS_STATUS_SUCCESS; i++)
                e = cublasSscal(c->blas, (int)a->n, &a->beta, a->c + i * a->ldc, 1);
    } else if (e == CUBLAS_STATUS_SUCCESS) {
        e = cublasSgemm(c->blas, a->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                        a->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)a->n, (int)a->m, (int)a->k,
                        &a->alpha, a->b, (int)a->ldb, a->a, (int)a->lda, &a->beta, a->c,
                        (int)a->ldc);
    }
    if (e != CUBLAS_STATUS_SUCCESS) return la_fail(impl, "cublasSgemm", (int)e);
    return finish(impl, "gemm_f32", s);
}

__global__ void k_colscale(const float *x, const float *sv, float *out, int64_t rows, int64_t cols,
                           int64_t ld) {
    size_t n = (size_t)rows * (size_t)cols;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n;
         t += (size_t)gridDim.x * blockDim.x) {
        int64_t i = (int64_t)(t / (size_t)cols), j = (int64_t)(t % (size_t)cols);
        out[i * ld + j] = pt_colscale_elem(x[i * ld + j], sv[j]);
    }
}

/* One thread per column, rows in order: the host loop's bits. */
__global__ void k_coldot(const float *x, const float *y, float *acc, int64_t rows, int64_t cols,
                         int64_t ld) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols;
         j += (int64_t)gridDim.x * blockDim.x)
        acc[j] = pt_coldot_col(x, y, rows, ld, j, acc[j]);
}

int be_cols_f32(void *impl, const pt_cols_args *a, pt_stream *s) {
    if (!a || a->rows < 0 || a->cols < 0 || a->ld < a->cols ||
        (a->op != PT_COLS_SCALE && a->op != PT_COLS_DOT))
        return PT_ERR_INVALID_ARG;
    if (a->rows && a->cols &&
        (!a->x || (a->op == PT_COLS_SCALE ? (!a->s || !a->out) : (!a->y || !a->acc))))
        return PT_ERR_INVALID_ARG;
    if (!a->rows || !a->cols) return 0;
    USE(impl);
    if (a->op == PT_COLS_SCALE)
        k_colscale<<<grid_for(impl, (size_t)(a->rows * a->cols)), kThreads, 0, st(s)>>>(
            a->x, a->s, a->out, a->rows, a->cols, a->ld);
    else
        k_coldot<<<grid_for(impl, (size_t)a->cols), kThreads, 0, st(s)>>>(a->x, a->y, a->acc,
                                                                          a->rows, a->cols, a->ld);
    return finish(impl, "cols_f32 kernel", s);
}

/* Row-major out (cols x rows) = transpose of row-major in (rows x cols), with geam. */
cublasStatus_t transpose(cublasHandle_t h, const float *in, float *out, int rows, int cols) {
    const float one = 1.0f, zero = 0.0f;
    /* column-major view: in is cols x rows (ld cols); out^T is rows x cols (ld rows) */
    return cublasSgeam(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, cols, &one, in, cols, &zero, out, rows,
                       out, rows);
}

/* gesvd wants a column-major matrix with at least as many rows as columns. A
 * row-major m x n matrix is the column-major n x m matrix A^T. With n >= m,
 * A^T = Ub S VTb gives A = VTb^T S Ub^T, whose row-major factors are VTb's and
 * Ub's storage as they are. With m > n the input is transposed first (column-major
 * A, m x n): A = Ub S VTb, and both factors are transposed back into row-major. */
int be_svd_f32(void *impl, const pt_svd_args *a, pt_stream *s) {
    if (!a || a->m < 1 || a->n < 1 || a->m > INT32_MAX || a->n > INT32_MAX || !a->a || !a->u ||
        !a->s || !a->vt || !a->info)
        return PT_ERR_INVALID_ARG;
    USE(impl);
    cuda_impl *c = (cuda_impl *)impl;
    std::lock_guard<std::mutex> lock(c->la_mu);
    if (!c->solver && cusolverDnCreate(&c->solver) != CUSOLVER_STATUS_SUCCESS) {
        c->solver = nullptr;
        return la_fail(impl, "cusolverDnCreate", 0);
    }
    if (!c->blas && cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        c->blas = nullptr;
        return la_fail(impl, "cublasCreate", 0);
    }
    int m = (int)a->m, n = (int)a->n, r = m < n ? m : n;
    int rows = n >= m ? n : m, cols = n >= m ? m : n;   /* of the column-major input */
    cusolverStatus_t se = cusolverDnSetStream(c->solver, st(s));
    if (se != CUSOLVER_STATUS_SUCCESS) return la_fail(impl, "cusolverDnSetStream", (int)se);
    if (cublasSetStream(c->blas, st(s)) != CUBLAS_STATUS_SUCCESS)
        return la_fail(impl, "cublasSetStream", 0);
    int lwork = 0;
    se = cusolverDnSgesvd_bufferSize(c->solver, rows, cols, &lwork);
    if (se != CUSOLVER_STATUS_SUCCESS) return la_fail(impl, "cusolverDnSgesvd_bufferSize", (int)se);
    /* workspace, and with m > n the transposed input and both factors before their
     * transpose back (freed in stream order below) */
    size_t extra = n >= m ? 0 : (size_t)m * n + (size_t)m * r + (size_t)r * n;
    float *ws = nullptr;
    CK(impl, "cudaMallocAsync (gesvd workspace)",
       cudaMallocAsync((void **)&ws, ((size_t)lwork + extra) * sizeof(float), st(s)));
    float *in = a->a, *uu = a->vt, *vv = a->u;
    int ldu = n, ldvt = m;
    if (m > n) {
        in = ws + lwork;
        uu = in + (size_t)m * n;
        vv = uu + (size_t)m * r;
        ldu = m;
        ldvt = n;
        if (transpose(c->blas, a->a, in, m, n) != CUBLAS_STATUS_SUCCESS) {
            (void)cudaFreeAsync(ws, st(s));
            return la_fail(impl, "cublasSgeam", 0);
        }
    }
    se = cusolverDnSgesvd(c->solver, 'S', 'S', rows, cols, in, rows, a->s, uu, ldu, vv, ldvt, ws,
                          lwork, nullptr, a->info);
    if (se == CUSOLVER_STATUS_SUCCESS && m > n) {
        /* uu: column-major m x n (= U); vv: column-major n x n (= Vt) */
        if (transpose(c->blas, uu, a->u, n, m) != CUBLAS_STATUS_SUCCESS ||
            transpose(c->blas, vv, a->vt, n, n) != CUBLAS_STATUS_SUCCESS)
            se = CUSOLVER_STATUS_EXECUTION_FAILED;
    }
    (void)cudaFreeAsync(ws, st(s));
    if (se != CUSOLVER_STATUS_SUCCESS) return la_fail(impl, "cusolverDnSgesvd", (int)se);
    return finish(impl, "svd_f32", s);
}

#include "rekls_ops.cuh"

}  // namespace

/* Designated initializers (in declaration order, as C++ requires) keep this a
 * constant-initialised object: no constructor runs at dlopen. The symbol's name
 * carries the table version (PT_CUDA_BACKEND_SYMBOL) and the head repeats it, so
 * a plugin from another build refuses this library instead of misreading it. */
extern "C" PT_EXPORT const pt_gpu_backend pt_gpu_backend_cuda_v1 = {
    .abi_version = PT_GPU_BACKEND_VERSION,
    .struct_size = sizeof(pt_gpu_backend),
    .name = "cuda",
    .open = be_open,
    .close = be_close,
    .set_log = be_set_log,
    .device_name = be_device_name,
    .total_memory = be_total_memory,
    .dev_alloc = be_dev_alloc,
    .dev_free = be_dev_free,
    .host_alloc = be_host_alloc,
    .host_free = be_host_free,
    .stream_create = be_stream_create,
    .stream_destroy = be_stream_destroy,
    .stream_sync = be_stream_sync,
    .event_create = be_event_create,
    .event_destroy = be_event_destroy,
    .event_record = be_event_record,
    .stream_wait_event = be_stream_wait_event,
    .event_sync = be_event_sync,
    .event_query = be_event_query,
    .event_elapsed_ms = be_event_elapsed_ms,
    .memset_async = be_memset_async,
    .memcpy_async = be_memcpy_async,
    .host_fn = be_host_fn,
    .adamw = be_adamw,
    .sqnorm = be_sqnorm,
    .convert = be_convert,
    .event_create_timing = be_event_create_timing,
    .gemm_f32 = be_gemm_f32,
    .cols_f32 = be_cols_f32,
    .svd_f32 = be_svd_f32,
    .eigh = be_eigh,
    .rekls_ew = be_rekls_ew,
};
