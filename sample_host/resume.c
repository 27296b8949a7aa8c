/*
 * resume.c — checkpoint generations (write, validate, choose, load, prune) for
 * sample_host. Format and guarantees: sh_resume.h and sample_host/README.md;
 * host.txt's text and parsing: resume_host.c.
 */
#include "sh_resume.h"
#include "resume_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MANIFEST "MANIFEST"
#define HOST_FILE "host.txt"
#define PARAMS_FILE "params.bin"
#define MANIFEST_MAX (64 * 1024)
/* a folder path (< PATH_MAX) plus a file name (< 256) */
#define PBUF (PATH_MAX + 300)

uint64_t sh_resume_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int sh_resume_say(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- small file-system helpers ---- */

static int write_all(int fd, const void *p, size_t n, uint64_t *h) {
    const char *b = p;
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, b + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    if (h) *h = sh_resume_fnv(*h, p, n);
    return 0;
}

/* path = parts[0..k) concatenated, fsync'd; *h = their checksum. */
static int write_file(const char *path, const void *const *parts, const size_t *lens, int k,
                      uint64_t *h, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return sh_resume_say(err, errlen, "cannot create %s: %s", path, strerror(errno));
    *h = FNV_START;
    int ok = 1;
    for (int i = 0; i < k && ok; i++) ok = write_all(fd, parts[i], lens[i], h) == 0;
    ok = ok && fsync(fd) == 0;
    int e = errno;
    ok = (close(fd) == 0) && ok;
    if (!ok) return sh_resume_say(err, errlen, "cannot write %s: %s", path, strerror(e ? e : errno));
    return 0;
}

static int hash_file(const char *path, uint64_t *h, long long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char buf[1 << 16];
    size_t k;
    *h = FNV_START;
    *size = 0;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
        *h = sh_resume_fnv(*h, buf, k);
        *size += (long long)k;
    }
    int bad = ferror(f);
    fclose(f);
    return bad ? -1 : 0;
}

static int fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p) == 0 || errno == ENOENT ? 0 : -1;
}

