/*
 * device_internal.h — the device object shared by the files of the device
 * wrapper (device.c, pinned.c, backend_lib.c). Nothing outside gpu/ includes it.
 */
#ifndef PT_DEVICE_INTERNAL_H
#define PT_DEVICE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "device_ext.h"
#include "extents.h"
#include "gpu.h"

struct pt_gpu {
    const pt_gpu_backend *ops;
    void *impl;
    void *dl;                  /* cuda backend library handle, or NULL */
    pt_gpu_config cfg;
    pthread_mutex_t mu;
    uint8_t *base;             /* the reservation: capacity bytes */
    uint64_t oom_need;         /* capacity the last failed allocation needed (0: none) */
    uint64_t oom_tags[PT_TAG_COUNT]; /* bytes in use per tag when it failed */
    pt_extents dev;            /* sub-allocation of the reservation */
    /* measuring (pt_gpu_measure_begin): a second range past the capacity that
     * recorded allocations spill into instead of failing; ovf_peak is the
     * highest end offset used, counting the overflow range as lying right
     * after the capacity */
    int measuring, overflowed;
    uint8_t *ovf_base;
    uint64_t ovf_size, ovf_peak;
    pt_extents ovf;
    pt_ptrmap live;            /* device pointer -> pt_blk* */
    pt_ptrmap pinned;          /* pinned pointer (own host_alloc) -> bytes */
    /* the pinned arena (pt_gpu_pinned_reserve): one host_alloc of pin_size
     * bytes at pin_base, carved for later pinned allocations */
    uint8_t *pin_base;
    uint64_t pin_size;
    pt_extents pin;
    pt_ptrmap pin_live;        /* pinned pointer inside the arena -> pt_blk* */
    uint64_t attempts;         /* pt_gpu_alloc calls so far (failure injection) */
    pt_gpu_usage u;
    /* The log hook has its own lock: the backend reports through it from inside
     * ops that device.c calls with mu held (host_alloc, for one). */
    pthread_mutex_t log_mu;
    pt_gpu_log_fn log;
    void *log_user;
    char fallback[768];        /* why auto did not open cuda; "" otherwise */
};

/* The mutex is logically mutable: const getters lock it too. */
static inline pthread_mutex_t *pt_gpu_mu(const pt_gpu *g) { return (pthread_mutex_t *)&g->mu; }

/* The device address of a block, in the reservation or the overflow range. */
static inline uint8_t *pt_gpu_blk_addr(const pt_gpu *g, const pt_blk *x) {
    return (x->ovf ? g->ovf_base : g->base) + x->off;
}

/* backend_lib.c: load the cuda backend library (lib as given, or NULL: beside
 * the file this code is linked into, then the loader path) and take its table,
 * or say in err why it is refused. */
int pt_gpu_load_cuda(const char *lib, const pt_gpu_backend **ops, void **dl, char *err,
                     size_t errlen);

/* dev_access.c: a clause ("it lies 256 bytes into a dev_alloc block of ...")
 * saying what the device address p is; g->mu held. */
void pt_gpu_describe_locked(const pt_gpu *g, const void *p, char *buf, size_t n);

/* pinned.c: frees the arena and any pinned allocation still live, reporting
 * leaks to the log (called by pt_gpu_close with no lock held). */
void pt_gpu_pinned_close(pt_gpu *g);

#endif /* PT_DEVICE_INTERNAL_H */
