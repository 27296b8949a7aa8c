/*
 * extents.h — the two data structures behind the device wrapper's memory:
 * an extent allocator that sub-allocates one reserved range (the device
 * reservation, the pinned arena), and a pointer -> value hash map that finds
 * live blocks by address. Neither locks: the wrapper holds its mutex around
 * every call.
 *
 * Extent allocator: blocks (free and live) form an address-ordered doubly
 * linked list covering [0, size) of the range; free blocks also sit in one of
 * 64 size bins, bin = floor(log2(size / PT_GPU_ALIGN)). A request takes the best
 * fit (smallest block >= size, lowest offset on ties) from the first bin that has
 * a fitting block: every block in a higher bin fits, so at most the blocks of
 * two bins are scanned. Remainders of at least PT_GPU_ALIGN bytes are split off;
 * freed blocks coalesce with free neighbours. Headers live in host memory
 * (device memory is not addressable on cuda).
 */
#ifndef PT_EXTENTS_H
#define PT_EXTENTS_H

#include <stddef.h>
#include <stdint.h>

#define PT_EXT_NBINS 64

typedef struct pt_blk {
    uint64_t off, size;            /* extent in the range; size % PT_GPU_ALIGN == 0 */
    uint64_t req;                  /* bytes the caller asked for (live blocks) */
    int tag;
    int host;                      /* live blocks: 1 when the host's (dev_alloc), 0 the plugin's */
    int state;                     /* 0 free, 1 live, 2 being poisoned (not free, not findable) */
    int ovf;                       /* live blocks: 1 when in the measuring overflow range */
    struct pt_blk *prev, *next;    /* address order */
    struct pt_blk *fprev, *fnext;  /* bin list (free blocks only) */
} pt_blk;

typedef struct pt_extents {
    pt_blk *first;                 /* lowest address; NULL when not initialised */
    pt_blk *bins[PT_EXT_NBINS];
} pt_extents;

/* One free block covering [0, size). 0, or -1 without host memory. */
int pt_ext_init(pt_extents *e, uint64_t size);
/* Frees every header (live blocks included); e is empty afterwards. */
void pt_ext_destroy(pt_extents *e);
/* Best-fit block of exactly `size` bytes (a multiple of PT_GPU_ALIGN), marked
 * live; NULL when no free block is large enough. */
pt_blk *pt_ext_carve(pt_extents *e, uint64_t size);
/* Gives a live (or being-poisoned) block back, coalescing with free neighbours. */
void pt_ext_release(pt_extents *e, pt_blk *x);
uint64_t pt_ext_largest_free(const pt_extents *e);
/* End offset of the highest block that is not free (0 when none): the range
 * [0, end) is what the live blocks need, holes included. */
uint64_t pt_ext_high_water(const pt_extents *e);
size_t pt_ext_free_count(const pt_extents *e);
/* 1 when no block is live (everything coalesced back into one free block). */
int pt_ext_all_free(const pt_extents *e);

/* Open addressing, linear probing, backward-shift deletion; key 0 = empty. */
typedef struct pt_ptrmap {
    uintptr_t *keys;
    uint64_t *vals;
    size_t cap, n;                 /* cap a power of two, n <= cap / 2 */
} pt_ptrmap;

int pt_ptrmap_put(pt_ptrmap *m, uintptr_t k, uint64_t v);   /* 0, or -1 without host memory */
int pt_ptrmap_get(const pt_ptrmap *m, uintptr_t k, uint64_t *v); /* 1 and *v when found */
void pt_ptrmap_del(pt_ptrmap *m, uintptr_t k);
void pt_ptrmap_free(pt_ptrmap *m);

#endif /* PT_EXTENTS_H */
