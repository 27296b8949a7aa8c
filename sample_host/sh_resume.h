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
 *   - MANIFEST: format line, step, state kind, one line per file (name, size, and
 *     an FNV-1a 64 checksum for the host's files; the plugin checks its own), and a
 *     last line "end <checksum of every byte above it>".
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
} sh_resume_state;

typedef struct sh_resume {
    const sh_config *c;
    int plugin;                /* 1: the state is the plugin's, else params.bin */
    char run[2048];            /* the "run" lines of this run (trajectory settings) */
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
int sh_resume_load(const sh_resume *r, sh_trainer *tr, sh_resume_state *st, char *gen,
                   size_t genlen, char *err, size_t errlen);

#endif /* SH_RESUME_H */
