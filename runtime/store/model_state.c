/*
 * model_state.c — the chunked model-state store: validation of the host's
 * descriptors, chunk layout, the knobs (n_persist, n_buffer), storage for
 * persistent and offloaded chunks, the initial upload, the plan summary.
 * Runtime movement (gather/release/offload/optimizer) is in chunk_runtime.c.
 * Everything resident (mode A) is the special case n_persist = N_chunk.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "device_ext.h"
#include "kernels_hd.h"
#include "store_internal.h"


uint64_t pt_store_param_numel(const pt_param_v1 *p) {
    uint64_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (uint64_t)p->shape[d];
    return n;
}

int pt_store_validate(const pt_model_v1 *m, char *err, size_t errlen) {
    for (int i = 0; i < m->n_params; i++) {
        const pt_param_v1 *p = &m->params[i];
        const char *nm = p->name ? p->name : "(unnamed)";
        if (p->ndim < 1 || p->ndim > 4) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' has ndim %d (need 1..4)", i, nm, p->ndim);
        }
        for (int d = 0; d < p->ndim; d++)
            if (p->shape[d] <= 0) {
                return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' has shape[%d] = %lld (need > 0)", i, nm, d,
                               (long long)p->shape[d]);
            }
        if (p->dtype < PT_F32 || p->dtype > PT_U8) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' has unknown dtype %d (0 f32, 1 bf16, 2 f16, 3 u8)", i,
                           nm, p->dtype);
        }
        if (p->dtype == PT_U8 && p->trainable) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' is u8 (opaque bytes) and trainable; byte "
                                                            "parameters have no gradient or optimizer, so they must be frozen (trainable = 0)",
                           i, nm);
        }
        if (p->block < -1 || p->block >= m->n_blocks) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' names block %d but the model has %d blocks", i,
                           nm, p->block, m->n_blocks);
        }
        if (p->tp_split < 0 || p->tp_split > 2 || (p->tp_split == 2 && p->ndim < 2) ||
            (p->tp_split && p->tie >= 0)) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' has tp_split %d with ndim %d and tie %d (0 = "
                                                            "not split, 1 = rows, 2 = columns of a tensor of at least 2 dims; a tied param "
                                                            "takes its split from the one it is tied to)",
                           i, nm, p->tp_split, p->ndim,
                           p->tie);
        }
        if (p->tie >= 0) {
            if (p->tie >= m->n_params || p->tie == i || m->params[p->tie].tie >= 0) {
                return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' is tied to %d, which is not a valid untied "
                                                                "param",
                               i, nm, p->tie);
            }
            const pt_param_v1 *t = &m->params[p->tie];
            if (pt_store_param_numel(t) != pt_store_param_numel(p) || t->dtype != p->dtype) {
                return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' is tied to '%s' but their sizes or dtypes "
                                                                "differ",
                               i, nm, t->name ? t->name : "(unnamed)");
            }
        } else if (!p->init) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' has no initial values (init is NULL)", i, nm);
        }
    }
    return PT_OK;
}

/* Lookahead minimum of the pool: the streamed chunks of two consecutive blocks
 * (the running block and the one being prefetched), at least 1 when anything
 * streams. Fewer slots than one block's streamed chunks cannot run at all. */
static int min_buffers(const pt_store *ms, int n_blocks, int lookahead) {
    int need = 0;
    for (int b = 0; b < n_blocks; b++) {
        int k = 0;
        int hi = (lookahead && b + 1 < n_blocks) ? b + 1 : b;
        int c0 = ms->lay.block_chunk_first[b], c1 = ms->lay.block_chunk_last[hi];
        if (c0 < 0) continue;
        if (c1 < c0) c1 = ms->lay.block_chunk_last[b];
        for (int c = c0; c <= c1; c++) k += !ms->ch[c].persistent;
        if (k > need) need = k;
    }
    return need;
}

/* With [nvme] path and a set pinned_budget: an automatic chunk size whose
 * disk-tier staging fits the budget, in case the offloaded chunks need the
 * tier's level 2. A slot holds the largest record plus a block: at level 2 a
 * chunk of S bytes has record 5S when fp32 (params S, gradient S, m, v and
 * the gradient sum S each) and 10S when 16-bit (E = S/2 elements: 2S, plus
 * m, v, masters, gradient sum 4E each); profiling then times copies through
 * max(2S, 64 KiB) more. The least waste among the sizes that fit, else the
 * smallest (the budget check then refuses with the bytes). */
