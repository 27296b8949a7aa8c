/*
 * device.c — the device wrapper every backend shares (gpu.h, device_ext.h):
 * backend selection (host / cuda via dlopen: backend_lib.c; auto), one
 * reservation of the whole device budget sub-allocated by the extent allocator
 * (extents.h), exact accounting, poison on free, failure injection, copy-traffic
 * counters, the log hook backends report through. Pinned host memory: pinned.c.
 *
 * One mutex guards the allocator, the maps and the counters: runtime threads and
 * stream-completion callbacks may call in concurrently. The log hook has a
 * second one (see struct pt_gpu in device_internal.h).
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "device_internal.h"
#include "pt_util.h"
#include "protrain.h"

/* ---- open / close ---- */

static void default_log(void *user, int32_t level, const char *msg) {
    (void)user;
    fprintf(stderr, "[protrain gpu %s] %s\n", level <= 0 ? "error" : "warn", msg);
}

/* What the backend reports goes to whatever hook pt_gpu_set_log installed by then. */
static void backend_log(void *user, int32_t level, const char *msg) {
    pt_gpu *g = user;
    pthread_mutex_lock(&g->log_mu);
    pt_gpu_log_fn fn = g->log;
    void *u = g->log_user;
    pthread_mutex_unlock(&g->log_mu);
    fn(u, level, msg);
}

/* Until the device object exists, the backend's first report is kept here so a
 * failed reservation can say what the driver said. */
typedef struct first_report {
    char msg[256];
} first_report;

static void keep_first(void *user, int32_t level, const char *msg) {
    first_report *r = user;
    (void)level;
    if (!r->msg[0]) snprintf(r->msg, sizeof r->msg, "%s", msg);
}

/* Open one backend and reserve the whole budget. On failure closes what it opened
 * (including dl) and fills err. */
static int open_with(const pt_gpu_backend *ops, void *dl, const pt_gpu_config *cfg, pt_gpu **out,
                     char *err, size_t errlen) {
    void *impl = NULL;
    char berr[512] = "";
    int rc = ops->open(cfg, &impl, berr, sizeof berr);
    if (rc != PT_OK) {
        /* the sentence first: ops->name lives in the library dlclose unmaps */
        rc = pt_fail(err, errlen, PT_ERR_BACKEND, "%s backend failed to open: %s", ops->name,
                     berr[0] ? berr : "no reason given");
        if (dl) dlclose(dl);
        return rc;
    }
    first_report first = {""};
    if (ops->set_log) ops->set_log(impl, keep_first, &first);
    uint64_t total = ops->total_memory(impl);
    uint64_t cap = cfg->capacity;
    if (!cap) /* host: total is the configured simulated size; real GPUs: leave 5% */
        cap = strcmp(ops->name, "host") == 0 ? total : total - total / 20;
    cap -= cap % PT_GPU_ALIGN;
    void *base = NULL;
    if (cap == 0 && cfg->capacity) {
        /* not the device's fault: the configured size holds no allocation at all */
        rc = pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                     "[memory] device_capacity = %" PRIu64 " bytes is less than one %u-byte "
                     "allocation unit, so nothing fits; give the model's size (post_model_load "
                     "names what it needs) or auto",
                     cfg->capacity, PT_GPU_ALIGN);
        ops->close(impl);
        if (dl) dlclose(dl);
        return rc;
    }
    if (cap == 0 || ops->dev_alloc(impl, (size_t)cap, &base) != PT_OK || !base) {
        rc = pt_fail(err, errlen, cap == 0 ? PT_ERR_INVALID_ARG : PT_ERR_OOM,
                     "could not reserve %" PRIu64 " bytes of device memory on the %s backend "
                     "(device reports %" PRIu64 " bytes total; lower [memory] capacity)%s%s",
                     cap, ops->name, total, first.msg[0] ? ": " : "", first.msg);
        ops->close(impl);
        if (dl) dlclose(dl);
        return rc;
    }
    pt_gpu *g = calloc(1, sizeof *g);
    int locks = 0;
    if (g && pt_ext_init(&g->dev, cap) == 0 && pthread_mutex_init(&g->mu, NULL) == 0) {
        locks = 1;
        if (pthread_mutex_init(&g->log_mu, NULL) == 0) locks = 2;
    }
    if (locks < 2) {
        if (locks == 1) pthread_mutex_destroy(&g->mu);
        if (g) pt_ext_destroy(&g->dev);
        free(g);
        ops->dev_free(impl, base, (size_t)cap);
        ops->close(impl);
        if (dl) dlclose(dl);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for the device wrapper");
    }
    g->ops = ops;
    g->impl = impl;
    g->dl = dl;
    g->cfg = *cfg;
    /* poisoning costs a memset per free: always on the simulated device (where
     * tests look for stray reads), opt-in on a real one */
    if (strcmp(ops->name, "host")) g->cfg.poison = cfg->poison_native;
    g->base = base;
    g->log = default_log;
    g->u.capacity = cap;
    g->u.pinned_budget = cfg->pinned_budget;
    if (ops->set_log) ops->set_log(impl, backend_log, g); /* `first` goes out of scope */
    *out = g;
    return PT_OK;
}