static int rm_tree(const char *path) { return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* dir/name into out (a path too long for PATH_MAX is cut; it then fails to open). */
static int join(char *out, size_t n, const char *dir, const char *name) {
    int k = snprintf(out, n, "%s/%s", dir, name);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* Test knob: widen the window in which a save can be interrupted. */
static void pause_ms(int ms) {
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---- the generation folder names ---- */

enum { E_OTHER, E_GEN, E_TMP, E_DEL };

/* Classify a DIR entry: gen-<step>, gen-<step>.tmp.<pid> or gen-<step>.del.<pid>. */
static int entry_kind(const char *name, int64_t *step, long *pid) {
    if (strncmp(name, "gen-", 4) != 0 || name[4] < '0' || name[4] > '9') return E_OTHER;
    char *end = NULL;
    errno = 0;
    long long s = strtoll(name + 4, &end, 10);
    if (errno || s < 0) return E_OTHER;
    *step = s;
    if (*end == '\0') return E_GEN;
    int kind = strncmp(end, ".tmp.", 5) == 0 ? E_TMP : strncmp(end, ".del.", 5) == 0 ? E_DEL : E_OTHER;
    if (kind == E_OTHER || end[5] < '1' || end[5] > '9') return E_OTHER;
    char *e2 = NULL;
    long p = strtol(end + 5, &e2, 10);
    if (*e2 != '\0' || p <= 0) return E_OTHER;
    *pid = p;
    return kind;
}

/* Remove .tmp/.del folders left by a writer that no longer runs (or by this one). A
 * live other writer's are kept. A reused pid keeps a stale folder until that process
 * ends: harmless, it is never taken for a generation. */
static void clean_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[PBUF];
    while ((e = readdir(d)) != NULL) {
        int64_t s;
        long pid;
        int k = entry_kind(e->d_name, &s, &pid);
        if (k != E_TMP && k != E_DEL) continue;
        if (pid != (long)getpid() && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
        if (join(path, sizeof path, dir, e->d_name) == 0) rm_tree(path);
    }
    closedir(d);
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* Steps of the complete generations in dir, newest first. -1 when dir is unreadable. */
static int list_gens(const char *dir, int64_t **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s;
        long pid;
        if (entry_kind(e->d_name, &s, &pid) != E_GEN) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *v = realloc(*out, (size_t)cap * sizeof *v);
            if (!v) break;
            *out = v;
        }
        (*out)[(*n)++] = s;
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_desc);
    return 0;
}

static void gen_path(char *buf, size_t n, const char *dir, int64_t step, const char *suffix,
                     long pid) {
    if (suffix) snprintf(buf, n, "%s/gen-%08lld.%s.%ld", dir, (long long)step, suffix, pid);
    else snprintf(buf, n, "%s/gen-%08lld", dir, (long long)step);
}

/* Take a complete generation out of the set atomically, then delete it. */
static int drop_gen(const char *dir, int64_t step) {
    char g[PATH_MAX], del[PATH_MAX];
    gen_path(g, sizeof g, dir, step, NULL, 0);
    gen_path(del, sizeof del, dir, step, "del", (long)getpid());
    if (rename(g, del) != 0) return -1;
    return rm_tree(del);
}

/* Keep the newest `keep` generations at or before `step`; with drop_newer, drop
 * those after it too (else they stay). */
static void prune(const char *dir, int64_t step, int drop_newer, int keep) {
    int64_t *g = NULL;
    int n = 0, kept = 0;
    if (list_gens(dir, &g, &n) == 0)
        for (int i = 0; i < n; i++)
            if (g[i] > step ? drop_newer : ++kept > keep) drop_gen(dir, g[i]);
    free(g);
}

/* ---- save ---- */

typedef struct listed {
    char name[128];
    long long size;
    uint64_t hash;
    int hashed;
} listed;

/* The files of a generation folder (not MANIFEST), with sizes; the host's files
 * with their checksums. */
static int list_files(const char *dir, listed *v, int max, int *n, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) return sh_resume_say(err, errlen, "cannot list %s: %s", dir, strerror(errno));
    struct dirent *e;
    *n = 0;
    int rc = 0;
    while (!rc && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, MANIFEST) == 0) continue;
        char p[PBUF];
        struct stat sb;
        (void)join(p, sizeof p, dir, e->d_name);
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode) || strlen(e->d_name) >= sizeof v->name ||
            strchr(e->d_name, ' ') || *n == max) {
            rc = sh_resume_say(err, errlen, "unexpected entry %s in a generation being written", p);
            break;
        }
        listed *l = &v[(*n)++];
        size_t nl = strlen(e->d_name);   /* < sizeof l->name, checked above */
        memcpy(l->name, e->d_name, nl + 1);
        l->size = (long long)sb.st_size;
        l->hashed = 1;   /* every file: one copied in from elsewhere is found */
        if (hash_file(p, &l->hash, &l->size))
            rc = sh_resume_say(err, errlen, "cannot read back %s", p);
    }
    closedir(d);
    return rc;
}

