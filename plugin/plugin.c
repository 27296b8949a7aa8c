/*
 * plugin.c — the exported table `protrain_plugin_v1`. Thin: checks hook
 * order (lifecycle.c), turns hooks into runtime calls (runtime/rt.h), keeps
 * the last error sentence. Never aborts the host.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "lifecycle.h"
#include "base/base.h"
#include "protrain.h"
#include "core/dist_agree.h"
#include "core/rt.h"
#include "osft/osft.h"
#include "tiled/tiled.h"
#include "pt_util.h"

/* A context's state word: a finalized context is never handed back to malloc
 * (the host may still hold the pointer and call finalize or a hook with it),
 * so reading this word is always defined and a late call is a clear
 * PT_ERR_ORDER instead of a use-after-free. */
enum { CTX_LIVE = 0x4c495645, CTX_DEAD = 0x44454144 };

typedef struct pt_ctx {
    uint32_t magic;
    struct pt_ctx *next;        /* the live list, or the graveyard once finalized */
    _Atomic int depth;          /* hooks of this context running now (nested ones count) */
    const char *outer;          /* the outermost of them */
    pt_config cfg;
    pt_logger lg;
    pt_lifecycle lc;
    pt_rt *rt;
    int agreed_micro;           /* the ranks compared n_micro at the first training pre_step */
    char err[1024];
} pt_ctx;

/* Errors from init (no ctx yet) and from calls with a NULL ctx. */
static _Thread_local char g_err[1024] = "no error";

static int fail_null(const char *hook) {
    return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                   "%s called with a NULL context (init failed or was not called)", hook);
}

/* Every context this load of the plugin handed out: live ones, and finalized
 * ones kept for reuse by the next init (their memory stays ours, so a stale
 * handle reads CTX_DEAD until init recycles it, exactly as malloc would have).
 * A pointer on neither list is never read: it may be memory of an earlier load
 * of the plugin (dlclose, dlopen again), or not a context at all. A hook looks
 * its pointer up first: a short list walk under an uncontended lock. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pt_ctx *g_live, *g_dead;

static pt_ctx *ctx_new(void) {
    pthread_mutex_lock(&g_mu);
    pt_ctx *c = g_dead;
    if (c) g_dead = c->next;
    pthread_mutex_unlock(&g_mu);
    if (c) memset(c, 0, sizeof *c);
    else c = calloc(1, sizeof *c);
    return c;
}

static void list_drop(pt_ctx **head, pt_ctx *c) {
    for (pt_ctx **p = head; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            return;
        }
}

/* 1 when c is one of this load's contexts (live or finalized). */
static int ctx_known(const pt_ctx *c) {
    pthread_mutex_lock(&g_mu);
    const pt_ctx *x = g_live;
    while (x && x != c) x = x->next;
    if (!x)
        for (x = g_dead; x && x != c;) x = x->next;
    pthread_mutex_unlock(&g_mu);
    return x != NULL;
}

static void ctx_publish(pt_ctx *c) {
    pthread_mutex_lock(&g_mu);
    c->next = g_live;
    g_live = c;
    pthread_mutex_unlock(&g_mu);
}

/* The context goes to the graveyard: its state word says finalized and its
 * last_error explains, for a host that calls it again. */
static void ctx_bury(pt_ctx *c, const char *why) {
    pthread_mutex_lock(&g_mu);
    list_drop(&g_live, c);
    memset(c, 0, sizeof *c);
    c->magic = CTX_DEAD;
    snprintf(c->err, sizeof c->err, "%s", why);
    c->next = g_dead;
    g_dead = c;
    pthread_mutex_unlock(&g_mu);
}

/* When the plugin is unloaded (dlclose, or the process exits) with contexts
 * the host never finalized, their threads would go on running code that is no
 * longer mapped: each is finalized here (threads joined, memory freed), unless
 * a hook of it is running (exit called from inside a callback: its runtime is
 * mid-call and the process is ending anyway). Then every context's memory goes
 * back to malloc: a handle from before the unload is not on the next load's
 * lists, so that load refuses it without reading it. */
