/*
 * trace_cache.c — the on-disk trace cache (trace_cache.h; the trace's own
 * helpers and its validation are trace.c). The reader trusts nothing: sizes are checked against the
 * file before anything is allocated, the payload checksum is verified, and the
 * decoded trace goes through pt_trace_validate.
 */
#include "trace_cache.h"
#include "protrain.h"
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Encoded sizes (see the format in trace_cache.h). */
#define SCALAR_BYTES 296u
#define BLOCK_BYTES 72u
#define CHUNK_BYTES 108u

static const char MAGIC[8] = {'P', 'T', 'T', 'R', 'A', 'C', 'E', 0};

/* ---------------- encoding ---------------- */

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} wbuf;

static void put(wbuf *w, const void *src, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 1024;
        while (nc < w->n + n) nc *= 2;
        unsigned char *q = realloc(w->p, nc);
        if (!q) {
            w->oom = 1;
            return;
        }
        w->p = q;
        w->cap = nc;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}

/* Explicit little-endian so the file is the same on any host: the low nb
 * bytes of v, lowest first. */
static void put_le(wbuf *w, uint64_t v, int nb) {
    unsigned char b[8];
    for (int i = 0; i < nb; i++) b[i] = (unsigned char)(v >> (8 * i));
    put(w, b, (size_t)nb);
}
static void put_u64(wbuf *w, uint64_t v) { put_le(w, v, 8); }
static void put_u32(wbuf *w, uint32_t v) { put_le(w, v, 4); }
static void put_i32(wbuf *w, int32_t v) { put_u32(w, (uint32_t)v); }
static void put_f64(wbuf *w, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    put_u64(w, v);
}

typedef struct rbuf {
    const unsigned char *p;
    size_t n, off;
    int bad;
} rbuf;

