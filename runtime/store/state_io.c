/*
 * state_io.c — the model and optimizer state as a layout-independent image:
 * per parameter (storage roots, declaration order) its compute-dtype values
 * and, when trainable, the fp32 master (16-bit params only), Adam m and v.
 * Because the image is per parameter, not per chunk, a state saved under one
 * plan restores under any other (different n_persist, chunk size, mode).
 *
 * Used by save_state / load_state (one file per rank, written to a temp file,
 * fsync'd and renamed; header and checksum checked on load) and by the
 * calibration re-plan (snapshot in memory, rebuild, restore).
 *
 * File: header (below), then for each root param: name (u32 length + bytes),
 * u32 dtype, u32 trainable, u64 numel, data [numel * dtype size],
 * trainable: master [numel f32] when dtype != f32, m [numel f32], v [numel f32],
 * and for a parameter REKLS steps its factors, bases and eigenvalues
 * [2m^2 + 2n^2 + m + n f32] (L, R, Q_L, Q_R, lam_L, lam_R). Version 3 added
 * that block and the optimizer type in the header; version 2 files (AdamW
 * only, the same layout otherwise) still load into an AdamW run.
 * The checksum is FNV-1a 64 over the whole file: the header with its checksum
 * field zero, then the payload. Version 1 covered only the payload, so a flipped
 * bit in step or a hyper-parameter loaded as valid (a flipped step went into the
 * bias correction and made NaN weights); it is refused, not read.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels_hd.h"
#include "store_internal.h"


#define ST_MAGIC 0x54535450u /* "PTST" */
#define ST_VERSION 3u

typedef struct st_header {
    uint32_t magic, version;
    uint32_t n_params, rank;
    uint32_t world_size, optim;  /* optim: pt_optim_type (version 2: 0, read as AdamW) */
    int64_t step;               /* optimizer steps taken (bias correction continues) */
    uint64_t payload_bytes;
    uint64_t checksum;          /* over header (this field 0) and payload */
    float lr, beta1, beta2, eps, weight_decay, max_grad_norm;
    uint32_t tp_size;           /* [dist] tp_size of the saving run (0 in older files: 1) */
    float lr0;                  /* lr create_optimizer set (valid with ST_HAS_LR0) */
    uint32_t flags;             /* ST_HAS_*; 0 in files written before these fields */
    uint32_t run_lo, run_hi;    /* the run's identity (valid with ST_HAS_RUN) */
    uint32_t reserved[3];
} st_header;
_Static_assert(sizeof(st_header) == 104, "the header's size is part of the format");

/* st_header.flags. lr is the lr of the last step (a host's schedule moves it
 * every step), so it says nothing about whether two runs were created alike;
 * lr0 does. Files without the flag (older writers) compare beta1..max_grad_norm. */
enum { ST_HAS_LR0 = 1u,
       ST_HAS_RUN = 2u };

/* The run's identity as its host states it: FNV-1a 64 over the lines of
 * pt_host_v1.fingerprint whose names start with "run." (in order, each with its
 * newline), e.g. sample_host's seed and data hashes. 0: the host gives none.
 * What the host puts there is what must not change between a save and the
 * load that continues it; another seed's run has another identity, and its
 * state file is refused (check_header). */
static uint64_t run_ident(const pt_store *st) {
    const pt_host_v1 *h = st->env.host;
    if (!h || h->struct_size < offsetof(pt_host_v1, fingerprint) + sizeof(const char *) ||
        !h->fingerprint)
        return 0;
    uint64_t id = 0;
    for (const char *l = h->fingerprint; *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        if (n > 4 && !strncmp(l, "run.", 4))
            id = pt_fnv1a64_more(id ? id : pt_fnv1a64("", 0), l, n + 1);
        l += n + (e != NULL);
    }
    return id;
}

/* A step count no run reaches: 2^40 optimizer steps is 35 years at one step a
 * millisecond. A larger one is a hand-made or foreign file; loaded, it would
 * silently change every update through the bias correction 1 - beta^t. */
#define ST_MAX_STEP ((int64_t)1 << 40)

