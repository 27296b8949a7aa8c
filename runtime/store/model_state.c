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
#include <sys/resource.h>
#include <time.h>

#include "coll/coll.h"
#include "device_ext.h"
#include "kernels_hd.h"
#include "store_internal.h"


uint64_t pt_param_numel(const pt_param_v1 *p) {
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
                "parameters have no gradient or optimizer, so they must be frozen (trainable = 0)", i, nm);
        }
        if (p->block < -1 || p->block >= m->n_blocks) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' names block %d but the model has %d blocks", i,
                nm, p->block, m->n_blocks);
        }
        if (p->tp_split < 0 || p->tp_split > 2 || (p->tp_split == 2 && p->ndim < 2) ||
            (p->tp_split && p->tie >= 0)) {
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' has tp_split %d with ndim %d and tie %d (0 = "
                "not split, 1 = rows, 2 = columns of a tensor of at least 2 dims; a tied param "
                "takes its split from the one it is tied to)", i, nm, p->tp_split, p->ndim,
                p->tie);
        }
        if (p->tie >= 0) {
            if (p->tie >= m->n_params || p->tie == i || m->params[p->tie].tie >= 0) {
                return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' is tied to %d, which is not a valid untied "
                    "param", i, nm, p->tie);
            }
            const pt_param_v1 *t = &m->params[p->tie];
            if (pt_param_numel(t) != pt_param_numel(p) || t->dtype != p->dtype) {
                return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "post_model_load: param %d '%s' is tied to '%s' but their sizes or dtypes "
                    "differ", i, nm, t->name ? t->name : "(unnamed)");
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
        rc = pt_chunk_size_choose(lp, m->n_params, m->n_blocks, &choice, err, errlen);
        if (!rc) {
            S = choice.chosen;
            char tab[4096];
            pt_chunk_size_table(&choice, tab, sizeof tab);
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

/* Pinned bytes of one offloaded chunk (the real cost of an offloaded parameter,
 * never 2 bytes per parameter), exactly as alloc_offloaded allocates them;
 * rounded: each allocation rounded as the pinned arena carves it. */
static uint64_t pinned_of(const cs_chunk *c, int rounded) {
    if (c->sh) {   /* this rank's parts, and the REKLS state of the params it owns */
        uint64_t own = c->rk_plan_own * 4;
        return pt_sh_pinned(c, rounded) + (rounded && own ? pt_gpu_round_size(own) : own);
    }
    uint64_t pb = rounded ? pt_gpu_round_size(c->used) : c->used;
    if (!c->trainable) return pb;                              /* h_param only */
    uint64_t eb = (uint64_t)c->n_state * 4, rk = c->rk_plan_aux * 4;
    if (rounded) eb = pt_gpu_round_size(eb), rk = rk ? pt_gpu_round_size(rk) : 0;
    /* h_param, h_gstage, m, v, fp32 masters, REKLS factors and bases */
    return 2 * pb + 2 * eb + (c->has16 ? eb : 0) + rk;
}

uint64_t pt_ms_chunk_host_bytes(const cs_chunk *c) { return pinned_of(c, 0); }

/* Device bytes of one resident chunk as alloc_persistent and pt_ms_optimizer_init
 * allocate them, each allocation rounded like the allocator rounds it. */
uint64_t pt_ms_chunk_dev_bytes(const cs_chunk *c) {
    uint64_t b = pt_gpu_round_size(c->used);                    /* d_param */
    if (!c->trainable) return b;
    uint64_t st = pt_gpu_round_size(c->n_state * 4);
    b += pt_gpu_round_size(c->used) + 2 * st;                   /* d_grad, d_m, d_v */
    if (c->has16) b += st;                                      /* d_master */
    return b + pt_ms_chunk_rekls_dev_bytes(c);
}

/* REKLS factors and bases on the device, plus the scratch of the chunk's
 * largest REKLS param. The store allocates one scratch for the largest
 * resident param, so summing this over resident chunks is an upper bound by
 * at most (resident REKLS chunks - 1) scratches. */
uint64_t pt_ms_chunk_rekls_dev_bytes(const cs_chunk *c) {
    if (!c->rk_plan_aux) return 0;
    return pt_gpu_round_size(c->rk_plan_aux * 4) + pt_gpu_round_size(c->rk_plan_ws * 4);
}

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static int check_pinned(pt_store *st, uint64_t need, char *err, size_t errlen) {
    uint64_t avail = mem_available();
    uint64_t budget = st->env.cfg->pinned_budget;
    struct rlimit rl;
    int have_rl = getrlimit(RLIMIT_MEMLOCK, &rl) == 0;
    char lim[64];
    if (!have_rl || rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof lim, "unlimited");
    else snprintf(lim, sizeof lim, "%llu", (unsigned long long)rl.rlim_cur);
    /* auto budget: 90% of MemAvailable. RLIMIT_MEMLOCK binds only where pages are
     * really locked (cuda pins through the driver, which ignores it; the host
     * backend does not lock), so it is reported, not enforced. */
    uint64_t eff = budget ? budget : avail / 10 * 9;
    if (need > eff || (avail && need > avail)) {
        /* mode C: also what mode B (replicated) would need per rank */
        char alt[160] = "";
        if (st->shard) {
            uint64_t rep = 0;
            for (int k = 0; k < st->n_chunks; k++) {
                const cs_chunk *c = &st->ch[k];
                if (c->sh)   /* REKLS's factors replicated too */
                    rep += c->trainable ? 2 * c->used + 2 * 4 * c->sh->n_state_full +
                                              4 * c->rk_plan_aux
                                        : c->used;
            }
            snprintf(alt, sizeof alt, " (this rank's parts in mode C, split over %d ranks; "
                     "replicated on every rank, mode B, they would need %llu)", st->world,
                     (unsigned long long)rep);
        }
        /* a profiling run then times the copy rates through one more pinned
         * buffer of max(2 x chunk_size, the largest arena, 64 KiB); the arenas
         * are not known yet, and where the budget leaves less the profiler
         * times at what is left (profiler_hw.c), so the chunks plus
         * max(2 x chunk_size, 64 KiB) is a budget that runs */
        uint64_t tb = 2 * st->lay.chunk_size > 65536 ? 2 * st->lay.chunk_size : 65536;
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "pinned host memory: the offloaded chunks need %llu bytes%s, but the budget is %llu "
            "(pinned_budget = %s), MemAvailable is %llu and RLIMIT_MEMLOCK is %s; lower "
            "offload (raise n_persist / device_capacity) or set [memory] pinned_budget to at "
            "least %llu (the chunks, plus %llu that profiling uses to time the copy rates)",
            (unsigned long long)need, alt, (unsigned long long)eff, budget ? "set" : "auto: 90% of "
            "MemAvailable", (unsigned long long)avail, lim, (unsigned long long)(need + tb),
            (unsigned long long)tb);
    }
    return PT_OK;
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
    if ((rc = pt_gpu_pinned_alloc(st->env.gpu, pb, &c->h_param, err, errlen))) return rc;
    memset(c->h_param, 0, pb);
    if (!c->trainable) return PT_OK;
    if ((rc = pt_gpu_pinned_alloc(st->env.gpu, gb, &c->h_gstage, err, errlen)) ||
        (rc = pt_gpu_pinned_alloc(st->env.gpu, eb, (void **)&c->h_m, err, errlen)) ||
        (rc = pt_gpu_pinned_alloc(st->env.gpu, eb, (void **)&c->h_v, err, errlen)))
        return rc;
    memset(c->h_m, 0, eb);
    memset(c->h_v, 0, eb);
    /* a part's padding elements are never copied in: they must read as zero */
    if (c->sh) memset(c->h_gstage, 0, gb);
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
        size_t bytes = (size_t)(pt_param_numel(p) * pt_dtype_size(p->dtype));
        if (c->sh) continue;   /* below, chunk by chunk */
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
        if (ms->ch[k].sh) pt_sh_init_values(st, &ms->ch[k]);
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
                            "resident (n_persist %d is used)", np, st->kn.source, L->n_chunks,
                L->n_chunks, L->n_chunks);
    if (np < 0 || np > L->n_chunks) np = L->n_chunks;
    for (int k = 0; k < L->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        c->lc = &L->chunks[k];
        c->id = k;
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
        pt_rk_plan_chunk(ms, c);
        if (c->persistent) ms->n_persist++;
        else ms->n_offloaded++;
        if (ms->shard && !c->persistent && (rc = pt_sh_setup(st, c, err, errlen))) return rc;
    }
    /* mode C: the owner rank of every REKLS param of a split chunk */
    if (ms->shard && (rc = pt_rk_sh_owners(ms, err, errlen))) return rc;
    int nb = st->kn.n_buffer;
    ms->nb_fixed = nb >= 0;
    int need = min_buffers(ms, m->n_blocks, 0), look = min_buffers(ms, m->n_blocks, 1);
    if (nb < 0) nb = look;
    if (nb < need) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "n_buffer = %d is too small: block streaming needs at least %d buffer(s) to hold one "
            "block's offloaded chunks (%d with one-block prefetch); raise [protrain] n_buffer",
            nb, need, look);
    }
    if (nb > ms->n_offloaded) nb = ms->n_offloaded;
    ms->n_buffer = nb;

    uint64_t pinned = 0;
    for (int k = 0; k < ms->n_chunks; k++)
        if (!ms->ch[k].persistent) pinned += pinned_of(&ms->ch[k], 0);
    if ((rc = check_pinned(st, pinned, err, errlen))) return rc;
    /* One pinned arena for every offloaded chunk, so no chunk costs its own
     * driver allocation (and no later free a device-wide wait). If it cannot be
     * had, the chunks still get their own allocations: slower, not wrong. */
    uint64_t arena = 0;
    for (int k = 0; k < ms->n_chunks; k++)
        if (!ms->ch[k].persistent) arena += pinned_of(&ms->ch[k], 1);
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
    ms->pin_seconds = pt_now_s() - t0;
    ms->pinned_bytes = pinned;
    if ((rc = pt_cs_init_runtime(st, err, errlen))) return rc;
    if (!st->no_init_upload && (rc = upload_initial(st, err, errlen))) return rc;
    set_static_pointers(st);

    uint64_t n_el = 0, n_tr = 0;
    for (int i = 0; i < m->n_params; i++)
        if (ms->root[i] == i) {
            n_el += pt_param_numel(&m->params[i]);
            if (m->params[i].trainable) n_tr += pt_param_numel(&m->params[i]);
        }
    PT_LOGI(st->env.lg, "model: %d params (%llu elements, %llu trainable), %d blocks", m->n_params,
            (unsigned long long)n_el, (unsigned long long)n_tr, m->n_blocks);
    PT_LOGI(st->env.lg, "chunks: S_chunk %llu bytes, N_chunk %d (%d mandatory persistent), "
                     "%d resident (n_persist %d, %s), n_buffer %d (%s; minimum %d, with "
                     "prefetch %d)",
            (unsigned long long)L->chunk_size, L->n_chunks, L->n_mandatory, ms->n_persist,
            np, ms->np_fixed ? st->kn.source : "all resident", ms->n_buffer,
            ms->nb_fixed ? st->kn.source : "lookahead minimum", need, look);
    PT_LOGI(st->env.lg, "memory: persistent chunks %.2f MiB, buffers %.2f MiB on the device; "
                     "pinned host %.2f MiB allocated in %.3f s; mode %s",
            ms->persist_bytes / 1048576.0, ms->buffer_bytes / 1048576.0, pinned / 1048576.0,
            ms->pin_seconds, !ms->n_offloaded ? "A (everything resident)"
                             : ms->shard ? "C (offload, sharded across the ranks)" : "B (offload)");
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
    for (int k = 0; k < ms->n_chunks; k++) {
        cs_chunk *c = &ms->ch[k];
        if (!c->trainable) continue;
        if (!c->persistent) {
            /* fp32 masters of 16-bit regions from the staged copy */
            for (int r = 0; c->has16 && r < c->lc->n_regions; r++) {
                const pt_chunk_region *g = &c->lc->regions[r];
                if (c->reg_state[r] == UINT64_MAX || g->dtype == PT_F32) continue;
                pt_cvt(c->h_master + c->reg_state[r], PT_F32, (char *)c->h_param + g->offset,
                       g->dtype, g->bytes / 2);
            }
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
                                   "failed: convert failed", c->id);
                if (g->bytes / 2 > max16) max16 = g->bytes / 2;
            }
        }
    }
    if (max16) {
        ms->gtmp_elems = max16;
        int rc = pt_gpu_alloc(st->env.gpu, max16 * 4, PT_TAG_OTHER, &ms->d_gtmp, err, errlen);
        if (rc) return rc;
    }
    if (st->env.opt->type == PT_OPTIM_REKLS) {
        int rc = pt_rk_init(st, err, errlen);
        if (rc) return rc;
    }
    st->opt_ready = 1;
    return PT_OK;
}

