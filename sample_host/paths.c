/*
 * paths.c — every output path of a run checked before any work, and the final
 * save's fallback. A path that cannot be written, or whose writing would destroy
 * something (a device node, a FIFO, a link, the run's own data), is found before
 * any training time is spent: the model of a long run is otherwise lost when
 * --save fails at the end, or the data is gone when --metrics names it.
 *
 * Files are told apart by (st_dev, st_ino), not by their spelling: "./a" and
 * "a", a hard link and a path through a linked folder are one file. A name that
 * does not exist yet is its folder's (st_dev, st_ino) plus the name.
 */
#include "sh_paths.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sh_ckpt.h"

/* Can a new file be made in dir? A probe file is created and removed (write
 * permission bits say nothing for root, a read-only mount or a full quota). */
static int probe_dir(const char *flag, const char *path, const char *dir, char *err,
                     size_t errlen) {
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        snprintf(err, errlen, "%s %s: folder %s %s (create it before the run: it would train "
                              "and then fail to write)",
                 flag, path, dir,
                 errno == ENOENT ? "does not exist" : strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "%s %s: %s is not a folder", flag, path, dir);
        return -1;
    }
    char probe[PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.sample_host_probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s %s: cannot create a file in %s: %s", flag, path, dir,
                 strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    return 0;
}

/* The folder of a file path ("." when it has none) into dir. */
static void folder_of(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, n, ".");
    else if (slash == path) snprintf(dir, n, "/");
    else snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The longest file name the folder's file system takes. */
static long name_max(const char *dir) {
    errno = 0;
    long n = pathconf(dir, _PC_NAME_MAX);
    return n > 0 ? n : NAME_MAX;
}

static const char *kind_of(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
                                : S_ISBLK(m)   ? "a block device"
                                : S_ISSOCK(m)  ? "a socket"
                                : S_ISDIR(m)   ? "a folder"
                                : S_ISLNK(m)   ? "a symbolic link"
                                               : "not a regular file";
}

/* ---- identities ---- */

typedef struct fid {
    const char *flag, *path, *suffix;   /* the file is path+suffix */
    dev_t dev;
    ino_t ino;
    char base[NAME_MAX + 1];   /* "" for an existing file; the new name otherwise */
} fid;

typedef struct fids {
    fid *v;
    int n, cap;
} fids;

static int same(const fid *a, const fid *b) {
    return a->dev == b->dev && a->ino == b->ino && strcmp(a->base, b->base) == 0;
}

static int push(fids *s, const fid *f) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        fid *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = *f;
    return 0;
}

/* An input that exists (one that does not is its loader's error, said later). */
static int add_input(fids *in, const char *flag, const char *path) {
    struct stat sb;
    if (!path || !path[0] || stat(path, &sb) != 0) return 0;
    fid f = {.flag = flag, .path = path, .dev = sb.st_dev, .ino = sb.st_ino};
    return push(in, &f);
}

