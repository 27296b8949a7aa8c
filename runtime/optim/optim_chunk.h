/*
 * optim_chunk.h — a chunk as an optimizer step sees it: the narrow view the
 * chunk store hands the optimizer kinds (runtime/store/kinds), so that the
 * update code here never sees the store's layout. A view holds the chunk's
 * trainable regions (where each one's values sit in the parameter and
 * gradient copies and in the fp32 state), the copies' addresses (the device
 * ones for a resident chunk, the pinned ones for an offloaded chunk) and the
 * kind's own state block.
 *
 * AdamW over a view (optim_chunk.c), the same element update on both sides:
 *   device: per region the backend's adamw op on stream s; a 16-bit
 *           gradient is widened into fp32 scratch first, the fp32 master is
 *           stepped and the 16-bit copy written from it;
 *   CPU:    every region one job whose slices every worker shares
 *           (pt_cpu_adam_step_many), a 16-bit parameter stepped through its
 *           master, the gradient the staged copy or the fp32 sum (from_acc).
 */
#ifndef PT_OPTIM_CHUNK_H
#define PT_OPTIM_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_adam.h"
#include "gpu.h"
#include "thread_pool.h"

/* One trainable region of a chunk. */
typedef struct pt_optim_region {
    uint64_t offset;   /* bytes into the parameter and gradient copies */
    uint64_t n;        /* elements (padding included) */
    uint64_t state;    /* its first element in master, m, v and the gradient sum */
    int32_t dtype;     /* the parameters' dtype (PT_F32, PT_BF16, PT_F16) */
} pt_optim_region;

/* A chunk's view. */
typedef struct pt_optim_chunk {
    int id;                      /* the chunk's index, for messages */
    int n_regions;               /* trainable regions, in offset order */
    const pt_optim_region *reg;
    void *param;                 /* the parameters, in their dtypes */
    const void *grad;            /* the gradient, in the parameters' dtypes */
    const float *gacc;           /* fp32 gradient sum (offloaded chunks), or NULL */
    float *master, *m, *v;       /* fp32 state: masters of 16-bit regions, the moments */
    void *state;                 /* the optimizer kind's own block for the chunk, or NULL */
} pt_optim_chunk;

/* Device AdamW over every region of resident chunk c on stream s: `hyper`
 * gives the step's hyper-parameters (lr, betas, eps, decay, bias corrections,
 * gradient scale; its n, param, grad, m, v, param_out are set here per
 * region); scratch holds fp32 for the largest 16-bit region. PT_ERR_BACKEND
 * naming the chunk when an op fails. */
int pt_adamw_chunk_dev(const pt_gpu_backend *ops, void *impl, pt_stream *s, float *scratch,
                       const pt_optim_chunk *c, const pt_adamw_args *hyper, char *err,
                       size_t errlen);
/* CPU AdamW over every region of offloaded chunk c with constants k, the
 * gradient from c->gacc (from_acc) or c->grad: grp NULL steps it now (from a
 * worker: the wait runs the job's queued slices itself), else the runners go
 * into grp with hooks h. */
void pt_adamw_chunk_cpu(pt_pool *pool, const pt_optim_chunk *c, const pt_adamw_consts *k,
                        int from_acc, pt_task_group *grp, const pt_cpu_adam_hooks *h);

#endif