static void tier_chunk_size(pt_store *st, const pt_layout_param *lp, pt_chunk_size_choice *ch) {
    const pt_config *cfg = st->env.cfg;
    if (!cfg->nvme_path[0] || !cfg->pinned_budget || !ch->n_cand) return;
    uint64_t ratio = 5;
    for (int i = 0; i < st->env.model->n_params; i++)
        if (lp[i].trainable && lp[i].dtype != PT_F32) ratio = 10;
    int best = -1;
    for (int i = 0; i < ch->n_cand; i++) {
        const pt_chunk_candidate *c = &ch->cand[i];
        uint64_t prof = pt_ms_profile_pinned(c->size);
        uint64_t slots = cfg->nvme_slots > 0 ? (uint64_t)cfg->nvme_slots : 3;   /* auto: at least 3 */
        uint64_t need = slots * (ratio * c->size + 2 * cfg->nvme_block) + prof;
        if (need > cfg->pinned_budget) continue;
        if (best < 0) best = i;
        const pt_chunk_candidate *b = &ch->cand[best];
        if (c->eligible > b->eligible || (c->eligible == b->eligible && c->waste < b->waste))
            best = i;
    }
    if (best < 0) best = 0;   /* the grid ascends: the smallest */
    if (ch->cand[best].size >= ch->chosen) return;
    PT_LOGI(st->env.lg, "chunk size %llu bytes instead of %llu: the disk tier's staging slots "
                        "must fit [memory] pinned_budget",
            (unsigned long long)ch->cand[best].size, (unsigned long long)ch->chosen);
    ch->chosen = ch->cand[best].size;
    ch->chosen_index = best;
}

static int choose_layout(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    pt_model_v1 *m = st->env.model;
    pt_layout_param *lp = calloc((size_t)m->n_params, sizeof *lp);
    if (!lp) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    int rc = pt_layout_params_from_model(m, NULL, lp, err, errlen);
    uint64_t S = st->env.cfg->chunk_size;
    pt_chunk_size_choice choice;
    if (!rc && !S) {
        rc = pt_layout_chunk_size_choose(lp, m->n_params, m->n_blocks, &choice, err, errlen);
        if (!rc) tier_chunk_size(st, lp, &choice);
        if (!rc) {
            S = choice.chosen;
            char tab[4096];
            pt_layout_chunk_size_table(&choice, tab, sizeof tab);
            PT_LOGD(st->env.lg, "chunk size candidates:");
            pt_log_text(st->env.lg, PT_LOG_DEBUG, tab);
        }
    } else if (!rc) {
        uint64_t asked = S;
        S = (S + PT_LAYOUT_ALIGN - 1) / PT_LAYOUT_ALIGN * PT_LAYOUT_ALIGN;
        if (S != asked) {
            PT_LOGW(st->env.lg, "[protrain] chunk_size = %llu bytes is not a multiple of the "
                                "%u-byte parameter alignment: chunks of %llu bytes are used",
                    (unsigned long long)asked, (unsigned)PT_LAYOUT_ALIGN, (unsigned long long)S);
        }
    }
    if (!rc) rc = pt_layout_build(lp, m->n_params, m->n_blocks, S, &ms->lay, err, errlen);
    free(lp);
    return rc;
}

static int alloc_persistent(pt_store *st, cs_chunk *c, char *err, size_t errlen) {
    const pt_gpu_backend *ops = pt_gpu_ops(st->env.gpu);
    void *impl = pt_gpu_impl(st->env.gpu);
    /* a resident chunk never enters a pool slot: it needs its used bytes, not S */
    int rc = pt_gpu_alloc(st->env.gpu, c->used, PT_TAG_PARAM, &c->d_param, err, errlen);
    if (rc) return rc;
    if (ops->memset_async(impl, c->d_param, 0, c->used, NULL))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "zeroing chunk %d's device parameters failed: memset failed", c->id);
    if (c->trainable) {
        if ((rc = pt_gpu_alloc(st->env.gpu, c->used, PT_TAG_GRAD, &c->d_grad, err, errlen))) return rc;
        if (ops->memset_async(impl, c->d_grad, 0, c->used, NULL))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "zeroing chunk %d's device gradient failed: memset failed", c->id);
    }
    st->persist_bytes += c->used * (c->trainable ? 2 : 1);
    return PT_OK;
}

static int alloc_offloaded(pt_store *st, cs_chunk *c, char *err, size_t errlen) {
    int rc;
    /* sharded: this rank's parts only, the staged gradient in fp32 */
    size_t eb = (size_t)c->n_state * sizeof(float);
    size_t pb = c->sh ? (size_t)c->sh->p_bytes : (size_t)c->used, gb = c->sh ? eb : pb;
    if (c->tiered == 2) return PT_OK;   /* all of it on disk (tier/tier.h) */
    if ((rc = pt_gpu_pinned_alloc(st->env.gpu, pb, &c->h_param, err, errlen))) return rc;
    memset(c->h_param, 0, pb);
    if (!c->trainable) return PT_OK;
    if ((rc = pt_gpu_pinned_alloc(st->env.gpu, gb, &c->h_gstage, err, errlen))) return rc;
    /* a part's padding elements are never copied in: they must read as zero */
    if (c->sh) memset(c->h_gstage, 0, gb);
    if (c->tiered) return PT_OK;   /* states on disk (tier/tier.h) */
    if ((rc = pt_gpu_pinned_alloc(st->env.gpu, eb, (void **)&c->h_m, err, errlen)) ||
        (rc = pt_gpu_pinned_alloc(st->env.gpu, eb, (void **)&c->h_v, err, errlen)))
        return rc;
    memset(c->h_m, 0, eb);
    memset(c->h_v, 0, eb);
    if (c->has16) {
        if ((rc = pt_gpu_pinned_alloc(st->env.gpu, eb, (void **)&c->h_master, err, errlen))) return rc;
        memset(c->h_master, 0, eb);
    }
    return PT_OK;
}

