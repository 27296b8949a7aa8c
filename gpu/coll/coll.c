/*
 * coll.c — the collectives front: picks the transport for a configuration
 * (pt_coll_pick), opens it, and sends every coll.h call to it. The runtime sees
 * only coll.h, so its code path is the same on both transports.
 *
 * Why the pairing is fixed: the MPI transport adds buffers with the CPU, which
 * is right only where device memory is host memory (the host backend); NCCL
 * moves and adds device memory, which the host backend does not have. Staging
 * cuda device buffers through host memory for MPI is not built. The host's
 * own collectives (pt_host_v1.coll) take the MPI transport's place on the host
 * backend when the host brings them: the host moves bytes, the plugin adds.
 */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "coll_boot.h"
#include "coll_host.h"
#include "coll_mpi.h"
#include "protrain.h"
#include "pt_util.h"

struct pt_coll {
    int world, rank;
    int nccl;                   /* 1: the NCCL transport; 0: MPI */
    pt_mpi_coll *mpi;           /* the MPI transport, or NCCL's MPI bootstrap (kept to
                                   finalize MPI after NCCL is gone); NULL with file:// */
    pt_coll_nccl nc;            /* nccl: the loaded library and its communicator */
    pt_host_coll *hc;           /* host: the host's collectives (no MPI, no NCCL) */
    int hang_rank, broken;      /* nccl: the testing aid and its broken state */
    double timeout_s;
};

int pt_coll_pick(const char *dist_backend, const char *device_backend, const char *init_method,
                 const char **transport, char *err, size_t errlen) {
    *transport = NULL;
    int cuda = !strcmp(device_backend, "cuda"), host = !strcmp(device_backend, "host");
    int file = init_method && !strncmp(init_method, "file:", 5);
    if (!cuda && !host)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "[dist]: no collectives for the %s "
                                                        "backend (nccl runs on cuda, mpi on host)",
                       device_backend);
    if (!strcmp(dist_backend, "auto")) {
        *transport = cuda ? "nccl" : "mpi";
    } else if (!strcmp(dist_backend, "nccl")) {
        if (!cuda)
            return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                           "[dist] backend = nccl needs the cuda backend (NCCL moves device "
                           "memory between GPUs) but this run is on the %s backend; use "
                           "backend = mpi or auto there",
                           device_backend);
        *transport = "nccl";
    } else if (!strcmp(dist_backend, "mpi")) {
        if (cuda)
            return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                           "[dist] backend = mpi on the cuda backend: the MPI collectives add "
                           "buffers with the CPU, and cuda device memory is not host memory "
                           "(staging it through the host is not built); use backend = nccl or "
                           "auto");
        *transport = "mpi";
    } else if (!strcmp(dist_backend, "none")) {
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "[dist] backend = none with several "
                                                        "ranks: the ranks could not agree on gradients");
    } else {
        return pt_fail(err, errlen, PT_ERR_CONFIG, "[dist] backend = '%s': expected auto, "
                                                   "nccl, mpi or none",
                       dist_backend);
    }
    if (file && !strcmp(*transport, "mpi")) {
        *transport = NULL;
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[dist] init_method = %s with the mpi transport: the shared-file "
                       "rendezvous hands out NCCL's id, while MPI ranks meet through mpirun "
                       "(use init_method = env or mpi)",
                       init_method);
    }
    return PT_OK;
}

int pt_coll_pick_table(const char *dist_backend, const char *device_backend,
                       const char *init_method, int has_table, const char **transport, char *err,
                       size_t errlen) {
    *transport = NULL;
    int named = !strcmp(dist_backend, "host");
    if (!has_table) {
        if (named)
            return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                           "[dist] backend = host needs a host that hands the plugin its own "
                           "collectives (pt_host_v1.coll, e.g. the PyTorch host over "
                           "torch.distributed), and this host gave none; use auto, mpi or nccl");
        return pt_coll_pick(dist_backend, device_backend, init_method, transport, err, errlen);
    }
    if (!named && strcmp(dist_backend, "auto"))
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[dist] backend = %s, but the host hands the plugin its own collectives "
                       "(pt_host_v1.coll, its process group): the ranks' gradients cannot go "
                       "over two transports; set backend = auto or host, or start the host "
                       "without its table",
                       dist_backend);
    if (strcmp(device_backend, "host"))
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[dist] the host's own collectives (pt_host_v1.coll) run on the host "
                       "backend only: they get host memory and the plugin adds with the CPU, "
                       "while the %s backend's buffers are device memory (staging them is not "
                       "built); on cuda pass no table and use backend = nccl",
                       device_backend);
    if (init_method && strcmp(init_method, "env"))
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[dist] init_method = %s, but the host hands the plugin its own "
                       "collectives (pt_host_v1.coll): its ranks have already met; leave "
                       "init_method = env",
                       init_method);
    *transport = "host";
    return PT_OK;
}

