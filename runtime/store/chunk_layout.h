/*
 * chunk_layout.h — packing parameters into chunks and choosing the chunk size
 * S_chunk. Pure logic: no device, no threads.
 *
 * Placement rules:
 *  - Placement follows execution order (exec_order: first use; declaration order
 *    breaks ties). The hook contract fixes the blocks' order of first use (forward
 *    runs blocks 0..n-1), so without an explicit order blocks go in index order
 *    whatever order the host declared them in (pt_layout_params_from_model). exec_order < 0 means "not observed": such
 *    params go after every observed one, in declaration order.
 *  - A block's params are one unit, kept contiguous and placed at the position of
 *    the block's earliest-used param. Before a block whose params do not fit in the
 *    remaining space of the open chunk, that chunk is sealed; a block larger than
 *    S_chunk starts a fresh chunk and spans consecutive chunks.
 *  - Non-block params (block == -1) are singleton units in execution order. They
 *    never share a chunk with block params (our choice):
 *    chunks holding any non-block param are mandatory persistent, and mixing one
 *    small norm weight into a block chunk would pin a whole S_chunk of block params
 *    on the device for the entire run.
 *  - A single tensor larger than S_chunk gets its own chunk of exactly its size
 *    (oversize). The open chunk is sealed first so chunk order stays execution order.
 *  - Tied params are placed once. All params tied (directly or through a chain) to
 *    the same root form a group stored at the root's place; the group's position is
 *    the earliest exec_order of any member (a tied tensor is placed at its first use).
 *    If the members belong to different blocks (or any is non-block), the storage is
 *    treated as non-block (needed outside a single block's hook window -> must be
 *    resident). The group is trainable if any member is. Members must agree on
 *    dtype and byte size.
 *  - Offsets inside a chunk are aligned to PT_LAYOUT_ALIGN = 64 bytes (a multiple of
 *    every element size; one cache line; enough for 16-byte CUDA vector loads and
 *    AVX-512 aligned loads). Cost: at most 63 padding bytes per param.
 *  - Regions: each chunk is cut into maximal runs of consecutive params with the
 *    same (dtype, trainable). A region covers [offset, offset + bytes) including the
 *    alignment padding between its params, so the runtime must keep padding zeroed
 *    (then an optimizer stepping a whole region leaves padding at zero). The sharded
 *    mode splits regions across ranks; the optimizer skips frozen regions.
 */
#ifndef PT_CHUNK_LAYOUT_H
#define PT_CHUNK_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "protrain.h"

#define PT_LAYOUT_ALIGN 64u

/* Input: one per model param, index = position in the array. */
typedef struct pt_layout_param {
    uint64_t bytes;      /* numel * elem_size of the compute dtype (> 0) */
    uint32_t elem_size;  /* 4 (f32), 2 (bf16/f16) or 1 (u8); must match dtype */
    int32_t dtype;       /* pt_dtype */
    int32_t block;       /* owning block in [0, n_blocks), or -1 */
    int32_t tie;         /* index of the param whose storage it shares, or -1 */
    int32_t trainable;   /* 0 = frozen */
    int32_t exec_order;  /* first-use rank (lower = earlier); < 0 = not observed */
} pt_layout_param;

/* A run of same-(dtype, trainable) params inside a chunk. */
typedef struct pt_chunk_region {
    uint64_t offset;     /* bytes from the chunk start (aligned to PT_LAYOUT_ALIGN) */
    uint64_t bytes;      /* to the end of the region's last param (padding included) */
    int32_t dtype;
    int32_t trainable;
} pt_chunk_region;

typedef struct pt_chunk {
    uint64_t capacity;         /* S_chunk, or the tensor's exact size when oversize */
    uint64_t bytes_used;       /* end offset of the last param placed */
    uint64_t trainable_bytes;  /* sum of bytes of its trainable params */
    int32_t first_param;       /* params are layout->order[first_param .. +n_params) */
    int32_t n_params;
    int32_t block_first;       /* lowest / highest block with params here; -1 if none */
    int32_t block_last;
    int32_t oversize;          /* 1: one tensor larger than S_chunk, capacity exact */
    int32_t mandatory_persistent; /* 1: holds a non-block param; never offloaded */
    int32_t n_regions;
    const pt_chunk_region *regions;  /* n_regions entries, in offset order */
} pt_chunk;

