/*
 * host_trace.c — the simulated device's op timeline ([host_backend] trace_file).
 *
 * Why: the cost model predicts a step from rates and fixed costs measured by
 * the profiler; when a run disagrees, the phase times calibration sees do not
 * say which op was slow or which stream waited. This records every op the
 * backend runs (its stream, what it was, its size, when it started and ended
 * on the backend's clock) and writes them as text when the backend closes,
 * like a GPU profiler's timeline. Recording costs one clock read per op and an
 * append under the backend's mutex, which the stream thread takes after every
 * op anyway; with the key unset nothing is recorded.
 *
 * File (tab-separated, one op per line, after two comment lines):
 *   stream  op  size  start_us  end_us
 * stream: 0 = the NULL stream (ran on the caller), else 1, 2, ... in creation
 * order; op: memcpy_h2d|memcpy_d2h|memcpy_d2d|memcpy_h2h, memset, host_fn,
 * record (an event marker; start = end), wait (a stream waiting for another's
 * event: the time it blocked), adamw, sqnorm, convert, gemm, cols, svd, eigh,
 * rekls_ew; size: bytes for copies and memsets, elements for adamw, sqnorm
 * and convert, else 0; times: microseconds since the backend opened. At most
 * MAX_RECS ops are kept (the last line says how many more were dropped).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_backend.h"
#include "protrain.h"
#include "pt_util.h"

#define MAX_RECS (1u << 22)   /* 4M ops, 128 MiB: minutes of a small model's training */

typedef struct rec {
    double t0, t1;
    uint64_t size;
    int32_t stream, kind, copy;
} rec;

struct hb_trace {
    FILE *f;
    double t_open;
    rec *r;
    size_t n, cap;
    uint64_t dropped;
};

int pt_hb_trace_open(hb *h, char *err, size_t errlen) {
    if (!h->cfg.trace_file[0]) return PT_OK;
    struct hb_trace *t = calloc(1, sizeof *t);
    if (!t) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "host backend open: out of host memory for the op trace");
    t->f = fopen(h->cfg.trace_file, "w");
    if (!t->f) {
        int e = errno;
        free(t);
        return pt_fail(err, errlen, PT_ERR_CONFIG,
                       "host backend open: [host_backend] trace_file '%s' cannot be written: %s",
                       h->cfg.trace_file, strerror(e));
    }
    t->t_open = pt_now_s();
    h->trace = t;
    return PT_OK;
}

void pt_hb_trace_add(hb *h, const pt_stream *s, const hb_op *op, double t0, double t1) {
    struct hb_trace *t = h->trace;
    if (!t) return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        rec *r = cap <= MAX_RECS ? realloc(t->r, cap * sizeof *r) : NULL;
        if (!r) {
            t->dropped++;
            return;
        }
        t->r = r;
        t->cap = cap;
    }
    uint64_t size = 0;
    int copy = -1;
    switch (op->kind) {
    case HB_OP_MEMCPY: size = op->u.cp.bytes, copy = op->u.cp.kind; break;
    case HB_OP_MEMSET: size = op->u.ms.bytes; break;
    case HB_OP_ADAMW: size = op->u.adamw.n; break;
    case HB_OP_SQNORM: size = op->u.sq.n; break;
    case HB_OP_CONVERT: size = op->u.cv.n; break;
    default: break;
    }
    t->r[t->n++] = (rec){t0, t1, size, s ? s->id : 0, (int32_t)op->kind, copy};
}

static const char *name(const rec *r) {
    static const char *const copies[4] = {"memcpy_h2d", "memcpy_d2h", "memcpy_d2d", "memcpy_h2h"};
    switch ((hb_op_kind)r->kind) {
    case HB_OP_MEMCPY: return r->copy >= 0 && r->copy < 4 ? copies[r->copy] : "memcpy";
    case HB_OP_MEMSET: return "memset";
    case HB_OP_HOSTFN: return "host_fn";
    case HB_OP_RECORD: return "record";
    case HB_OP_WAIT: return "wait";
    case HB_OP_ADAMW: return "adamw";
    case HB_OP_SQNORM: return "sqnorm";
    case HB_OP_CONVERT: return "convert";
    case HB_OP_GEMM: return "gemm";
    case HB_OP_COLS: return "cols";
    case HB_OP_SVD: return "svd";
    case HB_OP_EIGH: return "eigh";
    case HB_OP_REKLS_EW: return "rekls_ew";
    }
    return "?";
}

void pt_hb_trace_close(hb *h) {
    struct hb_trace *t = h->trace;
    if (!t) return;
    h->trace = NULL;
    fprintf(t->f, "# protrain host backend op timeline (%s)\n# stream\top\tsize\tstart_us\tend_us\n",
            h->cfg.trace_file);
    for (size_t i = 0; i < t->n; i++) {
        const rec *r = &t->r[i];
        fprintf(t->f, "%d\t%s\t%llu\t%.1f\t%.1f\n", r->stream, name(r), (unsigned long long)r->size,
                (r->t0 - t->t_open) * 1e6, (r->t1 - t->t_open) * 1e6);
    }
    if (t->dropped) fprintf(t->f, "# %llu more ops not recorded (limit %u)\n", (unsigned long long)t->dropped, MAX_RECS);
    int bad = ferror(t->f) != 0;
    if (fclose(t->f) != 0) bad = 1;
    if (bad && h->log) h->log(h->log_user, PT_LOG_WARN, "host backend: writing the op trace failed");
    free(t->r);
    free(t);
}