int pt_gpu_open_lib(const char *kind, const char *lib, const pt_gpu_config *cfg, pt_gpu **out,
                    char *err, size_t errlen) {
    if (!out)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_open: output pointer is NULL");
    *out = NULL;
    pt_gpu_config c;
    memset(&c, 0, sizeof c);
    if (cfg) c = *cfg;
    if (c.fail_alloc_at < 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "fail_alloc_at = %d must be >= 0 (0 disables injection)", c.fail_alloc_at);
    if (!kind) kind = "auto";
    if (strcmp(kind, "host") == 0) return open_with(&pt_gpu_backend_host, NULL, &c, out, err, errlen);
    int is_cuda = strcmp(kind, "cuda") == 0;
    if (!is_cuda && strcmp(kind, "auto") != 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "unknown device kind '%s' (expected host, cuda or auto)", kind);
    const pt_gpu_backend *ops = NULL;
    void *dl = NULL;
    char cerr[768] = "";
    int rc = pt_gpu_load_cuda(lib, &ops, &dl, cerr, sizeof cerr);
    if (rc == PT_OK) rc = open_with(ops, dl, &c, out, cerr, sizeof cerr);
    if (rc == PT_OK) return PT_OK;
    /* auto falls back to host, silently, only when there is no usable cuda device
     * (library missing or refused, or its open failed); a GPU that is there but
     * cannot hold the configured capacity is an error the user must see. The
     * reason stays readable through pt_gpu_fallback_reason. */
    if (is_cuda || rc != PT_ERR_BACKEND) return pt_fail(err, errlen, rc, "%s", cerr);
    rc = open_with(&pt_gpu_backend_host, NULL, &c, out, err, errlen);
    if (rc == PT_OK) snprintf((*out)->fallback, sizeof(*out)->fallback, "%s", cerr);
    return rc;
}

int pt_gpu_open(const char *kind, const pt_gpu_config *cfg, pt_gpu **out, char *err,
                size_t errlen) {
    return pt_gpu_open_lib(kind, NULL, cfg, out, err, errlen);
}

const char *pt_gpu_fallback_reason(const pt_gpu *g) { return g ? g->fallback : ""; }

void pt_gpu_set_log(pt_gpu *g, pt_gpu_log_fn fn, void *user) {
    if (!g) return;
    pthread_mutex_lock(&g->log_mu);
    g->log = fn ? fn : default_log;
    g->log_user = fn ? user : NULL;
    pthread_mutex_unlock(&g->log_mu);
}