/* Copy the host's initial values into the chunks (tied members share the root). */
static int upload_initial(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    pt_model_v1 *m = st->env.model;
    for (int i = 0; i < m->n_params; i++) {
        if (ms->root[i] != i) continue;
        const pt_param_v1 *p = &m->params[i];
        cs_chunk *c = &ms->ch[ms->lay.param_chunk[i]];
        uint64_t off = ms->lay.param_offset[i];
        size_t bytes = (size_t)(pt_store_param_numel(p) * pt_dtype_size(p->dtype));
        if (c->sh || c->tiered == 2) continue;   /* below, chunk by chunk */
        if (c->persistent) {
            char e[256];
            if (pt_gpu_memcpy_sync(st->env.gpu, (char *)c->d_param + off, p->init, bytes,
                                   PT_GPU_H2D, e, sizeof e)) {
                return pt_fail(err, errlen, PT_ERR_BACKEND, "post_model_load: upload of param '%s' failed: %s", p->name, e);
            }
        } else {
            memcpy((char *)c->h_param + off, p->init, bytes);
        }
    }
    for (int k = 0; k < ms->n_chunks; k++)
        if (ms->ch[k].sh && ms->ch[k].tiered != 2) pt_sh_init_values(st, &ms->ch[k]);
    /* whole images on the disk tier: each chunk's record written once */
    for (int k = 0; k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        if (c->tiered != 2) continue;
        int rc = pt_tier_chunk_open(st, c, 0, err, errlen);
        if (rc) return rc;
        if (c->sh) pt_sh_init_values(st, c);
        for (int i = 0; !c->sh && i < m->n_params; i++) {
            if (ms->root[i] != i || ms->lay.param_chunk[i] != k) continue;
            const pt_param_v1 *p = &m->params[i];
            memcpy((char *)c->h_param + ms->lay.param_offset[i], p->init,
                   (size_t)(pt_store_param_numel(p) * pt_dtype_size(p->dtype)));
        }
        if ((rc = pt_tier_chunk_close(st, c, 1, err, errlen))) return rc;
    }
    return PT_OK;
}

static void set_static_pointers(pt_store *st) {
    pt_store *ms = st;
    for (int k = 0; k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        if (c->persistent) pt_cs_set_pointers(st, c, c->d_param, c->d_grad);
        else pt_cs_set_pointers(st, c, NULL, NULL);
    }
}

/* Chunks and their storage under st->kn (the caller destroys st on failure). */
/* Chunk k of the layout: resident (the first np, and those that must be),
 * its fp32 state offsets per region, the optimizer kind's planner terms, mode
 * C's parts. */
static int setup_chunks(pt_store *st, int np, char *err, size_t errlen) {
    pt_store *ms = st;
    pt_layout *L = &ms->lay;
    int rc = PT_OK;
    for (int k = 0; k < L->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        c->lc = &L->chunks[k];
        c->id = k;
        c->owner = st;   /* host functions on the streams find the store through it */
        c->slot = -1;
        c->cap = c->lc->capacity;
        c->used = c->lc->bytes_used;
        /* Oversize chunks stay resident: a pool slot cannot hold them, and a
         * dedicated per-gather allocation would fragment the device. */
        c->persistent = k < np || c->lc->mandatory_persistent || c->lc->oversize;
        c->reg_state = calloc((size_t)(c->lc->n_regions ? c->lc->n_regions : 1), sizeof(uint64_t));
        if (!c->reg_state) {
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
        }
        for (int r = 0; r < c->lc->n_regions; r++) {
            const pt_chunk_region *g = &c->lc->regions[r];
            if (!g->trainable) {
                c->reg_state[r] = UINT64_MAX;
                continue;
            }
            c->reg_state[r] = c->n_state;
            c->n_state += g->bytes / pt_dtype_size(g->dtype);
            c->trainable = 1;
            if (g->dtype != PT_F32) c->has16 = 1;
        }
        if (ms->ok->plan_chunk) ms->ok->plan_chunk(ms, c);
        if (c->persistent) ms->n_persist++;
        else ms->n_offloaded++;
        if (ms->shard && !c->persistent && (rc = pt_sh_setup(st, c, err, errlen))) return rc;
    }
    return PT_OK;
}

/* The offloaded chunks at tier level lv (0: none): their pinned bytes plus
 * the staging slots; with several ranks below level 2 also the fp32 gradient
 * sums every step then allocates (h_gacc, 4E a chunk), which level 2 keeps in
 * its records. */
