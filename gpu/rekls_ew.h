/*
 * rekls_ew.h — the C loop of the REKLS element-wise kernels (pt_rekls_ew_args
 * in gpu.h) over [begin, end), from the bodies in kernels_hd.h. The CPU
 * optimizer and the host backend's rekls_ew op both run this loop, in index
 * order, so the two paths give the same bits.
 */
#ifndef PT_REKLS_EW_H
#define PT_REKLS_EW_H

#include "gpu.h"
#include "kernels_hd.h"

static inline void pt_rekls_ew_range(const pt_rekls_ew_args *a, size_t begin, size_t end) {
    switch (a->kind) {
    case PT_RK_GRAD_IN:
        for (size_t i = begin; i < end; i++) a->x[i] = pt_load_elem(a->src, a->src_dtype, i) * a->a;
        break;
    case PT_RK_SCALE_COLS:
        for (size_t i = begin; i < end; i++)
            a->x[i] = a->y[i] * pt_rekls_inv_elem(a->lam[i % a->cols], a->b, a->c0);
        break;
    case PT_RK_LERP:
        for (size_t i = begin; i < end; i++) a->x[i] = pt_rekls_lerp_elem(a->x[i], a->y[i], a->a);
        break;
    case PT_RK_COPY:
        for (size_t i = begin; i < end; i++) a->x[i] = a->y[i];
        break;
    case PT_RK_ADAM:
        for (size_t i = begin; i < end; i++)
            a->x[i] = pt_rekls_adam_elem(a->x[i], &a->m[i], &a->v[i], a->a, a->b, a->c0, a->c1,
                                         a->c2);
        break;
    case PT_RK_APPLY:
        for (size_t i = begin; i < end; i++) {
            float p = pt_rekls_apply_elem(a->x[i], a->y[i], a->a, a->c0);
            a->x[i] = p;
            if (a->dst) pt_store_elem(a->dst, a->dst_dtype, i, p);
        }
        break;
    case PT_RK_AXPY:
        for (size_t i = begin; i < end; i++) a->x[i] = pt_rekls_axpy_elem(a->x[i], a->y[i], a->a);
        break;
    default:
        break;
    }
}

/* 1 when the kind is known and its pointers are set. */
static inline int pt_rekls_ew_valid(const pt_rekls_ew_args *a) {
    if (!a || !a->x) return a && a->n == 0;
    switch (a->kind) {
    case PT_RK_GRAD_IN: return a->src && a->src_dtype >= 0 && a->src_dtype <= 2;
    case PT_RK_SCALE_COLS: return a->y && a->lam && a->cols > 0 && a->n % a->cols == 0;
    case PT_RK_LERP:
    case PT_RK_COPY:
    case PT_RK_AXPY: return a->y != NULL;
    case PT_RK_ADAM: return a->m && a->v;
    case PT_RK_APPLY: return a->y && (!a->dst || (a->dst_dtype >= 0 && a->dst_dtype <= 2));
    default: return 0;
    }
}

#endif /* PT_REKLS_EW_H */