/* nb little-endian bytes; past the end: 0, and the buffer is marked bad. */
static uint64_t get_le(rbuf *r, int nb) {
    if (r->bad || r->n - r->off < (size_t)nb) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < nb; i++) v |= (uint64_t)r->p[r->off + i] << (8 * i);
    r->off += (size_t)nb;
    return v;
}
static uint64_t get_u64(rbuf *r) { return get_le(r, 8); }
static uint32_t get_u32(rbuf *r) { return (uint32_t)get_le(r, 4); }
static int32_t get_i32(rbuf *r) { return (int32_t)get_u32(r); }
static double get_f64(rbuf *r) {
    uint64_t v = get_u64(r);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

static void encode_payload(wbuf *w, const pt_trace *t) {
    put_i32(w, t->n_block);
    put_i32(w, t->n_chunk);
    put_u64(w, t->chunk_size);
    put_i32(w, t->tp_size);
    put_f64(w, t->embed_fwd_s);
    put_f64(w, t->embed_bwd_s);
    put_f64(w, t->head_fwd_s);
    put_f64(w, t->head_bwd_s);
    put_u64(w, t->nonblock_bytes);
    put_u64(w, t->nonblock_scratch_bytes);
    put_u32(w, t->param_elem_bytes);
    put_u32(w, t->grad_elem_bytes);
    put_u32(w, t->master_elem_bytes);
    put_u32(w, t->adam_m_elem_bytes);
    put_u32(w, t->adam_v_elem_bytes);
    put_u32(w, t->host_grad_elem_bytes);
    put_u64(w, t->slot_bytes);
    put_f64(w, t->hw.h2d_Bps);
    put_f64(w, t->hw.d2h_Bps);
    put_f64(w, t->hw.cpu_adam_elems_per_s);
    put_f64(w, t->hw.dev_adam_elems_per_s);
    put_f64(w, t->hw.allreduce_Bps);
    put_f64(w, t->hw.allgather_Bps);
    put_f64(w, t->hw.reduce_scatter_Bps);
    put_f64(w, t->hw.dev_op_s);
    put_f64(w, t->hw.dev_memset_Bps);
    put_f64(w, t->hw.h2d_lat_s);
    put_f64(w, t->hw.d2h_lat_s);
    put_f64(w, t->hw.free_Bps);
    put_f64(w, t->hw.free_fwd_Bps);
    put_i32(w, t->hw.copy_engines);
    put_u64(w, t->hw.host_ram_bytes);
    put_u64(w, t->hw.device_capacity);
    put_f64(w, t->calib.peak);
    put_f64(w, t->calib.fwd);
    put_f64(w, t->calib.bwd);
    put_f64(w, t->calib.opt);
    put_f64(w, t->frag.factor);
    put_u64(w, t->frag.peak_bytes);
    put_u64(w, t->frag.span_bytes);
    put_u64(w, t->frag.largest_free);
    put_u64(w, t->frag.rounding_bytes);
    for (int32_t b = 0; b < t->n_block; b++) {
        const pt_trace_block *B = &t->blocks[b];
        put_f64(w, B->fwd_s);
        put_f64(w, B->bwd_s);
        put_f64(w, B->recompute_s);
        put_u64(w, B->arena_bytes);
        put_u64(w, B->input_bytes);
        put_u64(w, B->fwd_scratch_bytes);
        put_u64(w, B->bwd_scratch_bytes);
        put_u64(w, B->grad_act_bytes);
        put_i32(w, B->chunk_lo);
        put_i32(w, B->chunk_hi);
    }
    for (int32_t k = 0; k < t->n_chunk; k++) {
        const pt_trace_chunk *c = &t->chunks[k];
        put_u64(w, c->bytes);
        put_u64(w, c->elems);
        put_u64(w, c->trainable_elems);
        put_i32(w, c->first_block);
        put_i32(w, c->last_block);
        put_i32(w, c->mandatory);
        put_u64(w, c->dev_bytes);
        put_u64(w, c->host_bytes);
        put_u64(w, c->optim_bytes);
        put_f64(w, c->optim_s);
        put_u64(w, c->tp_grad_bytes);
        put_u64(w, c->tp_factor_bytes);
        put_u64(w, c->optim_aux_words);
        put_u64(w, c->optim_mn);
        put_u64(w, c->optim_own_max);
    }
}

/* Decode a payload whose size was already checked against n_block/n_chunk. */
static int decode_payload(rbuf *r, pt_trace *t, char *err, size_t errlen) {
    int32_t nb = get_i32(r), nc = get_i32(r);
    if (r->bad || nb < 1 || nb > PT_TRACE_MAX_BLOCKS || nc < 1 || nc > PT_TRACE_MAX_CHUNKS)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "block/chunk counts %d/%d out of range", nb, nc);
    if ((uint64_t)r->n != SCALAR_BYTES + (uint64_t)nb * BLOCK_BYTES + (uint64_t)nc * CHUNK_BYTES)
        return pt_fail(err, errlen, PT_ERR_FORMAT, "payload of %zu bytes does not match %d blocks and %d chunks", r->n,
                       nb, nc);
    int rc = pt_trace_alloc(t, nb, nc, err, errlen);
    if (rc) return rc;
    t->chunk_size = get_u64(r);
    t->tp_size = get_i32(r);
    t->embed_fwd_s = get_f64(r);
    t->embed_bwd_s = get_f64(r);
    t->head_fwd_s = get_f64(r);
    t->head_bwd_s = get_f64(r);
    t->nonblock_bytes = get_u64(r);
    t->nonblock_scratch_bytes = get_u64(r);
    t->param_elem_bytes = get_u32(r);
    t->grad_elem_bytes = get_u32(r);
    t->master_elem_bytes = get_u32(r);
    t->adam_m_elem_bytes = get_u32(r);
    t->adam_v_elem_bytes = get_u32(r);
    t->host_grad_elem_bytes = get_u32(r);
    t->slot_bytes = get_u64(r);
    t->hw.h2d_Bps = get_f64(r);
    t->hw.d2h_Bps = get_f64(r);
    t->hw.cpu_adam_elems_per_s = get_f64(r);
    t->hw.dev_adam_elems_per_s = get_f64(r);
    t->hw.allreduce_Bps = get_f64(r);
    t->hw.allgather_Bps = get_f64(r);
    t->hw.reduce_scatter_Bps = get_f64(r);
    t->hw.dev_op_s = get_f64(r);
    t->hw.dev_memset_Bps = get_f64(r);
    t->hw.h2d_lat_s = get_f64(r);
    t->hw.d2h_lat_s = get_f64(r);
    t->hw.free_Bps = get_f64(r);
    t->hw.free_fwd_Bps = get_f64(r);
    t->hw.copy_engines = get_i32(r);
    t->hw.host_ram_bytes = get_u64(r);
    t->hw.device_capacity = get_u64(r);
    t->calib.peak = get_f64(r);
    t->calib.fwd = get_f64(r);
    t->calib.bwd = get_f64(r);
    t->calib.opt = get_f64(r);
    t->frag.factor = get_f64(r);
    t->frag.peak_bytes = get_u64(r);
    t->frag.span_bytes = get_u64(r);
    t->frag.largest_free = get_u64(r);
    t->frag.rounding_bytes = get_u64(r);
    for (int32_t b = 0; b < nb; b++) {
        pt_trace_block *B = &t->blocks[b];
        B->fwd_s = get_f64(r);
        B->bwd_s = get_f64(r);
        B->recompute_s = get_f64(r);
        B->arena_bytes = get_u64(r);
        B->input_bytes = get_u64(r);
        B->fwd_scratch_bytes = get_u64(r);
        B->bwd_scratch_bytes = get_u64(r);
        B->grad_act_bytes = get_u64(r);
        B->chunk_lo = get_i32(r);
        B->chunk_hi = get_i32(r);
    }
    for (int32_t k = 0; k < nc; k++) {
        pt_trace_chunk *c = &t->chunks[k];
        c->bytes = get_u64(r);
        c->elems = get_u64(r);
        c->trainable_elems = get_u64(r);
        c->first_block = get_i32(r);
        c->last_block = get_i32(r);
        c->mandatory = get_i32(r);
        c->dev_bytes = get_u64(r);
        c->host_bytes = get_u64(r);
        c->optim_bytes = get_u64(r);
        c->optim_s = get_f64(r);
        c->tp_grad_bytes = get_u64(r);
        c->tp_factor_bytes = get_u64(r);
        c->optim_aux_words = get_u64(r);
        c->optim_mn = get_u64(r);
        c->optim_own_max = get_u64(r);
    }
    if (r->bad || r->off != r->n) return pt_fail(err, errlen, PT_ERR_FORMAT, "payload ends early or has trailing bytes");
    return PT_OK;
}

