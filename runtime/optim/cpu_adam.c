/*
 * cpu_adam.c — CPU AdamW and dtype converters with run-time ISA dispatch
 * (see cpu_adam.h for the contract).
 *
 * Three implementations of each kernel: scalar (the reference: it calls the
 * shared element bodies of gpu/kernels_hd.h directly), AVX2+F16C (8 lanes) and
 * AVX-512F (16 lanes). Vector paths process whole vectors and hand the tail
 * (< one vector) to the scalar kernel, so every element is computed either by
 * pt_adamw_elem itself or by the same IEEE operations in the same order.
 *
 * The per-element AdamW sequence, identical in all paths (kernels_hd.h):
 *   g  = g * grad_scale
 *   m' = (b1*m) + ((1-b1)*g)
 *   v' = (b2*v) + (((1-b2)*g)*g)
 *   p' = (p - (lrwd*p)) - ((step_size*m') / ((sqrt(v')*bc2_rsqrt) + eps))
 * mul/add/sub/div/sqrt are correctly rounded in SSE/AVX/AVX-512 exactly as
 * in scalar SSE, so the lanes equal the scalar results bit for bit. Neither
 * vector target enables FMA, so no contraction can happen even if the build
 * flags changed.
 */
#include "cpu_adam.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "protrain.h"
#include "pt_util.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define PT_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define PT_X86 0
#endif

#define ODT_NONE (-1) /* "no output copy" in the kernels' out-dtype argument */

/* ======================= scalar reference kernels ======================= */

static void adam_scalar(const pt_adamw_consts *c, float *p, const void *g, int gdt, float *m, float *v,
                        void *out, int odt, size_t b, size_t e) {
    for (size_t i = b; i < e; i++) {
        float pn = pt_adamw_elem(c, p[i], pt_load_elem(g, gdt, i), &m[i], &v[i]);
        p[i] = pn;
        if (odt != ODT_NONE) pt_store_elem(out, odt, i, pn);
    }
}

static void to_bf16_scalar(uint16_t *d, const float *s, size_t b, size_t e) {
    for (size_t i = b; i < e; i++) d[i] = pt_f32_to_bf16(s[i]);
}
static void from_bf16_scalar(float *d, const uint16_t *s, size_t b, size_t e) {
    for (size_t i = b; i < e; i++) d[i] = pt_bf16_to_f32(s[i]);
}
static void to_f16_scalar(uint16_t *d, const float *s, size_t b, size_t e) {
    for (size_t i = b; i < e; i++) d[i] = pt_f32_to_f16(s[i]);
}
static void from_f16_scalar(float *d, const uint16_t *s, size_t b, size_t e) {
    for (size_t i = b; i < e; i++) d[i] = pt_f16_to_f32(s[i]);
}

#if PT_X86
/* ============================ AVX2 + F16C =============================== */
#define A2 __attribute__((target("avx2,f16c")))
#define A2I __attribute__((target("avx2,f16c"), always_inline)) static inline

A2I __m256i a2_i(uint32_t x) { return _mm256_set1_epi32((int)x); }

/* 8 x u32 (each <= 0xffff) -> 8 x u16 in order. packus works per 128-bit
 * half, so pack the two halves against each other. */
A2I __m128i a2_pack(__m256i r) {
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* Lanes whose fp32 bits u are NaN: (u & 0x7fffffff) > 0x7f800000 (signed
 * compare is fine: both sides are non-negative as int32). */
A2I __m256i a2_isnan32(__m256i u) {
    return _mm256_cmpgt_epi32(_mm256_and_si256(u, a2_i(0x7fffffffu)), a2_i(0x7f800000u));
}

/* pt_bf16_to_f32 on 8 lanes: the bits become the top half of an fp32. */
A2I __m256 a2_from_bf16(const uint16_t *s) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

/* pt_f16_to_f32 on 8 lanes. vcvtph2ps is exact for every non-NaN half
 * (subnormals included) but quiets signalling NaNs, while the scalar body
 * keeps the payload: NaN lanes get sign<<16 | 0x7f800000 | mant<<13. */
A2I __m256 a2_from_f16(const uint16_t *s) {
    __m128i h = _mm_loadu_si128((const __m128i *)s);
    __m256 f = _mm256_cvtph_ps(h);
    __m256i u = _mm256_cvtepu16_epi32(h);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, a2_i(0x7fffu)), a2_i(0x7c00u));
    __m256i bits = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(u, a2_i(0x8000u)), 16),
                                   _mm256_or_si256(a2_i(0x7f800000u),
                                                   _mm256_slli_epi32(_mm256_and_si256(u, a2_i(0x3ffu)), 13)));
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
}

