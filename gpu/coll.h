/*
 * coll.h — collectives between data-parallel ranks, behind one interface so
 * the runtime never sees a transport's types (gpu/mpi/ implements it with MPI;
 * no other file may include an MPI header).
 *
 * Every reduction is deterministic: each rank receives every other rank's
 * buffer and adds them in rank order (0, 1, ..., W-1), so all ranks hold the
 * same bits and a rerun gives the same bits. Every call has a deadline
 * ([dist] timeout): a rank that exited, hung or fell behind makes the others
 * fail with a sentence that names it instead of blocking forever. After a
 * failure the group is broken: later calls fail at once.
 *
 * On the host backend device memory is host memory, so buffers may be either.
 */
#ifndef PT_COLL_H
#define PT_COLL_H

#include <stddef.h>
#include <stdint.h>

typedef struct pt_coll pt_coll;

typedef enum pt_coll_dtype { PT_COLL_F32 = 0, PT_COLL_F64 = 1 } pt_coll_dtype;

typedef struct pt_coll_config {
    int32_t world_size, rank;  /* what the host says; checked against the transport's */
    const char *init_method;   /* "env" or "mpi" (both start MPI if the host did not) */
    double timeout_s;          /* deadline of each collective */
    int32_t debug_hang_rank;   /* testing: this rank stops joining collectives; -1 none */
} pt_coll_config;

/* Starts (or joins the host's) MPI and checks its rank and size against cfg. */
int pt_coll_open(const pt_coll_config *cfg, pt_coll **out, char *err, size_t errlen);
/* Finalizes MPI when pt_coll_open started it and no collective failed (a broken
 * group cannot finalize: that would wait for the missing rank). */
void pt_coll_close(pt_coll *c);
int pt_coll_rank(const pt_coll *c);
int pt_coll_world(const pt_coll *c);

/* In place on every rank: buf = scale * (buf_0 + buf_1 + ... + buf_{W-1}), the
 * sum in rank order (elementwise, in the buffer's type), then one multiply by
 * scale (1 = plain sum; 1/W with W a power of two is exact). dtype is one of
 * pt_coll_dtype. `what` names the buffer in errors. */
int pt_coll_allreduce(pt_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                      const char *what, char *err, size_t errlen);
int pt_coll_barrier(pt_coll *c, char *err, size_t errlen);

#endif
