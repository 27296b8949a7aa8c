/*
 * model_shape.c — the model-shape synthesiser of ds_estimates.h: checks a
 * transformer's shape (pt_model_shape), counts its parameters, picks a chunk
 * size and builds the trace the planner would measure for it, so the planner
 * and the DeepSpeed comparison run on a model that is described, not loaded.
 */
#include "ds_estimates.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protrain.h"

#define MIB_U 1048576ull

static int shape_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int64_t dsize(int32_t dt) { return dt == PT_F32 ? 4 : 2; }

int pt_shape_check(pt_model_shape *m, char *err, size_t errlen) {
    if (m->arch != PT_ARCH_GPT && m->arch != PT_ARCH_LLAMA) return shape_fail(err, errlen, "model: arch must be gpt or llama");
    if (m->layers < 1 || m->layers > 100000) return shape_fail(err, errlen, "model: layers=%lld must be in [1, 100000]", (long long)m->layers);
    if (m->hidden < 1 || m->heads < 1 || m->hidden % m->heads)
        return shape_fail(err, errlen, "model: hidden=%lld must be a positive multiple of heads=%lld", (long long)m->hidden,
                          (long long)m->heads);
    if (m->kv_heads == 0) m->kv_heads = m->heads;
    if (m->kv_heads < 1 || m->heads % m->kv_heads)
        return shape_fail(err, errlen, "model: heads=%lld must be a multiple of kv_heads=%lld", (long long)m->heads,
                          (long long)m->kv_heads);
    if (m->ffn == 0) m->ffn = m->arch == PT_ARCH_GPT ? 4 * m->hidden : ((8 * m->hidden / 3 + 255) / 256) * 256;
    if (m->positions < 0) return shape_fail(err, errlen, "model: positions=%lld must be >= 0", (long long)m->positions);
    if (m->ffn < 1) return shape_fail(err, errlen, "model: ffn=%lld must be positive", (long long)m->ffn);
    if (m->vocab < 1 || m->seq < 1 || m->batch < 1)
        return shape_fail(err, errlen, "model: vocab=%lld, seq=%lld and batch=%lld must be positive", (long long)m->vocab,
                          (long long)m->seq, (long long)m->batch);
    if (m->dtype != PT_F32 && m->dtype != PT_BF16 && m->dtype != PT_F16)
        return shape_fail(err, errlen, "model: dtype must be fp32, bf16 or fp16");
    if (!(m->trainable_fraction > 0 && m->trainable_fraction <= 1))
        return shape_fail(err, errlen, "model: trainable_fraction=%g must be in (0, 1]", m->trainable_fraction);
    double p = (double)m->layers * (double)m->hidden * (double)(m->hidden + m->ffn) * 12.0;
    if (p > 1e15 || (double)m->seq * m->batch * m->hidden > 1e15)
        return shape_fail(err, errlen, "model: sizes are too large to plan");
    return 0;
}

/* One parameter tensor in execution order: elems, owning block (-1 = non-block),
 * module id (tensors of one module share it, for Lmax). */
typedef struct tens {
    int64_t elems;
    int32_t block;
    int32_t module;
} tens;