static int write_gen(const sh_resume *r, sh_trainer *tr, const sh_resume_state *st,
                     const char *tmp, int plugin_done, char *err, size_t errlen) {
    const sh_config *c = r->c;
    char p[PBUF];
    uint64_t h;
    if (plugin_done) {
        /* several ranks: each wrote its plugin state file already */
    } else if (r->plugin) {
        if (sh_trainer_plugin_state(tr, tmp, 0))
            return sh_resume_say(err, errlen, "checkpoint at step %lld: %s", (long long)st->step,
                       sh_trainer_error(tr));
    } else {
        size_t n = sh_trainer_model(tr)->n_floats;
        float *buf = malloc(3 * n * sizeof(float) + 1);
        if (!buf) return sh_resume_say(err, errlen, "out of host memory for a checkpoint (%zu floats)", 3 * n);
        int rc = sh_trainer_opt_io(tr, buf, buf + n, buf + 2 * n, 0);
        if (rc) sh_resume_say(err, errlen, "checkpoint at step %lld: %s", (long long)st->step,
                    sh_trainer_error(tr));
        (void)join(p, sizeof p, tmp, PARAMS_FILE);
        const void *parts[1] = {buf};
        size_t lens[1] = {3 * n * sizeof(float)};
        if (!rc) rc = write_file(p, parts, lens, 1, &h, err, errlen);
        free(buf);
        if (rc) return -1;
    }
    pause_ms(c->debug_save_sleep_ms);
    char host[4096];
    int hn = sh_resume_host_text(r, st, host, sizeof host);
    if (hn < 0) return sh_resume_say(err, errlen, "host state too long for a checkpoint");
    (void)join(p, sizeof p, tmp, HOST_FILE);
    const void *hp[1] = {host};
    size_t hl[1] = {(size_t)hn};
    if (write_file(p, hp, hl, 1, &h, err, errlen)) return -1;
    pause_ms(c->debug_save_sleep_ms);
    listed files[64];
    int nf = 0;
    if (list_files(tmp, files, 64, &nf, err, errlen)) return -1;
    char man[MANIFEST_MAX];
    int k = snprintf(man, sizeof man, "sample_host-generation 2\nstep %lld\nstate %s\n"
                     "ident %016" PRIx64 "\nworld %d\n", (long long)st->step,
                     r->plugin ? "plugin" : "host", r->run_id, c->world > 1 ? c->world : 1);
    for (int i = 0; i < nf && k > 0 && (size_t)k < sizeof man; i++) {
        char hx[20] = "-";
        if (files[i].hashed) snprintf(hx, sizeof hx, "%016" PRIx64, files[i].hash);
        k += snprintf(man + k, sizeof man - (size_t)k, "file %s %lld %s\n", files[i].name,
                      files[i].size, hx);
    }
    if (k <= 0 || (size_t)k + 32 >= sizeof man) return sh_resume_say(err, errlen, "manifest too long");
    k += snprintf(man + k, sizeof man - (size_t)k, "end %016" PRIx64 "\n",
                  sh_resume_fnv(FNV_START, man, (size_t)k));
    (void)join(p, sizeof p, tmp, MANIFEST);
    const void *mp[1] = {man};
    size_t ml[1] = {(size_t)k};
    if (write_file(p, mp, ml, 1, &h, err, errlen)) return -1;
    if (fsync_dir(tmp)) return sh_resume_say(err, errlen, "cannot fsync %s: %s", tmp, strerror(errno));
    pause_ms(c->debug_save_sleep_ms);
    return 0;
}

/* Several ranks: the ranks agree that every one of them got through a phase (a
 * sum of failure flags); a rank that failed keeps its own sentence in err. */
static int all_ok(sh_trainer *tr, int ok, const char *phase, char *err, size_t errlen) {
    double bad = ok ? 0 : 1;
    if (sh_trainer_dist_sum(tr, &bad, 1)) return sh_resume_say(err, errlen, "%s", sh_trainer_error(tr));
    if (!ok) return -1;
    if (bad != 0) return sh_resume_say(err, errlen, "checkpoint: %g other rank(s) failed %s", bad, phase);
    return 0;
}

/* Several ranks, one generation: rank 0 makes the temp folder (named after its
 * pid, which every rank learns), every rank writes its plugin state file into
 * it, then rank 0 writes the host's state and the manifest (listing every
 * rank's file) and renames the folder: the rename stays the one atomic step, so
 * a crash at any point leaves no complete-looking generation behind. */
