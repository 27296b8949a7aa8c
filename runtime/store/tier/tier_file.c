/*
 * tier_file.c — the disk tier's folder and file (tier.h): the lock that keeps
 * a second run out of the folder, the file reserved in full at open (so a full
 * disk or a file-size limit is found at post_model_load, not at a step), the
 * choice of O_DIRECT or buffered I/O, whole-record reads and writes, and the
 * removal at close.
 *
 * O_DIRECT is tried first (the page cache would otherwise hold a second copy
 * of every state, which is what the tier exists to avoid); a filesystem that
 * refuses it (tmpfs, some overlays: open or the first aligned write fails with
 * EINVAL) gets buffered I/O, and after each write posix_fadvise(DONTNEED)
 * asks the kernel to drop the pages once they are written back.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "tier_int.h"

/* The lock: one file per rank in the folder, flock'ed for the tier's life,
 * holding the owner's pid so a refusal can name it. */
static int take_lock(pt_tier *t, int rank, char *err, size_t errlen) {
    snprintf(t->lock, sizeof t->lock, "%s/protrain-tier.rank%d.lock", t->dir, rank);
    int fd = open(t->lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path: cannot create the lock file %s: %s",
                       t->lock, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        char buf[32] = "";
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        close(fd);
        if (e == EWOULDBLOCK)
            return pt_fail(err, errlen, PT_ERR_IO,
                           "[nvme] path %s is in use by another run (pid %s holds %s); give "
                           "each run its own folder", t->dir, buf[0] ? buf : "unknown", t->lock);
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path: cannot lock %s: %s", t->lock,
                       strerror(e));
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n) {
        int e = errno;
        close(fd);
        unlink(t->lock);
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path: cannot write the lock file %s: %s",
                       t->lock, strerror(e));
    }
    t->lock_fd = fd;
    return PT_OK;
}

/* The sentence of a failed write or reservation: a full disk and a file-size
 * limit named as such. */
int pt_tier_io_fail(pt_tier *t, int e, const char *what, char *err, size_t errlen) {
    const char *why = e == ENOSPC  ? "the disk is full"
                      : e == EFBIG ? "the file exceeds the file-size limit (ulimit -f)"
                      : e == EDQUOT ? "the disk quota is exhausted"
                                    : strerror(e);
    return pt_fail(err, errlen, PT_ERR_IO, "[nvme] tier file %s: %s failed: %s (%s)", t->file,
                   what, why, strerror(e));
}

/* Open the file: O_DIRECT when the filesystem takes it (one aligned write
 * probes it), else buffered. */
static int open_file(pt_tier *t, int rank, char *err, size_t errlen) {
    snprintf(t->file, sizeof t->file, "%s/protrain-tier.rank%d.bin", t->dir, rank);
    int fd = open(t->file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
    t->direct = fd >= 0;
    if (fd >= 0) {
        void *b = NULL;
        if (posix_memalign(&b, (size_t)t->blk, (size_t)t->blk))
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory");
        memset(b, 0, (size_t)t->blk);
        ssize_t n = pwrite(fd, b, (size_t)t->blk, 0);
        int e = errno;
        free(b);
        if (n != (ssize_t)t->blk) {
            close(fd);
            fd = -1;
            t->direct = 0;
            if (n >= 0 || e != EINVAL) {
                unlink(t->file);
                return pt_tier_io_fail(t, n >= 0 ? EIO : e, "the first write", err, errlen);
            }
        }
    } else if (errno != EINVAL) {
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path: cannot create %s: %s", t->file,
                       strerror(errno));
    }
    if (fd < 0) fd = open(t->file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path: cannot create %s: %s", t->file,
                       strerror(errno));
    t->fd = fd;
    return PT_OK;
}

int pt_tier_file_open(pt_tier *t, int rank, char *err, size_t errlen) {
    uint64_t b = t->blk;
    if (b < 512 || (b & (b - 1)))
        return pt_fail(err, errlen, PT_ERR_CONFIG,
                       "[nvme] block_size = %llu: it must be a power of two of at least 512",
                       (unsigned long long)b);
    int rc = take_lock(t, rank, err, errlen);
    if (rc) return rc;
    /* the disk: the budget asked for, and the free space there */
    struct statvfs vs;
    uint64_t avail = statvfs(t->dir, &vs) ? UINT64_MAX : (uint64_t)vs.f_bavail * vs.f_frsize;
    uint64_t cap = t->budget ? t->budget : avail;
    if (t->total > cap || t->total > avail) {
        rc = pt_fail(err, errlen, PT_ERR_IO,
                     "[nvme] the tier needs %llu bytes on disk for the offloaded chunks' states, "
                     "but %s allows %llu (the folder %s has %llu free); raise [nvme] budget or "
                     "free space there",
                     (unsigned long long)t->total, t->budget ? "[nvme] budget" : "the disk",
                     (unsigned long long)(t->total > cap ? cap : avail), t->dir,
                     (unsigned long long)avail);
        goto fail;
    }
    if ((rc = open_file(t, rank, err, errlen))) goto fail;
    /* a filesystem without fallocate gets the size at least (reads of records
     * not written yet then see zeros, not the end of the file) */
    int e = posix_fallocate(t->fd, 0, (off_t)t->total);
    if ((e == EOPNOTSUPP || e == EINVAL) && ftruncate(t->fd, (off_t)t->total)) e = errno;
    if (e && e != EOPNOTSUPP && e != EINVAL) {
        rc = pt_tier_io_fail(t, e, "reserving the whole file", err, errlen);
        close(t->fd);
        t->fd = -1;
        unlink(t->file);
        goto fail;
    }
    return PT_OK;
fail:
    close(t->lock_fd);
    t->lock_fd = -1;
    unlink(t->lock);
    return rc;
}

void pt_tier_file_close(pt_tier *t) {
    if (t->fd >= 0) {
        close(t->fd);
        unlink(t->file);
        t->fd = -1;
    }
    if (t->lock_fd >= 0) {
        unlink(t->lock);   /* before the unlock: no other run finds a stale file locked */
        close(t->lock_fd);
        t->lock_fd = -1;
    }
}

/* One whole record: len bytes at off, looping over short transfers. */
int pt_tier_rw(pt_tier *t, int write, void *buf, uint64_t off, uint64_t len, char *err,
               size_t errlen) {
    uint64_t done = 0;
    while (done < len) {
        ssize_t n = write ? pwrite(t->fd, (char *)buf + done, (size_t)(len - done),
                                   (off_t)(off + done))
                          : pread(t->fd, (char *)buf + done, (size_t)(len - done),
                                  (off_t)(off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            int e = n < 0 ? errno : write ? ENOSPC : EIO;
            char what[96];
            snprintf(what, sizeof what, "%s of %llu bytes at %llu", write ? "a write" : "a read",
                     (unsigned long long)len, (unsigned long long)off);
            return pt_tier_io_fail(t, e, what, err, errlen);
        }
        done += (uint64_t)n;
    }
    if (write && !t->direct) posix_fadvise(t->fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    return PT_OK;
}
