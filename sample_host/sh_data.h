/*
 * sh_data.h — token data for sample_host: byte-level text, the default corpus (the
 * repository's own text files), llm.c token shards, and deterministic batch sampling.
 *
 * llm.c token shard (llm.c's format): header of 256 little-endian int32
 *   [0] = 20240520 (magic), [1] = 1 (version), [2] = number of tokens n, rest 0;
 * then n uint16 tokens. File size must be exactly 1024 + 2n.
 */
#ifndef SH_DATA_H
#define SH_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "sh_rng.h"

#define SH_SHARD_MAGIC 20240520
#define SH_SHARD_VERSION 1
#define SH_SHARD_MAGIC_U32 20240801 /* llama-3 variant (uint32 tokens): rejected */

typedef struct sh_tokens {
    uint16_t *tok; /* (n) token ids */
    size_t n;
} sh_tokens;

void sh_data_tokens_free(sh_tokens *t);

/* Bytes of a text file as tokens 0..255. */
int sh_data_text_file_tokens(const char *path, sh_tokens *out, char *err, size_t errlen);
/* A file given by --data: an llm.c shard (detected by its magic) or else text. */
int sh_data_load(const char *path, sh_tokens *out, char *err, size_t errlen);
/* Read / write an llm.c shard; every header field and the file size are checked. */
int sh_data_read_shard(const char *path, sh_tokens *out, char *err, size_t errlen);
int sh_data_write_shard(const char *path, const uint16_t *tok, size_t n, char *err, size_t errlen);

/* The repository root: $PT_ROOT, else the first directory upward from the current one
 * (then from the executable's) that holds host_api/protrain.h. 0 on success. */
int sh_data_find_repo_root(char *out, size_t outlen);
/* Default corpus: the repository's text files (*.md *.c *.h *.cu *.ini *.sh under the
 * root, skipping hidden and build* folders), concatenated in sorted path order. */
int sh_data_default_corpus(const char *root, sh_tokens *out, char *err, size_t errlen);

/* Split t into train (first 90%) and validation (last 10%) views (no copies). */
void sh_data_split(const sh_tokens *t, sh_tokens *train, sh_tokens *val);
/* Largest token id + 1 (0 when empty). */
int sh_data_tokens_vocab(const sh_tokens *t);

/* One (B,T) batch: row r starts at a uniform random offset o in [0, n-T);
 * inp[r,t] = tok[o+t], tgt[r,t] = tok[o+t+1]. Requires n > T. */
void sh_data_sample_batch(sh_rng *r, const sh_tokens *t, int B, int T, int32_t *inp, int32_t *tgt);
/* Validation batch k: row r starts at ((k*B + r) * T) mod (n - T): fixed windows so
 * every evaluation sees the same text. Requires n > T. */
void sh_data_val_batch(const sh_tokens *t, int k, int B, int T, int32_t *inp, int32_t *tgt);

/* --data: one file, a comma-separated list, or glob patterns (matches in sorted
 * order; a pattern without a match is an error). Each file is read by sh_data_load
 * (shards' headers checked) and the tokens are concatenated in the order given. */
int sh_data_load_list(const char *spec, sh_tokens *out, char *err, size_t errlen);

#endif /* SH_DATA_H */
