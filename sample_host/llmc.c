/*
 * llmc.c — batch orders (random, llm.c's sequential and shuffled loaders). See
 * sh_llmc.h; the --data lists and globs are read in data.c, the learning-rate
 * schedules are lr.c.
 */
#include "sh_llmc.h"

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
    if (order == SH_ORDER_RANDOM) return 0; /* sh_data_sample_batch checks n > T itself */
    size_t bt = (size_t)B * (size_t)T;
    if (t->n < bt + 1) {
        snprintf(err, errlen, "data_order = %s needs at least batch x seq + 1 = %zu training "
                              "tokens, the data has %zu",
                 order == SH_ORDER_SEQUENTIAL ? "sequential" : "shuffled", bt + 1, t->n);
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
        sh_data_sample_batch(&copy, s->t, s->B, s->T, inp, tgt);
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
        sh_data_sample_batch(&s->rng, s->t, s->B, s->T, inp, tgt);
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
