/*
 * data.c — text and llm.c shard loading, the default corpus, batch sampling,
 * and --data lists and globs of files.
 */
#include "sh_data.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Corpus limits: the default corpus is source text, a few MB at most. */
#define CORPUS_MAX_FILE (4u << 20)
#define CORPUS_MAX_TOTAL (64u << 20)
#define CORPUS_MAX_FILES 20000

void sh_data_tokens_free(sh_tokens *t) {
    free(t->tok);
    t->tok = NULL;
    t->n = 0;
}

/* Whole file into memory. *len bytes; returns NULL and fills err on failure. */
static unsigned char *slurp(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s is not a regular file", path);
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf) {
        snprintf(err, errlen, "out of host memory reading %s (%zu bytes)", path, n);
        fclose(f);
        return NULL;
    }
    if (n && fread(buf, 1, n, f) != n) {
        snprintf(err, errlen, "short read from %s (expected %zu bytes)", path, n);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

static int bytes_to_tokens(const unsigned char *b, size_t n, sh_tokens *out, const char *what,
                           char *err, size_t errlen) {
    out->tok = malloc((n ? n : 1) * sizeof(uint16_t));
    if (!out->tok) {
        snprintf(err, errlen, "out of host memory for %zu tokens of %s", n, what);
        return -1;
    }
    for (size_t i = 0; i < n; i++) out->tok[i] = b[i];
    out->n = n;
    return 0;
}

int sh_data_text_file_tokens(const char *path, sh_tokens *out, char *err, size_t errlen) {
    size_t n = 0;
    unsigned char *b = slurp(path, &n, err, errlen);
    if (!b) return -1;
    int rc = bytes_to_tokens(b, n, out, path, err, errlen);
    free(b);
    return rc;
}

static int32_t rd_i32(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

static int parse_shard(const char *path, const unsigned char *b, size_t n, sh_tokens *out,
                       char *err, size_t errlen) {
    if (n < 1024) {
        snprintf(err, errlen, "%s: truncated shard header (%zu of 1024 bytes)", path, n);
        return -1;
    }
    int32_t magic = rd_i32(b), version = rd_i32(b + 4), ntok = rd_i32(b + 8);
    if (magic == SH_SHARD_MAGIC_U32) {
        snprintf(err, errlen, "%s: header field magic is %d (llama-3 uint32 shard); only "
                              "uint16 shards with magic %d are supported",
                 path, magic, SH_SHARD_MAGIC);
        return -1;
    }
    if (magic != SH_SHARD_MAGIC) {
        snprintf(err, errlen, "%s: header field magic is %d, expected %d (llm.c token shard)",
                 path, magic, SH_SHARD_MAGIC);
        return -1;
    }
    if (version != SH_SHARD_VERSION) {
        snprintf(err, errlen, "%s: header field version is %d, expected %d", path, version,
                 SH_SHARD_VERSION);
        return -1;
    }
    if (ntok < 0) {
        snprintf(err, errlen, "%s: header field token count is negative (%d)", path, ntok);
        return -1;
    }
    size_t want = 1024 + 2 * (size_t)ntok;
    if (n != want) {
        snprintf(err, errlen, "%s: file size %zu does not match the header (1024 + 2 x %d "
                              "tokens = %zu bytes): %s",
                 path, n, ntok, want,
                 n < want ? "truncated" : "trailing bytes");
        return -1;
    }
    out->tok = malloc(((size_t)ntok ? (size_t)ntok : 1) * sizeof(uint16_t));
    if (!out->tok) {
        snprintf(err, errlen, "out of host memory for %d tokens of %s", ntok, path);
        return -1;
    }
    for (size_t i = 0; i < (size_t)ntok; i++)
        out->tok[i] = (uint16_t)(b[1024 + 2 * i] | b[1024 + 2 * i + 1] << 8);
    out->n = (size_t)ntok;
    return 0;
}

int sh_data_read_shard(const char *path, sh_tokens *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    size_t n = 0;
    unsigned char *b = slurp(path, &n, err, errlen);
    if (!b) return -1;
    int rc = parse_shard(path, b, n, out, err, errlen);
    free(b);
    return rc;
}

/* A file taken for text is every byte a token, so a shard with a damaged magic
 * would train as noise without a word. It is a shard, not text, when its header's
 * version and token count agree with its size (1024 + 2 x count bytes), or when it
 * is named .bin (llm.c's shard extension; text is never named so). 1: refused, with
 * the sentence in err. */
static int shard_like(const char *path, const unsigned char *b, size_t n, char *err,
                      size_t errlen) {
    int32_t magic = n >= 4 ? rd_i32(b) : 0;
    size_t pl = strlen(path);
    int bin = pl >= 4 && strcmp(path + pl - 4, ".bin") == 0;
    int32_t version = n >= 1024 ? rd_i32(b + 4) : 0, ntok = n >= 1024 ? rd_i32(b + 8) : -1;
    int sized = n >= 1024 && ntok >= 0 && n == 1024 + 2 * (size_t)ntok;
    if (sized)
        snprintf(err, errlen, "%s: its header (version %d, %d tokens, matching the file's %zu "
                              "bytes) is an llm.c token shard's, but its header field magic is %d, expected "
                              "%d: a damaged shard, refused rather than trained on as text bytes",
                 path,
                 version, ntok, n, magic, SH_SHARD_MAGIC);
    else if (bin)
        snprintf(err, errlen, "%s: named .bin (an llm.c token shard) but its header field magic "
                              "is %d, expected %d; refused rather than trained on as text bytes (give text "
                              "another extension)",
                 path, magic, SH_SHARD_MAGIC);
    return sized || bin;
}

int sh_data_load(const char *path, sh_tokens *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    size_t n = 0;
    unsigned char *b = slurp(path, &n, err, errlen);
    if (!b) return -1;
    int rc;
    int32_t magic = n >= 4 ? rd_i32(b) : 0;
    if (magic == SH_SHARD_MAGIC || magic == SH_SHARD_MAGIC_U32)
        rc = parse_shard(path, b, n, out, err, errlen);
    else if (shard_like(path, b, n, err, errlen))
        rc = -1;
    else
        rc = bytes_to_tokens(b, n, out, path, err, errlen);
    free(b);
    return rc;
}

int sh_data_write_shard(const char *path, const uint16_t *tok, size_t n, char *err, size_t errlen) {
    if (n > (size_t)INT32_MAX) {
        snprintf(err, errlen, "%s: %zu tokens do not fit the shard header's int32 count", path,
                 n);
        return -1;
    }
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        snprintf(err, errlen, "output path too long: %s", path);
        return -1;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    unsigned char hdr[1024] = {0};
    int32_t h[3] = {SH_SHARD_MAGIC, SH_SHARD_VERSION, (int32_t)n};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) hdr[4 * i + k] = (unsigned char)((uint32_t)h[i] >> (8 * k));
    int ok = fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr;
    unsigned char buf[8192];
    for (size_t i = 0; ok && i < n;) {
        size_t m = 0;
        for (; i < n && m < sizeof buf; i++) {
            buf[m++] = (unsigned char)(tok[i] & 0xff);
            buf[m++] = (unsigned char)(tok[i] >> 8);
        }
        ok = fwrite(buf, 1, m, f) == m;
    }
    ok = (fflush(f) == 0) && ok;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* ---- default corpus ---- */

static int has_marker(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/host_api/protrain.h", dir) >= (int)sizeof p) return 0;
    return access(p, R_OK) == 0;
}

/* Walk up from dir looking for the marker; writes the root into out. */
static int walk_up(const char *start, char *out, size_t outlen) {
    char d[PATH_MAX];
    if (!realpath(start, d)) return -1;
    for (;;) {
        if (has_marker(d)) {
            snprintf(out, outlen, "%s", d);
            return 0;
        }
        char *slash = strrchr(d, '/');
        if (!slash || slash == d) return -1;
        *slash = '\0';
    }
}

int sh_data_find_repo_root(char *out, size_t outlen) {
    const char *env = getenv("PT_ROOT");
    if (env && *env && has_marker(env)) {
        snprintf(out, outlen, "%s", env);
        return 0;
    }
    if (walk_up(".", out, outlen) == 0) return 0;
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        if (walk_up(exe, out, outlen) == 0) return 0;
    }
    return -1;
}

typedef struct flist {
    char **v;
    size_t n, cap;
    size_t bytes;
} flist;

static int text_ext(const char *name) {
    static const char *ext[] = {".md", ".c", ".h", ".cu", ".ini", ".sh"};
    const char *dot = strrchr(name, '.');
    if (!dot) return 0;
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
        if (strcmp(dot, ext[i]) == 0) return 1;
    return 0;
}

/* Recursive listing of rel (relative to root) into fl; only text files, no symlinks. */
static int walk(const char *root, const char *rel, flist *fl) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *dir = opendir(path);
    if (!dir) return 0; /* unreadable folders are skipped */
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        const char *nm = e->d_name;
        if (nm[0] == '.' || strncmp(nm, "build", 5) == 0) continue;
        char r2[PATH_MAX], full[PATH_MAX + 256];
        if (snprintf(r2, sizeof r2, "%s%s%s", rel, *rel ? "/" : "", nm) >= (int)sizeof r2)
            continue;
        if (snprintf(full, sizeof full, "%s/%s", root, r2) >= (int)sizeof full) continue;
        struct stat st;
        if (lstat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            rc = walk(root, r2, fl);
        } else if (S_ISREG(st.st_mode) && text_ext(nm) && st.st_size <= CORPUS_MAX_FILE) {
            if (fl->n >= CORPUS_MAX_FILES || fl->bytes + (size_t)st.st_size > CORPUS_MAX_TOTAL)
                continue;
            if (fl->n == fl->cap) {
                size_t nc = fl->cap ? 2 * fl->cap : 64;
                char **nv = realloc(fl->v, nc * sizeof *nv);
                if (!nv) {
                    rc = -1;
                    break;
                }
                fl->v = nv;
                fl->cap = nc;
            }
            if (!(fl->v[fl->n] = strdup(r2))) {
                rc = -1;
                break;
            }
            fl->n++;
            fl->bytes += (size_t)st.st_size;
        }
    }
    closedir(dir);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int sh_data_default_corpus(const char *root, sh_tokens *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    flist fl = {0};
    int rc = walk(root, "", &fl);
    if (rc == 0 && fl.n == 0) {
        snprintf(err, errlen, "default corpus: no text files (*.md *.c *.h) under %s", root);
        rc = -1;
    } else if (rc != 0) {
        snprintf(err, errlen, "out of host memory listing the default corpus under %s", root);
    }
    if (rc == 0) {
        qsort(fl.v, fl.n, sizeof *fl.v, cmp_str);
        out->tok = malloc((fl.bytes ? fl.bytes : 1) * sizeof(uint16_t));
        if (!out->tok) {
            snprintf(err, errlen, "out of host memory for the default corpus (%zu bytes)",
                     fl.bytes);
            rc = -1;
        }
    }
    for (size_t i = 0; rc == 0 && i < fl.n; i++) {
        char full[PATH_MAX + 256];
        snprintf(full, sizeof full, "%s/%s", root, fl.v[i]);
        size_t n = 0;
        unsigned char *b = slurp(full, &n, err, errlen);
        if (!b) {
            rc = -1;
            break;
        }
        /* files may have grown since the listing: never write past the buffer */
        if (n > fl.bytes - out->n) n = fl.bytes - out->n;
        for (size_t k = 0; k < n; k++) out->tok[out->n + k] = b[k];
        out->n += n;
        free(b);
    }
    for (size_t i = 0; i < fl.n; i++) free(fl.v[i]);
    free(fl.v);
    if (rc) sh_data_tokens_free(out);
    return rc;
}