void pt_gpu_close(pt_gpu *g) {
    if (!g) return;
    char msg[256];
    if (g->live.n) {
        uint64_t bytes = 0, tb[PT_TAG_COUNT] = {0};
        for (pt_blk *x = g->dev.first; x; x = x->next)
            if (x->state) {
                bytes += x->req;
                tb[x->tag] += x->req;
            }
        int worst = 0;
        for (int t = 1; t < PT_TAG_COUNT; t++)
            if (tb[t] > tb[worst]) worst = t;
        snprintf(msg, sizeof msg,
                 "pt_gpu_close: %zu device allocations (%" PRIu64 " bytes) were never freed; "
                 "most under tag %s (%" PRIu64 " bytes)",
                 g->live.n, bytes, pt_mem_tag_name(worst), tb[worst]);
        g->log(g->log_user, PT_LOG_WARN, msg);
    }
    pt_gpu_pinned_close(g);
    pt_ext_destroy(&g->dev);
    if (g->ovf_base) {
        pt_ext_destroy(&g->ovf);
        g->ops->dev_free(g->impl, g->ovf_base, (size_t)g->ovf_size);
    }
    g->ops->dev_free(g->impl, g->base, (size_t)g->u.capacity);
    g->ops->close(g->impl);
    if (g->dl) dlclose(g->dl);
    pt_ptrmap_free(&g->live);
    pthread_mutex_destroy(&g->log_mu);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

const char *pt_gpu_backend_name(const pt_gpu *g) { return g ? g->ops->name : "none"; }

void pt_gpu_device_name(const pt_gpu *g, char *buf, size_t len) {
    if (!buf || !len) return;
    if (!g) {
        snprintf(buf, len, "none");
        return;
    }
    g->ops->device_name(g->impl, buf, len);
}

const pt_gpu_backend *pt_gpu_ops(const pt_gpu *g) { return g ? g->ops : NULL; }
void *pt_gpu_impl(const pt_gpu *g) { return g ? g->impl : NULL; }

/* ---- device memory ---- */

uint64_t pt_gpu_round_size(uint64_t bytes) {
    if (bytes == 0) return PT_GPU_ALIGN;
    if (bytes > UINT64_MAX - (PT_GPU_ALIGN - 1)) return 0; /* unrepresentable */
    return (bytes + PT_GPU_ALIGN - 1) / PT_GPU_ALIGN * PT_GPU_ALIGN;
}


/* alloc's flags. AL_RECORD: a request that does not fit is kept for
 * pt_gpu_last_oom (without it: a caller's optional buffer, pt_gpu_try_alloc).
 * AL_HOST: the block is the host's (dev_alloc), the only kind dev_free takes. */
enum { AL_RECORD = 1,
       AL_HOST = 2 };

static int alloc(pt_gpu *g, size_t bytes, int tag, void **p, int flags, char *err, size_t errlen) {
    if (!g || !p || tag < 0 || tag >= PT_TAG_COUNT)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_alloc: %s",
                       !g ? "device is NULL" : !p ? "output pointer is NULL"
                                                  : "tag out of range");
    *p = NULL;
    uint64_t size = pt_gpu_round_size(bytes);
    pthread_mutex_lock(&g->mu);
    uint64_t attempt = ++g->attempts;
    if (g->cfg.fail_alloc_at > 0 && attempt == (uint64_t)g->cfg.fail_alloc_at) {
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_OOM,
                       "device out of memory (injected failure): allocation #%" PRIu64
                       " (tag %s, %zu bytes) failed because fail_alloc_at = %d",
                       attempt, pt_mem_tag_name(tag), bytes, g->cfg.fail_alloc_at);
    }
    if (!size) {
        /* no rounding of this request fits in 64 bits: no device could hold it */
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_OOM,
                       "device out of memory: tag %s needs %zu bytes, more than any device "
                       "holds (capacity %" PRIu64 ")",
                       pt_mem_tag_name(tag), bytes,
                       g->u.capacity);
    }
    pt_blk *x = pt_ext_carve(&g->dev, size);
    if (x) x->ovf = 0;
    /* measuring: the request lands past the capacity and is counted as if the
     * device were that much larger, so setup goes on and its peak is known. A
     * host request larger than the whole capacity is refused as always: no
     * device of this size holds it, and a host may rely on that refusal (a
     * caching allocator that probes or falls back) */
    int warn = 0;
    if (!x && g->measuring && (flags & AL_RECORD) &&
        (!(flags & AL_HOST) || size <= g->u.capacity) && (x = pt_ext_carve(&g->ovf, size))) {
        x->ovf = 1;
        warn = !g->overflowed;
        g->overflowed = 1;
        if (g->u.capacity + x->off + x->size > g->ovf_peak)
            g->ovf_peak = g->u.capacity + x->off + x->size;
    }
    if (x && pt_ptrmap_put(&g->live, (uintptr_t)pt_gpu_blk_addr(g, x), (uint64_t)(uintptr_t)x) != 0) {
        pt_ext_release(x->ovf ? &g->ovf : &g->dev, x);
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pt_gpu_alloc: out of host memory for the allocation table");
    }
    if (!x) {
        uint64_t cap = g->u.capacity, freeb = cap > g->u.current ? cap - g->u.current : 0;
        uint64_t largest = pt_ext_largest_free(&g->dev);
        if (flags & AL_RECORD) {
            g->oom_need = g->u.current + size;
            memcpy(g->oom_tags, g->u.tag_current, sizeof g->oom_tags);
        }
        uint64_t atleast = g->u.current + size;
        int whole = g->measuring && size > cap;
        pthread_mutex_unlock(&g->mu);
        if (whole)   /* a host request refused while measuring (above) */
            return pt_fail(err, errlen, PT_ERR_OOM,
                           "device out of memory: tag %s needs %zu bytes, more than the whole "
                           "capacity of %" PRIu64 ": the device needs at least %" PRIu64
                           " bytes (this request plus the bytes in use)",
                           pt_mem_tag_name(tag), bytes, cap, atleast);
        if (size == bytes)
            return pt_fail(err, errlen, PT_ERR_OOM,
                           "device out of memory: tag %s needs %zu bytes, %" PRIu64
                           " free of %" PRIu64 " capacity (largest free block %" PRIu64 ")",
                           pt_mem_tag_name(tag), bytes, freeb, cap, largest);
        return pt_fail(err, errlen, PT_ERR_OOM,
                       "device out of memory: tag %s needs %zu bytes (%" PRIu64 " with %u-byte "
                       "alignment), %" PRIu64 " free of %" PRIu64 " capacity (largest free block %" PRIu64 ")",
                       pt_mem_tag_name(tag), bytes, size, PT_GPU_ALIGN, freeb, cap, largest);
    }
    x->req = bytes;
    x->tag = tag;
    x->host = (flags & AL_HOST) != 0;
    g->u.current += x->size;
    g->u.req_current += bytes;
    if (!x->ovf && x->off + x->size > g->u.span_peak) g->u.span_peak = x->off + x->size;
    if (g->u.current > g->u.peak) {
        g->u.peak = g->u.current;
        g->u.peak_req = g->u.req_current;
        g->u.peak_largest_free = pt_ext_largest_free(&g->dev);
    }
    g->u.tag_current[tag] += x->size;
    if (g->u.tag_current[tag] > g->u.tag_peak[tag]) g->u.tag_peak[tag] = g->u.tag_current[tag];
    g->u.n_allocs++;
    *p = pt_gpu_blk_addr(g, x);
    uint64_t cur = g->u.current;
    pthread_mutex_unlock(&g->mu);
    if (warn) {
        char msg[400];
        snprintf(msg, sizeof msg, "device capacity of %" PRIu64 " bytes exceeded (tag %s, %zu "
                                  "bytes; %" PRIu64 " in use with it): the setup goes on past it only to measure "
                                  "what it needs, and post_model_load will fail naming that size",
                 g->u.capacity, pt_mem_tag_name(tag), bytes, cur);
        backend_log(g, PT_LOG_WARN, msg);
    }
    return PT_OK;
}

