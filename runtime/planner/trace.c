/*
 * trace.c — the pt_trace helpers of trace.h: allocation, copies (plain and
 * calibrated), the per-phase compute sums, the chunks' state formulas, and
 * pt_trace_validate, which every trace read from a file or built by a
 * synthesiser goes through before a model uses it.
 */
#include "trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "protrain.h"

uint64_t pt_trace_arch_hash(const char *description) {
    return pt_fnv1a64(description ? description : "", description ? strlen(description) : 0);
}

void pt_trace_init(pt_trace *t) { memset(t, 0, sizeof *t); }

void pt_trace_free(pt_trace *t) {
    if (!t) return;
    free(t->blocks);
    free(t->chunks);
    t->blocks = NULL;
    t->chunks = NULL;
    t->n_block = t->n_chunk = 0;
}

int pt_trace_alloc(pt_trace *t, int32_t n_block, int32_t n_chunk, char *err, size_t errlen) {
    if (n_block < 1 || n_block > PT_TRACE_MAX_BLOCKS || n_chunk < 1 ||
        n_chunk > PT_TRACE_MAX_CHUNKS)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: n_block=%d and n_chunk=%d must be in [1, %d] and [1, %d]", n_block,
                       n_chunk, PT_TRACE_MAX_BLOCKS, PT_TRACE_MAX_CHUNKS);
    pt_trace_block *b = calloc((size_t)n_block, sizeof *b);
    pt_trace_chunk *c = calloc((size_t)n_chunk, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "trace: cannot allocate %zu bytes for %d blocks and %d chunks",
                       (size_t)n_block * sizeof *b + (size_t)n_chunk * sizeof *c, n_block, n_chunk);
    }
    free(t->blocks);
    free(t->chunks);
    t->blocks = b;
    t->chunks = c;
    t->n_block = n_block;
    t->n_chunk = n_chunk;
    for (int32_t i = 0; i < n_block; i++) b[i].chunk_lo = b[i].chunk_hi = -1;
    return PT_OK;
}

int pt_trace_copy(pt_trace *dst, const pt_trace *src, char *err, size_t errlen) {
    pt_trace tmp = *src;
    tmp.blocks = NULL;
    tmp.chunks = NULL;
    int rc = pt_trace_alloc(&tmp, src->n_block, src->n_chunk, err, errlen);
    if (rc) return rc;
    memcpy(tmp.blocks, src->blocks, (size_t)src->n_block * sizeof *src->blocks);
    memcpy(tmp.chunks, src->chunks, (size_t)src->n_chunk * sizeof *src->chunks);
    pt_trace_free(dst);
    *dst = tmp;
    return PT_OK;
}

static double factor(double f) { return f > 0 ? f : 1.0; }

int pt_trace_calibrated(pt_trace *dst, const pt_trace *src, char *err, size_t errlen) {
    int rc = pt_trace_copy(dst, src, err, errlen);
    if (rc) return rc;
    double f = factor(src->calib.fwd), b = factor(src->calib.bwd), o = factor(src->calib.opt);
    dst->embed_fwd_s *= f;
    dst->head_fwd_s *= b;   /* the head and loss run inside the backward phase's turn */
    dst->head_bwd_s *= b;
    dst->embed_bwd_s *= b;
    for (int32_t k = 0; k < dst->n_block; k++) {
        dst->blocks[k].fwd_s *= f;
        dst->blocks[k].recompute_s *= f;
        dst->blocks[k].bwd_s *= b;
    }
    dst->hw.cpu_adam_elems_per_s /= o;
    dst->hw.dev_adam_elems_per_s /= o;
    dst->hw.dev_op_s *= o;
    dst->hw.dev_memset_Bps /= o;
    return PT_OK;
}

void pt_trace_phase_compute(const pt_trace *t, double *fwd, double *bwd) {
    double f = t->embed_fwd_s, b = t->head_fwd_s + t->head_bwd_s + t->embed_bwd_s;
    for (int32_t k = 0; k < t->n_block; k++) {
        f += t->blocks[k].fwd_s;
        b += t->blocks[k].bwd_s;
    }
    *fwd = f;
    *bwd = b;
}

