/*
 * coll_mpi.c — coll.h over MPI point-to-point messages.
 *
 * Why not MPI_Allreduce: its reduction order is the library's choice (it may
 * change with the message size, the process count or the library version), so
 * sums would not be reproducible and would not match a single rank that
 * accumulates micro-batches in order. Instead every rank sends its buffer to
 * every other rank and adds the W buffers in rank order itself; each message is
 * its own request, so when the deadline passes we know exactly which rank's
 * part is missing and can name it. Buffers travel in segments so the receive
 * space stays bounded (W-1 segments) whatever the chunk size.
 *
 * All calls come from the thread that calls the plugin's hooks
 * (MPI_THREAD_FUNNELED is enough). Traffic uses a duplicate of
 * MPI_COMM_WORLD, so a host that uses MPI itself cannot match our messages.
 */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll.h"
#include "coll_mpi.h"
#include "protrain.h"
#include "pt_util.h"

/* Elements per segment: 1 Mi floats = 4 MiB per peer in flight. */
#define SEG_ELEMS ((size_t)1 << 20)

struct pt_mpi_coll {
    int world, rank;
    int we_init;        /* pt_coll_open called MPI_Init_thread */
    int broken;         /* a collective failed: no further collective, no finalize */
    double timeout_s;
    int hang_rank;
    unsigned seq;       /* collectives so far (message tags, error text) */
    MPI_Comm comm;
    void *recv;         /* (world-1) segments of the widest type */
    MPI_Request *req;   /* 2*(world-1) */
};

static void pause_briefly(void) {
    /* polling at 100 us keeps latency low without spinning a core the CPU
     * optimizer's threads need */
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

static const char *mpi_text(int code, char *buf, size_t cap) {
    int len = 0;
    char s[MPI_MAX_ERROR_STRING];
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "code %d", code);
    snprintf(buf, cap, "%s", s);
    return buf;
}

int pt_mpi_coll_open(const pt_coll_config *cfg, pt_mpi_coll **out, char *err, size_t errlen) {
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[dist]: MPI was already finalized in this process (an earlier plugin "
                       "instance or the host); MPI cannot start twice");
    MPI_Initialized(&inited);
    pt_mpi_coll *c = calloc(1, sizeof *c);
    if (!c) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    if (!inited) {
        /* The plugin is dlopened RTLD_LOCAL; Open MPI's own components are
         * dlopened later and need libmpi's symbols global. Promote it (it is
         * already loaded as our dependency, NOLOAD only changes its scope). */
        (void)dlopen("libmpi.so.40", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        int prov = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &prov) != MPI_SUCCESS) {
            free(c);
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "[dist] init_method = %s: MPI_Init_thread failed (run the host under "
                           "mpirun)", cfg->init_method);
        }
        c->we_init = 1;
    }
    int w = 0, r = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &w);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    if (w != cfg->world_size || r != cfg->rank) {
        pt_mpi_coll_close(c);
        return pt_fail(err, errlen, PT_ERR_CONFIG,
                       "[dist]: the host says rank %d of %d, MPI says rank %d of %d (start every "
                       "rank with mpirun and pass MPI's numbers in pt_host_v1)",
                       cfg->rank, cfg->world_size, r, w);
    }
    c->world = w;
    c->rank = r;
    c->timeout_s = cfg->timeout_s;
    c->hang_rank = cfg->debug_hang_rank;
    c->comm = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS) {
        pt_mpi_coll_close(c);
        return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist]: MPI_Comm_dup failed");
    }
    /* a failed peer must become an error we report, not an abort inside MPI */
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    c->recv = malloc((size_t)(w > 1 ? w - 1 : 1) * SEG_ELEMS * sizeof(double));
    c->req = calloc((size_t)(2 * w), sizeof *c->req);
    if (!c->recv || !c->req) {
        pt_mpi_coll_close(c);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    }
    *out = c;
    return PT_OK;
}

void pt_mpi_coll_close(pt_mpi_coll *c) {
    if (!c) return;
    if (!c->broken) {
        if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
        if (c->we_init) MPI_Finalize();
    }
    free(c->recv);
    free(c->req);
    free(c);
}