static uint64_t file_checksum(const st_header *h, const void *payload, size_t n) {
    st_header z = *h;
    z.checksum = 0;
    return pt_fnv1a64_more(pt_fnv1a64(&z, sizeof z), payload, n);
}

static int running_world(const pt_store *st) {
    return st->env.host->world_size > 0 ? st->env.host->world_size : 1;
}

/* Where a root param's state lives: its chunk and fp32 state index. */
static cs_chunk *locate(pt_store *st, int i, uint64_t *off, uint64_t *sidx) {
    pt_store *ms = st;
    cs_chunk *c = &ms->ch[ms->lay.param_chunk[i]];
    *off = ms->lay.param_offset[i];
    *sidx = UINT64_MAX;
    for (int r = 0; r < c->lc->n_regions; r++) {
        const pt_chunk_region *g = &c->lc->regions[r];
        if (*off >= g->offset && *off < g->offset + g->bytes && c->reg_state[r] != UINT64_MAX)
            *sidx = c->reg_state[r] + (*off - g->offset) / pt_dtype_size(g->dtype);
    }
    return c;
}

/* Copy n bytes between the state image and a chunk's storage: device memory
 * through the backend for resident chunks, pinned memory directly otherwise. */
static int xfer(pt_store *st, cs_chunk *c, void *img, void *store, size_t n, int to_img) {
    if (!store || !n) return PT_OK;
    if (!c->persistent) {
        if (to_img) memcpy(img, store, n);
        else memcpy(store, img, n);
        return PT_OK;
    }
    return to_img ? pt_gpu_memcpy(st->env.gpu, img, store, n, PT_GPU_D2H)
                  : pt_gpu_memcpy(st->env.gpu, store, img, n, PT_GPU_H2D);
}

/* The first of n values (dtype dt; f32 when dt is PT_F32 or the optimizer's
 * state) that no run can hold: non-finite, or negative where nonneg (Adam's
 * second moment is a mean of squares). -1 when all are fine. A 16-bit value is
 * non-finite when its exponent bits are all ones (bf16: 8 bits, f16: 5). */
static int64_t bad_value(const unsigned char *p, uint64_t n, int dt, int nonneg) {
    if (dt == PT_BF16 || dt == PT_F16) {
        uint16_t mask = dt == PT_BF16 ? 0x7f80u : 0x7c00u;
        for (uint64_t k = 0; k < n; k++) {
            uint16_t u;
            memcpy(&u, p + 2 * k, 2);
            if ((u & mask) == mask) return (int64_t)k;
        }
        return -1;
    }
    if (dt != PT_F32) return -1;   /* opaque bytes */
    for (uint64_t k = 0; k < n; k++) {
        float x;
        memcpy(&x, p + 4 * k, 4);
        if (!isfinite(x) || (nonneg && x < 0)) return (int64_t)k;
    }
    return -1;
}

static int refuse_value(const unsigned char *p, uint64_t n, int dt, int nonneg, const char *name,
                        const char *what, char *err, size_t errlen) {
    int64_t k = bad_value(p, n, dt, nonneg);
    if (k < 0) return PT_OK;
    double x = NAN;
    if (dt == PT_F32) {
        float f;
        memcpy(&f, p + 4 * k, 4);
        x = f;
    }
    return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: parameter '%s' holds a %s %s value "
                                               "(%g at element %lld); a saved run never has one (a hand-made, foreign or "
                                               "diverged file)",
                   name, isfinite(x) ? "negative" : "non-finite", what, x,
                   (long long)k);
}

/* Walk every root param. mode W_SIZE: only the size; W_SAVE: store -> img;
 * W_CHECK: compare img's per-param headers with the model, move nothing;
 * W_LOAD: img -> store (after a W_CHECK, so a bad file changes nothing). */
enum { W_SIZE,
       W_SAVE,
       W_CHECK,
       W_LOAD };