/* pt_f32_to_bf16 on 8 lanes: (u + 0x7fff + ((u >> 16) & 1)) >> 16, i.e.
 * round to nearest even on the dropped 16 bits; NaN -> (u >> 16) | 0x40.
 * The add cannot wrap for non-NaN u (max 0xff800000 + 0x8000). */
A2I __m128i a2_to_bf16(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, a2_i(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, a2_i(0x7fffu)), lsb), 16);
    __m256i q = _mm256_or_si256(hi, a2_i(0x40u));
    return a2_pack(_mm256_blendv_epi8(r, q, a2_isnan32(u)));
}

/* pt_f32_to_f16 on 8 lanes. vcvtps2ph with round-to-nearest-even matches the
 * scalar body on every non-NaN input (overflow at >= 65520 to inf, subnormal
 * rounding, fp32 subnormals to +-0); for NaN the scalar returns the canonical
 * sign|0x7e00 while hardware keeps payload bits, so those lanes are patched. */
A2I __m128i a2_to_f16(__m256 x) {
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    __m256i u = _mm256_castps_si256(x);
    __m256i nan = a2_isnan32(u);
    __m128i q = a2_pack(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), a2_i(0x8000u)),
                                        a2_i(0x7e00u)));
    /* 0 / -1 lanes pack (signed saturation) to 0x0000 / 0xffff byte masks. */
    __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    return _mm_blendv_epi8(h, q, nan16);
}

/* The AdamW body, instantiated per (grad dtype, out dtype) so the dtype
 * tests fold away. Whole vectors here; the tail goes to the scalar body. */
A2I void a2_body(const pt_adamw_consts *c, float *p, const void *g, int gdt, float *m, float *v,
                 void *out, int odt, size_t b, size_t e) {
    const __m256 b1 = _mm256_set1_ps(c->b1), omb1 = _mm256_set1_ps(c->one_minus_b1);
    const __m256 b2 = _mm256_set1_ps(c->b2), omb2 = _mm256_set1_ps(c->one_minus_b2);
    const __m256 lrwd = _mm256_set1_ps(c->lrwd), step = _mm256_set1_ps(c->step_size);
    const __m256 bc2r = _mm256_set1_ps(c->bc2_rsqrt), eps = _mm256_set1_ps(c->eps);
    const __m256 gs = _mm256_set1_ps(c->grad_scale);
    size_t i = b;
    for (; e - i >= 8; i += 8) {
        __m256 gg = gdt == PT_F32    ? _mm256_loadu_ps((const float *)g + i)
                    : gdt == PT_BF16 ? a2_from_bf16((const uint16_t *)g + i)
                                     : a2_from_f16((const uint16_t *)g + i);
        gg = _mm256_mul_ps(gg, gs);
        __m256 mm = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, gg));
        __m256 vv = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(_mm256_mul_ps(omb2, gg), gg));
        __m256 p0 = _mm256_loadu_ps(p + i);
        __m256 pp = _mm256_sub_ps(p0, _mm256_mul_ps(lrwd, p0));
        __m256 den = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vv), bc2r), eps);
        pp = _mm256_sub_ps(pp, _mm256_div_ps(_mm256_mul_ps(step, mm), den));
        _mm256_storeu_ps(m + i, mm);
        _mm256_storeu_ps(v + i, vv);
        _mm256_storeu_ps(p + i, pp);
        if (odt == PT_F32) _mm256_storeu_ps((float *)out + i, pp);
        else if (odt == PT_BF16) _mm_storeu_si128((__m128i *)((uint16_t *)out + i), a2_to_bf16(pp));
        else if (odt == PT_F16) _mm_storeu_si128((__m128i *)((uint16_t *)out + i), a2_to_f16(pp));
    }
    adam_scalar(c, p, g, gdt, m, v, out, odt, i, e);
}

