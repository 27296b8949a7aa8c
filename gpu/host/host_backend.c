/*
 * host_backend.c — the host backend's vtable: open/close, device and pinned
 * memory, and the enqueueing side of copies and kernels (execution is in
 * host_ops.c, streams and events in host_stream.c).
 *
 * Device memory is an anonymous mmap with MAP_NORESERVE: a simulated 1 GiB
 * device costs no RAM until pages are touched. Fresh device memory is therefore
 * zero on first use, but callers must not rely on that (cudaMalloc does not zero,
 * and the device wrapper hands out recycled, possibly poisoned, blocks).
 * Pinned memory is ordinary 64-byte aligned heap memory of the exact size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "host_backend.h"
#include "rekls_ew.h"
#include "protrain.h"
#include "pt_util.h"

static int hb_open(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen) {
    if (!impl)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "host backend open: impl pointer is NULL");
    if (cfg && cfg->copy_bandwidth != 0.0 &&
        !(cfg->copy_bandwidth >= PT_GPU_COPY_BW_MIN && cfg->copy_bandwidth <= PT_GPU_COPY_BW_MAX))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "host backend open: copy_bandwidth %g bytes/s is outside the accepted "
                       "range: 0 (unthrottled) or %g to %g bytes/s",
                       cfg->copy_bandwidth, PT_GPU_COPY_BW_MIN, PT_GPU_COPY_BW_MAX);
    if (cfg && (cfg->fail_op < 0 || cfg->fail_op >= PT_GPU_OP_COUNT || cfg->fail_op_at < 0))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "host backend open: fail_op %d / fail_op_at %d out of range (op 0..%d, "
                       "call number >= 0)",
                       cfg->fail_op, cfg->fail_op_at, PT_GPU_OP_COUNT - 1);
    hb *h = calloc(1, sizeof *h);
    if (!h)
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "host backend open: out of host memory for the backend state");
    if (cfg) h->cfg = *cfg;
    h->jitter_state = (h->cfg.jitter_seed ? h->cfg.jitter_seed : 1) * 0x9e3779b97f4a7c15ull;
    h->total = h->cfg.capacity ? h->cfg.capacity : PT_HB_DEFAULT_CAPACITY;
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h);
        return pt_fail(err, errlen, PT_ERR_BACKEND, "host backend open: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&h->progress, NULL) != 0) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return pt_fail(err, errlen, PT_ERR_BACKEND, "host backend open: pthread_cond_init failed");
    }
    int rc = pt_hb_trace_open(h, err, errlen);
    if (rc) {
        pthread_cond_destroy(&h->progress);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return rc;
    }
    *impl = h;
    return PT_OK;
}

static void hb_close(void *impl) {
    hb *h = impl;
    if (!h) return;
    /* Streams the caller forgot: drain and join them so no thread outlives us. */
    for (;;) {
        pthread_mutex_lock(&h->mu);
        pt_stream *s = h->live;
        pthread_mutex_unlock(&h->mu);
        if (!s) break;
        pt_hb_stream_destroy(h, s);
    }
    pt_hb_trace_close(h);   /* every stream joined: no op runs any more */
    pthread_cond_destroy(&h->progress);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

static void hb_device_name(void *impl, char *buf, size_t len) {
    hb *h = impl;
    if (!buf || !len) return;
    if (!h) {
        snprintf(buf, len, "host (simulated device)");
        return;
    }
    if (h->cfg.copy_bandwidth > 0.0)
        snprintf(buf, len, "host (simulated device, %.0f MiB, copies at %.1f MB/s)",
                 (double)h->total / 1048576.0, h->cfg.copy_bandwidth / 1e6);
    else
        snprintf(buf, len, "host (simulated device, %.0f MiB, unthrottled copies)",
                 (double)h->total / 1048576.0);
}

static uint64_t hb_total_memory(void *impl) {
    hb *h = impl;
    return h ? h->total : 0;
}

static int hb_dev_alloc(void *impl, size_t bytes, void **p) {
    (void)impl;
    if (!p) return PT_ERR_INVALID_ARG;
    *p = NULL;
    if (bytes == 0) return PT_OK;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) return PT_ERR_OOM;
    *p = m;
    return PT_OK;
}

