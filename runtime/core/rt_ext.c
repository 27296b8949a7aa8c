/*
 * rt_ext.c — the runtime object's calls into the features that extend it
 * (pt_rt_ext, rt_internal.h): which features there are, and the loop over
 * them at each extension point, so that rt.c and plan_rt.c name none.
 */
#include "osft/osft.h"
#include "rt_internal.h"
#include "tiled/tiled.h"

/* The features, in the order they are called. */
static const pt_rt_ext *const exts[] = {&pt_osft_ext, &pt_tiled_ext, NULL};
_Static_assert(sizeof exts / sizeof *exts - 1 <= PT_RT_EXT_MAX, "PT_RT_EXT_MAX is too small");

static int slot(const pt_rt_ext *e) {
    int i = 0;
    while (exts[i] && exts[i] != e) i++;
    return i;   /* an unlisted table gets the list's end: no slot (see below) */
}

void *pt_rt_ext_state(const pt_rt *rt, const pt_rt_ext *e) {
    int i = slot(e);
    return exts[i] ? rt->ext_state[i] : NULL;
}

void pt_rt_ext_set_state(pt_rt *rt, const pt_rt_ext *e, void *state) {
    int i = slot(e);
    if (exts[i]) rt->ext_state[i] = state;
}

static void unload(pt_rt *rt, int n) {
    for (int i = n - 1; i >= 0; i--)
        if (exts[i]->model_unload) exts[i]->model_unload(rt);
}

int pt_rt_ext_model_load(pt_rt *rt, pt_model_v1 *model, char *err, size_t errlen) {
    /* the features may refuse the model or replace the list the store lays out;
     * one that refuses undoes the ones before it (its own included) */
    rt->hmodel = rt->model = model;
    for (int i = 0; exts[i]; i++) {
        int rc = exts[i]->model_load ? exts[i]->model_load(rt, model, err, errlen) : PT_OK;
        if (!rc) continue;
        unload(rt, i + 1);
        rt->model = rt->hmodel = NULL;
        return rc;
    }
    return PT_OK;
}

void pt_rt_ext_unload(pt_rt *rt) {
    int n = 0;
    while (exts[n]) n++;
    unload(rt, n);
}

int pt_rt_ext_optimizer_check(const pt_rt *rt, int type, char *err, size_t errlen) {
    int rc = PT_OK;
    for (int i = 0; !rc && exts[i]; i++)
        if (exts[i]->optimizer_check) rc = exts[i]->optimizer_check(rt, type, err, errlen);
    return rc;
}

void pt_rt_ext_after_hook(pt_rt *rt) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->after_hook) exts[i]->after_hook(rt);
}

int pt_rt_ext_async_status(pt_rt *rt, char *err, size_t errlen) {
    int rc = PT_OK;
    for (int i = 0; !rc && exts[i]; i++)
        if (exts[i]->async_status) rc = exts[i]->async_status(rt, err, errlen);
    return rc;
}

int pt_rt_ext_block_backward(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    int rc = PT_OK;
    for (int i = 0; !rc && exts[i]; i++)
        if (exts[i]->block_backward) rc = exts[i]->block_backward(rt, b, err, errlen);
    return rc;
}

int pt_rt_ext_after_optimizer_step(pt_rt *rt, char *err, size_t errlen) {
    int rc = PT_OK;
    for (int i = 0; !rc && exts[i]; i++)
        if (exts[i]->after_optimizer_step) rc = exts[i]->after_optimizer_step(rt, err, errlen);
    return rc;
}

static void chunk_stepped(void *user, int32_t chunk) {
    pt_rt *rt = user;
    for (int i = 0; exts[i]; i++)
        if (exts[i]->chunk_stepped && exts[i]->active(rt)) exts[i]->chunk_stepped(rt, chunk);
}

pt_rt_stepped_fn pt_rt_ext_chunk_stepped(const pt_rt *rt) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->chunk_stepped && exts[i]->active(rt)) return chunk_stepped;
    return NULL;
}

void pt_rt_ext_state_loaded(pt_rt *rt) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->state_loaded) exts[i]->state_loaded(rt);
}

const pt_rt_ext *pt_rt_ext_reader(const pt_rt *rt) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->read_param && exts[i]->active(rt)) return exts[i];
    return NULL;
}

const pt_rt_ext *pt_rt_ext_launcher(const pt_rt *rt) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->launch && exts[i]->active(rt)) return exts[i];
    return NULL;
}

void pt_rt_ext_stats(const pt_rt *rt, pt_stats_v1 *s) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->stats) exts[i]->stats(rt, s);
}

void pt_rt_ext_plan_log(const pt_rt *rt) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->plan_log) exts[i]->plan_log(rt);
}

const char *pt_rt_ext_refuse(const pt_config *cfg) {
    const char *why = NULL;
    for (int i = 0; !why && exts[i]; i++)
        if (exts[i]->refuse) why = exts[i]->refuse(cfg);
    return why;
}

void pt_rt_ext_agree_keys(const pt_config *cfg, const pt_rt_keys *keys) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->agree_keys) exts[i]->agree_keys(cfg, keys);
}

uint64_t pt_rt_ext_cache_key(const pt_config *cfg, uint64_t h) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->cache_key) h = exts[i]->cache_key(cfg, h);
    return h;
}

const pt_rt_ext *pt_rt_ext_searcher(const pt_rt *rt) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->search && exts[i]->wants_search && exts[i]->wants_search(rt)) return exts[i];
    return NULL;
}

void pt_rt_ext_plan_fill(const pt_rt *rt, struct pt_plan *plan) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->plan_fill) exts[i]->plan_fill(rt, plan);
}

void pt_rt_ext_fini(pt_rt *rt) {
    for (int i = 0; exts[i]; i++)
        if (exts[i]->fini) exts[i]->fini(rt);
}

/* Launched work runs through OSFT's launch (it captures the factor addresses),
 * so OSFT knows whether this thread is inside it. */
int pt_rt_ext_in_launch(void) { return pt_osft_in_launch(); }
