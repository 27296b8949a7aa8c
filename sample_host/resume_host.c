/*
 * resume_host.c — a checkpoint generation's host.txt: the "run" lines that fix
 * the trajectory (sh_resume_init), the host's state written and parsed, and the
 * comparison of a saved run's lines with this run's.
 */
#include "sh_resume.h"
#include "resume_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- describing the run ---- */

static void add_run(char *buf, size_t n, const char *key, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used >= n) return;
    snprintf(buf + used, n - used, "run %s ", key);
    used = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, n - used, fmt, ap);
    va_end(ap);
    used = strlen(buf);
    if (used + 1 < n) strcat(buf, "\n");
}

void sh_resume_init(sh_resume *r, const sh_config *c, const sh_dims *d, const sh_tokens *train,
                    const sh_tokens *val, int plugin) {
    memset(r, 0, sizeof *r);
    r->c = c;
    r->plugin = plugin;
    r->run_id = sh_gen_new_id();
    char *b = r->run;
    size_t n = sizeof r->run;
    /* every setting the per-step losses depend on; the plan (the plugin's INI
     * sections) is not one of them, so it may change between the halves */
    add_run(b, n, "vocab", "%d", d->V);
    add_run(b, n, "padded_vocab", "%d", d->Vp);
    add_run(b, n, "max_seq", "%d", d->maxT);
    add_run(b, n, "layers", "%d", d->L);
    add_run(b, n, "heads", "%d", d->NH);
    add_run(b, n, "channels", "%d", d->C);
    add_run(b, n, "batch", "%d", c->batch);
    add_run(b, n, "seq", "%d", c->seq);
    /* micro-batches per step over all ranks: 2 ranks x 1 and 1 rank x 2 take the
     * same batches per step (rank r takes batch r of every W), so a generation
     * of one resumes under the other */
    add_run(b, n, "grad_accum", "%d", c->grad_accum * (c->world > 1 ? c->world : 1));
    add_run(b, n, "steps", "%d", c->steps);
    add_run(b, n, "seed", "%" PRIu64, c->seed);
    add_run(b, n, "optimizer", "%s", c->optim_from_ini ? "ini" : "adamw");
    add_run(b, n, "lr", "%.9g", c->lr);
    add_run(b, n, "min_lr_frac", "%.9g", c->min_lr_frac);
    add_run(b, n, "warmup", "%d", c->warmup);
    /* written only when not the default, so generations of earlier versions (which
     * lack these lines and used random rows and cosine) still resume */
    static const char *const sched[] = {"cosine", "constant", "linear"};
    static const char *const order[] = {"random", "sequential", "shuffled"};
    if (c->lr_schedule != SH_LR_COSINE) add_run(b, n, "lr_schedule", "%s", sched[c->lr_schedule]);
    if (c->data_order != SH_ORDER_RANDOM) add_run(b, n, "data_order", "%s", order[c->data_order]);
    add_run(b, n, "weight_decay", "%.9g", c->weight_decay);
    add_run(b, n, "beta1", "%.9g", c->beta1);
    add_run(b, n, "beta2", "%.9g", c->beta2);
    add_run(b, n, "eps", "%.9g", c->eps);
    add_run(b, n, "max_grad_norm", "%.9g", c->max_grad_norm);
    add_run(b, n, "device", "%s", c->device == SH_DEVICE_CUDA ? "cuda" : "cpu");
    add_run(b, n, "plugin", "%s", plugin ? "yes" : "no");
    add_run(b, n, "train_tokens", "%zu", train->n);
    add_run(b, n, "train_hash", "%016" PRIx64, sh_resume_fnv(FNV_START, train->tok, train->n * 2));
    add_run(b, n, "val_tokens", "%zu", val->n);
    add_run(b, n, "val_hash", "%016" PRIx64, sh_resume_fnv(FNV_START, val->tok, val->n * 2));
}

/* ---- host.txt ---- */

int sh_resume_host_text(const sh_resume *r, const sh_resume_state *st, char *buf, size_t n) {
    int k = snprintf(buf, n,
                     "sample_host-host-state 1\n"
                     "step %lld\nbatch_rng 0x%016" PRIx64 "\nopt_steps %lld\n"
                     "gen_rng 0x%016" PRIx64 "\nn_skipped %lld\nmetrics_bytes %lld\n"
                     "train_tokens %lld\ntrain_time %a\nlast_loss %a\nlast_val %a\n"
                     "data_epoch %" PRIu64 "\ndata_pos %" PRIu64 "\nident %016" PRIx64
                     "\nworld %d\n%s",
                     (long long)st->step, st->tr.batch_rng, (long long)st->tr.opt_steps,
                     st->gen_rng, (long long)st->n_skipped, (long long)st->metrics_bytes,
                     (long long)st->train_tokens, st->train_time, st->last_loss, st->last_val,
                     st->tr.data_epoch, st->tr.data_pos, r->run_id,
                     r->c->world > 1 ? r->c->world : 1, r->run);
    return k > 0 && (size_t)k < n ? k : -1;
}