static int walk(pt_store *st, unsigned char *img, size_t *size, int mode, char *err, size_t errlen) {
    int to_img = mode == W_SAVE;
    int move = mode == W_SAVE || mode == W_LOAD;
    pt_store *ms = st;
    pt_model_v1 *m = st->env.model;
    size_t pos = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (ms->root[i] != i) continue;
        const pt_param_v1 *p = &m->params[i];
        uint32_t nl = (uint32_t)strlen(p->name ? p->name : "");
        uint32_t dt = (uint32_t)p->dtype, tr = (uint32_t)ms->root_tr[i];
        uint64_t n = pt_store_param_numel(p), off, s;
        cs_chunk *c = locate(st, i, &off, &s);
        size_t db = (size_t)(n * pt_dtype_size(p->dtype)), fb = (size_t)n * 4;
        if (mode == W_SAVE) {
            memcpy(img + pos, &nl, 4);
            memcpy(img + pos + 4, p->name ? p->name : "", nl);
            memcpy(img + pos + 4 + nl, &dt, 4);
            memcpy(img + pos + 8 + nl, &tr, 4);
            memcpy(img + pos + 12 + nl, &n, 8);
        } else if (mode == W_CHECK) {
            if (pos + 20 + nl > *size) {
                return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: the file ends inside parameter '%s'", p->name ? p->name : "");
            }
            uint32_t fnl, fdt, ftr;
            uint64_t fn;
            memcpy(&fnl, img + pos, 4);
            if (fnl != nl || memcmp(img + pos + 4, p->name ? p->name : "", nl)) {
                /* both names cut at the same place, and where they first differ,
                 * so two long names sharing a prefix never print alike */
                const char *mn = p->name ? p->name : "", *fname = (const char *)img + pos + 4;
                uint32_t avail = (uint32_t)(*size - pos - 4 < fnl ? *size - pos - 4 : fnl);
                uint32_t d = 0;
                while (d < nl && d < avail && mn[d] == fname[d]) d++;
                return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: parameter %d is named "
                                                           "'%.96s' (%u bytes) in the model but '%.*s' (%u bytes) in the file; the "
                                                           "names first differ at byte %u",
                               i, mn, nl, (int)(avail < 96 ? avail : 96),
                               fname, fnl, d);
            }
            memcpy(&fdt, img + pos + 4 + nl, 4);
            memcpy(&ftr, img + pos + 8 + nl, 4);
            memcpy(&fn, img + pos + 12 + nl, 8);
            if (fdt != dt || ftr != tr || fn != n) {
                return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: parameter '%s' has dtype %u, trainable %u, %llu elements in the "
                                                           "model but %u, %u, %llu in the file",
                               p->name ? p->name : "", dt, tr,
                               (unsigned long long)n, fdt, ftr, (unsigned long long)fn);
            }
        }
        pos += 20 + nl;
        int rc = PT_OK;
        if (mode == W_CHECK && pos + db <= *size)
            rc = refuse_value(img + pos, n, p->dtype, 0, p->name ? p->name : "", "data", err,
                              errlen);
        if (rc) return rc;
        void *pdata = c->persistent ? (char *)c->d_param + off : (char *)c->h_param + off;
        if (move && xfer(st, c, img + pos, pdata, db, to_img)) goto io;
        pos += db;
        if (!tr || !st->opt_ready) continue;
        if (s == UINT64_MAX) {
            return pt_fail(err, errlen, PT_ERR_INTERNAL, "state: trainable parameter '%s' has no optimizer state", p->name ? p->name : "");
        }
        float *master = c->persistent ? c->d_master : c->h_master;
        float *mm = c->persistent ? c->d_m : c->h_m, *vv = c->persistent ? c->d_v : c->h_v;
        if (mode == W_CHECK && pos + 3 * fb <= *size) {
            const char *nm = p->name ? p->name : "";
            int has_master = p->dtype != PT_F32;
            if (has_master)
                rc = refuse_value(img + pos, n, PT_F32, 0, nm, "fp32 master", err, errlen);
            size_t mo = pos + (has_master ? fb : 0);
            if (!rc) rc = refuse_value(img + mo, n, PT_F32, 0, nm, "first-moment (m)", err, errlen);
            if (!rc && mo + 2 * fb <= *size)
                rc = refuse_value(img + mo + fb, n, PT_F32, 1, nm, "second-moment (v)", err,
                                  errlen);
            if (rc) return rc;
        }
        if (p->dtype != PT_F32) {
            if (move && xfer(st, c, img + pos, master + s, fb, to_img)) goto io;
            pos += fb;
        }
        if (move && (xfer(st, c, img + pos, mm + s, fb, to_img) ||
                     xfer(st, c, img + pos + fb, vv + s, fb, to_img)))
            goto io;
        pos += 2 * fb;
        uint64_t ow = 0;   /* the optimizer kind's own words (REKLS: factors, bases, eigenvalues) */
        float *os = st->ok->param_state ? st->ok->param_state(st, i, &ow) : NULL;
        if (ow) {
            size_t ab = sizeof(float) * (size_t)ow;
            if (move && xfer(st, c, img + pos, os, ab, to_img)) goto io;
            pos += ab;
        }
    }
    *size = pos;
    return PT_OK;
