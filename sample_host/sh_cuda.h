/*
 * sh_cuda.h — the C interface between sample_host and libsample_cuda.so, the CUDA
 * implementation of its device work (sources in sample_host/cuda/).
 *
 * sample_host never links CUDA: with --device cuda it dlopens libsample_cuda.so and
 * reads one const table, exported as SH_CUDA_SYMBOL. The table starts with version
 * and struct_size; the host refuses a table whose version differs or whose
 * struct_size is smaller than the one it was built with (host and library are built
 * from one tree, so this only catches a stale library).
 *
 * Everything runs on one cudaStream_t that the library creates at open and that the
 * host hands to the plugin as pt_host_v1.compute_stream. Every entry except
 * open/close/sync/last_error only enqueues work: errors (a failed launch, a cuBLAS
 * status) are kept, first one wins, and reported by the next sync.
 */
#ifndef SH_CUDA_H
#define SH_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "sh_elem.h"
#include "sh_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SH_CUDA_SYMBOL "sh_cuda_api_v1"
#define SH_CUDA_VERSION 1u
#define SH_CUDA_LIB "libsample_cuda.so"

typedef struct sh_cuda_api {
    uint32_t version;     /* SH_CUDA_VERSION */
    uint32_t struct_size; /* sizeof(sh_cuda_api) as the library was built */
    /* Pick device `device`, create the stream, a cuBLAS handle bound to it with
     * pedantic fp32 math (no TF32, no reduced-precision reductions). 0, or non-zero
     * with one sentence in err (no driver, no device, ...). */
    int (*open)(int device, void **ctx, char *err, size_t errlen);
    /* Synchronises, then frees what open and the library made. */
    void (*close)(void *ctx);
    void *(*stream)(void *ctx);       /* the cudaStream_t */
    /* One sentence naming the device (for the start line). */
    const char *(*device_name)(void *ctx);
    /* Plain device memory (--no-plugin; with the plugin, dev_alloc is used). */
    int (*dev_alloc)(void *ctx, size_t bytes, void **p);
    void (*dev_free)(void *ctx, void *p);
    /* dst (device) = src (host), ordered on the stream. The source may be reused as soon
     * as the call returns (it is staged in pinned memory, or copied synchronously when
     * large). */
    void (*h2d)(void *ctx, void *dst, const void *src, size_t bytes);
    /* dst (host) = src (device), ordered on the stream; read dst after sync. */
    void (*d2h)(void *ctx, void *dst, const void *src, size_t bytes);
    /* Wait for everything enqueued; 0, or non-zero after the first error so far. */
    int (*sync)(void *ctx);
    const char *(*last_error)(void *ctx); /* never NULL */
    /* No-plugin AdamW over the flat parameter layout (n floats in p, g, m, v).
     * Clipping when max_norm > 0: S_i = sum over segment i of (double)g^2, norm =
     * sqrt(sum_i S_i) with the S_i added in segment order (seg_off/seg_len: host
     * arrays of nseg (offset, length) in floats, the trainable untied params in
     * declaration order), scale = (float)(max_norm / (norm + 1e-6)) when norm >
     * max_norm else 1; the norm is written to d_norm (device double) when clipping.
     * Then per element g*scale through sh_adamw_elem with k, and g zeroed. */
    void (*adamw)(void *ctx, float *p, float *g, float *m, float *v, size_t n,
                  const size_t *seg_off, const size_t *seg_len, int nseg, float max_norm,
                  const sh_adamw_k *k, double *d_norm);
    /* The layer operations (sh_ops.h); their ctx member is left NULL: the host sets it
     * to the ctx open returned. */
    sh_layer_ops layers;
} sh_cuda_api;

/* ---- host side (sample_host/cuda_load.c) ---- */

/* A loaded and opened library. */
typedef struct sh_cuda {
    void *dl;                 /* dlopen handle */
    const sh_cuda_api *api;
    void *ctx;                /* open's context */
    sh_layer_ops ops;         /* api->layers with ctx filled in */
    char path[512];
} sh_cuda;

/* Find libsample_cuda.so ($SH_CUDA_LIB if set, else beside the executable, else
 * $PT_BUILD, else the loader path), check its table and open device `device`.
 * 0, or -1 with one sentence in err (library missing, stale, no GPU). */
int sh_cuda_load(sh_cuda *out, int device, char *err, size_t errlen);
void sh_cuda_unload(sh_cuda *c);

#ifdef __cplusplus
}
#endif
#endif /* SH_CUDA_H */