void pt_trace_derive_ranges(pt_trace *t) {
    for (int32_t b = 0; b < t->n_block; b++) t->blocks[b].chunk_lo = t->blocks[b].chunk_hi = -1;
    for (int32_t k = 0; k < t->n_chunk; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        if (c->first_block < 0) continue;
        for (int32_t b = c->first_block; b <= c->last_block && b < t->n_block; b++) {
            pt_trace_block *B = &t->blocks[b];
            if (B->chunk_lo < 0 || k < B->chunk_lo) B->chunk_lo = k;
            if (k + 1 > B->chunk_hi) B->chunk_hi = k + 1;
        }
    }
}

static uint64_t dev_formula(const pt_trace *t, const pt_trace_chunk *c) {
    uint64_t per_tr = (uint64_t)t->grad_elem_bytes + t->master_elem_bytes + t->adam_m_elem_bytes +
                      t->adam_v_elem_bytes;
    return c->bytes + c->trainable_elems * per_tr + c->optim_bytes;
}

static uint64_t host_formula(const pt_trace *t, const pt_trace_chunk *c) {
    /* Decision 4: staged param (compute dtype) + fp32 grad + fp32 master + m + v
     * per trainable element; a frozen element needs only its staged param. */
    uint64_t per_tr = (uint64_t)t->host_grad_elem_bytes + 4u + t->adam_m_elem_bytes + t->adam_v_elem_bytes;
    return c->bytes + c->trainable_elems * per_tr + c->optim_bytes;
}

/* The exact figures are what the runtime allocated (profiler), so they win. */
uint64_t pt_trace_chunk_dev_state(const pt_trace *t, const pt_trace_chunk *c) {
    return c->dev_bytes ? c->dev_bytes : dev_formula(t, c);
}

uint64_t pt_trace_chunk_host_state(const pt_trace *t, const pt_trace_chunk *c) {
    return c->host_bytes ? c->host_bytes : host_formula(t, c);
}

/* An exact footprint must hold the params and stay within 2 x the formula +
 * 2048 (trace.h); anything else is a unit mix-up or corruption. */
static int exact_ok(uint64_t x, uint64_t bytes, uint64_t formula) {
    return x == 0 || (x >= bytes && x <= 2 * formula + 2048);
}

static int finite_nonneg(double x) { return isfinite(x) && x >= 0.0; }

/* The trace's header: sizes, key, element sizes, the non-block times. */
static int check_header(const pt_trace *t, char *err, size_t errlen) {
    if (!t || !t->blocks || !t->chunks)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: blocks or chunks array is NULL");
    if (t->n_block < 1 || t->n_block > PT_TRACE_MAX_BLOCKS || t->n_chunk < 1 ||
        t->n_chunk > PT_TRACE_MAX_CHUNKS)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: n_block=%d or n_chunk=%d out of range",
                       t->n_block, t->n_chunk);
    if (memchr(t->key.device, 0, sizeof t->key.device) == NULL)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: key.device is not NUL-terminated");
    if (t->key.world_size < 1 || t->key.batch < 0 || t->key.seq < 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: key world_size=%d batch=%lld seq=%lld invalid",
                       t->key.world_size, (long long)t->key.batch, (long long)t->key.seq);
    if (t->chunk_size == 0) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: chunk_size is 0");
    if (t->tp_size < 0 || (t->tp_size > 1 && t->key.world_size % t->tp_size))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: tp_size %d must be 0 or 1 (none) or divide world_size %d", t->tp_size,
                       t->key.world_size);
    if (t->param_elem_bytes < 1 || t->param_elem_bytes > 8 || t->grad_elem_bytes > 8 ||
        t->master_elem_bytes > 8 || t->adam_m_elem_bytes > 8 || t->adam_v_elem_bytes > 8 ||
        t->host_grad_elem_bytes > 8)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: per-element byte sizes (param %u grad %u master %u m %u v %u host grad %u) out of range",
                       t->param_elem_bytes, t->grad_elem_bytes, t->master_elem_bytes, t->adam_m_elem_bytes,
                       t->adam_v_elem_bytes, t->host_grad_elem_bytes);
    if (!finite_nonneg(t->embed_fwd_s) || !finite_nonneg(t->embed_bwd_s) || !finite_nonneg(t->head_fwd_s) ||
        !finite_nonneg(t->head_bwd_s))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: a non-block time is negative or not finite");
    return PT_OK;
}

