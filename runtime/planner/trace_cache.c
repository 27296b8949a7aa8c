/*
 * trace_cache.c — pt_trace helpers (trace.h) and the on-disk trace cache
 * (trace_cache.h). The reader trusts nothing: sizes are checked against the
 * file before anything is allocated, the payload checksum is verified, and the
 * decoded trace goes through pt_trace_validate.
 */
#include "trace_cache.h"
#include "protrain.h"
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_BLOCKS (1 << 20)
#define MAX_CHUNKS (1 << 24)
/* Encoded sizes (see the format in trace_cache.h). */
#define SCALAR_BYTES 296u
#define BLOCK_BYTES 72u
#define CHUNK_BYTES 108u

static const char MAGIC[8] = {'P', 'T', 'T', 'R', 'A', 'C', 'E', 0};


/* ---------------- trace helpers ---------------- */

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
    if (n_block < 1 || n_block > MAX_BLOCKS || n_chunk < 1 || n_chunk > MAX_CHUNKS)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                    "trace: n_block=%d and n_chunk=%d must be in [1, %d] and [1, %d]", n_block,
                    n_chunk, MAX_BLOCKS, MAX_CHUNKS);
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
    return c->bytes + c->trainable_elems * per_tr + c->rekls_bytes;
}

static uint64_t host_formula(const pt_trace *t, const pt_trace_chunk *c) {
    /* Decision 4: staged param (compute dtype) + fp32 grad + fp32 master + m + v
     * per trainable element; a frozen element needs only its staged param. */
    uint64_t per_tr = (uint64_t)t->host_grad_elem_bytes + 4u + t->adam_m_elem_bytes + t->adam_v_elem_bytes;
    return c->bytes + c->trainable_elems * per_tr + c->rekls_bytes;
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
    if (t->n_block < 1 || t->n_block > MAX_BLOCKS || t->n_chunk < 1 || t->n_chunk > MAX_CHUNKS)
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
                       "opt %g)", cb->peak, cb->fwd, cb->bwd, cb->opt);
    const pt_trace_frag *fr = &t->frag;
    if (!(fr->factor == 0.0 || (isfinite(fr->factor) && fr->factor >= 1.0 && fr->factor <= 64.0)) ||
        fr->rounding_bytes > fr->peak_bytes || (fr->span_bytes && fr->span_bytes < fr->peak_bytes))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: fragmentation figures are inconsistent (factor %g must be 0 or in "
                       "[1, 64]; rounding %llu and span %llu against peak %llu bytes)", fr->factor,
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
    if (!finite_nonneg(c->rekls_s))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d rekls_s %g is not a finite number >= 0", k, c->rekls_s);
    /* the split params' full shapes are P times their shards, which the
     * chunk's trainable elements hold; a factor side is at most
     * PT_REKLS_MAX_DIM = 8192, so 4 (m^2 + n^2) <= 2 * 8192 * 4 m n */
    uint64_t tpp = t->tp_size > 1 ? (uint64_t)t->tp_size : 0;
    if (c->tp_grad_bytes > 4 * tpp * c->trainable_elems ||
        c->tp_factor_bytes > 16384 * c->tp_grad_bytes)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d tensor-parallel gather bytes (gradient %llu, factors "
                       "%llu) do not fit tp_size %d and %llu trainable elements (both 0 "
                       "without tensor parallel)", k, (unsigned long long)c->tp_grad_bytes,
                       (unsigned long long)c->tp_factor_bytes, t->tp_size,
                       (unsigned long long)c->trainable_elems);
    /* one param's state is part of the sum; the factors are part of the host bytes */
    if (c->rekls_aux_words > (1ull << 48) || c->rekls_mn > (1ull << 48) ||
        c->rekls_own_max > c->rekls_aux_words + 2 * c->rekls_mn ||
        4 * c->rekls_aux_words > (host_formula(t, c) > c->host_bytes ? host_formula(t, c)
                                                                     : c->host_bytes))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "trace: chunk %d REKLS words %llu / m n %llu / largest %llu are "
                       "inconsistent (the largest above the sum, or the factors above the "
                       "chunk's host bytes)", k, (unsigned long long)c->rekls_aux_words,
                       (unsigned long long)c->rekls_mn, (unsigned long long)c->rekls_own_max);
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

/* ---------------- encoding ---------------- */

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} wbuf;

static void put(wbuf *w, const void *src, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 1024;
        while (nc < w->n + n) nc *= 2;
        unsigned char *q = realloc(w->p, nc);
        if (!q) {
            w->oom = 1;
            return;
        }
        w->p = q;
        w->cap = nc;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}

