/*
 * sh_resume.h — crash-safe checkpoint generations and --resume for sample_host.
 *
 * A generation is one folder DIR/gen-<step> (step zero-padded to 8 digits) holding
 *   - the training state: the plugin's state file(s) (save_state, one per rank), or
 *     with --no-plugin params.bin (the flat parameters, then AdamW m, then v, fp32);
 *   - host.txt: the host's state (step, batch and sampling RNG positions, the
 *     no-plugin optimizer step count, skipped steps, metrics file length, totals for
 *     the summary) and the "run" lines: every setting that fixes the trajectory
 *     (model shape, batch, schedule, optimizer, seed, device, data size and hash);
 *   - MANIFEST: format line, step, state kind, the run's id ("ident", also in
 *     host.txt; not a "run" line, it is not a setting) and world size, one
 *     line per file (name, size, FNV-1a 64 checksum: every file, the plugin's state
 *     files too), and a last line "end <checksum of every byte above it>".
 * A generation mixes when a file is not the one it wrote: a plugin state file
 * whose checksum differs from the MANIFEST's but which the plugin reads as intact
 * (so copied from another generation, run or rank), one whose optimizer step is
 * not the generation's, host state whose run id differs from the MANIFEST's, or
 * host state with values no run writes (sh_gen_check_values). --resume refuses
 * such a generation with an error naming the file and field; a file that is torn
 * or flipped (the plugin's own checksum fails, a size differs) is corrupt: that
 * generation is skipped with a warning and the previous one is used.
 * It is written as DIR/gen-<step>.tmp.<pid>/ (every file fsync'd, then the folder)
 * and renamed into place, so a gen-<step> folder is always complete; one being
 * replaced or dropped is first renamed to gen-<step>.del.<pid>. A crash at any point
 * leaves the previous generations as they were. Leftover .tmp/.del folders whose
 * writer process no longer exists are removed by the next save or resume.
 */
#ifndef SH_RESUME_H
#define SH_RESUME_H

#include <stddef.h>
#include <stdint.h>

#include "sh_config.h"
#include "sh_data.h"
#include "sh_gpt.h"
#include "sh_train.h"

/* Where the run stands after `step` completed steps, besides the training state. */
typedef struct sh_resume_state {
    int64_t step;
    sh_trainer_state tr;       /* batch sampler position, no-plugin AdamW step count */
    uint64_t gen_rng;          /* the sampling stream */
    int64_t n_skipped;         /* steps skipped for a non-finite loss */
    int64_t metrics_bytes;     /* metrics file length after this step's line */
    int64_t train_tokens;      /* summary totals */
    double train_time, last_loss, last_val;
    uint64_t run_id;           /* the run's id (0: a generation of an earlier version) */
    int world;                 /* ranks of the saving run (0: not recorded) */
} sh_resume_state;

typedef struct sh_resume {
    const sh_config *c;
    int plugin;                /* 1: the state is the plugin's, else params.bin */
    char run[2048];            /* the "run" lines of this run (trajectory settings) */
    uint64_t run_id;           /* drawn at start, the resumed generation's after --resume */
} sh_resume;

/* Describe this run: c (borrowed, outlives r), the resolved dims and the data. */
void sh_resume_init(sh_resume *r, const sh_config *c, const sh_dims *d, const sh_tokens *train,
                    const sh_tokens *val, int plugin);
/* Write generation st->step into c->checkpoint_dir, then drop generations newer than
 * it (an abandoned future) and all but the newest c->checkpoint_keep. 0 or -1. */
int sh_resume_save(const sh_resume *r, sh_trainer *tr, const sh_resume_state *st, char *err,
                   size_t errlen);
/* Load the newest complete and valid generation into tr and *st; a corrupt or
 * incomplete one is skipped with a warning naming it (on stderr). gen (genlen bytes)
 * receives its folder. Returns 0 loaded, 1 nothing to resume (no folder or no
 * generation), -1 error (a generation of another run, or none loadable). */
int sh_resume_load(sh_resume *r, sh_trainer *tr, sh_resume_state *st, char *gen,
                   size_t genlen, char *err, size_t errlen);

/* A fresh run's id: random, never 0. */
uint64_t sh_gen_new_id(void);
/* Values of a generation's host state no run writes: -1 with a sentence naming the
 * field and its bounds into why. */
int sh_gen_check_values(const sh_resume_state *s, const sh_config *c, char *why, size_t wl);

#endif /* SH_RESUME_H */