io:
    /* pt_gpu_memcpy is a memcpy followed by a stream_sync on the device */
    return pt_fail(err, errlen, PT_ERR_BACKEND,
                   "state: device copy failed (memcpy or the stream_sync after it)");
}

/* The optimizer state must exist (create_optimizer done) for m and v. */
/* need_opt: files carry the optimizer state; in-memory images carry it when it
 * exists (a re-plan before create_optimizer moves parameter values only). */
static int ready(pt_store *st, const char *what, int need_opt, char *err, size_t errlen) {
    if (!st || (need_opt && !st->opt_ready)) {
        return pt_fail(err, errlen, PT_ERR_ORDER, "%s: needs post_model_load%s first", what, need_opt ? " and create_optimizer" : "");
    }
    /* no CPU task may still write a chunk; one that failed fails this too */
    int rc = PT_OK;
    for (int k = 0; k < st->n_chunks && st->workers; k++) {
        char e[320];
        int r = pt_cs_wait_task(st, &st->ch[k], what, e, sizeof e);
        if (r && !rc) rc = pt_fail(err, errlen, r, "%s", e);
    }
    return rc;
}

int pt_store_snapshot(pt_store *st, pt_state_image *img, char *err, size_t errlen) {
    if (pt_store_sync(st, err, errlen)) return PT_ERR_BACKEND;   /* queued work may use the state */
    memset(img, 0, sizeof *img);
    int rc = ready(st, "state snapshot", 0, err, errlen);
    if (rc) return rc;
    size_t n = 0;
    if ((rc = walk(st, NULL, &n, W_SIZE, err, errlen))) return rc;
    img->data = malloc(n ? n : 1);
    if (!img->data) {
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "state: out of host memory for a %zu-byte snapshot", n);
    }
    img->bytes = n;
    img->step = st->env.opt->t;
    img->has_opt = st->opt_ready;
    /* mode C: every rank's parts gathered into whole chunks first (a collective:
     * every rank snapshots at the same point), so the image is the same per
     * parameter image a single rank writes */
    if (st->shard && (rc = pt_sh_views_open(st, 1, err, errlen))) {
        pt_store_image_free(img);
        return rc;
    }
    /* and the optimizer kind's own state of split chunks' params (REKLS: from
     * their owners), into the same places a single rank's image has it */
    if (st->shard && st->opt_ready && st->ok->views_open &&
        (rc = st->ok->views_open(st, 1, err, errlen))) {
        pt_sh_views_close(st, 0);
        pt_store_image_free(img);
        return rc;
    }
    /* the disk tier's states in memory while the walk reads them */
    if (!rc && (st->opt_ready || pt_tier_level(st) == 2) &&
        (rc = pt_tier_views_open(st, 1, err, errlen)))
        goto out;
    rc = walk(st, img->data, &n, W_SAVE, err, errlen);
    pt_tier_views_close(st, 0, NULL, 0);
out:
    if (st->shard && st->ok->views_close) st->ok->views_close(st, 0);
    if (st->shard) pt_sh_views_close(st, 0);
    if (rc) pt_store_image_free(img);
    return rc;
}

/* Streamed copies in buffer slots no longer match the store: drop their tags. */
static void invalidate_slots(pt_store *st) {
    pt_store *ms = st;
    if (ms->pool) pt_bufpool_invalidate_all(ms->pool);
}

