/*
 * test_disk_probe.c — runtime/core/profiler_disk.h: the disk tier's rates are
 * timed in the folder leaving nothing behind, kept in the cache keyed on the
 * folder's device and the thread count, read back from it (a planted file's
 * rates come back), and timed again when the key or the file does not match.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/profiler_disk.h"
#include "protrain.h"

typedef struct dirs {
    char data[256], cache[256];
} dirs;

static int setup(void **state) {
    dirs *d = calloc(1, sizeof *d);
    if (!d) return -1;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(d->data, sizeof d->data, "%s/pt_disk_data.XXXXXX", base);
    snprintf(d->cache, sizeof d->cache, "%s/pt_disk_cache.XXXXXX", base);
    if (!mkdtemp(d->data) || !mkdtemp(d->cache)) return -1;
    *state = d;
    return 0;
}

/* Entries of a folder besides . and .. */
static int entries(const char *dir) {
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(dp);
    return n;
}

static void clear(const char *dir) {
    DIR *dp = opendir(dir);
    if (!dp) return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(dp)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(dp);
}

static int teardown(void **state) {
    dirs *d = *state;
    clear(d->data);
    clear(d->cache);
    rmdir(d->data);
    rmdir(d->cache);
    free(d);
    return 0;
}

static void plant(const char *path, unsigned long long dev, int threads, double rd, double wr) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "protrain disk rates 1\ndev %llu\nthreads %d\nbytes %llu\nread_Bps %.17g\nwrite_Bps %.17g\ndirect 1\n",
            dev, threads, (unsigned long long)PT_DISK_PROBE_BYTES, rd, wr);
    fclose(f);
}

/* Timed once, then read from the cache: the same rates, and a planted file's
 * rates when one is planted (the lookup reads the file, not a copy in memory). */
static void test_probe_then_cache(void **state) {
    dirs *d = *state;
    char err[512];
    pt_disk_rates a, b;
    assert_int_equal(pt_disk_probe(d->data, 2, d->cache, &a, err, sizeof err), PT_OK);
    assert_int_equal(a.cached, 0);
    assert_true(a.rd_Bps > 0 && a.wr_Bps > 0);
    assert_true(a.probe_s > 0 && a.probe_s < 10);   /* 8 MiB twice each way */
    print_message("disk probe: read %.3g B/s, write %.3g B/s, %s, %.3f s\n", a.rd_Bps, a.wr_Bps,
                  a.direct ? "O_DIRECT" : "buffered", a.probe_s);
    assert_int_equal(entries(d->data), 0);           /* the probe's file is gone */
    assert_int_equal(entries(d->cache), 1);

    assert_int_equal(pt_disk_probe(d->data, 2, d->cache, &b, err, sizeof err), PT_OK);
    assert_int_equal(b.cached, 1);
    assert_true(b.rd_Bps == a.rd_Bps && b.wr_Bps == a.wr_Bps);
    assert_int_equal(b.direct, a.direct);
    assert_true(b.probe_s == 0);

    char path[600];
    assert_int_equal(pt_disk_cache_path(d->cache, d->data, 2, path, sizeof path, err, sizeof err), PT_OK);
    plant(path, (unsigned long long)a.dev, 2, 123.0, 456.0);
    assert_int_equal(pt_disk_probe(d->data, 2, d->cache, &b, err, sizeof err), PT_OK);
    assert_int_equal(b.cached, 1);
    assert_true(b.rd_Bps == 123.0 && b.wr_Bps == 456.0);
    assert_int_equal(entries(d->cache), 1);
}

/* Another key times again: another thread count (another file), a file whose
 * device does not match (as a folder on another disk would have), a corrupt
 * file; without a cache folder every call times. */
