/*
 * ckpt.c — llm.c checkpoint I/O with full header and size validation.
 * Assumes a little-endian host (x86-64, aarch64), as llm.c does.
 */
#include "sh_ckpt.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Number of floats the checkpoint body holds for dims d (wte and wpe included once). */
static size_t body_floats(const sh_dims *d) {
    size_t C = (size_t)d->C, L = (size_t)d->L;
    return (size_t)d->Vp * C + (size_t)d->maxT * C +
           L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C + 4 * C * C + 4 * C + 4 * C * C + C) +
           2 * C;
}

static const char *const FIELD[8] = {"magic", "version", "max_seq_len", "vocab_size",
                                     "num_layers", "num_heads", "channels", "padded_vocab_size"};

static int check_header(const char *path, const int32_t *h, long long fsize, sh_dims *d,
                        char *err, size_t errlen) {
    if (h[0] != SH_CKPT_MAGIC) {
        snprintf(err, errlen, "%s: header field magic is %d, expected %d (llm.c GPT-2 "
                              "checkpoint)",
                 path, h[0], SH_CKPT_MAGIC);
        return -1;
    }
    if (h[1] != SH_CKPT_VERSION) {
        snprintf(err, errlen, "%s: header field version is %d, expected %d (fp32)%s", path,
                 h[1], SH_CKPT_VERSION, h[1] == 5 ? "; bf16 checkpoints are not supported" : "");
        return -1;
    }
    for (int i = 2; i < 8; i++) {
        if (h[i] <= 0) {
            snprintf(err, errlen, "%s: header field %s is %d, expected a positive value", path,
                     FIELD[i], h[i]);
            return -1;
        }
    }
    d->maxT = h[2];
    d->V = h[3];
    d->L = h[4];
    d->NH = h[5];
    d->C = h[6];
    d->Vp = h[7];
    char e2[256];
    if (sh_model_dims_check(d, e2, sizeof e2)) {
        snprintf(err, errlen, "%s: header describes an invalid model: %s", path, e2);
        return -1;
    }
    long long want = 1024 + 4 * (long long)body_floats(d);
    if (fsize != want) {
        snprintf(err, errlen, "%s: file size %lld does not match the header (1024 + 4 x %zu "
                              "floats = %lld bytes): %s",
                 path, fsize, body_floats(d), want,
                 fsize < want ? "truncated" : "trailing bytes");
        return -1;
    }
    return 0;
}

/* Open and validate; on success *f is positioned at the first tensor. */
static int open_ckpt(const char *path, FILE **fo, sh_dims *d, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open checkpoint %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "checkpoint %s is not a regular file", path);
        fclose(f);
        return -1;
    }
    int32_t h[256];
    if (st.st_size < (off_t)sizeof h || fread(h, sizeof h, 1, f) != 1) {
        snprintf(err, errlen, "%s: truncated checkpoint header (%lld of 1024 bytes)", path,
                 (long long)st.st_size);
        fclose(f);
        return -1;
    }
    if (check_header(path, h, (long long)st.st_size, d, err, errlen)) {
        fclose(f);
        return -1;
    }
    *fo = f;
    return 0;
}

int sh_ckpt_read_header(const char *path, sh_dims *d, char *err, size_t errlen) {
    FILE *f = NULL;
    if (open_ckpt(path, &f, d, err, errlen)) return -1;
    fclose(f);
    return 0;
}

/* Visit the 16 checkpoint tensors in file order, per layer for stacked ones:
 * fn(model param index) for each piece in the order it appears in the file. */
static int visit(const sh_model *m, int (*fn)(void *u, int pidx), void *u) {
    int L = m->d.L;
    if (fn(u, SH_P_WTE) || fn(u, SH_P_WPE)) return -1;
    for (int k = 0; k < SH_NLP; k++)
        for (int l = 0; l < L; l++)
            if (fn(u, SH_P_LAYER(l, k))) return -1;
    if (fn(u, SH_P_LNFW(L)) || fn(u, SH_P_LNFB(L))) return -1;
    return 0;
}

typedef struct io_ctx {
    const sh_model *m;
    FILE *f;
    float *dst;       /* load target (flat layout) */
    const float *src; /* save source (flat layout) */
} io_ctx;

static int rd_piece(void *u, int i) {
    io_ctx *c = u;
    size_t n = sh_model_param_numel(&c->m->params[i]);
    return fread(c->dst + c->m->off[i], sizeof(float), n, c->f) == n ? 0 : -1;
}

static int wr_piece(void *u, int i) {
    io_ctx *c = u;
    size_t n = sh_model_param_numel(&c->m->params[i]);
    return fwrite(c->src + c->m->off[i], sizeof(float), n, c->f) == n ? 0 : -1;
}

int sh_ckpt_load(const char *path, sh_model *m, char *err, size_t errlen) {
    if (!m->init) {
        snprintf(err, errlen, "checkpoint %s: the model's initial values were already handed "
                              "to the plugin",
                 path);
        return -1;
    }
    FILE *f = NULL;
    sh_dims d;
    if (open_ckpt(path, &f, &d, err, errlen)) return -1;
    int hv[8] = {0, 0, d.maxT, d.V, d.L, d.NH, d.C, d.Vp};
    int mv[8] = {0, 0, m->d.maxT, m->d.V, m->d.L, m->d.NH, m->d.C, m->d.Vp};
    for (int i = 2; i < 8; i++) {
        if (hv[i] != mv[i]) {
            snprintf(err, errlen, "%s: mismatched shape: header field %s is %d but the model "
                                  "has %d",
                     path, FIELD[i], hv[i], mv[i]);
            fclose(f);
            return -1;
        }
    }
    io_ctx c = {.m = m, .f = f, .dst = m->init};
    int rc = visit(m, rd_piece, &c);
    fclose(f);
    if (rc) {
        snprintf(err, errlen, "%s: read error in the tensor data (file changed while "
                              "reading?)",
                 path);
        return -1;
    }
    return 0;
}

int sh_ckpt_save(const char *path, const sh_model *m, const float *flat, char *err,
                 size_t errlen) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        snprintf(err, errlen, "checkpoint path too long: %s", path);
        return -1;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    int32_t h[256] = {SH_CKPT_MAGIC, SH_CKPT_VERSION, m->d.maxT, m->d.V, m->d.L,
                      m->d.NH, m->d.C, m->d.Vp};
    int ok = fwrite(h, sizeof h, 1, f) == 1;
    io_ctx c = {.m = m, .f = f, .src = flat};
    ok = ok && visit(m, wr_piece, &c) == 0;
    ok = (fflush(f) == 0) && ok;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot write checkpoint %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}
