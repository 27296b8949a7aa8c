/*
 * preflight.c — the address space the GEMMs need under ulimit -v
 * (sh_preflight.h).
 */
#include "sh_preflight.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sh_layers.h"

/* The sentence the alarm prints: made before the alarm is armed (a handler
 * may only write and exit). */
static char g_msg[768];

static void on_alarm(int sig) {
    (void)sig;
    ssize_t w = write(STDERR_FILENO, g_msg, strlen(g_msg));
    (void)w;
    _exit(1);
}

int sh_preflight(const sh_config *c, char *err, size_t errlen) {
    struct rlimit rl;
    if (c->device != SH_DEVICE_CPU || getrlimit(RLIMIT_AS, &rl) != 0 ||
        rl.rlim_cur == RLIM_INFINITY)
        return 0;
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    if (nt > 8) nt = 8;   /* the row slabs of one GEMM (layers.c) */
    size_t need = (size_t)nt * SH_BLAS_THREAD_BYTES;
    void *p = mmap(NULL, need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    snprintf(g_msg, sizeof g_msg, "sample_host: error: the address-space limit (ulimit -v) is %llu MiB and leaves too "
                                  "little for the GEMMs: OpenBLAS takes a 128 MiB work buffer (and a 64 MiB "
                                  "malloc arena) for each of the %d threads that call it, %zu MiB in all, and "
                                  "when it cannot get one it waits forever instead of failing; raise the limit "
                                  "by at least that much, or use fewer threads (OMP_NUM_THREADS)",
             (unsigned long long)(rl.rlim_cur >> 20), nt, need >> 20);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "%s", g_msg + strlen("sample_host: error: "));
        return -1;
    }
    munmap(p, need);
    if (strlen(g_msg) + 1 < sizeof g_msg) strcat(g_msg, "\n");
    /* one GEMM per slab thread now: each thread's buffer is taken while the
     * space is there (OpenBLAS keeps it for the process's life) */
    enum { N = 16 * 8,
           K = 16 };
    float *a = calloc((size_t)N * K * 2 + K * K, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "out of host memory before the first step");
        return -1;
    }
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, &old);
    unsigned left = alarm(SH_PREFLIGHT_WAIT_S);
    sh_layers_init();
    sh_layers_matmul_fwd(a + N * K, a, a + 2 * N * K, NULL, N, K, K);
    alarm(left);
    sigaction(SIGALRM, &old, NULL);
    free(a);
    return 0;
}
