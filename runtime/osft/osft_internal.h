/*
 * osft_internal.h — OSFT's private state, shared by osft.c (decomposition, the
 * factorised hooks, read_param, launch) and osft_proj.c (the gradient and
 * value projections). Code outside these two files uses osft.h.
 */
#ifndef PT_CORE_OSFT_INTERNAL_H
#define PT_CORE_OSFT_INTERNAL_H

#include <pthread.h>

#include "device_ext.h"
#include "osft.h"
#include "core/rt_internal.h"

typedef struct tgt {
    int hidx;                 /* host param index */
    int block;
    int64_t N, M, R, k, kl;   /* out, in, rank, frozen, trainable */
    int x[PT_OSFT_NF];        /* expanded indices; the high ones -1 when k == 0 */
} tgt;

/* Factor addresses of one target: data of the six, gradients of the low three. */
typedef struct fptr {
    const float *d[PT_OSFT_NF];
    float *g[PT_OSFT_NF];
} fptr;

struct pt_osft {
    pt_model_v1 xm;           /* what the store lays out */
    pt_param_v1 *xp;
    char (*names)[160];
    float *vals;              /* the factors' initial values, host memory */
    int *map;                 /* [host n] expanded index of a non-target, -1 for a target */
    int *tmap;                /* [host n] target index, or -1 */
    int n_host;
    int n;
    tgt *t;
    /* device scratch for the hooks and projections, sized at setup for batch x seq
     * rows: every use runs on the compute stream (queued there, or inside work
     * launched on it), so one buffer serves them all in turn; a call with more
     * rows allocates its own */
    float *scr;
    uint64_t scr_floats;
    /* mode C: one projection path's two whole factors, gathered from the ranks'
     * parts (pinned, allocated at the first need: max over targets of
     * max(N, M) x R floats, [frozen | trainable]) */
    float *full;
    uint64_t full_floats;
    float **fzc;              /* [n x 2] [osft] cache_frozen: each path's frozen factor whole
                               * (pinned), filled by its first gather; NULL entries until then */
    double split_s, gather_s; /* mode C: seconds in those projections, of which gathering */
    int64_t split_steps;      /* optimizer steps that ran them */
    pthread_mutex_t mu;       /* async_* (written by the compute thread) */
    int async_rc;
    char async_err[256];
};

/* OSFT's state in the runtime object (its pt_rt_ext slot): NULL while OSFT is
 * not in force. */
static inline pt_osft *osft_of(const pt_rt *rt) { return pt_rt_ext_state(rt, &pt_osft_ext); }


/* A run of products: backend ops on stream s (NULL: now, on this thread), or
 * with cpu set the CPU's own GEMM (the same cblas_sgemm call the host
 * backend's gemm_f32 makes, so the same bits) on host memory. */
typedef struct lin {
    const pt_gpu_backend *ops;
    void *impl;
    pt_stream *s;
    int cpu;
    int rc;
} lin;

/* C = alpha op(A) op(B) + beta C, row-major, leading dimensions as stored. */
void pt_osft_mm(lin *L, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                int64_t ldc);
/* The factor addresses the store lends now. */
void pt_osft_live_ptrs(const pt_osft *o, const tgt *t, fptr *f);
/* In launched work: ops run now on this thread; else queued on the compute stream. */
void pt_osft_lin_open(pt_rt *rt, lin *L);
/* A failed op as one sentence; ops queued for a host computing on its own
 * thread are waited for first. */
int pt_osft_lin_close(pt_rt *rt, lin *L, const char *what, char *err, size_t errlen);
/* Mode C, one projection path of one target whose factors lie in chunks
 * split across the ranks (osft_proj.c, project_split, gives why gathered): the
 * split factors gathered whole, the single-rank products run on them, and
 * this rank's own elements of the trainable factor kept. The gather is a
 * callback so the path runs apart from the runtime too (the plugin:
 * pt_coll_allgather_ranges over the store's parts; tests/unit/test_osft_dist.c:
 * an in-process copy of every rank's part). */
typedef struct pt_osft_split {
    const pt_store_part *pf, *pq;  /* this rank's part of the frozen and trainable factor */
    const float *fz;               /* the frozen factor whole already (cached), or NULL */
    float *f, *q;                  /* room for the frozen and the trainable factor whole */
    float *c;                      /* coefficients, k x kl floats */
    /* factor `index` whole into dst on every rank, `own` (this rank's part) included */
    int (*gather)(void *user, int32_t index, float *dst, const pt_store_part *own, char *err,
                  size_t errlen);
    int (*sync)(void *user);       /* wait for the products (NULL: they ran on this thread) */
    void *user;
} pt_osft_split;
int pt_osft_split_path(lin *L, const tgt *t, int v, const pt_osft_split *s, char *err,
                       size_t errlen);
/* n floats of device scratch: the shared buffer, or (larger) an allocation of its own. */
int pt_osft_scratch_get(pt_rt *rt, uint64_t n, float **p, char *err, size_t errlen);
void pt_osft_scratch_free(pt_rt *rt, void *p);

#endif
