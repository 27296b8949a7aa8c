/*
 * tiled_ext.c — TiledMLP as an extension of the runtime object (pt_rt_ext,
 * core/rt_internal.h): its check at post_model_load and its get_stats field.
 * The tile loop itself is a hook of its own (pt_tiled_mlp), and the planner's
 * tile terms are read through tiled.h.
 */
#include "core/rt_internal.h"
#include "tiled.h"

static int active(const pt_rt *rt) { return rt->cfg.tiled_mlp_enabled != 0; }

static int model_load(pt_rt *rt, pt_model_v1 *host, char *err, size_t errlen) {
    (void)host;
    rt->mlp_auto_n = 0;   /* tiles = auto: decided after the profile */
    return pt_tiled_check(rt, err, errlen);
}

static void stats(const pt_rt *rt, pt_stats_v1 *s) { s->mlp_tiles = pt_tiled_mlp_tiles(rt); }

const pt_rt_ext pt_tiled_ext = {
    .name = "tiled_mlp",
    .active = active,
    .model_load = model_load,
    .stats = stats,
};
