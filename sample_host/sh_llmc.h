/*
 * sh_llmc.h — what sample_host needs to train on llm.c's data the way llm.c does:
 * the batch order (llm.c's sequential and shuffled loaders beside sample_host's own
 * random rows), --data given as a list or glob of shards, and the learning-rate
 * schedules.
 *
 * Batch orders (sh_config.data_order):
 *  - random:     each of the B rows starts at a uniform random offset (rows may
 *                overlap); the stream is the seed's batch stream. The default, and what
 *                every earlier run used.
 *  - sequential: llm.c's unshuffled loader. Window w holds tokens [w*B*T, w*B*T + B*T]
 *                (B*T+1 tokens); row r of the batch is inputs window[r*T .. r*T+T),
 *                targets shifted by one. Windows follow each other at a stride of B*T
 *                (the last target of one window is the first input of the next, as in
 *                llm.c), so no input token repeats within an epoch; an epoch is
 *                (n-1) / (B*T) windows and the next one starts again at token 0.
 *  - shuffled:   the same windows in a seeded permutation (Fisher-Yates on the seed's
 *                batch stream mixed with the epoch number), a new one every epoch.
 * The position (epoch, window index) and the random stream's state are all of the
 * sampler's state; a checkpoint records them and the permutation is rebuilt from
 * (seed, epoch), so a resumed run draws the same batches.
 */
#ifndef SH_LLMC_H
#define SH_LLMC_H

#include <stddef.h>
#include <stdint.h>

#include "sh_data.h"
#include "sh_rng.h"

/* sh_config.data_order and sh_train_opts.data_order */
enum { SH_ORDER_RANDOM = 0,
       SH_ORDER_SEQUENTIAL = 1,
       SH_ORDER_SHUFFLED = 2 };
/* sh_config.lr_schedule */
enum { SH_LR_COSINE = 0,
       SH_LR_CONSTANT = 1,
       SH_LR_LINEAR = 2 };

typedef struct sh_sampler {
    int order, B, T;
    uint64_t seed;
    const sh_tokens *t;  /* borrowed */
    sh_rng rng;          /* random: row offsets */
    uint64_t nwin;       /* windows per epoch (sequential, shuffled) */
    uint64_t epoch, pos; /* next window: index pos of epoch `epoch` */
    size_t *perm;        /* shuffled: the permutation of epoch perm_epoch */
    uint64_t perm_epoch;
} sh_sampler;

/* 0, or -1 with one sentence in err (too few tokens for one batch, no memory). */
int sh_sampler_init(sh_sampler *s, int order, const sh_tokens *t, int B, int T, uint64_t seed,
                    char *err, size_t errlen);
void sh_sampler_free(sh_sampler *s);
/* The next batch (B x T inputs and targets), and advance. */
void sh_sampler_next(sh_sampler *s, int32_t *inp, int32_t *tgt);
/* Data parallel: draws `world` batches and returns batch `rank` of them (the others
 * go through scratch, 2*B*T ints, only so the random order advances the same way),
 * so every rank's sampler stays in one state and W ranks see the batches one rank
 * drawing W times sees. world <= 1 is sh_sampler_next. */
void sh_sampler_next_rank(sh_sampler *s, int world, int rank, int32_t *inp, int32_t *tgt,
                          int32_t *scratch);
/* The batch sh_sampler_next would return, without advancing. */
void sh_sampler_peek(const sh_sampler *s, int32_t *inp, int32_t *tgt);
/* State for checkpoints; set rebuilds the permutation of that epoch. */
void sh_sampler_get(const sh_sampler *s, uint64_t *rng, uint64_t *epoch, uint64_t *pos);
void sh_sampler_set(sh_sampler *s, uint64_t rng, uint64_t epoch, uint64_t pos);
/* Token offset of the window sh_sampler_next returns next (sequential/shuffled). */
uint64_t sh_sampler_window_start(const sh_sampler *s);

/* Learning rate at `step` (1-based, as in the metrics; llm.c counts from 0, so its
 * step s is our step s+1): linear warmup lr*step/warmup over `warmup` steps, then
 * cosine: lr*min_frac + (lr - lr*min_frac) * (1 + cos(pi*p)) / 2,
 * linear:  lr - (lr - lr*min_frac) * p,   constant: lr,
 * with p = (step - warmup) / (steps - warmup). */
float sh_lr_at(int schedule, float lr, float min_frac, int warmup, int steps, int step);

#endif /* SH_LLMC_H */
