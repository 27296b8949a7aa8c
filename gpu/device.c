/*
 * device.c — the device wrapper every backend shares (gpu.h, device_ext.h):
 * backend selection (host / cuda via dlopen, the library's table version checked
 * / auto), one reservation of the whole device budget sub-allocated by our own
 * allocator, exact accounting, poison on free, pinned-memory budget, failure
 * injection, copy-traffic counters, the log hook backends report through.
 *
 * Allocator: blocks (free and live) form an address-ordered doubly linked list
 * covering [0, capacity) of the reservation; free blocks also sit in one of 64
 * size bins, bin = floor(log2(size / 256)). A request takes the best fit (smallest
 * block >= size, lowest offset on ties) from the first bin that has a fitting
 * block: every block in a higher bin fits, so at most the blocks of two bins are
 * scanned. Live blocks are found by pointer through an open-addressing hash map.
 * Block headers live in host memory (device memory is not addressable on cuda).
 *
 * One mutex guards the allocator, the maps and the counters: runtime threads and
 * stream-completion callbacks may call in concurrently. The log hook has a
 * second one (see struct pt_gpu).
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

#include "device_ext.h"
#include "pt_util.h"
#include "gpu.h"
#include "protrain.h"

#define NBINS 64

typedef struct blk {
    uint64_t off, size;        /* extent in the reservation; size % PT_GPU_ALIGN == 0 */
    uint64_t req;              /* bytes the caller asked for (live blocks) */
    int tag;
    int state;                 /* 0 free, 1 live, 2 being poisoned (not free, not findable) */
    struct blk *prev, *next;   /* address order */
    struct blk *fprev, *fnext; /* bin list (free blocks only) */
} blk;

/* Open addressing, linear probing, backward-shift deletion; key 0 = empty. */
typedef struct pmap {
    uintptr_t *keys;
    uint64_t *vals;
    size_t cap, n;             /* cap a power of two, n <= cap / 2 */
} pmap;

struct pt_gpu {
    const pt_gpu_backend *ops;
    void *impl;
    void *dl;                  /* cuda backend library handle, or NULL */
    pt_gpu_config cfg;
    pthread_mutex_t mu;
    uint8_t *base;             /* the reservation: capacity bytes */
    blk *first;
    blk *bins[NBINS];
    pmap live;                 /* device pointer -> blk* */
    pmap pinned;               /* pinned pointer -> bytes */
    uint64_t attempts;         /* pt_gpu_alloc calls so far (failure injection) */
    pt_gpu_usage u;
    /* The log hook has its own lock: the backend reports through it from inside
     * ops that device.c calls with mu held (host_alloc, for one). */
    pthread_mutex_t log_mu;
    pt_gpu_log_fn log;
    void *log_user;
    char fallback[768];        /* why auto did not open cuda; "" otherwise */
};

/* ---- tags ---- */

static const char *const tag_names[PT_TAG_COUNT] = {"param", "grad",    "optim",   "buffer",
                                                     "act",   "scratch", "hostuse", "other"};

const char *pt_mem_tag_name(int tag) {
    return (tag >= 0 && tag < PT_TAG_COUNT) ? tag_names[tag] : "invalid";
}

int pt_mem_tag_parse(const char *s) {
    static const struct { const char *name; int tag; } alias[] = {
        {"params", PT_TAG_PARAM},      {"parameter", PT_TAG_PARAM},  {"grads", PT_TAG_GRAD},
        {"gradient", PT_TAG_GRAD},     {"optimizer", PT_TAG_OPTIM},  {"chunk", PT_TAG_BUFFER},
        {"activation", PT_TAG_ACT},    {"activations", PT_TAG_ACT},  {"acts", PT_TAG_ACT},
        {"workspace", PT_TAG_SCRATCH}, {"tmp", PT_TAG_SCRATCH},      {"temp", PT_TAG_SCRATCH},
    };
    if (!s) return PT_TAG_HOSTUSE;
    for (int t = 0; t < PT_TAG_COUNT; t++)
        if (strcasecmp(s, tag_names[t]) == 0) return t;
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (strcasecmp(s, alias[i].name) == 0) return alias[i].tag;
    return PT_TAG_HOSTUSE; /* "input", "logits", anything else the host names */
}