int pt_store_read_param(pt_store *st, int32_t index, void *dst, uint64_t bytes, char *err,
                     size_t errlen) {
    pt_store *ms = st;
    if (!ms || index < 0 || index >= ms->n_params || !dst) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "read_param: bad index %d (model has %d params) or NULL destination", index,
            ms ? ms->n_params : 0);
    }
    int root = ms->root[index];
    const pt_param_v1 *p = &st->env.model->params[root];
    uint64_t need = pt_param_numel(p) * pt_dtype_size(p->dtype);
    if (bytes != need) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "read_param: param %d holds %llu bytes, caller passed %llu", index,
            (unsigned long long)need, (unsigned long long)bytes);
    }
    cs_chunk *c = &ms->ch[ms->lay.param_chunk[root]];
    uint64_t off = ms->lay.param_offset[root];
    if (c->sh) return pt_sh_read_param(st, c, off, dst, (size_t)bytes, err, errlen);
    if (c->persistent) {
        /* the device AdamW of the last step may still be queued */
        int rc = pt_cs_ord(st, PT_ORD_STEP) ? pt_store_sync(st, err, errlen) : PT_OK;
        char e[256];
        if (!rc && (rc = pt_gpu_memcpy_sync(st->env.gpu, dst, (char *)c->d_param + off, bytes,
                                            PT_GPU_D2H, e, sizeof e)))
            rc = pt_fail(err, errlen, PT_ERR_BACKEND, "read_param: reading param %d failed: %s",
                         index, e);
        return rc;
    }
    int rc = pt_cs_wait_task(st, c, "read_param", err, errlen);
    if (rc) return rc;
    memcpy(dst, (char *)c->h_param + off, bytes);
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
        out->host_bytes = c->trainable ? 2 * c->used + 2 * eb + c->rk_plan_aux * 4 : c->used;
        out->n_state = c->sh->n_state_full;
    }
    /* several ranks: the fp32 gradient sum is always kept (pt_store_pre_step) */
    if (st->env.coll && c->trainable) out->host_bytes += 4 * out->n_state;
    out->rekls_bytes = pt_ms_chunk_rekls_dev_bytes(c);
    out->rekls_gemm_flops = c->rk_plan_gemm;
    out->rekls_eigh_flops = c->rk_plan_eigh;
    out->rekls_params = c->rk_plan_n;
    out->rekls_tp_grad_bytes = c->rk_plan_tp_grad;
    out->rekls_tp_factor_bytes = c->rk_plan_tp_fac;
    out->rekls_aux_words = c->rk_plan_aux;
    out->rekls_mn = c->rk_plan_mn;
    out->rekls_own_max = c->rk_plan_max;
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
    pt_rk_fini(st);
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