/* case label for (grad dtype G in 0..2, out dtype O in -1..2) */
#define ADAM_CASE(BODY, G, O) \
    case (G) * 4 + (O) + 1: BODY(c, p, g, G, m, v, out, O, b, e); return;
#define ADAM_CASES(BODY, G) \
    ADAM_CASE(BODY, G, ODT_NONE) \
    ADAM_CASE(BODY, G, PT_F32) \
    ADAM_CASE(BODY, G, PT_BF16) \
    ADAM_CASE(BODY, G, PT_F16)

A2 static void adam_avx2(const pt_adamw_consts *c, float *p, const void *g, int gdt, float *m, float *v,
                         void *out, int odt, size_t b, size_t e) {
    switch (gdt * 4 + odt + 1) {
        ADAM_CASES(a2_body, PT_F32)
        ADAM_CASES(a2_body, PT_BF16)
        ADAM_CASES(a2_body, PT_F16)
    default: adam_scalar(c, p, g, gdt, m, v, out, odt, b, e); /* unreachable after check */
    }
}

A2 static void to_bf16_avx2(uint16_t *d, const float *s, size_t b, size_t e) {
    size_t i = b;
    for (; e - i >= 8; i += 8) _mm_storeu_si128((__m128i *)(d + i), a2_to_bf16(_mm256_loadu_ps(s + i)));
    to_bf16_scalar(d, s, i, e);
}
A2 static void from_bf16_avx2(float *d, const uint16_t *s, size_t b, size_t e) {
    size_t i = b;
    for (; e - i >= 8; i += 8) _mm256_storeu_ps(d + i, a2_from_bf16(s + i));
    from_bf16_scalar(d, s, i, e);
}
A2 static void to_f16_avx2(uint16_t *d, const float *s, size_t b, size_t e) {
    size_t i = b;
    for (; e - i >= 8; i += 8) _mm_storeu_si128((__m128i *)(d + i), a2_to_f16(_mm256_loadu_ps(s + i)));
    to_f16_scalar(d, s, i, e);
}
A2 static void from_f16_avx2(float *d, const uint16_t *s, size_t b, size_t e) {
    size_t i = b;
    for (; e - i >= 8; i += 8) _mm256_storeu_ps(d + i, a2_from_f16(s + i));
    from_f16_scalar(d, s, i, e);
}

/* ============================== AVX-512F ================================ */
/* Same math on 16 lanes. Only AVX-512F instructions are used (no BW/VL):
 * 16-bit data is widened to / narrowed from 32-bit lanes (vpmovzxwd /
 * vpmovdw) and NaN patches are done on 32-bit lanes under a k-mask. */
#define A5 __attribute__((target("avx512f")))
#define A5I __attribute__((target("avx512f"), always_inline)) static inline

A5I __m512i a5_i(uint32_t x) { return _mm512_set1_epi32((int)x); }

A5I __mmask16 a5_isnan32(__m512i u) {
    return _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, a5_i(0x7fffffffu)), a5_i(0x7f800000u));
}

A5I __m512 a5_from_bf16(const uint16_t *s) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

A5I __m512 a5_from_f16(const uint16_t *s) {
    __m256i h = _mm256_loadu_si256((const __m256i *)s);
    __m512 f = _mm512_cvtph_ps(h);
    __m512i u = _mm512_cvtepu16_epi32(h);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, a5_i(0x7fffu)), a5_i(0x7c00u));
    __m512i bits = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(u, a5_i(0x8000u)), 16),
                                   _mm512_or_si512(a5_i(0x7f800000u),
                                                   _mm512_slli_epi32(_mm512_and_si512(u, a5_i(0x3ffu)), 13)));
    return _mm512_mask_blend_ps(nan, f, _mm512_castsi512_ps(bits));
}

A5I __m256i a5_to_bf16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, a5_i(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, a5_i(0x7fffu)), lsb), 16);
    __m512i q = _mm512_or_si512(hi, a5_i(0x40u));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(a5_isnan32(u), r, q));
}

A5I __m256i a5_to_f16(__m512 x) {
    __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    __m512i u = _mm512_castps_si512(x);
    __m512i q = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), a5_i(0x8000u)), a5_i(0x7e00u));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(a5_isnan32(u), h, q));
}