/* The hardware rates, the calibration factors and the fragmentation figures. */
static int check_hw(const pt_trace *t, char *err, size_t errlen) {
    const pt_trace_hw *h = &t->hw;
    if (!(isfinite(h->h2d_Bps) && h->h2d_Bps > 0) || !(isfinite(h->d2h_Bps) && h->d2h_Bps > 0) ||
        !(isfinite(h->cpu_adam_elems_per_s) && h->cpu_adam_elems_per_s > 0) ||
        !(isfinite(h->dev_adam_elems_per_s) && h->dev_adam_elems_per_s > 0) || !finite_nonneg(h->allreduce_Bps) ||
        !finite_nonneg(h->allgather_Bps) || !finite_nonneg(h->reduce_scatter_Bps) ||
        !finite_nonneg(h->dev_op_s) || !finite_nonneg(h->dev_memset_Bps) ||
        !finite_nonneg(h->h2d_lat_s) || !finite_nonneg(h->d2h_lat_s) || !finite_nonneg(h->free_Bps) || !finite_nonneg(h->free_fwd_Bps))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: hw rates must be positive and finite (h2d %g d2h %g B/s, cpu adam %g, dev adam %g elem/s)",
                       h->h2d_Bps, h->d2h_Bps, h->cpu_adam_elems_per_s, h->dev_adam_elems_per_s);
    if (h->copy_engines != 1 && h->copy_engines != 2)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: hw.copy_engines=%d must be 1 or 2", h->copy_engines);
    const pt_trace_calib *cb = &t->calib;
    if (!finite_nonneg(cb->peak) || !finite_nonneg(cb->fwd) || !finite_nonneg(cb->bwd) ||
        !finite_nonneg(cb->opt))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: calibration factors must be finite and >= 0 (peak %g, fwd %g, bwd %g, "
                       "opt %g)",
                       cb->peak, cb->fwd, cb->bwd, cb->opt);
    const pt_trace_frag *fr = &t->frag;
    if (!(fr->factor == 0.0 || (isfinite(fr->factor) && fr->factor >= 1.0 && fr->factor <= 64.0)) ||
        fr->rounding_bytes > fr->peak_bytes || (fr->span_bytes && fr->span_bytes < fr->peak_bytes))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: fragmentation figures are inconsistent (factor %g must be 0 or in "
                       "[1, 64]; rounding %llu and span %llu against peak %llu bytes)",
                       fr->factor,
                       (unsigned long long)fr->rounding_bytes, (unsigned long long)fr->span_bytes,
                       (unsigned long long)fr->peak_bytes);
    return PT_OK;
}

/* Chunk k's own figures (its order among the others is the caller's). */
static int check_chunk(const pt_trace *t, int32_t k, char *err, size_t errlen) {
    const pt_trace_chunk *c = &t->chunks[k];
    if (c->trainable_elems > c->elems)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: chunk %d has trainable_elems %llu > elems %llu", k,
                       (unsigned long long)c->trainable_elems, (unsigned long long)c->elems);
    if (c->elems > (1ull << 48) || c->bytes > (1ull << 52))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: chunk %d has %llu elements / %llu bytes (limit 2^48 / 2^52)",
                       k, (unsigned long long)c->elems, (unsigned long long)c->bytes);
    if (!exact_ok(c->dev_bytes, c->bytes, dev_formula(t, c)))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d dev_bytes %llu is outside [bytes %llu, 2 x formula %llu + 2048] (0 = use the formula)",
                       k, (unsigned long long)c->dev_bytes, (unsigned long long)c->bytes,
                       (unsigned long long)dev_formula(t, c));
    if (!exact_ok(c->host_bytes, c->bytes, host_formula(t, c)))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d host_bytes %llu is outside [bytes %llu, 2 x formula %llu + 2048] (0 = use the formula)",
                       k, (unsigned long long)c->host_bytes, (unsigned long long)c->bytes,
                       (unsigned long long)host_formula(t, c));
    if (!finite_nonneg(c->optim_s))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d optim_s %g is not a finite number >= 0", k, c->optim_s);
    /* the split params' full shapes are P times their shards, which the
     * chunk's trainable elements hold; a factor side is at most
     * PT_REKLS_MAX_DIM = 8192, so 4 (m^2 + n^2) <= 2 * 8192 * 4 m n */
    uint64_t tpp = t->tp_size > 1 ? (uint64_t)t->tp_size : 0;
    if (c->tp_grad_bytes > 4 * tpp * c->trainable_elems ||
        c->tp_factor_bytes > 16384 * c->tp_grad_bytes)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d tensor-parallel gather bytes (gradient %llu, factors "
                       "%llu) do not fit tp_size %d and %llu trainable elements (both 0 "
                       "without tensor parallel)",
                       k, (unsigned long long)c->tp_grad_bytes,
                       (unsigned long long)c->tp_factor_bytes, t->tp_size,
                       (unsigned long long)c->trainable_elems);
    /* one param's state is part of the sum; the factors are part of the host bytes */
    if (c->optim_aux_words > (1ull << 48) || c->optim_mn > (1ull << 48) ||
        c->optim_own_max > c->optim_aux_words + 2 * c->optim_mn ||
        4 * c->optim_aux_words > (host_formula(t, c) > c->host_bytes ? host_formula(t, c)
                                                                     : c->host_bytes))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d REKLS words %llu / m n %llu / largest %llu are "
                       "inconsistent (the largest above the sum, or the factors above the "
                       "chunk's host bytes)",
                       k, (unsigned long long)c->optim_aux_words,
                       (unsigned long long)c->optim_mn, (unsigned long long)c->optim_own_max);
    if (c->first_block < -1 || c->last_block < c->first_block || c->last_block >= t->n_block ||
        (c->first_block == -1) != (c->last_block == -1))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: chunk %d block range [%d, %d] invalid for %d blocks",
                       k, c->first_block, c->last_block, t->n_block);
    if (c->first_block < 0 && !c->mandatory)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d uses no block but is not mandatory (non-block params stay persistent)", k);
    return PT_OK;
}