/* Explicit little-endian so the file is the same on any host: the low nb
 * bytes of v, lowest first. */
static void put_le(wbuf *w, uint64_t v, int nb) {
    unsigned char b[8];
    for (int i = 0; i < nb; i++) b[i] = (unsigned char)(v >> (8 * i));
    put(w, b, (size_t)nb);
}
static void put_u64(wbuf *w, uint64_t v) { put_le(w, v, 8); }
static void put_u32(wbuf *w, uint32_t v) { put_le(w, v, 4); }
static void put_i32(wbuf *w, int32_t v) { put_u32(w, (uint32_t)v); }
static void put_f64(wbuf *w, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    put_u64(w, v);
}

typedef struct rbuf {
    const unsigned char *p;
    size_t n, off;
    int bad;
} rbuf;

/* nb little-endian bytes; past the end: 0, and the buffer is marked bad. */
static uint64_t get_le(rbuf *r, int nb) {
    if (r->bad || r->n - r->off < (size_t)nb) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < nb; i++) v |= (uint64_t)r->p[r->off + i] << (8 * i);
    r->off += (size_t)nb;
    return v;
}
static uint64_t get_u64(rbuf *r) { return get_le(r, 8); }
static uint32_t get_u32(rbuf *r) { return (uint32_t)get_le(r, 4); }
static int32_t get_i32(rbuf *r) { return (int32_t)get_u32(r); }
static double get_f64(rbuf *r) {
    uint64_t v = get_u64(r);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

static void encode_payload(wbuf *w, const pt_trace *t) {
    put_i32(w, t->n_block);
    put_i32(w, t->n_chunk);
    put_u64(w, t->chunk_size);
    put_i32(w, t->tp_size);
    put_f64(w, t->embed_fwd_s);
    put_f64(w, t->embed_bwd_s);
    put_f64(w, t->head_fwd_s);
    put_f64(w, t->head_bwd_s);
    put_u64(w, t->nonblock_bytes);
    put_u64(w, t->nonblock_scratch_bytes);
    put_u32(w, t->param_elem_bytes);
    put_u32(w, t->grad_elem_bytes);
    put_u32(w, t->master_elem_bytes);
    put_u32(w, t->adam_m_elem_bytes);
    put_u32(w, t->adam_v_elem_bytes);
    put_u32(w, t->host_grad_elem_bytes);
    put_u64(w, t->slot_bytes);
    put_f64(w, t->hw.h2d_Bps);
    put_f64(w, t->hw.d2h_Bps);
    put_f64(w, t->hw.cpu_adam_elems_per_s);
    put_f64(w, t->hw.dev_adam_elems_per_s);
    put_f64(w, t->hw.allreduce_Bps);
    put_f64(w, t->hw.allgather_Bps);
    put_f64(w, t->hw.reduce_scatter_Bps);
    put_f64(w, t->hw.dev_op_s);
    put_f64(w, t->hw.dev_memset_Bps);
    put_f64(w, t->hw.h2d_lat_s);
    put_f64(w, t->hw.d2h_lat_s);
    put_f64(w, t->hw.free_Bps);
    put_f64(w, t->hw.free_fwd_Bps);
    put_i32(w, t->hw.copy_engines);
    put_u64(w, t->hw.host_ram_bytes);
    put_u64(w, t->hw.device_capacity);
    put_f64(w, t->calib.peak);
    put_f64(w, t->calib.fwd);
    put_f64(w, t->calib.bwd);
    put_f64(w, t->calib.opt);
    put_f64(w, t->frag.factor);
    put_u64(w, t->frag.peak_bytes);
    put_u64(w, t->frag.span_bytes);
    put_u64(w, t->frag.largest_free);
    put_u64(w, t->frag.rounding_bytes);
    for (int32_t b = 0; b < t->n_block; b++) {
        const pt_trace_block *B = &t->blocks[b];
        put_f64(w, B->fwd_s);
        put_f64(w, B->bwd_s);
        put_f64(w, B->recompute_s);
        put_u64(w, B->arena_bytes);
        put_u64(w, B->input_bytes);
        put_u64(w, B->fwd_scratch_bytes);
        put_u64(w, B->bwd_scratch_bytes);
        put_u64(w, B->grad_act_bytes);
        put_i32(w, B->chunk_lo);
        put_i32(w, B->chunk_hi);
    }
    for (int32_t k = 0; k < t->n_chunk; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        put_u64(w, c->bytes);
        put_u64(w, c->elems);
        put_u64(w, c->trainable_elems);
        put_i32(w, c->first_block);
        put_i32(w, c->last_block);
        put_i32(w, c->mandatory);
        put_u64(w, c->dev_bytes);
        put_u64(w, c->host_bytes);
        put_u64(w, c->rekls_bytes);
        put_f64(w, c->rekls_s);
        put_u64(w, c->tp_grad_bytes);
        put_u64(w, c->tp_factor_bytes);
        put_u64(w, c->rekls_aux_words);
        put_u64(w, c->rekls_mn);
        put_u64(w, c->rekls_own_max);
    }
}

/* Decode a payload whose size was already checked against n_block/n_chunk. */
static int decode_payload(rbuf *r, pt_trace *t, char *err, size_t errlen) {
    int32_t nb = get_i32(r), nc = get_i32(r);
    if (r->bad || nb < 1 || nb > MAX_BLOCKS || nc < 1 || nc > MAX_CHUNKS)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "block/chunk counts %d/%d out of range", nb, nc);
    if ((uint64_t)r->n != SCALAR_BYTES + (uint64_t)nb * BLOCK_BYTES + (uint64_t)nc * CHUNK_BYTES)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "payload of %zu bytes does not match %d blocks and %d chunks", r->n,
                    nb, nc);
    int rc = pt_trace_alloc(t, nb, nc, err, errlen);
    if (rc) return rc;
    t->chunk_size = get_u64(r);
    t->tp_size = get_i32(r);
    t->embed_fwd_s = get_f64(r);
    t->embed_bwd_s = get_f64(r);
    t->head_fwd_s = get_f64(r);
    t->head_bwd_s = get_f64(r);
    t->nonblock_bytes = get_u64(r);
    t->nonblock_scratch_bytes = get_u64(r);
    t->param_elem_bytes = get_u32(r);
    t->grad_elem_bytes = get_u32(r);
    t->master_elem_bytes = get_u32(r);
    t->adam_m_elem_bytes = get_u32(r);
    t->adam_v_elem_bytes = get_u32(r);
    t->host_grad_elem_bytes = get_u32(r);
    t->slot_bytes = get_u64(r);
    t->hw.h2d_Bps = get_f64(r);
    t->hw.d2h_Bps = get_f64(r);
    t->hw.cpu_adam_elems_per_s = get_f64(r);
    t->hw.dev_adam_elems_per_s = get_f64(r);
    t->hw.allreduce_Bps = get_f64(r);
    t->hw.allgather_Bps = get_f64(r);
    t->hw.reduce_scatter_Bps = get_f64(r);
    t->hw.dev_op_s = get_f64(r);
    t->hw.dev_memset_Bps = get_f64(r);
    t->hw.h2d_lat_s = get_f64(r);
    t->hw.d2h_lat_s = get_f64(r);
    t->hw.free_Bps = get_f64(r);
    t->hw.free_fwd_Bps = get_f64(r);
    t->hw.copy_engines = get_i32(r);
    t->hw.host_ram_bytes = get_u64(r);
    t->hw.device_capacity = get_u64(r);
    t->calib.peak = get_f64(r);
    t->calib.fwd = get_f64(r);
    t->calib.bwd = get_f64(r);
    t->calib.opt = get_f64(r);
    t->frag.factor = get_f64(r);
    t->frag.peak_bytes = get_u64(r);
    t->frag.span_bytes = get_u64(r);
    t->frag.largest_free = get_u64(r);
    t->frag.rounding_bytes = get_u64(r);
    for (int32_t b = 0; b < nb; b++) {
        pt_trace_block *B = &t->blocks[b];
        B->fwd_s = get_f64(r);
        B->bwd_s = get_f64(r);
        B->recompute_s = get_f64(r);
        B->arena_bytes = get_u64(r);
        B->input_bytes = get_u64(r);
        B->fwd_scratch_bytes = get_u64(r);
        B->bwd_scratch_bytes = get_u64(r);
        B->grad_act_bytes = get_u64(r);
        B->chunk_lo = get_i32(r);
        B->chunk_hi = get_i32(r);
    }
    for (int32_t k = 0; k < nc; k++) {
        pt_trace_chunk *c = &t->chunks[k];
        c->bytes = get_u64(r);
        c->elems = get_u64(r);
        c->trainable_elems = get_u64(r);
        c->first_block = get_i32(r);
        c->last_block = get_i32(r);
        c->mandatory = get_i32(r);
        c->dev_bytes = get_u64(r);
        c->host_bytes = get_u64(r);
        c->rekls_bytes = get_u64(r);
        c->rekls_s = get_f64(r);
        c->tp_grad_bytes = get_u64(r);
        c->tp_factor_bytes = get_u64(r);
        c->rekls_aux_words = get_u64(r);
        c->rekls_mn = get_u64(r);
        c->rekls_own_max = get_u64(r);
    }
    if (r->bad || r->off != r->n) return pt_fail(err, errlen, PT_ERR_FORMAT, "payload ends early or has trailing bytes");
    return PT_OK;
}

