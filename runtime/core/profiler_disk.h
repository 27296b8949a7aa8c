/*
 * profiler_disk.h — the disk tier's read and write rates ([nvme] path), for
 * the cost model's I/O term (planner/cost_model.h, pt_cost_tier_time).
 *
 * A probe writes then reads PT_DISK_PROBE_BYTES through a temporary file in
 * the folder, split over `threads` requests in flight (the tier's io_threads,
 * so the rate is the one the tier sees), O_DIRECT where the filesystem takes
 * it, else buffered with the write's fdatasync timed and the page cache
 * dropped (posix_fadvise DONTNEED) before the read. The file is unlinked as
 * soon as it is open, so nothing is left behind whatever happens. Best of two
 * rounds each way (the first after posix_fallocate, as the tier reserves its
 * file).
 *
 * Cache: with a cache folder the rates are kept in
 * <cache_dir>/disk-<16 hex>.rate, the hex being FNV-1a 64 of (the folder's
 * device st_dev, threads, probe bytes, format version): another disk, another
 * thread count, another file. The file is text and checked field by field on
 * reading; anything that does not match is timed again and rewritten.
 */
#ifndef PT_PROFILER_DISK_H
#define PT_PROFILER_DISK_H

#include <stddef.h>
#include <stdint.h>

#define PT_DISK_PROBE_BYTES ((uint64_t)8 << 20)

typedef struct pt_disk_rates {
    double rd_Bps, wr_Bps;   /* bytes/s with `threads` requests in flight */
    double probe_s;          /* seconds the probe took (0 when cached) */
    int direct;              /* 1: O_DIRECT, 0: buffered + DONTNEED */
    int cached;              /* 1: read from the cache file, not timed */
    uint64_t dev;            /* st_dev of the folder */
} pt_disk_rates;

/* The cache file of (folder's device, threads) under cache_dir. 0, or
 * PT_ERR_IO (the folder cannot be stat'ed) / PT_ERR_INVALID_ARG (no room). */
int pt_disk_cache_path(const char *cache_dir, const char *folder, int threads, char *out, size_t outlen, char *err,
                       size_t errlen);
/* The rates of folder with threads (1..64) requests in flight: from the
 * cache when cache_dir (may be NULL or "") holds them, else timed (and then
 * stored there; a cache that cannot be written is not an error). Errors
 * (PT_ERR_IO, PT_ERR_INVALID_ARG, PT_ERR_HOST_OOM) name the folder and cause. */
int pt_disk_probe(const char *folder, int threads, const char *cache_dir, pt_disk_rates *out, char *err,
                  size_t errlen);

#endif