A5I void a5_body(const pt_adamw_consts *c, float *p, const void *g, int gdt, float *m, float *v,
                 void *out, int odt, size_t b, size_t e) {
    const __m512 b1 = _mm512_set1_ps(c->b1), omb1 = _mm512_set1_ps(c->one_minus_b1);
    const __m512 b2 = _mm512_set1_ps(c->b2), omb2 = _mm512_set1_ps(c->one_minus_b2);
    const __m512 lrwd = _mm512_set1_ps(c->lrwd), step = _mm512_set1_ps(c->step_size);
    const __m512 bc2r = _mm512_set1_ps(c->bc2_rsqrt), eps = _mm512_set1_ps(c->eps);
    const __m512 gs = _mm512_set1_ps(c->grad_scale);
    size_t i = b;
    for (; e - i >= 16; i += 16) {
        __m512 gg = gdt == PT_F32    ? _mm512_loadu_ps((const float *)g + i)
                    : gdt == PT_BF16 ? a5_from_bf16((const uint16_t *)g + i)
                                     : a5_from_f16((const uint16_t *)g + i);
        gg = _mm512_mul_ps(gg, gs);
        __m512 mm = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(omb1, gg));
        __m512 vv = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                  _mm512_mul_ps(_mm512_mul_ps(omb2, gg), gg));
        __m512 p0 = _mm512_loadu_ps(p + i);
        __m512 pp = _mm512_sub_ps(p0, _mm512_mul_ps(lrwd, p0));
        __m512 den = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vv), bc2r), eps);
        pp = _mm512_sub_ps(pp, _mm512_div_ps(_mm512_mul_ps(step, mm), den));
        _mm512_storeu_ps(m + i, mm);
        _mm512_storeu_ps(v + i, vv);
        _mm512_storeu_ps(p + i, pp);
        if (odt == PT_F32) _mm512_storeu_ps((float *)out + i, pp);
        else if (odt == PT_BF16) _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), a5_to_bf16(pp));
        else if (odt == PT_F16) _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), a5_to_f16(pp));
    }
    adam_scalar(c, p, g, gdt, m, v, out, odt, i, e);
}

A5 static void adam_avx512(const pt_adamw_consts *c, float *p, const void *g, int gdt, float *m, float *v,
                           void *out, int odt, size_t b, size_t e) {
    switch (gdt * 4 + odt + 1) {
        ADAM_CASES(a5_body, PT_F32)
        ADAM_CASES(a5_body, PT_BF16)
        ADAM_CASES(a5_body, PT_F16)
    default: adam_scalar(c, p, g, gdt, m, v, out, odt, b, e);
    }
}

A5 static void to_bf16_avx512(uint16_t *d, const float *s, size_t b, size_t e) {
    size_t i = b;
    for (; e - i >= 16; i += 16) _mm256_storeu_si256((__m256i *)(d + i), a5_to_bf16(_mm512_loadu_ps(s + i)));
    to_bf16_scalar(d, s, i, e);
}
A5 static void from_bf16_avx512(float *d, const uint16_t *s, size_t b, size_t e) {
    size_t i = b;
    for (; e - i >= 16; i += 16) _mm512_storeu_ps(d + i, a5_from_bf16(s + i));
    from_bf16_scalar(d, s, i, e);
}
A5 static void to_f16_avx512(uint16_t *d, const float *s, size_t b, size_t e) {
    size_t i = b;
    for (; e - i >= 16; i += 16) _mm256_storeu_si256((__m256i *)(d + i), a5_to_f16(_mm512_loadu_ps(s + i)));
    to_f16_scalar(d, s, i, e);
}
A5 static void from_f16_avx512(float *d, const uint16_t *s, size_t b, size_t e) {
    size_t i = b;
    for (; e - i >= 16; i += 16) _mm512_storeu_ps(d + i, a5_from_f16(s + i));
    from_f16_scalar(d, s, i, e);
}
#endif /* PT_X86 */

/* ============================== dispatch ================================ */