/* Device name bytes up to the NUL, zero-filled: stray bytes after it are not key. */
static void norm_device(char dst[64], const char *src) {
    size_t n = strnlen(src, 63);
    memset(dst, 0, 64);
    memcpy(dst, src, n);
}

static void encode_header(wbuf *w, const pt_trace_key *k, uint64_t payload_size, uint64_t sum) {
    char dev[64];
    norm_device(dev, k->device);
    put(w, MAGIC, 8);
    put_u32(w, PT_TRACE_FILE_VERSION);
    put_u32(w, PT_TRACE_HEADER_BYTES);
    put_u64(w, k->arch_hash);
    put_u64(w, (uint64_t)k->batch);
    put_u64(w, (uint64_t)k->seq);
    put_i32(w, k->world_size);
    put_u32(w, k->version);
    put(w, dev, 64);
    put_u64(w, payload_size);
    put_u64(w, sum);
}

/* Hash of the key fields (not of the struct bytes: padding is not data). */
static uint64_t key_hash(const pt_trace_key *k) {
    wbuf w = {0};
    put_u64(&w, k->arch_hash);
    put_u64(&w, (uint64_t)k->batch);
    put_u64(&w, (uint64_t)k->seq);
    put_i32(&w, k->world_size);
    put_u32(&w, k->version);
    char dev[64];
    norm_device(dev, k->device);
    put(&w, dev, 64);
    uint64_t h = w.oom ? 0 : pt_fnv1a64(w.p, w.n);
    free(w.p);
    return h;
}

