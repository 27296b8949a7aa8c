// api.cu — libsample_cuda.so's context: opening the device (stream, cuBLAS with
// pedantic fp32 math), device memory, copies on the stream, sync and errors, and the
// exported table (sh_cuda.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/shc.cuh"

void shc_fail(shc_ctx *c, const char *what, const char *why) {
    if (c->failed) return;
    c->failed = 1;
    snprintf(c->err, sizeof c->err, "CUDA error in %s on device %d: %s", what, c->device, why);
}

void shc_check(shc_ctx *c, cudaError_t e, const char *what) {
    if (e != cudaSuccess) shc_fail(c, what, cudaGetErrorString(e));
}

void shc_blas(shc_ctx *c, cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    char buf[64];
    snprintf(buf, sizeof buf, "cuBLAS status %d", (int)st);
    shc_fail(c, what, buf);
}

static void release(shc_ctx *c) {
    for (int i = 0; i < SHC_NSTAGE; i++) {
        if (c->stage[i].host) cudaFreeHost(c->stage[i].host);
        if (c->stage[i].ev) cudaEventDestroy(c->stage[i].ev);
    }
    if (c->part) cudaFree(c->part);
    if (c->scale) cudaFree(c->scale);
    if (c->blas) cublasDestroy(c->blas);
    if (c->s) cudaStreamDestroy(c->s);
    free(c);
}

static int api_open(int device, void **out, char *err, size_t errlen) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        snprintf(err, errlen, "no usable CUDA GPU on this machine (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
        return -1;
    }
    if (device < 0 || device >= n) {
        snprintf(err, errlen, "CUDA device %d does not exist (%d device%s found)", device, n,
                 n == 1 ? "" : "s");
        return -1;
    }
    shc_ctx *c = (shc_ctx *)calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of host memory for the CUDA context");
        return -1;
    }
    c->device = device;
    const char *what = "cudaSetDevice";
    e = cudaSetDevice(device);
    // A blocking stream: it also orders against anything put on the legacy default
    // stream (a plugin's synchronous copies, say), which a non-blocking one would not.
    if (e == cudaSuccess) {
        what = "cudaStreamCreate";
        e = cudaStreamCreate(&c->s);
    }
    if (e == cudaSuccess) {
        what = "cudaMalloc";
        e = cudaMalloc((void **)&c->scale, sizeof(float));
    }
    for (int i = 0; i < SHC_NSTAGE && e == cudaSuccess; i++) {
        what = "cudaEventCreate";
        e = cudaEventCreateWithFlags(&c->stage[i].ev, cudaEventDisableTiming);
    }
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    if (e == cudaSuccess) {
        // Pedantic math: fp32 GEMMs in fp32 (no TF32, no reduced-precision reductions),
        // so the GPU computes what the CPU reference computes, up to summation order.
        what = "cuBLAS setup";
        if ((bs = cublasCreate(&c->blas)) == CUBLAS_STATUS_SUCCESS &&
            (bs = cublasSetStream(c->blas, c->s)) == CUBLAS_STATUS_SUCCESS)
            bs = cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH);
    }
    if (e != cudaSuccess || bs != CUBLAS_STATUS_SUCCESS) {
        if (e != cudaSuccess)
            snprintf(err, errlen, "%s failed on CUDA device %d: %s", what, device,
                     cudaGetErrorString(e));
        else
            snprintf(err, errlen, "%s failed on CUDA device %d: cuBLAS status %d", what,
                     device, (int)bs);
        release(c);
        return -1;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) == cudaSuccess)
        snprintf(c->name, sizeof c->name, "cuda:%d %s (sm_%d%d, %.1f GiB)", device, p.name,
                 p.major, p.minor, (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    else
        snprintf(c->name, sizeof c->name, "cuda:%d", device);
    *out = c;
    return 0;
}

static void api_close(void *ctx) {
    shc_ctx *c = shc(ctx);
    if (!c) return;
    cudaStreamSynchronize(c->s);
    release(c);
}

static void *api_stream(void *ctx) { return (void *)shc(ctx)->s; }
static const char *api_name(void *ctx) { return shc(ctx)->name; }

static int api_alloc(void *ctx, size_t bytes, void **p) {
    shc_ctx *c = shc(ctx);
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", bytes);
        shc_check(c, e, what);
        *p = NULL;
        return -1;
    }
    return 0;
}

