/*
 * ptrmap.c — the pointer map of extents.h: an open-addressing hash map from a
 * pointer to a 64-bit value (linear probing, Fibonacci hashing, capacity a
 * power of two kept at least twice the count, deletion by backward shift so no
 * tombstones build up).
 */
#include <stdlib.h>
#include <string.h>

#include "extents.h"

static size_t slot_of(const pt_ptrmap *m, uintptr_t k) {
    uint64_t h = (uint64_t)k * 0x9E3779B97F4A7C15ull; /* Fibonacci hashing */
    return (size_t)(h >> 32) & (m->cap - 1);
}

static int grow(pt_ptrmap *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uintptr_t *nk = calloc(ncap, sizeof *nk);
    uint64_t *nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return -1;
    }
    pt_ptrmap o = *m;
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
    for (size_t i = 0; i < o.cap; i++) {
        if (!o.keys[i]) continue;
        size_t j = slot_of(m, o.keys[i]);
        while (m->keys[j]) j = (j + 1) & (ncap - 1);
        m->keys[j] = o.keys[i];
        m->vals[j] = o.vals[i];
    }
    free(o.keys);
    free(o.vals);
    return 0;
}

int pt_ptrmap_put(pt_ptrmap *m, uintptr_t k, uint64_t v) {
    if ((m->n + 1) * 2 > m->cap && grow(m) != 0) return -1;
    size_t j = slot_of(m, k);
    while (m->keys[j] && m->keys[j] != k) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) m->n++;
    m->keys[j] = k;
    m->vals[j] = v;
    return 0;
}

/* Returns 1 and *v when found. */
int pt_ptrmap_get(const pt_ptrmap *m, uintptr_t k, uint64_t *v) {
    if (!m->cap || !k) return 0;
    for (size_t j = slot_of(m, k); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        if (m->keys[j] == k) {
            if (v) *v = m->vals[j];
            return 1;
        }
    }
    return 0;
}

void pt_ptrmap_del(pt_ptrmap *m, uintptr_t k) {
    if (!m->cap || !k) return;
    size_t mask = m->cap - 1, j = slot_of(m, k);
    while (m->keys[j] && m->keys[j] != k) j = (j + 1) & mask;
    if (!m->keys[j]) return;
    m->keys[j] = 0;
    m->n--;
    /* backward shift: move later members of the probe run into the hole when
     * their home slot does not lie cyclically in (hole, their slot]. */
    for (size_t i = (j + 1) & mask; m->keys[i]; i = (i + 1) & mask) {
        size_t home = slot_of(m, m->keys[i]);
        int stays = (j <= i) ? (home > j && home <= i) : (home > j || home <= i);
        if (stays) continue;
        m->keys[j] = m->keys[i];
        m->vals[j] = m->vals[i];
        m->keys[i] = 0;
        j = i;
    }
}

void pt_ptrmap_free(pt_ptrmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}
