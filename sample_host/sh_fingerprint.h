/*
 * sh_fingerprint.h — what fixes sample_host's side of the math and of its
 * outputs, as the text pt_host_v1.fingerprint carries (one name=value per
 * line), so that ranks started with another model shape, seed, data set,
 * batch, accumulation, schedule, evaluation or checkpoint setting refuse to
 * train together (at init, the field named) instead of training apart or
 * waiting for each other in different collectives.
 *
 * Every option of sample_host is either in the text or left out for a reason:
 *   in:  the model dims as resolved (a --load file's header), batch, seq,
 *        grad_accum, steps, seed, optimizer source and AdamW settings, the lr
 *        schedule (warmup, min_lr_frac, lr_schedule), data_order,
 *        on_nonfinite, device, the data by content, val_every, val_batches,
 *        gen_every, gen_len, temperature, checkpoint_dir, checkpoint_every,
 *        stop_after, resume, whether --save is given, debug_nan_step;
 *   out: the paths of --data / --val-data (their content is in), --load (its
 *        weights are compared by the plugin at post_model_load), --config and
 *        --plugin (the plugin compares its release and the INI keys that fix
 *        the math itself), --metrics, --save's path, checkpoint_keep, progress,
 *        quiet, log_every, metrics_no_time (rank 0 alone writes and prunes),
 *        debug_save_sleep_ms (timing only), the rank numbers.
 * Lines named "run.*" are the run's identity, which the plugin records in its
 * state files and compares on load (runtime/store/state_io.c).
 */
#ifndef SH_FINGERPRINT_H
#define SH_FINGERPRINT_H

#include <stddef.h>

#include "sh_config.h"
#include "sh_data.h"
#include "sh_gpt.h"

/* Writes the text into buf (len bytes) for the resolved dims d. Every rank gets
 * the same text from the same settings and data: the data enter by content
 * (token counts and a hash of the tokens: every token up to 4 Mi of them, else
 * 4 Mi tokens at an even stride). Returns 0, or -1 when buf is too small. */
int sh_fingerprint(const sh_config *c, const sh_dims *d, const sh_tokens *train,
                   const sh_tokens *val, char *buf, size_t len);

#endif
