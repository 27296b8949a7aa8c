/*
 * coll_boot.h — bringing up the NCCL transport for the collectives front
 * (coll.c): loading and version-checking libprotrain_nccl.so, and handing
 * rank 0's unique id to every rank, over MPI when it runs or through a file
 * on a filesystem every rank sees ([dist] init_method = file:///path).
 */
#ifndef PT_COLL_BOOT_H
#define PT_COLL_BOOT_H

#include <stddef.h>

#include "coll.h"
#include "coll_mpi.h"
#include "coll_nccl.h"

typedef struct pt_coll_nccl {
    void *dl;                     /* the library's dlopen handle */
    const pt_nccl_coll_ops *ops;  /* its table, version-checked */
    void *h;                      /* the communicator */
} pt_coll_nccl;

/* Loads the library, exchanges the id (over mpi when it is non-NULL, else
 * through cfg->init_method's file) and joins the communicator. On failure out
 * holds nothing to close. */
int pt_coll_nccl_open(const pt_coll_config *cfg, pt_mpi_coll *mpi, pt_coll_nccl *out, char *err,
                      size_t errlen);
void pt_coll_nccl_close(pt_coll_nccl *n);
/* the polling pause of every wait here (100 us) */
void pt_coll_nccl_pause(void);

/* The shared-file rendezvous (exposed for its tests). Rank 0 publishes: the
 * file must not exist (a stale one from a crashed run would hand the others a
 * dead id), and is written under a temporary name then renamed, so a reader
 * sees all of it or nothing. The others fetch: poll until it appears or
 * timeout_s passes; the file says the world size, which must match. Rank 0
 * removes the file once every rank has joined (pt_coll_file_remove). */
int pt_coll_file_publish(const char *path, int world, const unsigned char *id, size_t n,
                         char *err, size_t errlen);
int pt_coll_file_fetch(const char *path, int rank, int world, double timeout_s, unsigned char *id,
                       size_t n, char *err, size_t errlen);
void pt_coll_file_remove(const char *path);

#endif
