/*
 * llmc.c — batch orders (random, llm.c's sequential and shuffled loaders), --data
 * file lists and globs, learning-rate schedules. See sh_llmc.h.
 */
#include "sh_llmc.h"

#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shuffled order's stream; distinct from sh_rng.h's init/batch/gen streams so a
 * permutation never correlates with the init or sampling draws. */
#define STREAM_SHUFFLE 4u

static void permute(sh_sampler *s, uint64_t epoch) {
    sh_rng r;
    /* one stream per epoch: the epoch number is mixed into the seed by an odd
     * constant, so epochs e and e+1 share no state */
    sh_rng_seed(&r, s->seed ^ (epoch * 0x9e3779b97f4a7c15ull), STREAM_SHUFFLE);
    for (uint64_t i = 0; i < s->nwin; i++) s->perm[i] = (size_t)i;
    for (uint64_t i = s->nwin; i > 1; i--) {
        uint64_t j = sh_rng_below(&r, i);
        size_t tmp = s->perm[i - 1];
        s->perm[i - 1] = s->perm[j];
        s->perm[j] = tmp;
    }
    s->perm_epoch = epoch;
}

int sh_sampler_init(sh_sampler *s, int order, const sh_tokens *t, int B, int T, uint64_t seed,
                    char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->order = order;
    s->B = B;
    s->T = T;
    s->seed = seed;
    s->t = t;
    sh_rng_seed(&s->rng, seed, SH_STREAM_BATCH);
    if (order == SH_ORDER_RANDOM) return 0; /* sh_sample_batch checks n > T itself */
    size_t bt = (size_t)B * (size_t)T;
    if (t->n < bt + 1) {
        snprintf(err, errlen, "data_order = %s needs at least batch x seq + 1 = %zu training "
                 "tokens, the data has %zu", order == SH_ORDER_SEQUENTIAL ? "sequential" :
                 "shuffled", bt + 1, t->n);
        return -1;
    }
    s->nwin = (uint64_t)((t->n - 1) / bt);
    if (order == SH_ORDER_SHUFFLED) {
        s->perm = malloc((size_t)s->nwin * sizeof *s->perm);
        if (!s->perm) {
            snprintf(err, errlen, "out of host memory for the shuffled order of %llu windows",
                     (unsigned long long)s->nwin);
            return -1;
        }
        permute(s, 0);
    }
    return 0;
}

void sh_sampler_free(sh_sampler *s) {
    free(s->perm);
    s->perm = NULL;
}

uint64_t sh_sampler_window_start(const sh_sampler *s) {
    uint64_t w = s->order == SH_ORDER_SHUFFLED ? (uint64_t)s->perm[s->pos] : s->pos;
    return w * (uint64_t)s->B * (uint64_t)s->T;
}

void sh_sampler_peek(const sh_sampler *s, int32_t *inp, int32_t *tgt) {
    if (s->order == SH_ORDER_RANDOM) {
        sh_rng copy = s->rng;
        sh_sample_batch(&copy, s->t, s->B, s->T, inp, tgt);
        return;
    }
    const uint16_t *w = s->t->tok + sh_sampler_window_start(s);
    size_t bt = (size_t)s->B * (size_t)s->T;
    for (size_t i = 0; i < bt; i++) {
        inp[i] = w[i];
        tgt[i] = w[i + 1];
    }
}

void sh_sampler_next(sh_sampler *s, int32_t *inp, int32_t *tgt) {
    if (s->order == SH_ORDER_RANDOM) {
        sh_sample_batch(&s->rng, s->t, s->B, s->T, inp, tgt);
        return;
    }
    sh_sampler_peek(s, inp, tgt);
    /* advance now, so the state a checkpoint records always names the next window */
    if (++s->pos == s->nwin) {
        s->pos = 0;
        s->epoch++;
        if (s->order == SH_ORDER_SHUFFLED) permute(s, s->epoch);
    }
}

