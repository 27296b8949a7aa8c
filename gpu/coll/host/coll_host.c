/*
 * coll_host.c — coll.h over the host's own collectives (pt_host_coll_v1).
 *
 * The host's ops move bytes; the sums are formed here so they are the MPI
 * transport's (rank order, first addend as is, f32 in f32, one multiply by
 * scale) whatever library the host uses:
 *   reduce-scatter: each rank cuts its buffer into the W parts of
 *     pt_coll_part and sends part q to rank q (all_to_all); rank q then holds
 *     every rank's copy of its part, in rank order, and adds them;
 *   all-gather: every rank contributes its part (all_gather) and copies the
 *     others' parts into place;
 *   all-reduce = reduce-scatter, then all-gather of the summed parts: each
 *     element's sum is formed once, by its owner, and copied to the others,
 *     so every rank holds the same bits (2(W-1)/W of the buffer received per
 *     rank, what a ring all-reduce moves).
 * Without the table's all_to_all, a rank's blocks for every rank travel by
 * all_gather and each rank keeps the column addressed to it (W times the
 * bytes received).
 *
 * Buffers travel in segments of `seg` elements of the longest part (the same
 * count on every rank: tail parts are padded), so the staging space is two
 * buffers of W x SEG_ELEMS x 8 bytes whatever the chunk size.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/coll_host.h"
#include "protrain.h"
#include "pt_util.h"

/* Elements per segment of a part: 2 MiB of f64 per rank's block. */
#define SEG_ELEMS ((size_t)1 << 18)

struct pt_host_coll {
    int world, rank;
    int broken;           /* an op failed: no further call to the host */
    unsigned seq;         /* collectives so far (error text) */
    const pt_host_coll_v1 *t;
    int32_t (*a2a)(void *, const void *, void *, uint64_t, char *, uint64_t);  /* or NULL */
    int32_t (*bar)(void *, char *, uint64_t);                                  /* or NULL */
    size_t seg;           /* elements per segment: SEG_ELEMS, / W without all_to_all */
    char *send, *recv;    /* staging: W x SEG_ELEMS x 8 bytes (recv SEG_ELEMS x 8 more
                             without all_to_all) */
};

/* Field f of the host's table when its struct_size covers it, else NULL. */
#define HAS_FIELD(t, f) \
    ((t)->struct_size >= offsetof(pt_host_coll_v1, f) + sizeof((t)->f) ? (t)->f : NULL)

static int begin(pt_host_coll *c, const char *what, char *err, size_t errlen) {
    if (c->broken)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] %s: an earlier collective failed; the group is broken", what);
    c->seq++;
    return PT_OK;
}

/* The host's answer: 0, or the group is broken and its sentence is quoted. */
static int answer(pt_host_coll *c, int32_t rc, const char *op, const char *what, char *msg,
                  size_t msgcap, char *err, size_t errlen) {
    if (!rc) return PT_OK;
    c->broken = 1;
    msg[msgcap - 1] = '\0';
    return pt_fail(err, errlen, PT_ERR_BACKEND,
                   "[dist] %s (collective %u): the host's %s failed on rank %d with code %d: %s",
                   what, c->seq, op, c->rank, (int)rc,
                   msg[0] ? msg : "(the host gave no message)");
}

static int gather(pt_host_coll *c, const void *send, void *recv, size_t bytes, const char *what,
                  char *err, size_t errlen) {
    char msg[512] = "";
    int32_t rc = c->t->all_gather(c->t->user, send, recv, (uint64_t)bytes, msg, sizeof msg);
    return answer(c, rc, "all_gather", what, msg, sizeof msg, err, errlen);
}

/* c->send holds W blocks of `bytes` (block q for rank q); afterwards c->recv
 * holds W blocks (block p from rank p). */
static int exchange(pt_host_coll *c, size_t bytes, const char *what, char *err, size_t errlen) {
    char msg[512] = "";
    if (c->a2a) {
        int32_t rc = c->a2a(c->t->user, c->send, c->recv, (uint64_t)bytes, msg, sizeof msg);
        return answer(c, rc, "all_to_all", what, msg, sizeof msg, err, errlen);
    }
    /* all_gather of every rank's W blocks: rank p's W blocks land at
     * p * W * bytes; keep block `rank` of each (the segment is W times
     * shorter here, so W * W blocks fit the recv staging) */
    size_t W = (size_t)c->world, row = W * bytes;
    char *all = c->recv + row;   /* the blocks kept below go to c->recv[0, row) */
    int rc = gather(c, c->send, all, row, what, err, errlen);
    for (size_t p = 0; !rc && p < W; p++)
        memmove(c->recv + p * bytes, all + p * row + (size_t)c->rank * bytes, bytes);
    return rc;
}