int pt_gpu_alloc(pt_gpu *g, size_t bytes, int tag, void **p, char *err, size_t errlen) {
    return alloc(g, bytes, tag, p, AL_RECORD, err, errlen);
}

int pt_gpu_try_alloc(pt_gpu *g, size_t bytes, int tag, void **p, char *err, size_t errlen) {
    return alloc(g, bytes, tag, p, 0, err, errlen);
}

int pt_gpu_alloc_host(pt_gpu *g, size_t bytes, int tag, void **p, char *err, size_t errlen) {
    return alloc(g, bytes, tag, p, AL_RECORD | AL_HOST, err, errlen);
}

/* Frees a live block. s == NULL: the poison (when on) is written before the
 * block can be handed out again. Otherwise stream-ordered: the block is free at
 * once and its poison is queued on s behind the work already there. host_only:
 * the block must be one of the host's (pt_gpu_alloc_host); a plugin block, or an
 * address inside any block, is refused with a sentence saying what it is. */
static int free_block(pt_gpu *g, void *p, pt_stream *s, int host_only, char *err, size_t errlen) {
    if (!g) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_free: device is NULL");
    if (!p) return PT_OK;
    uint64_t v;
    pthread_mutex_lock(&g->mu);
    int found = pt_ptrmap_get(&g->live, (uintptr_t)p, &v);
    if (!found || (host_only && !((pt_blk *)(uintptr_t)v)->host)) {
        char what[256];
        pt_gpu_describe_locked(g, p, what, sizeof what);
        pthread_mutex_unlock(&g->mu);
        if (host_only)
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "dev_free: %p is not an allocation from dev_alloc: %s", p, what);
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "pt_gpu_free: %p is not a live device allocation (never allocated by this "
                       "device, already freed, or not the start of a block): %s",
                       p, what);
    }
    pt_blk *x = (pt_blk *)(uintptr_t)v;
    pt_ptrmap_del(&g->live, (uintptr_t)p);
    int rc = 0;
    if (g->cfg.poison && s) {
        rc = g->ops->memset_async(g->impl, p, 0xFF, (size_t)x->size, s);
    } else if (g->cfg.poison) {
        /* Unfindable (a second free fails) but not yet free (nobody can get it):
         * poison it without holding the lock, then give it back. */
        x->state = 2;
        pthread_mutex_unlock(&g->mu);
        /* a free has no status to fail with: an unpoisoned block is only a lost
         * debugging aid, so it is reported and the block still goes back */
        const char *bad = g->ops->memset_async(g->impl, p, 0xFF, (size_t)x->size, NULL) ? "memset"
                          : g->ops->stream_sync(g->impl, NULL)                          ? "stream_sync"
                                                                                        : NULL;
        if (bad) {
            char msg[160];
            snprintf(msg, sizeof msg, "pt_gpu_free: the poison fill of %p failed (%s)", p, bad);
            backend_log(g, PT_LOG_WARN, msg);
        }
        pthread_mutex_lock(&g->mu);
    }
    g->u.current -= x->size;
    g->u.req_current -= x->req;
    g->u.tag_current[x->tag] -= x->size;
    pt_ext_release(x->ovf ? &g->ovf : &g->dev, x);
    pthread_mutex_unlock(&g->mu);
    return rc ? pt_fail(err, errlen, PT_ERR_BACKEND,
                        "pt_gpu_free: queueing the poison fill (memset) on the stream failed")
              : PT_OK;
}

