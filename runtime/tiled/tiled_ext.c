/*
 * tiled_ext.c — TiledMLP as an extension of the runtime object (pt_rt_ext,
 * core/rt_internal.h): its state (made at post_model_load, freed at
 * finalize), its check at post_model_load, its keys in the ranks' agreement
 * and the profile cache key, the tiles = auto search in place of the plain
 * one, its plan fields and its get_stats field. The tile loop itself is a
 * hook of its own (pt_tiled_mlp).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/planner.h"
#include "tiled_internal.h"

static int active(const pt_rt *rt) { return rt->cfg.tiled_mlp_enabled != 0; }

static int model_load(pt_rt *rt, pt_model_v1 *host, char *err, size_t errlen) {
    (void)host;
    pt_tiled_state *s = tiled_of(rt);
    if (!s) {
        /* kept across model loads (the scratch per row seen stays a maximum) */
        s = calloc(1, sizeof *s);
        if (!s)
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "post_model_load: out of host memory "
                                                         "for TiledMLP's state");
        pt_rt_ext_set_state(rt, &pt_tiled_ext, s);
    }
    s->mlp_auto_n = 0;   /* tiles = auto: decided after the profile */
    return pt_tiled_check(rt, err, errlen);
}

static void fini(pt_rt *rt) {
    free(tiled_of(rt));
    pt_rt_ext_set_state(rt, &pt_tiled_ext, NULL);
}

static void agree_keys(const pt_config *c, const pt_rt_keys *k) {
    char v[32];
    snprintf(v, sizeof v, "%d", c->tiled_mlp_enabled);
    k->put(k->t, "tiled_mlp.enabled", v);
    snprintf(v, sizeof v, "%d", c->tiled_mlp_tiles);
    k->put(k->t, "tiled_mlp.tiles", v);
}

/* the tiles change every block's scratch, so a profile measures them */
static uint64_t cache_key(const pt_config *c, uint64_t h) {
    const int32_t in[2] = {c->tiled_mlp_enabled, c->tiled_mlp_tiles};
    return pt_rt_key_mix(h, in, sizeof in);
}

/* tiles = auto picks its count from the profiling run's per-row scratch */
static int wants_search(const pt_rt *rt) {
    return rt->cfg.tiled_mlp_enabled && rt->cfg.tiled_mlp_tiles <= 0;
}

static void plan_fill(const pt_rt *rt, pt_plan *plan) {
    if (!rt->cfg.tiled_mlp_enabled) return;
    int64_t tok = plan->batch * plan->seq;
    plan->mlp_tiles = pt_mlp_tiles_eff(tok, pt_tiled_tiles_req(rt));
    plan->mlp_tile_len = pt_mlp_tile_len(tok, pt_tiled_tiles_req(rt));
    plan->mlp_tiles_auto = rt->cfg.tiled_mlp_tiles <= 0;
}

static void stats(const pt_rt *rt, pt_stats_v1 *s) { s->mlp_tiles = pt_tiled_mlp_tiles(rt); }

const pt_rt_ext pt_tiled_ext = {
    .name = "tiled_mlp",
    .active = active,
    .agree_keys = agree_keys,
    .cache_key = cache_key,
    .wants_search = wants_search,
    .search = pt_tiled_auto_search,
    .search_what = "[tiled_mlp] tiles = auto",
    .plan_fill = plan_fill,
    .fini = fini,
    .model_load = model_load,
    .stats = stats,
};
