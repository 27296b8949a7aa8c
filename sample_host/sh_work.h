/*
 * sh_work.h — the trainer's device work, as a GPU host issues it.
 *
 * Each piece of a pass (embedding, a block's forward, the head, a block's
 * backward, a recompute, an input upload) is one sh_op. sh_work_run either runs
 * it at once on the calling thread (no plugin, a plugin without a compute
 * stream, or CUDA, where running it enqueues its kernels on the host's stream)
 * or launches it on the plugin's compute stream (protrain.h: launch),
 * where it runs later, after the hook that follows it may have returned.
 * Launching captures what a kernel launch captures: the op's buffers and the
 * model's parameter addresses as they are now (a copy of the descriptor
 * array), and for uploads a copy of the source bytes. The CPU reads results
 * (the loss, logits) only after sh_work_sync.
 */
#ifndef SH_WORK_H
#define SH_WORK_H

#include <stddef.h>
#include <stdint.h>

#include "protrain.h"
#include "sh_gpt.h"

typedef enum sh_op_kind {
    SH_OP_ENCODER_FWD = 0, /* out = wte[tok] + wpe */
    SH_OP_BLOCK_FWD,       /* block l: arena a, input x, output out */
    SH_OP_HEAD_FWD,        /* head on x: *loss_out += mean loss (when tgt) */
    SH_OP_HEAD_BWD,        /* head backward into dres */
    SH_OP_BLOCK_BWD,       /* block l backward: arena a, input x, dres in/out */
    SH_OP_ENCODER_BWD,     /* dwte, dwpe += from dres */
    SH_OP_UPLOAD,          /* dst = a copy of src taken at launch (bytes) */
    SH_OP_BLOCK_FWD_ATTN,  /* TiledMLP: block l up to ln2 (tiled arena layout) */
    SH_OP_MLP_FWD,         /* TiledMLP: one tile's MLP forward (mlp) */
    SH_OP_MLP_BWD,         /* TiledMLP: one tile's MLP backward (mlp) */
    SH_OP_BLOCK_BWD_ATTN   /* TiledMLP: block l's backward below the MLP */
} sh_op_kind;

typedef struct sh_op {
    sh_op_kind kind;
    int l, B, T;
    float *a;                 /* block arena */
    const float *x;           /* block or head input (B,T,C) */
    float *out;               /* block or encoder output (B,T,C) */
    const int32_t *tok, *tgt; /* (B,T) device tokens; tgt NULL = no loss */
    float dloss;              /* head backward: d(loss)/d(each position's loss) */
    float *dres;              /* (B,T,C) residual gradient */
    sh_head_acts head;
    sh_scratch scr;
    double *loss_out;         /* head forward adds its mean loss here (device memory of
                                 the model's layer table) */
    sh_mlp_rows mlp;          /* TiledMLP tile ops */
    void *dst;                /* upload */
    const void *src;
    size_t bytes;
} sh_op;

typedef struct sh_launcher {
    const pt_plugin_v1 *tbl;  /* NULL: run everything at once */
    void *ctx;
    int async;                /* tbl has launch and stream_sync: launch */
} sh_launcher;

/* Whether the plugin offers a compute stream (then the host sets
 * PT_HOST_ASYNC_COMPUTE in pt_host_v1.flags). */
int sh_work_can_launch(const pt_plugin_v1 *tbl);
/* Runs or launches op over model m (addresses read now). 0, or the launch
 * hook's status. */
int32_t sh_work_run(const sh_launcher *L, const sh_model *m, const sh_op *op);
/* Waits for every launched op (0, or the hook's status). */
int32_t sh_work_sync(const sh_launcher *L);

#endif