__attribute__((destructor)) static void ctx_unload(void) {
    pthread_mutex_lock(&g_mu);
    pt_ctx *live = g_live, *dead = g_dead;
    g_live = g_dead = NULL;
    pthread_mutex_unlock(&g_mu);
    while (live) {
        pt_ctx *c = live;
        live = c->next;
        if (c->depth) continue;
        pt_rt_destroy(c->rt);
        free(c);
    }
    while (dead) {
        pt_ctx *c = dead;
        dead = c->next;
        free(c);
    }
}

/* A hook called with a finalized context, or a pointer this load never handed out. */
static int fail_dead(pt_ctx *c, const char *hook) {
    if (c->magic == CTX_DEAD)
        return pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                       "hook %s called after finalize: this context is finished; call init "
                       "for a new one", hook);
    return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                   "%s called with a pointer that is not a context returned by init", hook);
}

static int fail_unknown(const char *hook) {
    return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                   "%s called with a pointer that is not a context of this plugin: never "
                   "returned by init, or returned before the plugin was unloaded (dlclose) "
                   "and loaded again", hook);
}

/* Counts the hooks of a context that are running, so finalize can refuse to
 * free a runtime that a hook further up the host's stack is still using (a
 * host callback such as profile_step or recompute_block calling finalize). */
static void hook_leave(pt_ctx **pc) {
    if (*pc) (*pc)->depth--;
}

#define CTX(hook)                                                      \
    pt_ctx *c = (pt_ctx *)vctx;                                        \
    if (!c) return fail_null(hook);                                    \
    if (!ctx_known(c)) return fail_unknown(hook);                      \
    if (c->magic != CTX_LIVE) return fail_dead(c, hook);               \
    __attribute__((cleanup(hook_leave))) pt_ctx *in_hook_ = c;         \
    if (c->depth++ == 0) c->outer = hook;                              \
    (void)in_hook_

/* Log the failure once at debug level; the host reads last_error. */
static int done(pt_ctx *c, int rc) {
    if (rc) PT_LOGD(&c->lg, "error %d: %s", rc, c->err);
    return rc;
}

/* Bytes an input struct must cover: every v1 field, i.e. all but the trailing
 * reserved slots (which mean nothing in v1). More is fine: a newer host's struct
 * starts with the same v1 fields, and only those are ever read. Checked before
 * the lifecycle or the runtime see the call, so a refusal changes nothing and the
 * host can call again with a correct struct. */
#define V1_FIELDS(type) offsetof(type, reserved)

static int check_struct_size(pt_ctx *c, const char *hook, const char *type, uint32_t given,
                             size_t need) {
    if (given >= need) return PT_OK;
    return pt_fail(c->err, sizeof c->err, PT_ERR_INVALID_ARG,
                   "%s: %s.struct_size is %u bytes, too small: need at least %zu (its v1 "
                   "fields)", hook, type, (unsigned)given, need);
}

/* The host's identity fields, checked before anything is built: a rank outside
 * the world or an unknown device kind would otherwise pick files and backends by
 * a meaningless number. */
static int check_host(const pt_host_v1 *h) {
    if (!h) return PT_OK;
    if (h->world_size < 1)
        return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                       "init: pt_host_v1.world_size is %d; it must be >= 1 (1 when not "
                       "distributed)", h->world_size);
    if (h->rank < 0 || h->rank >= h->world_size)
        return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                       "init: pt_host_v1.rank is %d; it must be in [0, world_size %d)", h->rank,
                       h->world_size);
    if (h->local_rank < 0)
        return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                       "init: pt_host_v1.local_rank is %d; it must be >= 0", h->local_rank);
    if (h->device_kind != PT_DEVICE_AUTO && h->device_kind != PT_DEVICE_HOST &&
        h->device_kind != PT_DEVICE_CUDA)
        return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                       "init: pt_host_v1.device_kind is %d; it must be 0 (auto), 1 (host) or "
                       "2 (cuda)", h->device_kind);
    if (h->device_index < 0)
        return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                       "init: pt_host_v1.device_index is %d; it must be >= 0", h->device_index);
    if (h->struct_size >= offsetof(pt_host_v1, fingerprint) + sizeof h->fingerprint)
        return pt_agree_check_fingerprint(h->fingerprint, g_err, sizeof g_err);
    return PT_OK;
}

