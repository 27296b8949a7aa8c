/*
 * chunk_layout.c — parameter -> chunk placement and chunk-size selection.
 * Rules and their reasons are in chunk_layout.h.
 *
 * Two phases:
 *  prep: validate, resolve tie groups to their root, give each root its effective
 *        block / trainable / execution key, and sort the roots into placement order
 *        (units by first use, params inside a block unit by first use).
 *  pack: walk that order for one S_chunk. Sizing runs prep once and pack per candidate.
 */
#include "chunk_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define UNOBSERVED INT64_MAX   /* exec key of a param never seen in the profile */

static uint64_t align_up(uint64_t x) {
    return (x + PT_LAYOUT_ALIGN - 1) & ~(uint64_t)(PT_LAYOUT_ALIGN - 1);
}

/* One placed param (a tie root) with its sort keys. */
typedef struct ent {
    int64_t ue;
    int32_t ui;   /* unit key: min (exec, index) over the unit */
    int64_t e;
    int32_t i;     /* own key: min (exec, index) over its tie group */
    int32_t root;             /* the param owning the storage */
    int32_t block;            /* effective block (-1 = non-block) */
    int32_t trainable;
} ent;

typedef struct prep {
    int32_t n;                /* n_params */
    int32_t n_blocks;
    int32_t *root;            /* [n] */
    ent *ents;                /* [n_ents] sorted in placement order */
    int32_t n_ents;
} prep;

static void prep_free(prep *pr) {
    free(pr->root);
    free(pr->ents);
    memset(pr, 0, sizeof *pr);
}

static int key_less(int64_t e1, int32_t i1, int64_t e2, int32_t i2) {
    return e1 < e2 || (e1 == e2 && i1 < i2);
}