/* ---- pointer map ---- */

static size_t slot_of(const pmap *m, uintptr_t k) {
    uint64_t h = (uint64_t)k * 0x9E3779B97F4A7C15ull; /* Fibonacci hashing */
    return (size_t)(h >> 32) & (m->cap - 1);
}

static int pmap_grow(pmap *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uintptr_t *nk = calloc(ncap, sizeof *nk);
    uint64_t *nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return -1;
    }
    pmap o = *m;
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
    for (size_t i = 0; i < o.cap; i++) {
        if (!o.keys[i]) continue;
        size_t j = slot_of(m, o.keys[i]);
        while (m->keys[j]) j = (j + 1) & (ncap - 1);
        m->keys[j] = o.keys[i];
        m->vals[j] = o.vals[i];
    }
    free(o.keys);
    free(o.vals);
    return 0;
}

static int pmap_put(pmap *m, uintptr_t k, uint64_t v) {
    if ((m->n + 1) * 2 > m->cap && pmap_grow(m) != 0) return -1;
    size_t j = slot_of(m, k);
    while (m->keys[j] && m->keys[j] != k) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) m->n++;
    m->keys[j] = k;
    m->vals[j] = v;
    return 0;
}

/* Returns 1 and *v when found. */
static int pmap_get(const pmap *m, uintptr_t k, uint64_t *v) {
    if (!m->cap || !k) return 0;
    for (size_t j = slot_of(m, k); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        if (m->keys[j] == k) {
            if (v) *v = m->vals[j];
            return 1;
        }
    }
    return 0;
}

static void pmap_del(pmap *m, uintptr_t k) {
    if (!m->cap || !k) return;
    size_t mask = m->cap - 1, j = slot_of(m, k);
    while (m->keys[j] && m->keys[j] != k) j = (j + 1) & mask;
    if (!m->keys[j]) return;
    m->keys[j] = 0;
    m->n--;
    /* backward shift: move later members of the probe run into the hole when
     * their home slot does not lie cyclically in (hole, their slot]. */
    for (size_t i = (j + 1) & mask; m->keys[i]; i = (i + 1) & mask) {
        size_t home = slot_of(m, m->keys[i]);
        int stays = (j <= i) ? (home > j && home <= i) : (home > j || home <= i);
        if (stays) continue;
        m->keys[j] = m->keys[i];
        m->vals[j] = m->vals[i];
        m->keys[i] = 0;
        j = i;
    }
}