int pt_host_coll_open(const pt_coll_config *cfg, pt_host_coll **out, char *err, size_t errlen) {
    *out = NULL;
    const pt_host_coll_v1 *t = cfg->host_coll;
    if (!t)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] backend = host: the host gave "
                                                        "no collectives table (pt_host_v1.coll is NULL)");
    if (t->struct_size < offsetof(pt_host_coll_v1, all_gather) + sizeof t->all_gather ||
        !t->all_gather)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "init: pt_host_v1.coll is not usable: struct_size %u (need at least %zu) "
                       "and all_gather %s",
                       t->struct_size,
                       offsetof(pt_host_coll_v1, all_gather) + sizeof t->all_gather,
                       t->all_gather ? "set" : "NULL");
    if (t->rank != cfg->rank || t->world_size != cfg->world_size)
        return pt_fail(err, errlen, PT_ERR_CONFIG,
                       "[dist]: the host's collectives table says rank %d of %d but pt_host_v1 "
                       "says rank %d of %d; pass the process group's numbers in both",
                       t->rank, t->world_size, cfg->rank, cfg->world_size);
    if (cfg->debug_hang_rank >= 0)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[testing] debug_hang_rank = %d with the host's collectives: the "
                       "deadline is the host's, which the plugin cannot play",
                       cfg->debug_hang_rank);
    pt_host_coll *c = calloc(1, sizeof *c);
    if (!c) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    c->world = cfg->world_size;
    c->rank = cfg->rank;
    c->t = t;
    c->a2a = HAS_FIELD(t, all_to_all);
    c->bar = HAS_FIELD(t, barrier);
    c->seg = c->a2a ? SEG_ELEMS : (SEG_ELEMS / (size_t)c->world ? SEG_ELEMS / (size_t)c->world : 1);
    /* W blocks of at most seg elements of 8 bytes: stage bytes. Without
     * all_to_all, exchange() gathers W rows of W blocks after the row it
     * keeps, each row at most SEG_ELEMS * 8 bytes (W * seg <= SEG_ELEMS) */
    size_t stage = (size_t)c->world * SEG_ELEMS * 8;
    c->send = malloc(stage);
    c->recv = malloc(c->a2a ? stage : stage + SEG_ELEMS * 8);
    if (!c->send || !c->recv) {
        pt_host_coll_close(c);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    }
    /* every rank's table must see the same group: rank p declares p of W */
    int32_t mine[2] = {c->rank, c->world};
    int32_t *all = calloc((size_t)c->world * 2, sizeof *all);
    int rc = all ? gather(c, mine, all, sizeof mine, "the ranks' start-up exchange", err, errlen)
                 : pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    for (int p = 0; !rc && p < c->world; p++)
        if (all[2 * p] != p || all[2 * p + 1] != c->world)
            rc = pt_fail(err, errlen, PT_ERR_CONFIG,
                         "[dist]: the host's collectives disagree on the group: slot %d of the "
                         "start-up exchange holds rank %d of %d, this rank %d expected rank %d "
                         "of %d",
                         p, all[2 * p], all[2 * p + 1], c->rank, p, c->world);
    free(all);
    if (rc) {
        pt_host_coll_close(c);
        return rc;
    }
    *out = c;
    return PT_OK;
}

void pt_host_coll_close(pt_host_coll *c) {
    if (!c) return;
    free(c->send);
    free(c->recv);
    free(c);
}

int pt_host_coll_rank(const pt_host_coll *c) { return c ? c->rank : 0; }
int pt_host_coll_world(const pt_host_coll *c) { return c ? c->world : 1; }

static int check_dtype(int32_t dtype, const void *buf, size_t n, const char *what, char *err,
                       size_t errlen) {
    if (dtype != PT_COLL_F32 && dtype != PT_COLL_F64)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: dtype %d is not f32 or f64",
                       what, (int)dtype);
    if (n && !buf)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: %zu elements from NULL",
                       what, n);
    return PT_OK;
}

/* dst[e] = blk_0[e] + blk_1[e] + ... + blk_{W-1}[e], blocks `stride` bytes
 * apart, the first addend taken as is, f32 sums in f32. */
static void sum_blocks(void *dst, const char *blk, size_t stride, int w, size_t m, int32_t dtype) {
    if (dtype == PT_COLL_F32) {
        for (size_t e = 0; e < m; e++) {
            float a = ((const float *)blk)[e];
            for (int p = 1; p < w; p++) a += ((const float *)(blk + (size_t)p * stride))[e];
            ((float *)dst)[e] = a;
        }
    } else {
        for (size_t e = 0; e < m; e++) {
            double a = ((const double *)blk)[e];
            for (int p = 1; p < w; p++) a += ((const double *)(blk + (size_t)p * stride))[e];
            ((double *)dst)[e] = a;
        }
    }
}

/* elements of a part of length len in the segment starting at off */
static size_t seg_len(size_t len, size_t off, size_t seg) {
    if (off >= len) return 0;
    return len - off < seg ? len - off : seg;
}

