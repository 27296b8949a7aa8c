/*
 * extents.c — the extent allocator of extents.h (its pointer map: ptrmap.c).
 */
#include "extents.h"

#include <stdlib.h>
#include <string.h>

#include "device_ext.h"

/* ---- extent allocator ---- */

static int bin_of(uint64_t size) {
    uint64_t units = size / PT_GPU_ALIGN; /* >= 1 */
    int b = 63 - __builtin_clzll(units);
    return b < PT_EXT_NBINS ? b : PT_EXT_NBINS - 1;
}

static void bin_insert(pt_extents *g, pt_blk *x) {
    int b = bin_of(x->size);
    x->fprev = NULL;
    x->fnext = g->bins[b];
    if (g->bins[b]) g->bins[b]->fprev = x;
    g->bins[b] = x;
}

static void bin_remove(pt_extents *g, pt_blk *x) {
    if (x->fprev) x->fprev->fnext = x->fnext;
    else g->bins[bin_of(x->size)] = x->fnext;
    if (x->fnext) x->fnext->fprev = x->fprev;
    x->fprev = x->fnext = NULL;
}

static pt_blk *find_fit(pt_extents *g, uint64_t size) {
    for (int b = bin_of(size); b < PT_EXT_NBINS; b++) {
        pt_blk *best = NULL;
        for (pt_blk *x = g->bins[b]; x; x = x->fnext)
            if (x->size >= size &&
                (!best || x->size < best->size || (x->size == best->size && x->off < best->off)))
                best = x;
        if (best) return best;
    }
    return NULL;
}

pt_blk *pt_ext_carve(pt_extents *g, uint64_t size) {
    pt_blk *x = find_fit(g, size);
    if (!x) return NULL;
    bin_remove(g, x);
    if (x->size - size >= PT_GPU_ALIGN) {
        pt_blk *r = calloc(1, sizeof *r);
        if (r) { /* without a header for the tail the whole block is handed out */
            r->off = x->off + size;
            r->size = x->size - size;
            r->prev = x;
            r->next = x->next;
            if (x->next) x->next->prev = r;
            x->next = r;
            x->size = size;
            bin_insert(g, r);
        }
    }
    x->state = 1;
    return x;
}

/* Merge b into a (a directly precedes b); b's header goes. */
static void absorb(pt_blk *a, pt_blk *b) {
    a->size += b->size;
    a->next = b->next;
    if (b->next) b->next->prev = a;
    free(b);
}

void pt_ext_release(pt_extents *g, pt_blk *x) {
    x->state = 0;
    x->req = 0;
    if (x->next && x->next->state == 0) {
        bin_remove(g, x->next);
        absorb(x, x->next);
    }
    if (x->prev && x->prev->state == 0) {
        pt_blk *p = x->prev;
        bin_remove(g, p);
        absorb(p, x);
        x = p;
    }
    bin_insert(g, x);
}

uint64_t pt_ext_largest_free(const pt_extents *g) {
    for (int b = PT_EXT_NBINS - 1; b >= 0; b--) {
        if (!g->bins[b]) continue;
        uint64_t m = 0;
        for (const pt_blk *x = g->bins[b]; x; x = x->fnext)
            if (x->size > m) m = x->size;
        return m;
    }
    return 0;
}

uint64_t pt_ext_high_water(const pt_extents *g) {
    const pt_blk *x = g->first;
    if (!x) return 0;
    while (x->next) x = x->next;
    while (x && x->state == 0) x = x->prev;
    return x ? x->off + x->size : 0;
}

size_t pt_ext_free_count(const pt_extents *g) {
    size_t n = 0;
    for (int b = 0; b < PT_EXT_NBINS; b++)
        for (const pt_blk *x = g->bins[b]; x; x = x->fnext) n++;
    return n;
}

int pt_ext_all_free(const pt_extents *e) {
    return !e->first || (e->first->state == 0 && !e->first->next);
}

int pt_ext_init(pt_extents *e, uint64_t size) {
    memset(e, 0, sizeof *e);
    pt_blk *all = calloc(1, sizeof *all);
    if (!all) return -1;
    all->size = size;
    e->first = all;
    bin_insert(e, all);
    return 0;
}

void pt_ext_destroy(pt_extents *e) {
    for (pt_blk *x = e->first, *n; x; x = n) {
        n = x->next;
        free(x);
    }
    memset(e, 0, sizeof *e);
}