/* --data: one file, or a comma list of files and globs (as sh_data_load_list). */
static int add_data(fids *in, const char *spec, char **keep) {
    if (!spec[0]) return 0;
    if (!strpbrk(spec, ",*?[")) return add_input(in, "--data", spec);
    char *list = strdup(spec), *save = NULL;
    if (!list) return -1;
    *keep = list;   /* the fids point into it */
    int rc = 0;
    for (char *item = strtok_r(list, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        if (!strpbrk(item, "*?[")) {
            rc = add_input(in, "--data", item);
            continue;
        }
        glob_t g;
        if (glob(item, GLOB_ERR, NULL, &g) != 0) continue;   /* the loader says why */
        for (size_t i = 0; i < g.gl_pathc && !rc; i++) {
            struct stat sb;
            if (stat(g.gl_pathv[i], &sb) != 0) continue;
            fid f = {.flag = "--data", .path = spec, .dev = sb.st_dev, .ino = sb.st_ino};
            rc = push(in, &f);
        }
        globfree(&g);
    }
    return rc;
}

/* ---- one output file ---- */

static void ident(const char *flag, const char *path, const char *suffix, fid *id);

/* path (written through path+suffix when suffix is not empty) may be written:
 * its names fit, it is a regular file or a new name in a folder that takes
 * one, not a link, device, FIFO or socket; its identity into *id. */
static int check_file(const char *flag, const char *path, const char *suffix, fid *id,
                      char *err, size_t errlen) {
    char dir[PATH_MAX], full[PATH_MAX + 16];
    const char *base = base_of(path);
    if (strlen(path) + strlen(suffix) >= PATH_MAX) {
        snprintf(err, errlen, "%s %.200s...: the path is %zu characters; the system takes at most "
                              "%d",
                 flag, path, strlen(path) + strlen(suffix), PATH_MAX - 1);
        return -1;
    }
    if (!base[0]) {
        snprintf(err, errlen, "%s %s is a folder path; it takes a file path", flag, path);
        return -1;
    }
    folder_of(path, dir, sizeof dir);
    long nm = name_max(dir);
    if ((long)(strlen(base) + strlen(suffix)) > nm) {
        snprintf(err, errlen, "%s %.200s...: the file name is %zu characters%s%s%s, more than "
                              "the %ld its file system takes (it would train and then fail to write)",
                 flag,
                 path, strlen(base) + strlen(suffix), suffix[0] ? " with the temporary file's " : "",
                 suffix, suffix[0] ? " added" : "", nm);
        return -1;
    }
    struct stat sb;
    for (int k = 0; k < (suffix[0] ? 2 : 1); k++) {
        snprintf(full, sizeof full, "%s%s", path, k ? suffix : "");
        if (lstat(full, &sb) != 0) {
            if (errno == ENOENT || errno == ENOTDIR) continue;   /* probe_dir says why */
            snprintf(err, errlen, "%s %s: %s", flag, full, strerror(errno));
            return -1;
        }
        if (S_ISLNK(sb.st_mode)) {
            char to[PATH_MAX] = "?";
            ssize_t t = readlink(full, to, sizeof to - 1);
            to[t > 0 ? t : 1] = '\0';
            snprintf(err, errlen, "%s %s is a symbolic link (to %s): sample_host writes a "
                                  "temporary file and renames it over the path, which would replace the link "
                                  "and never write its target; give the target's path instead",
                     flag, full, to);
            return -1;
        }
        if (S_ISDIR(sb.st_mode)) {
            snprintf(err, errlen, "%s %s is a folder; it takes a file path", flag, full);
            return -1;
        }
        if (!S_ISREG(sb.st_mode)) {
            snprintf(err, errlen, "%s %s is %s, not a regular file: writing the output would "
                                  "replace it with a file (or wait on it forever); give a file path",
                     flag,
                     full, kind_of(sb.st_mode));
            return -1;
        }
    }
    if (probe_dir(flag, path, dir, err, errlen)) return -1;
    ident(flag, path, "", id);
    return 0;
}

/* The identity of path+suffix: an existing file's, else its folder's and name. */
static void ident(const char *flag, const char *path, const char *suffix, fid *id) {
    char full[PATH_MAX + 16], dir[PATH_MAX];
    struct stat sb;
    snprintf(full, sizeof full, "%s%s", path, suffix);
    memset(id, 0, sizeof *id);
    id->flag = flag;
    id->path = path;
    id->suffix = suffix;
    if (stat(full, &sb) == 0) {
        id->dev = sb.st_dev;
        id->ino = sb.st_ino;
        return;
    }
    folder_of(full, dir, sizeof dir);
    if (stat(dir, &sb) != 0) return;   /* check_file's probe saw it a moment ago */
    id->dev = sb.st_dev;
    id->ino = sb.st_ino;
    const char *b = base_of(full);
    size_t bl = strlen(b) < sizeof id->base ? strlen(b) : sizeof id->base - 1;
    memcpy(id->base, b, bl);
    id->base[bl] = '\0';
}

/* ---- the checkpoint folder ---- */

static int digits(long long v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

/* The folder (existing, or a new name whose parent takes it) and the longest
 * path the run makes inside it: DIR/gen-<step>.tmp.<pid>/protrain_state_rank<r>.bin
 * (a step of at least 8 digits, a pid of up to 10). */
static int check_ckpt_dir(const sh_config *c, char *err, size_t errlen) {
    const char *dir = c->checkpoint_dir, *flag = "--checkpoint-dir";
    int step_d = digits(c->steps) > 8 ? digits(c->steps) : 8;
    int rank_d = digits(c->world > 1 ? c->world - 1 : 0);
    /* "/gen-" step ".tmp." pid "/protrain_state_rank" rank ".bin" */
    size_t inside = 5 + (size_t)step_d + 5 + 10 + 20 + (size_t)rank_d + 4;
    if (strlen(dir) + inside >= PATH_MAX) {
        snprintf(err, errlen, "%s %.200s...: the folder's path is %zu characters and the run "
                              "writes files up to %zu characters deeper inside it, more than the system's %d "
                              "(it would train and then fail to write a generation)",
                 flag, dir, strlen(dir),
                 inside, PATH_MAX - 1);
        return -1;
    }
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) {
            snprintf(err, errlen, "%s %s is %s; it takes a folder", flag, dir, kind_of(sb.st_mode));
            return -1;
        }
        return probe_dir(flag, dir, dir, err, errlen);
    }
    if (errno != ENOENT) {
        snprintf(err, errlen, "%s %s: %s", flag, dir, strerror(errno));
        return -1;
    }
    /* made before the run, one level: its parent must take it */
    char parent[PATH_MAX];
    folder_of(dir, parent, sizeof parent);
    const char *base = base_of(dir);
    if ((long)strlen(base) > name_max(parent)) {
        snprintf(err, errlen, "%s %.200s...: the folder name is %zu characters, more than the "
                              "%ld its file system takes",
                 flag, dir, strlen(base), name_max(parent));
        return -1;
    }
    return probe_dir(flag, dir, parent, err, errlen);
}