static int ent_cmp(const void *a, const void *b) {
    const ent *x = a, *y = b;
    if (x->ue != y->ue) return x->ue < y->ue ? -1 : 1;
    if (x->ui != y->ui) return x->ui < y->ui ? -1 : 1;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static uint32_t dtype_size(int32_t dt) {
    switch (dt) {
    case PT_F32: return 4;
    case PT_BF16:
    case PT_F16: return 2;
    case PT_U8: return 1;
    default: return 0;
    }
}

static int prep_build(const pt_layout_param *p, int32_t n, int32_t n_blocks, prep *pr,
                      char *err, size_t errlen) {
    memset(pr, 0, sizeof *pr);
    if (n < 0 || n_blocks < 0 || (n > 0 && !p)) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "chunk layout: bad arguments (n_params %d, n_blocks %d, params %p)",
                       (int)n, (int)n_blocks, (const void *)p);
    }
    for (int32_t i = 0; i < n; i++) {
        uint32_t es = dtype_size(p[i].dtype);
        if (!es || p[i].elem_size != es) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "chunk layout: param %d has dtype %d with elem_size %u "
                           "(f32 needs 4, bf16/f16 need 2, u8 needs 1)",
                           (int)i, (int)p[i].dtype,
                           (unsigned)p[i].elem_size);
        }
        if (p[i].bytes == 0 || p[i].bytes % es) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "chunk layout: param %d has %llu bytes, not a positive "
                           "multiple of its element size %u",
                           (int)i,
                           (unsigned long long)p[i].bytes, (unsigned)es);
        }
        if (p[i].block < -1 || p[i].block >= n_blocks) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "chunk layout: param %d has block %d outside [-1, %d)",
                           (int)i, (int)p[i].block, (int)n_blocks);
        }
        if (p[i].tie < -1 || p[i].tie >= n || p[i].tie == i) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "chunk layout: param %d has tie %d (must be -1 or another "
                           "param in [0, %d))",
                           (int)i, (int)p[i].tie, (int)n);
        }
    }
    pr->n = n;
    pr->n_blocks = n_blocks;
    pr->root = malloc(sizeof *pr->root * (size_t)(n ? n : 1));
    int32_t *slot = malloc(sizeof *slot * (size_t)(n ? n : 1)); /* root -> ents index */
    pr->ents = malloc(sizeof *pr->ents * (size_t)(n ? n : 1));
    int64_t *bkey_e = malloc(sizeof *bkey_e * (size_t)(n_blocks ? n_blocks : 1));
    int32_t *bkey_i = malloc(sizeof *bkey_i * (size_t)(n_blocks ? n_blocks : 1));
    int rc = PT_OK;
    if (!pr->root || !slot || !pr->ents || !bkey_e || !bkey_i) {
        rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "chunk layout: out of host memory for %d params", (int)n);
        goto out;
    }
    /* Roots: follow tie chains, stopping at a param whose root is known (so a long
     * chain costs O(n) in total); more than n steps means a cycle. */
    for (int32_t i = 0; i < n; i++) pr->root[i] = -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t r = i, steps = 0;
        while (pr->root[r] < 0 && p[r].tie >= 0 && steps <= n) {
            r = p[r].tie;
            steps++;
        }
        if (steps > n) {
            rc = pt_fail(err, errlen, PT_ERR_INVALID_ARG, "chunk layout: param %d has a tie cycle", (int)i);
            goto out;
        }
        int32_t root = pr->root[r] >= 0 ? pr->root[r] : r;
        for (int32_t x = i; pr->root[x] < 0; x = p[x].tie) {
            pr->root[x] = root;
            if (x == r) break;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t r = pr->root[i];
        if (p[r].dtype != p[i].dtype || p[r].bytes != p[i].bytes) {
            rc = pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                         "chunk layout: param %d is tied to param %d but has dtype %d "
                         "and %llu bytes vs dtype %d and %llu bytes",
                         (int)i, (int)r,
                         (int)p[i].dtype, (unsigned long long)p[i].bytes, (int)p[r].dtype,
                         (unsigned long long)p[r].bytes);
            goto out;
        }
    }
    /* One entry per root, then fold in the group's members. */
    for (int32_t i = 0; i < n; i++) {
        slot[i] = -1;
        if (pr->root[i] != i) continue;
        ent *e = &pr->ents[pr->n_ents];
        e->i = i;
        e->root = i;
        e->e = p[i].exec_order >= 0 ? p[i].exec_order : UNOBSERVED;
        e->block = p[i].block;
        e->trainable = p[i].trainable != 0;
        slot[i] = pr->n_ents++;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t r = pr->root[i];
        if (r == i) continue;
        ent *e = &pr->ents[slot[r]];
        int64_t ex = p[i].exec_order >= 0 ? p[i].exec_order : UNOBSERVED;
        if (key_less(ex, i, e->e, e->i)) {
            e->e = ex;
            e->i = i;
        }
        if (p[i].block != p[r].block) e->block = -1;  /* shared across blocks: resident */
        e->trainable |= p[i].trainable != 0;
    }
    /* Unit keys: a block's key is the min over its roots; non-block roots are units. */
    for (int32_t b = 0; b < n_blocks; b++) {
        bkey_e[b] = UNOBSERVED;
        bkey_i[b] = INT32_MAX;
    }
    for (int32_t k = 0; k < pr->n_ents; k++) {
        ent *e = &pr->ents[k];
        if (e->block >= 0 && key_less(e->e, e->i, bkey_e[e->block], bkey_i[e->block])) {
            bkey_e[e->block] = e->e;
            bkey_i[e->block] = e->i;
        }
    }
    for (int32_t k = 0; k < pr->n_ents; k++) {
        ent *e = &pr->ents[k];
        if (e->block >= 0) {
            e->ue = bkey_e[e->block];
            e->ui = bkey_i[e->block];
        } else {
            e->ue = e->e;
            e->ui = e->i;
        }
    }
    qsort(pr->ents, (size_t)pr->n_ents, sizeof *pr->ents, ent_cmp);
out:
    free(slot);
    free(bkey_e);
    free(bkey_i);
    if (rc) prep_free(pr);
    return rc;
}

/* ---- pack: one pass over the sorted roots for a given S_chunk ---- */

typedef struct packer {
    const pt_layout_param *p;
    pt_layout *L;
    int32_t *rfirst;          /* [chunk] index of its first region in L->regions */
    uint64_t S;
    int32_t cur;              /* open chunk, -1 when sealed */
} packer;

static int32_t open_chunk(packer *k, uint64_t capacity, int oversize) {
    pt_layout *L = k->L;
    int32_t c = L->n_chunks++;
    pt_chunk *ch = &L->chunks[c];
    memset(ch, 0, sizeof *ch);
    ch->capacity = capacity;
    ch->first_param = L->n_placed;
    ch->block_first = ch->block_last = -1;
    ch->oversize = oversize;
    k->rfirst[c] = L->n_regions;
    return c;
}

