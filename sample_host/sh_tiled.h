/*
 * sh_tiled.h — sample_host's side of TiledMLP (protrain.h: tiled_mlp_forward /
 * tiled_mlp_backward, host callbacks mlp_forward / mlp_backward, tiled_mlp_scratch).
 *
 * When the plugin reports TiledMLP on (pt_stats_v1.mlp_tiles > 0 after init), each
 * block runs as: attention part up to ln2 (the arena has no fch / fch_gelu), then
 * the plugin's tiled_mlp_forward(l, B*T), which calls back once per tile of rows.
 * A token (row) is b*T + s over the (B,T) batch flattened row-major; the MLP is
 * token-wise, so a tile may cross from one sequence into the next. Backward: the
 * plugin's tiled_mlp_backward recomputes each tile (fch, fch_gelu into the tile
 * scratch) and calls its backward (d ln2 rows into dsmall, weight gradients +=),
 * then the host runs the rest of the block's backward. A CKPT recompute runs only
 * the attention part: the MLP output is not needed again and its intermediates
 * are recomputed per tile anyway.
 * Tile scratch (floats): fch (n,4C), fch_gelu (n,4C), and in backward dbig (n,4C).
 */
#ifndef SH_TILED_H
#define SH_TILED_H

#include <stddef.h>
#include <stdint.h>

#include "protrain.h"
#include "sh_gpt.h"
#include "sh_work.h"

typedef struct sh_tiled {
    int on;                   /* the plugin runs the MLPs in tiles */
    const pt_plugin_v1 *tbl;
    void *ctx;
    const sh_launcher *lw;
    const sh_model *m;
    /* the block whose MLP is being tiled (set for the duration of the hook) */
    int active, l, B, T, backward;
    float *a, *out;           /* arena; forward output rows (N,C) */
    float *dres, *dsmall;     /* backward: dL/d out (N,C), d ln2 (N,C) */
    char *err;                /* callback error sentence */
    size_t errlen;
} sh_tiled;

/* After the plugin's init: t->on from get_stats (0 without the hooks). */
void sh_tiled_query(sh_tiled *t);
/* Block l's MLP, forward (out = res2 + mlp(ln2)) / backward (dsmall = d ln2). */
int32_t sh_tiled_fwd(sh_tiled *t, int l, float *a, float *out, int B, int T);
int32_t sh_tiled_bwd(sh_tiled *t, int l, float *a, float *dres, float *dsmall, int B, int T);
/* The mlp_forward (backward = 0) / mlp_backward (1) callback for one tile. */
int32_t sh_tiled_cb(sh_tiled *t, int32_t b, int64_t begin, int64_t count, int backward);

#endif