static void pmap_free(pmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- allocator (caller holds g->mu) ---- */

static int bin_of(uint64_t size) {
    uint64_t units = size / PT_GPU_ALIGN; /* >= 1 */
    int b = 63 - __builtin_clzll(units);
    return b < NBINS ? b : NBINS - 1;
}

static void bin_insert(pt_gpu *g, blk *x) {
    int b = bin_of(x->size);
    x->fprev = NULL;
    x->fnext = g->bins[b];
    if (g->bins[b]) g->bins[b]->fprev = x;
    g->bins[b] = x;
}

static void bin_remove(pt_gpu *g, blk *x) {
    if (x->fprev) x->fprev->fnext = x->fnext;
    else g->bins[bin_of(x->size)] = x->fnext;
    if (x->fnext) x->fnext->fprev = x->fprev;
    x->fprev = x->fnext = NULL;
}

static blk *find_fit(pt_gpu *g, uint64_t size) {
    for (int b = bin_of(size); b < NBINS; b++) {
        blk *best = NULL;
        for (blk *x = g->bins[b]; x; x = x->fnext)
            if (x->size >= size &&
                (!best || x->size < best->size || (x->size == best->size && x->off < best->off)))
                best = x;
        if (best) return best;
    }
    return NULL;
}

static blk *carve(pt_gpu *g, uint64_t size) {
    blk *x = find_fit(g, size);
    if (!x) return NULL;
    bin_remove(g, x);
    if (x->size - size >= PT_GPU_ALIGN) {
        blk *r = calloc(1, sizeof *r);
        if (r) { /* without a header for the tail the whole block is handed out */
            r->off = x->off + size;
            r->size = x->size - size;
            r->prev = x;
            r->next = x->next;
            if (x->next) x->next->prev = r;
            x->next = r;
            x->size = size;
            bin_insert(g, r);
        }
    }
    x->state = 1;
    return x;
}

/* Merge b into a (a directly precedes b); b's header goes. */
static void absorb(blk *a, blk *b) {
    a->size += b->size;
    a->next = b->next;
    if (b->next) b->next->prev = a;
    free(b);
}

static void release(pt_gpu *g, blk *x) {
    x->state = 0;
    x->req = 0;
    if (x->next && x->next->state == 0) {
        bin_remove(g, x->next);
        absorb(x, x->next);
    }
    if (x->prev && x->prev->state == 0) {
        blk *p = x->prev;
        bin_remove(g, p);
        absorb(p, x);
        x = p;
    }
    bin_insert(g, x);
}

static uint64_t largest_free_locked(const pt_gpu *g) {
    for (int b = NBINS - 1; b >= 0; b--) {
        if (!g->bins[b]) continue;
        uint64_t m = 0;
        for (const blk *x = g->bins[b]; x; x = x->fnext)
            if (x->size > m) m = x->size;
        return m;
    }
    return 0;
}

/* ---- the cuda backend library ---- */

/* How far past this build's version a library is probed, to tell "too new" from
 * "not a cuda backend". */
#define BACKEND_PROBE_AHEAD 16u

static const char self_anchor = 0; /* dladdr on this finds the file we were linked into */

static const void *find_sym(void *h, const char *name) {
    dlerror(); /* clear a stale error so the check below sees only this lookup's */
    void *p = dlsym(h, name);
    return dlerror() ? NULL : p;
}

static const void *find_version(void *h, uint32_t v) {
    char name[64];
    snprintf(name, sizeof name, "%s_v%u", PT_CUDA_BACKEND_SYMBOL_STEM, (unsigned)v);
    return find_sym(h, name);
}

/* Bytes the library's object file gives the symbol at addr; 0 when it says nothing.
 * A table may not claim more than this. */
static size_t symbol_bytes(const void *addr) {
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (!dladdr1(addr, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym) return 0;
    if (info.dli_saddr != addr) return 0;
    return (size_t)sym->st_size;
}

/* The library has no table of this build's version: say which version it has. */
static int explain_missing(void *h, const char *path, char *err, size_t errlen) {
    for (uint32_t v = PT_GPU_BACKEND_VERSION + BACKEND_PROBE_AHEAD; v > PT_GPU_BACKEND_VERSION; v--)
        if (find_version(h, v))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "cuda backend library %s is too new: it exports %s_v%u (backend "
                           "table version %u) but this plugin speaks version %u; use the "
                           "%s built with this plugin",
                           path, PT_CUDA_BACKEND_SYMBOL_STEM, (unsigned)v, (unsigned)v,
                           (unsigned)PT_GPU_BACKEND_VERSION, PT_CUDA_BACKEND_LIB);
    for (uint32_t v = PT_GPU_BACKEND_VERSION; v-- > 0;)
        if (find_version(h, v))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "cuda backend library %s is too old: it exports %s_v%u (backend "
                           "table version %u) but this plugin speaks version %u; use the "
                           "%s built with this plugin",
                           path, PT_CUDA_BACKEND_SYMBOL_STEM, (unsigned)v, (unsigned)v,
                           (unsigned)PT_GPU_BACKEND_VERSION, PT_CUDA_BACKEND_LIB);
    if (find_sym(h, PT_CUDA_BACKEND_SYMBOL_STEM))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s is too old: it exports only the unversioned "
                       "%s (backend table version 0, from before tables were versioned) but "
                       "this plugin speaks version %u; use the %s built with this plugin",
                       path, PT_CUDA_BACKEND_SYMBOL_STEM, (unsigned)PT_GPU_BACKEND_VERSION,
                       PT_CUDA_BACKEND_LIB);
    return pt_fail(err, errlen, PT_ERR_BACKEND,
                   "cuda backend library %s does not export %s (nor any other version of it): "
                   "it is not a protrain cuda backend",
                   path, PT_CUDA_BACKEND_SYMBOL);
}