/* All tensors in execution order; *n set. Caller frees. */
static tens *tensor_list(const pt_model_shape *m, int64_t *n) {
    int64_t h = m->hidden, f = m->ffn, V = m->vocab, kvh = h / m->heads * m->kv_heads, L = m->layers;
    int per = m->arch == PT_ARCH_GPT ? 12 : 9;
    tens *t = malloc((size_t)(L * per + 8) * sizeof *t);
    if (!t) return NULL;
    int64_t k = 0;
    int32_t mod = 0;
#define T(e, b) (t[k++] = (tens){(e), (b), mod})
    T(V * h, -1);   /* token embedding (also the head when tied) */
    mod++;
    if (m->arch == PT_ARCH_GPT) {
        T((m->positions > 0 ? m->positions : m->seq) * h, -1);   /* learned positions */
        mod++;
    }
    for (int32_t b = 0; b < L; b++) {
        if (m->arch == PT_ARCH_GPT) {
            T(h, b);
            T(h, b);
            mod++;                    /* ln1 */
            T(3 * h * h, b);
            T(3 * h, b);
            mod++;        /* qkv */
            T(h * h, b);
            T(h, b);
            mod++;                /* attention projection */
            T(h, b);
            T(h, b);
            mod++;                    /* ln2 */
            T(f * h, b);
            T(f, b);
            mod++;                /* fc */
            T(h * f, b);
            T(h, b);
            mod++;                /* fc projection */
        } else {
            T(h, b);
            mod++;                             /* attention norm */
            T(h * h, b);
            mod++;                         /* q */
            T(kvh * h, b);
            mod++;                       /* k */
            T(kvh * h, b);
            mod++;                       /* v */
            T(h * h, b);
            mod++;                         /* o */
            T(h, b);
            mod++;                             /* mlp norm */
            T(f * h, b);
            mod++;                         /* gate */
            T(f * h, b);
            mod++;                         /* up */
            T(h * f, b);
            mod++;                         /* down */
        }
    }
    T(h, -1);                                           /* final norm */
    if (m->arch == PT_ARCH_GPT) T(h, -1);
    mod++;
    if (!m->tied) T(V * h, -1);                         /* untied head */
#undef T
    *n = k;
    return t;
}

void pt_shape_count(const pt_model_shape *m, int64_t *params, int64_t *largest, int64_t *per_block) {
    int64_t n = 0, P = 0, Lm = 0, pb = 0, cur = 0;
    int32_t curmod = -1;
    tens *t = tensor_list(m, &n);
    for (int64_t i = 0; t && i < n; i++) {
        P += t[i].elems;
        if (t[i].block == 0) pb += t[i].elems;
        if (t[i].module != curmod) {
            curmod = t[i].module;
            cur = 0;
        }
        cur += t[i].elems;
        if (cur > Lm) Lm = cur;
    }
    free(t);
    if (params) *params = P;
    if (largest) *largest = Lm;
    if (per_block) *per_block = pb;
}

/* Seal-before-block packing at tensor granularity. Returns the chunk count and
 * the slack of every chunk but the last (oversized chunks count 0); fills
 * chunks when out != NULL (sized by a first counting call). */
static int64_t pack(const tens *t, int64_t n, int64_t L, uint64_t S, int64_t esz, double tf, pt_trace_chunk *out,
                    uint64_t *waste) {
    int64_t nc = 0;
    uint64_t used = 0, slack = 0, last_slack = 0;
    int open = 0, cur_nb = 0;   /* cur_nb: the open chunk holds non-block params */
    pt_trace_chunk cur = {0};
#define SEAL() \
    do { \
        if (open) { \
            if (out) out[nc] = cur; \
            nc++; \
            last_slack = S > used ? S - used : 0; \
            slack += last_slack; \
            open = 0; \
        } \
    } while (0)
    for (int64_t i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)t[i].elems * (uint64_t)esz;
        int nb = t[i].block < 0;
        if (i == 0 || t[i].block != t[i - 1].block) {
            /* New block (or block <-> non-block boundary): seal unless the whole
             * block fits in what is left; never mix block and non-block params. */
            uint64_t group = 0;
            for (int64_t j = i; j < n && t[j].block == t[i].block; j++) group += (uint64_t)t[j].elems * esz;
            if (open && (nb != cur_nb || nb || used + group > S)) SEAL();
        }
        if (bytes > S) {   /* oversized tensor: a chunk of its exact size */
            SEAL();
            pt_trace_chunk c = {.bytes = bytes, .elems = (uint64_t)t[i].elems, .first_block = t[i].block, .last_block = t[i].block, .mandatory = nb};
            c.trainable_elems = (uint64_t)llround(tf * (double)t[i].elems);
            if (out) out[nc] = c;
            nc++;
            last_slack = 0;
            continue;
        }
        if (open && used + bytes > S) SEAL();
        if (!open) {
            memset(&cur, 0, sizeof cur);
            cur.first_block = t[i].block;
            cur.mandatory = nb;
            used = 0;
            open = 1;
            cur_nb = nb;
        }
        used += bytes;
        cur.bytes += bytes;
        cur.elems += (uint64_t)t[i].elems;
        cur.trainable_elems = (uint64_t)llround(tf * (double)cur.elems);
        cur.last_block = t[i].block;
    }
    SEAL();