/* An output inside the checkpoint folder's own names: a generation folder
 * (gen-*: a later save or prune deletes it, and a file written into one makes
 * the generation fail its manifest), a name the folder's writer uses (gen-*,
 * the lock). -1 with a sentence. */
static int in_generation(const char *ckdir, const fid *o, char *err, size_t errlen) {
    char full[PATH_MAX + 16], dir[PATH_MAX], up[PATH_MAX + 8];
    struct stat ck, sb;
    if (stat(ckdir, &ck) != 0) return 0;   /* made later, empty */
    snprintf(full, sizeof full, "%s%s", o->path, o->suffix);
    folder_of(full, dir, sizeof dir);
    const char *name = base_of(full), *fold = base_of(dir);
    int in_ck = stat(dir, &sb) == 0 && sb.st_dev == ck.st_dev && sb.st_ino == ck.st_ino;
    snprintf(up, sizeof up, "%s/..", dir);
    int in_gen = strncmp(fold, "gen-", 4) == 0 && stat(up, &sb) == 0 && sb.st_dev == ck.st_dev &&
                 sb.st_ino == ck.st_ino;
    if (!(in_ck && (strncmp(name, "gen-", 4) == 0 || strcmp(name, ".lock") == 0)) && !in_gen)
        return 0;
    snprintf(err, errlen, "%s %s is %s checkpoint folder %s, which the run writes and prunes; "
                          "give a path outside its generations",
             o->flag, full,
             in_gen ? "inside a generation of the" : "a generation's or the lock's name in the",
             ckdir);
    return -1;
}

/* "--save X", or "--save X's temporary file X.tmp". */
static const char *shown(const fid *f, char *buf, size_t n) {
    if (f->suffix[0]) snprintf(buf, n, "%s %s's temporary file %s%s", f->flag, f->path, f->path,
                               f->suffix);
    else snprintf(buf, n, "%s %s", f->flag, f->path);
    return buf;
}

/* ---- all of them ---- */

typedef struct out_spec {
    const char *flag, *path, *suffix;
} out_spec;