/* Take this build's table from an opened library, or say why it is refused.
 * Nothing past the 8-byte head is read before struct_size (and the symbol's size,
 * when known) vouch for it. */
static int take_table(void *h, const char *path, const pt_gpu_backend **ops, char *err,
                      size_t errlen) {
    const pt_gpu_backend *b = find_sym(h, PT_CUDA_BACKEND_SYMBOL);
    if (!b) return explain_missing(h, path, err, errlen);
    const size_t head = offsetof(pt_gpu_backend, name), need = sizeof *b;
    size_t bytes = symbol_bytes(b);
    if (bytes && bytes < head)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s: its %s is only %zu bytes, too short for a "
                       "backend table of any version (this plugin speaks version %u)",
                       path, PT_CUDA_BACKEND_SYMBOL, bytes, (unsigned)PT_GPU_BACKEND_VERSION);
    if (b->abi_version != PT_GPU_BACKEND_VERSION)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s exports %s but its table says version %u, and "
                       "this plugin speaks version %u; use the %s built with this plugin",
                       path, PT_CUDA_BACKEND_SYMBOL, (unsigned)b->abi_version,
                       (unsigned)PT_GPU_BACKEND_VERSION, PT_CUDA_BACKEND_LIB);
    if (b->struct_size < need)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s: its version %u table is %u bytes, smaller than "
                       "this plugin's version %u table of %zu bytes, so it was built from other "
                       "sources; use the %s built with this plugin",
                       path, (unsigned)b->abi_version, (unsigned)b->struct_size,
                       (unsigned)PT_GPU_BACKEND_VERSION, need, PT_CUDA_BACKEND_LIB);
    if (bytes && bytes < need)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s: its version %u table says %u bytes but the "
                       "symbol %s holds only %zu, less than this plugin's version %u table of "
                       "%zu bytes",
                       path, (unsigned)b->abi_version, (unsigned)b->struct_size,
                       PT_CUDA_BACKEND_SYMBOL, bytes, (unsigned)PT_GPU_BACKEND_VERSION, need);
    if (!b->name || !b->open)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s: its version %u table has no %s", path,
                       (unsigned)b->abi_version, !b->name ? "name" : "open op");
    *ops = b;
    return PT_OK;
}

/* Load the cuda backend library: `lib` as given, or (lib NULL) the default search,
 * beside the file device.c was linked into, then the loader path. */