static void place(packer *k, int32_t c, const ent *e) {
    pt_layout *L = k->L;
    pt_chunk *ch = &L->chunks[c];
    const pt_layout_param *q = &k->p[e->root];
    uint64_t off = ch->n_params ? align_up(ch->bytes_used) : 0;
    L->order[L->n_placed++] = e->root;
    ch->n_params++;
    L->param_chunk[e->root] = c;
    L->param_offset[e->root] = off;
    ch->bytes_used = off + q->bytes;
    if (e->trainable) ch->trainable_bytes += q->bytes;
    if (e->block < 0) {
        ch->mandatory_persistent = 1;
    } else {
        if (ch->block_first < 0 || e->block < ch->block_first) ch->block_first = e->block;
        if (e->block > ch->block_last) ch->block_last = e->block;
    }
    /* Extend the chunk's last region when dtype and trainability match, else start one. */
    pt_chunk_region *last = ch->n_regions ? &L->regions[L->n_regions - 1] : NULL;
    if (last && last->dtype == q->dtype && last->trainable == e->trainable) {
        last->bytes = off + q->bytes - last->offset;
    } else {
        pt_chunk_region *r = &L->regions[L->n_regions++];
        r->offset = off;
        r->bytes = q->bytes;
        r->dtype = q->dtype;
        r->trainable = e->trainable;
        ch->n_regions++;
    }
}

/* Place one root: oversize tensors get a sealed chunk of their own; others go into the
 * open chunk when they fit, else into a fresh S_chunk chunk. */
static void place_one(packer *k, const ent *e) {
    uint64_t b = k->p[e->root].bytes;
    if (b > k->S) {
        int32_t c = open_chunk(k, b, 1);
        place(k, c, e);
        k->cur = -1;
        return;
    }
    if (k->cur < 0 || align_up(k->L->chunks[k->cur].bytes_used) + b > k->S)
        k->cur = open_chunk(k, k->S, 0);
    place(k, k->cur, e);
}

/* Does the unit ents[a..z) fit, as a whole, behind what the open chunk holds? */
static int unit_fits(const packer *k, const ent *ents, int32_t a, int32_t z) {
    if (k->cur < 0) return 0;
    const pt_chunk *ch = &k->L->chunks[k->cur];
    int is_block = ents[a].block >= 0;
    /* Non-block params never share a chunk with block params (see chunk_layout.h). */
    if (is_block ? ch->mandatory_persistent : ch->block_first >= 0) return 0;
    uint64_t off = ch->bytes_used;
    for (int32_t j = a; j < z; j++) {
        uint64_t b = k->p[ents[j].root].bytes;
        if (b > k->S) return 0;
        off = align_up(off) + b;
        if (off > k->S) return 0;
    }
    return 1;
}