static int check_all(const sh_config *c, fids *in, fids *out, char **keep, char *err,
                     size_t errlen) {
    if (add_input(in, "--config", c->config) || add_data(in, c->data, keep) ||
        add_input(in, "--val-data", c->val_data) || add_input(in, "--load", c->load) ||
        (strchr(c->plugin, '/') && !c->no_plugin && add_input(in, "--plugin", c->plugin))) {
        snprintf(err, errlen, "out of host memory checking the run's files");
        return -1;
    }
    /* every file the run writes; the plugin writes its own (the INI's keys) when
     * it runs, through the same kind of open */
    const out_spec outs[] = {
        {"--save", c->save, ".tmp"},
        {"--metrics", c->metrics, ""},
        {"--write-shard", c->write_shard, ".tmp"},
        {"[protrain] plan_file", c->no_plugin ? "" : c->plugin_outs[0], ""},
        {"[protrain] timeline_file", c->no_plugin ? "" : c->plugin_outs[1], ""},
        {"[host_backend] trace_file", c->no_plugin ? "" : c->plugin_outs[2], ""},
    };
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        const out_spec *o = &outs[i];
        if (!o->path[0]) continue;
        fid ids[2];   /* the file, and the temporary file written beside it */
        if (check_file(o->flag, o->path, o->suffix, &ids[0], err, errlen)) return -1;
        int nid = 1;
        if (o->suffix[0]) ident(o->flag, o->path, o->suffix, &ids[nid++]);
        for (int j = 0; j < nid; j++) {
            const fid *id = &ids[j];
            for (int k = 0; k < in->n; k++) {
                const fid *f = &in->v[k];
                if (!same(id, f)) continue;
                char a[PATH_MAX + 64];
                snprintf(err, errlen, "%s is the file %s %s reads, an input of this run "
                                      "(writing it would destroy it); give another path",
                         shown(id, a, sizeof a), f->flag, f->path);
                return -1;
            }
            for (int k = 0; k < out->n; k++) {
                const fid *f = &out->v[k];
                if (!same(id, f)) continue;
                char a[PATH_MAX + 64], b[PATH_MAX + 64];
                snprintf(err, errlen, "%s and %s name one file: one output would overwrite the "
                                      "other; give two paths",
                         shown(f, a, sizeof a), shown(id, b, sizeof b));
                return -1;
            }
        }
        for (int j = 0; j < nid; j++)
            if (push(out, &ids[j])) {
                snprintf(err, errlen, "out of host memory checking the run's files");
                return -1;
            }
    }
    if (!c->checkpoint_dir[0] || c->write_shard[0]) return 0;
    if (check_ckpt_dir(c, err, errlen)) return -1;
    for (int k = 0; k < out->n; k++)
        if (in_generation(c->checkpoint_dir, &out->v[k], err, errlen)) return -1;
    return 0;
}

int sh_paths_check(const sh_config *c, char *err, size_t errlen) {
    fids in = {0}, out = {0};
    char *keep = NULL;
    int rc = check_all(c, &in, &out, &keep, err, errlen);
    free(in.v);
    free(out.v);
    free(keep);
    return rc;
}

int sh_paths_save_model(const sh_config *c, const sh_model *m, const float *flat, char *written,
                        size_t wlen, char *err, size_t errlen) {
    written[0] = '\0';
    char why[1024];
    if (sh_ckpt_save(c->save, m, flat, why, sizeof why) == 0) {
        snprintf(written, wlen, "%s", c->save);
        return 0;
    }
    const char *base = base_of(c->save);
    const char *tmp = getenv("TMPDIR");
    const char *dirs[2] = {c->checkpoint_dir[0] ? c->checkpoint_dir : NULL,
                           tmp && *tmp ? tmp : "/tmp"};
    for (int i = 0; i < 2; i++) {
        if (!dirs[i]) continue;
        char alt[PATH_MAX], e2[512];
        if (snprintf(alt, sizeof alt, "%s/sample_host-%ld-%s", dirs[i], (long)getpid(), base) >=
            (int)sizeof alt)
            continue;
        mkdir(dirs[i], 0755);   /* the checkpoint folder may not exist yet */
        if (sh_ckpt_save(alt, m, flat, e2, sizeof e2) == 0) {
            snprintf(written, wlen, "%s", alt);
            snprintf(err, errlen, "%s; the model was written to %s instead", why, alt);
            return -1;
        }
    }
    snprintf(err, errlen, "%s; writing it to %s or %s failed too: the model is lost", why,
             dirs[0] ? dirs[0] : "(no checkpoint folder)", dirs[1]);
    return -1;
}