void sh_data_split(const sh_tokens *t, sh_tokens *train, sh_tokens *val) {
    size_t ntr = t->n / 10 * 9 + (t->n % 10) * 9 / 10;
    train->tok = t->tok;
    train->n = ntr;
    val->tok = t->tok + ntr;
    val->n = t->n - ntr;
}

int sh_data_tokens_vocab(const sh_tokens *t) {
    int mx = -1;
    for (size_t i = 0; i < t->n; i++)
        if (t->tok[i] > mx) mx = t->tok[i];
    return mx + 1;
}

void sh_data_sample_batch(sh_rng *r, const sh_tokens *t, int B, int T, int32_t *inp, int32_t *tgt) {
    for (int b = 0; b < B; b++) {
        size_t o = (size_t)sh_rng_below(r, (uint64_t)(t->n - (size_t)T));
        for (int i = 0; i < T; i++) {
            inp[(size_t)b * T + i] = t->tok[o + i];
            tgt[(size_t)b * T + i] = t->tok[o + i + 1];
        }
    }
}

void sh_data_val_batch(const sh_tokens *t, int k, int B, int T, int32_t *inp, int32_t *tgt) {
    size_t span = t->n - (size_t)T;
    for (int b = 0; b < B; b++) {
        size_t o = ((size_t)k * B + b) * (size_t)T % span;
        for (int i = 0; i < T; i++) {
            inp[(size_t)b * T + i] = t->tok[o + i];
            tgt[(size_t)b * T + i] = t->tok[o + i + 1];
        }
    }
}