/* The image fits this store (names, shapes, sizes), checked without changing
 * anything. */
static int check_image(pt_store *st, const pt_state_image *img, char *err, size_t errlen) {
    int rc = ready(st, "state restore", img->has_opt, err, errlen);
    if (rc) return rc;
    if (img->has_opt != st->opt_ready) {
        return pt_fail(err, errlen, PT_ERR_ORDER, "state restore: the image %s optimizer state but the optimizer %s",
                       img->has_opt ? "holds" : "lacks", st->opt_ready ? "exists" : "does not exist yet");
    }
    size_t need = 0;
    if ((rc = walk(st, NULL, &need, W_SIZE, err, errlen))) return rc;
    size_t have = img->bytes;
    if ((rc = walk(st, img->data, &have, W_CHECK, err, errlen))) return rc;
    if (need != img->bytes) {
        return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: the state holds %zu bytes of parameters and optimizer state, this "
                                                   "model needs %zu (a different model)",
                       img->bytes, need);
    }
    return PT_OK;
}

int pt_store_restore(pt_store *st, const pt_state_image *img, char *err, size_t errlen) {
    if (pt_store_sync(st, err, errlen)) return PT_ERR_BACKEND;   /* queued work may use the state */
    int rc = check_image(st, img, err, errlen);
    if (rc) return rc;
    size_t n = img->bytes;
    /* mode C: whole-chunk views receive the image; this rank keeps its parts */
    if (st->shard && (rc = pt_sh_views_open(st, 0, err, errlen))) return rc;
    if (st->shard && st->opt_ready && st->ok->views_open &&
        (rc = st->ok->views_open(st, 0, err, errlen))) {
        pt_sh_views_close(st, 0);
        return rc;
    }
    /* the disk tier: the image's states written to its file (a resume refills it) */
    if ((st->opt_ready || pt_tier_level(st) == 2) && (rc = pt_tier_views_open(st, 1, err, errlen)))
        goto out;
    rc = walk(st, img->data, &n, W_LOAD, err, errlen);
    {
        int trc = pt_tier_views_close(st, !rc, err, errlen);
        if (!rc) rc = trc;
    }
out:
    /* the kind's state goes back where it lives (REKLS: its owners take it,
     * moments from the m / v views, so before those close) */
    if (st->shard && st->ok->views_close) st->ok->views_close(st, !rc);
    if (st->shard) pt_sh_views_close(st, !rc);
    if (rc) return rc;
    st->env.opt->t = img->step;
    invalidate_slots(st);
    return PT_OK;
}

void pt_store_image_free(pt_state_image *img) {
    free(img->data);
    img->data = NULL;
    img->bytes = 0;
}

static void file_path(pt_store *st, const char *dir, char *buf, size_t len) {
    snprintf(buf, len, "%s/protrain_state_rank%d.bin", dir, st->env.host->rank);
}

/* The file a rank loads: its own; a rank the saving run did not have (more ranks
 * now) reads rank 0's. Every file holds the whole per-parameter image (modes A
 * and B replicate it, mode C gathers it before writing), so any of them restores
 * any rank under any world size and mode. Tensor parallel (tp_size P > 1): a
 * file holds its rank's shards, the same for every rank with the same rank % P,
 * so a rank without a file of its own reads rank (rank % P)'s (the same tp_size
 * is checked in the header). Sets *from to the rank read. */
static void load_path(pt_store *st, const char *dir, char *buf, size_t len, int *from) {
    *from = st->env.host->rank;
    file_path(st, dir, buf, len);
    int P = pt_cs_tp_size(st);
    if (*from >= P && access(buf, F_OK) != 0 && errno == ENOENT) {
        *from = P > 1 ? *from % P : 0;
        snprintf(buf, len, "%s/protrain_state_rank%d.bin", dir, *from);
    }
}

/* A save killed between creating its temp file and the rename leaves
 * <file>.tmp.<pid> behind. Before writing, remove those of this rank's file
 * whose writer is gone (kill(pid, 0) says no such process); a live writer's
 * temp file, or one we cannot judge, stays. Only this rank's name: another
 * rank's writer may live on another machine, where its pid means nothing here. */
