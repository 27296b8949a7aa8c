/*
 * osft_proj.c — OSFT's projections onto the complement of each target's frozen
 * bases, in two independent paths per target (osft.h gives the math):
 *   U path: U_low [N x kl] -= U_high (U_high^T U_low),   U_high [N x k];
 *   V path: V_low [kl x M] -= (V_low V_high^T) V_high,   V_high [k x M].
 * Each path reads one frozen factor and changes one trainable factor, so it can
 * run as soon as that trainable factor has its final values, wherever its
 * partner lives.
 *
 *  - Gradients: right after the owning block's backward, queued on the compute
 *    stream behind it, before the store copies, reduces or offloads them.
 *  - Values, after every optimizer step, where the step wrote them:
 *    . in an offloaded chunk (CPU step) whose frozen partner is in pinned memory
 *      too: inside that chunk's step task, on the worker, with the CPU's GEMM
 *      (pt_osft_chunk_stepped). The chunk's next upload and every host-side
 *      reader wait for the step and so for the projection, and no other chunk's
 *      deferred step is waited for: with OSFT on, optimizer_step still returns
 *      while the CPU steps run into the next forward. The CPU GEMM is the same
 *      cblas_sgemm call the host backend's gemm_f32 makes, so the values are the
 *      bits the op queued on the compute stream would produce;
 *    . otherwise (a resident trainable factor after device AdamW, or a frozen
 *      partner on the device): queued on the compute stream from
 *      optimizer_step, after waiting for the one chunk's step;
 *    . mode C (a factor in a chunk split across the ranks): gathered whole on
 *      every rank in optimizer_step, projected there with the same products on
 *      the same values, and each rank keeps its own part (project_split).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "osft_internal.h"
#include "store/ord_bits.h"

static const int FZ[2] = {PT_OSFT_UH, PT_OSFT_VH}, TR[2] = {PT_OSFT_UL, PT_OSFT_VL};

/* Path v (0 U, 1 V) of target t: tr -= the part of tr along the frozen fz, with
 * c [k x kl] scratch for the coefficients (U: fz^T tr; V: tr fz^T, kl x k). */
static void project_path(lin *L, const tgt *t, int v, const float *fz, float *tr, float *c) {
    int64_t N = t->N, M = t->M, k = t->k, kl = t->kl;
    if (!v) {
        pt_osft_mm(L, 1, 0, k, kl, N, 1.0f, fz, k, tr, kl, 0.0f, c, kl);
        pt_osft_mm(L, 0, 0, N, kl, k, -1.0f, fz, k, c, kl, 1.0f, tr, kl);
    } else {
        pt_osft_mm(L, 0, 1, kl, k, M, 1.0f, tr, M, fz, M, 0.0f, c, k);
        pt_osft_mm(L, 0, 0, kl, M, k, -1.0f, c, k, fz, M, 1.0f, tr, M);
    }
}

static int64_t max_coef(const pt_osft *o, int32_t b) {
    int64_t w = 0;
    for (int i = 0; i < o->n; i++)
        if ((b == INT32_MIN || o->t[i].block == b) && o->t[i].k * o->t[i].kl > w)
            w = o->t[i].k * o->t[i].kl;
    return w;
}

/* Order against clipping: the gradients are projected here, block by block,
 * before optimizer_step takes the global norm, so max_grad_norm clips the
 * projected gradient. The norm then counts only what the step can use: the part
 * along the frozen bases is removed and would never move a weight, so it should
 * not shrink the update either. A reference that clips the raw gradient and
 * projects inside its optimizer step (mini_trainer's order) divides by the raw
 * norm, which is >= the projected one: with a clip in effect it takes smaller
 * steps, and the two trajectories part; without clipping they are the same
 * (the projection is linear and comes before the step in both). Projecting here
 * is what lets the projection run behind each block's backward on the device,
 * before the gradient is reduced across ranks or offloaded to the CPU; the other
 * order would keep every raw gradient until the norm is known and project in
 * optimizer_step wherever each chunk lives, so it is not offered. */
