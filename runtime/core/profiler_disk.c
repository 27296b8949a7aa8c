/*
 * profiler_disk.c — the disk tier's rates: a short timed write and read in
 * the [nvme] folder, cached per device (profiler_disk.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "profiler_disk.h"
#include "protrain.h"

#define DISK_FMT 1      /* the cache file's format and the probe's method */
#define DISK_ALIGN 4096 /* O_DIRECT offsets, lengths and buffers */

int pt_disk_cache_path(const char *cache_dir, const char *folder, int threads, char *out, size_t outlen, char *err,
                       size_t errlen) {
    struct stat sb;
    if (stat(folder, &sb))
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path %s: %s", folder, strerror(errno));
    char key[128];
    int n = snprintf(key, sizeof key, "protrain disk rates v%d dev %llu threads %d bytes %llu", DISK_FMT,
                     (unsigned long long)sb.st_dev, threads, (unsigned long long)PT_DISK_PROBE_BYTES);
    n = snprintf(out, outlen, "%s/disk-%016llx.rate", cache_dir, (unsigned long long)pt_fnv1a64(key, (size_t)n));
    if (n < 0 || (size_t)n >= outlen)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "cache_dir %s: path too long", cache_dir);
    return PT_OK;
}

/* The cached rates when the file is there and every field matches. */
static int cache_read(const char *path, uint64_t dev, int threads, pt_disk_rates *r) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int fmt = 0, th = 0, direct = -1;
    unsigned long long d = 0, by = 0;
    double rd = 0, wr = 0;
    int got = fscanf(f, "protrain disk rates %d dev %llu threads %d bytes %llu read_Bps %lg write_Bps %lg direct %d",
                     &fmt, &d, &th, &by, &rd, &wr, &direct);
    fclose(f);
    if (got != 7 || fmt != DISK_FMT || d != dev || th != threads || by != PT_DISK_PROBE_BYTES || !isfinite(rd) ||
        !isfinite(wr) || !(rd > 0) || !(wr > 0) || (direct != 0 && direct != 1))
        return 0;
    r->rd_Bps = rd;
    r->wr_Bps = wr;
    r->direct = direct;
    r->cached = 1;
    return 1;
}

/* Written to a private name, then renamed: a reader never sees half a file. */
static void cache_write(const char *path, const pt_disk_rates *r, int threads) {
    char tmp[1100];
    if (snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) >= (int)sizeof tmp) return;
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    int bad = fprintf(f, "protrain disk rates %d\ndev %llu\nthreads %d\nbytes %llu\nread_Bps %.17g\nwrite_Bps %.17g\n"
                         "direct %d\n",
                      DISK_FMT, (unsigned long long)r->dev, threads, (unsigned long long)PT_DISK_PROBE_BYTES, r->rd_Bps,
                      r->wr_Bps, r->direct) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) unlink(tmp);
}

typedef struct io_part {
    int fd, write;
    char *buf;
    uint64_t off, len;
    int err;   /* errno of a failed request, or EIO for a short one that made no progress */
} io_part;