static int32_t h_init(const char *ini_path, const pt_host_v1 *host, void **out) {
    if (!out)
        return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG, "init: ctx output pointer is NULL");
    *out = NULL;
    /* pt_host_v1's fields through ABI 1.4; fingerprint (1.5) took a reserved
     * slot, so a 1.4 host's struct_size stays enough */
    const size_t host_need = offsetof(pt_host_v1, fingerprint);
    if (host && (host->struct_size < host_need || host->abi_version < 1)) {
        return pt_fail(g_err, sizeof g_err, PT_ERR_INVALID_ARG,
                       "init: pt_host_v1 too small or too old (struct_size %u, need at least "
                       "%zu; abi_version %u, need at least 1)",
                       host->struct_size, host_need, host->abi_version);
    }
    int rc = check_host(host);
    if (rc) return rc;
    pt_ctx *c = ctx_new();
    if (!c) return pt_fail(g_err, sizeof g_err, PT_ERR_HOST_OOM, "init: out of host memory");
    rc = pt_config_load(ini_path, &c->cfg, g_err, sizeof g_err);
    if (rc) {
        ctx_bury(c, "init failed");
        return rc;
    }
    c->lg.level = c->cfg.log_level;
    c->lg.fn = host ? host->log : NULL;
    c->lg.user = host ? host->user : NULL;
    c->lg.rank = (host && host->world_size > 1) ? host->rank : -1;
    rc = pt_rt_create(&c->cfg, host, &c->lg, &c->lc.sx, &c->rt, g_err, sizeof g_err);
    if (rc) {
        ctx_bury(c, "init failed");
        return rc;
    }
    pt_agree_keep_fingerprint(c->rt);
    /* A transport named for one rank: no collective ever runs, so the setting
     * does nothing; say so rather than let it look as if it had been used. */
    if ((!host || host->world_size == 1) &&
        (!strcmp(c->cfg.dist_backend, "nccl") || !strcmp(c->cfg.dist_backend, "mpi") ||
         !strcmp(c->cfg.dist_backend, "host")))
        PT_LOGW(&c->lg, "[dist] backend = %s has no effect with one rank (world_size 1): no "
                        "collective runs and no %s communicator is opened (config %s)",
                c->cfg.dist_backend, c->cfg.dist_backend, c->cfg.source);
    /* from the host's first dev_alloc to the end of post_model_load, a device
     * too small is measured rather than failed at its first allocation */
    pt_rt_measure_setup(c->rt);
    c->magic = CTX_LIVE;
    c->lc.state = PT_LC_INIT;
    snprintf(c->err, sizeof c->err, "no error");
    ctx_publish(c);
    *out = c;
    return PT_OK;
}

/* A finalized context keeps its memory (see ctx_bury), so its sentence is
 * readable; a pointer that is not one of ours is not read: the hook that
 * refused it wrote its sentence where NULL's goes. */
static const char *h_last_error(void *vctx) {
    pt_ctx *c = (pt_ctx *)vctx;
    return c && ctx_known(c) ? c->err : g_err;
}

/* The profiler's measured step: the plugin opens a training micro-batch on the
 * host's behalf (profile_step runs block hooks only), the host runs forward and
 * backward through the hooks, then the runtime searches and rebuilds. */
static int profile(pt_ctx *c, int *stepped) {
    int hit = 0;
    int rc = pt_rt_plan_from_cache(c->rt, &hit, c->err, sizeof c->err);
    if (rc || hit) return rc;
    *stepped = 1;
    pt_lifecycle saved = c->lc;
    /* warm-up passes (caches, page mappings, BLAS, the host's thread teams),
     * then measured passes whose per-window medians go into the trace */
    for (int pass = 0; pass < pt_rt_profile_passes() && !rc; pass++) {
        c->lc.state = PT_LC_READY;
        rc = pt_lc_pre_step(&c->lc, -1, 0, 1, c->err, sizeof c->err);
        if (!rc) rc = pt_rt_profile_begin(c->rt, c->err, sizeof c->err);
        if (!rc) rc = pt_rt_pre_step(c->rt, c->err, sizeof c->err);
        if (!rc) rc = pt_rt_call_profile_step(c->rt, c->err, sizeof c->err);
        if (!rc && c->lc.state != PT_LC_MICRO_DONE) {
            char want[128];
            snprintf(want, sizeof want, "%s", pt_lc_state_name(c->lc.state));
            rc = pt_fail(c->err, sizeof c->err, PT_ERR_CALLBACK,
                         "post_model_load: the host's profile_step returned before every "
                         "block's forward and backward hooks ran (state: %s, next block %d)",
                         want, c->lc.block);
        }
    }
    if (!rc) rc = pt_rt_profile_end(c->rt, c->err, sizeof c->err);
    else pt_rt_profile_abort(c->rt);
    c->lc = saved;
    return rc;
}

