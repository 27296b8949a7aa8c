/*
 * coll_boot.c — the NCCL transport's start: find and version-check
 * libprotrain_nccl.so (beside the plugin, then the loader path), get rank 0's
 * unique id to every rank, join the communicator. Every wait has the [dist]
 * timeout as its deadline.
 *
 * The id over MPI: the MPI transport's all-gather of a W x 128-byte buffer in
 * which rank 0's part holds the id, so every rank ends with rank 0's bytes.
 * It is a broadcast with the MPI transport's deadline and rank-naming errors,
 * which a blocking MPI_Bcast would not have.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coll_boot.h"
#include "protrain.h"
#include "pt_util.h"

#define PROBE_AHEAD 8u

static const char self_anchor = 0; /* dladdr on this finds the file we were linked into */

void pt_coll_nccl_pause(void) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

static const void *find_sym(void *h, const char *name) {
    dlerror();
    void *p = dlsym(h, name);
    return dlerror() ? NULL : p;
}

static int take_table(void *h, const char *path, const pt_nccl_coll_ops **ops, char *err,
                      size_t errlen) {
    const pt_nccl_coll_ops *t = find_sym(h, PT_NCCL_COLL_SYMBOL);
    if (!t) {
        char name[64];
        for (uint32_t v = PT_NCCL_COLL_VERSION + PROBE_AHEAD; v > 0; v--) {
            snprintf(name, sizeof name, "%s_v%u", PT_NCCL_COLL_SYMBOL_STEM, (unsigned)v);
            if (v != PT_NCCL_COLL_VERSION && find_sym(h, name))
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "NCCL transport library %s exports %s (table version %u) but "
                               "this plugin speaks version %u; use the %s built with this plugin",
                               path, name, (unsigned)v, (unsigned)PT_NCCL_COLL_VERSION,
                               PT_NCCL_COLL_LIB);
        }
        return pt_fail(err, errlen, PT_ERR_BACKEND, "library %s does not export %s: it is not a "
                                                    "protrain NCCL transport",
                       path, PT_NCCL_COLL_SYMBOL);
    }
    if (t->abi_version != PT_NCCL_COLL_VERSION || t->struct_size < sizeof *t)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "NCCL transport library %s: its table says version %u, %u bytes; this "
                       "plugin speaks version %u, %zu bytes; use the %s built with this plugin",
                       path, (unsigned)t->abi_version, (unsigned)t->struct_size,
                       (unsigned)PT_NCCL_COLL_VERSION, sizeof *t, PT_NCCL_COLL_LIB);
    if (!t->unique_id || !t->open || !t->close || !t->allreduce || !t->allgather ||
        !t->reduce_scatter || !t->barrier || !t->describe)
        return pt_fail(err, errlen, PT_ERR_BACKEND, "NCCL transport library %s: its table lacks "
                                                    "an op",
                       path);
    *ops = t;
    return PT_OK;
}

static int load(const char *lib, pt_coll_nccl *n, char *err, size_t errlen) {
    char path[4096] = "";
    void *h = NULL;
    if (lib) {
        snprintf(path, sizeof path, "%s", lib);
    } else {
        Dl_info di;
        const char *slash = NULL;
        if (dladdr(&self_anchor, &di) && di.dli_fname) slash = strrchr(di.dli_fname, '/');
        if (slash)
            snprintf(path, sizeof path, "%.*s/%s", (int)(slash - di.dli_fname), di.dli_fname,
                     PT_NCCL_COLL_LIB);
        if (!path[0] || access(path, F_OK) != 0) snprintf(path, sizeof path, "%s", PT_NCCL_COLL_LIB);
    }
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "[dist] the nccl transport needs %s, which failed to load: %s (it is "
                       "built with the cuda backend when nvcc and NCCL are installed)",
                       path, e ? e : "no detail");
    }
    int rc = take_table(h, path, &n->ops, err, errlen);
    if (rc) {
        dlclose(h);
        return rc;
    }
    n->dl = h;
    return PT_OK;
}

/* ---- the shared-file rendezvous ---- */

#define FILE_MAGIC "protrain-nccl-id 1"

