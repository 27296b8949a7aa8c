/*
 * adamw.c — the --no-plugin AdamW on the CPU (sh_adamw.h).
 */
#include "sh_adamw.h"

#include <math.h>
#include <string.h>

sh_adamw_k sh_adamw_consts(float lr, float b1, float b2, float eps, float wd, int64_t t) {
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2r = (float)(1.0 / sqrt(1.0 - pow((double)b2, (double)t)));
    sh_adamw_k k;
    k.b1 = b1;
    k.b2 = b2;
    k.eps = eps;
    k.omb1 = 1.0f - b1;
    k.omb2 = 1.0f - b2;
    k.lrwd = lr * wd;
    k.step = lr / bc1;
    k.bc2r = bc2r;
    return k;
}

double sh_adamw_cpu(const sh_model *m, float *pd, float *pg, float *mm, float *vv,
                    float max_norm, const sh_adamw_k *k) {
    float scale = 1.0f;
    double norm = NAN;
    if (max_norm > 0.0f) {
        /* global L2 norm: per param, squares summed in double in element order; the
         * per-param sums added in declaration order; tied params counted once */
        double s = 0.0;
        for (int i = 0; i < m->n_params; i++) {
            const pt_param_v1 *p = &m->params[i];
            if (!p->trainable || p->tie >= 0) continue;
            const float *g = (const float *)p->grad;
            size_t n = sh_model_param_numel(p);
            double ps = 0.0;
            for (size_t j = 0; j < n; j++) ps += (double)g[j] * (double)g[j];
            s += ps;
        }
        norm = sqrt(s);
        if (norm > (double)max_norm) scale = (float)((double)max_norm / (norm + 1e-6));
    }
    size_t n = m->n_floats;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) sh_adamw_elem(&pd[i], &mm[i], &vv[i], pg[i] * scale, k);
    memset(pg, 0, n * sizeof(float));
    return norm;
}