static int open_host(const pt_coll_config *cfg, pt_coll **out, char *err, size_t errlen) {
    pt_coll *c = calloc(1, sizeof *c);
    if (!c) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    int rc = pt_host_coll_open(cfg, &c->hc, err, errlen);
    if (rc) {
        free(c);
        return rc;
    }
    c->world = cfg->world_size;
    c->rank = cfg->rank;
    c->hang_rank = -1;
    c->timeout_s = cfg->timeout_s;
    *out = c;
    return PT_OK;
}

int pt_coll_open(const pt_coll_config *cfg, pt_coll **out, char *err, size_t errlen) {
    *out = NULL;
    const char *tr = cfg->transport ? cfg->transport : "mpi";
    int nccl = !strcmp(tr, "nccl");
    if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        return pt_fail(err, errlen, PT_ERR_CONFIG, "[dist]: rank %d of %d is not a rank",
                       cfg->rank, cfg->world_size);
    if (!strcmp(tr, "host")) return open_host(cfg, out, err, errlen);
    if (!nccl && strcmp(tr, "mpi"))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist]: unknown transport '%s'", tr);
    int file = cfg->init_method && !strncmp(cfg->init_method, "file:", 5);
    if (file && !nccl)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED, "[dist] init_method = %s needs the nccl "
                                                        "transport (MPI ranks meet through mpirun)",
                       cfg->init_method);
    pt_coll *c = calloc(1, sizeof *c);
    if (!c) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    c->world = cfg->world_size;
    c->rank = cfg->rank;
    c->nccl = nccl;
    c->hang_rank = cfg->debug_hang_rank;
    c->timeout_s = cfg->timeout_s;
    int rc = PT_OK;
    if (!file) {
        pt_coll_config mc = *cfg;
        if (nccl) mc.debug_hang_rank = -1;   /* the bootstrap must not hang */
        rc = pt_mpi_coll_open(&mc, &c->mpi, err, errlen);
    }
    /* a failed NCCL start may have left a peer waiting (or gone): MPI is then
     * not finalized, as after a failed collective */
    if (!rc && nccl && (rc = pt_coll_nccl_open(cfg, c->mpi, &c->nc, err, errlen))) c->broken = 1;
    if (rc) {
        pt_coll_close(c);
        return rc;
    }
    *out = c;
    return PT_OK;
}

void pt_coll_close(pt_coll *c) {
    if (!c) return;
    pt_host_coll_close(c->hc);
    pt_coll_nccl_close(&c->nc);   /* before MPI: NCCL's bootstrap may still use it */
    if (c->broken) pt_mpi_coll_mark_broken(c->mpi);
    pt_mpi_coll_close(c->mpi);
    free(c);
}

void pt_coll_abort(pt_coll *c, const char *why) {
    if (!c) return;
    c->broken = 1;
    pt_mpi_coll_abort(c->mpi, why);   /* NULL (file:// NCCL, host): nothing to tell with */
}

int pt_coll_split(pt_coll *c, int color, int key, pt_coll **sub, char *err, size_t errlen) {
    *sub = NULL;
    if (!c)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] sub-group: no group to split");
    if (c->hc)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[dist] sub-groups (tensor parallel inside data parallel) are not built "
                       "on the host's own collectives; they run on mpi");
    if (c->nccl)   /* ncclCommSplit would give it; nothing asks for it on cuda yet */
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "[dist] sub-groups (tensor parallel inside data parallel) are not built "
                       "on the nccl transport; they run on mpi (the host backend)");
    pt_coll *s = calloc(1, sizeof *s);
    if (!s) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for a sub-group");
    int rc = pt_mpi_coll_split(c->mpi, color, key, &s->mpi, err, errlen);
    if (rc) {
        free(s);
        return rc;
    }
    s->world = pt_mpi_coll_world(s->mpi);
    s->rank = pt_mpi_coll_rank(s->mpi);
    s->hang_rank = -1;
    s->timeout_s = c->timeout_s;
    *sub = s;
    return PT_OK;
}