static void *io_run(void *arg) {
    io_part *p = arg;
    uint64_t done = 0;
    while (done < p->len) {
        ssize_t n = p->write ? pwrite(p->fd, p->buf + done, (size_t)(p->len - done), (off_t)(p->off + done))
                             : pread(p->fd, p->buf + done, (size_t)(p->len - done), (off_t)(p->off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            p->err = n < 0 ? errno : EIO;
            return NULL;
        }
        done += (uint64_t)n;
    }
    return NULL;
}

/* One pass over the file with `threads` requests in flight: seconds, or -errno. */
static double io_pass(int fd, char *buf, int threads, int write, int direct) {
    io_part part[64];
    pthread_t th[64];
    unsigned char started[64];
    uint64_t each = PT_DISK_PROBE_BYTES / (uint64_t)threads / DISK_ALIGN * DISK_ALIGN;
    double t0 = pt_now_s();
    for (int i = 0; i < threads; i++) {
        uint64_t off = (uint64_t)i * each, len = i == threads - 1 ? PT_DISK_PROBE_BYTES - off : each;
        part[i] = (io_part){fd, write, buf + off, off, len, 0};
        started[i] = !pthread_create(&th[i], NULL, io_run, &part[i]);
        if (!started[i]) io_run(&part[i]);   /* no thread: this one does the part */
    }
    for (int i = 0; i < threads; i++)
        if (started[i]) pthread_join(th[i], NULL);
    int e = 0;
    for (int i = 0; i < threads && !e; i++) e = part[i].err;
    if (!e && write && fdatasync(fd)) e = errno;
    double dt = pt_now_s() - t0;
    /* buffered: the next read must come from the disk, not the page cache */
    if (!direct) (void)posix_fadvise(fd, 0, (off_t)PT_DISK_PROBE_BYTES, POSIX_FADV_DONTNEED);
    return e ? -(double)e : dt;
}

/* The timed part: a temporary file (unlinked at once), O_DIRECT when the
 * filesystem takes it, two rounds each way, the best kept. */
static int time_disk(const char *folder, int threads, pt_disk_rates *r, char *err, size_t errlen) {
    char path[1100];
    if (snprintf(path, sizeof path, "%s/.protrain-disk-probe.XXXXXX", folder) >= (int)sizeof path)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[nvme] path %s: too long", folder);
    int direct = 1, fd = mkostemp(path, O_CLOEXEC | O_DIRECT);
    if (fd < 0 && errno == EINVAL) {   /* tmpfs and some overlays refuse O_DIRECT */
        direct = 0;
        fd = mkostemp(path, O_CLOEXEC);
    }
    if (fd < 0)
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path %s: cannot create a file to time the disk: %s", folder,
                       strerror(errno));
    unlink(path);
    char *buf = NULL;
    if (posix_memalign((void **)&buf, DISK_ALIGN, (size_t)PT_DISK_PROBE_BYTES)) {
        close(fd);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM, "out of host memory timing the disk");
    }
    for (uint64_t i = 0; i < PT_DISK_PROBE_BYTES; i++) buf[i] = (char)(i * 131 + 7);   /* not all zeros */
    int e = posix_fallocate(fd, 0, (off_t)PT_DISK_PROBE_BYTES);
    if (e == EINVAL || e == EOPNOTSUPP) e = 0;   /* no reservation there: the first round allocates */
    double t0 = pt_now_s(), wbest = 0, rbest = 0;
    for (int round = 0; round < 2 && !e; round++) {
        double w = io_pass(fd, buf, threads, 1, direct);
        if (w < 0 && -w == EINVAL && direct && round == 0) {
            /* the file opened with O_DIRECT but the first aligned write is refused: buffered */
            int fl = fcntl(fd, F_GETFL);
            if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT)) {
                e = errno;
                break;
            }
            direct = 0;
            w = io_pass(fd, buf, threads, 1, direct);
        }
        double rd = w < 0 ? w : io_pass(fd, buf, threads, 0, direct);
        if (w < 0 || rd < 0) {
            e = (int)-(w < 0 ? w : rd);
            break;
        }
        if (w > 0 && (wbest == 0 || w < wbest)) wbest = w;
        if (rd > 0 && (rbest == 0 || rd < rbest)) rbest = rd;
    }
    free(buf);
    close(fd);
    if (e)
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path %s: timing the disk failed: %s", folder, strerror(e));
    /* a clock too coarse for the pass: one tick, which under-states the rate */
    const double tick = 1e-6;
    r->wr_Bps = (double)PT_DISK_PROBE_BYTES / (wbest > tick ? wbest : tick);
    r->rd_Bps = (double)PT_DISK_PROBE_BYTES / (rbest > tick ? rbest : tick);
    r->direct = direct;
    r->probe_s = pt_now_s() - t0;
    return PT_OK;
}

int pt_disk_probe(const char *folder, int threads, const char *cache_dir, pt_disk_rates *out, char *err,
                  size_t errlen) {
    memset(out, 0, sizeof *out);
    if (!folder || !folder[0]) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[nvme] path is empty: no disk to time");
    if (threads < 1 || threads > 64)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "[nvme] io_threads = %d: it must be in [1, 64]", threads);
    struct stat sb;
    if (stat(folder, &sb))
        return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path %s: %s", folder, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return pt_fail(err, errlen, PT_ERR_IO, "[nvme] path %s: not a folder", folder);
    out->dev = (uint64_t)sb.st_dev;
    char cpath[1100] = "";
    int use_cache = cache_dir && cache_dir[0] &&
                    !pt_disk_cache_path(cache_dir, folder, threads, cpath, sizeof cpath, NULL, 0);
    if (use_cache && cache_read(cpath, out->dev, threads, out)) return PT_OK;
    int rc = time_disk(folder, threads, out, err, errlen);
    if (!rc && use_cache) cache_write(cpath, out, threads);
    return rc;
}