/* Device name bytes up to the NUL, zero-filled: stray bytes after it are not key. */
static void norm_device(char dst[64], const char *src) {
    size_t n = strnlen(src, 63);
    memset(dst, 0, 64);
    memcpy(dst, src, n);
}

static void encode_header(wbuf *w, const pt_trace_key *k, uint64_t payload_size, uint64_t sum) {
    char dev[64];
    norm_device(dev, k->device);
    put(w, MAGIC, 8);
    put_u32(w, PT_TRACE_FILE_VERSION);
    put_u32(w, PT_TRACE_HEADER_BYTES);
    put_u64(w, k->arch_hash);
    put_u64(w, (uint64_t)k->batch);
    put_u64(w, (uint64_t)k->seq);
    put_i32(w, k->world_size);
    put_u32(w, k->version);
    put(w, dev, 64);
    put_u64(w, payload_size);
    put_u64(w, sum);
}

/* Hash of the key fields (not of the struct bytes: padding is not data). */
static uint64_t key_hash(const pt_trace_key *k) {
    wbuf w = {0};
    put_u64(&w, k->arch_hash);
    put_u64(&w, (uint64_t)k->batch);
    put_u64(&w, (uint64_t)k->seq);
    put_i32(&w, k->world_size);
    put_u32(&w, k->version);
    char dev[64];
    norm_device(dev, k->device);
    put(&w, dev, 64);
    uint64_t h = w.oom ? 0 : pt_fnv1a64(w.p, w.n);
    free(w.p);
    return h;
}

static int key_equal(const pt_trace_key *a, const pt_trace_key *b) {
    return a->arch_hash == b->arch_hash && a->batch == b->batch && a->seq == b->seq &&
           a->world_size == b->world_size && a->version == b->version &&
           strncmp(a->device, b->device, sizeof a->device) == 0;
}

int pt_trace_cache_path(const char *dir, const pt_trace_key *key, char *buf, size_t len) {
    int n = snprintf(buf, len, "%s/%016llx.trace", dir && *dir ? dir : ".", (unsigned long long)key_hash(key));
    return (n < 0 || (size_t)n >= len) ? PT_ERR_INVALID_ARG : PT_OK;
}