static uint64_t tier_at(pt_store *st, int lv) {
    uint64_t pinned = 0;
    for (int k = 0; k < st->n_chunks; k++) {
        cs_chunk *c = &st->ch[k];
        if (c->persistent) continue;
        c->tiered = lv == 2 ? 2 : lv == 1 && c->trainable;
        pinned += pt_ms_chunk_pinned(c, 0);
        if (lv < 2 && st->world > 1 && c->trainable) pinned += (uint64_t)c->n_state * 4;
    }
    return pinned + pt_tier_staging_bytes(st, 0);
}

/* staging_slots = auto: enough to read every step of a block ahead (the most
 * tiered trainable chunks whose gradients one block completes, plus one
 * being written back and one more read ahead), at least 3, at most 64, and
 * no more than pinned_budget leaves (lim) beside the level's other bytes and
 * the buffer profiling times the copy rates with. On
 * one rank at level 1 the fp32 gradient sums of several micro-batches come at
 * their first step: the slots beyond 3 make room for them then
 * (pt_tier_make_room). The planner sizes them alike (pt_cost_tier). */
static void auto_slots(pt_store *st, uint64_t *pinned, uint64_t lim) {
    int want = 0;
    for (int b = 0; b < st->n_blocks; b++) {
        int n = 0;
        for (int k = 0; k < st->n_chunks; k++)
            n += st->ch[k].tiered && st->ch[k].trainable && st->ch[k].lc->block_first == b;
        if (n > want) want = n;
    }
    want = want + 2 < 3 ? 3 : want + 2 > 64 ? 64
                                            : want + 2;
    st->tier_want = want;
    uint64_t base = *pinned - pt_tier_staging_bytes(st, 0), per = pt_tier_staging_bytes(st, 0) / 3;
    /* and what profiling times the copy rates with: max(2 S, 64 KiB) */
    uint64_t prof = pt_ms_profile_pinned(st->lay.chunk_size);
    uint64_t fit = lim > base + prof && per ? (lim - base - prof) / per : 3;
    if (fit > 64) fit = 64;
    st->tier_slots = (uint64_t)want < fit ? want : fit < 3 ? 3
                                                           : (int)fit;
    *pinned = base + (uint64_t)st->tier_slots * per;
}

/* [nvme] path set: the offloaded chunks go to the disk tier at the lowest
 * level whose pinned bytes (*pinned, the chunks' and the staging slots') fit
 * the limit: 1, their Adam states; 2, their whole images (mode C: this rank's
 * parts). REKLS keeps its state in pinned memory (not built: the tier holds
 * AdamW's), and level 2 is not built for mode B on several ranks (its
 * optimizer_step all-reduces every chunk's gradient sum in place). */
static int tier_chunks(pt_store *st, uint64_t *pinned, char *err, size_t errlen) {
    const pt_config *cfg = st->env.cfg;
    if (!cfg->nvme_path[0] || st->ok != &pt_optk_adamw) return PT_OK;
    st->tier_slots = cfg->nvme_slots > 0 ? cfg->nvme_slots : 3;   /* auto: 3 to choose the level */
    uint64_t lim = pt_ms_pinned_limit(st), p1 = tier_at(st, 1);
    int lv = cfg->debug_tier_level ? cfg->debug_tier_level : p1 <= lim ? 1
                                                                       : 2;
    if (lv == 2 && st->world > 1 && !st->shard)
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pinned host memory: with their Adam states on the disk tier the "
                       "offloaded chunks still need %llu pinned bytes (their parameters and "
                       "gradients, and %d staging slots), over the budget of %llu; moving the "
                       "parameters and gradients to disk too is built for one rank or mode C "
                       "(zero3_shard), not for mode B on %d ranks: raise [memory] pinned_budget, "
                       "lower offload or shard the chunks",
                       (unsigned long long)p1, st->tier_slots, (unsigned long long)lim,
                       st->world);
    *pinned = lv == 1 ? p1 : tier_at(st, lv);
    if (cfg->nvme_slots <= 0) auto_slots(st, pinned, lim);
    char why[96] = "";
    if (st->tier_want)
        snprintf(why, sizeof why, "; auto: %d read a block ahead%s", st->tier_want,
                 st->tier_want > st->tier_slots ? ", more than the budget leaves" : "");
    PT_LOGI(st->env.lg, "nvme tier: level %d, the offloaded chunks' %s go to disk: %llu pinned "
                        "bytes left for the chunks, plus %llu of staging (%d slots of the largest "
                        "record%s)",
            lv, lv == 1 ? "Adam states" : "whole images (parameters, gradients, Adam states)",
            (unsigned long long)(*pinned - pt_tier_staging_bytes(st, 0)),
            (unsigned long long)pt_tier_staging_bytes(st, 0), st->tier_slots, why);
    return PT_OK;
}

/* Every chunk's storage: the pinned budget checked first, one pinned arena for
 * the offloaded chunks, then each chunk's allocations. */