static void api_free(void *ctx, void *p) {
    // cudaFree waits for the device, so no kernel still uses p
    if (p) shc_check(shc(ctx), cudaFree(p), "cudaFree");
}

static void api_h2d(void *ctx, void *dst, const void *src, size_t bytes) {
    shc_ctx *c = shc(ctx);
    if (!bytes) return;
    if (bytes > SHC_STAGE_MAX) {
        // large (initial parameters): copy and wait, so src is free on return
        shc_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->s), "h2d copy");
        shc_check(c, cudaStreamSynchronize(c->s), "h2d copy");
        return;
    }
    // small (token batches): through a pinned slot, asynchronously; a slot is reused
    // only after its previous copy has run (its event)
    shc_stage *st = &c->stage[c->next_stage];
    c->next_stage = (c->next_stage + 1) % SHC_NSTAGE;
    if (st->pending) shc_check(c, cudaEventSynchronize(st->ev), "h2d staging wait");
    st->pending = 0;
    if (st->cap < bytes) {
        if (st->host) cudaFreeHost(st->host);
        st->host = NULL;
        st->cap = 0;
        size_t cap = bytes < 65536 ? 65536 : bytes;
        cudaError_t e = cudaMallocHost(&st->host, cap);
        if (e != cudaSuccess) {
            st->host = NULL;
            shc_check(c, e, "cudaMallocHost (h2d staging)");
            return;
        }
        st->cap = cap;
    }
    memcpy(st->host, src, bytes);
    shc_check(c, cudaMemcpyAsync(dst, st->host, bytes, cudaMemcpyHostToDevice, c->s),
              "h2d copy");
    shc_check(c, cudaEventRecord(st->ev, c->s), "cudaEventRecord");
    st->pending = 1;
}

static void api_d2h(void *ctx, void *dst, const void *src, size_t bytes) {
    shc_ctx *c = shc(ctx);
    if (bytes)
        shc_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->s), "d2h copy");
}

static int api_sync(void *ctx) {
    shc_ctx *c = shc(ctx);
    shc_check(c, cudaStreamSynchronize(c->s), "cudaStreamSynchronize");
    shc_check(c, cudaGetLastError(), "a kernel");
    return c->failed ? -1 : 0;
}

static const char *api_error(void *ctx) {
    shc_ctx *c = shc(ctx);
    return c && c->failed ? c->err : "no CUDA error";
}

void shc_zero(void *ctx, void *dst, size_t bytes) {
    shc_ctx *c = shc(ctx);
    if (bytes) shc_check(c, cudaMemsetAsync(dst, 0, bytes, c->s), "cudaMemsetAsync");
}

extern "C" __attribute__((visibility("default"))) const sh_cuda_api sh_cuda_api_v1 = {
    SH_CUDA_VERSION,
    (uint32_t)sizeof(sh_cuda_api),
    api_open,
    api_close,
    api_stream,
    api_name,
    api_alloc,
    api_free,
    api_h2d,
    api_d2h,
    api_sync,
    api_error,
    shc_adamw,
    {
        NULL,
        shc_encoder_fwd,
        shc_encoder_bwd,
        shc_layernorm_fwd,
        shc_layernorm_bwd,
        shc_matmul_fwd,
        shc_matmul_bwd,
        shc_attention_fwd,
        shc_attention_bwd,
        shc_attention_slots,
        shc_gelu_fwd,
        shc_gelu_bwd,
        shc_add_inplace,
        shc_crossentropy_fwd,
        shc_crossentropy_bwd,
        shc_zero,
    },
};
