/*
 * rt_mem.c — the device services the host calls: dev_alloc / dev_free,
 * activation arenas, memcpy checked against the host's allocations, stats,
 * read_param, launch of the host's work and the compute stream's sync.
 */
#include "rt.h"

#include <string.h>

#include "device_ext.h"
#include "rt_internal.h"

int pt_rt_dev_alloc(pt_rt *rt, uint64_t bytes, const char *tag, void **ptr, char *err,
                    size_t errlen) {
    if (!ptr) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "dev_alloc: ptr is NULL");
    }
    *ptr = NULL;
    if (bytes == 0) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "dev_alloc: zero-byte request (tag %s)", tag ? tag : "(none)");
    }
    return pt_gpu_alloc_host(rt->dev.gpu, (size_t)bytes, pt_mem_tag_parse(tag), ptr, err, errlen);
}

int pt_rt_dev_free(pt_rt *rt, void *ptr, char *err, size_t errlen) {
    if (!ptr) return PT_OK;
    int b = pt_store_is_arena(rt->st, ptr);
    if (b >= 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "dev_free: %p is block %d's activation arena, which the plugin owns", ptr, b);
    /* the host's queued kernels may still use it: free in the compute stream's
     * order; only the host's own blocks (a parameter's address is the plugin's) */
    pt_stream *s = rt->dev.ordered && !(rt->dev.skip & PT_ORD_FREE) ? rt->dev.s_compute : NULL;
    return pt_gpu_free_host(rt->dev.gpu, ptr, s, err, errlen);
}

int pt_rt_arena(pt_rt *rt, int32_t b, uint64_t bytes, void **ptr, char *err, size_t errlen) {
    int rc = pt_rt_need_store(rt, "activation_arena", 0, err, errlen);
    return rc ? rc : pt_acts_arena(rt->st, b, bytes, ptr, err, errlen);
}

int pt_rt_arena_get(pt_rt *rt, int32_t b, void **ptr, char *err, size_t errlen) {
    int rc = pt_rt_need_store(rt, "activation_arena_get", 0, err, errlen);
    return rc ? rc : pt_acts_arena_get(rt->st, b, ptr, err, errlen);
}

int pt_rt_memcpy(pt_rt *rt, void *dst, const void *src, uint64_t bytes, int32_t kind, char *err,
                 size_t errlen) {
    if ((!dst || !src) && bytes) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "memcpy: NULL pointer");
    }
    if (kind < PT_COPY_H2D || kind > PT_COPY_D2D) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "memcpy: unknown copy kind %d (0 H2D, 1 D2H, 2 D2D)", kind);
    }
    /* The device side must lie, whole, in one allocation the host may use: a
     * range that starts in a block and runs on would overwrite the next one
     * (on the simulated device it would also let a host address "work" that
     * faults on a GPU). Pointer arithmetic on the block list: every backend. */
    if (bytes) {
        static const char *const kn[] = {"H2D", "D2H", "D2D"};
        char why[320];
        const void *bad = NULL;
        const char *side = NULL;
        if (kind != PT_COPY_D2H && !pt_gpu_host_range(rt->dev.gpu, dst, (size_t)bytes, why, sizeof why))
            bad = dst, side = "destination";
        else if (kind != PT_COPY_H2D &&
                 !pt_gpu_host_range(rt->dev.gpu, src, (size_t)bytes, why, sizeof why))
            bad = src, side = "source";
        if (bad)
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "memcpy(%s, %llu bytes): the %s %p %s",
                           kn[kind], (unsigned long long)bytes, side, bad, why);
    }
    /* a copy on the compute stream: after the host's launched work */
    int rc = rt->dev.ordered && !(rt->dev.skip & PT_ORD_HOSTIO) ? pt_rt_stream_sync(rt, err, errlen) : PT_OK;
    if (rc) return rc;
    char e[256];
    rc = pt_gpu_memcpy_sync(rt->dev.gpu, dst, src, (size_t)bytes, kind, e, sizeof e);
    if (rc) pt_fail(err, errlen, rc, "memcpy: %s", e);
    return rc;
}