typedef struct kernels {
    const char *name;
    void (*adam)(const pt_adamw_consts *, float *, const void *, int, float *, float *, void *, int, size_t,
                 size_t);
    void (*to_bf16)(uint16_t *, const float *, size_t, size_t);
    void (*from_bf16)(float *, const uint16_t *, size_t, size_t);
    void (*to_f16)(uint16_t *, const float *, size_t, size_t);
    void (*from_f16)(float *, const uint16_t *, size_t, size_t);
} kernels;

static const kernels K[3] = {
    {"scalar", adam_scalar, to_bf16_scalar, from_bf16_scalar, to_f16_scalar, from_f16_scalar},
#if PT_X86
    {"avx2", adam_avx2, to_bf16_avx2, from_bf16_avx2, to_f16_avx2, from_f16_avx2},
    {"avx512", adam_avx512, to_bf16_avx512, from_bf16_avx512, to_f16_avx512, from_f16_avx512},
#else
    {"scalar", adam_scalar, to_bf16_scalar, from_bf16_scalar, to_f16_scalar, from_f16_scalar},
    {"scalar", adam_scalar, to_bf16_scalar, from_bf16_scalar, to_f16_scalar, from_f16_scalar},
#endif
};

static atomic_int isa_sel = -1; /* resolved lazily; -1 = not yet */

pt_cpu_isa pt_cpu_adam_isa_best(void) {
#if PT_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return PT_ISA_AVX512;
    /* F16C from CPUID leaf 1, ECX bit 29: clang's __builtin_cpu_supports has no
     * "f16c", and the fuzz build compiles this file with clang */
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    int f16c = __get_cpuid(1, &a1, &b1, &c1, &d1) && (c1 & (1u << 29));
    if (__builtin_cpu_supports("avx2") && f16c) return PT_ISA_AVX2;
#endif
    return PT_ISA_SCALAR;
}

pt_cpu_isa pt_cpu_adam_isa_id(void) {
    int s = atomic_load_explicit(&isa_sel, memory_order_relaxed);
    if (s < 0) {
        s = (int)pt_cpu_adam_isa_best();
        /* PT_CPU_ADAM_ISA=scalar|avx2 narrows the path (benchmarks, triage);
         * a wider or unknown name is ignored. */
        const char *env = getenv("PT_CPU_ADAM_ISA");
        if (env) {
            for (int i = 0; i < s; i++)
                if (strcmp(env, K[i].name) == 0) s = i;
        }
        int expect = -1; /* first resolver wins; a racing one computed the same */
        if (!atomic_compare_exchange_strong(&isa_sel, &expect, s)) s = expect;
    }
    return (pt_cpu_isa)s;
}

const char *pt_cpu_adam_isa(void) { return K[pt_cpu_adam_isa_id()].name; }

int pt_cpu_adam_set_isa(pt_cpu_isa isa, char *err, size_t errlen) {
    if ((int)isa < PT_ISA_SCALAR || (int)isa > PT_ISA_AVX512)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "cpu_adam: unknown ISA id %d (0 scalar, 1 avx2, 2 avx512)",
                       (int)isa);
    if (isa > pt_cpu_adam_isa_best())
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "cpu_adam: this CPU does not support the %s path (best: %s)",
                       K[isa].name, K[pt_cpu_adam_isa_best()].name);
    atomic_store(&isa_sel, (int)isa);
    return PT_OK;
}

static const kernels *kern(void) { return &K[pt_cpu_adam_isa_id()]; }

/* =============================== AdamW ================================== */

static int dtype_ok(int dt) { return dt == PT_F32 || dt == PT_BF16 || dt == PT_F16; }

int pt_cpu_adam_check(const pt_cpu_adam_args *a, char *err, size_t errlen) {
    if (!a) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "cpu_adam: args pointer is NULL");
    if (!dtype_ok(a->g_dtype))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "cpu_adam: g_dtype %d is not a floating-point pt_dtype (0 f32, 1 bf16, 2 f16; u8 parameters are frozen and have no gradient)",
                       a->g_dtype);
    if (a->out && !dtype_ok(a->out_dtype))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "cpu_adam: out_dtype %d is not a floating-point pt_dtype (0 f32, 1 bf16, 2 f16; u8 parameters are never stepped)", a->out_dtype);
    if (a->n > 0 && (!a->p || !a->g || !a->m || !a->v))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "cpu_adam: n = %zu but %s is NULL", a->n,
                       !a->p ? "p" : !a->g ? "g"
                                 : !a->m   ? "m"
                                           : "v");
    return PT_OK;
}