typedef struct pt_layout {
    uint64_t chunk_size;       /* S_chunk */
    int32_t n_params;          /* as given to pt_layout_build */
    int32_t n_blocks;
    int32_t n_chunks;
    int32_t n_placed;          /* params with their own storage (tied members excluded) */
    int32_t n_mandatory;       /* chunks with mandatory_persistent */
    int32_t n_oversize;        /* oversize chunks */
    pt_chunk *chunks;          /* [n_chunks], in execution order */
    int32_t *order;            /* [n_placed] param indices in placement order */
    int32_t *param_chunk;      /* [n_params] chunk holding the storage (tied -> root's) */
    uint64_t *param_offset;    /* [n_params] byte offset in that chunk (tied -> root's) */
    int32_t *param_root;       /* [n_params] index of the param owning the storage */
    int32_t *block_chunk_first;/* [n_blocks] first chunk with the block's params, -1 none */
    int32_t *block_chunk_last; /* [n_blocks] last such chunk (the range is contiguous) */
    pt_chunk_region *regions;  /* all chunks' regions, chunk by chunk */
    int32_t n_regions;
    uint64_t total_used;       /* sum of bytes_used over chunks */
    uint64_t total_capacity;   /* sum of capacity over chunks */
} pt_layout;

/*
 * Build the layout. chunk_size must be a positive multiple of PT_LAYOUT_ALIGN.
 * On failure returns PT_ERR_INVALID_ARG (bad input: names the param index and field)
 * or PT_ERR_HOST_OOM (malloc), fills err, and leaves *out zeroed.
 */
int pt_layout_build(const pt_layout_param *p, int32_t n_params, int32_t n_blocks,
                    uint64_t chunk_size, pt_layout *out, char *err, size_t errlen);
void pt_layout_free(pt_layout *l);

/* Non-tail waste, what the chunk-size choice minimises: sum over chunks k = 0..N-2
 * of capacity_k - used_k; oversize chunks count 0 (their capacity is exact anyway). */
uint64_t pt_layout_waste(const pt_layout *l);

/*
 * Fill p[i] from the host's descriptors: bytes = prod(shape) * elem_size(dtype).
 * exec_order: per-param first-use rank, or NULL for the order the hook contract
 * fixes (blocks in index order, non-block params in declaration order; a host
 * that declares its blocks in order gets the declaration order).
 */
int pt_layout_params_from_model(const pt_model_v1 *m, const int32_t *exec_order,
                                pt_layout_param *p, char *err, size_t errlen);

/* ---- chunk size selection ---- */

#define PT_CHUNK_MAX_CANDIDATES 48

typedef struct pt_chunk_candidate {
    uint64_t size;       /* S_chunk candidate (a power of two) */
    uint64_t waste;      /* pt_layout_waste at this size */
    int32_t n_chunks;
    int32_t n_oversize;
    int32_t eligible;    /* 0: fewer than min_chunks chunks (see below) */
} pt_chunk_candidate;

typedef struct pt_chunk_size_choice {
    uint64_t chosen;     /* the selected S_chunk */
    int32_t chosen_index;/* into cand[] */
    int32_t min_chunks;  /* eligibility rule: n_chunks >= min_chunks */
    uint64_t lo, hi;     /* grid bounds (inclusive) */
    int32_t n_cand;
    pt_chunk_candidate cand[PT_CHUNK_MAX_CANDIDATES];
} pt_chunk_size_choice;

/*
 * Grid: powers of two from lo to hi, where (T = total placed bytes,
 * Bmax = largest block's bytes, Tmax = largest block-owned tensor):
 *   lo = max(4 KiB, pow2ceil(Tmax), pow2floor(Bmax / 8), pow2floor(T / 4096))
 *     - pow2ceil(Tmax): no block tensor is ever oversize, so no block chunk is pinned
 *       on the device for being oversize (the store keeps oversize chunks persistent);
 *     - Bmax / 8: a block spans at most ~8-16 chunks (per-chunk copy and event
 *       overheads stay small next to the transfer);
 *     - T / 4096: at most a few thousand chunks for block-less models;
 *   hi = max(4 * lo, 2 * pow2ceil(Bmax)), capped at max(lo, pow2ceil(T)).
 * Tiny test models get KiB chunks; a 7B fp16 model (Bmax ~ 400 MB, Tmax ~ 90 MB)
 * gets 128 MiB .. 1 GiB.
 * Eligibility: n_chunks >= min_chunks = min(8, N_blocks) (at least 1). Without it a
 * size holding the whole model in one chunk has zero non-tail waste and would always
 * win, leaving the searcher no persistent/offloaded split to choose. If no candidate
 * is eligible, all are considered.
 * Choice: least waste among eligible candidates, ties to the smaller size (smaller
 * n_buffer * S_chunk footprint).
 */
int pt_layout_chunk_size_choose(const pt_layout_param *p, int32_t n_params, int32_t n_blocks,
                                pt_chunk_size_choice *out, char *err, size_t errlen);

/* The candidate table as text, one line per size, the chosen one marked; for the plan
 * log. Returns the length that would have been written (snprintf-style). */
size_t pt_layout_chunk_size_table(const pt_chunk_size_choice *c, char *buf, size_t len);

#endif /* PT_CHUNK_LAYOUT_H */