static void hb_dev_free(void *impl, void *p, size_t bytes) {
    (void)impl;
    if (p && bytes) munmap(p, bytes);
}

static int hb_host_alloc(void *impl, size_t bytes, void **p) {
    (void)impl;
    if (!p) return PT_ERR_INVALID_ARG;
    *p = NULL;
    /* exact size (ProTrain's pinned allocator does not round up); 64-byte aligned
     * for the vectorised CPU optimizer. malloc(0)-like: one aligned byte. */
    if (posix_memalign(p, 64, bytes ? bytes : 1) != 0) {
        *p = NULL;
        return PT_ERR_HOST_OOM;
    }
    return PT_OK;
}

static void hb_host_free(void *impl, void *p, size_t bytes) {
    (void)impl;
    (void)bytes;
    free(p);
}

/* ---- enqueueing ---- */

/* The head every queued op's entry point shares, in this order: the injected
 * failure (PT_ERR_BACKEND; the call counts towards fail_op_at even when its
 * arguments are bad), then the arguments (PT_ERR_INVALID_ARG for a NULL backend
 * or args_ok == 0), then the op itself (PT_ERR_HOST_OOM). args_ok is evaluated
 * by the caller before this runs, so it must be a side-effect-free test of the
 * arguments alone (every one here is). PT_GPU_OP_NONE: the op has no injection
 * point, and pt_hb_inject is not called at all (with fail_op = none and a call
 * number it would otherwise count the call). */
int pt_hb_op_start(void *impl, int inject_op, int args_ok, hb_op_kind kind, hb_op **op) {
    *op = NULL;
    if (inject_op != PT_GPU_OP_NONE && pt_hb_inject(impl, inject_op)) return PT_ERR_BACKEND;
    if (!impl || !args_ok) return PT_ERR_INVALID_ARG;
    *op = pt_hb_op_new(kind);
    return *op ? PT_OK : PT_ERR_HOST_OOM;
}

/* the floating-point pt_dtypes; u8 (frozen opaque bytes) has no element op */
static int valid_dtype(int d) { return d >= 0 && d <= 2; }

static int hb_memset_async(void *impl, void *p, int value, size_t bytes, pt_stream *s) {
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_MEMSET, p || !bytes, HB_OP_MEMSET, &op);
    if (rc != PT_OK) return rc;
    op->u.ms = (hb_memset_args){.p = p, .value = value, .bytes = bytes};
    return pt_hb_submit(impl, s, op);
}

static int hb_memcpy_async(void *impl, void *dst, const void *src, size_t bytes, int kind,
                           pt_stream *s) {
    int ok = ((dst && src) || !bytes) && kind >= PT_GPU_H2D && kind <= PT_GPU_H2H;
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_MEMCPY, ok, HB_OP_MEMCPY, &op);
    if (rc != PT_OK) return rc;
    op->u.cp = (hb_copy_args){.dst = dst, .src = src, .bytes = bytes, .kind = kind};
    return pt_hb_submit(impl, s, op);
}

static int hb_host_fn(void *impl, pt_stream *s, void (*fn)(void *), void *arg) {
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_HOST_FN, fn != NULL, HB_OP_HOSTFN, &op);
    if (rc != PT_OK) return rc;
    op->u.fn = (hb_fn_args){.fn = fn, .arg = arg};
    hb *h = impl;
    if (h->cfg.compute_jitter_s > 0) {
        /* the delay is drawn at submission, in submission order, so a seed gives
         * the same delays whatever the threads' timing (and only for calls that
         * queue an op: a failed call draws nothing) */
        pthread_mutex_lock(&h->mu);
        uint64_t x = h->jitter_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        h->jitter_state = x;
        pthread_mutex_unlock(&h->mu);
        op->u.fn.delay_s = h->cfg.compute_jitter_s * (double)(x >> 11) * 0x1.0p-53;
    }
    return pt_hb_submit(impl, s, op);
}