void pt_cpu_adam_range(const pt_cpu_adam_args *a, size_t begin, size_t end) {
    if (end > a->n) end = a->n;
    if (begin >= end) return;
    kern()->adam(&a->c, a->p, a->g, a->g_dtype, a->m, a->v, a->out, a->out ? a->out_dtype : ODT_NONE, begin,
                 end);
}

/* A queued update: k runner tasks pull slices from `next` until none are left.
 * The slices of all arrays form one index space: array i owns slices
 * [first[i], first[i+1]), so a chunk of several regions is one job that
 * every runner shares. The last of the job's holders (tasks, plus the caller
 * if it ran slices inline) calls the done hook and frees the job, so an
 * asynchronous step needs no cleanup call. */
typedef struct adam_job {
    size_t slices;        /* first[n_arr] */
    atomic_size_t next;   /* next slice to hand out */
    atomic_size_t refs;   /* holders still to finish */
    pt_cpu_adam_hooks h;  /* zeroed when the caller gave none */
    double t_first;       /* host clock when slice 0 was taken (its taker writes it
                           * before its release on refs; the last holder reads it) */
    int n_arr;
    pt_cpu_adam_args *a;  /* [n_arr] private copies: the caller's may go away */
    size_t *first;        /* [n_arr + 1] */
} adam_job;

/* Array of global slice i: the last array whose first slice is <= i
 * (arrays with no elements own no slices and are skipped). */
static int job_array(const adam_job *j, size_t i) {
    int lo = 0, hi = j->n_arr - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (j->first[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static void job_run(adam_job *j) {
    if (j->h.start) j->h.start(j->h.ctx);
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->slices) break;
        if (i == 0) j->t_first = pt_now_s();
        int k = job_array(j, i);
        size_t s = i - j->first[k];
        pt_cpu_adam_range(&j->a[k], s * PT_CPU_ADAM_SLICE, (s + 1) * PT_CPU_ADAM_SLICE);
    }
}

static void job_put(adam_job *j, size_t holders) {
    if (atomic_fetch_sub_explicit(&j->refs, holders, memory_order_acq_rel) != holders) return;
    /* every slice is done (each holder stopped only when none was left) */
    if (j->h.done) j->h.done(j->h.ctx, j->t_first, pt_now_s());
    free(j);
}

static void job_task(void *arg) {
    adam_job *j = arg;
    job_run(j);
    job_put(j, 1);
}

/* One thread does it all: no pool, or no memory for a job. */
static void run_inline(const pt_cpu_adam_args *a, int n_arr, const pt_cpu_adam_hooks *h) {
    if (h && h->start) h->start(h->ctx);
    double t0 = pt_now_s();
    for (int i = 0; i < n_arr; i++) pt_cpu_adam_range(&a[i], 0, a[i].n);
    if (h && h->done) h->done(h->ctx, t0, pt_now_s());
}

int pt_cpu_adam_step_many(pt_pool *pool, const pt_cpu_adam_args *a, int n_arr, pt_task_group *g,
                          const pt_cpu_adam_hooks *hooks, char *err, size_t errlen) {
    if (n_arr < 0 || (n_arr > 0 && !a))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "cpu_adam: %d arrays at %p", n_arr, (const void *)a);
    size_t slices = 0;
    for (int i = 0; i < n_arr; i++) {
        char why[200];
        int rc = pt_cpu_adam_check(&a[i], why, sizeof why);
        if (rc != PT_OK) return pt_fail(err, errlen, rc, "array %d of %d: %s", i, n_arr, why);
        slices += a[i].n / PT_CPU_ADAM_SLICE + (a[i].n % PT_CPU_ADAM_SLICE != 0);
    }
    size_t nt = (size_t)pt_pool_threads(pool);
    adam_job *j = NULL;
    if (pool && slices > 0 && (g || slices > 1)) {
        size_t sz = sizeof *j + (size_t)n_arr * sizeof *j->a + ((size_t)n_arr + 1) * sizeof *j->first;
        j = malloc(sz);
    }
    if (!j) {
        /* no pool, nothing to do, a synchronous single slice, or no memory for
         * the job: the caller does the whole update now, which is always correct */
        run_inline(a, n_arr, hooks);
        return PT_OK;
    }
    j->a = (pt_cpu_adam_args *)(j + 1);
    j->first = (size_t *)(j->a + n_arr);
    j->n_arr = n_arr;
    j->first[0] = 0;
    for (int i = 0; i < n_arr; i++) {
        j->a[i] = a[i];
        j->first[i + 1] = j->first[i] + a[i].n / PT_CPU_ADAM_SLICE + (a[i].n % PT_CPU_ADAM_SLICE != 0);
    }
    j->slices = slices;
    j->t_first = 0;
    if (hooks) j->h = *hooks;
    else memset(&j->h, 0, sizeof j->h);
    atomic_init(&j->next, 0);
    size_t k = slices < nt ? slices : nt; /* tasks (holders) */
    atomic_init(&j->refs, k);
    /* Synchronous: the caller is one of the k runners; asynchronous: all k
     * are queued and the caller returns at once. */
    pt_task_group local = PT_TASK_GROUP_INIT;
    pt_task_group *grp = g ? g : &local;
    size_t to_queue = g ? k : k - 1, queued = 0;
    char why[160];
    int rc = PT_OK;
    for (; queued < to_queue; queued++) {
        rc = pt_pool_submit(pool, job_task, j, grp, why, sizeof why);
        if (rc != PT_OK) {
            pt_fail(err, errlen, rc, "cpu_adam: queueing slice task %zu of %zu failed (%s); ran the rest inline",
                    queued + 1, to_queue, why);
            break;
        }
    }
    size_t mine = k - queued; /* holders the caller stands in for */
    if (mine > 0) {
        job_run(j);
        job_put(j, mine);
    }
    if (!g) {
        int wrc = pt_pool_wait(pool, grp);
        if (rc == PT_OK) rc = wrc;
    }
    return rc;
}