const char *pt_coll_transport(const pt_coll *c) {
    return !c ? "none" : c->hc ? "host"
                     : c->nccl ? "nccl"
                               : "mpi";
}
int pt_coll_rank(const pt_coll *c) { return c ? c->rank : 0; }
int pt_coll_world(const pt_coll *c) { return c ? c->world : 1; }

/* host: the front's broken flag (set by a stop of this rank) refuses before
 * the host is called; the transport keeps its own for failed ops. */
static int host_ok(const pt_coll *c, const char *what, char *err, size_t errlen) {
    if (c->broken)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] %s: an earlier collective failed; the group is broken", what);
    return PT_OK;
}

/* nccl: refuse on a broken group, and play the hung rank when a test asks for
 * one (as the MPI transport does inside its own calls). */
static int nccl_begin(pt_coll *c, const char *what, char *err, size_t errlen) {
    if (c->broken)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] %s: an earlier collective failed; the group is broken", what);
    if (c->rank == c->hang_rank) {
        double until = pt_now_s() + 20 * c->timeout_s + 10;
        while (pt_now_s() < until) pt_coll_nccl_pause();
        c->broken = 1;
        return pt_fail(err, errlen, PT_ERR_BACKEND, "[dist] %s: [testing] debug_hang_rank = %d: "
                                                    "this rank hung on purpose",
                       what, c->hang_rank);
    }
    return PT_OK;
}

/* A failed NCCL call breaks the group here too, so the hang aid and later
 * calls see it without asking the library. */
static int nccl_end(pt_coll *c, int rc) {
    if (rc) c->broken = 1;
    return rc;
}

int pt_coll_allreduce(pt_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                      const char *what, char *err, size_t errlen) {
    if (c && c->hc)
        return host_ok(c, what, err, errlen)
                   ? PT_ERR_BACKEND
                   : pt_host_coll_allreduce(c->hc, buf, n, dtype, scale, what, err, errlen);
    if (c && c->nccl) {
        int rc = nccl_begin(c, what, err, errlen);
        return rc ? rc : nccl_end(c, c->nc.ops->allreduce(c->nc.h, buf, n, dtype, scale, what, err, errlen));
    }
    return pt_mpi_coll_allreduce(c ? c->mpi : NULL, buf, n, dtype, scale, what, err, errlen);
}

int pt_coll_barrier(pt_coll *c, char *err, size_t errlen) {
    if (c && c->hc)
        return host_ok(c, "barrier", err, errlen) ? PT_ERR_BACKEND
                                                  : pt_host_coll_barrier(c->hc, err, errlen);
    if (c && c->nccl) {
        int rc = nccl_begin(c, "barrier", err, errlen);
        return rc ? rc : nccl_end(c, c->nc.ops->barrier(c->nc.h, err, errlen));
    }
    return pt_mpi_coll_barrier(c ? c->mpi : NULL, err, errlen);
}

int pt_coll_allgather(pt_coll *c, void *buf, size_t n, size_t elem_size, const char *what,
                      char *err, size_t errlen) {
    if (c && c->hc)
        return host_ok(c, what, err, errlen)
                   ? PT_ERR_BACKEND
                   : pt_host_coll_allgather(c->hc, buf, n, elem_size, what, err, errlen);
    if (c && c->nccl) {
        int rc = nccl_begin(c, what, err, errlen);
        return rc ? rc : nccl_end(c, c->nc.ops->allgather(c->nc.h, buf, n, elem_size, what, err, errlen));
    }
    return pt_mpi_coll_allgather(c ? c->mpi : NULL, buf, n, elem_size, what, err, errlen);
}