int pt_trace_write_file(const char *path, const pt_trace *t, char *err, size_t errlen) {
    char verr[256];
    if (pt_trace_validate(t, verr, sizeof verr))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "refusing to write an invalid trace to %s: %s", path, verr);
    wbuf pay = {0}, all = {0};
    encode_payload(&pay, t);
    if (!pay.oom) {
        encode_header(&all, &t->key, pay.n, pt_fnv1a64(pay.p, pay.n));
        put(&all, pay.p, pay.n);
    }
    free(pay.p);
    if (pay.oom || all.oom) {
        free(all.p);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of memory encoding the trace for %s", path);
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        free(all.p);
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace path too long: %s", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        int e = errno;
        free(all.p);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot create %s: %s", tmp, strerror(e));
    }
    size_t off = 0;
    while (off < all.n) {
        ssize_t m = write(fd, all.p + off, all.n - off);
        if (m < 0 && errno == EINTR) continue;
        if (m <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            free(all.p);
            return pt_fail(err, errlen, PT_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
        }
        off += (size_t)m;
    }
    free(all.p);
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot flush %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return pt_fail(err, errlen, PT_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    /* Make the rename itself durable. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        if (!*dir) strcpy(dir, "/");
    } else {
        strcpy(dir, ".");
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return PT_OK;
}

int pt_trace_read_file(const char *path, const pt_trace_key *expect, pt_trace *out, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return pt_fail(err, errlen, PT_ERR_IO, "cannot open trace %s: %s", path, strerror(errno));
    unsigned char hdr[PT_TRACE_HEADER_BYTES];
    size_t got = fread(hdr, 1, sizeof hdr, f);
    if (got != sizeof hdr) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is truncated: %zu of %u header bytes", path, got,
                       PT_TRACE_HEADER_BYTES);
    }
    rbuf r = {hdr, sizeof hdr, 0, 0};
    if (memcmp(hdr, MAGIC, 8) != 0) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s has a wrong magic (not a protrain trace)", path);
    }
    r.off = 8;
    uint32_t fver = get_u32(&r), hsize = get_u32(&r);
    pt_trace_key k;
    memset(&k, 0, sizeof k);
    k.arch_hash = get_u64(&r);
    k.batch = (int64_t)get_u64(&r);
    k.seq = (int64_t)get_u64(&r);
    k.world_size = get_i32(&r);
    k.version = get_u32(&r);
    memcpy(k.device, hdr + r.off, 64);
    r.off += 64;
    uint64_t psize = get_u64(&r), sum = get_u64(&r);
    if (fver != PT_TRACE_FILE_VERSION || hsize != PT_TRACE_HEADER_BYTES) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s has file format %u (header %u), this build reads %u", path,
                       fver, hsize, PT_TRACE_FILE_VERSION);
    }
    if (memchr(k.device, 0, sizeof k.device) == NULL) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s has an unterminated device name", path);
    }
    if (k.version != PT_TRACE_VERSION) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is trace version %u, this build wants %u", path, k.version,
                       PT_TRACE_VERSION);
    }
    if (expect && !key_equal(&k, expect)) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT,
                       "trace %s belongs to another key (arch %016llx batch %lld seq %lld device '%s' world %d)", path,
                       (unsigned long long)k.arch_hash, (long long)k.batch, (long long)k.seq, k.device, k.world_size);
    }
    /* Size check against the real file before allocating anything. */
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0 ||
        (uint64_t)st.st_size != (uint64_t)PT_TRACE_HEADER_BYTES + psize ||
        psize > SCALAR_BYTES + (uint64_t)PT_TRACE_MAX_BLOCKS * BLOCK_BYTES +
                    (uint64_t)PT_TRACE_MAX_CHUNKS * CHUNK_BYTES) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is truncated or oversized: header says %llu payload bytes, file has %lld",
                       path, (unsigned long long)psize, (long long)st.st_size - PT_TRACE_HEADER_BYTES);
    }
    unsigned char *pay = malloc(psize ? psize : 1);
    if (!pay) {
        fclose(f);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "cannot allocate %llu bytes to read %s", (unsigned long long)psize, path);
    }
    got = fread(pay, 1, psize, f);
    fclose(f);
    if (got != psize) {
        free(pay);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is truncated: %zu of %llu payload bytes", path, got,
                       (unsigned long long)psize);
    }
    if (pt_fnv1a64(pay, psize) != sum) {
        free(pay);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is corrupt: payload checksum mismatch", path);
    }
    pt_trace t;
    pt_trace_init(&t);
    t.key = k;
    rbuf pr = {pay, psize, 0, 0};
    char derr[256];
    int rc = decode_payload(&pr, &t, derr, sizeof derr);
    free(pay);
    if (!rc) rc = pt_trace_validate(&t, derr, sizeof derr);
    if (rc) {
        pt_trace_free(&t);
        return pt_fail(err, errlen, PT_ERR_FORMAT, "trace %s is corrupt: %s", path, derr);
    }
    pt_trace_free(out);
    *out = t;
    return PT_OK;
}

int pt_trace_cache_store(const char *dir, const pt_trace *t, char *err, size_t errlen) {
    if (!dir || !*dir) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace cache: no cache directory given");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pt_fail(err, errlen, PT_ERR_IO, "trace cache: cannot create directory %s: %s", dir, strerror(errno));
    char path[4096];
    if (pt_trace_cache_path(dir, &t->key, path, sizeof path))
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "trace cache: directory path too long: %s", dir);
    return pt_trace_write_file(path, t, err, errlen);
}

int pt_trace_cache_load(const char *dir, const pt_trace_key *key, pt_trace *out, char *warn, size_t warnlen) {
    if (warn && warnlen) warn[0] = 0;
    char path[4096];
    if (!dir || !*dir || pt_trace_cache_path(dir, key, path, sizeof path)) {
        pt_fail(warn, warnlen, 0, "trace cache: directory missing or path too long; profiling");
        return PT_CACHE_MISS;
    }
    if (access(path, F_OK) != 0) return PT_CACHE_MISS;   /* clean miss */
    char e[512];
    int rc = pt_trace_read_file(path, key, out, e, sizeof e);
    if (rc) {
        pt_fail(warn, warnlen, 0, "trace cache: ignoring %s", e);
        return PT_CACHE_MISS;
    }
    return PT_CACHE_HIT;
}
