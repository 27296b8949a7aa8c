/*
 * coll_nccl.h — the boundary between the plugin's collectives front (coll.c)
 * and the NCCL transport, which is its own shared object
 * (libprotrain_nccl.so, built from gpu/coll/nccl/) so that the plugin and the
 * single-GPU cuda backend load on machines without NCCL. No NCCL or CUDA type
 * crosses it: the unique id travels as PT_NCCL_ID_BYTES opaque bytes and
 * buffers as pointers.
 *
 * Versioned like the cuda backend's table: the library exports
 * pt_nccl_coll_v<PT_NCCL_COLL_VERSION>, whose head (abi_version, struct_size)
 * the loader checks before reading any op; a mismatch is refused with a
 * sentence naming both versions.
 *
 * Every op has coll.h's meaning (rank-order sums, parts by pt_coll_part,
 * a deadline per call, a broken group after a failure) on buffers that are
 * either device memory of the communicator's device or host memory (staged
 * through the transport's own device buffer). Each call returns when its
 * result is in buf.
 */
#ifndef PT_COLL_NCCL_H
#define PT_COLL_NCCL_H

#include <stddef.h>
#include <stdint.h>

#define PT_NCCL_COLL_VERSION 1u
#define PT_NCCL_COLL_SYMBOL_STEM "pt_nccl_coll"
#define PT_NCCL_COLL_SYMBOL "pt_nccl_coll_v1"
#define PT_NCCL_COLL_LIB "libprotrain_nccl.so"
/* ncclUniqueId's size in every NCCL 2.x (checked by the library at build time) */
#define PT_NCCL_ID_BYTES 128

typedef struct pt_nccl_coll_ops {
    uint32_t abi_version;   /* PT_NCCL_COLL_VERSION */
    uint32_t struct_size;   /* sizeof(pt_nccl_coll_ops) the library was built with */
    /* "NCCL 2.28.9" and the like, for the log */
    void (*describe)(char *buf, size_t cap);
    /* rank 0: a fresh unique id (ncclGetUniqueId) to hand to every rank */
    int (*unique_id)(unsigned char id[PT_NCCL_ID_BYTES], char *err, size_t errlen);
    /* Joins the communicator of `world` ranks named by id as `rank` on CUDA
     * device `device`, giving up (and aborting the half-made communicator)
     * after timeout_s. */
    int (*open)(const unsigned char id[PT_NCCL_ID_BYTES], int rank, int world, int device,
                double timeout_s, void **out, char *err, size_t errlen);
    /* Destroys the communicator (aborts it when a collective failed: a broken
     * group cannot flush) and frees the transport's device buffers. */
    void (*close)(void *h);
    int (*allreduce)(void *h, void *buf, size_t n, int32_t dtype, double scale, const char *what,
                     char *err, size_t errlen);
    int (*allgather)(void *h, void *buf, size_t n, size_t elem_size, const char *what, char *err,
                     size_t errlen);
    int (*reduce_scatter)(void *h, void *buf, size_t n, int32_t dtype, double scale,
                          const char *what, char *err, size_t errlen);
    int (*barrier)(void *h, char *err, size_t errlen);
} pt_nccl_coll_ops;

#endif
