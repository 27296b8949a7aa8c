/*
 * host_ops.c — what each queued op does on the host backend: copies (with the
 * bandwidth throttle), memset, host functions and the numeric kernels. Runs on
 * the stream's worker thread (or the caller for the NULL stream), without h->mu
 * except for the throttle's link bookkeeping.
 *
 * Kernel bodies come from gpu/kernels_hd.h so the CUDA kernels compute the same
 * per-element math. Loops are single-threaded: the simulated device runs one
 * kernel at a time per stream, and tests want bit-exact, order-fixed results.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "host_backend.h"
#include "kernels_hd.h"
#include "la_cpu.h"
#include "rekls_ew.h"
#include "pt_util.h"

/* A pt_now_s() time as the absolute CLOCK_MONOTONIC deadline clock_nanosleep
 * takes (pt_now_s reads that same clock). */
static struct timespec deadline_of(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    long ns = (long)((t - (double)ts.tv_sec) * 1e9);
    ts.tv_nsec = ns < 0 ? 0 : ns > 999999999l ? 999999999l
                                              : ns;
    return ts;
}

/* Throttled copy: reserve the direction's link for bytes/bw seconds starting at
 * max(now, link free), copy, then sleep to the end of the reservation (absolute
 * deadline, so the memcpy time is part of the window, not added to it). */
static void copy_op(hb *h, void *dst, const void *src, size_t bytes, int kind) {
    double bw = h->cfg.copy_bandwidth;
    if (!(bw > 0.0) || kind == PT_GPU_H2H || kind < 0 || kind > PT_GPU_D2D) {
        if (bytes) memmove(dst, src, bytes);
        return;
    }
    double now = pt_now_s();
    pthread_mutex_lock(&h->mu);
    double start = now < h->link_free[kind] ? h->link_free[kind] : now;
    double end = start + (double)bytes / bw;
    h->link_free[kind] = end;
    pthread_mutex_unlock(&h->mu);
    if (bytes) memmove(dst, src, bytes);
    struct timespec deadline = deadline_of(end);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL) == EINTR) {
    }
}

static void adamw_op(const pt_adamw_args *a) {
    pt_adamw_consts c = pt_adamw_make_consts(a->lr, a->beta1, a->beta2, a->eps, a->weight_decay,
                                             a->bc1, a->bc2_rsqrt, a->grad_scale);
    for (size_t i = 0; i < a->n; i++) {
        float p = pt_adamw_elem(&c, a->param[i], a->grad[i], &a->m[i], &a->v[i]);
        a->param[i] = p;
        if (a->param_out) pt_store_elem(a->param_out, a->out_dtype, i, p);
    }
}

void pt_hb_exec(hb *h, hb_op *op) {
    switch (op->kind) {
    case HB_OP_MEMCPY:
        copy_op(h, op->u.cp.dst, op->u.cp.src, op->u.cp.bytes, op->u.cp.kind);
        break;
    case HB_OP_MEMSET:
        if (op->u.ms.bytes) memset(op->u.ms.p, op->u.ms.value, op->u.ms.bytes);
        break;
    case HB_OP_HOSTFN:
        if (op->u.fn.delay_s > 0) {
            struct timespec d = {(time_t)op->u.fn.delay_s,
                                 (long)((op->u.fn.delay_s - (double)(time_t)op->u.fn.delay_s) * 1e9)};
            while (nanosleep(&d, &d) && errno == EINTR) {}
        }
        op->u.fn.fn(op->u.fn.arg);
        break;
    case HB_OP_ADAMW:
        adamw_op(&op->u.adamw);
        break;
    /* REKLS: the very functions the CPU optimizer calls (bit-identical paths) */
    case HB_OP_EIGH: {
        int bad = pt_la_eigh_desc(op->u.eig.n, op->u.eig.A, op->u.eig.w);
        if (bad && op->u.eig.status) *op->u.eig.status = bad;   /* sticky until zeroed */
        break;
    }
    case HB_OP_REKLS_EW:
        pt_rekls_ew_range(&op->u.rew, 0, op->u.rew.n);
        break;
    case HB_OP_SQNORM: {
        /* sum of squares in double (order fixed: i ascending), added once */
        double acc = 0.0;
        for (size_t i = 0; i < op->u.sq.n; i++) {
            double x = (double)pt_load_elem(op->u.sq.x, op->u.sq.dtype, i);
            acc += x * x;
        }
        *op->u.sq.out += acc;
        break;
    }
    case HB_OP_CONVERT: {
        const void *src = op->u.cv.src;
        void *dst = op->u.cv.dst;
        int sd = op->u.cv.src_dtype, dd = op->u.cv.dst_dtype;
        if (op->u.cv.acc) {
            /* dst = round(dst + src), the sum formed in fp32 */
            for (size_t i = 0; i < op->u.cv.n; i++)
                pt_store_elem(dst, dd, i, pt_load_elem(dst, dd, i) + pt_load_elem(src, sd, i));
        } else {
            for (size_t i = 0; i < op->u.cv.n; i++)
                pt_store_elem(dst, dd, i, pt_load_elem(src, sd, i));
        }
        break;
    }
    case HB_OP_GEMM:
    case HB_OP_COLS:
    case HB_OP_SVD:
        pt_hb_exec_linalg(op);
        break;
    case HB_OP_RECORD:
    case HB_OP_WAIT:
        break; /* handled by the worker under the lock */
    }
}
