/*
 * bench_cpu_adam.c — CPU AdamW throughput against a STREAM-style triad run
 * in the same process on the same pool (make bench).
 *
 * Accounting (fixed, so numbers compare across machines):
 *   adam : 28 B per param = read p, g, m, v + write p, m, v (7 x 4 B fp32)
 *   triad: 12 B per element = a[i] = b[i] + s*c[i], 3 arrays x 4 B
 * Caveat printed with the results: with ordinary stores the CPU also reads
 * each line of `a` before writing it (write-allocate), so the triad moves
 * 16 B/elem on the bus while counting 12; Adam's stores hit lines it just
 * read, so its 28 B are its real traffic. A non-temporal-store triad
 * (12 B real = counted) is printed as a second probe for reference.
 *
 * Usage: bench_cpu_adam [size ...]   (default 256K 1M 16M 64M; K = 2^10 params,
 *        M = 2^20, a bare number is M)
 * Env:   PT_BENCH_REPS (default 7, min 5), PT_CPU_ADAM_ISA (scalar|avx2 to narrow),
 *        PT_BENCH_SPIN_US (the pool's idle spin for the `adam` rows; default the
 *        pool's own, PT_POOL_SPIN_NS_DEFAULT).
 * Each measure: one warm-up, then the median of REPS timed repeats. A repeat of
 * a small size runs ceil(16M / n) calls back to back and reports the time per
 * call: at 256K one call takes ~0.1 ms, so the in-cache sizes measure exactly
 * what a pool's dispatch and wake-up cost on top of the arithmetic.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "optim/cpu_adam.h"
#include "protrain.h"
#include "pt_util.h"
#include "optim/thread_pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- triad ---- */

typedef struct triad_arg {
    float *a;
    const float *b, *c;
    float s;
    int nt_store; /* 1: streaming stores (needs 32-byte aligned slices) */
} triad_arg;

static void triad_scalar(float *a, const float *b, const float *c, float s, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) a[i] = b[i] + s * c[i];
}

#if HAVE_X86
__attribute__((target("avx2"))) static void triad_avx2(const triad_arg *t, size_t lo, size_t hi) {
    const __m256 s = _mm256_set1_ps(t->s);
    size_t i = lo;
    if (t->nt_store) {
        for (; hi - i >= 8; i += 8)
            _mm256_stream_ps(t->a + i,
                             _mm256_add_ps(_mm256_load_ps(t->b + i), _mm256_mul_ps(s, _mm256_load_ps(t->c + i))));
        _mm_sfence(); /* order the streaming stores before the slice counts as done */
    } else {
        for (; hi - i >= 8; i += 8)
            _mm256_storeu_ps(t->a + i,
                             _mm256_add_ps(_mm256_loadu_ps(t->b + i), _mm256_mul_ps(s, _mm256_loadu_ps(t->c + i))));
    }
    triad_scalar(t->a, t->b, t->c, t->s, i, hi);
}
#endif

static int use_avx2;

static void triad_slice(void *arg, size_t lo, size_t hi) {
    const triad_arg *t = arg;
#if HAVE_X86
    if (use_avx2) {
        triad_avx2(t, lo, hi);
        return;
    }
#endif
    triad_scalar(t->a, t->b, t->c, t->s, lo, hi);
}

/* ---- parallel first-touch init ---- */

typedef struct init_arg {
    float *x[7];
    int nx;
} init_arg;

static void init_slice(void *arg, size_t lo, size_t hi) {
    const init_arg *ia = arg;
    for (int k = 0; k < ia->nx; k++)
        for (size_t i = lo; i < hi; i++) {
            /* finite, v > 0, sizes like real training state */
            float r = (float)((i * 2654435761u + (size_t)k * 40503u) % 1000u) * 1e-3f;
            ia->x[k][i] = k == 3 ? 1e-6f + 1e-6f * r : (r - 0.5f) * (k == 1 ? 1e-2f : 1.0f);
        }
}

