/*
 * tiled.h — TiledMLP: a block's MLP run in sequence tiles (tiled_mlp.c), so
 * that only one tile's (rows, 4C)-sized intermediates exist at a time. The
 * plugin drives the tiles through the host's mlp_forward / mlp_backward
 * callbacks; the feature keeps its per-run state (the tile scratch, the tile
 * being run, the auto count: tiled_internal.h) behind its slot in the runtime
 * object, which calls it only through its extension table (tiled_ext.c).
 */
#ifndef PT_TILED_H
#define PT_TILED_H

#include <stddef.h>
#include <stdint.h>

struct pt_rt;
struct pt_rt_ext;
struct pt_trace;

/* TiledMLP's entries in the runtime object's extension table (tiled_ext.c). */
extern const struct pt_rt_ext pt_tiled_ext;

/* Block b's MLP over `tokens` rows in the configured tiles (backward: recompute,
 * then backward, per tile; weight gradients summed in fp32 and added once). */
int pt_tiled_mlp(struct pt_rt *rt, int32_t b, int64_t tokens, int backward, char *err,
                 size_t errlen);
/* The tile scratch the host asks for inside a tile callback. */
int pt_tiled_scratch(struct pt_rt *rt, uint64_t bytes, void **ptr, char *err, size_t errlen);
/* Tiles per MLP: 0 = TiledMLP off; before post_model_load the configured count (auto 1). */
uint64_t pt_tiled_mlp_tiles(const struct pt_rt *rt);
/* At post_model_load, refuse what TiledMLP cannot run (non-fp32
 * gradients, a host without the callbacks). */
int pt_tiled_check(struct pt_rt *rt, char *err, size_t errlen);
/* The tile count asked for: the INI's, the auto choice, or (0) the profiling rule. */
int64_t pt_tiled_tiles_req(const struct pt_rt *rt);
/* tiles = auto: search with the profile t adjusted to each candidate count, fewest
 * first; applies the first plan that fits (pt_rt_search_and_apply). */
int pt_tiled_auto_search(struct pt_rt *rt, const struct pt_trace *t, double prof_s, char *err,
                         size_t errlen);

#endif