static int key_equal(const pt_trace_key *a, const pt_trace_key *b) {
    return a->arch_hash == b->arch_hash && a->batch == b->batch && a->seq == b->seq &&
           a->world_size == b->world_size && a->version == b->version &&
           strncmp(a->device, b->device, sizeof a->device) == 0;
}

int pt_trace_cache_path(const char *dir, const pt_trace_key *key, char *buf, size_t len) {
    int n = snprintf(buf, len, "%s/%016llx.trace", dir && *dir ? dir : ".", (unsigned long long)key_hash(key));
    return (n < 0 || (size_t)n >= len) ? PT_ERR_INVALID_ARG : PT_OK;
}

int pt_trace_write_file(const char *path, const pt_trace *t, char *err, size_t errlen) {
    char verr[256];
    if (pt_trace_validate(t, verr, sizeof verr))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "refusing to write an invalid trace to %s: %s", path, verr);
    wbuf pay = {0}, all = {0};
    encode_payload(&pay, t);
    if (!pay.oom) {
        encode_header(&all, &t->key, pay.n, pt_fnv1a64(pay.p, pay.n));
        put(&all, pay.p, pay.n);
    }
    free(pay.p);
    if (pay.oom || all.oom) {
        free(all.p);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of memory encoding the trace for %s", path);
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        free(all.p);
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace path too long: %s", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        int e = errno;
        free(all.p);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot create %s: %s", tmp, strerror(e));
    }
    size_t off = 0;
    while (off < all.n) {
        ssize_t m = write(fd, all.p + off, all.n - off);
        if (m < 0 && errno == EINTR) continue;
        if (m <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            free(all.p);
            return pt_fail(err, errlen, PT_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
        }
        off += (size_t)m;
    }
    free(all.p);
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot flush %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    /* Make the rename itself durable. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        if (!*dir) strcpy(dir, "/");
    } else {
        strcpy(dir, ".");
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return PT_OK;
}

int pt_trace_read_file(const char *path, const pt_trace_key *expect, pt_trace *out, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return pt_fail(err, errlen, PT_ERR_IO, "cannot open trace %s: %s", path, strerror(errno));
    unsigned char hdr[PT_TRACE_HEADER_BYTES];
    size_t got = fread(hdr, 1, sizeof hdr, f);
    if (got != sizeof hdr) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is truncated: %zu of %u header bytes", path, got,
                    PT_TRACE_HEADER_BYTES);
    }
    rbuf r = {hdr, sizeof hdr, 0, 0};
    if (memcmp(hdr, MAGIC, 8) != 0) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s has a wrong magic (not a protrain trace)", path);
    }
    r.off = 8;
    uint32_t fver = get_u32(&r), hsize = get_u32(&r);
    pt_trace_key k;
    memset(&k, 0, sizeof k);
    k.arch_hash = get_u64(&r);
    k.batch = (int64_t)get_u64(&r);
    k.seq = (int64_t)get_u64(&r);
    k.world_size = get_i32(&r);
    k.version = get_u32(&r);
    memcpy(k.device, hdr + r.off, 64);
    r.off += 64;
    uint64_t psize = get_u64(&r), sum = get_u64(&r);
    if (fver != PT_TRACE_FILE_VERSION || hsize != PT_TRACE_HEADER_BYTES) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s has file format %u (header %u), this build reads %u", path,
                    fver, hsize, PT_TRACE_FILE_VERSION);
    }
    if (memchr(k.device, 0, sizeof k.device) == NULL) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s has an unterminated device name", path);
    }
    if (k.version != PT_TRACE_VERSION) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is trace version %u, this build wants %u", path, k.version,
                    PT_TRACE_VERSION);
    }
    if (expect && !key_equal(&k, expect)) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT,
                    "trace %s belongs to another key (arch %016llx batch %lld seq %lld device '%s' world %d)", path,
                    (unsigned long long)k.arch_hash, (long long)k.batch, (long long)k.seq, k.device, k.world_size);
    }
    /* Size check against the real file before allocating anything. */
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 ||
        (uint64_t)st.st_size != (uint64_t)PT_TRACE_HEADER_BYTES + psize ||
        psize > SCALAR_BYTES + (uint64_t)MAX_BLOCKS * BLOCK_BYTES + (uint64_t)MAX_CHUNKS * CHUNK_BYTES) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is truncated or oversized: header says %llu payload bytes, file has %lld",
                    path, (unsigned long long)psize, (long long)st.st_size - PT_TRACE_HEADER_BYTES);
    }
    unsigned char *pay = malloc(psize ? psize : 1);
    if (!pay) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "cannot allocate %llu bytes to read %s", (unsigned long long)psize, path);
    }
    got = fread(pay, 1, psize, f);
    fclose(f);
    if (got != psize) {
        free(pay);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is truncated: %zu of %llu payload bytes", path, got,
                    (unsigned long long)psize);
    }
    if (pt_fnv1a64(pay, psize) != sum) {
        free(pay);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is corrupt: payload checksum mismatch", path);
    }
    pt_trace t;
    pt_trace_init(&t);
    t.key = k;
    rbuf pr = {pay, psize, 0, 0};
    char derr[256];
    int rc = decode_payload(&pr, &t, derr, sizeof derr);
    free(pay);
    if (!rc) rc = pt_trace_validate(&t, derr, sizeof derr);
    if (rc) {
        pt_trace_free(&t);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is corrupt: %s", path, derr);
    }
    pt_trace_free(out);
    *out = t;
    return PT_OK;
}