#undef SEAL
    (void)L;
    if (waste) *waste = slack - last_slack;
    return nc;
}

uint64_t pt_shape_chunk_size(const pt_model_shape *m) {
    static const uint64_t grid[] = {32, 64, 128, 256, 512};
    int64_t n = 0;
    tens *t = tensor_list(m, &n);
    if (!t) return 64 * MIB_U;
    uint64_t best = grid[0] * MIB_U, best_w = UINT64_MAX;
    for (size_t i = 0; i < sizeof grid / sizeof grid[0]; i++) {
        uint64_t w = 0;
        pack(t, n, m->layers, grid[i] * MIB_U, dsize(m->dtype), 1.0, NULL, &w);
        if (w < best_w) {   /* strict: ties keep the smaller size */
            best_w = w;
            best = grid[i] * MIB_U;
        }
    }
    free(t);
    return best;
}

int pt_shape_trace(const pt_model_shape *m0, const pt_hw_shape *hw, uint64_t S, pt_trace *out, char *err,
                   size_t errlen) {
    pt_model_shape m = *m0;
    if (pt_shape_check(&m, err, errlen)) return PT_ERR_INVALID_ARG;
    if (!(hw->h2d_Bps > 0 && hw->d2h_Bps > 0 && hw->cpu_adam_elems_per_s > 0 && hw->dev_adam_elems_per_s > 0 &&
          hw->flops > 0) ||
        hw->device_bytes == 0 || hw->world_size < 1 || (hw->copy_engines != 1 && hw->copy_engines != 2)) {
        shape_fail(err, errlen,
                   "hw: device memory, PCIe bandwidth, CPU/device Adam rates and TFLOPS must be positive, copy_engines 1 or 2, world_size >= 1");
        return PT_ERR_INVALID_ARG;
    }
    if (S == 0) S = pt_shape_chunk_size(&m);
    int64_t n = 0, esz = dsize(m.dtype);
    tens *t = tensor_list(&m, &n);
    if (!t) return shape_fail(err, errlen, "model: out of memory"), PT_ERR_HOST_OOM;
    int64_t nc = pack(t, n, m.layers, S, esz, m.trainable_fraction, NULL, NULL);
    int rc = pt_trace_alloc(out, (int32_t)m.layers, (int32_t)nc, err, errlen);
    if (rc) {
        free(t);
        return rc;
    }
    pack(t, n, m.layers, S, esz, m.trainable_fraction, out->chunks, NULL);
    free(t);
    pt_trace_derive_ranges(out);

    int64_t P = 0, pb = 0;
    pt_shape_count(&m, &P, NULL, &pb);
    double h = (double)m.hidden, f = (double)m.ffn, a = (double)m.heads, s = (double)m.seq, B = (double)m.batch;
    double kvh = h / a * (double)m.kv_heads, V = (double)m.vocab, p = (double)esz, sbh = s * B * h;
    double tok = s * B, F = hw->flops;
    /* Saved activations per layer in 16-bit bytes (Korthikanti et al. 2022; the
     * family of published activation estimates): GPT 18sbh + 4sbf + 5as^2b (= sbh(34 + 5as/h)
     * for f = 4h); Llama (no dropout, SwiGLU, GQA) 12sbh + 4sb*kvh + 8sbf +
     * 4as^2b. Flash attention drops the s^2 terms. Scaled by p/2 for fp32. The
     * block input (2sbh of it) is kept by the host outside the arena. */
    double act = m.arch == PT_ARCH_GPT ? 18 * sbh + 4 * s * B * f + (m.flash_attn ? 0 : 5 * a * s * s * B)
                                       : 12 * sbh + 4 * s * B * kvh + 8 * s * B * f + (m.flash_attn ? 0 : 4 * a * s * s * B);
    act *= p / 2;
    double in = sbh * p;
    double fwd = (2.0 * (double)pb * tok + 4.0 * B * s * s * h) / F;
    for (int32_t b = 0; b < out->n_block; b++) {
        pt_trace_block *T = &out->blocks[b];
        T->fwd_s = fwd;
        T->bwd_s = 2 * fwd;
        T->recompute_s = fwd;
        T->arena_bytes = (uint64_t)(act - in);
        T->input_bytes = (uint64_t)in;
        /* transients (estimates): forward temporaries of the widest layer;
         * backward gradients of the widest intermediates (+ attention probs). */
        T->fwd_scratch_bytes = (uint64_t)(s * B * (f > 3 * h ? f : 3 * h) * p);
        T->bwd_scratch_bytes = (uint64_t)(2 * s * B * (f > 3 * h ? f : 3 * h) * p + (m.flash_attn ? 0 : a * s * s * B * p));
        T->grad_act_bytes = (uint64_t)(2 * in);
    }
    /* Non-block: embedding is memory-bound (~1 TB/s), head matmul 2Vh per token. */
    out->embed_fwd_s = out->embed_bwd_s = tok * h * p / 1e12;
    out->head_fwd_s = 2 * V * h * tok / F;
    out->head_bwd_s = 2 * out->head_fwd_s;
    out->nonblock_bytes = (uint64_t)(2 * tok * 4 + tok * V * 4 + 2 * sbh * p);  /* tokens+targets, fp32 logits, final hidden */
    out->nonblock_scratch_bytes = (uint64_t)(tok * V * 4);                      /* dlogits */
    out->chunk_size = S;
    out->param_elem_bytes = (uint32_t)esz;
    out->grad_elem_bytes = (uint32_t)esz;
    out->master_elem_bytes = m.dtype == PT_F32 ? 0 : 4;
    out->adam_m_elem_bytes = out->adam_v_elem_bytes = 4;
    out->host_grad_elem_bytes = 4;
    uint64_t big = S;
    for (int32_t k = 0; k < out->n_chunk; k++)
        if (!out->chunks[k].mandatory && out->chunks[k].bytes > big) big = out->chunks[k].bytes;
    out->slot_bytes = 2 * big;   /* params + grads of the largest streamed chunk */
    out->hw.h2d_Bps = hw->h2d_Bps;
    out->hw.d2h_Bps = hw->d2h_Bps;
    out->hw.cpu_adam_elems_per_s = hw->cpu_adam_elems_per_s;
    out->hw.dev_adam_elems_per_s = hw->dev_adam_elems_per_s;
    out->hw.allreduce_Bps = hw->allreduce_Bps;
    out->hw.allgather_Bps = hw->allgather_Bps;
    out->hw.reduce_scatter_Bps = hw->reduce_scatter_Bps;
    out->hw.copy_engines = hw->copy_engines;
    out->hw.host_ram_bytes = hw->host_ram_bytes;
    out->hw.device_capacity = hw->device_bytes;
    char desc[256];
    snprintf(desc, sizeof desc, "%s L%lld h%lld a%lld kv%lld f%lld V%lld pos%lld dt%d tied%d flash%d tf%.6g",
             m.arch == PT_ARCH_GPT ? "gpt" : "llama", (long long)m.layers, (long long)m.hidden, (long long)m.heads,
             (long long)m.kv_heads, (long long)m.ffn, (long long)m.vocab, (long long)m.positions, m.dtype, m.tied,
             m.flash_attn,
             m.trainable_fraction);
    out->key.arch_hash = pt_trace_arch_hash(desc);
    out->key.batch = m.batch;
    out->key.seq = m.seq;
    out->key.world_size = hw->world_size;
    out->key.version = PT_TRACE_VERSION;
    snprintf(out->key.device, sizeof out->key.device, "%s", hw->device[0] ? hw->device : "synthetic");
    return pt_trace_validate(out, err, errlen);
}