void pt_mpi_coll_mark_broken(pt_mpi_coll *c) {
    if (c) c->broken = 1;
}

int pt_mpi_coll_rank(const pt_mpi_coll *c) { return c ? c->rank : 0; }
int pt_mpi_coll_world(const pt_mpi_coll *c) { return c ? c->world : 1; }

/* Waits for the 2*(W-1) requests (receives first, then sends) until the
 * deadline; on a miss names the first peer whose message is outstanding. */
static int wait_all(pt_mpi_coll *c, int nreq, const int *peer, double deadline, const char *what,
                    char *err, size_t errlen) {
    int left = nreq;
    while (left > 0) {
        for (int i = 0; i < nreq; i++) {
            if (c->req[i] == MPI_REQUEST_NULL) continue;
            int done = 0;
            MPI_Status stt;
            int rc = MPI_Test(&c->req[i], &done, &stt);
            if (rc != MPI_SUCCESS) {
                char t[MPI_MAX_ERROR_STRING];
                c->broken = 1;
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "[dist] %s (collective %u): the message %s rank %d failed: %s",
                               what, c->seq, i < nreq / 2 ? "from" : "to", peer[i],
                               mpi_text(rc, t, sizeof t));
            }
            if (done) left--;
        }
        if (!left) break;
        if (pt_now_s() > deadline) {
            for (int i = 0; i < nreq; i++)
                if (c->req[i] != MPI_REQUEST_NULL) {
                    c->broken = 1;
                    return pt_fail(err, errlen, PT_ERR_BACKEND,
                                   "[dist] %s (collective %u): rank %d did not %s within "
                                   "[dist] timeout = %g s (it exited, hung or fell behind); "
                                   "this rank stops", what, c->seq, peer[i],
                                   i < nreq / 2 ? "send its part" : "take this rank's part",
                                   c->timeout_s);
                }
        }
        pause_briefly();
    }
    return PT_OK;
}

/* What every collective does first: refuse on a broken group, count it (tags,
 * error text), and play the hung rank when a test asks for one. */
static int begin(pt_mpi_coll *c, const char *what, char *err, size_t errlen) {
    if (c->broken)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] %s: an earlier collective failed; the group is broken", what);
    c->seq++;
    if (c->rank == c->hang_rank) {
        /* testing: behave like a rank stuck outside the collective; the others
         * must time out and name this rank (mpirun then ends this one) */
        double until = pt_now_s() + 20 * c->timeout_s + 10;
        while (pt_now_s() < until) pause_briefly();
        c->broken = 1;
        return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist] %s: [dist] debug_hang_rank = %d: "
                       "this rank hung on purpose", what, c->hang_rank);
    }
    return PT_OK;
}

static void scale_buf(void *buf, size_t n, int32_t dtype, double scale) {
    if (scale == 1.0) return;
    if (dtype == PT_COLL_F64) {
        for (size_t e = 0; e < n; e++) ((double *)buf)[e] *= scale;
    } else {
        float s = (float)scale;
        for (size_t e = 0; e < n; e++) ((float *)buf)[e] *= s;
    }
}

/* acc[e] += src[e] for m elements of dtype (f32 sums stay f32: a single rank
 * accumulating micro-batches adds in f32 too). */
static void add_into(void *acc, const void *src, size_t m, int dtype) {
    if (dtype == PT_COLL_F32) {
        float *a = acc;
        const float *x = src;
        for (size_t e = 0; e < m; e++) a[e] += x[e];
    } else {
        double *a = acc;
        const double *x = src;
        for (size_t e = 0; e < m; e++) a[e] += x[e];
    }
}

