/*
 * paths.c — output paths checked before step 1, and the final save's fallback.
 * A path that cannot be written is found before any training time is spent: the
 * model of a long run is otherwise lost when --save fails at the end.
 */
#include "sh_paths.h"

#include <errno.h>
#include <fcntl.h>
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
                 "and then fail to write)", flag, path, dir,
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

static int check_file(const char *flag, const char *path, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "%s %s is a folder; it takes a file path", flag, path);
        return -1;
    }
    char dir[PATH_MAX];
    folder_of(path, dir, sizeof dir);
    return probe_dir(flag, path, dir, err, errlen);
}

int sh_paths_check(const sh_config *c, char *err, size_t errlen) {
    if (c->save[0] && check_file("--save", c->save, err, errlen)) return -1;
    if (c->metrics[0] && check_file("--metrics", c->metrics, err, errlen)) return -1;
    if (c->write_shard[0] && check_file("--write-shard", c->write_shard, err, errlen)) return -1;
    if (!c->checkpoint_dir[0]) return 0;
    struct stat sb;
    if (stat(c->checkpoint_dir, &sb) == 0)
        return probe_dir("--checkpoint-dir", c->checkpoint_dir, c->checkpoint_dir, err, errlen);
    /* made at the first save, one level: its parent must take it */
    char parent[PATH_MAX];
    folder_of(c->checkpoint_dir, parent, sizeof parent);
    return probe_dir("--checkpoint-dir", c->checkpoint_dir, parent, err, errlen);
}

int sh_paths_save_model(const sh_config *c, const sh_model *m, const float *flat, char *written,
                        size_t wlen, char *err, size_t errlen) {
    written[0] = '\0';
    char why[1024];
    if (sh_ckpt_save(c->save, m, flat, why, sizeof why) == 0) {
        snprintf(written, wlen, "%s", c->save);
        return 0;
    }
    const char *base = strrchr(c->save, '/');
    base = base ? base + 1 : c->save;
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
