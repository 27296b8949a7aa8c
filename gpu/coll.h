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

/* The part of an n-element buffer that rank p owns in the sharded collectives
 * below: s = ceil(n / world) elements per part, rank p owns [p*s, p*s + len)
 * with len = min(s, n - p*s) (0 when p*s >= n). Every part but the tail ones
 * is s long, so a rank storing its part in s elements pads at most world - 1
 * elements per buffer. */
static inline void pt_coll_part(size_t n, int world, int p, size_t *lo, size_t *len) {
    size_t w = world > 0 ? (size_t)world : 1, s = (n + w - 1) / w, a = (size_t)p * s;
    *lo = a;
    *len = a >= n ? 0 : (n - a < s ? n - a : s);
}

/* In place on every rank: each rank's own part of buf (pt_coll_part, with
 * n elements of elem_size bytes) is copied into every other rank's buf, so
 * afterwards every rank holds every part. No arithmetic: any element type. */
int pt_coll_allgather(pt_coll *c, void *buf, size_t n, size_t elem_size, const char *what,
                      char *err, size_t errlen);
/* The same for any parts: rank p's elements [lo[p], lo[p] + len[p]) of buf
 * (W entries each, the same on every rank, the ranges disjoint; len 0 gives
 * nothing) are copied into every other rank's buf. pt_coll_allgather is the
 * case lo/len = pt_coll_part. For a slice of a sharded buffer (a parameter
 * inside a chunk's region), whose parts are the region's parts cut to it. */
int pt_coll_allgather_ranges(pt_coll *c, void *buf, const size_t *lo, const size_t *len,
                             size_t elem_size, const char *what, char *err, size_t errlen);
/* In place: every rank passes n elements; afterwards this rank's own part of
 * buf (pt_coll_part) = scale * (part_0 + part_1 + ... + part_{W-1}), summed in
 * rank order exactly as pt_coll_allreduce sums (so the part holds the same
 * bits an all-reduce would leave there). The rest of buf is left as it was. */
int pt_coll_reduce_scatter(pt_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                           const char *what, char *err, size_t errlen);

#endif
