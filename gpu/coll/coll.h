/*
 * coll.h — collectives between data-parallel ranks, behind one interface so
 * the runtime never sees a transport's types. Three transports implement it:
 * MPI (gpu/coll/mpi/, the host backend: buffers are added by the CPU), NCCL
 * (gpu/coll/nccl/, built as libprotrain_nccl.so and loaded only when picked: the
 * cuda backend, buffers in device memory or host memory) and the host's own
 * collectives (gpu/coll/host/, pt_host_v1.coll: the host moves bytes over its
 * process group, the plugin adds with the CPU; host backend). pt_coll_pick says
 * which one a configuration gets; coll.c dispatches. No other file may include
 * an MPI or NCCL header.
 *
 * Every reduction is deterministic: every element is the sum of the ranks'
 * values in rank order (0, 1, ..., W-1), first addend copied, in the buffer's
 * type, so all ranks hold the same bits and a rerun gives the same bits; the
 * NCCL transport makes the MPI transport's additions in the same order (on a
 * GPU kernel built without contraction; not yet checked on a GPU), so the two
 * are meant to agree bit for bit. Every call has a deadline ([dist] timeout): a
 * rank that exited, hung or fell behind makes the others fail with a sentence
 * instead of blocking forever (the MPI transport names the missing rank; NCCL
 * cannot tell which peer is missing, so its error names this rank). After a
 * failure the group is broken: later calls fail at once.
 *
 * Each call returns with its result in buf. The caller must have finished
 * writing buf (device work on it synchronised) before the call.
 */
#ifndef PT_COLL_H
#define PT_COLL_H

#include <stddef.h>
#include <stdint.h>

typedef struct pt_coll pt_coll;
struct pt_host_coll_v1;   /* protrain.h */

typedef enum pt_coll_dtype { PT_COLL_F32 = 0,
                             PT_COLL_F64 = 1 } pt_coll_dtype;

typedef struct pt_coll_config {
    int32_t world_size, rank;  /* what the host says; checked against MPI's when MPI runs */
    /* "env" or "mpi" (both start MPI if the host did not; NCCL's id then goes
     * from rank 0 to the others over MPI), or "file:///path" (NCCL only: rank 0
     * writes its id to path, the others poll for it; no MPI at all) */
    const char *init_method;
    double timeout_s;          /* deadline of each collective (and of NCCL's set-up) */
    int32_t debug_hang_rank;   /* testing: this rank stops joining collectives; -1 none */
    const char *transport;     /* "mpi", "nccl" or "host", from pt_coll_pick; NULL: "mpi" */
    int32_t device_index;      /* nccl: the CUDA device this rank's communicator uses */
    const char *nccl_lib;      /* nccl: the transport library to load; NULL: beside the
                                  plugin, then the loader path */
    /* host: the host's table (pt_host_v1.coll); init_method, timeout_s,
     * device_index and nccl_lib do not apply (the host's group is joined and
     * keeps its own deadline) */
    const struct pt_host_coll_v1 *host_coll;
} pt_coll_config;

/* The transport for [dist] backend = dist_backend (auto|nccl|mpi) on the device
 * backend named device_backend ("cuda" or "host") with init_method: auto
 * gives nccl on cuda and mpi on host; nccl on host, mpi on cuda and file://
 * with mpi are refused with a sentence. *transport is a static string. */
int pt_coll_pick(const char *dist_backend, const char *device_backend, const char *init_method,
                 const char **transport, char *err, size_t errlen);
/* The same when the host may hand its own collectives (has_table: pt_host_v1.coll
 * is set): with a table, auto and host give "host" on the host backend, and
 * what contradicts the table is refused with a sentence (backend = mpi or
 * nccl, init_method other than env, the cuda backend: the table gets host
 * memory and the plugin adds with the CPU); without one, backend = host is
 * refused and the rest is pt_coll_pick. */
