/*
 * sh_preflight.h — what a finite address-space limit (ulimit -v) must leave
 * for the GEMMs, checked before any work.
 *
 * OpenBLAS gives every thread that calls it a work buffer of 128 MiB (its
 * BUFFER_SIZE on x86-64; taken with malloc at the thread's first GEMM, so a
 * thread other than the main one also makes a glibc arena, which reserves
 * 64 MiB of address space). When that malloc fails OpenBLAS tries again
 * forever: the run hangs at its first GEMM instead of failing. sample_host
 * calls OpenBLAS from at most min(OpenMP threads, 8 row slabs) threads at once.
 */
#ifndef SH_PREFLIGHT_H
#define SH_PREFLIGHT_H

#include <stddef.h>

#include "sh_config.h"

/* Address space a GEMM-calling thread takes at its first GEMM: the buffer (and
 * malloc's page) and the arena malloc makes for a thread (its 64 MiB heap is
 * carved out of a 128 MiB mapping, so up to 64 MiB more for a moment). */
#define SH_BLAS_THREAD_BYTES ((size_t)(192u << 20) + 4096u)
/* Seconds the warm-up GEMMs may take before the run is stopped with the
 * sentence: they take microseconds unless OpenBLAS is retrying an allocation. */
#define SH_PREFLIGHT_WAIT_S 20

/* With RLIMIT_AS finite (and the layers on the CPU): reserve that much address
 * space for each GEMM thread and release it; when it fits, every thread's
 * buffer is taken at once by one small GEMM per thread (so the model's
 * allocations that follow cannot leave too little for them), else -1 with a
 * sentence naming the limit, the need and the way out. The figures are
 * glibc's and OpenBLAS's, not promises: should the warm-up still not finish
 * within SH_PREFLIGHT_WAIT_S, the process prints the same sentence and exits
 * with status 1 (an alarm, armed only under the limit). No limit: nothing. */
int sh_preflight(const sh_config *c, char *err, size_t errlen);

#endif /* SH_PREFLIGHT_H */