int pt_trace_cache_store(const char *dir, const pt_trace *t, char *err, size_t errlen) {
    if (!dir || !*dir) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace cache: no cache directory given");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pt_fail(err, errlen, PT_ERR_IO, "trace cache: cannot create directory %s: %s", dir, strerror(errno));
    char path[4096];
    if (pt_trace_cache_path(dir, &t->key, path, sizeof path))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace cache: directory path too long: %s", dir);
    return pt_trace_write_file(path, t, err, errlen);
}

int pt_trace_cache_load(const char *dir, const pt_trace_key *key, pt_trace *out, char *warn, size_t warnlen) {
    if (warn && warnlen) warn[0] = 0;
    char path[4096];
    if (!dir || !*dir || pt_trace_cache_path(dir, key, path, sizeof path)) {
        pt_fail(warn, warnlen, 0, "trace cache: directory missing or path too long; profiling");
        return PT_CACHE_MISS;
    }
    if (access(path, F_OK) != 0) return PT_CACHE_MISS;   /* clean miss */
    char e[512];
    int rc = pt_trace_read_file(path, key, out, e, sizeof e);
    if (rc) {
        pt_fail(warn, warnlen, 0, "trace cache: ignoring %s", e);
        return PT_CACHE_MISS;
    }
    return PT_CACHE_HIT;
}
