/*
 * tiled_internal.h — TiledMLP's per-run state, private to runtime/tiled: the
 * runtime object holds it behind the feature's pt_rt_ext slot
 * (pt_rt_ext_state); tiled_ext.c makes it at post_model_load and frees it at
 * finalize, and tiled_mlp.c reads it (none yet reads as all zeros).
 */
#ifndef PT_TILED_INTERNAL_H
#define PT_TILED_INTERNAL_H

#include "core/rt_internal.h"
#include "tiled.h"

typedef struct pt_tiled_state {
    int in_tiles;             /* inside a tiled_mlp_forward/backward tile loop */
    void *tile_scr;           /* the tile scratch handed to the host, or NULL */
    uint64_t tile_scr_bytes;
    int64_t tile_count;       /* rows of the tile being run; tile_bwd: inside a backward */
    int tile_bwd;
    uint64_t tile_tok[2];     /* device bytes of tile scratch per row seen, forward / backward */
    int64_t mlp_auto_n;       /* tiles = auto: the count chosen (0: not yet, the profile's) */
} pt_tiled_state;

/* TiledMLP's state in rt, or NULL before the first post_model_load. */
static inline pt_tiled_state *tiled_of(const pt_rt *rt) { return pt_rt_ext_state(rt, &pt_tiled_ext); }

#endif
