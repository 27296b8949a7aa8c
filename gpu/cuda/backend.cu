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
 *  - Every op first selects the opened device on the calling thread: the runtime's
 *    current device is per host thread and stream workers are other threads.
 */
#include <cuda_runtime.h>

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
};

constexpr int kThreads = 256;

/* Hand one failure sentence to the wrapper's log and pass its status through. */
int report(void *impl, int code, const char *msg) {
    const cuda_impl *c = (const cuda_impl *)impl;
    if (c && c->log) c->log(c->log_user, PT_LOG_ERROR, msg);
    return code;
}

/* Report a CUDA failure and map it to a pt_status. Clears the (non-sticky) error so
 * the next call does not see it again. */
int fail(void *impl, const char *op, cudaError_t e) {
    (void)cudaGetLastError();
    char msg[256];
    int rc = pt_fail(msg, sizeof msg, PT_ERR_BACKEND, "cuda backend: %s failed: %s (%s)", op,
                     cudaGetErrorString(e), cudaGetErrorName(e));
    return report(impl, rc, msg);
}

#define CK(impl, op, call)                                  \
    do {                                                    \
        cudaError_t e_ = (call);                            \
        if (e_ != cudaSuccess) return fail(impl, op, e_);   \
    } while (0)

cudaStream_t st(pt_stream *s) { return s ? (cudaStream_t)s : cudaStreamPerThread; }

/* After queueing work: a NULL stream means the caller wants it done on return. */
int finish(void *impl, const char *op, pt_stream *s) {
    cudaError_t e = cudaGetLastError();   /* launch-configuration errors */
    if (e != cudaSuccess) return fail(impl, op, e);
    if (!s) CK(impl, op, cudaStreamSynchronize(cudaStreamPerThread));
    return 0;
}

int use(void *impl) {
    CK(impl, "cudaSetDevice", cudaSetDevice(((cuda_impl *)impl)->dev));
    return 0;
}

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
 * block into part[blockIdx.x]; or, when part is NULL (no scratch), atomicAdd into
 * *out (order of the adds then varies run to run). */
__global__ void k_sqnorm(const void *x, int dtype, size_t n, double *part, double *out) {
    double acc = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double a = (double)pt_load_elem(x, dtype, i);
        acc += a * a;
    }
    double b = block_sum(acc);
    if (threadIdx.x != 0) return;
    if (part) part[blockIdx.x] = b;
    else atomicAdd(out, b);
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

int dtype_ok(int d) { return d == PT_F32 || d == PT_BF16 || d == PT_F16; }

/* ---- lifecycle ---- */

int be_open(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen) {
    if (impl) *impl = nullptr;
    if (!cfg || !impl)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "cuda backend open: NULL config or impl pointer");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return pt_fail(err, errlen, PT_ERR_BACKEND, "no CUDA device: %s",
                       e != cudaSuccess ? cudaGetErrorString(e)
                                        : "cudaGetDeviceCount reports 0 devices");
    }
    if (cfg->device_index < 0 || cfg->device_index >= count)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "CUDA device index %d out of range: this machine has %d device(s)",
                       cfg->device_index, count);
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(cfg->device_index)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, cfg->device_index)) != cudaSuccess) {
        (void)cudaGetLastError();
        return pt_fail(err, errlen, PT_ERR_BACKEND, "cannot open CUDA device %d: %s",
                       cfg->device_index, cudaGetErrorString(e));
    }
    cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
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
void be_close(void *impl) { free(impl); }

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
    if (int rc = use(impl)) return rc;
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
    if (!p || use(impl)) return;
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) fail(impl, "cudaFree", e);
}

/* Portable: pinned for every context, so copies from any thread are DMA. */
int be_host_alloc(void *impl, size_t bytes, void **p) {
    if (int rc = use(impl)) return rc;
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
    if (int rc = use(impl)) return rc;
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
    if (int rc = use(impl)) return rc;
    CK(impl, "cudaStreamSynchronize", cudaStreamSynchronize(st(s)));
    return 0;
}

int be_event_create(void *impl, pt_event **ev) {
    if (int rc = use(impl)) return rc;
    cudaEvent_t e;
    CK(impl, "cudaEventCreate", cudaEventCreate(&e));   /* timing on: event_elapsed_ms needs it */
    *ev = (pt_event *)e;
    return 0;
}

void be_event_destroy(void *impl, pt_event *ev) {
    if (!ev) return;
    cudaError_t e = cudaEventDestroy((cudaEvent_t)ev);
    if (e != cudaSuccess) fail(impl, "cudaEventDestroy", e);
}

int be_event_record(void *impl, pt_event *ev, pt_stream *s) {
    if (int rc = use(impl)) return rc;
    CK(impl, "cudaEventRecord", cudaEventRecord((cudaEvent_t)ev, st(s)));
    return 0;
}

/* NULL stream = the calling thread itself waits (later synchronous work is then
 * ordered after the event too). */