static int32_t h_post_model_load(void *vctx, pt_model_v1 *model) {
    CTX("post_model_load");
    if (!model)
        return pt_fail(c->err, sizeof c->err, PT_ERR_INVALID_ARG, "post_model_load: model is NULL");
    int rc = check_struct_size(c, "post_model_load", "pt_model_v1", model->struct_size,
                               V1_FIELDS(pt_model_v1));
    if (rc) return done(c, rc);
    rc = pt_lc_post_model_load(&c->lc, model->n_blocks, c->err, sizeof c->err);
    if (!rc) rc = pt_agree_model(c->rt, model, c->err, sizeof c->err);
    if (!rc) rc = pt_rt_model_load(c->rt, model, c->err, sizeof c->err);
    int profiled = 0;   /* a profiling step ran (not planned from the cache) */
    if (!rc && pt_rt_profiling(c->rt)) rc = profile(c, &profiled);
    if (c->rt) rc = pt_rt_setup_end(c->rt, profiled, rc, c->err, sizeof c->err);
    if (!rc) c->lc.state = PT_LC_LOADED;
    return done(c, rc);
}

static int32_t h_create_optimizer(void *vctx, const pt_optim_v1 *desc) {
    CTX("create_optimizer");
    /* desc NULL: every setting from the INI */
    int rc = desc ? check_struct_size(c, "create_optimizer", "pt_optim_v1", desc->struct_size,
                                      V1_FIELDS(pt_optim_v1))
                  : PT_OK;
    if (!rc) rc = pt_lc_create_optimizer(&c->lc, c->err, sizeof c->err);
    if (!rc) rc = pt_agree_optim(c->rt, desc, c->err, sizeof c->err);
    if (!rc) {
        rc = pt_rt_create_optimizer(c->rt, desc, c->err, sizeof c->err);
        if (rc) pt_rt_explain_oom(c->rt, rc, c->err, sizeof c->err);
    }
    if (!rc) c->lc.state = PT_LC_READY;
    return done(c, rc);
}

static int32_t h_pre_step(void *vctx, int64_t step, int32_t micro, int32_t n_micro) {
    CTX("pre_step");
    pt_lifecycle saved = c->lc;
    int rc = pt_lc_pre_step(&c->lc, step, micro, n_micro, c->err, sizeof c->err);
    if (!rc && n_micro > 0 && !c->agreed_micro) {
        rc = pt_agree_micro(c->rt, n_micro, c->err, sizeof c->err);
        c->agreed_micro = !rc;
        if (rc) c->lc = saved;
    }
    if (!rc) {
        rc = pt_rt_pre_step(c->rt, c->err, sizeof c->err);
        if (rc) c->lc = saved;
    }
    return done(c, rc);
}

typedef int (*rt_block_fn)(pt_rt *, int32_t, char *, size_t);

static int block_hook(pt_ctx *c, int which, int32_t b, rt_block_fn fn) {
    pt_lifecycle saved = c->lc;
    int rc = pt_lc_block(&c->lc, which, b, c->err, sizeof c->err);
    if (!rc) {
        rc = fn(c->rt, b, c->err, sizeof c->err);
        if (rc) c->lc = saved;
    }
    return done(c, rc);
}