static int hb_adamw(void *impl, const pt_adamw_args *a, pt_stream *s) {
    int ok = a && (!a->n || (a->param && a->grad && a->m && a->v)) &&
             (!a->param_out || valid_dtype(a->out_dtype));
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_ADAMW, ok, HB_OP_ADAMW, &op);
    if (rc != PT_OK) return rc;
    op->u.adamw = *a; /* by value: the caller's struct may be gone when this runs */
    return pt_hb_submit(impl, s, op);
}

static int hb_sqnorm(void *impl, const void *x, int dtype, size_t n, double *out, pt_stream *s) {
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_SQNORM, out && (x || !n) && valid_dtype(dtype),
                            HB_OP_SQNORM, &op);
    if (rc != PT_OK) return rc;
    op->u.sq = (hb_sqnorm_args){.x = x, .dtype = dtype, .n = n, .out = out};
    return pt_hb_submit(impl, s, op);
}

static int hb_convert(void *impl, void *dst, int dst_dtype, const void *src, int src_dtype,
                      size_t n, int accumulate, pt_stream *s) {
    int ok = ((dst && src) || !n) && valid_dtype(dst_dtype) && valid_dtype(src_dtype);
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_CONVERT, ok, HB_OP_CONVERT, &op);
    if (rc != PT_OK) return rc;
    op->u.cv = (hb_convert_args){.dst = dst, .dst_dtype = dst_dtype, .src = src, .src_dtype = src_dtype, .n = n, .acc = accumulate};
    return pt_hb_submit(impl, s, op);
}

static int hb_eigh(void *impl, int n, float *A, float *w, int *status, pt_stream *s) {
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_EIGH, n == 0 || (n > 0 && A && w), HB_OP_EIGH, &op);
    if (rc != PT_OK) return rc;
    op->u.eig = (hb_eigh_args){.n = n, .A = A, .w = w, .status = status};
    return pt_hb_submit(impl, s, op);
}

static int hb_rekls_ew(void *impl, const pt_rekls_ew_args *a, pt_stream *s) {
    hb_op *op;
    int rc = pt_hb_op_start(impl, PT_GPU_OP_REKLS_EW, pt_rekls_ew_valid(a), HB_OP_REKLS_EW, &op);
    if (rc != PT_OK) return rc;
    op->u.rew = *a;
    return pt_hb_submit(impl, s, op);
}

/* Linked into the plugin, so always the same build as the wrapper; the head is
 * filled anyway so every table reads the same way. set_log only carries the
 * notice of an injected failure (host_faults.c): every real failure of this
 * backend is fully described by its status code. */
const pt_gpu_backend pt_gpu_backend_host = {
    .abi_version = PT_GPU_BACKEND_VERSION,
    .struct_size = sizeof(pt_gpu_backend),
    .name = "host",
    .open = hb_open,
    .close = hb_close,
    .set_log = pt_hb_set_log,
    .device_name = hb_device_name,
    .total_memory = hb_total_memory,
    .dev_alloc = hb_dev_alloc,
    .dev_free = hb_dev_free,
    .host_alloc = hb_host_alloc,
    .host_free = hb_host_free,
    .stream_create = pt_hb_stream_create,
    .stream_destroy = pt_hb_stream_destroy,
    .stream_sync = pt_hb_stream_sync,
    .event_create = pt_hb_event_create,
    .event_destroy = pt_hb_event_destroy,
    .event_record = pt_hb_event_record,
    .stream_wait_event = pt_hb_stream_wait_event,
    .event_sync = pt_hb_event_sync,
    .event_query = pt_hb_event_query,
    .event_elapsed_ms = pt_hb_event_elapsed_ms,
    .memset_async = hb_memset_async,
    .memcpy_async = hb_memcpy_async,
    .host_fn = hb_host_fn,
    .adamw = hb_adamw,
    .sqnorm = hb_sqnorm,
    .convert = hb_convert,
    .event_create_timing = pt_hb_event_create,   /* every host event has a time */
    .gemm_f32 = pt_hb_gemm,
    .cols_f32 = pt_hb_cols,
    .svd_f32 = pt_hb_svd,
    .eigh = hb_eigh,
    .rekls_ew = hb_rekls_ew,
};
