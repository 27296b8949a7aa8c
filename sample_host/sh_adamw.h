/*
 * sh_adamw.h — the --no-plugin AdamW of sample_host (arithmetic in sh_train.h): the
 * per-step constants, shared by the CPU step below and the CUDA kernel, and the CPU
 * step itself (global-norm clipping, the sh_adamw_elem update, zeroed gradients).
 */
#ifndef SH_ADAMW_H
#define SH_ADAMW_H

#include <stdint.h>

#include "sh_elem.h"
#include "sh_gpt.h"

/* Constants of optimizer step t (1-based): bc1 = (float)(1 - b1^t) and
 * bc2r = (float)(1/sqrt(1 - b2^t)) in double math, then (1-b1), (1-b2), lr*wd
 * and lr/bc1 in float. */
sh_adamw_k sh_adamw_consts(float lr, float b1, float b2, float eps, float wd, int64_t t);

/* One CPU step over the flat layout (n = m->n_floats floats in p, g, mm, vv; every
 * untied param trainable). Clipping when max_norm > 0, with the norm over m's
 * trainable untied params (squares in double in element order, params in declaration
 * order). Gradients are zeroed. Returns the norm, NaN when not clipping. */
double sh_adamw_cpu(const sh_model *m, float *p, float *g, float *mm, float *vv,
                    float max_norm, const sh_adamw_k *k);

#endif /* SH_ADAMW_H */