static int32_t h_pre_fwd(void *vctx, int32_t b) {
    CTX("block_pre_forward");
    return block_hook(c, PT_HOOK_PRE_FWD, b, pt_rt_pre_forward);
}
static int32_t h_post_fwd(void *vctx, int32_t b) {
    CTX("block_post_forward");
    return block_hook(c, PT_HOOK_POST_FWD, b, pt_rt_post_forward);
}
static int32_t h_pre_bwd(void *vctx, int32_t b) {
    CTX("block_pre_backward");
    return block_hook(c, PT_HOOK_PRE_BWD, b, pt_rt_pre_backward);
}
static int32_t h_post_bwd(void *vctx, int32_t b) {
    CTX("block_post_backward");
    return block_hook(c, PT_HOOK_POST_BWD, b, pt_rt_post_backward);
}

static int32_t h_optimizer_step(void *vctx, float lr) {
    CTX("optimizer_step");
    /* a negative lr means "as set"; an infinite one would step every weight to inf */
    if (!isfinite(lr))
        return pt_fail(c->err, sizeof c->err, PT_ERR_INVALID_ARG,
                       "optimizer_step: lr is %g; it must be finite (>= 0, or < 0 for the "
                       "lr given to set_lr)", (double)lr);
    pt_lifecycle saved = c->lc;
    int rc = pt_lc_optimizer_step(&c->lc, c->err, sizeof c->err);
    if (!rc) {
        rc = pt_rt_optimizer_step(c->rt, lr, c->err, sizeof c->err);
        if (rc) c->lc = saved;
    }
    return done(c, rc);
}

static int32_t h_dist_allreduce(void *vctx, double *values, int32_t n) {
    CTX("dist_allreduce");
    return done(c, pt_rt_dist_allreduce(c->rt, values, n, c->err, sizeof c->err));
}

/* Any state: a host ending a multi-rank run with an error tells the others. */
static int32_t h_dist_abort(void *vctx, const char *why) {
    CTX("dist_abort");
    pt_rt_dist_abort(c->rt, why ? why : "its host gave no reason");
    return PT_OK;
}

static int32_t h_clip_grad_norm(void *vctx, float max_norm, double *norm) {
    CTX("clip_grad_norm");
    int rc = pt_lc_clip_grad_norm(&c->lc, norm != NULL, c->err, sizeof c->err);
    if (!rc) rc = pt_rt_clip_grad_norm(c->rt, max_norm, norm, c->err, sizeof c->err);
    return done(c, rc);
}

static int32_t h_set_lr(void *vctx, float lr) {
    CTX("set_lr");
    return done(c, pt_rt_set_lr(c->rt, lr, c->err, sizeof c->err));
}

/* The device's compute stream: valid from init on (a host may launch work
 * before post_model_load, e.g. to initialise its own buffers). */
static int32_t h_launch(void *vctx, void (*fn)(void *), void *arg) {
    CTX("launch");
    return done(c, pt_rt_launch(c->rt, fn, arg, c->err, sizeof c->err));
}

static int32_t h_stream_sync(void *vctx) {
    CTX("stream_sync");
    return done(c, pt_rt_stream_sync(c->rt, c->err, sizeof c->err));
}

static int32_t h_post_step(void *vctx, int64_t step, float loss) {
    CTX("post_step");
    int rc = pt_lc_post_step(&c->lc, step, c->err, sizeof c->err);
    if (!rc) rc = pt_rt_post_step(c->rt, step, loss, c->err, sizeof c->err);
    return done(c, rc);
}

static int32_t h_finalize(void *vctx) {
    CTX("finalize");
    /* from inside another hook's callback (profile_step, recompute_block, a
     * tile, the log): that hook resumes on this runtime when the callback
     * returns, so it must outlive the call */
    if (c->depth > 1)
        return pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                       "finalize called from inside %s (from a host callback it made, such as "
                       "profile_step or recompute_block): nothing was freed; call finalize "
                       "after %s returns", c->outer, c->outer);
    if (pt_rt_ext_in_launch())
        return pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                       "finalize called from work launched on the compute stream: nothing was "
                       "freed; call it from the host's thread after stream_sync");
    in_hook_ = NULL;   /* the context is gone when the hook returns */
    pt_rt_destroy(c->rt);
    ctx_bury(c, "this context was finalized; no error since");
    return PT_OK;
}