int pt_osft_project_grads(pt_rt *rt, int32_t b, char *err, size_t errlen) {
    pt_osft *o = osft_of(rt);
    if (!o) return PT_OK;
    int64_t w = max_coef(o, b);
    if (!w) return PT_OK;   /* nothing frozen in this block */
    float *c = NULL;
    int rc = pt_osft_scratch_get(rt, (uint64_t)w, &c, err, errlen);
    if (rc) return rc;
    lin L;
    pt_osft_lin_open(rt, &L);
    /* negative control: at once on this thread, before the backward has run */
    if (rt->dev.ordered && (rt->dev.skip & PT_ORD_OSFT)) L.s = NULL;
    for (int i = 0; i < o->n; i++) {
        const tgt *t = &o->t[i];
        if (t->block != b || !t->k) continue;
        fptr f;
        pt_osft_live_ptrs(o, t, &f);
        /* no gradient buffer: nothing to project (evaluation, or a frozen pass) */
        if (!f.g[PT_OSFT_UL] || !f.g[PT_OSFT_VL] || !f.d[PT_OSFT_UH] || !f.d[PT_OSFT_VH]) continue;
        project_path(&L, t, 0, f.d[PT_OSFT_UH], f.g[PT_OSFT_UL], c);
        project_path(&L, t, 1, f.d[PT_OSFT_VH], f.g[PT_OSFT_VL], c);
    }
    pt_osft_scratch_free(rt, c);
    return pt_osft_lin_close(rt, &L, "osft: gradient projection", err, errlen);
}

/* The chunk whose CPU step projects path v of t (its trainable factor's, when
 * both factors are in pinned memory of offloaded chunks not split across
 * ranks), with both addresses; else -1. The frozen partner may be in another
 * chunk: nothing writes frozen values, so reading them from any worker is safe. */
static int task_chunk(const pt_rt *rt, const tgt *t, int v, float **fz, float **tr) {
    int c = pt_store_param_chunk(rt->st, t->x[TR[v]], tr);
    (void)pt_store_param_chunk(rt->st, t->x[FZ[v]], fz);
    return *tr && *fz ? c : -1;
}

/* A failure on a worker, reported by the next hook (pt_osft_async_status). */
static void worker_fail(pt_osft *o, int rc, const char *msg) {
    pthread_mutex_lock(&o->mu);
    if (!o->async_rc) {
        o->async_rc = rc;
        snprintf(o->async_err, sizeof o->async_err, "%s", msg);
    }
    pthread_mutex_unlock(&o->mu);
}

void pt_osft_chunk_stepped(pt_rt *rt, int32_t chunk) {
    pt_osft *o = osft_of(rt);
    if (!o || !rt->st) return;
    float *c = NULL;
    lin L = {.cpu = 1};
    for (int i = 0; i < o->n; i++) {
        const tgt *t = &o->t[i];
        for (int v = 0; v < 2 && t->k; v++) {
            float *fz, *tr;
            if (task_chunk(rt, t, v, &fz, &tr) != chunk) continue;
            /* the coefficients: this worker's own (other chunks' steps run beside it) */
            if (!c && !(c = malloc((size_t)max_coef(o, INT32_MIN) * 4))) {
                worker_fail(o, PT_ERR_HOST_OOM, "osft: out of host memory for the value "
                                                "projection's coefficients in a CPU step");
                return;
            }
            project_path(&L, t, v, fz, tr, c);
        }
    }
    free(c);
}

/* Factor `index` (n elements) whole into dst on every rank: this rank's part
 * `q` copied in, then each rank's part of it copied to every other rank (the
 * parts are its region's parts cut to it, so pt_coll_allgather, which cuts the
 * buffer it is given into ceil(n / W) parts, cannot do it). A copy: exact. */
static int gather(pt_rt *rt, int32_t index, float *dst, const pt_store_part *q, char *err,
                  size_t errlen) {
    int w = pt_coll_world(rt->dist.coll);
    size_t *lo = malloc(2 * sizeof(size_t) * (size_t)w);
    if (!lo) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "osft: out of host memory");
    size_t *len = lo + w;
    int rc = pt_store_param_parts(rt->st, index, lo, len)
                 ? pt_fail(err, errlen, PT_ERR_INTERNAL, "osft: factor %d is not split across "
                           "the ranks, yet its chunk is", (int)index)
                 : PT_OK;
    if (!rc && q->len) memcpy(dst + q->lo, q->p, (size_t)q->len * 4);
    if (!rc) {
        char what[200];
        snprintf(what, sizeof what, "osft: gathering '%s' for its value projection",
                 osft_of(rt)->xp[index].name);
        rc = pt_coll_allgather_ranges(rt->dist.coll, dst, lo, len, 4, what, err, errlen);
    }
    free(lo);
    return rc;
}