static int reduce_scatter(pt_host_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                          const char *what, char *err, size_t errlen) {
    size_t es = dtype == PT_COLL_F64 ? 8 : 4, z, s_part, lo_me, len_me;
    pt_coll_part(n, c->world, 0, &z, &s_part);   /* rank 0's part is the longest */
    pt_coll_part(n, c->world, c->rank, &lo_me, &len_me);
    for (size_t off = 0; off < s_part; off += c->seg) {
        size_t m = seg_len(s_part, off, c->seg), block = m * es;
        for (int q = 0; q < c->world; q++) {
            size_t lo, len;
            pt_coll_part(n, c->world, q, &lo, &len);
            size_t mq = seg_len(len, off, c->seg);
            char *dst = c->send + (size_t)q * block;
            if (mq) memcpy(dst, (char *)buf + (lo + off) * es, mq * es);
            memset(dst + mq * es, 0, block - mq * es);   /* a tail part's padding */
        }
        int rc = exchange(c, block, what, err, errlen);
        if (rc) return rc;
        size_t mm = seg_len(len_me, off, c->seg);
        if (mm) sum_blocks((char *)buf + (lo_me + off) * es, c->recv, block, c->world, mm, dtype);
    }
    pt_coll_scale((char *)buf + lo_me * es, len_me, dtype, scale);
    return PT_OK;
}

static int allgather(pt_host_coll *c, void *buf, size_t n, size_t es, const char *what,
                     char *err, size_t errlen) {
    size_t z, s_part, lo_me, len_me;
    pt_coll_part(n, c->world, 0, &z, &s_part);
    pt_coll_part(n, c->world, c->rank, &lo_me, &len_me);
    for (size_t off = 0; off < s_part; off += c->seg) {
        size_t m = seg_len(s_part, off, c->seg), block = m * es, mm = seg_len(len_me, off, c->seg);
        if (mm) memcpy(c->send, (char *)buf + (lo_me + off) * es, mm * es);
        memset(c->send + mm * es, 0, block - mm * es);
        int rc = gather(c, c->send, c->recv, block, what, err, errlen);
        if (rc) return rc;
        for (int p = 0; p < c->world; p++) {
            size_t lo, len;
            pt_coll_part(n, c->world, p, &lo, &len);
            size_t mp = seg_len(len, off, c->seg);
            if (p != c->rank && mp)
                memcpy((char *)buf + (lo + off) * es, c->recv + (size_t)p * block, mp * es);
        }
    }
    return PT_OK;
}

int pt_host_coll_reduce_scatter(pt_host_coll *c, void *buf, size_t n, int32_t dtype,
                                double scale, const char *what, char *err, size_t errlen) {
    int rc = check_dtype(dtype, buf, n, what, err, errlen);
    if (rc) return rc;
    if (!c || c->world == 1) {
        pt_coll_scale(buf, n, dtype, scale);
        return PT_OK;
    }
    return (rc = begin(c, what, err, errlen)) ? rc
                                              : reduce_scatter(c, buf, n, dtype, scale, what,
                                                               err, errlen);
}

int pt_host_coll_allreduce(pt_host_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                           const char *what, char *err, size_t errlen) {
    int rc = check_dtype(dtype, buf, n, what, err, errlen);
    if (rc) return rc;
    if (!c || c->world == 1) {
        pt_coll_scale(buf, n, dtype, scale);
        return PT_OK;
    }
    if ((rc = begin(c, what, err, errlen))) return rc;
    rc = reduce_scatter(c, buf, n, dtype, scale, what, err, errlen);
    return rc ? rc : allgather(c, buf, n, dtype == PT_COLL_F64 ? 8 : 4, what, err, errlen);
}

int pt_host_coll_allgather(pt_host_coll *c, void *buf, size_t n, size_t elem_size,
                           const char *what, char *err, size_t errlen) {
    if (!c || c->world == 1) return PT_OK;
    if (!elem_size || elem_size > 8 || (n && !buf))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "[dist] %s: all-gather of %zu elements of %zu bytes from %p", what, n,
                       elem_size, buf);
    int rc = begin(c, what, err, errlen);
    return rc ? rc : allgather(c, buf, n, elem_size, what, err, errlen);
}

int pt_host_coll_barrier(pt_host_coll *c, char *err, size_t errlen) {
    if (!c || c->world == 1) return PT_OK;
    int rc = begin(c, "barrier", err, errlen);
    if (rc) return rc;
    if (!c->bar) {
        uint64_t one = 1;
        return gather(c, &one, c->recv, sizeof one, "barrier", err, errlen);
    }
    char msg[512] = "";
    return answer(c, c->bar(c->t->user, msg, sizeof msg), "barrier", "barrier", msg, sizeof msg,
                  err, errlen);
}