static int32_t h_dev_alloc(void *vctx, uint64_t bytes, const char *tag, void **ptr) {
    CTX("dev_alloc");
    return done(c, pt_rt_dev_alloc(c->rt, bytes, tag, ptr, c->err, sizeof c->err));
}

static int32_t h_dev_free(void *vctx, void *ptr) {
    CTX("dev_free");
    return done(c, pt_rt_dev_free(c->rt, ptr, c->err, sizeof c->err));
}

static int needs_model(pt_ctx *c, const char *hook) {
    if (c->lc.state == PT_LC_INIT)
        return pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                       "hook %s called out of order: expected post_model_load first (state: %s)",
                       hook, pt_lc_state_name(c->lc.state));
    return PT_OK;
}

static int32_t h_arena(void *vctx, int32_t b, uint64_t bytes, void **ptr) {
    CTX("activation_arena");
    int rc = needs_model(c, "activation_arena");
    if (!rc && !pt_lc_in_block(&c->lc, b))
        rc = pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                     "hook activation_arena(%d) called out of order: call it between "
                     "block_pre_forward(%d) and block_post_forward(%d)", b, b, b);
    if (!rc) rc = pt_rt_arena(c->rt, b, bytes, ptr, c->err, sizeof c->err);
    return done(c, rc);
}

static int32_t h_arena_get(void *vctx, int32_t b, void **ptr) {
    CTX("activation_arena_get");
    int rc = needs_model(c, "activation_arena_get");
    if (!rc) rc = pt_rt_arena_get(c->rt, b, ptr, c->err, sizeof c->err);
    return done(c, rc);
}

static int32_t h_memcpy(void *vctx, void *dst, const void *src, uint64_t bytes, int32_t kind) {
    CTX("memcpy");
    return done(c, pt_rt_memcpy(c->rt, dst, src, bytes, kind, c->err, sizeof c->err));
}

static int32_t h_get_stats(void *vctx, pt_stats_v1 *out) {
    CTX("get_stats");
    if (!out) return pt_fail(c->err, sizeof c->err, PT_ERR_INVALID_ARG, "get_stats: out is NULL");
    return pt_rt_stats(c->rt, out);
}

static int32_t h_read_param(void *vctx, int32_t index, void *dst, uint64_t bytes) {
    CTX("read_param");
    int rc = needs_model(c, "read_param");
    if (!rc) rc = pt_rt_read_param(c->rt, index, dst, bytes, c->err, sizeof c->err);
    return done(c, rc);
}

static int32_t h_write_param(void *vctx, int32_t index, const void *src, uint64_t bytes) {
    CTX("write_param");
    int rc = needs_model(c, "write_param");
    if (!rc) rc = pt_lc_write_param(&c->lc, c->err, sizeof c->err);
    if (!rc) rc = pt_rt_write_param(c->rt, index, src, bytes, c->err, sizeof c->err);
    return done(c, rc);
}

/* Between steps only: no gradient or CPU step may be in flight. */
static int between_steps(pt_ctx *c, const char *hook) {
    if (c->lc.state == PT_LC_READY) return PT_OK;
    return pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                   "hook %s called out of order: expected it between steps (after "
                   "create_optimizer or post_step; state: %s)", hook,
                   pt_lc_state_name(c->lc.state));
}
static int32_t h_save_state(void *vctx, const char *dir) {
    CTX("save_state");
    int rc = between_steps(c, "save_state");
    if (!rc) rc = pt_rt_save_state(c->rt, dir, c->err, sizeof c->err);
    return done(c, rc);
}
static int32_t h_load_state(void *vctx, const char *dir) {
    CTX("load_state");
    int rc = between_steps(c, "load_state");
    if (!rc) rc = pt_rt_load_state(c->rt, dir, c->err, sizeof c->err);
    return done(c, rc);
}

/* ABI 1.6: the step in progress dropped (host contract 7). From a pass or
 * between its micro-batches; between steps there is nothing to drop. Not from
 * inside a host callback (the hook that made it resumes on this step). */