int pt_gpu_free_checked(pt_gpu *g, void *p, char *err, size_t errlen) {
    return free_block(g, p, NULL, 0, err, errlen);
}

int pt_gpu_free_host(pt_gpu *g, void *p, pt_stream *s, char *err, size_t errlen) {
    return free_block(g, p, s, 1, err, errlen);
}

void pt_gpu_free(pt_gpu *g, void *p) { (void)pt_gpu_free_checked(g, p, NULL, 0); }

size_t pt_gpu_alloc_size(const pt_gpu *g, const void *p) {
    if (!g || !p) return 0;
    uint64_t v;
    size_t n = 0;
    pthread_mutex_lock(pt_gpu_mu(g));
    if (pt_ptrmap_get(&g->live, (uintptr_t)p, &v)) n = (size_t)((const pt_blk *)(uintptr_t)v)->req;
    pthread_mutex_unlock(pt_gpu_mu(g));
    return n;
}

size_t pt_gpu_live_allocs(const pt_gpu *g) {
    if (!g) return 0;
    pthread_mutex_lock(pt_gpu_mu(g));
    size_t n = g->live.n;
    pthread_mutex_unlock(pt_gpu_mu(g));
    return n;
}


uint64_t pt_gpu_largest_free(const pt_gpu *g) {
    if (!g) return 0;
    pthread_mutex_lock(pt_gpu_mu(g));
    uint64_t m = pt_ext_largest_free(&g->dev);
    pthread_mutex_unlock(pt_gpu_mu(g));
    return m;
}