int pt_mpi_coll_allreduce(pt_mpi_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                      const char *what, char *err, size_t errlen) {
    if (!c || c->world == 1) {
        scale_buf(buf, n, dtype, scale);
        return PT_OK;
    }
    if (dtype != PT_COLL_F32 && dtype != PT_COLL_F64)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: dtype %d is not f32 or f64",
                       what, (int)dtype);
    int brc = begin(c, what, err, errlen);
    if (brc) return brc;
    size_t es = dtype == PT_COLL_F64 ? 8 : 4;
    MPI_Datatype mt = dtype == PT_COLL_F64 ? MPI_DOUBLE : MPI_FLOAT;
    int np = c->world - 1;
    int *peer = malloc(sizeof(int) * (size_t)(2 * np));
    /* one segment's sum, reused by every segment */
    void *acc = malloc((n < SEG_ELEMS ? n : SEG_ELEMS) * es + 1);
    if (!peer || !acc) {
        free(peer);
        free(acc);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    double deadline = pt_now_s() + c->timeout_s;
    int rc = PT_OK;
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += SEG_ELEMS) {
        size_t m = n - off < SEG_ELEMS ? n - off : SEG_ELEMS;
        char *mine = (char *)buf + off * es;
        int tag = (int)(c->seq & 0x3fff);   /* messages between two ranks stay ordered */
        int i = 0;
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            int slot = p < c->rank ? p : p - 1;
            peer[i] = p;
            MPI_Irecv((char *)c->recv + (size_t)slot * SEG_ELEMS * es, (int)m, mt, p, tag,
                      c->comm, &c->req[i]);
            i++;
        }
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            peer[i] = p;
            MPI_Isend(mine, (int)m, mt, p, tag, c->comm, &c->req[i]);
            i++;
        }
        if ((rc = wait_all(c, 2 * np, peer, deadline, what, err, errlen))) break;
        /* sum in rank order: ranks below us, ours, ranks above (the first
         * addend is copied, not added to 0, so -0 and NaN payloads match a
         * single rank's accumulation) */
        for (int p = 0; p < c->world; p++) {
            const char *src = p == c->rank ? mine
                              : (const char *)c->recv + (size_t)(p < c->rank ? p : p - 1) * SEG_ELEMS * es;
            if (p == 0) memcpy(acc, src, m * es);
            else add_into(acc, src, m, dtype);
        }
        memcpy(mine, acc, m * es);
        if (n == 0) break;
    }
    free(peer);
    free(acc);
    if (!rc) scale_buf(buf, n, dtype, scale);
    return rc;
}

int pt_mpi_coll_barrier(pt_mpi_coll *c, char *err, size_t errlen) {
    return pt_mpi_coll_allreduce(c, NULL, 0, PT_COLL_F32, 1.0, "barrier", err, errlen);
}

/* Sharded collectives: every part is cut into the same number of segments
 * (SEG_ELEMS elements; a part shorter than another sends fewer, possibly zero,
 * elements in a segment), so every rank posts the same messages per segment and
 * the receive space stays bounded. Zero-length messages keep the pattern
 * uniform; MPI allows them. */
static size_t seg_len(size_t part_len, size_t off) {
    if (off >= part_len) return 0;
    return part_len - off < SEG_ELEMS ? part_len - off : SEG_ELEMS;
}

int pt_mpi_coll_allgather(pt_mpi_coll *c, void *buf, size_t n, size_t elem_size, const char *what,
                      char *err, size_t errlen) {
    if (!c || c->world == 1) return PT_OK;
    if (!elem_size || elem_size > 8 || (n && !buf))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "[dist] %s: all-gather of %zu elements of %zu bytes from %p", what, n,
                       elem_size, buf);
    int brc = begin(c, what, err, errlen);
    if (brc) return brc;
    int np = c->world - 1;
    int *peer = malloc(sizeof(int) * (size_t)(2 * np));
    if (!peer) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    size_t lo_me, len_me, s_part, z;
    pt_coll_part(n, c->world, 0, &z, &s_part);   /* rank 0 holds the longest part */
    pt_coll_part(n, c->world, c->rank, &lo_me, &len_me);
    double deadline = pt_now_s() + c->timeout_s;
    int rc = PT_OK;
    /* bytes travel as MPI_BYTE: the element type does not matter for a copy */
    for (size_t off = 0; off < s_part || off == 0; off += SEG_ELEMS) {
        int tag = (int)(c->seq & 0x3fff), i = 0;
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            size_t lo, len;
            pt_coll_part(n, c->world, p, &lo, &len);
            size_t m = seg_len(len, off);
            peer[i] = p;
            MPI_Irecv((char *)buf + (lo + (m ? off : 0)) * elem_size, (int)(m * elem_size),
                      MPI_BYTE, p, tag, c->comm, &c->req[i]);
            i++;
        }
        size_t mm = seg_len(len_me, off);
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            peer[i] = p;
            MPI_Isend((char *)buf + (lo_me + (mm ? off : 0)) * elem_size, (int)(mm * elem_size),
                      MPI_BYTE, p, tag, c->comm, &c->req[i]);
            i++;
        }
        if ((rc = wait_all(c, 2 * np, peer, deadline, what, err, errlen))) break;
        if (s_part == 0) break;
    }
    free(peer);
    return rc;
}

