/*
 * sh_fingerprint.h — what fixes sample_host's side of the math, as the text
 * pt_host_v1.fingerprint carries (one name=value per line), so that ranks
 * started with another seed, data set, batch, accumulation or learning-rate
 * schedule refuse to train together instead of training apart.
 */
#ifndef SH_FINGERPRINT_H
#define SH_FINGERPRINT_H

#include <stddef.h>

#include "sh_config.h"
#include "sh_data.h"

/* Writes the text into buf (len bytes). Every rank gets the same text from the
 * same settings and data: the rank, paths and timing are left out, and the data
 * enter by content (token counts and a hash of the tokens: every token up to
 * 4 Mi of them, else 4 Mi tokens at an even stride). Returns 0, or -1 when buf
 * is too small. */
int sh_fingerprint(const sh_config *c, const sh_tokens *train, const sh_tokens *val, char *buf,
                   size_t len);

#endif