int pt_coll_file_publish(const char *path, int world, const unsigned char *id, size_t n,
                         char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return pt_fail(err, errlen, PT_ERR_IO, "[dist] init_method file: cannot create %s: %s",
                       tmp, strerror(errno));
    char head[96];
    int hl = snprintf(head, sizeof head, "%s world %d bytes %zu\n", FILE_MAGIC, world, n);
    int ok = write(fd, head, (size_t)hl) == hl && write(fd, id, n) == (ssize_t)n && !fsync(fd);
    int werr = errno;
    close(fd);
    if (!ok) {
        unlink(tmp);
        return pt_fail(err, errlen, PT_ERR_IO, "[dist] init_method file: writing %s failed: %s",
                       tmp, strerror(werr));
    }
    /* link, not rename: it fails when the name exists, so a stale id is never
     * replaced under a reader's feet, and the reader sees the whole file */
    if (link(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        if (e == EEXIST)
            return pt_fail(err, errlen, PT_ERR_CONFIG,
                           "[dist] init_method file: %s already exists (left by an earlier run "
                           "that did not finish, or another job uses it); remove it and start "
                           "every rank again",
                           path);
        return pt_fail(err, errlen, PT_ERR_IO, "[dist] init_method file: cannot create %s: %s",
                       path, strerror(e));
    }
    unlink(tmp);
    return PT_OK;
}

int pt_coll_file_fetch(const char *path, int rank, int world, double timeout_s, unsigned char *id,
                       size_t n, char *err, size_t errlen) {
    double deadline = pt_now_s() + timeout_s;
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            char head[96];
            int w = 0;
            size_t bytes = 0;
            int ok = fgets(head, sizeof head, f) &&
                     sscanf(head, FILE_MAGIC " world %d bytes %zu", &w, &bytes) == 2;
            size_t got = ok && bytes == n ? fread(id, 1, n, f) : 0;
            fclose(f);
            if (!ok || bytes != n)
                return pt_fail(err, errlen, PT_ERR_CONFIG, "[dist] init_method file: %s is not "
                                                           "a protrain NCCL id file of %zu bytes",
                               path, n);
            if (w != world)
                return pt_fail(err, errlen, PT_ERR_CONFIG,
                               "[dist] init_method file: %s was written by a rank 0 of world "
                               "%d, but rank %d is in world %d",
                               path, w, rank, world);
            if (got != n)
                return pt_fail(err, errlen, PT_ERR_IO, "[dist] init_method file: %s ends "
                                                       "early (%zu of %zu id bytes)",
                               path, got, n);
            return PT_OK;
        }
        if (errno != ENOENT)
            return pt_fail(err, errlen, PT_ERR_IO, "[dist] init_method file: cannot read %s: %s",
                           path, strerror(errno));
        if (pt_now_s() > deadline)
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "[dist] init_method file: rank %d found no NCCL id at %s within "
                           "[dist] timeout = %g s (rank 0 writes it: is rank 0 running, with the "
                           "same init_method, on a filesystem this rank sees?)",
                           rank, path, timeout_s);
        struct timespec ts = {0, 10000000};   /* 10 ms: a file system, not a network */
        nanosleep(&ts, NULL);
    }
}

void pt_coll_file_remove(const char *path) { unlink(path); }

/* ---- open / close ---- */

static int exchange_id(const pt_coll_config *cfg, pt_mpi_coll *mpi, const pt_coll_nccl *n,
                       unsigned char id[PT_NCCL_ID_BYTES], int *published, char *err,
                       size_t errlen) {
    const char *file = cfg->init_method && !strncmp(cfg->init_method, "file://", 7)
                           ? cfg->init_method + 7
                           : NULL;
    int rc = cfg->rank == 0 ? n->ops->unique_id(id, err, errlen) : PT_OK;
    if (rc) return rc;
    if (file && cfg->rank == 0) {
        rc = pt_coll_file_publish(file, cfg->world_size, id, PT_NCCL_ID_BYTES, err, errlen);
        *published = !rc;
        return rc;
    }
    if (file)
        return pt_coll_file_fetch(file, cfg->rank, cfg->world_size, cfg->timeout_s, id,
                                  PT_NCCL_ID_BYTES, err, errlen);
    if (!mpi)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[dist] the nccl transport needs MPI or "
                                                        "init_method = file:///path to hand out its id");
    /* rank r's part of the W x 128 buffer is [r*128, (r+1)*128): rank 0's holds the id */
    size_t total = (size_t)cfg->world_size * PT_NCCL_ID_BYTES;
    unsigned char *all = calloc(1, total);
    if (!all) return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
    if (cfg->rank == 0) memcpy(all, id, PT_NCCL_ID_BYTES);
    rc = pt_mpi_coll_allgather(mpi, all, total, 1, "NCCL's unique id from rank 0", err, errlen);
    if (!rc) memcpy(id, all, PT_NCCL_ID_BYTES);
    free(all);
    return rc;
}

int pt_coll_nccl_open(const pt_coll_config *cfg, pt_mpi_coll *mpi, pt_coll_nccl *out, char *err,
                      size_t errlen) {
    memset(out, 0, sizeof *out);
    pt_coll_nccl n = {0};
    int rc = load(cfg->nccl_lib, &n, err, errlen);
    if (rc) return rc;
    unsigned char id[PT_NCCL_ID_BYTES] = {0};
    int published = 0;
    rc = exchange_id(cfg, mpi, &n, id, &published, err, errlen);
    if (!rc)
        rc = n.ops->open(id, cfg->rank, cfg->world_size, cfg->device_index, cfg->timeout_s, &n.h,
                         err, errlen);
    /* rank 0's file has served (every rank joined) or failed: either way it
     * must not outlive this attempt, or the next run would read a dead id.
     * Not when publishing it failed: then it is someone else's. */
    if (published) pt_coll_file_remove(cfg->init_method + 7);
    if (rc) {
        dlclose(n.dl);
        return rc;
    }
    *out = n;
    return PT_OK;
}

void pt_coll_nccl_close(pt_coll_nccl *n) {
    if (!n || !n->ops) return;
    if (n->h) n->ops->close(n->h);
    if (n->dl) dlclose(n->dl);
    memset(n, 0, sizeof *n);
}