/* Block ranges must be what the chunks say (derive, then compare). */
static int check_ranges(const pt_trace *t, char *err, size_t errlen) {
    int32_t *rng = malloc((size_t)t->n_block * 2 * sizeof *rng);
    if (!rng) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "trace: cannot allocate the range check");
    for (int32_t b = 0; b < 2 * t->n_block; b++) rng[b] = -1;
    for (int32_t k = 0; k < t->n_chunk; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        for (int32_t b = c->first_block; b >= 0 && b <= c->last_block; b++) {
            if (rng[2 * b] < 0) rng[2 * b] = k;
            rng[2 * b + 1] = k + 1;
        }
    }
    for (int32_t b = 0; b < t->n_block; b++) {
        int32_t lo = rng[2 * b], hi = rng[2 * b + 1];
        if (t->blocks[b].chunk_lo != lo || t->blocks[b].chunk_hi != hi) {
            free(rng);
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "trace: block %d chunk range [%d, %d) differs from the chunks' [%d, %d) (call pt_trace_derive_ranges)",
                           b, t->blocks[b].chunk_lo, t->blocks[b].chunk_hi, lo, hi);
        }
    }
    free(rng);
    return PT_OK;
}

int pt_trace_validate(const pt_trace *t, char *err, size_t errlen) {
    int rc = check_header(t, err, errlen);
    if (!rc) rc = check_hw(t, err, errlen);
    if (rc) return rc;
    for (int32_t b = 0; b < t->n_block; b++) {
        const pt_trace_block *B = &t->blocks[b];
        if (!finite_nonneg(B->fwd_s) || !finite_nonneg(B->bwd_s) || !finite_nonneg(B->recompute_s))
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: block %d has a negative or non-finite time", b);
    }
    int32_t last_first = -1, last_last = -1;
    uint64_t max_stream = 0;
    for (int32_t k = 0; k < t->n_chunk; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        if ((rc = check_chunk(t, k, err, errlen))) return rc;
        if (c->mandatory) continue;
        if (c->first_block < last_first || c->last_block < last_last)
            return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                           "trace: chunk %d blocks [%d, %d] go backwards after [%d, %d]; chunks must be in execution order",
                           k, c->first_block, c->last_block, last_first, last_last);
        last_first = c->first_block;
        last_last = c->last_block;
        if (c->bytes > max_stream) max_stream = c->bytes;
    }
    if (t->slot_bytes < max_stream)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace: slot_bytes %llu cannot hold the largest streamed chunk (%llu bytes)",
                       (unsigned long long)t->slot_bytes, (unsigned long long)max_stream);
    return check_ranges(t, err, errlen);
}