void sh_sampler_next_rank(sh_sampler *s, int world, int rank, int32_t *inp, int32_t *tgt,
                          int32_t *scratch) {
    if (world <= 1) {
        sh_sampler_next(s, inp, tgt);
        return;
    }
    size_t bt = (size_t)s->B * (size_t)s->T;
    for (int r = 0; r < world; r++) {
        if (r == rank) sh_sampler_next(s, inp, tgt);
        else sh_sampler_next(s, scratch, scratch + bt);
    }
}

void sh_sampler_get(const sh_sampler *s, uint64_t *rng, uint64_t *epoch, uint64_t *pos) {
    *rng = s->rng.s;
    *epoch = s->epoch;
    *pos = s->pos;
}

void sh_sampler_set(sh_sampler *s, uint64_t rng, uint64_t epoch, uint64_t pos) {
    s->rng.s = rng;
    s->epoch = epoch;
    /* a position from a run with other data cannot be used; resume.c refuses such a
     * run by its data hash first, this only keeps the index in range */
    s->pos = s->nwin ? pos % s->nwin : 0;
    if (s->order == SH_ORDER_SHUFFLED && s->perm_epoch != epoch) permute(s, epoch);
}

/* ---- --data lists and globs ---- */

static int append(sh_tokens *all, const char *path, char *err, size_t errlen) {
    sh_tokens one;
    if (sh_load_data(path, &one, err, errlen)) return -1;
    uint16_t *nt = realloc(all->tok, (all->n + one.n + 1) * sizeof *nt);
    if (!nt) {
        snprintf(err, errlen, "out of host memory adding %zu tokens of %s", one.n, path);
        sh_tokens_free(&one);
        return -1;
    }
    memcpy(nt + all->n, one.tok, one.n * sizeof *nt);
    all->tok = nt;
    all->n += one.n;
    sh_tokens_free(&one);
    return 0;
}

int sh_load_data_list(const char *spec, sh_tokens *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    /* one plain file: the single-file loader itself (no copy, its own messages) */
    if (!strpbrk(spec, ",*?[")) return sh_load_data(spec, out, err, errlen);
    char *list = strdup(spec);
    if (!list) {
        snprintf(err, errlen, "out of host memory reading --data");
        return -1;
    }
    int rc = 0;
    char *save = NULL;
    for (char *item = strtok_r(list, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        if (!*item) continue;
        if (!strpbrk(item, "*?[")) {
            rc = append(out, item, err, errlen);
            continue;
        }
        glob_t g;
        int gr = glob(item, GLOB_ERR, NULL, &g); /* glob sorts its matches */
        if (gr == GLOB_NOMATCH) {
            snprintf(err, errlen, "--data: the pattern %s matches no file", item);
            rc = -1;
        } else if (gr != 0) {
            snprintf(err, errlen, "--data: cannot expand the pattern %s", item);
            rc = -1;
        }
        for (size_t i = 0; gr == 0 && !rc && i < g.gl_pathc; i++)
            rc = append(out, g.gl_pathv[i], err, errlen);
        if (gr == 0) globfree(&g);
    }
    free(list);
    if (!rc && out->n == 0 && !out->tok) {
        snprintf(err, errlen, "--data '%s' names no file", spec);
        rc = -1;
    }
    if (rc) sh_tokens_free(out);
    return rc;
}

float sh_lr_at(int schedule, float lr_f, float min_frac, int warmup, int steps, int step) {
    double lr = lr_f, mn = lr * min_frac;
    if (warmup > 0 && step <= warmup) return (float)(lr * step / warmup);
    int decay = steps - warmup;
    if (decay <= 0 || schedule == SH_LR_CONSTANT) return (float)lr;
    double prog = (double)(step - warmup) / decay;
    if (schedule == SH_LR_LINEAR) return (float)(lr - (lr - mn) * prog);
    return (float)(mn + 0.5 * (1.0 + cos(M_PI * prog)) * (lr - mn));
}