static int32_t h_discard_step(void *vctx) {
    CTX("discard_step");
    pt_lc_state s = c->lc.state;
    if (s == PT_LC_INIT || s == PT_LC_LOADED || s == PT_LC_STEPPED)
        return done(c, pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                               "hook discard_step called out of order: %s (state: %s)",
                               s == PT_LC_STEPPED
                                   ? "optimizer_step already applied this step; call post_step"
                                   : "no step can run before post_model_load and "
                                     "create_optimizer",
                               pt_lc_state_name(s)));
    if (c->depth > 1 || pt_rt_ext_in_launch())
        return done(c, pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                               "hook discard_step called out of order: from inside %s; call it "
                               "after that hook returns",
                               c->depth > 1 ? c->outer : "work launched on the compute stream"));
    if (s == PT_LC_READY) return PT_OK;   /* nothing in progress */
    int rc = pt_rt_discard_step(c->rt, c->lc.sx.eval, c->err, sizeof c->err);
    if (rc) return done(c, rc);
    PT_LOGD(&c->lg, "discard_step: step %lld dropped at %s (micro-batch %d of %d)",
            (long long)c->lc.sx.step, pt_lc_state_name(s), (int)c->lc.sx.micro,
            (int)c->lc.sx.n_micro);
    c->lc.state = PT_LC_READY;
    c->lc.block = 0;
    c->lc.inside = 0;
    c->lc.sx.eval = 0;
    return PT_OK;
}

/* ABI 1.6: profile and plan again for another batch shape, between steps. */
static int replan_profile(void *user) {
    int profiled = 0;
    return profile((pt_ctx *)user, &profiled);
}
static int32_t h_replan(void *vctx, int64_t batch, int64_t seq) {
    CTX("replan");
    int rc = between_steps(c, "replan");
    if (!rc && c->depth > 1)
        rc = pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                     "hook replan called out of order: from inside %s; call it after that hook "
                     "returns", c->outer);
    if (rc) return done(c, rc);
    rc = pt_rt_replan(c->rt, batch, seq, replan_profile, c, c->err, sizeof c->err);
    if (rc) {
        char inner[sizeof c->err];
        snprintf(inner, sizeof inner, "%s", c->err);
        pt_fail(c->err, sizeof c->err, rc, "replan(batch %lld, sequence %lld): %s",
                (long long)batch, (long long)seq, inner);
    }
    return done(c, rc);
}

/* TiledMLP: inside block b's forward (or backward) window only, where the
 * block's parameters are in place and the host's tile callbacks may use them. */
static int32_t tiled(void *vctx, int32_t b, int64_t tokens, int backward) {
    const char *hook = backward ? "tiled_mlp_backward" : "tiled_mlp_forward";
    CTX(hook);
    int rc = needs_model(c, hook);
    pt_lc_state want = backward ? PT_LC_BWD : PT_LC_FWD;
    if (!rc && !(c->lc.state == want && pt_lc_in_block(&c->lc, b)))
        rc = pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                     "hook %s(%d) called out of order: call it between block_pre_%s(%d) and "
                     "block_post_%s(%d) (state: %s)", hook, b, backward ? "backward" : "forward",
                     b, backward ? "backward" : "forward", b, pt_lc_state_name(c->lc.state));
    if (!rc) rc = pt_tiled_mlp(c->rt, b, tokens, backward, c->err, sizeof c->err);
    return done(c, rc);
}
static int32_t h_tiled_fwd(void *vctx, int32_t b, int64_t tokens) {
    return tiled(vctx, b, tokens, 0);
}
static int32_t h_tiled_bwd(void *vctx, int32_t b, int64_t tokens) {
    return tiled(vctx, b, tokens, 1);
}
static int32_t h_tiled_scratch(void *vctx, uint64_t bytes, void **ptr) {
    CTX("tiled_mlp_scratch");
    return done(c, pt_tiled_scratch(c->rt, bytes, ptr, c->err, sizeof c->err));
}

/* OSFT's linear layer. From the host's thread: inside the owning block's
 * window (forward or backward as named). From inside launched work the hook
 * runs on the compute thread: it leaves the lifecycle and the context's error
 * buffer (the host's thread owns both) alone, and a failure reaches the host at
 * its next stream_sync / block_post_backward / optimizer_step. */
