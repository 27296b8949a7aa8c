/*
 * cpu_adam.h — multi-threaded, vectorised CPU AdamW for offloaded chunks, and
 * bulk fp32 <-> bf16/fp16 converters for staging buffers.
 *
 * Numerics: every element is BIT-IDENTICAL to pt_adamw_elem (gpu/kernels_hd.h)
 * on the same inputs, on every ISA path: the vector code performs the same
 * IEEE operations in the same order (mul, add, sqrt, div; never FMA — the AVX2
 * and AVX-512 functions are compiled without the fma target and the build is
 * -std=c11, i.e. -ffp-contract=off), and 16-bit loads/stores reproduce
 * pt_bf16_to_f32 / pt_f16_to_f32 / pt_f32_to_bf16 / pt_f32_to_f16 exactly,
 * NaN payloads included. This is what lets the plugin path match the
 * no-plugin baseline bit for bit. (Assumes the default MXCSR: no FTZ/DAZ.)
 *
 * Dispatch: the widest of AVX-512F, AVX2(+F16C), scalar that the CPU supports,
 * chosen once at first use; pt_cpu_adam_set_isa can force a narrower path
 * (tests use it to check every path against the scalar one).
 *
 * Threading: pt_cpu_adam_step cuts [0, n) into slices of PT_CPU_ADAM_SLICE
 * elements (a multiple of 64, so with 64-byte aligned buffers every slice
 * starts on a cache-line boundary for fp32 and 16-bit arrays alike and two
 * threads never write the same line) and queues min(slices, threads) runner
 * tasks on a pt_pool that pull slices dynamically (a runner that starts late,
 * or a core busy with something else, simply takes fewer).
 * pt_cpu_adam_step_many does the same for several arrays at once.
 *
 * Errors: functions that can fail return a pt_status (host_api/protrain.h)
 * and write one sentence into the caller's err buffer (may be NULL).
 * The converters return the status alone: they fail only
 * on arguments their callers have already validated.
 */
#ifndef PT_CPU_ADAM_H
#define PT_CPU_ADAM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels_hd.h"
#include "thread_pool.h"

/* Elements per work slice: 32768 fp32 = 128 KiB per array, 7 arrays per
 * slice stay well inside L2 while a slice is processed, and a 64M-param
 * chunk is 2048 slices, enough to balance 2..64 threads. Multiple of 64. */
#define PT_CPU_ADAM_SLICE ((size_t)32768)

typedef enum pt_cpu_isa {
    PT_ISA_SCALAR = 0,
    PT_ISA_AVX2 = 1,     /* AVX2 + F16C */
    PT_ISA_AVX512 = 2    /* AVX-512F */
} pt_cpu_isa;

/* One AdamW update over n elements. Arrays must not overlap, except that
 * out may equal p when out_dtype is fp32 (it then rewrites the same value).
 * Alignment is not required; 64-byte alignment is what makes slices
 * cache-line disjoint. */
typedef struct pt_cpu_adam_args {
    float *p;             /* [n] fp32 master weights, updated in place */
    const void *g;        /* [n] gradient, dtype g_dtype */
    int g_dtype;          /* pt_dtype: PT_F32, PT_BF16, PT_F16 */
    float *m, *v;         /* [n] fp32 Adam moments, updated in place */
    void *out;            /* [n] compute-dtype copy of the new p, or NULL */
    int out_dtype;        /* pt_dtype of out (ignored when out is NULL) */
    size_t n;
    pt_adamw_consts c;    /* pt_adamw_make_consts(...) for this step (includes grad_scale) */
} pt_cpu_adam_args;

/* Name of the path in use: "avx512", "avx2" or "scalar". */
const char *pt_cpu_adam_isa(void);
pt_cpu_isa pt_cpu_adam_isa_id(void);
/* Widest path this CPU supports (what dispatch picks by default). */
pt_cpu_isa pt_cpu_adam_isa_best(void);
/* Force a path (process-wide; call when no step is running). Returns
 * PT_ERR_UNSUPPORTED if the CPU lacks it, PT_ERR_INVALID_ARG if unknown. */
int pt_cpu_adam_set_isa(pt_cpu_isa isa, char *err, size_t errlen);

/* Check args: PT_OK, or PT_ERR_INVALID_ARG naming the bad field. */
int pt_cpu_adam_check(const pt_cpu_adam_args *a, char *err, size_t errlen);

/* Update elements [begin, end) on the calling thread (no checks beyond
 * begin <= end <= n; call pt_cpu_adam_check first). */
void pt_cpu_adam_range(const pt_cpu_adam_args *a, size_t begin, size_t end);

/* Queue the update of a->[0, n) on pool as slice tasks and return.
 * *a is copied; the arrays must stay valid until pt_pool_wait(pool, g).
 * g NULL: synchronous (waits before returning). pool NULL: runs on the
 * calling thread before returning (g, if given, is left untouched).
 * Returns PT_OK, PT_ERR_INVALID_ARG, or PT_ERR_HOST_OOM/PT_ERR_ORDER from the
 * pool (in which case the slices that could not be queued were run inline,
 * so the update is still complete after the wait). */
int pt_cpu_adam_step(pt_pool *pool, const pt_cpu_adam_args *a, pt_task_group *g, char *err, size_t errlen);

/* Optional callbacks of a pt_cpu_adam_step_many job (each may be NULL):
 * start runs on every runner before it takes its first slice; done runs once,
 * on the runner that finished last, after every slice, with the host-clock
 * interval from the first slice's start to that moment. Both run before the
 * job's tasks count as finished in g, so a waiter on g sees their effects. */
typedef struct pt_cpu_adam_hooks {
    void (*start)(void *ctx);
    void (*done)(void *ctx, double t_first, double t_end);
    void *ctx;
} pt_cpu_adam_hooks;

/* One update over several arrays (an offloaded chunk's trainable regions)
 * as ONE job: the slices of a[0..n_arr) form one index space that min(slices,
 * threads) runners pull from, so a chunk of any region count is spread over
 * every thread, and the result of every element is the same as
 * pt_cpu_adam_range over each array (AdamW is element-wise; a slice is a
 * range). Queueing and errors as pt_cpu_adam_step; g NULL: synchronous (safe
 * from inside a pool task: the wait runs the job's queued tasks itself).
 * Returns PT_ERR_INVALID_ARG (naming the array) before doing anything if any
 * array fails pt_cpu_adam_check. */
int pt_cpu_adam_step_many(pt_pool *pool, const pt_cpu_adam_args *a, int n_arr, pt_task_group *g,
                          const pt_cpu_adam_hooks *hooks, char *err, size_t errlen);

/* ---- bulk converters, bit-identical to the scalar ones in kernels_hd.h ---- */
void pt_cpu_cvt_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void pt_cpu_cvt_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void pt_cpu_cvt_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void pt_cpu_cvt_f16_to_f32(float *dst, const uint16_t *src, size_t n);
/* Any floating-point pt_dtype to any other (same dtype: memmove). PT_OK, or
 * PT_ERR_INVALID_ARG for PT_U8, an unknown dtype or a NULL array. 16->16 goes through
 * fp32. */
int pt_cpu_cvt(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n);

#endif /* PT_CPU_ADAM_H */
