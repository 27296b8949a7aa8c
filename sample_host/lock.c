/*
 * lock.c — the checkpoint folder's writer lock (sh_lock.h).
 */
#include "sh_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int sh_lock_dir(const char *dir, int *fd, char *err, size_t errlen) {
    *fd = -1;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create checkpoint folder %s: %s", dir, strerror(errno));
        return -1;
    }
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/%s", dir, SH_LOCK_FILE);
    int f = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (f < 0) {
        snprintf(err, errlen, "--checkpoint-dir %s: cannot open its lock file %s: %s", dir, p,
                 strerror(errno));
        return -1;
    }
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char who[32] = "";
        ssize_t n = e == EWOULDBLOCK ? pread(f, who, sizeof who - 1, 0) : -1;
        close(f);
        if (e != EWOULDBLOCK) {
            snprintf(err, errlen, "--checkpoint-dir %s: cannot lock %s: %s", dir, p, strerror(e));
            return -1;
        }
        long pid = n > 0 ? strtol(who, NULL, 10) : 0;
        char holder[48] = "another process (it has not written its pid yet)";
        if (pid > 0) snprintf(holder, sizeof holder, "process %ld", pid);
        snprintf(err, errlen, "--checkpoint-dir %s is in use by %s, which holds its lock %s: two "
                              "runs writing one folder would remove each other's generations, and two "
                              "--resume runs would continue one run twice; wait for it to end or give another "
                              "folder",
                 dir, holder, p);
        return -1;
    }
    char line[32];
    int k = snprintf(line, sizeof line, "%ld\n", (long)getpid());
    /* the pid is only for the sentence above: the lock itself is the flock */
    if (ftruncate(f, 0) != 0 || pwrite(f, line, (size_t)k, 0) != k) {
        /* a folder whose lock file cannot be written still locks; no sentence needed */
    }
    *fd = f;
    return 0;
}

void sh_lock_release(int *fd) {
    if (*fd >= 0) close(*fd);   /* closing the descriptor drops the flock */
    *fd = -1;
}