static void remove_stale_temps(pt_store *st, const char *dir) {
    char prefix[96];
    int pl = snprintf(prefix, sizeof prefix, "protrain_state_rank%d.bin.tmp.", st->env.host->rank);
    DIR *d = opendir(dir);
    if (!d) return;   /* the save itself reports an unusable directory */
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, (size_t)pl)) continue;
        const char *num = e->d_name + pl;
        char *end;
        errno = 0;
        long pid = strtol(num, &end, 10);
        if (!*num || *end || errno || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!unlink(path))
            PT_LOGI(st->env.lg, "save_state: removed %s, left by a save whose process (pid %ld) "
                                "no longer exists",
                    path, pid);
        else
            PT_LOGW(st->env.lg, "save_state: cannot remove the stale temp file %s: %s", path,
                    strerror(errno));
    }
    closedir(d);
}

int pt_store_save(pt_store *st, const char *dir, char *err, size_t errlen) {
    if (!dir || !*dir) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "save_state: no directory given");
    }
    int rc = ready(st, "save_state", 1, err, errlen);
    if (rc) return rc;
    pt_state_image img;
    if ((rc = pt_store_snapshot(st, &img, err, errlen))) return rc;
    st_header h;
    memset(&h, 0, sizeof h);
    h.magic = ST_MAGIC;
    h.version = ST_VERSION;
    h.n_params = (uint32_t)st->env.model->n_params;
    h.rank = (uint32_t)st->env.host->rank;
    h.world_size = (uint32_t)running_world(st);
    h.optim = (uint32_t)pt_optk_of(st->env.opt->type)->id;
    h.step = img.step;
    h.payload_bytes = img.bytes;
    h.lr = st->env.opt->lr;
    h.beta1 = st->env.opt->beta1;
    h.beta2 = st->env.opt->beta2;
    h.eps = st->env.opt->eps;
    h.weight_decay = st->env.opt->weight_decay;
    h.max_grad_norm = st->env.opt->max_grad_norm;
    h.tp_size = (uint32_t)pt_cs_tp_size(st);
    h.lr0 = st->env.opt->lr0;
    h.flags = ST_HAS_LR0;
    uint64_t id = run_ident(st);
    if (id) {
        h.flags |= ST_HAS_RUN;
        h.run_lo = (uint32_t)id;
        h.run_hi = (uint32_t)(id >> 32);
    }
    h.checksum = file_checksum(&h, img.data, img.bytes);
    char path[1024], tmp[1100];
    file_path(st, dir, path, sizeof path);
    remove_stale_temps(st, dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        rc = pt_fail(err, errlen, PT_ERR_IO, "save_state: cannot create %s: %s", tmp,
                     strerror(errno));
        pt_store_image_free(&img);
        return rc;
    }
    const unsigned char *parts[2] = {(const unsigned char *)&h, img.data};
    size_t lens[2] = {sizeof h, img.bytes};
    for (int k = 0; k < 2 && !rc; k++)
        for (size_t done = 0; done < lens[k];) {
            ssize_t w = write(fd, parts[k] + done, lens[k] - done);
            if (w <= 0) {
                rc = pt_fail(err, errlen, PT_ERR_IO, "save_state: writing %s failed: %s", tmp, strerror(errno));
                break;
            }
            done += (size_t)w;
        }
    if (!rc && fsync(fd)) {
        rc = pt_fail(err, errlen, PT_ERR_IO, "save_state: fsync of %s failed: %s", tmp, strerror(errno));
    }
    close(fd);
    pt_store_image_free(&img);
    if (!rc && rename(tmp, path)) {
        rc = pt_fail(err, errlen, PT_ERR_IO, "save_state: rename %s -> %s failed: %s", tmp, path, strerror(errno));
    }
    if (rc) unlink(tmp);
    else PT_LOGI(st->env.lg, "state saved to %s (step %lld, %llu bytes)", path, (long long)h.step,
                 (unsigned long long)(sizeof h + h.payload_bytes));
    return rc;
}