static int load_cuda(const char *lib, const pt_gpu_backend **ops, void **dl, char *err,
                     size_t errlen) {
    char path[4096] = "";
    void *h = NULL;
    if (lib) {
        snprintf(path, sizeof path, "%s", lib);
        h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "cuda backend library %s failed to load: %s", lib,
                           e ? e : "unknown dlopen error");
        }
    } else {
        Dl_info di;
        if (dladdr(&self_anchor, &di) && di.dli_fname) {
            const char *slash = strrchr(di.dli_fname, '/');
            if (slash) {
                snprintf(path, sizeof path, "%.*s/%s", (int)(slash - di.dli_fname), di.dli_fname,
                         PT_CUDA_BACKEND_LIB);
                if (access(path, F_OK) == 0) {
                    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
                    if (!h) {
                        const char *e = dlerror();
                        return pt_fail(err, errlen, PT_ERR_BACKEND,
                                       "cuda backend library %s exists but failed to load: %s",
                                       path, e ? e : "unknown dlopen error");
                    }
                }
            }
        }
        if (!h) {
            h = dlopen(PT_CUDA_BACKEND_LIB, RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                const char *e = dlerror();
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "cuda backend library %s not found (tried %s, then the loader "
                               "path: %s)",
                               PT_CUDA_BACKEND_LIB, path[0] ? path : "beside the plugin",
                               e ? e : "no detail");
            }
            snprintf(path, sizeof path, "%s", PT_CUDA_BACKEND_LIB);
        }
    }
    int rc = take_table(h, path, ops, err, errlen);
    if (rc != PT_OK) {
        dlclose(h);
        return rc;
    }
    *dl = h;
    return PT_OK;
}

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
typedef struct first_report { char msg[256]; } first_report;

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
    blk *all = calloc(1, sizeof *all);
    int locks = 0;
    if (g && all && pthread_mutex_init(&g->mu, NULL) == 0) {
        locks = 1;
        if (pthread_mutex_init(&g->log_mu, NULL) == 0) locks = 2;
    }
    if (locks < 2) {
        if (locks == 1) pthread_mutex_destroy(&g->mu);
        free(g);
        free(all);
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
    all->size = cap;
    g->first = all;
    bin_insert(g, all);
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
    int rc = load_cuda(lib, &ops, &dl, cerr, sizeof cerr);
    if (rc == PT_OK) rc = open_with(ops, dl, &c, out, cerr, sizeof cerr);
    if (rc == PT_OK) return PT_OK;
    /* auto falls back to host, silently, only when there is no usable cuda device
     * (library missing or refused, or its open failed); a GPU that is there but
     * cannot hold the configured capacity is an error the user must see. The
     * reason stays readable through pt_gpu_fallback_reason. */
    if (is_cuda || rc != PT_ERR_BACKEND) return pt_fail(err, errlen, rc, "%s", cerr);
    rc = open_with(&pt_gpu_backend_host, NULL, &c, out, err, errlen);
    if (rc == PT_OK) snprintf((*out)->fallback, sizeof (*out)->fallback, "%s", cerr);
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
        for (blk *x = g->first; x; x = x->next)
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
    if (g->pinned.n) {
        snprintf(msg, sizeof msg,
                 "pt_gpu_close: %zu pinned allocations (%" PRIu64 " bytes) were never freed; "
                 "freeing them now",
                 g->pinned.n, g->u.pinned_current);
        g->log(g->log_user, PT_LOG_WARN, msg);
        for (size_t i = 0; i < g->pinned.cap; i++)
            if (g->pinned.keys[i])
                g->ops->host_free(g->impl, (void *)g->pinned.keys[i], (size_t)g->pinned.vals[i]);
    }
    for (blk *x = g->first, *n; x; x = n) {
        n = x->next;
        free(x);
    }
    g->ops->dev_free(g->impl, g->base, (size_t)g->u.capacity);
    g->ops->close(g->impl);
    if (g->dl) dlclose(g->dl);
    pmap_free(&g->live);
    pmap_free(&g->pinned);
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

/* The mutex is logically mutable: const getters lock it too. */
static pthread_mutex_t *mu_of(const pt_gpu *g) { return (pthread_mutex_t *)&g->mu; }

int pt_gpu_alloc(pt_gpu *g, size_t bytes, int tag, void **p, char *err, size_t errlen) {
    if (!g || !p || tag < 0 || tag >= PT_TAG_COUNT)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_alloc: %s",
                       !g ? "device is NULL" : !p ? "output pointer is NULL" : "tag out of range");
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
    blk *x = size ? carve(g, size) : NULL;
    if (x && pmap_put(&g->live, (uintptr_t)(g->base + x->off), (uint64_t)(uintptr_t)x) != 0) {
        release(g, x);
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pt_gpu_alloc: out of host memory for the allocation table");
    }
    if (!x) {
        uint64_t cap = g->u.capacity, freeb = cap - g->u.current;
        uint64_t largest = largest_free_locked(g);
        pthread_mutex_unlock(&g->mu);
        if (size == bytes)
            return pt_fail(err, errlen, PT_ERR_OOM,
                           "device out of memory: tag %s needs %zu bytes, %" PRIu64
                           " free of %" PRIu64 " capacity (largest free block %" PRIu64 ")",
                           pt_mem_tag_name(tag), bytes, freeb, cap, largest);
        return pt_fail(err, errlen, PT_ERR_OOM,
                       "device out of memory: tag %s needs %zu bytes (%" PRIu64 " with %u-byte "
                       "alignment), %" PRIu64 " free of %" PRIu64 " capacity (largest free block %"
                       PRIu64 ")",
                       pt_mem_tag_name(tag), bytes, size, PT_GPU_ALIGN, freeb, cap, largest);
    }
    x->req = bytes;
    x->tag = tag;
    g->u.current += x->size;
    if (g->u.current > g->u.peak) g->u.peak = g->u.current;
    g->u.tag_current[tag] += x->size;
    if (g->u.tag_current[tag] > g->u.tag_peak[tag]) g->u.tag_peak[tag] = g->u.tag_current[tag];
    g->u.n_allocs++;
    *p = g->base + x->off;
    pthread_mutex_unlock(&g->mu);
    return PT_OK;
}