static int save_ranks(const sh_resume *r, sh_trainer *tr, const sh_resume_state *st,
                      char *err, size_t errlen) {
    const char *dir = r->c->checkpoint_dir;
    int r0 = r->c->rank == 0;
    double pid = r0 ? (double)getpid() : 0;
    if (sh_trainer_dist_sum(tr, &pid, 1)) return sh_resume_say(err, errlen, "%s", sh_trainer_error(tr));
    char tmp[PATH_MAX], fin[PATH_MAX];
    gen_path(tmp, sizeof tmp, dir, st->step, "tmp", (long)pid);
    gen_path(fin, sizeof fin, dir, st->step, NULL, 0);
    int ok = 1;
    if (r0) {
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            ok = !sh_resume_say(err, errlen, "cannot create checkpoint folder %s: %s", dir, strerror(errno));
        if (ok) clean_stale(dir);
        if (ok && mkdir(tmp, 0755) != 0)
            ok = !sh_resume_say(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    }
    if (all_ok(tr, ok, "to create the generation's folder", err, errlen)) return -1;
    ok = !sh_trainer_plugin_state(tr, tmp, 0);
    if (!ok) sh_resume_say(err, errlen, "checkpoint at step %lld: %s", (long long)st->step,
                 sh_trainer_error(tr));
    if (all_ok(tr, ok, "to write their plugin state", err, errlen)) {
        if (r0) rm_tree(tmp);
        return -1;
    }
    if (r0) {
        struct stat sb;
        if (write_gen(r, tr, st, tmp, 1, err, errlen)) ok = 0;
        else if (stat(fin, &sb) == 0 && drop_gen(dir, st->step) != 0)
            ok = !sh_resume_say(err, errlen, "cannot replace %s: %s", fin, strerror(errno));
        else if (rename(tmp, fin) != 0)
            ok = !sh_resume_say(err, errlen, "cannot rename %s to %s: %s", tmp, fin, strerror(errno));
        else if (fsync_dir(dir))
            ok = !sh_resume_say(err, errlen, "cannot fsync %s: %s", dir, strerror(errno));
        if (!ok) rm_tree(tmp);
        else prune(dir, st->step, 1, r->c->checkpoint_keep);
    }
    return all_ok(tr, ok, "to complete the generation", err, errlen);
}

int sh_resume_save(const sh_resume *r, sh_trainer *tr, const sh_resume_state *st, char *err,
                   size_t errlen) {
    if (r->c->world > 1) return save_ranks(r, tr, st, err, errlen);
    const char *dir = r->c->checkpoint_dir;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return sh_resume_say(err, errlen, "cannot create checkpoint folder %s: %s", dir, strerror(errno));
    clean_stale(dir);
    char tmp[PATH_MAX], fin[PATH_MAX];
    gen_path(tmp, sizeof tmp, dir, st->step, "tmp", (long)getpid());
    gen_path(fin, sizeof fin, dir, st->step, NULL, 0);
    if (mkdir(tmp, 0755) != 0)
        return sh_resume_say(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    if (write_gen(r, tr, st, tmp, 0, err, errlen)) {
        rm_tree(tmp);
        return -1;
    }
    /* an older folder of this step (from before a resume that skipped it) goes first */
    struct stat sb;
    if (stat(fin, &sb) == 0 && drop_gen(dir, st->step) != 0) {
        rm_tree(tmp);
        return sh_resume_say(err, errlen, "cannot replace %s: %s", fin, strerror(errno));
    }
    if (rename(tmp, fin) != 0) {
        int e = errno;
        rm_tree(tmp);
        return sh_resume_say(err, errlen, "cannot rename %s to %s: %s", tmp, fin, strerror(e));
    }
    if (fsync_dir(dir)) return sh_resume_say(err, errlen, "cannot fsync %s: %s", dir, strerror(errno));
    /* generations past this step belong to a future this run abandoned (a resume
     * went back before them, they were not valid) */
    prune(dir, st->step, 1, r->c->checkpoint_keep);
    return 0;
}

/* ---- validate and load ---- */

/* What check_gen found besides host.txt: the MANIFEST's run id (0 in format 1)
 * and the first state file whose checksum differs from the MANIFEST's although
 * its size is right (corrupt, or copied in: load_gen tells which). */
typedef struct gen_seen {
    uint64_t run_id;
    char suspect[128];
} gen_seen;

/* A complete generation: its MANIFEST intact, every listed file of the listed size,
 * host.txt with its checksum (format 2: every file's checksum, a state file that
 * differs noted in seen); host.txt into host (hn bytes). */
static int check_gen(const sh_resume *r, const char *gp, int64_t step, char *host, size_t hn,
                     gen_seen *seen, char *why, size_t wl) {
    char p[PBUF];
    (void)join(p, sizeof p, gp, MANIFEST);
    FILE *f = fopen(p, "rb");
    if (!f) return sh_resume_say(why, wl, "no readable %s (%s)", MANIFEST, strerror(errno));
    static char man[MANIFEST_MAX + 1];
    size_t k = fread(man, 1, MANIFEST_MAX, f);
    fclose(f);
    man[k] = '\0';
    if (k == 0 || k == MANIFEST_MAX || man[k - 1] != '\n')
        return sh_resume_say(why, wl, "%s is empty, too long or cut short", MANIFEST);
    /* by bytes, not as a string: a flipped byte may be a NUL, which the checksum
     * below must see rather than a string function stop at */
    char *last = k > 1 ? memrchr(man, '\n', k - 1) : NULL;
    uint64_t want;
    if (!last || sscanf(last + 1, "end %" SCNx64, &want) != 1)
        return sh_resume_say(why, wl, "%s has no end line (cut short)", MANIFEST);
    if (sh_resume_fnv(FNV_START, man, (size_t)(last + 1 - man)) != want)
        return sh_resume_say(why, wl, "%s checksum mismatch (corrupt)", MANIFEST);
    long long ms;
    char state[16];
    int fmt = 0;
    memset(seen, 0, sizeof *seen);
    if (sscanf(man, "sample_host-generation %d\nstep %lld\nstate %15s\n", &fmt, &ms, state) != 3 ||
        (fmt != 1 && fmt != 2))
        return sh_resume_say(why, wl, "%s has an unknown format (this sample_host reads formats 1 and 2)",
                   MANIFEST);
    char idv[32];
    if (fmt == 2 && (sh_resume_find_val(man, "ident", 0, idv, sizeof idv) ||
                     !(seen->run_id = strtoull(idv, NULL, 16))))
        return sh_resume_say(why, wl, "%s (format 2) has no ident (the run's id)", MANIFEST);
    if (ms != step) return sh_resume_say(why, wl, "%s says step %lld, the folder %lld", MANIFEST, ms,
                               (long long)step);
    if (strcmp(state, r->plugin ? "plugin" : "host") != 0)
        return sh_resume_say(why, wl, "it holds %s state but this run is %s", state,
                   r->plugin ? "with the plugin" : "--no-plugin");
    int have_host = 0;
    for (char *line = man; line < last; line = strchr(line, '\n') + 1) {
        char name[128], hx[20];
        long long size;
        if (sscanf(line, "file %127s %lld %19s", name, &size, hx) != 3) continue;
        (void)join(p, sizeof p, gp, name);
        struct stat sb;
        if (stat(p, &sb) != 0) return sh_resume_say(why, wl, "file %s is missing", name);
        if ((long long)sb.st_size != size)
            return sh_resume_say(why, wl, "file %s is %lld bytes, the manifest says %lld (truncated?)",
                       name, (long long)sb.st_size, size);
        if (strcmp(hx, "-") == 0) {
            if (fmt == 2) return sh_resume_say(why, wl, "%s lists %s without a checksum", MANIFEST, name);
            continue;
        }
        uint64_t h, hw = strtoull(hx, NULL, 16);
        long long got;
        int is_host = strcmp(name, HOST_FILE) == 0;
        if (hash_file(p, &h, &got) || got != size)
            return sh_resume_say(why, wl, "file %s cannot be read whole", name);
        if (h != hw && (is_host || !r->plugin))
            return sh_resume_say(why, wl, "file %s checksum mismatch (corrupt, or not the file this "
                       "generation wrote)", name);
        if (h != hw && !seen->suspect[0]) snprintf(seen->suspect, sizeof seen->suspect, "%s", name);
        if (is_host) {
            FILE *hf = fopen(p, "rb");
            size_t hk = hf ? fread(host, 1, hn - 1, hf) : 0;
            if (hf) fclose(hf);
            host[hk] = '\0';
            have_host = hk == (size_t)size;
        }
    }
    if (!have_host) return sh_resume_say(why, wl, "%s is not listed or too long", HOST_FILE);
    return 0;
}

static void warn_skip(const char *gp, const char *why) {
    fflush(stdout);
    fprintf(stderr, "sample_host: warning: skipping checkpoint generation %s: %s\n", gp, why);
}

/* Put one checked generation's training state into the trainer. 0, or -1 with why. */
static int load_gen(const sh_resume *r, sh_trainer *tr, const char *gp, char *why, size_t wl) {
    if (r->plugin) {
        if (sh_trainer_plugin_state(tr, gp, 1))
            return sh_resume_say(why, wl, "%s", sh_trainer_error(tr));
        return 0;
    }
    size_t n = sh_trainer_model(tr)->n_floats;
    char p[PBUF];
    (void)join(p, sizeof p, gp, PARAMS_FILE);
    float *buf = malloc(3 * n * sizeof(float) + 1);
    if (!buf) return sh_resume_say(why, wl, "out of host memory (%zu floats)", 3 * n);
    FILE *f = fopen(p, "rb");
    int rc = 0;
    if (!f) rc = sh_resume_say(why, wl, "cannot open %s", PARAMS_FILE);
    else if (fread(buf, sizeof(float), 3 * n, f) != 3 * n || fgetc(f) != EOF)
        rc = sh_resume_say(why, wl, "%s does not hold 3 x %zu floats (another model?)", PARAMS_FILE, n);
    if (f) fclose(f);
    if (!rc && sh_trainer_opt_io(tr, buf, buf + n, buf + 2 * n, 1))
        rc = sh_resume_say(why, wl, "%s", sh_trainer_error(tr));
    free(buf);
    return rc;
}

/* After the plugin loaded a generation's state: its optimizer step must be the
 * generation's (one optimizer step per step with the plugin), and a state file
 * the plugin reads as intact whose checksum is not the MANIFEST's was copied in. */
static int plugin_mixed(const sh_resume *r, sh_trainer *tr, const char *gp,
                        const sh_resume_state *s, const gen_seen *seen, char *err, size_t errlen) {
    if (!r->plugin) return 0;
    const char *file = seen->suspect[0] ? seen->suspect : "the plugin's state file";
    pt_stats_v1 ps;
    memset(&ps, 0, sizeof ps);
    ps.struct_size = sizeof ps;
    if (sh_trainer_stats(tr, &ps) == 0 && ps.steps != s->step)
        return sh_resume_say(err, errlen, "--resume: %s/%s holds optimizer step %lld but the generation "
                   "is step %lld: it was copied from another generation or run",
                   gp, file, (long long)ps.steps, (long long)s->step);
    if (seen->suspect[0])
        return sh_resume_say(err, errlen, "--resume: %s/%s is an intact state file but not the one this "
                   "generation wrote (its checksum differs from the %s's): it was copied from "
                   "another run, rank or generation; mixing it with this generation's host "
                   "state would not continue any run", gp, file, MANIFEST);
    return 0;
}

int sh_resume_load(sh_resume *r, sh_trainer *tr, sh_resume_state *st, char *gen,
                   size_t genlen, char *err, size_t errlen) {
    const char *dir = r->c->checkpoint_dir;
    struct stat sb;
    int ranks = r->c->world > 1, r0 = r->c->rank == 0;
    int missing = stat(dir, &sb) != 0 && errno == ENOENT;
    if (missing && !ranks) return 1;
    /* several ranks: only rank 0 removes or prunes anything (the others may be
     * reading those folders) */
    if (r0 && !missing) clean_stale(dir);
    int64_t *g = NULL;
    int n = 0;
    if (!missing && list_gens(dir, &g, &n) != 0)
        return sh_resume_say(err, errlen, "--resume: cannot read checkpoint folder %s: %s", dir,
                   strerror(errno));
    int rc = 1;
    for (int i = 0; i < n; i++) {
        char gp[PATH_MAX], why[512], host[4096];
        gen_seen seen;
        gen_path(gp, sizeof gp, dir, g[i], NULL, 0);
        if (check_gen(r, gp, g[i], host, sizeof host, &seen, why, sizeof why)) {
            warn_skip(gp, why);
            continue;
        }
        sh_resume_state s;
        memset(&s, 0, sizeof s);
        if (sh_resume_parse_host(host, &s) || s.step != g[i]) {
            warn_skip(gp, HOST_FILE " is malformed");
            continue;
        }
        /* a valid generation of another run is an error, not something to skip */
        if (sh_resume_same_run(r, host, gp, err, errlen)) {
            rc = -1;
            break;
        }
        /* intact files (their checksums hold) that do not belong together, or hold
         * what no run writes: an error, not something to skip past */
        if (sh_gen_check_values(&s, r->c, why, sizeof why)) {
            rc = sh_resume_say(err, errlen, "--resume: %s/%s: %s; no run writes that (a hand-made or "
                     "foreign file)", gp, HOST_FILE, why);
            break;
        }
        if (seen.run_id && s.run_id != seen.run_id) {
            rc = sh_resume_say(err, errlen, "--resume: %s/%s has ident (the run's id) %016" PRIx64 " but "
                     "the %s says %016" PRIx64 ": the files come from different runs", gp, HOST_FILE,
                     s.run_id, MANIFEST, seen.run_id);
            break;
        }
        if (load_gen(r, tr, gp, why, sizeof why)) {
            /* the plugin's own checksum or size check failing is a torn or flipped
             * file; any other refusal of a file that is not this generation's
             * (another rank's, another model's) is a mix */
            /* the plugin's header naming another run, or other optimizer
             * settings, is a mix whatever the MANIFEST says (a MANIFEST made to
             * list the foreign file); an older generation would be refused the
             * same way, so none is skipped to */
            if ((seen.suspect[0] && !strstr(why, "corrupt") && !strstr(why, "truncated")) ||
                strstr(why, "is another run's") || strstr(why, "resume_changes")) {
                if (seen.suspect[0])
                    rc = sh_resume_say(err, errlen, "--resume: %s/%s is not the file this generation "
                             "wrote (its checksum differs from the %s's) and the plugin refuses "
                             "it: %s", gp, seen.suspect, MANIFEST, why);
                else
                    rc = sh_resume_say(err, errlen, "--resume: %s: the plugin refuses its state file "
                             "although the %s lists its checksum: %s", gp, MANIFEST, why);
                break;
            }
            warn_skip(gp, why);
            continue;
        }
        if (plugin_mixed(r, tr, gp, &s, &seen, err, errlen)) {
            rc = -1;
            break;
        }
        if (s.run_id) r->run_id = s.run_id;   /* the resumed run keeps its id */
        sh_trainer_set_state(tr, &s.tr);
        *st = s;
        /* a run killed between a save's rename and its pruning left one too many */
        if (!ranks) prune(dir, s.step, 0, r->c->checkpoint_keep);
        snprintf(gen, genlen, "%s", gp);
        rc = 0;
        break;
    }
    if (ranks) {
        /* every rank must continue from the same generation (or all start afresh);
         * a rank that refused a generation takes part too, so none waits for it */
        double v[3] = {rc == 0 ? (double)st->step : -1, 1, rc < 0 ? 1 : 0};
        if (sh_trainer_dist_sum(tr, v, 3)) {
            if (rc >= 0) rc = sh_resume_say(err, errlen, "%s", sh_trainer_error(tr));
        } else if (rc < 0) {
            /* this rank's own sentence stands */
        } else if (v[2] > 0) {
            rc = sh_resume_say(err, errlen, "--resume: %g other rank(s) refused the generation in %s "
                     "(their error names the file)", v[2], dir);
        } else if (v[0] != v[1] * (rc == 0 ? (double)st->step : -1)) {
            rc = sh_resume_say(err, errlen, "--resume: the ranks found different generations in %s (this "
                     "rank: %s); they must all continue from the same step", dir,
                     rc == 0 ? gen : "none");
        } else if (rc == 0 && r0) {
            prune(dir, st->step, 0, r->c->checkpoint_keep);
        }
    }
    if (rc == 1 && n > 0)
        rc = sh_resume_say(err, errlen, "--resume: none of the %d checkpoint generations in %s could be "
                 "loaded (each is named in a warning above)", n, dir);
    free(g);
    return rc;
}