int pt_coll_pick_table(const char *dist_backend, const char *device_backend,
                       const char *init_method, int has_table, const char **transport, char *err,
                       size_t errlen);

/* buf[e] *= scale for n elements of dtype (f32 scaled in f32): the averaging
 * step the transports share after a sum (scale 1: nothing). */
void pt_coll_scale(void *buf, size_t n, int32_t dtype, double scale);

/* Opens cfg->transport. mpi: starts (or joins the host's) MPI and checks its
 * rank and size against cfg. nccl: loads libprotrain_nccl.so, hands rank 0's
 * unique id to every rank (over MPI, or through the file) and joins the
 * communicator on cfg->device_index, all within cfg->timeout_s. */
int pt_coll_open(const pt_coll_config *cfg, pt_coll **out, char *err, size_t errlen);
/* Closes the transport: finalizes MPI when pt_coll_open started it and no
 * collective failed (a broken group cannot finalize: that would wait for the
 * missing rank); destroys the NCCL communicator (aborts it when broken). */
void pt_coll_close(pt_coll *c);
/* This rank stops, for the reason `why` (one sentence): every other rank's
 * collective that is waiting, or that waits later, fails within one poll with
 * "rank r stopped: why" instead of waiting [dist] timeout, and the group is
 * broken here (later calls fail at once). Sent once; c NULL or one rank:
 * nothing. On the mpi transport (and over NCCL's MPI bootstrap, where the NCCL
 * waits do not read it yet: they still end at [dist] timeout; the host
 * transport, a host's own collectives, does not carry it: only this rank's
 * group breaks). Close also tells the others that this rank ended (clean or
 * not), so a rank still waiting for it in a collective fails soon rather than
 * at the deadline. */
void pt_coll_abort(pt_coll *c, const char *why);
/* "mpi", "nccl" or "host" (c NULL: "none") */
const char *pt_coll_transport(const pt_coll *c);
int pt_coll_rank(const pt_coll *c);
int pt_coll_world(const pt_coll *c);

/* Sub-groups. Every rank of c calls this once, at setup, in the same order as
 * its other collectives on c; the ranks passing the same color form one group,
 * ranked by key (ties by their rank in c). Example, tensor parallel of size P
 * inside data parallel: color = rank / P, key = rank gives groups of P
 * consecutive ranks; color = rank % P gives the data-parallel replicas of one
 * shard. A sub-group sums in its own rank order and keeps c's deadline (a
 * barrier on c comes first, so a missing rank is named, not waited for); its
 * seq counts its own collectives. A failure in either breaks both (later calls
 * on either fail at once). Close every sub-group before c; a sub-group never
 * finalizes MPI. A group of one rank makes every collective a local no-op
 * (apart from the scale). mpi transport only: nccl and host refuse with a sentence
 * (PT_ERR_UNSUPPORTED). */
int pt_coll_split(pt_coll *c, int color, int key, pt_coll **sub, char *err, size_t errlen);

/* In place on every rank: buf = scale * (buf_0 + buf_1 + ... + buf_{W-1}), the
 * sum in rank order (elementwise, in the buffer's type), then one multiply by
 * scale (1 = plain sum; 1/W with W a power of two is exact). dtype is one of
 * pt_coll_dtype. `what` names the buffer in errors. */
int pt_coll_allreduce(pt_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                      const char *what, char *err, size_t errlen);
int pt_coll_barrier(pt_coll *c, char *err, size_t errlen);

/* Nonblocking all-reduce, for gradient buckets reduced while backward still
 * runs. The result is the one pt_coll_allreduce gives, bit for bit (same
 * rank-order sum, same scale), formed in buf when the operation completes;
 * until then buf must be neither read nor written. Started operations need
 * no further call to move (every message is posted at the start); the sum is
 * formed by the pt_coll_op_test or pt_coll_op_wait that sees them all in.
 * key (0 <= key < PT_COLL_KEYS) names the buffer: the ranks' operations with
 * the same key are matched with each other whatever order each rank starts
 * them in, or which of its other collectives run meanwhile, so keys must be
 * unique among a rank's unfinished operations. All calls on the thread that
 * makes the other collectives. The receive space is (W-1) * n elements per
 * operation, held until pt_coll_op_free. */