void pt_osft_drop_frozen(pt_rt *rt) {
    pt_osft *o = osft_of(rt);
    for (int i = 0; o && o->fzc && i < 2 * o->n; i++) {
        if (o->fzc[i]) pt_gpu_pinned_free(rt->dev.gpu, o->fzc[i]);
        o->fzc[i] = NULL;
    }
}

/* [osft] cache_frozen: path v of t's frozen factor whole, gathered once into
 * pinned memory it keeps (frozen values never change; load_state drops it).
 * Every rank fills it at the same step, so the gathers still line up. */
static int cached_frozen(pt_rt *rt, const tgt *t, int v, const pt_store_part *pf,
                         const float **fz, char *err, size_t errlen) {
    pt_osft *o = osft_of(rt);
    if (!o->fzc) {
        if (!(o->fzc = calloc((size_t)(2 * o->n), sizeof *o->fzc)))
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "osft: out of host memory");
        uint64_t fzb, trb, dnb;
        pt_osft_bytes(rt, &fzb, &trb, &dnb);
        PT_LOGI(&rt->lg, "osft: mode C keeps the frozen factors whole on every rank ([osft] "
                         "cache_frozen): up to %.2f MiB pinned", fzb / 1048576.0);
    }
    float **slot = &o->fzc[2 * (t - o->t) + v];
    if (!*slot) {
        size_t nf = (size_t)(v ? t->k * t->M : t->N * t->k);
        int rc = pt_gpu_pinned_alloc(rt->dev.gpu, nf * 4, (void **)slot, err, errlen);
        if (!rc && (rc = gather(rt, t->x[FZ[v]], *slot, pf, err, errlen))) {
            pt_gpu_pinned_free(rt->dev.gpu, *slot);
            *slot = NULL;
        }
        if (rc) return rc;
    }
    *fz = *slot;
    return PT_OK;
}

/* Mode C: path v of t when either factor lies in a chunk split across the
 * ranks. Why gathered and not a partial product all-reduced: a rank holds a
 * byte range of its chunk, so its rows of U_low and of U_high (or of V_low and
 * V_high) are not the same rows, and no contraction index is split the same
 * way for both; a sum of local coefficients would be wrong (for V it mixes
 * coefficients of different rows). Gathered, every rank runs the single-rank
 * products on the single-rank values: the bits of mode B. By default the
 * frozen factor is gathered again every step instead of kept whole: a
 * replicated copy would cost every rank its full frozen bytes, which mode C
 * exists to split ([osft] cache_frozen keeps it, for users with the memory).
 * Cost per step and target: its four U/V factors, (N + M) R floats, gathered
 * (each rank receives the (W - 1) / W of them it does not hold; cached: only
 * the trainable (N + M) kl), and the projection's 4 (N + M) k kl flops on
 * every rank. */
int pt_osft_split_path(lin *L, const tgt *t, int v, const pt_osft_split *s, char *err,
                       size_t errlen) {
    const float *fz = s->pf->split ? s->fz : s->pf->p;
    int rc = PT_OK;
    if (!fz) {
        rc = s->gather(s->user, t->x[FZ[v]], s->f, s->pf, err, errlen);
        fz = s->f;
    }
    if (!rc && s->pq->split) rc = s->gather(s->user, t->x[TR[v]], s->q, s->pq, err, errlen);
    if (rc) return rc;
    project_path(L, t, v, fz, s->pq->split ? s->q : s->pq->p, s->c);
    /* the result is read back (and the buffer reused) by this thread */
    if (!L->rc && s->sync && s->sync(s->user)) L->rc = PT_ERR_BACKEND;
    if (!L->rc && s->pq->split && s->pq->len)
        memcpy(s->pq->p, s->q + s->pq->lo, (size_t)s->pq->len * 4);
    return PT_OK;   /* an op's failure is in L->rc */
}

