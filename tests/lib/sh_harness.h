/*
 * sh_harness.h — what the integration tests and benchmarks that drive
 * sample_host in process share: a scratch folder, the built plugin, a token
 * stream, an INI writer, sample_host options and a median.
 * Header-only (static functions); include once per test program.
 */
#ifndef PT_SH_HARNESS_H
#define PT_SH_HARNESS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protrain.h"
#include "pt_util.h"
#include "sh_data.h"
#include "sh_train.h"

typedef struct sh_harness {
    char dir[256];          /* scratch folder, removed by sh_harness_close */
    pt_loaded_plugin plug;  /* $PT_BUILD/protrain_plugin.so */
    sh_tokens all, train, val;
} sh_harness;

/* Plugin log lines at `level` or more severe go to stderr. */
static int sh_harness_log_level = 1; /* PT_LOG_WARN */
static inline void sh_harness_log(void *u, int32_t level, const char *msg) {
    (void)u;
    if (level <= sh_harness_log_level) fprintf(stderr, "protrain: %s\n", msg);
}

/* Scratch folder, plugin, and `n` tokens repeating `text` with stride num/den
 * (structured, so a model learns and gradients are not noise). 0 or -1. */
static inline int sh_harness_open(sh_harness *h, const char *name, const char *text, size_t n,
                                  size_t num, size_t den) {
    memset(h, 0, sizeof *h);
    snprintf(h->dir, sizeof h->dir, "/tmp/%s.XXXXXX", name);
    if (!mkdtemp(h->dir)) return -1;
    const char *b = getenv("PT_BUILD");
    char so[600], err[600];
    snprintf(so, sizeof so, "%s/protrain_plugin.so", b ? b : "build");
    if (pt_plugin_load(so, &h->plug, err, sizeof err) != 0 || !h->plug.table) {
        fprintf(stderr, "%s: cannot load %s: %s\n", name, so, err);
        return -1;
    }
    if (text) {
        size_t len = strlen(text);
        h->all.n = n;
        h->all.tok = malloc(n * sizeof(uint16_t));
        if (!h->all.tok) return -1;
        for (size_t i = 0; i < n; i++) h->all.tok[i] = (uint16_t)(unsigned char)text[(i * num / den) % len];
        sh_data_split(&h->all, &h->train, &h->val);
    }
    return 0;
}

static inline int sh_harness_close(sh_harness *h) {
    pt_plugin_unload(&h->plug);
    sh_data_tokens_free(&h->all);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", h->dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes `text` to <dir>/<name>.ini and returns the path (static buffer). */
static inline const char *sh_harness_ini(const sh_harness *h, const char *name, const char *text) {
    static char path[400];
    snprintf(path, sizeof path, "%s/%s.ini", h->dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs(text, f);
    return fclose(f) == 0 ? path : NULL;
}

/* Trainer options for a model of L blocks, C channels, NH heads, batch B x T. */
static inline sh_train_opts sh_harness_opts(const sh_harness *h, int L, int C, int NH, int B, int T) {
    sh_train_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (sh_dims){.V = 256, .maxT = T, .L = L, .NH = NH, .C = C};
    o.B = B;
    o.T = T;
    o.n_micro = 1;
    o.seed = 7;
    o.lr = 2e-3f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.train = &h->train;
    o.val = &h->val;
    o.log = sh_harness_log;
    return o;
}

static inline int sh_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place. */
static inline double sh_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, sh_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif /* PT_SH_HARNESS_H */