int pt_coll_allgather_ranges(pt_coll *c, void *buf, const size_t *lo, const size_t *len,
                             size_t elem_size, const char *what, char *err, size_t errlen) {
    if (!c || c->world == 1) return PT_OK;
    size_t s = 0;   /* the longest part: every slot's length */
    for (int p = 0; p < c->world; p++)
        if (len[p] > s) s = len[p];
    if (!elem_size || elem_size > 8 || (s && !buf))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: all-gather of parts up to "
                                                        "%zu elements of %zu bytes from %p",
                       what, s, elem_size, buf);
    /* slot p = [p s, (p + 1) s): exactly rank p's part under pt_coll_part(W s) */
    char *tmp = malloc((size_t)c->world * s * elem_size + 1);
    if (!tmp) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "[dist] %s: out of host memory for "
                                                           "%zu bytes",
                             what, (size_t)c->world * s * elem_size);
    memcpy(tmp + (size_t)c->rank * s * elem_size, (char *)buf + lo[c->rank] * elem_size,
           len[c->rank] * elem_size);
    int rc = pt_coll_allgather(c, tmp, (size_t)c->world * s, elem_size, what, err, errlen);
    for (int p = 0; !rc && p < c->world; p++)
        if (p != c->rank && len[p])
            memcpy((char *)buf + lo[p] * elem_size, tmp + (size_t)p * s * elem_size,
                   len[p] * elem_size);
    free(tmp);
    return rc;
}

int pt_coll_alltoallv_gathered(pt_coll *c, const void *send, const size_t *soff,
                               const size_t *scount, void *recv, const size_t *roff,
                               const size_t *rcount, const char *what, char *err,
                               size_t errlen) {
    int w = pt_coll_world(c), me = pt_coll_rank(c);
    if (scount[me] != rcount[me])
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: this rank sends itself %zu "
                                                        "bytes but expects %zu",
                       what, scount[me], rcount[me]);
    if (scount[me]) memcpy((char *)recv + roff[me], (const char *)send + soff[me], scount[me]);
    if (w == 1) return PT_OK;
    /* tab[(p * w + q) * 3 + {0, 1, 2}]: rank p's offset and count toward rank q,
     * and what p expects from q (each rank fills its own row; the sum of zeros
     * elsewhere is exact), so every rank checks every pair and all of them fail
     * together, before the all-gather, when two disagree */
    size_t nt = (size_t)w * (size_t)w * 3;
    double *tab = calloc(nt, sizeof *tab);
    if (!tab) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "[dist] %s: out of host memory", what);
    for (int q = 0; q < w; q++) {
        tab[((size_t)me * w + q) * 3] = (double)soff[q];
        tab[((size_t)me * w + q) * 3 + 1] = (double)scount[q];
        tab[((size_t)me * w + q) * 3 + 2] = (double)rcount[q];
    }
    int rc = pt_coll_allreduce(c, tab, nt, PT_COLL_F64, 1.0, what, err, errlen);
    size_t S = 0;   /* the longest send buffer: every slot's length */
    for (size_t i = 0; !rc && i < nt; i += 3) {
        size_t end = (size_t)tab[i] + (size_t)tab[i + 1];
        if (end > S) S = end;
    }
    for (int p = 0; !rc && p < w; p++)
        for (int q = 0; !rc && q < w; q++) {
            size_t sent = (size_t)tab[((size_t)p * w + q) * 3 + 1];
            size_t want = (size_t)tab[((size_t)q * w + p) * 3 + 2];
            if (p != q && sent != want)
                rc = pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: rank %d sends %zu bytes "
                                                              "to rank %d, which expects %zu",
                             what, p, sent, q, want);
        }
    char *tmp = rc ? NULL : malloc((size_t)w * S + 1);
    if (!rc && !tmp)
        rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "[dist] %s: out of host memory for %zu bytes",
                     what, (size_t)w * S);
    if (!rc) {
        /* slot p = [p S, (p + 1) S): exactly rank p's part under pt_coll_part(W S) */
        size_t mine = 0;
        for (int q = 0; q < w; q++)
            if (soff[q] + scount[q] > mine) mine = soff[q] + scount[q];
        memset(tmp + (size_t)me * S, 0, S);
        if (mine) memcpy(tmp + (size_t)me * S, send, mine);
        rc = pt_coll_allgather(c, tmp, (size_t)w * S, 1, what, err, errlen);
    }
    for (int p = 0; !rc && p < w; p++)
        if (p != me && rcount[p])
            memcpy((char *)recv + roff[p],
                   tmp + (size_t)p * S + (size_t)tab[((size_t)p * w + me) * 3], rcount[p]);
    free(tmp);
    free(tab);
    return rc;
}

