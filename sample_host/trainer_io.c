/*
 * trainer_io.c — reading and writing the trainer's state: parameters read back,
 * the plugin's counters, the no-plugin optimizer state and the plugin's state
 * files for checkpoints (resume.c), the batch order's position.
 */
#include <string.h>

#include "sh_trainer_int.h"

int sh_trainer_snapshot(sh_trainer *tr, float *flat) {
    const sh_model *m = &tr->model;
    if (!tr->tbl) {
        SYNC();
        return sh_trainer_copy(tr, flat, tr->p_data, m->n_floats * sizeof(float), PT_COPY_D2H);
    }
    if (!PT_HAS_HOOK(tr->tbl, read_param))
        return sh_trainer_fail(tr, "plugin lacks read_param: cannot read the parameters back");
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].tie >= 0) continue;
        size_t n = sh_model_param_numel(&m->params[i]);
        HOOK(read_param, i, i, flat + m->off[i], n * sizeof(float));
    }
    return 0;
}

int sh_trainer_stats(sh_trainer *tr, pt_stats_v1 *st) {
    if (!tr->tbl || !PT_HAS_HOOK(tr->tbl, get_stats)) return 1;
    memset(st, 0, sizeof *st);
    st->struct_size = sizeof *st;
    HOOK(get_stats, 0, st);
    return 0;
}

const sh_model *sh_trainer_model(const sh_trainer *tr) { return &tr->model; }
const char *sh_trainer_error(const sh_trainer *tr) { return tr->err; }
double sh_trainer_last_norm(const sh_trainer *tr) { return tr->last_norm; }

void sh_trainer_zero_grads(sh_trainer *tr) {
    if (!tr->tbl) sh_trainer_dzero(tr, tr->p_grad, tr->model.n_floats * sizeof(float));
}

/* ---- checkpoint access (resume.c) ---- */

void sh_trainer_get_state(const sh_trainer *tr, sh_trainer_state *s) {
    sh_sampler_get(&tr->batch, &s->batch_rng, &s->data_epoch, &s->data_pos);
    s->opt_steps = tr->t;
}

void sh_trainer_set_state(sh_trainer *tr, const sh_trainer_state *s) {
    sh_sampler_set(&tr->batch, s->batch_rng, s->data_epoch, s->data_pos);
    tr->t = s->opt_steps;
}

int sh_trainer_opt_io(sh_trainer *tr, float *p, float *m, float *v, int load) {
    if (tr->tbl) return sh_trainer_fail(tr, "the optimizer state lives in the plugin (use save_state)");
    size_t b = tr->model.n_floats * sizeof(float);
    float *dev[3] = {tr->p_data, tr->opt_m, tr->opt_v}, *host[3] = {p, m, v};
    SYNC();   /* no update may still be writing what is read or replaced */
    for (int k = 0; k < 3; k++)
        if (sh_trainer_copy(tr, load ? dev[k] : host[k], load ? host[k] : dev[k], b,
                 load ? PT_COPY_H2D : PT_COPY_D2H))
            return -1;
    SYNC();
    return 0;
}

int sh_trainer_dist_sum(sh_trainer *tr, double *v, int n) {
    if (!tr->tbl || !PT_HAS_HOOK(tr->tbl, dist_allreduce))
        return sh_trainer_fail(tr, "%d ranks need a plugin with dist_allreduce (ABI 1.3)", tr->o.world);
    HOOK(dist_allreduce, tr->o.world, v, n);
    return 0;
}

void sh_trainer_dist_abort(sh_trainer *tr, const char *why) {
    if (tr && tr->tbl && tr->ctx && PT_HAS_HOOK(tr->tbl, dist_abort))
        (void)tr->tbl->dist_abort(tr->ctx, why);
}

int sh_trainer_plugin_state(sh_trainer *tr, const char *dir, int load) {
    if (!tr->tbl) return sh_trainer_fail(tr, "no plugin: its state cannot be saved or loaded");
    if (!(load ? PT_HAS_HOOK(tr->tbl, load_state) : PT_HAS_HOOK(tr->tbl, save_state)))
        return sh_trainer_fail(tr, "plugin lacks %s: it cannot checkpoint", load ? "load_state" : "save_state");
    SYNC();
    if (load) HOOK(load_state, 0, dir);
    else HOOK(save_state, 0, dir);
    return 0;
}