/* Values a checksummed header may still hold that this run cannot use (a file
 * written by a buggy or foreign writer): refused before anything is restored. */
static int check_header(pt_store *st, const st_header *h, const char *path, int from,
                        char *err, size_t errlen) {
    if (h->n_params != (uint32_t)st->env.model->n_params)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s holds a model with %u parameters, this one has %d", path,
                       h->n_params, st->env.model->n_params);
    /* the file of another rank by name would be a copy gone wrong; another world
     * size is fine (the image is per parameter) */
    if (h->rank != (uint32_t)from || h->world_size < 1 || h->rank >= h->world_size)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s says it was saved by rank %u "
                                                   "of %u, but its name is rank %d's",
                       path, h->rank, h->world_size, from);
    /* split params hold a 1/P shard: another P would read another shard's
     * values (a changed shard size would also fail the element counts) */
    uint32_t ftp = h->tp_size ? h->tp_size : 1;
    if (ftp != (uint32_t)pt_cs_tp_size(st))
        return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s was saved with [dist] "
                                                   "tp_size %u, this run has %d: its split parameters are other shards",
                       path, ftp, pt_cs_tp_size(st));
    /* the file's kind (0: a file from before the field, AdamW) against the
     * running one; an id no kind has is named unknown */
    const pt_optim_kind *filek = h->optim ? pt_optk_find((int)h->optim) : &pt_optk_adamw;
    const pt_optim_kind *runk = pt_optk_of(st->env.opt->type);
    if (filek != runk)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s holds %s optimizer state, "
                                                   "the running optimizer is %s",
                       path, filek ? filek->name : "unknown", runk->name);
    /* a file of another run (a copy from another seed's run, at the same step):
     * refused when both the file and this run carry an identity */
    uint64_t fid = (uint64_t)h->run_hi << 32 | h->run_lo, rid = run_ident(st);
    if ((h->flags & ST_HAS_RUN) && rid && fid != rid)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s is another run's: its run "
                                                   "identity %016llx (from the \"run.\" lines of the saving host's "
                                                   "pt_host_v1.fingerprint) differs from this run's %016llx, so the host "
                                                   "says the runs differ (another seed, data, model, batch, accumulation or "
                                                   "schedule)",
                       path,
                       (unsigned long long)fid, (unsigned long long)rid);
    if (h->step < 0 || h->step > ST_MAX_STEP)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s has step %lld; a step count "
                                                   "must be in [0, 2^40] (more is a hand-made or foreign file)",
                       path,
                       (long long)h->step);
    const float hp[7] = {h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, h->max_grad_norm,
                         h->lr0};
    static const char *const names[7] = {"lr", "beta1", "beta2", "eps", "weight_decay",
                                         "max_grad_norm", "lr0"};
    for (int i = 0; i < 7; i++)
        if (!isfinite(hp[i]))
            return pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s has %s = %g; "
                                                       "hyper-parameters must be finite",
                           path, names[i], (double)hp[i]);
    return PT_OK;
}

/* The optimizer's hyper-parameters the file was saved under against the running
 * ones (the host's create_optimizer chose them; lr as the run was created, lr0,
 * not the last step's scheduled lr): a resume continues the same run, so a
 * difference is refused, naming the first, unless [optimizer] resume_changes
 * allows a deliberate change; then the running ones stay in force and each
 * change is logged (warn = 1, after the load). Files without lr0 (older
 * writers) compare beta1..max_grad_norm. */