/* ---- --data lists and globs ---- */

static int append(sh_tokens *all, const char *path, char *err, size_t errlen) {
    sh_tokens one;
    if (sh_data_load(path, &one, err, errlen)) return -1;
    uint16_t *nt = realloc(all->tok, (all->n + one.n + 1) * sizeof *nt);
    if (!nt) {
        snprintf(err, errlen, "out of host memory adding %zu tokens of %s", one.n, path);
        sh_data_tokens_free(&one);
        return -1;
    }
    memcpy(nt + all->n, one.tok, one.n * sizeof *nt);
    all->tok = nt;
    all->n += one.n;
    sh_data_tokens_free(&one);
    return 0;
}

int sh_data_load_list(const char *spec, sh_tokens *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    /* one plain file: the single-file loader itself (no copy, its own messages) */
    if (!strpbrk(spec, ",*?[")) return sh_data_load(spec, out, err, errlen);
    char *list = strdup(spec);
    if (!list) {
        snprintf(err, errlen, "out of host memory reading --data");
        return -1;
    }
    int rc = 0;
    char *save = NULL;
    for (char *item = strtok_r(list, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        if (!*item) continue;
        if (!strpbrk(item, "*?[")) {
            rc = append(out, item, err, errlen);
            continue;
        }
        glob_t g;
        int gr = glob(item, GLOB_ERR, NULL, &g); /* glob sorts its matches */
        if (gr == GLOB_NOMATCH) {
            snprintf(err, errlen, "--data: the pattern %s matches no file", item);
            rc = -1;
        } else if (gr != 0) {
            snprintf(err, errlen, "--data: cannot expand the pattern %s", item);
            rc = -1;
        }
        for (size_t i = 0; gr == 0 && !rc && i < g.gl_pathc; i++)
            rc = append(out, g.gl_pathv[i], err, errlen);
        if (gr == 0) globfree(&g);
    }
    free(list);
    if (!rc && out->n == 0 && !out->tok) {
        snprintf(err, errlen, "--data '%s' names no file", spec);
        rc = -1;
    }
    if (rc) sh_data_tokens_free(out);
    return rc;
}