size_t pt_gpu_free_extents(const pt_gpu *g) {
    if (!g) return 0;
    size_t n = 0;
    pthread_mutex_lock(pt_gpu_mu(g));
    n = pt_ext_free_count(&g->dev);
    pthread_mutex_unlock(pt_gpu_mu(g));
    return n;
}

/* ---- counters ---- */

double pt_gpu_frag_factor(const pt_gpu_usage *u) {
    if (!u || !u->peak || u->span_peak <= u->peak) return 1.0;
    /* The tail above the high water is one free block, so the largest free block
     * at the peak is at least capacity - span: span_peak also bounds the range
     * "everything but the largest free block" at the peak. */
    return (double)u->span_peak / (double)u->peak;
}

void pt_gpu_usage_get(const pt_gpu *g, pt_gpu_usage *u) {
    if (!u) return;
    if (!g) {
        memset(u, 0, sizeof *u);
        return;
    }
    pthread_mutex_lock(pt_gpu_mu(g));
    *u = g->u;
    pthread_mutex_unlock(pt_gpu_mu(g));
}

void pt_gpu_reset_peak(pt_gpu *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->u.peak = g->u.current;
    g->u.peak_req = g->u.req_current;
    g->u.peak_largest_free = pt_ext_largest_free(&g->dev);
    g->u.span_peak = pt_ext_high_water(&g->dev);
    for (int t = 0; t < PT_TAG_COUNT; t++) g->u.tag_peak[t] = g->u.tag_current[t];
    g->u.pinned_peak = g->u.pinned_current;
    pthread_mutex_unlock(&g->mu);
}

/* ---- copies ---- */

int pt_gpu_memcpy_async(pt_gpu *g, void *dst, const void *src, size_t bytes, int kind,
                        pt_stream *s) {
    if (!g) return PT_ERR_INVALID_ARG;
    int rc = g->ops->memcpy_async(g->impl, dst, src, bytes, kind, s);
    if (rc == PT_OK && (kind == PT_GPU_H2D || kind == PT_GPU_D2H)) {
        pthread_mutex_lock(&g->mu);
        if (kind == PT_GPU_H2D) g->u.h2d_bytes += bytes;
        else g->u.d2h_bytes += bytes;
        pthread_mutex_unlock(&g->mu);
    }
    return rc;
}

int pt_gpu_memcpy(pt_gpu *g, void *dst, const void *src, size_t bytes, int kind) {
    int rc = pt_gpu_memcpy_async(g, dst, src, bytes, kind, NULL);
    if (rc == PT_OK) rc = g->ops->stream_sync(g->impl, NULL);
    return rc;
}

int pt_gpu_memcpy_sync(pt_gpu *g, void *dst, const void *src, size_t bytes, int kind, char *err,
                       size_t errlen) {
    static const char *const dir[] = {"H2D", "D2H", "D2D", "H2H"};
    int rc = pt_gpu_memcpy_async(g, dst, src, bytes, kind, NULL);
    const char *op = rc ? "memcpy" : NULL;
    if (!rc && (rc = g->ops->stream_sync(g->impl, NULL))) op = "stream_sync after the copy";
    if (!rc) return PT_OK;
    return pt_fail(err, errlen, rc, "%s copy of %zu bytes on the %s backend failed (%s)",
                   kind >= 0 && kind <= PT_GPU_H2H ? dir[kind] : "unknown-kind", bytes,
                   g->ops->name, op);
}

static int in_range(const void *p, size_t bytes, const uint8_t *base, uint64_t size) {
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)base, cap = (uintptr_t)size;
    return base && a >= lo && a - lo <= cap && bytes <= cap - (a - lo);
}