static int osft_run(pt_rt *rt, int32_t param, const void *x, const void *dy, void *out,
                    int64_t rows, int backward, char *err, size_t errlen) {
    return backward ? pt_osft_backward(rt, param, x, dy, out, rows, err, errlen)
                    : pt_osft_forward(rt, param, x, out, rows, err, errlen);
}
static int32_t osft_linear(void *vctx, int32_t param, const void *x, const void *dy, void *out,
                           int64_t rows, int backward) {
    const char *hook = backward ? "osft_linear_backward" : "osft_linear_forward";
    if (pt_rt_ext_in_launch()) {
        pt_ctx *c = (pt_ctx *)vctx;
        char e[256];
        return osft_run(c->rt, param, x, dy, out, rows, backward, e, sizeof e);
    }
    CTX(hook);
    int rc = needs_model(c, hook);
    int b = rc ? -2 : pt_osft_block_of(c->rt, param);
    if (!rc && b == -2)
        rc = pt_fail(c->err, sizeof c->err, PT_ERR_INVALID_ARG, "%s: param %d is not an OSFT "
                     "target (pt_stats_v1.osft_targets says how many are)", hook, (int)param);
    pt_lc_state want = backward ? PT_LC_BWD : PT_LC_FWD;
    if (!rc && b >= 0 && !(c->lc.state == want && pt_lc_in_block(&c->lc, b)))
        rc = pt_fail(c->err, sizeof c->err, PT_ERR_ORDER,
                     "hook %s(param %d) called out of order: call it between block_pre_%s(%d) "
                     "and block_post_%s(%d) (state: %s)", hook, (int)param,
                     backward ? "backward" : "forward", b, backward ? "backward" : "forward", b,
                     pt_lc_state_name(c->lc.state));
    if (!rc)
        rc = osft_run(c->rt, param, x, dy, out, rows, backward, c->err, sizeof c->err);
    return done(c, rc);
}
static int32_t h_osft_fwd(void *vctx, int32_t param, const void *x, void *y, int64_t rows) {
    return osft_linear(vctx, param, x, NULL, y, rows, 0);
}
static int32_t h_osft_bwd(void *vctx, int32_t param, const void *x, const void *dy, void *dx,
                          int64_t rows) {
    return osft_linear(vctx, param, x, dy, dx, rows, 1);
}

__attribute__((visibility("default"))) const pt_plugin_v1 protrain_plugin_v1 = {
    .abi_version = 1,
    .struct_size = sizeof(pt_plugin_v1),
    .name = "protrain",
    .version = PT_PLUGIN_VERSION,
    .init = h_init,
    .last_error = h_last_error,
    .post_model_load = h_post_model_load,
    .create_optimizer = h_create_optimizer,
    .pre_step = h_pre_step,
    .block_pre_forward = h_pre_fwd,
    .block_post_forward = h_post_fwd,
    .block_pre_backward = h_pre_bwd,
    .block_post_backward = h_post_bwd,
    .optimizer_step = h_optimizer_step,
    .post_step = h_post_step,
    .finalize = h_finalize,
    .dev_alloc = h_dev_alloc,
    .dev_free = h_dev_free,
    .activation_arena = h_arena,
    .activation_arena_get = h_arena_get,
    .memcpy = h_memcpy,
    .get_stats = h_get_stats,
    .read_param = h_read_param,
    .save_state = h_save_state,
    .load_state = h_load_state,
    .set_lr = h_set_lr,
    .clip_grad_norm = h_clip_grad_norm,
    .write_param = h_write_param,
    .launch = h_launch,
    .stream_sync = h_stream_sync,
    .osft_linear_forward = h_osft_fwd,
    .osft_linear_backward = h_osft_bwd,
    .tiled_mlp_forward = h_tiled_fwd,
    .tiled_mlp_backward = h_tiled_bwd,
    .tiled_mlp_scratch = h_tiled_scratch,
    .dist_allreduce = h_dist_allreduce,
    .discard_step = h_discard_step,   /* ABI 1.6 */
    .replan = h_replan,               /* ABI 1.6 */
    .dist_abort = h_dist_abort,
};
