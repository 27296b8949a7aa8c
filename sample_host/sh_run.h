/*
 * sh_run.h — the sample_host program: data, model, training loop, evaluation,
 * generation, metrics, progress display, summary and checkpoint save.
 */
#ifndef SH_RUN_H
#define SH_RUN_H

#include <stddef.h>

#include "sh_config.h"

/* Run what cfg asks (train, or --write-shard). Output goes to stdout; returns 0, or
 * -1 with one sentence in err. */
int sh_run(const sh_config *cfg, char *err, size_t errlen);
/* main(): parse flags, run, print the error and return non-zero on failure. */
int sh_run_main(int argc, char **argv);

#endif /* SH_RUN_H */