int pt_mpi_coll_reduce_scatter(pt_mpi_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                           const char *what, char *err, size_t errlen) {
    if (!c || c->world == 1) {
        scale_buf(buf, n, dtype, scale);
        return PT_OK;
    }
    if (dtype != PT_COLL_F32 && dtype != PT_COLL_F64)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: dtype %d is not f32 or f64",
                       what, (int)dtype);
    if (n && !buf)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: reduce-scatter of %zu "
                       "elements from NULL", what, n);
    int brc = begin(c, what, err, errlen);
    if (brc) return brc;
    size_t es = dtype == PT_COLL_F64 ? 8 : 4;
    MPI_Datatype mt = dtype == PT_COLL_F64 ? MPI_DOUBLE : MPI_FLOAT;
    int np = c->world - 1;
    size_t lo_me, len_me, s_part, z;
    pt_coll_part(n, c->world, 0, &z, &s_part);
    pt_coll_part(n, c->world, c->rank, &lo_me, &len_me);
    int *peer = malloc(sizeof(int) * (size_t)(2 * np));
    void *acc = malloc((len_me < SEG_ELEMS ? len_me : SEG_ELEMS) * es + 1);
    if (!peer || !acc) {
        free(peer);
        free(acc);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    }
    double deadline = pt_now_s() + c->timeout_s;
    int rc = PT_OK;
    for (size_t off = 0; off < s_part || off == 0; off += SEG_ELEMS) {
        int tag = (int)(c->seq & 0x3fff), i = 0;
        size_t m = seg_len(len_me, off);   /* this segment of our part, from every peer */
        char *mine = (char *)buf + (lo_me + (m ? off : 0)) * es;
        for (int p = 0; p < c->world; p++) {
            if (p == c->rank) continue;
            int slot = p < c->rank ? p : p - 1;
            peer[i] = p;
            MPI_Irecv((char *)c->recv + (size_t)slot * SEG_ELEMS * es, (int)m, mt, p, tag,
                      c->comm, &c->req[i]);
            i++;
        }
        for (int p = 0; p < c->world; p++) {   /* peer p's part of our buffer goes to p */
            if (p == c->rank) continue;
            size_t lo, len;
            pt_coll_part(n, c->world, p, &lo, &len);
            size_t mp = seg_len(len, off);
            peer[i] = p;
            MPI_Isend((char *)buf + (lo + (mp ? off : 0)) * es, (int)mp, mt, p, tag, c->comm,
                      &c->req[i]);
            i++;
        }
        if ((rc = wait_all(c, 2 * np, peer, deadline, what, err, errlen))) break;
        /* rank order, first addend copied: the same sum pt_coll_allreduce forms */
        for (int p = 0; p < c->world && m; p++) {
            const char *src = p == c->rank ? mine
                              : (const char *)c->recv + (size_t)(p < c->rank ? p : p - 1) * SEG_ELEMS * es;
            if (p == 0) memcpy(acc, src, m * es);
            else add_into(acc, src, m, dtype);
        }
        if (m) memcpy(mine, acc, m * es);
        if (s_part == 0) break;
    }
    free(peer);
    free(acc);
    if (!rc) scale_buf((char *)buf + lo_me * es, len_me, dtype, scale);
    return rc;
}