int pt_gpu_in_device(const pt_gpu *g, const void *p, size_t bytes) {
    if (!g || !g->base || !p) return 0;
    return in_range(p, bytes, g->base, g->u.capacity) ||
           in_range(p, bytes, g->ovf_base, g->ovf_size);
}

/* The overflow range: address space only where the backend's memory is
 * (the simulated device maps it lazily, MAP_NORESERVE), so untouched bytes
 * cost nothing; at most half the machine's memory, so a model far past every
 * capacity fails as before instead of exhausting the host. */
int pt_gpu_measure_begin(pt_gpu *g) {
    if (!g || strcmp(g->ops->name, "host")) return 0;
    pthread_mutex_lock(&g->mu);
    if (!g->ovf_base) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        uint64_t size = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : 0;
        size -= size % PT_GPU_ALIGN;
        void *b = NULL;
        if (size && g->ops->dev_alloc(g->impl, (size_t)size, &b) == PT_OK && b) {
            if (pt_ext_init(&g->ovf, size) == 0) {
                g->ovf_base = b;
                g->ovf_size = size;
            } else {
                g->ops->dev_free(g->impl, b, (size_t)size);
            }
        }
    }
    g->measuring = g->ovf_base != NULL;
    g->overflowed = 0;
    g->ovf_peak = 0;
    int on = g->measuring;
    pthread_mutex_unlock(&g->mu);
    return on;
}

int pt_gpu_measuring(const pt_gpu *g) {
    if (!g) return 0;
    pthread_mutex_lock(pt_gpu_mu(g));
    int on = g->measuring;
    pthread_mutex_unlock(pt_gpu_mu(g));
    return on;
}

uint64_t pt_gpu_measure_end(pt_gpu *g) {
    if (!g) return 0;
    pthread_mutex_lock(&g->mu);
    uint64_t need = 0;
    if (g->measuring && g->overflowed)
        need = g->ovf_peak > g->u.span_peak ? g->ovf_peak : g->u.span_peak;
    g->measuring = 0;
    pthread_mutex_unlock(&g->mu);
    return need;
}

uint64_t pt_gpu_last_oom(const pt_gpu *g, uint64_t tag_current[PT_TAG_COUNT]) {
    if (!g) return 0;
    pthread_mutex_lock(pt_gpu_mu(g));
    uint64_t need = g->oom_need;
    if (tag_current) memcpy(tag_current, g->oom_tags, sizeof g->oom_tags);
    pthread_mutex_unlock(pt_gpu_mu(g));
    return need;
}

void pt_gpu_oom_reset(pt_gpu *g) {
    if (!g) return;
    pthread_mutex_lock(pt_gpu_mu(g));
    g->oom_need = 0;
    pthread_mutex_unlock(pt_gpu_mu(g));
}

/* Stream-ordered free: the block goes back to the allocator now (accounting
 * stays exact), and with poison on, its NaN fill is queued on s, so it lands
 * after the work already queued there that may still read or write the block.
 * The next owner of these bytes must order its own writes after s: work on s
 * itself is ordered by FIFO; a copy on another stream waits for an event
 * recorded on s (which also covers the poison). */
int pt_gpu_free_on_stream(pt_gpu *g, void *p, pt_stream *s, char *err, size_t errlen) {
    if (!s) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_free_on_stream: no stream");
    return free_block(g, p, s, 0, err, errlen);
}

int pt_gpu_adopt_stream(pt_gpu *g, void *native, pt_stream **s, char *err, size_t errlen) {
    if (!g || !native || !s)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "adopt stream: NULL argument");
    if (strcmp(g->ops->name, "cuda"))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "pt_host_v1.compute_stream is set, but the %s backend has no native "
                       "streams: leave it NULL and launch work through the plugin's launch hook",
                       g->ops->name);
    *s = (pt_stream *)native;   /* the cuda backend's pt_stream* is a cudaStream_t */
    return PT_OK;
}

int pt_gpu_event_create_timing(pt_gpu *g, pt_event **e) {
    if (!g || !e) return PT_ERR_INVALID_ARG;
    if (g->ops->event_create_timing) return g->ops->event_create_timing(g->impl, e);
    return g->ops->event_create(g->impl, e);
}
