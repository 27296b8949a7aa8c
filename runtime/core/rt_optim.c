/*
 * rt_optim.c — create_optimizer: the host's descriptor merged over the INI
 * (NaN = from the INI; auto betas and weight decay by the optimizer chosen),
 * checked, and the plan redone for what the optimizer needs (clipping), then
 * the store's optimizer state made.
 */
#include "rt.h"

#include <math.h>

#include "device_ext.h"
#include "rt_internal.h"

int pt_rt_create_optimizer(pt_rt *rt, const pt_optim_v1 *d, char *err, size_t errlen) {
    pt_optim_state *o = &rt->opt;
    const pt_config *c = &rt->cfg;
    int type = (d && d->type != PT_OPTIM_FROM_CONFIG) ? d->type : c->optim_type;
    if (type != PT_OPTIM_ADAMW && type != PT_OPTIM_REKLS) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "create_optimizer: optimizer type %d is "
                       "unknown (%d = adamw, %d = rekls)", type, PT_OPTIM_ADAMW, PT_OPTIM_REKLS);
    }
    int crc = pt_rt_ext_optimizer_check(rt, type, err, errlen);
    if (crc) return crc;
    /* Into a copy first: a refused descriptor leaves the optimizer as it was. */
    pt_optim_state n = *o;
    static const char *const names[6] = {"lr", "beta1", "beta2", "eps", "weight_decay",
                                         "max_grad_norm"};
    const float given[6] = {d ? d->lr : NAN, d ? d->beta1 : NAN, d ? d->beta2 : NAN,
                            d ? d->eps : NAN, d ? d->weight_decay : NAN,
                            d ? d->max_grad_norm : NAN};
    /* NaN means "from the INI"; an infinity is a host mistake, never a setting */
    for (int i = 0; i < 6; i++)
        if (isinf(given[i]))
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "create_optimizer: pt_optim_v1.%s is %g; it must be finite (NaN = "
                           "from the INI)", names[i], (double)given[i]);
    n.lr = !isnan(given[0]) ? given[0] : c->lr;
    n.beta1 = !isnan(given[1]) ? given[1] : c->beta1;
    /* [optimizer] beta2 = auto (NaN): the reference's default of the optimizer
     * actually chosen, 0.95 for REKLS (betas (0.9, 0.95)), 0.999 for AdamW */
    n.beta2 = !isnan(given[2]) ? given[2]
              : !isnan(c->beta2) ? c->beta2
              : type == PT_OPTIM_REKLS ? 0.95f : 0.999f;
    n.eps = !isnan(given[3]) ? given[3] : c->eps;
    /* [optimizer] weight_decay = auto (NaN), the same way: REKLS's reference
     * default 0.01, AdamW's 0 (what every AdamW run had before auto existed) */
    n.weight_decay = !isnan(given[4]) ? given[4]
                     : !isnan(c->weight_decay) ? c->weight_decay
                     : type == PT_OPTIM_REKLS ? 0.01f : 0.0f;
    n.max_grad_norm = !isnan(given[5]) ? given[5] : c->max_grad_norm;
    if (!(n.lr >= 0) || !(n.beta1 >= 0 && n.beta1 < 1) || !(n.beta2 >= 0 && n.beta2 < 1) ||
        !(n.eps > 0) || !(n.weight_decay >= 0)) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "create_optimizer: bad hyper-parameters lr %g beta1 %g beta2 %g eps %g weight_decay %g "
            "(need lr >= 0, betas in [0,1), eps > 0, weight_decay >= 0)",
            n.lr, n.beta1, n.beta2, n.eps, n.weight_decay);
    }
    n.type = type;
    n.lr0 = n.lr;
    /* A host porting REKLS(eps=...) gives its eps in the descriptor: it is REKLS's
     * eps then (the descriptor wins over the INI, as for every other field), and
     * the AdamW eps of the parameters REKLS does not take, the same number. */
    n.rekls_eps = !isnan(given[3]) ? given[3] : c->rekls_eps;
    *o = n;
    pt_gpu_oom_reset(rt->dev.gpu);
    o->t = 0;
    o->last_norm = NAN;
    if (type == PT_OPTIM_REKLS)
        PT_LOGI(&rt->lg, "optimizer rekls lr %g betas (%g, %g) shampoo_beta %g eps %g "
                "weight_decay %g (%s) step 1 %s clip %s; AdamW (eps %g, decoupled decay) for "
                "the parameters REKLS does not take", o->lr, o->beta1, o->beta2,
                c->rekls_shampoo_beta, o->rekls_eps, o->weight_decay,
                c->rekls_wd_method == 1 ? "independent" : c->rekls_wd_method == 2 ? "l2"
                : c->rekls_wd_method == 3 ? "palm" : "decoupled",
                c->rekls_seed_shampoo ? "seeded with Shampoo factors" : "as the reference",
                o->max_grad_norm > 0 ? "global-norm" : "off", o->eps);
    else
        PT_LOGI(&rt->lg, "optimizer adamw lr %g betas (%g, %g) eps %g weight_decay %g clip %s",
                o->lr, o->beta1, o->beta2, o->eps, o->weight_decay,
                o->max_grad_norm > 0 ? "global-norm" : "off");
    int rc = pt_rt_replan_for_optimizer(rt, o->max_grad_norm > 0, err, errlen);
    if (!rc) rc = pt_store_optimizer_init(rt->st, err, errlen);
    rt->opt_created = !rc;
    return rc;
}