static void test_other_key_reprobes(void **state) {
    dirs *d = *state;
    char err[512], p1[600], p2[600];
    pt_disk_rates a, b;
    assert_int_equal(pt_disk_probe(d->data, 2, d->cache, &a, err, sizeof err), PT_OK);
    assert_int_equal(pt_disk_cache_path(d->cache, d->data, 1, p1, sizeof p1, err, sizeof err), PT_OK);
    assert_int_equal(pt_disk_cache_path(d->cache, d->data, 2, p2, sizeof p2, err, sizeof err), PT_OK);
    assert_string_not_equal(p1, p2);
    assert_int_equal(pt_disk_probe(d->data, 1, d->cache, &b, err, sizeof err), PT_OK);
    assert_int_equal(b.cached, 0);
    assert_int_equal(entries(d->cache), 2);

    /* a folder on another device keys another file (when /dev/shm is one) */
    struct stat s1, s2;
    if (!stat("/dev/shm", &s2) && !stat(d->data, &s1) && s1.st_dev != s2.st_dev) {
        char p3[600];
        assert_int_equal(pt_disk_cache_path(d->cache, "/dev/shm", 2, p3, sizeof p3, err, sizeof err), PT_OK);
        assert_string_not_equal(p3, p2);
    }

    /* the right file name with another device inside: timed again, rewritten */
    plant(p2, (unsigned long long)a.dev + 1, 2, 123.0, 456.0);
    assert_int_equal(pt_disk_probe(d->data, 2, d->cache, &b, err, sizeof err), PT_OK);
    assert_int_equal(b.cached, 0);
    assert_true(b.rd_Bps != 123.0);
    assert_int_equal(pt_disk_probe(d->data, 2, d->cache, &b, err, sizeof err), PT_OK);
    assert_int_equal(b.cached, 1);

    FILE *f = fopen(p2, "w");
    assert_non_null(f);
    fputs("protrain disk rates 1\ndev", f);
    fclose(f);
    assert_int_equal(pt_disk_probe(d->data, 2, d->cache, &b, err, sizeof err), PT_OK);
    assert_int_equal(b.cached, 0);

    assert_int_equal(pt_disk_probe(d->data, 2, NULL, &b, err, sizeof err), PT_OK);
    assert_int_equal(b.cached, 0);
    assert_int_equal(pt_disk_probe(d->data, 2, "", &b, err, sizeof err), PT_OK);
    assert_int_equal(b.cached, 0);
    assert_int_equal(entries(d->data), 0);
}

/* A memory filesystem (tmpfs: O_DIRECT refused by kernels before 6.6, then
 * buffered): timed, nothing left behind. */
static void test_tmpfs_buffered(void **state) {
    (void)state;
    char dir[] = "/dev/shm/pt_disk_shm.XXXXXX";
    if (!mkdtemp(dir)) skip();
    char err[512];
    pt_disk_rates r;
    int rc = pt_disk_probe(dir, 3, NULL, &r, err, sizeof err);
    int left = entries(dir);
    rmdir(dir);
    assert_int_equal(rc, PT_OK);
    assert_true(r.rd_Bps > 0 && r.wr_Bps > 0);
    assert_int_equal(left, 0);
}

static void test_bad_input(void **state) {
    dirs *d = *state;
    char err[512], path[600];
    pt_disk_rates r;
    snprintf(path, sizeof path, "%s/missing", d->data);
    assert_int_equal(pt_disk_probe(path, 2, d->cache, &r, err, sizeof err), PT_ERR_IO);
    assert_non_null(strstr(err, path));
    assert_int_equal(pt_disk_probe(d->data, 0, d->cache, &r, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "io_threads"));
    assert_int_equal(pt_disk_probe("", 2, d->cache, &r, err, sizeof err), PT_ERR_INVALID_ARG);
    FILE *f = fopen(path, "w");   /* a file, not a folder */
    assert_non_null(f);
    fclose(f);
    assert_int_equal(pt_disk_probe(path, 2, d->cache, &r, err, sizeof err), PT_ERR_IO);
    assert_non_null(strstr(err, "not a folder"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_probe_then_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_key_reprobes, setup, teardown),
        cmocka_unit_test(test_tmpfs_buffered),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
