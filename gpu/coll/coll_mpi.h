/*
 * coll_mpi.h — the MPI transport of coll.h (gpu/coll/mpi/coll_mpi.c), as the
 * collectives front (coll.c) calls it: coll.h's operations with coll.h's
 * meaning, on a handle of its own. No MPI type in it. The front also uses it
 * to hand NCCL's unique id from rank 0 to the others when MPI is there.
 */
#ifndef PT_COLL_MPI_H
#define PT_COLL_MPI_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"

typedef struct pt_mpi_coll pt_mpi_coll;

int pt_mpi_coll_open(const pt_coll_config *cfg, pt_mpi_coll **out, char *err, size_t errlen);
void pt_mpi_coll_close(pt_mpi_coll *c);
/* Another transport's group (NCCL's, bootstrapped here) broke: a rank may be
 * gone, so close must not finalize MPI (that would wait for it). */
void pt_mpi_coll_mark_broken(pt_mpi_coll *c);
/* coll.h's pt_coll_abort on this transport: the abort notice to every peer. */
void pt_mpi_coll_abort(pt_mpi_coll *c, const char *why);
/* coll.h's pt_coll_split on this transport (MPI_Comm_split after a barrier). */
int pt_mpi_coll_split(pt_mpi_coll *c, int color, int key, pt_mpi_coll **sub, char *err,
                      size_t errlen);
int pt_mpi_coll_rank(const pt_mpi_coll *c);
int pt_mpi_coll_world(const pt_mpi_coll *c);
int pt_mpi_coll_allreduce(pt_mpi_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                          const char *what, char *err, size_t errlen);
int pt_mpi_coll_barrier(pt_mpi_coll *c, char *err, size_t errlen);
int pt_mpi_coll_allgather(pt_mpi_coll *c, void *buf, size_t n, size_t elem_size,
                          const char *what, char *err, size_t errlen);
int pt_mpi_coll_reduce_scatter(pt_mpi_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                               const char *what, char *err, size_t errlen);
int pt_mpi_coll_alltoallv(pt_mpi_coll *c, const void *send, const size_t *soff,
                          const size_t *scount, void *recv, const size_t *roff,
                          const size_t *rcount, const char *what, char *err, size_t errlen);
/* coll.h's keyed nonblocking all-reduce (pt_coll_iallreduce and the rest) */
typedef struct pt_mpi_op pt_mpi_op;
int pt_mpi_coll_iallreduce(pt_mpi_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                           int32_t key, const char *what, pt_mpi_op **out, char *err,
                           size_t errlen);
int pt_mpi_coll_op_test(pt_mpi_coll *c, pt_mpi_op *op, int *done, char *err, size_t errlen);
int pt_mpi_coll_op_wait(pt_mpi_coll *c, pt_mpi_op *op, char *err, size_t errlen);
void pt_mpi_coll_op_free(pt_mpi_coll *c, pt_mpi_op *op);

#endif