static int alloc_storage(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    int rc;
    uint64_t pinned = 0;
    for (int k = 0; k < ms->n_chunks; k++)
        if (!ms->ch[k].persistent) pinned += pt_ms_chunk_pinned(&ms->ch[k], 0);
    /* over the pinned limit with a disk tier: the states go to disk */
    if ((pinned > pt_ms_pinned_limit(st) || st->env.cfg->debug_tier_force) &&
        (rc = tier_chunks(st, &pinned, err, errlen)))
        return rc;
    if ((rc = pt_ms_check_pinned(st, pinned, err, errlen))) return rc;
    /* One pinned arena for every offloaded chunk, so no chunk costs its own
     * driver allocation (and no later free a device-wide wait). If it cannot be
     * had, the chunks still get their own allocations: slower, not wrong. */
    uint64_t arena = 0;
    for (int k = 0; k < ms->n_chunks; k++)
        if (!ms->ch[k].persistent) arena += pt_ms_chunk_pinned(&ms->ch[k], 1);
    arena += pt_tier_staging_bytes(st, 1);
    char why[512];
    if (pt_gpu_pinned_reserve(st->env.gpu, (size_t)arena, why, sizeof why))
        PT_LOGW(st->env.lg, "offloaded chunks get one pinned allocation each: %s", why);

    double t0 = pt_now_s();
    for (int k = 0; k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        rc = c->persistent ? alloc_persistent(st, c, err, errlen)
                           : alloc_offloaded(st, c, err, errlen);
        if (rc) return rc;
    }
    if (pt_tier_staging_bytes(st, 0) && (rc = pt_tier_open(st, err, errlen))) return rc;
    ms->pin_seconds = pt_now_s() - t0;
    ms->pinned_bytes = pinned;
    return PT_OK;
}

static int load_chunks(pt_store *st, char *err, size_t errlen) {
    pt_model_v1 *m = st->env.model;
    pt_store *ms = st;
    ms->n_params = m->n_params;
    ms->rank = pt_coll_rank(st->env.coll);
    ms->world = pt_coll_world(st->env.coll);
    ms->shard = st->env.shard && st->env.coll && ms->world > 1;
    int rc = choose_layout(st, err, errlen);
    if (rc) return rc;
    pt_layout *L = &ms->lay;
    ms->n_chunks = L->n_chunks;
    ms->ch = calloc((size_t)L->n_chunks, sizeof *ms->ch);
    ms->root = calloc((size_t)m->n_params, sizeof *ms->root);
    ms->psq = calloc((size_t)m->n_params, sizeof *ms->psq);
    if (!ms->ch || !ms->root || !ms->psq) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    ms->root_tr = calloc((size_t)m->n_params, sizeof *ms->root_tr);
    ms->tied = calloc((size_t)m->n_params, sizeof *ms->tied);
    if (!ms->root_tr || !ms->tied) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    for (int i = 0; i < m->n_params; i++) {
        ms->root[i] = L->param_root[i];
        if (m->params[i].trainable) ms->root_tr[ms->root[i]] = 1;
        if (ms->root[i] != i) ms->tied[ms->n_tied++] = i;
    }

    /* Knobs: INI overrides, else everything persistent until the searcher decides. */
    int np = st->kn.n_persist;
    ms->np_fixed = np >= 0;
    if (np > L->n_chunks)
        PT_LOGW(st->env.lg, "n_persist = %d (%s) is more than the model's %d chunks: all %d are "
                            "resident (n_persist %d is used)",
                np, st->kn.source, L->n_chunks,
                L->n_chunks, L->n_chunks);
    if (np < 0 || np > L->n_chunks) np = L->n_chunks;
    if ((rc = setup_chunks(st, np, err, errlen))) return rc;
    /* after the chunks are set up (REKLS in mode C: its owner ranks) */
    if (ms->ok->plan_store && (rc = ms->ok->plan_store(ms, err, errlen))) return rc;
    int nb = st->kn.n_buffer;
    ms->nb_fixed = nb >= 0;
    int need = min_buffers(ms, m->n_blocks, 0), look = min_buffers(ms, m->n_blocks, 1);
    if (nb < 0) nb = look;
    if (nb < need) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "n_buffer = %d is too small: block streaming needs at least %d buffer(s) to hold one "
                                                        "block's offloaded chunks (%d with one-block prefetch); raise [protrain] n_buffer",
                       nb, need, look);
    }
    if (nb > ms->n_offloaded) {
        /* a slot holds one streamed chunk: more slots than streamed chunks are never
         * filled, so the count is the chunks, and the log names both */
        if (ms->nb_fixed)
            PT_LOGW(st->env.lg, "n_buffer = %d (%s) is more than the %d chunk(s) this plan streams: "
                                "%d buffer(s) are made (a buffer holds one streamed chunk, so more "
                                "would never be used)",
                    nb, st->kn.source, ms->n_offloaded,
                    ms->n_offloaded);
        nb = ms->n_offloaded;
    }
    ms->n_buffer = nb;
    char nb_src[96];
    if (!ms->nb_fixed) snprintf(nb_src, sizeof nb_src, "lookahead minimum");
    else if (st->kn.n_buffer != nb)
        snprintf(nb_src, sizeof nb_src, "%s %d, capped at the streamed chunks", st->kn.source,
                 st->kn.n_buffer);
    else snprintf(nb_src, sizeof nb_src, "%s", st->kn.source);

    if ((rc = alloc_storage(st, err, errlen))) return rc;
    uint64_t pinned = ms->pinned_bytes;
    if ((rc = pt_cs_init_runtime(st, err, errlen))) return rc;
    if (!st->no_init_upload && (rc = upload_initial(st, err, errlen))) return rc;
    set_static_pointers(st);

    uint64_t n_el = 0, n_tr = 0;
    for (int i = 0; i < m->n_params; i++)
        if (ms->root[i] == i) {
            n_el += pt_store_param_numel(&m->params[i]);
            if (m->params[i].trainable) n_tr += pt_store_param_numel(&m->params[i]);
        }
    PT_LOGI(st->env.lg, "model: %d params (%llu elements, %llu trainable), %d blocks", m->n_params,
            (unsigned long long)n_el, (unsigned long long)n_tr, m->n_blocks);
    /* Mandatory (non-block params) and oversize chunks (one tensor larger than
     * S_chunk) stay resident whatever n_persist says: the count says why. */
    PT_LOGI(st->env.lg, "chunks: S_chunk %llu bytes, N_chunk %d (%d mandatory persistent, %d "
                        "oversize kept resident), %d resident (n_persist %d, %s), n_buffer %d "
                        "(%s; minimum %d, with prefetch %d)",
            (unsigned long long)L->chunk_size, L->n_chunks, L->n_mandatory, L->n_oversize,
            ms->n_persist,
            np, ms->np_fixed ? st->kn.source : "all resident", ms->n_buffer,
            nb_src, need, look);
    PT_LOGI(st->env.lg, "memory: persistent chunks %.2f MiB, buffers %.2f MiB on the device; "
                        "pinned host %.2f MiB allocated in %.3f s; mode %s",
            ms->persist_bytes / 1048576.0, ms->buffer_bytes / 1048576.0, pinned / 1048576.0,
            ms->pin_seconds, !ms->n_offloaded ? "A (everything resident)" : ms->shard ? "C (offload, sharded across the ranks)"
                                                                                      : "B (offload)");
    return PT_OK;
}