int pt_coll_alltoallv(pt_coll *c, const void *send, const size_t *soff, const size_t *scount,
                      void *recv, const size_t *roff, const size_t *rcount, const char *what,
                      char *err, size_t errlen) {
    if (c && (c->nccl || c->hc))
        return pt_coll_alltoallv_gathered(c, send, soff, scount, recv, roff, rcount, what, err,
                                          errlen);
    return pt_mpi_coll_alltoallv(c ? c->mpi : NULL, send, soff, scount, recv, roff, rcount, what,
                                 err, errlen);
}

int pt_coll_reduce_scatter(pt_coll *c, void *buf, size_t n, int32_t dtype, double scale,
                           const char *what, char *err, size_t errlen) {
    if (c && c->hc)
        return host_ok(c, what, err, errlen)
                   ? PT_ERR_BACKEND
                   : pt_host_coll_reduce_scatter(c->hc, buf, n, dtype, scale, what, err, errlen);
    if (c && c->nccl) {
        int rc = nccl_begin(c, what, err, errlen);
        return rc ? rc : nccl_end(c, c->nc.ops->reduce_scatter(c->nc.h, buf, n, dtype, scale, what, err, errlen));
    }
    return pt_mpi_coll_reduce_scatter(c ? c->mpi : NULL, buf, n, dtype, scale, what, err, errlen);
}

/* The keyed nonblocking all-reduce: the MPI transport's own operation. On
 * NCCL and the host's collectives the blocking all-reduce runs at the start instead (its result is in buf
 * when pt_coll_iallreduce returns, so a bucket overlaps nothing there yet; the
 * sums are the same). */
struct pt_coll_op {
    pt_mpi_op *m;   /* NULL: finished at the start (NCCL, host) */
};

int pt_coll_iallreduce(pt_coll *c, void *buf, size_t n, int32_t dtype, double scale, int32_t key,
                       const char *what, pt_coll_op **out, char *err, size_t errlen) {
    *out = NULL;
    if (key < 0 || key >= PT_COLL_KEYS)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] %s: nonblocking all-reduce with "
                                                        "key %d (want 0..%d)",
                       what, (int)key, PT_COLL_KEYS - 1);
    pt_coll_op *op = calloc(1, sizeof *op);
    if (!op) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory for collectives");
    int rc = c && (c->nccl || c->hc) ? pt_coll_allreduce(c, buf, n, dtype, scale, what, err, errlen)
                                     : pt_mpi_coll_iallreduce(c ? c->mpi : NULL, buf, n, dtype, scale, key,
                                                              what, &op->m, err, errlen);
    if (rc) {
        free(op);
        return rc;
    }
    *out = op;
    return PT_OK;
}

int pt_coll_op_test(pt_coll *c, pt_coll_op *op, int *done, char *err, size_t errlen) {
    *done = 1;
    return op->m ? pt_mpi_coll_op_test(c ? c->mpi : NULL, op->m, done, err, errlen) : PT_OK;
}

int pt_coll_op_wait(pt_coll *c, pt_coll_op *op, char *err, size_t errlen) {
    return op->m ? pt_mpi_coll_op_wait(c ? c->mpi : NULL, op->m, err, errlen) : PT_OK;
}

void pt_coll_op_free(pt_coll *c, pt_coll_op *op) {
    if (!op) return;
    pt_mpi_coll_op_free(c ? c->mpi : NULL, op->m);
    free(op);
}

void pt_coll_scale(void *buf, size_t n, int32_t dtype, double scale) {
    if (scale == 1.0) return;
    if (dtype == PT_COLL_F64) {
        for (size_t e = 0; e < n; e++) ((double *)buf)[e] *= scale;
    } else {
        float s = (float)scale;
        for (size_t e = 0; e < n; e++) ((float *)buf)[e] *= s;
    }
}