int pt_store_param_home(pt_store *st, int32_t index, float **p, int *on_device, char *err,
                        size_t errlen) {
    pt_store *ms = st;
    *p = NULL;
    if (!ms || index < 0 || index >= ms->n_params)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "param_home: bad index %d (model has %d "
                       "params)", index, ms ? ms->n_params : 0);
    int root = ms->root[index];
    const pt_param_v1 *q = &st->env.model->params[root];
    if (q->dtype != PT_F32)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "param_home: param %d '%s' is not fp32",
                       index, q->name ? q->name : "(unnamed)");
    cs_chunk *c = &ms->ch[ms->lay.param_chunk[root]];
    uint64_t off = ms->lay.param_offset[root];
    if (c->sh)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "param_home: param %d '%s' lies in "
                       "chunk %d, which mode C splits across the ranks", index,
                       q->name ? q->name : "(unnamed)", c->id);
    if (c->persistent) {
        *p = (float *)((char *)c->d_param + off);
        *on_device = 1;
        return PT_OK;
    }
    int rc = pt_cs_wait_task(st, c, "param_home", err, errlen);
    if (rc) return rc;
    *p = (float *)((char *)c->h_param + off);
    *on_device = 0;
    return PT_OK;
}

int pt_store_param_part(pt_store *st, int32_t index, pt_store_part *out, char *err,
                        size_t errlen) {
    memset(out, 0, sizeof *out);
    if (!st || index < 0 || index >= st->n_params)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "param_part: bad index %d (model has %d "
                       "params)", index, st ? st->n_params : 0);
    int root = st->root[index];
    cs_chunk *c = &st->ch[st->lay.param_chunk[root]];
    const pt_param_v1 *q = &st->env.model->params[root];
    uint64_t n = pt_param_numel(q);
    if (!c->sh) {
        out->len = n;
        return pt_store_param_home(st, index, &out->p, &out->on_device, err, errlen);
    }
    if (q->dtype != PT_F32)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "param_part: param %d '%s' is not fp32",
                       index, q->name ? q->name : "(unnamed)");
    int rc = pt_cs_wait_task(st, c, "param_part", err, errlen);
    if (rc) return rc;
    out->split = 1;
    /* the param is elements [e0, e0 + n) of one region; this rank owns the
     * region's [lo, lo + own): the intersection is contiguous */
    uint64_t off = st->lay.param_offset[root];
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        const cs_shreg *h = &c->sh->r[r];
        if (off < g->offset || off >= g->offset + g->bytes) continue;
        uint64_t e0 = (off - g->offset) / 4, a = e0 > h->lo ? e0 : h->lo;
        uint64_t b = e0 + n < h->lo + h->own ? e0 + n : h->lo + h->own;
        if (b > a) {
            out->p = (float *)((char *)c->h_param + h->hp_off) + (a - h->lo);
            out->lo = a - e0;
            out->len = b - a;
        }
        break;
    }
    return PT_OK;
}

