/*
 * work.c — running or launching the trainer's device work (sh_work.h).
 */
#include "sh_work.h"

#include <stdlib.h>
#include <string.h>

#include "sh_ops.h"

static void exec(const sh_model *m, const sh_op *op) {
    const sh_dims *d = &m->d;
    const sh_layer_ops *O = m->ops ? m->ops : &sh_cpu_ops;
    switch (op->kind) {
    case SH_OP_ENCODER_FWD:
        O->encoder_fwd(O->ctx, op->out, op->tok, (const float *)m->params[SH_P_WTE].data,
                       (const float *)m->params[SH_P_WPE].data, op->B, op->T, d->C);
        break;
    case SH_OP_BLOCK_FWD:
        sh_model_block_fwd(m, op->l, op->a, op->x, op->out, op->B, op->T);
        break;
    case SH_OP_HEAD_FWD:
        sh_model_head_fwd(m, &op->head, op->x, op->tgt, op->B, op->T, op->loss_out);
        break;
    case SH_OP_HEAD_BWD:
        sh_model_head_bwd(m, &op->head, op->x, op->tgt, op->dloss, op->dres, op->scr.dsmall, op->B,
                          op->T);
        break;
    case SH_OP_BLOCK_BWD:
        sh_model_block_bwd(m, op->l, op->a, op->x, op->dres, &op->scr, op->B, op->T);
        break;
    case SH_OP_ENCODER_BWD:
        O->encoder_bwd(O->ctx, (float *)m->params[SH_P_WTE].grad,
                       (float *)m->params[SH_P_WPE].grad, op->dres, op->tok, op->B, op->T, d->C);
        break;
    case SH_OP_BLOCK_FWD_ATTN:
        sh_model_block_fwd_attn(m, op->l, op->a, op->x, op->B, op->T, 1);
        break;
    case SH_OP_MLP_FWD:
        sh_model_mlp_fwd(m, op->l, &op->mlp);
        break;
    case SH_OP_MLP_BWD:
        sh_model_mlp_bwd(m, op->l, &op->mlp);
        break;
    case SH_OP_BLOCK_BWD_ATTN:
        sh_model_block_bwd_attn(m, op->l, op->a, op->x, op->dres, &op->scr, op->B, op->T, 1);
        break;
    case SH_OP_UPLOAD:
        /* only launched on the host backend (device memory is host memory there) */
        memcpy(op->dst, op->src, op->bytes);
        break;
    }
}

/* A launched op: the op, the model with its own copy of the parameter
 * descriptors, and for uploads the bytes. One allocation, freed by the run. */
typedef struct job {
    sh_op op;
    sh_model m;
    pt_param_v1 params[]; /* m.n_params, then the upload bytes */
} job;

static void job_run(void *arg) {
    job *j = arg;
    exec(&j->m, &j->op);
    free(j);
}

int sh_work_can_launch(const pt_plugin_v1 *tbl) {
    return tbl && PT_HAS_HOOK(tbl, launch) && PT_HAS_HOOK(tbl, stream_sync);
}

int32_t sh_work_run(const sh_launcher *L, const sh_model *m, const sh_op *op) {
    if (!L->async) {
        exec(m, op);
        return 0;
    }
    size_t pbytes = (size_t)m->n_params * sizeof(pt_param_v1);
    size_t extra = op->kind == SH_OP_UPLOAD ? op->bytes : 0;
    job *j = malloc(sizeof *j + pbytes + extra);
    if (!j) return PT_ERR_HOST_OOM;
    j->op = *op;
    j->m = *m;
    memcpy(j->params, m->params, pbytes);
    j->m.params = j->params;
    if (extra) {
        unsigned char *bytes = (unsigned char *)j->params + pbytes;
        memcpy(bytes, op->src, extra);
        j->op.src = bytes;
    }
    int32_t st = L->tbl->launch(L->ctx, job_run, j);
    if (st != 0) free(j);
    return st;
}

int32_t sh_work_sync(const sh_launcher *L) {
    return L->async ? L->tbl->stream_sync(L->ctx) : 0;
}