int pt_cpu_adam_step(pt_pool *pool, const pt_cpu_adam_args *a, pt_task_group *g, char *err, size_t errlen) {
    int rc = pt_cpu_adam_check(a, err, errlen);
    if (rc != PT_OK || a->n == 0) return rc;
    return pt_cpu_adam_step_many(pool, a, 1, g, NULL, err, errlen);
}


/* ============================= converters =============================== */

void pt_cpu_cvt_f32_to_bf16(uint16_t *d, const float *s, size_t n) { kern()->to_bf16(d, s, 0, n); }
void pt_cpu_cvt_bf16_to_f32(float *d, const uint16_t *s, size_t n) { kern()->from_bf16(d, s, 0, n); }
void pt_cpu_cvt_f32_to_f16(uint16_t *d, const float *s, size_t n) { kern()->to_f16(d, s, 0, n); }
void pt_cpu_cvt_f16_to_f32(float *d, const uint16_t *s, size_t n) { kern()->from_f16(d, s, 0, n); }

int pt_cpu_cvt(void *dst, int ddt, const void *src, int sdt, size_t n) {
    if (!dtype_ok(ddt) || !dtype_ok(sdt)) return PT_ERR_INVALID_ARG;
    if (n == 0) return PT_OK;
    if (!dst || !src) return PT_ERR_INVALID_ARG;
    if (ddt == sdt) {
        memmove(dst, src, n * pt_dtype_size(ddt));
        return PT_OK;
    }
    const kernels *k = kern();
    if (sdt == PT_F32) {
        (ddt == PT_BF16 ? k->to_bf16 : k->to_f16)(dst, src, 0, n);
    } else if (ddt == PT_F32) {
        (sdt == PT_BF16 ? k->from_bf16 : k->from_f16)(dst, src, 0, n);
    } else {
        /* bf16 <-> f16 via fp32 (exact widening, one rounding), 256 at a time */
        float tmp[256];
        const uint16_t *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i += 256) {
            size_t c = n - i < 256 ? n - i : 256;
            (sdt == PT_BF16 ? k->from_bf16 : k->from_f16)(tmp, s + i, 0, c);
            (ddt == PT_BF16 ? k->to_bf16 : k->to_f16)(d + i, tmp, 0, c);
        }
    }
    return PT_OK;
}