#define PT_COLL_KEYS 16384
typedef struct pt_coll_op pt_coll_op;
/* On success *out is the operation (free it with pt_coll_op_free, done or
 * not); on failure *out is NULL. */
int pt_coll_iallreduce(pt_coll *c, void *buf, size_t n, int32_t dtype, double scale, int32_t key,
                       const char *what, pt_coll_op **out, char *err, size_t errlen);
/* Without blocking: *done = 1 once buf holds the result. */
int pt_coll_op_test(pt_coll *c, pt_coll_op *op, int *done, char *err, size_t errlen);
/* Blocks until the result is in buf, or [dist] timeout after this call (an
 * error naming the rank whose part is missing; the group is broken then). */
int pt_coll_op_wait(pt_coll *c, pt_coll_op *op, char *err, size_t errlen);
/* Frees op (NULL: nothing). An unfinished one is cancelled and the group is
 * marked broken: its peers' messages can no longer be matched. */
void pt_coll_op_free(pt_coll *c, pt_coll_op *op);

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
 * inside a chunk's region), whose parts are the region's parts cut to it.
 * buf is host memory (on the host backend device memory is): the parts are
 * packed into W slots of the longest part's length with the CPU, all-gathered
 * with pt_coll_allgather on either transport, and unpacked, so each rank
 * receives about (W - 1) / W of the slice. */
int pt_coll_allgather_ranges(pt_coll *c, void *buf, const size_t *lo, const size_t *len,
                             size_t elem_size, const char *what, char *err, size_t errlen);
/* Personalised exchange (every pair of ranks its own bytes, like MPI's
 * alltoallv): this rank sends rank p the scount[p] bytes at send + soff[p] and
 * receives rank p's bytes into recv + roff[p], rcount[p] of them (W entries
 * each; rcount[p] here must equal scount[this rank] on rank p: callers derive
 * both sides from one rule, e.g. a parameter's owner and the parts of its
 * region). This rank's own entry is a local copy; a pair with nothing to
 * exchange sends no message. A copy, no arithmetic: the bytes arrive as sent.
 * Host memory (on the host backend device memory is). The MPI transport sends
 * each pair's bytes point to point, so each rank receives only its own; nccl
 * and host run pt_coll_alltoallv_gathered. */
int pt_coll_alltoallv(pt_coll *c, const void *send, const size_t *soff, const size_t *scount,
                      void *recv, const size_t *roff, const size_t *rcount, const char *what,
                      char *err, size_t errlen);
/* The same exchange from the group collectives: one all-reduce of every rank's
 * offsets and counts (W^2 pairs of doubles), then one all-gather of every
 * rank's send buffer padded to the longest, from which each rank copies what
 * is addressed to it. Every rank receives every rank's bytes (about W times the
 * traffic of the point-to-point exchange). What the nccl and host transports
 * run (their tables have no point-to-point call); declared here so the MPI tests check it
 * against the same oracle. A count that does not match its peer's is refused
 * with a sentence naming both ranks. */
int pt_coll_alltoallv_gathered(pt_coll *c, const void *send, const size_t *soff,
                               const size_t *scount, void *recv, const size_t *roff,
                               const size_t *rcount, const char *what, char *err,
                               size_t errlen);
/* In place: every rank passes n elements; afterwards this rank's own part of
 * buf (pt_coll_part) = scale * (part_0 + part_1 + ... + part_{W-1}), summed in
 * rank order exactly as pt_coll_allreduce sums (so the part holds the same
 * bits an all-reduce would leave there). The rest of buf is left as it was. */
int pt_coll_reduce_scatter(pt_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                           const char *what, char *err, size_t errlen);

#endif