uint64_t pt_store_arch_hash(const pt_model_v1 *m, const pt_config *cfg) {
    uint64_t h = pt_fnv1a64(m->arch ? m->arch : "", m->arch ? strlen(m->arch) : 0);
    for (int i = 0; i < m->n_params; i++) {
        const pt_param_v1 *p = &m->params[i];
        int32_t f[5] = {p->dtype, p->ndim, p->block, p->trainable, p->tie};
        h ^= pt_fnv1a64(f, sizeof f) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h ^= pt_fnv1a64(p->shape, sizeof p->shape) + (h << 6) + (h >> 2);
        if (p->name) h ^= pt_fnv1a64(p->name, strlen(p->name)) + (h << 6) + (h >> 2);
    }
    h ^= (uint64_t)m->n_blocks * 0x100000001b3ull;
    (void)cfg;
    return h;
}

int pt_store_optimizer_init(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    const pt_gpu_backend *ops = pt_gpu_ops(st->env.gpu);
    void *impl = pt_gpu_impl(st->env.gpu);
    uint64_t max16 = 0;
    int trc;
    for (int k = 0; k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        if (!c->trainable) continue;
        /* a tiered chunk's record in memory: zero moments and the masters below
         * go to disk (level 2: beside its parameters, read first) */
        if (c->tiered && (trc = pt_tier_chunk_open(st, c, c->tiered == 2, err, errlen))) return trc;
        if (c->tiered) {
            size_t eb = (size_t)c->n_state * sizeof(float);
            memset(c->h_m, 0, eb);
            memset(c->h_v, 0, eb);
            if (c->h_master) memset(c->h_master, 0, eb);
        }
        if (!c->persistent) {
            /* fp32 masters of 16-bit regions from the staged copy */
            for (int r = 0; c->has16 && r < c->lc->n_regions; r++) {
                const pt_chunk_region *g = &c->lc->regions[r];
                if (c->reg_state[r] == UINT64_MAX || g->dtype == PT_F32) continue;
                pt_cpu_cvt(c->h_master + c->reg_state[r], PT_F32, (char *)c->h_param + g->offset,
                           g->dtype, g->bytes / 2);
            }
            if (c->tiered && (trc = pt_tier_chunk_close(st, c, 1, err, errlen))) return trc;
            continue;
        }
        size_t eb = (size_t)c->n_state * sizeof(float);
        int rc;
        if ((rc = pt_gpu_alloc(st->env.gpu, eb, PT_TAG_OPTIM, (void **)&c->d_m, err, errlen)) ||
            (rc = pt_gpu_alloc(st->env.gpu, eb, PT_TAG_OPTIM, (void **)&c->d_v, err, errlen)))
            return rc;
        if (ops->memset_async(impl, c->d_m, 0, eb, NULL) ||
            ops->memset_async(impl, c->d_v, 0, eb, NULL))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "zeroing chunk %d's device Adam moments failed: memset failed", c->id);
        if (c->has16) {
            if ((rc = pt_gpu_alloc(st->env.gpu, eb, PT_TAG_OPTIM, (void **)&c->d_master, err, errlen)))
                return rc;
            for (int r = 0; r < c->lc->n_regions; r++) {
                const pt_chunk_region *g = &c->lc->regions[r];
                if (c->reg_state[r] == UINT64_MAX || g->dtype == PT_F32) continue;
                if (ops->convert(impl, c->d_master + c->reg_state[r], PT_F32,
                                 (char *)c->d_param + g->offset, g->dtype, g->bytes / 2, 0, NULL))
                    return pt_fail(err, errlen, PT_ERR_BACKEND,
                                   "widening chunk %d's 16-bit parameters into fp32 masters "
                                   "failed: convert failed",
                                   c->id);
                if (g->bytes / 2 > max16) max16 = g->bytes / 2;
            }
        }
    }
    if (max16) {
        ms->gtmp_elems = max16;
        int rc = pt_gpu_alloc(st->env.gpu, max16 * 4, PT_TAG_OTHER, &ms->d_gtmp, err, errlen);
        if (rc) return rc;
    }
    /* the kind create_optimizer chose; a layout planned for another hands
     * that one's state back first (the planner terms stay as planned) */
    const pt_optim_kind *kind = pt_optk_of(st->env.opt->type);
    if (st->tier && kind != &pt_optk_adamw)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "create_optimizer: the disk tier ([nvme] path) holds AdamW's states "
                       "only, and the optimizer is %s: raise [memory] pinned_budget so the "
                       "chunks fit without the tier, or use adamw",
                       kind->name);
    if (kind != st->ok) {
        if (st->ok->fini) st->ok->fini(st);
        st->ok = kind;
    }
    if (kind->init) {
        int rc = kind->init(st, err, errlen);
        if (rc) return rc;
    }
    st->opt_ready = 1;
    return PT_OK;
}