static int pack(const pt_layout_param *p, const prep *pr, uint64_t S, pt_layout *L, char *err,
                size_t errlen) {
    memset(L, 0, sizeof *L);
    size_t ne = (size_t)(pr->n_ents ? pr->n_ents : 1);
    size_t np = (size_t)(pr->n ? pr->n : 1);
    size_t nb = (size_t)(pr->n_blocks ? pr->n_blocks : 1);
    packer k = {.p = p, .L = L, .S = S, .cur = -1};
    L->chunk_size = S;
    L->n_params = pr->n;
    L->n_blocks = pr->n_blocks;
    /* Every root opens at most one chunk, and every region holds at least one root. */
    L->chunks = malloc(sizeof *L->chunks * ne);
    L->regions = malloc(sizeof *L->regions * ne);
    L->order = malloc(sizeof *L->order * ne);
    L->param_chunk = malloc(sizeof *L->param_chunk * np);
    L->param_offset = malloc(sizeof *L->param_offset * np);
    L->param_root = malloc(sizeof *L->param_root * np);
    L->block_chunk_first = malloc(sizeof *L->block_chunk_first * nb);
    L->block_chunk_last = malloc(sizeof *L->block_chunk_last * nb);
    k.rfirst = malloc(sizeof *k.rfirst * ne);
    if (!L->chunks || !L->regions || !L->order || !L->param_chunk || !L->param_offset ||
        !L->param_root || !L->block_chunk_first || !L->block_chunk_last || !k.rfirst) {
        free(k.rfirst);
        pt_layout_free(L);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "chunk layout: out of host memory for %d params", (int)pr->n);
    }
    for (int32_t a = 0; a < pr->n_ents;) {
        int32_t z = a + 1;
        while (z < pr->n_ents && pr->ents[z].ue == pr->ents[a].ue &&
               pr->ents[z].ui == pr->ents[a].ui)
            z++;
        if (!unit_fits(&k, pr->ents, a, z)) k.cur = -1;   /* seal before the unit */
        for (int32_t j = a; j < z; j++) place_one(&k, &pr->ents[j]);
        a = z;
    }
    for (int32_t c = 0; c < L->n_chunks; c++) {
        pt_chunk *ch = &L->chunks[c];
        ch->regions = &L->regions[k.rfirst[c]];
        L->n_mandatory += ch->mandatory_persistent;
        L->n_oversize += ch->oversize;
        L->total_used += ch->bytes_used;
        L->total_capacity += ch->capacity;
    }
    free(k.rfirst);
    for (int32_t i = 0; i < pr->n; i++) {
        int32_t r = pr->root[i];
        L->param_root[i] = r;
        L->param_chunk[i] = L->param_chunk[r];
        L->param_offset[i] = L->param_offset[r];
    }
    for (int32_t b = 0; b < pr->n_blocks; b++) L->block_chunk_first[b] = L->block_chunk_last[b] = -1;
    for (int32_t j = 0; j < pr->n_ents; j++) {
        const ent *e = &pr->ents[j];
        if (e->block < 0) continue;
        int32_t c = L->param_chunk[e->root];
        if (L->block_chunk_first[e->block] < 0 || c < L->block_chunk_first[e->block])
            L->block_chunk_first[e->block] = c;
        if (c > L->block_chunk_last[e->block]) L->block_chunk_last[e->block] = c;
    }
    return PT_OK;
}

int pt_layout_build(const pt_layout_param *p, int32_t n_params, int32_t n_blocks,
                    uint64_t chunk_size, pt_layout *out, char *err, size_t errlen) {
    if (!out) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "chunk layout: NULL output layout");
    }
    memset(out, 0, sizeof *out);
    if (chunk_size == 0 || chunk_size % PT_LAYOUT_ALIGN) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "chunk layout: chunk size %llu bytes is not a positive multiple "
                       "of the %u-byte parameter alignment",
                       (unsigned long long)chunk_size,
                       (unsigned)PT_LAYOUT_ALIGN);
    }
    prep pr;
    int rc = prep_build(p, n_params, n_blocks, &pr, err, errlen);
    if (rc) return rc;
    rc = pack(p, &pr, chunk_size, out, err, errlen);
    prep_free(&pr);
    return rc;
}

void pt_layout_free(pt_layout *l) {
    if (!l) return;
    free(l->chunks);
    free(l->regions);
    free(l->order);
    free(l->param_chunk);
    free(l->param_offset);
    free(l->param_root);
    free(l->block_chunk_first);
    free(l->block_chunk_last);
    memset(l, 0, sizeof *l);
}

uint64_t pt_layout_waste(const pt_layout *l) {
    uint64_t w = 0;
    for (int32_t c = 0; c + 1 < l->n_chunks; c++)
        if (!l->chunks[c].oversize) w += l->chunks[c].capacity - l->chunks[c].bytes_used;
    return w;
}

/*
 * The execution order the hook contract fixes, as first-use ranks: forward runs
 * block 0, 1, ..., n-1 (hooks out of that order are refused), so a block's params
 * are first used in block-index order whatever order the host declared them in.
 * Non-block params cannot be observed (the host uses them between any hooks) and
 * keep their declaration index. The blocks are given the declaration keys the
 * blocks had, sorted, in block-index order: block b gets D[b'] where D is the
 * ascending list of each block's first declaration index and b' is b's rank among
 * blocks that own params. Non-block params therefore keep their place between the
 * block units, and a host that declares blocks in order gets exactly the
 * declaration-order layout. Example: blocks declared 0,2,1,3 with first indices
 * 1,3,5,7 get keys 1,3,5,7 for blocks 0,1,2,3 (declaration order would give block
 * 2 the key 3 and pack it before block 1, so a forward would switch chunks
 * 0 -> 2 -> 1 -> 3 and gather a chunk twice).
 */
