/*
 * trace_cache.h — the profile trace on disk, so a rerun with the same model,
 * shapes, device and world size skips profiling.
 *
 * File: <cache_dir>/<16 hex digits>.trace, the hex being FNV-1a 64 of the key
 * fields. Format (little-endian, version PT_TRACE_FILE_VERSION):
 *   header (128 bytes):
 *     0   char[8]  magic "PTTRACE\0"
 *     8   u32      file format version
 *     12  u32      header size (128)
 *     16  u64      key.arch_hash
 *     24  i64      key.batch
 *     32  i64      key.seq
 *     40  i32      key.world_size
 *     44  u32      key.version (PT_TRACE_VERSION)
 *     48  char[64] key.device
 *     112 u64      payload size in bytes
 *     120 u64      FNV-1a 64 of the payload
 *   payload: the trace scalars, then n_block block records, then n_chunk chunk
 *   records, every field in declaration order as u32/i32/u64/i64/f64 (reserved
 *   fields are not stored; a chunk record is 108 bytes).
 * Writes are atomic: <file>.tmp.<pid>, fsync, rename, fsync of the directory.
 * A missing file is a plain miss; a corrupt, truncated, foreign-key or
 * other-version file is a miss with a warning sentence (never a crash).
 */
#ifndef PT_TRACE_CACHE_H
#define PT_TRACE_CACHE_H

#include "trace.h"

#define PT_TRACE_FILE_VERSION 10u   /* 2: chunk records carry dev_bytes, host_bytes;
                                      3: the scalars end with calib (4 f64);
                                      4: chunk records end with optim_bytes, optim_s;
                                      5: the scalars end with frag (f64 factor, 4 u64);
                                      6: all-gather and reduce-scatter rates (2 f64)
                                         after the all-reduce rate;
                                      7: tp_size (i32) after chunk_size, chunk records
                                         end with tp_grad_bytes, tp_factor_bytes;
                                      8: dev_op_s, dev_memset_Bps, h2d_lat_s, d2h_lat_s
                                         (4 f64) after the reduce-scatter rate;
                                      9: chunk records end with optim_aux_words,
                                         optim_mn, optim_own_max (3 u64);
                                      10: free_Bps, free_fwd_Bps (2 f64) after d2h_lat_s */
#define PT_TRACE_HEADER_BYTES 128u

enum { PT_CACHE_MISS = 0,
       PT_CACHE_HIT = 1 };

/* Path of the cache file for key: "<dir>/<hex>.trace". 0, or PT_ERR_INVALID_ARG
 * when it does not fit in len. */
int pt_trace_cache_path(const char *dir, const pt_trace_key *key, char *buf, size_t len);

/* Store t under t->key (creates dir if missing). 0 or PT_ERR_IO/INVALID_ARG. */
int pt_trace_cache_store(const char *dir, const pt_trace *t, char *err, size_t errlen);

/* Look key up. Returns PT_CACHE_HIT (out filled, validated) or PT_CACHE_MISS.
 * warn gets "" on a clean miss, or one sentence why an existing file was
 * rejected. out must be initialised (pt_trace_init); it is left empty on a miss. */
int pt_trace_cache_load(const char *dir, const pt_trace_key *key, pt_trace *out,
                        char *warn, size_t warnlen);

/* The same for an explicit file. expect may be NULL (accept any key). Returns
 * PT_OK, or PT_ERR_IO (cannot open/read), PT_ERR_FORMAT (corrupt, truncated,
 * wrong version or key), with err filled. */
int pt_trace_write_file(const char *path, const pt_trace *t, char *err, size_t errlen);
int pt_trace_read_file(const char *path, const pt_trace_key *expect, pt_trace *out,
                       char *err, size_t errlen);

#endif /* PT_TRACE_CACHE_H */