int pt_store_optimizer_ready(const pt_store *st) { return st && st->opt_ready; }

void pt_store_stats(const pt_store *st, pt_stats_v1 *s) {
    pt_store *ms = (pt_store *)st;   /* the accounting mutex */
    if (!ms) return;
    s->n_chunk = ms->n_chunks;
    s->n_persist = ms->n_persist;
    s->n_buffer = ms->n_buffer;
    s->mode = ms->n_offloaded ? (ms->shard ? 2 : 1) : 0;
    pthread_mutex_lock(&ms->acct_mu);
    s->cpu_optim_s = ms->cpu_optim_s;
    s->cpu_optim_hidden_s = ms->cpu_hidden_s;
    pthread_mutex_unlock(&ms->acct_mu);
    s->optim_wait_s = ms->optim_wait_s;
    for (int b = 0; ms->arena && b < ms->n_blocks; b++) {
        s->n_swap += ms->arena[b].mode == PT_ACT_SWAP;
        s->n_checkpoint += ms->arena[b].mode == PT_ACT_CKPT;
    }
    s->recomputes = ms->recomputes;
    s->swap_bytes = ms->swap_out_bytes;
    pt_tier_counters tc;
    pt_tier_get_counters(ms, &tc);
    s->tier_io_us = (uint64_t)llround((tc.rd_s + tc.wr_s) * 1e6);
    s->tier_wait_us = (uint64_t)llround(tc.wait_s * 1e6);
}

uint64_t pt_store_chunk_size(const pt_store *st) { return st->lay.chunk_size; }
int pt_store_n_chunks(const pt_store *st) { return st->n_chunks; }

void pt_store_chunk_info_get(const pt_store *st, int k, pt_store_chunk_info *out) {
    const cs_chunk *c = &st->ch[k];
    memset(out, 0, sizeof *out);
    out->used = c->used;
    for (int r = 0; r < c->lc->n_regions; r++)
        out->elems += c->lc->regions[r].bytes / pt_dtype_size(c->lc->regions[r].dtype);
    out->n_state = c->n_state;
    out->first_block = c->lc->mandatory_persistent ? -1 : c->lc->block_first;
    out->last_block = c->lc->mandatory_persistent ? -1 : c->lc->block_last;
    out->mandatory = c->lc->mandatory_persistent || c->lc->oversize;
    out->dev_bytes = pt_ms_chunk_dev_bytes(c);
    out->host_bytes = pt_ms_chunk_host_bytes(c);
    if (c->sh) {
        /* the replicated figure (what mode B would pin): the planner divides it
         * by the ranks itself when it weighs mode C */
        uint64_t eb = c->sh->n_state_full * 4;
        out->host_bytes = c->trainable ? 2 * c->used + 2 * eb + c->plan.aux_words * 4 : c->used;
        out->n_state = c->sh->n_state_full;
    }
    /* several ranks: the fp32 gradient sum is always kept (pt_store_pre_step) */
    if (st->env.coll && c->trainable) out->host_bytes += 4 * out->n_state;
    /* the planner terms of the kind the store is laid out for */
    const pt_optim_terms *t = &c->plan;
    out->optim_bytes = pt_ms_chunk_optim_dev_bytes(c);
    out->optim_gemm_flops = t->gemm_flops;
    out->optim_eigh_flops = t->eigh_flops;
    out->optim_params = t->n_params;
    out->optim_tp_grad_bytes = t->tp_grad_bytes;
    out->optim_tp_factor_bytes = t->tp_fac_bytes;
    out->optim_aux_words = t->aux_words;
    out->optim_mn = t->mn;
    out->optim_own_max = t->own_max;
}