static int gather_cb(void *user, int32_t index, float *dst, const pt_store_part *own, char *err,
                     size_t errlen) {
    pt_rt *rt = user;
    double t0 = pt_now_s();
    int rc = gather(rt, index, dst, own, err, errlen);
    osft_of(rt)->gather_s += pt_now_s() - t0;
    return rc;
}

static int sync_cb(void *user) {
    pt_rt *rt = user;
    return pt_gpu_ops(rt->dev.gpu)->stream_sync(pt_gpu_impl(rt->dev.gpu), rt->dev.s_compute);
}

static int project_split(pt_rt *rt, lin *L, const tgt *t, int v, const pt_store_part *pf,
                         const pt_store_part *pq, float *c, char *err, size_t errlen) {
    pt_osft *o = osft_of(rt);
    uint64_t nf = (uint64_t)(v ? t->k * t->M : t->N * t->k);
    if (!o->full) {
        uint64_t need = 0;
        for (int i = 0; i < o->n; i++) {
            uint64_t a = (uint64_t)((o->t[i].N > o->t[i].M ? o->t[i].N : o->t[i].M) * o->t[i].R);
            if (a > need) need = a;
        }
        int rc = pt_gpu_pinned_alloc(rt->dev.gpu, (size_t)need * 4, (void **)&o->full, err, errlen);
        if (rc) return rc;
        o->full_floats = need;
        PT_LOGI(&rt->lg, "osft: mode C gathers each projection path's factors whole: %.2f MiB "
                         "pinned for the largest", need * 4 / 1048576.0);
    }
    pt_osft_split s = {.pf = pf, .pq = pq, .f = o->full, .q = o->full + nf, .c = c,
                       .gather = gather_cb, .sync = sync_cb, .user = rt};
    int rc = PT_OK;
    double t0 = pt_now_s();
    if (pf->split && rt->cfg.osft_cache_frozen) {
        rc = cached_frozen(rt, t, v, pf, &s.fz, err, errlen);
        o->gather_s += pt_now_s() - t0;
    }
    if (!rc) rc = pt_osft_split_path(L, t, v, &s, err, errlen);
    o->split_s += pt_now_s() - t0;
    return rc;
}

int pt_osft_project_params(pt_rt *rt, char *err, size_t errlen) {
    pt_osft *o = osft_of(rt);
    if (!o || !rt->st) return PT_OK;
    int64_t w = max_coef(o, INT32_MIN);
    if (!w) return PT_OK;
    float *c = NULL;
    int rc = pt_osft_scratch_get(rt, (uint64_t)w, &c, err, errlen);
    if (rc) return rc;
    lin L;
    pt_osft_lin_open(rt, &L);
    int any_host = 0, any_split = 0;
    /* every rank walks the targets and paths in the same order and takes the
     * same branches (one plan), so the gathers' collectives line up */
    for (int i = 0; i < o->n && !rc; i++) {
        const tgt *t = &o->t[i];
        for (int v = 0; v < 2 && t->k && !rc; v++) {
            float *fz, *tr;
            if (task_chunk(rt, t, v, &fz, &tr) >= 0) continue;   /* done in the CPU step */
            pt_store_part pf, pq;
            if ((rc = pt_store_param_part(rt->st, t->x[FZ[v]], &pf, err, errlen)) ||
                (rc = pt_store_param_part(rt->st, t->x[TR[v]], &pq, err, errlen)))
                break;
            if (pf.split || pq.split) {
                rc = project_split(rt, &L, t, v, &pf, &pq, c, err, errlen);
                any_split = 1;
                continue;
            }
            any_host |= !pf.on_device || !pq.on_device;
            project_path(&L, t, v, pf.p, pq.p, c);
        }
    }
    o->split_steps += any_split;
    pt_osft_scratch_free(rt, c);
    if (rc) {
        (void)pt_osft_lin_close(rt, &L, "osft: value projection", NULL, 0);
        return rc;
    }
    /* values in pinned host memory are uploaded by the next gather on another
     * stream: they must be final when this hook returns */
    if (any_host && !L.rc && L.ops->stream_sync(L.impl, rt->dev.s_compute)) L.rc = PT_ERR_BACKEND;
    return pt_osft_lin_close(rt, &L, "osft: value projection", err, errlen);
}