int pt_store_param_parts(const pt_store *st, int32_t index, size_t *lo, size_t *len) {
    if (!st || index < 0 || index >= st->n_params) return -1;
    int root = st->root[index];
    const cs_chunk *c = &st->ch[st->lay.param_chunk[root]];
    if (!c->sh) return -1;
    const pt_param_v1 *q = &st->env.model->params[root];
    uint64_t off = st->lay.param_offset[root], es = pt_dtype_size(q->dtype);
    uint64_t n = pt_param_numel(q);
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (off < g->offset || off >= g->offset + g->bytes) continue;
        /* the region's parts (pt_coll_part over its elements) cut to the param's
         * elements [e0, e0 + n) */
        uint64_t e0 = (off - g->offset) / es;
        for (int p = 0; p < st->world; p++) {
            size_t plo, plen;
            pt_coll_part((size_t)c->sh->r[r].n, st->world, p, &plo, &plen);
            uint64_t a = e0 > plo ? e0 : plo, b = e0 + n < plo + plen ? e0 + n : plo + plen;
            lo[p] = b > a ? (size_t)(a - e0) : 0;
            len[p] = b > a ? (size_t)(b - a) : 0;
        }
        return 0;
    }
    return -1;
}

int pt_store_param_chunk(const pt_store *st, int32_t index, float **pinned) {
    *pinned = NULL;
    if (!st || index < 0 || index >= st->n_params) return -1;
    int root = st->root[index];
    const cs_chunk *c = &st->ch[st->lay.param_chunk[root]];
    if (!c->persistent && !c->sh && st->env.model->params[root].dtype == PT_F32)
        *pinned = (float *)((char *)c->h_param + st->lay.param_offset[root]);
    return c->id;
}