double pt_store_chunk_optim_cpu_s(const pt_store *st, int k, pt_optim_rates *r) {
    const cs_chunk *c = &st->ch[k];
    return st->ok->cpu_seconds ? st->ok->cpu_seconds(r, &c->plan) : 0;
}

int pt_store_borrow_slot(pt_store *st, void **dev, uint64_t *bytes) {
    if (!st->pool || pt_bufpool_n_slots(st->pool) == 0 || pt_bufpool_slot_leases(st->pool, 0))
        return 0;
    /* the slot's last gradient copy to the host (d2h stream) and the compute
     * stream's last use of it may still run: the borrower's copies (on other
     * streams) would race with them */
    const pt_gpu_backend *o = pt_gpu_ops(st->env.gpu);
    if ((st->slot_free && o->event_sync(pt_gpu_impl(st->env.gpu), st->slot_free[0])) ||
        (st->slot_used && o->event_sync(pt_gpu_impl(st->env.gpu), st->slot_used[0])))
        return 0;
    *dev = pt_bufpool_slot_ptr(st->pool, 0);
    *bytes = pt_bufpool_slot_bytes(st->pool);
    pt_bufpool_invalidate_all(st->pool);
    return 1;
}

struct pt_pool *pt_store_workers(pt_store *st) { return st->workers; }

void pt_store_coll_seconds(const pt_store *st, double out[3]) {
    for (int i = 0; i < 3; i++) out[i] = st ? st->coll_s[i] : 0;
}

void pt_store_coll_bytes(const pt_store *st, double out[3]) {
    for (int i = 0; i < 3; i++) out[i] = st ? st->coll_b[i] : 0;
}

int pt_store_create(const pt_store_env *env, const pt_store_knobs *kn, const int32_t *modes,
                    const int32_t *swap_done, int from_image, pt_store **out, char *err,
                    size_t errlen) {
    *out = NULL;
    pt_store *st = calloc(1, sizeof *st);
    if (!st) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    pthread_mutex_init(&st->acct_mu, NULL);
    st->env = *env;
    st->n_blocks = env->model->n_blocks;
    st->kn = *kn;
    st->no_init_upload = from_image;
    /* the kind to plan for: the one create_optimizer chose, or before that the INI's */
    int t = env->opt ? env->opt->type : 0;
    st->ok = pt_optk_of(t ? t : env->cfg->optim_type);
    int rc = load_chunks(st, err, errlen);
    if (!rc) rc = pt_acts_init(st, modes, swap_done, err, errlen);
    st->no_init_upload = 0;
    if (rc) {
        (void)pt_store_destroy(st, NULL, 0);   /* rc is the error that matters */
        return rc;
    }
    *out = st;
    return PT_OK;
}

int pt_store_destroy(pt_store *st, char *err, size_t errlen) {
    pt_store *ms = st;
    if (!ms) return PT_OK;
    /* nothing queued may touch what is freed below (the runtime's and the
     * arenas' teardown rely on this one wait) */
    char e[256];
    int src = pt_store_sync(st, e, sizeof e);
    if (src && err) pt_fail(err, errlen, src, "freeing the chunk store: %s", e);
    else if (src) PT_LOGW(st->env.lg, "freeing the chunk store: %s", e);
    pt_acts_fini(st);
    pt_cs_fini_runtime(st);
    pt_tier_close(st);
    if (st->ok && st->ok->fini) st->ok->fini(st);
    for (int k = 0; ms->ch && k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        pt_gpu_free(st->env.gpu, c->d_param);
        pt_gpu_free(st->env.gpu, c->d_grad);
        pt_gpu_free(st->env.gpu, c->d_master);
        pt_gpu_free(st->env.gpu, c->d_m);
        pt_gpu_free(st->env.gpu, c->d_v);
        pt_gpu_pinned_free(st->env.gpu, c->h_param);
        pt_gpu_pinned_free(st->env.gpu, c->h_gstage);
        pt_gpu_pinned_free(st->env.gpu, c->h_master);
        pt_gpu_pinned_free(st->env.gpu, c->h_m);
        pt_gpu_pinned_free(st->env.gpu, c->h_v);
        pt_gpu_pinned_free(st->env.gpu, c->h_gacc);
        pt_sh_free(c);
        free(c->reg_state);
    }
    pt_gpu_free(st->env.gpu, ms->d_gtmp);
    free(ms->ch);
    free(ms->root);
    free(ms->root_tr);
    free(ms->tied);
    free(ms->psq);
    pt_layout_free(&ms->lay);
    pthread_mutex_destroy(&ms->acct_mu);
    free(ms);
    return src;
}
