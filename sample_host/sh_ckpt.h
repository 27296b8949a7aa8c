/*
 * sh_ckpt.h — llm.c GPT-2 checkpoint load/save (llm.c's format).
 *
 * Format (little-endian): header of 256 int32 —
 *   [0] 20240326 magic, [1] 3 version (fp32), [2] maxT, [3] V, [4] L, [5] NH, [6] C,
 *   [7] Vp, rest 0 — then 16 fp32 tensors back to back, per-layer tensors stacked over L:
 *   wte (Vp,C) wpe (maxT,C) ln1w (L,C) ln1b (L,C) qkvw (L,3C,C) qkvb (L,3C)
 *   attprojw (L,C,C) attprojb (L,C) ln2w (L,C) ln2b (L,C) fcw (L,4C,C) fcb (L,4C)
 *   fcprojw (L,C,4C) fcprojb (L,C) lnfw (C) lnfb (C).
 * sample_host keeps per-layer tensors separately; load/save restack them.
 */
#ifndef SH_CKPT_H
#define SH_CKPT_H

#include <stddef.h>

#include "sh_gpt.h"

#define SH_CKPT_MAGIC 20240326
#define SH_CKPT_VERSION 3

/* Read and validate the header and the file size; fills d. */
int sh_ckpt_read_header(const char *path, sh_dims *d, char *err, size_t errlen);
/* Load the tensors into m->init; the file's dims must equal m->d (else an error naming
 * the first field that differs). */
int sh_ckpt_load(const char *path, sh_model *m, char *err, size_t errlen);
/* Save values given in the model's flat layout (flat[m->off[i]...], m->n_floats floats).
 * Written to PATH.tmp, fsync'd and renamed, so a crash never leaves a half file. */
int sh_ckpt_save(const char *path, const sh_model *m, const float *flat, char *err,
                 size_t errlen);

#endif /* SH_CKPT_H */
