/*
 * sh_paths.h — sample_host's output paths, checked before the first step, and
 * the end-of-run model save with a fallback place.
 */
#ifndef SH_PATHS_H
#define SH_PATHS_H

#include <stddef.h>

#include "sh_config.h"
#include "sh_gpt.h"

/* --save, --metrics and --checkpoint-dir: each one's folder exists and takes a
 * new file (one is created and removed there), a file path is not a folder. -1
 * with a sentence naming the flag, the path and the cause; nothing is written. */
int sh_paths_check(const sh_config *c, char *err, size_t errlen);

/* Write the model (flat layout) to c->save. When that fails after all (the disk
 * filled, the folder went away), the model goes to a place that can be found:
 * c->checkpoint_dir when set, else $TMPDIR (or /tmp), under the same base name
 * prefixed with the pid, and err says where. 0, or -1 (also when the fallback
 * took it: the run did not write what was asked). *written receives the path
 * written, "" when none. */
int sh_paths_save_model(const sh_config *c, const sh_model *m, const float *flat, char *written,
                        size_t wlen, char *err, size_t errlen);

#endif /* SH_PATHS_H */