static int check_hparams(pt_store *st, const st_header *h, const char *path, int warn,
                         char *err, size_t errlen) {
    const pt_optim_state *o = st->env.opt;
    const float saved[6] = {h->lr0, h->beta1, h->beta2, h->eps, h->weight_decay, h->max_grad_norm};
    const float run[6] = {o->lr0, o->beta1, o->beta2, o->eps, o->weight_decay, o->max_grad_norm};
    static const char *const names[6] = {"lr", "beta1", "beta2", "eps", "weight_decay",
                                         "max_grad_norm"};
    const int allow = st->env.cfg && st->env.cfg->resume_changes;
    for (int i = (h->flags & ST_HAS_LR0) ? 0 : 1; i < 6; i++) {
        if (saved[i] == run[i]) continue;
        if (!allow && !err) return PT_ERR_CONFIG;
        if (!allow)
            return pt_fail(err, errlen, PT_ERR_CONFIG,
                           "load_state: %s was saved with %s = %g, the running optimizer has "
                           "%s = %g: a resume continues the same run, so its optimizer "
                           "settings must match; to change them on resume deliberately, set "
                           "[optimizer] resume_changes = true (config %s)",
                           path, names[i],
                           (double)saved[i], names[i], (double)run[i],
                           st->env.cfg ? st->env.cfg->source : "?");
        if (warn)
            PT_LOGW(st->env.lg, "load_state: %s was saved with %s = %g; the running optimizer's "
                                "%s = %g is kept ([optimizer] resume_changes = true)",
                    path,
                    names[i], (double)saved[i], names[i], (double)run[i]);
    }
    return PT_OK;
}

int pt_store_load(pt_store *st, const char *dir, char *err, size_t errlen) {
    if (!dir || !*dir) {
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "load_state: no directory given");
    }
    char path[1024];
    int from = 0;
    load_path(st, dir, path, sizeof path, &from);
    FILE *f = fopen(path, "rb");
    if (!f) {
        return pt_fail(err, errlen, PT_ERR_IO, "load_state: cannot open %s: %s", path, strerror(errno));
    }
    st_header h;
    int rc = PT_OK;
    pt_state_image img = {0};
    struct stat sb;
    if (fread(&h, sizeof h, 1, f) != 1) {
        rc = pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s is truncated (no complete header)", path);
    } else if (h.magic != ST_MAGIC) {
        rc = pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s is not a protrain state file (magic %08x)", path, h.magic);
    } else if (h.version != ST_VERSION && h.version != 2) {
        rc = pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s has state format version %u, "
                                                 "this plugin reads version %u (and version 2, AdamW only)%s",
                     path, h.version, ST_VERSION,
                     h.version == 1 ? " (version 1 did not checksum its header, so its step and "
                                      "hyper-parameters cannot be trusted)"
                                    : "");
    } else if (fstat(fileno(f), &sb) || (uint64_t)sb.st_size < sizeof h ||
               (uint64_t)sb.st_size - sizeof h != h.payload_bytes) {
        rc = pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s is %lld bytes, its header says %llu (truncated or trailing bytes)",
                     path, (long long)sb.st_size, (unsigned long long)(sizeof h + h.payload_bytes));
    } else if (!(img.data = malloc(h.payload_bytes ? h.payload_bytes : 1))) {
        rc = pt_fail(err, errlen, PT_ERR_HOST_OOM, "load_state: out of host memory (%llu bytes)", (unsigned long long)h.payload_bytes);
    } else if (fread(img.data, 1, h.payload_bytes, f) != h.payload_bytes) {
        rc = pt_fail(err, errlen, PT_ERR_IO, "load_state: reading %s failed", path);
    } else if (file_checksum(&h, img.data, h.payload_bytes) != h.checksum) {
        rc = pt_fail(err, errlen, PT_ERR_FORMAT, "load_state: %s is corrupt (checksum mismatch over its header and payload)", path);
    } else {
        rc = check_header(st, &h, path, from, err, errlen);
    }
    fclose(f);
    if (!rc) rc = ready(st, "load_state", 1, err, errlen);
    if (!rc) {
        img.bytes = h.payload_bytes;
        img.step = h.step;
        img.has_opt = 1;
        /* another model is named as such before other optimizer settings */
        rc = check_image(st, &img, err, errlen);
    }
    if (!rc) rc = check_hparams(st, &h, path, 0, err, errlen);
    if (!rc) rc = pt_store_restore(st, &img, err, errlen);
    pt_store_image_free(&img);
    if (!rc) {
        (void)check_hparams(st, &h, path, 1, NULL, 0);
        PT_LOGI(st->env.lg, "state loaded from %s (step %lld; saved by rank %u of %u, this is "
                            "rank %d of %d)",
                path, (long long)h.step, h.rank, h.world_size,
                st->env.host->rank, running_world(st));
    }
    return rc;
}