int pt_rt_stats(pt_rt *rt, pt_stats_v1 *out) {
    pt_gpu_usage u;
    pt_gpu_usage_get(rt->dev.gpu, &u);
    pt_stats_v1 s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.dev_capacity = u.capacity;
    s.dev_current = u.current;
    s.dev_peak = u.peak;
    s.pinned_current = u.pinned_current;
    s.pinned_peak = u.pinned_peak;
    s.pinned_arena = u.pinned_arena;
    s.pinned_own_allocs = u.pinned_own_allocs;
    s.h2d_bytes = u.h2d_bytes;
    s.d2h_bytes = u.d2h_bytes;
    s.last_grad_norm = rt->opt.last_norm;
    s.steps = rt->opt.t;
    s.pred_peak = rt->plan.pred_peak;
    s.pred_iter_s = rt->plan.pred_iter_s;
    pt_store_stats(rt->st, &s);
    pt_rt_ext_stats(rt, &s);
    uint32_t n = out->struct_size && out->struct_size < sizeof s ? out->struct_size : sizeof s;
    memcpy(out, &s, n);
    out->struct_size = n;
    return PT_OK;
}

int pt_rt_read_param(pt_rt *rt, int32_t index, void *dst, uint64_t bytes, char *err,
                     size_t errlen) {
    int rc = pt_rt_need_store(rt, "read_param", 0, err, errlen);
    const pt_rt_ext *x = rc ? NULL : pt_rt_ext_reader(rt);
    if (x) return x->read_param(rt, index, dst, bytes, err, errlen);
    return rc ? rc : pt_store_read_param(rt->st, index, dst, bytes, err, errlen);
}

int pt_rt_write_param(pt_rt *rt, int32_t index, const void *src, uint64_t bytes, char *err,
                      size_t errlen) {
    int rc = pt_rt_need_store(rt, "write_param", 0, err, errlen);
    if (rc) return rc;
    /* a feature that reads parameters in the store's place (OSFT's factors)
     * holds values the store's copy does not */
    if (pt_rt_ext_reader(rt))
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "write_param: a feature owns the "
                                                        "parameters' values here (OSFT); writing them is not built");
    return pt_store_write_param(rt->st, index, src, bytes, err, errlen);
}

int pt_rt_launch(pt_rt *rt, void (*fn)(void *), void *arg, char *err, size_t errlen) {
    if (!fn) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "launch: fn is NULL");
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    void *impl = pt_gpu_impl(rt->dev.gpu);
    const pt_rt_ext *x = rt->dev.launch_queued ? pt_rt_ext_launcher(rt) : NULL;
    if (x) return x->launch(rt, fn, arg, err, errlen);
    if (rt->dev.launch_queued) {
        if (ops->host_fn(impl, rt->dev.s_compute, fn, arg))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "launch: queueing work on the compute stream failed: host_fn failed");
        return PT_OK;
    }
    /* cuda: fn enqueues its kernels on the compute stream, behind the plugin's
     * waits; nothing to wait for here */
    if (rt->dev.host_async && strcmp(pt_gpu_backend_name(rt->dev.gpu), "host")) {
        fn(arg);
        return PT_OK;
    }
    /* synchronous: what the stream holds (uploads the hooks ordered) runs first */
    int rc = pt_rt_stream_sync(rt, err, errlen);
    if (rc) return rc;
    fn(arg);
    return PT_OK;
}

int pt_rt_stream_sync(pt_rt *rt, char *err, size_t errlen) {
    const pt_gpu_backend *ops = pt_gpu_ops(rt->dev.gpu);
    if (ops->stream_sync(pt_gpu_impl(rt->dev.gpu), rt->dev.s_compute))
        return pt_fail(err, errlen, PT_ERR_BACKEND, "stream_sync: the compute stream failed");
    return pt_rt_ext_async_status(rt, err, errlen);
}
