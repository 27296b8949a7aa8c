/*
 * coll_host.h — the host-table transport of coll.h (gpu/coll/host/), as the
 * collectives front (coll.c) calls it: coll.h's operations with coll.h's
 * meaning over the byte-moving ops a host hands in pt_host_v1.coll
 * (protrain.h, pt_host_coll_v1). The host moves bytes; every sum is formed
 * here, in rank order, with the MPI transport's arithmetic, so the two
 * transports leave the same bits.
 *
 * Buffers are host memory (the host backend, where device memory is host
 * memory). No deadline of the plugin's own: a missing rank is the host's
 * library's to time out, and its failure comes back as a sentence. After a
 * failed op the group is broken: later calls fail at once without calling
 * the host.
 */
#ifndef PT_COLL_HOST_H
#define PT_COLL_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"

typedef struct pt_host_coll pt_host_coll;

/* Checks the table (struct_size, all_gather, its rank and world against
 * cfg's, which are pt_host_v1's) and then, with one all_gather, that every
 * rank's table sees the same group: rank p declares rank p of the same world. */
int pt_host_coll_open(const pt_coll_config *cfg, pt_host_coll **out, char *err, size_t errlen);
void pt_host_coll_close(pt_host_coll *c);
int pt_host_coll_rank(const pt_host_coll *c);
int pt_host_coll_world(const pt_host_coll *c);
int pt_host_coll_allreduce(pt_host_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                           const char *what, char *err, size_t errlen);
int pt_host_coll_barrier(pt_host_coll *c, char *err, size_t errlen);
int pt_host_coll_allgather(pt_host_coll *c, void *buf, size_t n, size_t elem_size,
                           const char *what, char *err, size_t errlen);
int pt_host_coll_reduce_scatter(pt_host_coll *c, void *buf, size_t n, int32_t dtype,
                                double scale, const char *what, char *err, size_t errlen);

#endif