static int contract_order(const pt_model_v1 *m, int32_t *ord, char *err, size_t errlen) {
    int32_t n = m->n_params, nb = m->n_blocks > 0 ? m->n_blocks : 0;
    int32_t *first = malloc(((size_t)nb + 1) * sizeof *first);
    int32_t *sorted = malloc(((size_t)nb + 1) * sizeof *sorted);
    if (!first || !sorted) {
        free(first);
        free(sorted);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    for (int32_t b = 0; b < nb; b++) first[b] = -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t b = m->params[i].block;
        if (b >= 0 && b < nb && first[b] < 0) first[b] = i;
    }
    int32_t k = 0;
    for (int32_t b = 0; b < nb; b++)
        if (first[b] >= 0) sorted[k++] = first[b];
    /* insertion sort: the first indices are distinct and usually already sorted */
    for (int32_t a = 1; a < k; a++) {
        int32_t v = sorted[a], j = a - 1;
        for (; j >= 0 && sorted[j] > v; j--) sorted[j + 1] = sorted[j];
        sorted[j + 1] = v;
    }
    /* first[b] becomes block b's key: the rank-th smallest first index */
    for (int32_t b = 0, r = 0; b < nb; b++)
        if (first[b] >= 0) first[b] = sorted[r++];
    for (int32_t i = 0; i < n; i++) {
        int32_t b = m->params[i].block;
        ord[i] = (b >= 0 && b < nb) ? first[b] : i;
    }
    free(first);
    free(sorted);
    return PT_OK;
}

int pt_layout_params_from_model(const pt_model_v1 *m, const int32_t *exec_order,
                                pt_layout_param *p, char *err, size_t errlen) {
    if (!m || !p || m->n_params < 0 || (m->n_params > 0 && !m->params)) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "chunk layout: NULL or empty model descriptor");
    }
    int32_t *own = NULL;
    if (!exec_order && m->n_params > 0) {
        if (!(own = malloc((size_t)m->n_params * sizeof *own)))
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
        int rc = contract_order(m, own, err, errlen);
        if (rc) {
            free(own);
            return rc;
        }
        exec_order = own;
    }
    for (int32_t i = 0; i < m->n_params; i++) {
        const pt_param_v1 *q = &m->params[i];
        const char *nm = q->name ? q->name : "?";
        uint32_t es = dtype_size(q->dtype);
        if (!es) {
            free(own);
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "param %d (%s): unknown dtype %d", (int)i, nm, (int)q->dtype);
        }
        if (q->ndim < 1 || q->ndim > 4) {
            free(own);
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "param %d (%s): ndim %d outside 1..4", (int)i, nm, (int)q->ndim);
        }
        uint64_t numel = 1;
        for (int32_t d = 0; d < q->ndim; d++) {
            if (q->shape[d] <= 0 || (uint64_t)q->shape[d] > (UINT64_MAX / 8) / numel) {
                free(own);
                return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                               "param %d (%s): shape[%d] = %lld is not positive or "
                               "the size overflows",
                               (int)i, nm, (int)d, (long long)q->shape[d]);
            }
            numel *= (uint64_t)q->shape[d];
        }
        p[i].bytes = numel * es;
        p[i].elem_size = es;
        p[i].dtype = q->dtype;
        p[i].block = q->block;
        p[i].tie = q->tie;
        p[i].trainable = q->trainable != 0;
        p[i].exec_order = exec_order[i];
    }
    free(own);
    return PT_OK;
}

/* ---- chunk size selection ---- */

static uint64_t pow2ceil(uint64_t x) {
    uint64_t r = 1;
    while (r < x && r < (UINT64_C(1) << 62)) r <<= 1;
    return r;
}

static uint64_t pow2floor(uint64_t x) {
    if (!x) return 0;
    uint64_t r = 1;
    while (r <= x / 2) r <<= 1;
    return r;
}