int be_stream_wait_event(void *impl, pt_stream *s, pt_event *ev) {
    if (int rc = use(impl)) return rc;
    if (!s) CK(impl, "cudaEventSynchronize", cudaEventSynchronize((cudaEvent_t)ev));
    else CK(impl, "cudaStreamWaitEvent", cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0));
    return 0;
}

int be_event_sync(void *impl, pt_event *ev) {
    if (int rc = use(impl)) return rc;
    CK(impl, "cudaEventSynchronize", cudaEventSynchronize((cudaEvent_t)ev));
    return 0;
}

/* 1 done, 0 pending, negative pt_status on error. */
int be_event_query(void *impl, pt_event *ev) {
    if (int rc = use(impl)) return -rc;
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    return -fail(impl, "cudaEventQuery", e);
}

int be_event_elapsed_ms(void *impl, pt_event *a, pt_event *b, float *ms) {
    if (int rc = use(impl)) return rc;
    CK(impl, "cudaEventElapsedTime", cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b));
    return 0;
}

/* ---- copies ---- */

int be_memset_async(void *impl, void *p, int value, size_t bytes, pt_stream *s) {
    if (int rc = use(impl)) return rc;
    if (bytes == 0) return 0;
    CK(impl, "cudaMemsetAsync", cudaMemsetAsync(p, value, bytes, st(s)));
    return finish(impl, "cudaMemsetAsync", s);
}

int be_memcpy_async(void *impl, void *dst, const void *src, size_t bytes, int kind, pt_stream *s) {
    static const cudaMemcpyKind map[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                         cudaMemcpyDeviceToDevice, cudaMemcpyHostToHost};
    if (kind < PT_GPU_H2D || kind > PT_GPU_H2H) {
        char msg[128];
        return report(impl, pt_fail(msg, sizeof msg, PT_ERR_INVALID_ARG,
                                    "cuda backend: memcpy_async: bad copy kind %d", kind),
                      msg);
    }
    if (int rc = use(impl)) return rc;
    if (bytes == 0) return 0;
    CK(impl, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, map[kind], st(s)));
    return finish(impl, "cudaMemcpyAsync", s);
}

/* On a real stream fn runs on a CUDA-internal thread and, by cudaLaunchHostFunc's
 * rules, must not call CUDA itself (it may signal a host thread that does). */
int be_host_fn(void *impl, pt_stream *s, void (*fn)(void *), void *arg) {
    if (int rc = use(impl)) return rc;
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
    if (a->param_out && !dtype_ok(a->out_dtype)) return PT_ERR_INVALID_ARG;
    if (int rc = use(impl)) return rc;
    if (a->n == 0) return 0;
    pt_adamw_consts c = pt_adamw_make_consts(a->lr, a->beta1, a->beta2, a->eps, a->weight_decay,
                                             a->bc1, a->bc2_rsqrt, a->grad_scale);
    k_adamw<<<grid_for(impl, a->n), kThreads, 0, st(s)>>>(a->param, a->grad, a->m, a->v,
                                                         a->param_out, a->out_dtype, a->n, c);
    return finish(impl, "adamw kernel", s);
}

/* Two passes through a stream-ordered scratch of one double per block (at most
 * 8 per SM: ~8 KiB, outside pt_gpu accounting), so the global grad norm is
 * bit-reproducible run to run. If the pool allocator is unavailable, fall back
 * to one pass with atomicAdd. */
int be_sqnorm(void *impl, const void *x, int dtype, size_t n, double *out, pt_stream *s) {
    if (!dtype_ok(dtype)) return PT_ERR_INVALID_ARG;
    if (int rc = use(impl)) return rc;
    if (n == 0) return 0;
    unsigned nb = grid_for(impl, n);
    double *part = nullptr;
    if (cudaMallocAsync((void **)&part, sizeof(double) * nb, st(s)) != cudaSuccess) {
        (void)cudaGetLastError();
        part = nullptr;
    }
    k_sqnorm<<<nb, kThreads, 0, st(s)>>>(x, dtype, n, part, out);
    if (part) {
        k_sum_into<<<1, kThreads, 0, st(s)>>>(part, nb, out);
        CK(impl, "cudaFreeAsync", cudaFreeAsync(part, st(s)));
    }
    return finish(impl, "sqnorm kernel", s);
}

int be_convert(void *impl, void *dst, int dst_dtype, const void *src, int src_dtype, size_t n,
               int accumulate, pt_stream *s) {
    if (!dtype_ok(dst_dtype) || !dtype_ok(src_dtype)) return PT_ERR_INVALID_ARG;
    if (int rc = use(impl)) return rc;
    if (n == 0) return 0;
    k_convert<<<grid_for(impl, n), kThreads, 0, st(s)>>>(dst, dst_dtype, src, src_dtype, n,
                                                        accumulate);
    return finish(impl, "convert kernel", s);
}

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
};