/* The value of "key" in a "key value" line of text (a "run key value" line when
 * run), copied into v; 0 when found. */
int sh_resume_find_val(const char *text, const char *key, int run, char *v, size_t vn) {
    size_t kl = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *q = p;
        if (run) {
            if (strncmp(q, "run ", 4) != 0) continue;
            q += 4;
        }
        if (strncmp(q, key, kl) != 0 || q[kl] != ' ') continue;
        q += kl + 1;
        size_t len = strcspn(q, "\n");
        if (len >= vn) len = vn - 1;
        memcpy(v, q, len);
        v[len] = '\0';
        return 0;
    }
    return -1;
}

/* The default of a run key that is written only when it is not the default
 * (sh_resume_init), NULL for the keys always written. */
static const char *omitted_default(const char *key) {
    if (!strcmp(key, "lr_schedule")) return "cosine";
    if (!strcmp(key, "data_order")) return "random";
    return NULL;
}

/* The saved run must be this run: every trajectory setting equal. */
int sh_resume_same_run(const sh_resume *r, const char *saved, const char *gen, char *err,
                       size_t errlen) {
    for (const char *p = r->run; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        char key[64], mine[128], theirs[128];
        if (sscanf(p, "run %63s %127s", key, mine) != 2) break;
        if (sh_resume_find_val(saved, key, 1, theirs, sizeof theirs) != 0) {
            /* a key written only when not the default: its absence is the default */
            const char *def = omitted_default(key);
            if (def)
                return sh_resume_say(err, errlen, "--resume: %s was written by a run with %s = %s "
                                                  "(the default, which generations do not record) but this run has "
                                                  "%s = %s; resuming would not continue that run",
                                     gen, key, def, key,
                                     mine);
            return sh_resume_say(err, errlen, "--resume: %s does not record '%s' (written by another "
                                              "version of sample_host?)",
                                 gen, key);
        }
        if (strcmp(mine, theirs) != 0)
            return sh_resume_say(err, errlen, "--resume: %s was written by a run with %s = %s but this "
                                              "run has %s = %s; resuming would not continue that run (settings "
                                              "that fix the losses must match; the plan may change)",
                                 gen, key, theirs, key, mine);
    }
    /* and a setting only the saved run records (written when not the default, as
     * data_order) differs from this run's default */
    for (const char *p = saved; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        char key[64], theirs[128], mine[128];
        if (sscanf(p, "run %63s %127s", key, theirs) != 2) continue;
        if (sh_resume_find_val(r->run, key, 1, mine, sizeof mine) != 0)
            return sh_resume_say(err, errlen, "--resume: %s was written by a run with %s = %s but this "
                                              "run has the default %s = %s; resuming would not continue that run",
                                 gen, key, theirs, key, omitted_default(key) ? omitted_default(key) : "?");
    }
    return 0;
}

int sh_resume_parse_host(const char *text, sh_resume_state *st) {
    char v[128];
    const char *keys[] = {"step", "batch_rng", "opt_steps", "gen_rng", "n_skipped",
                          "metrics_bytes", "train_tokens", "train_time", "last_loss",
                          "last_val"};
    if (strncmp(text, "sample_host-host-state 1\n", 25) != 0) return -1;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (sh_resume_find_val(text, keys[i], 0, v, sizeof v)) return -1;
        char *end = NULL;
        errno = 0;
        if (i >= 7) {
            double x = strtod(v, &end);
            if (i == 7) st->train_time = x;
            else if (i == 8) st->last_loss = x;
            else st->last_val = x;
        } else {
            unsigned long long u = strtoull(v, &end, 0);
            int64_t s = (int64_t)u;
            switch (i) {
            case 0: st->step = s; break;
            case 1: st->tr.batch_rng = (uint64_t)u; break;
            case 2: st->tr.opt_steps = s; break;
            case 3: st->gen_rng = (uint64_t)u; break;
            case 4: st->n_skipped = s; break;
            case 5: st->metrics_bytes = s; break;
            default: st->train_tokens = s; break;
            }
        }
        if (end == v || *end || errno) return -1;
    }
    /* the ordered loaders' position; absent in earlier versions' files (random rows
     * only, where the batch_rng above is the whole position) */
    st->tr.data_epoch = st->tr.data_pos = 0;
    if (sh_resume_find_val(text, "data_epoch", 0, v, sizeof v) == 0) st->tr.data_epoch = strtoull(v, NULL, 0);
    if (sh_resume_find_val(text, "data_pos", 0, v, sizeof v) == 0) st->tr.data_pos = strtoull(v, NULL, 0);
    /* the run's id and world size; absent in earlier versions' files (0) */
    st->run_id = 0;
    st->world = 0;
    if (sh_resume_find_val(text, "ident", 0, v, sizeof v) == 0) st->run_id = strtoull(v, NULL, 16);
    if (sh_resume_find_val(text, "world", 0, v, sizeof v) == 0) st->world = atoi(v);
    return 0;
}