/* 2 MiB aligned and advised for transparent huge pages: first touch of a
 * GiB then costs ~500 faults instead of ~250k (both measures benefit alike). */
static float *alloc_f(size_t n) {
    const size_t huge = (size_t)2 << 20;
    size_t bytes = (n * 4 + huge - 1) / huge * huge;
    float *p = aligned_alloc(huge, bytes);
    if (!p) {
        fprintf(stderr, "bench_cpu_adam: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    madvise(p, bytes, MADV_HUGEPAGE); /* advisory; failure only costs speed */
    return p;
}

/* "256K", "16M", "16" (M): params, or 0 for anything unreadable. */
static size_t parse_size(const char *s) {
    char *end = NULL;
    unsigned long x = strtoul(s, &end, 10);
    if (end == s) return 0;
    if (*end == 'K' || *end == 'k') return (size_t)x << 10;
    if (*end == 'M' || *end == 'm' || *end == 0) return (size_t)x << 20;
    return 0;
}

/* "256K" / "16M" for printing. */
static const char *size_name(size_t n, char *buf, size_t len) {
    if (n % ((size_t)1 << 20) == 0) snprintf(buf, len, "%zuM", n >> 20);
    else snprintf(buf, len, "%zuK", n >> 10);
    return buf;
}

int main(int argc, char **argv) {
    size_t sizes[16] = {(size_t)256 << 10, (size_t)1 << 20, (size_t)16 << 20, (size_t)64 << 20};
    int nsizes = 4;
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc && nsizes < 16; i++) sizes[nsizes++] = parse_size(argv[i]);
    }
    int reps = getenv("PT_BENCH_REPS") ? atoi(getenv("PT_BENCH_REPS")) : 7;
    if (reps < 5) reps = 5;
#if HAVE_X86
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
    printf("bench_cpu_adam: isa=%s, triad=%s, %d repeats (median), adam 28 B/param, triad 12 B/elem\n",
           pt_cpu_adam_isa(), use_avx2 ? "avx2" : "scalar", reps);
    double *t[5];
    for (int k = 0; k < 5; k++) t[k] = malloc((size_t)reps * sizeof *t[k]);
    int rc = 0;
    for (int si = 0; si < nsizes && rc == 0; si++) {
        size_t n = sizes[si];
        if (n == 0) continue;
        char nm[32];
        size_name(n, nm, sizeof nm);
        /* calls per timed repeat: at least 16M params of work each */
        const size_t inner = ((size_t)16 << 20) / n + (((size_t)16 << 20) % n != 0);
        float *p = alloc_f(n), *g = alloc_f(n), *m = alloc_f(n), *v = alloc_f(n);
        float *ta = alloc_f(n), *tb = alloc_f(n), *tc = alloc_f(n);
        uint16_t *out16 = (uint16_t *)alloc_f(n / 2 + 1);
        for (int nt = 1; nt <= 2 && rc == 0; nt++) {
            char err[200];
            pt_pool *pool = NULL;
            if (pt_pool_create(nt, &pool, err, sizeof err)) {
                fprintf(stderr, "bench_cpu_adam: %s\n", err);
                rc = 1;
                break;
            }
            init_arg ia = {{p, g, m, v, ta, tb, tc}, 7};
            pt_pool_parallel_for(pool, n, PT_CPU_ADAM_SLICE, init_slice, &ia);

            /* Interleave the four measures repeat by repeat so that load from
             * other processes on a shared machine hits them alike:
             * 0 adam fp32, 1 adam + bf16 copy, 2 triad, 3 triad with streaming stores,
             * 4 adam fp32 with the pool's idle spin off (threads sleep at once:
             * the pool before the spin existed), to show what the spin buys. */
            double med[5];
            const double spin = getenv("PT_BENCH_SPIN_US") ? atof(getenv("PT_BENCH_SPIN_US")) * 1e-6 : pt_pool_get_spin(pool);
            triad_arg tr[2] = {{ta, tb, tc, 3.0f, 0}, {ta, tb, tc, 3.0f, use_avx2}};
            for (int r = -1; r < reps && rc == 0; r++) {
                for (int k = 0; k < 5; k++) {
                    if (k == 3 && !use_avx2) continue;
                    pt_pool_set_spin(pool, k == 4 ? 0.0 : spin);
                    float bc1, bc2r;
                    pt_adamw_bias(0.9f, 0.999f, r + 2, &bc1, &bc2r);
                    pt_cpu_adam_args a = {.p = p, .g = g, .g_dtype = PT_F32, .m = m, .v = v, .out = k == 1 ? out16 : NULL, .out_dtype = PT_BF16, .n = n, .c = pt_adamw_make_consts(1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, bc1, bc2r, 1.0f)};
                    double t0 = pt_now_s();
                    for (size_t it = 0; it < inner && rc == 0; it++) {
                        if (k < 2 || k == 4) {
                            if (pt_cpu_adam_step(pool, &a, NULL, err, sizeof err) != PT_OK) {
                                fprintf(stderr, "bench_cpu_adam: %s\n", err);
                                rc = 1;
                            }
                        } else {
                            pt_pool_parallel_for(pool, n, PT_CPU_ADAM_SLICE, triad_slice, &tr[k - 2]);
                        }
                    }
                    if (r >= 0) t[k][r] = (pt_now_s() - t0) / (double)inner;
                }
            }
            for (int k = 0; k < 5; k++) med[k] = k == 3 && !use_avx2 ? 1 : median(t[k], reps);
            double adam_s = med[0], adam16_s = med[1], triad_s[2] = {med[2], med[3]};
            double nn = (double)n;
            double adam_bw = 28.0 * nn / adam_s, triad_bw = 12.0 * nn / triad_s[0], nt_bw = 12.0 * nn / triad_s[1];
            printf("adam      N=%4s threads=%d: %8.2f ms  %6.3f Gparam/s  %6.2f GB/s (28 B/param)\n",
                   nm, nt, 1e3 * adam_s, nn / adam_s * 1e-9, adam_bw * 1e-9);
            printf("adam-nospin N=%4s threads=%d: %6.2f ms  %6.3f Gparam/s  (idle spin off; spin %.0f us is %.3fx faster)\n",
                   nm, nt, 1e3 * med[4], nn / med[4] * 1e-9, spin * 1e6, med[4] / adam_s);
            printf("adam+bf16 N=%4s threads=%d: %8.2f ms  %6.3f Gparam/s  %6.2f GB/s (30 B/param, bf16 copy written)\n",
                   nm, nt, 1e3 * adam16_s, nn / adam16_s * 1e-9, 30.0 * nn / adam16_s * 1e-9);
            printf("triad     N=%4s threads=%d: %8.2f ms  %6.2f GB/s (12 B/elem; +4 B/elem write-allocate not counted)\n",
                   nm, nt, 1e3 * triad_s[0], triad_bw * 1e-9);
            if (use_avx2)
                printf("triad-nt  N=%4s threads=%d: %8.2f ms  %6.2f GB/s (12 B/elem, streaming stores)\n",
                       nm, nt, 1e3 * triad_s[1], nt_bw * 1e-9);
            printf("RATIO     N=%4s threads=%d: adam/triad = %.3f (goal >= 0.9 on 2 threads)\n", nm, nt,
                   adam_bw / triad_bw);
            if (use_avx2)
                printf("RATIO-nt  N=%4s threads=%d: adam/triad-nt = %.3f\n", nm, nt, adam_bw / nt_bw);
            fflush(stdout);
            pt_pool_destroy(pool);
        }
        free(p), free(g), free(m), free(v), free(ta), free(tb), free(tc), free(out16);
    }
    for (int k = 0; k < 5; k++) free(t[k]);
    return rc;
}