/* Frees a live block. s == NULL: the poison (when on) is written before the
 * block can be handed out again. Otherwise stream-ordered: the block is free at
 * once and its poison is queued on s behind the work already there. */
static int free_block(pt_gpu *g, void *p, pt_stream *s, char *err, size_t errlen) {
    if (!g) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_free: device is NULL");
    if (!p) return PT_OK;
    uint64_t v;
    pthread_mutex_lock(&g->mu);
    if (!pmap_get(&g->live, (uintptr_t)p, &v)) {
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "pt_gpu_free: %p is not a live device allocation (never allocated by this "
                       "device, already freed, or not the start of a block)",
                       p);
    }
    blk *x = (blk *)(uintptr_t)v;
    pmap_del(&g->live, (uintptr_t)p);
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
                          : g->ops->stream_sync(g->impl, NULL)                           ? "stream_sync"
                                                                                         : NULL;
        if (bad) {
            char msg[160];
            snprintf(msg, sizeof msg, "pt_gpu_free: the poison fill of %p failed (%s)", p, bad);
            backend_log(g, PT_LOG_WARN, msg);
        }
        pthread_mutex_lock(&g->mu);
    }
    g->u.current -= x->size;
    g->u.tag_current[x->tag] -= x->size;
    release(g, x);
    pthread_mutex_unlock(&g->mu);
    return rc ? pt_fail(err, errlen, PT_ERR_BACKEND,
                        "pt_gpu_free: queueing the poison fill (memset) on the stream failed")
              : PT_OK;
}

int pt_gpu_free_checked(pt_gpu *g, void *p, char *err, size_t errlen) {
    return free_block(g, p, NULL, err, errlen);
}

void pt_gpu_free(pt_gpu *g, void *p) { (void)pt_gpu_free_checked(g, p, NULL, 0); }

size_t pt_gpu_alloc_size(const pt_gpu *g, const void *p) {
    if (!g || !p) return 0;
    uint64_t v;
    size_t n = 0;
    pthread_mutex_lock(mu_of(g));
    if (pmap_get(&g->live, (uintptr_t)p, &v)) n = (size_t)((const blk *)(uintptr_t)v)->req;
    pthread_mutex_unlock(mu_of(g));
    return n;
}

size_t pt_gpu_live_allocs(const pt_gpu *g) {
    if (!g) return 0;
    pthread_mutex_lock(mu_of(g));
    size_t n = g->live.n;
    pthread_mutex_unlock(mu_of(g));
    return n;
}