int pt_layout_chunk_size_choose(const pt_layout_param *p, int32_t n_params, int32_t n_blocks,
                                pt_chunk_size_choice *out, char *err, size_t errlen) {
    if (!out) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "chunk size: NULL output");
    }
    memset(out, 0, sizeof *out);
    prep pr;
    int rc = prep_build(p, n_params, n_blocks, &pr, err, errlen);
    if (rc) return rc;
    /* Model extents from the placed roots (padding counted as it would be placed). */
    uint64_t total = 0, tmax = 0, bmax = 0;
    uint64_t *bsum = calloc((size_t)(n_blocks ? n_blocks : 1), sizeof *bsum);
    if (!bsum) {
        prep_free(&pr);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "chunk size: out of host memory");
    }
    for (int32_t j = 0; j < pr.n_ents; j++) {
        const ent *e = &pr.ents[j];
        uint64_t b = p[e->root].bytes;
        total += align_up(b);
        if (e->block >= 0) {
            bsum[e->block] += align_up(b);
            if (b > tmax) tmax = b;
        }
    }
    int32_t nb_used = 0;
    for (int32_t b = 0; b < n_blocks; b++) {
        if (bsum[b] > bmax) bmax = bsum[b];
        nb_used += bsum[b] > 0;
    }
    free(bsum);
    uint64_t lo = 4096;
    if (tmax && pow2ceil(tmax) > lo) lo = pow2ceil(tmax);
    if (pow2floor(bmax / 8) > lo) lo = pow2floor(bmax / 8);
    if (pow2floor(total / 4096) > lo) lo = pow2floor(total / 4096);
    uint64_t hi = 4 * lo;
    if (bmax && 2 * pow2ceil(bmax) > hi) hi = 2 * pow2ceil(bmax);
    uint64_t cap = pow2ceil(total) > lo ? pow2ceil(total) : lo;
    if (hi > cap) hi = cap;
    out->lo = lo;
    out->hi = hi;
    out->min_chunks = nb_used < 8 ? nb_used : 8;
    if (out->min_chunks < 1) out->min_chunks = 1;
    int any_eligible = 0;
    for (uint64_t s = lo; s <= hi && out->n_cand < PT_CHUNK_MAX_CANDIDATES; s <<= 1) {
        pt_layout L;
        rc = pack(p, &pr, s, &L, err, errlen);
        if (rc) break;
        pt_chunk_candidate *c = &out->cand[out->n_cand++];
        c->size = s;
        c->waste = pt_layout_waste(&L);
        c->n_chunks = L.n_chunks;
        c->n_oversize = L.n_oversize;
        c->eligible = L.n_chunks >= out->min_chunks;
        any_eligible |= c->eligible;
        pt_layout_free(&L);
    }
    prep_free(&pr);
    if (rc) return rc;
    /* argmin waste, ties to the smaller size (candidates are in increasing size). */
    out->chosen_index = -1;
    for (int32_t i = 0; i < out->n_cand; i++) {
        const pt_chunk_candidate *c = &out->cand[i];
        if (any_eligible && !c->eligible) continue;
        if (out->chosen_index < 0 || c->waste < out->cand[out->chosen_index].waste)
            out->chosen_index = i;
    }
    out->chosen = out->cand[out->chosen_index].size;
    return PT_OK;
}

static void fmt_bytes(uint64_t b, char *buf, size_t len) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = (double)b;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)b);
    else if (v == (double)(uint64_t)v) snprintf(buf, len, "%llu %s", (unsigned long long)v, unit[u]);
    else snprintf(buf, len, "%.1f %s", v, unit[u]);
}

size_t pt_layout_chunk_size_table(const pt_chunk_size_choice *c, char *buf, size_t len) {
    size_t n = 0;
    char s[32], w[32];
#define PUT(...) \
    do { \
        int k_ = snprintf(buf && n < len ? buf + n : NULL, buf && n < len ? len - n : 0, \
                          __VA_ARGS__); \
        if (k_ > 0) n += (size_t)k_; \
    } while (0)
    PUT("chunk size candidates (least non-tail waste among those with >= %d chunks; "
        "ties to the smaller):\n",
        (int)c->min_chunks);
    PUT("     S_chunk   chunks oversize  waste\n");
    for (int32_t i = 0; i < c->n_cand; i++) {
        const pt_chunk_candidate *k = &c->cand[i];
        fmt_bytes(k->size, s, sizeof s);
        fmt_bytes(k->waste, w, sizeof w);
        PUT("  %c %-10s %6d %8d  %s%s\n", i == c->chosen_index ? '*' : ' ', s,
            (int)k->n_chunks, (int)k->n_oversize, w, k->eligible ? "" : "  (too few chunks)");
    }
#undef PUT
    return n;
}