size_t pt_gpu_live_pinned(const pt_gpu *g) {
    if (!g) return 0;
    pthread_mutex_lock(mu_of(g));
    size_t n = g->pinned.n;
    pthread_mutex_unlock(mu_of(g));
    return n;
}

uint64_t pt_gpu_largest_free(const pt_gpu *g) {
    if (!g) return 0;
    pthread_mutex_lock(mu_of(g));
    uint64_t m = largest_free_locked(g);
    pthread_mutex_unlock(mu_of(g));
    return m;
}

size_t pt_gpu_free_extents(const pt_gpu *g) {
    if (!g) return 0;
    size_t n = 0;
    pthread_mutex_lock(mu_of(g));
    for (int b = 0; b < NBINS; b++)
        for (const blk *x = g->bins[b]; x; x = x->fnext) n++;
    pthread_mutex_unlock(mu_of(g));
    return n;
}

/* ---- pinned host memory ---- */

int pt_gpu_pinned_alloc(pt_gpu *g, size_t bytes, void **p, char *err, size_t errlen) {
    if (!g || !p)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_pinned_alloc: %s",
                       !g ? "device is NULL" : "output pointer is NULL");
    *p = NULL;
    pthread_mutex_lock(&g->mu);
    uint64_t cur = g->u.pinned_current, budget = g->u.pinned_budget;
    if (budget && (bytes > budget || cur > budget - bytes)) {
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pinned host memory budget exceeded: needs %zu bytes, %" PRIu64
                       " in use of a %" PRIu64 "-byte budget",
                       bytes, cur, budget);
    }
    /* Under the lock so the budget check and the charge are one step; pinned
     * allocations are few and large. */
    void *q = NULL;
    if (g->ops->host_alloc(g->impl, bytes, &q) != PT_OK || !q) {
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pinned host allocation of %zu bytes failed on the %s backend (%" PRIu64
                       " bytes pinned so far)",
                       bytes, g->ops->name, cur);
    }
    if (pmap_put(&g->pinned, (uintptr_t)q, bytes) != 0) {
        g->ops->host_free(g->impl, q, bytes);
        pthread_mutex_unlock(&g->mu);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pt_gpu_pinned_alloc: out of host memory for the allocation table");
    }
    g->u.pinned_current += bytes;
    if (g->u.pinned_current > g->u.pinned_peak) g->u.pinned_peak = g->u.pinned_current;
    pthread_mutex_unlock(&g->mu);
    *p = q;
    return PT_OK;
}

void pt_gpu_pinned_free(pt_gpu *g, void *p) {
    if (!g || !p) return;
    uint64_t bytes;
    pthread_mutex_lock(&g->mu);
    if (pmap_get(&g->pinned, (uintptr_t)p, &bytes)) {
        pmap_del(&g->pinned, (uintptr_t)p);
        g->u.pinned_current -= bytes;
        g->ops->host_free(g->impl, p, (size_t)bytes);
    }
    pthread_mutex_unlock(&g->mu);
}

/* ---- counters ---- */

void pt_gpu_usage_get(const pt_gpu *g, pt_gpu_usage *u) {
    if (!u) return;
    if (!g) {
        memset(u, 0, sizeof *u);
        return;
    }
    pthread_mutex_lock(mu_of(g));
    *u = g->u;
    pthread_mutex_unlock(mu_of(g));
}

void pt_gpu_reset_peak(pt_gpu *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->u.peak = g->u.current;
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

/* Stream-ordered free: the block goes back to the allocator now (accounting
 * stays exact), and with poison on, its NaN fill is queued on s, so it lands
 * after the work already queued there that may still read or write the block.
 * The next owner of these bytes must order its own writes after s: work on s
 * itself is ordered by FIFO; a copy on another stream waits for an event
 * recorded on s (which also covers the poison). */
int pt_gpu_free_on_stream(pt_gpu *g, void *p, pt_stream *s, char *err, size_t errlen) {
    if (!s) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_gpu_free_on_stream: no stream");
    return free_block(g, p, s, err, errlen);
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
