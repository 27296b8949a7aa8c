/*
 * test_tier_plan.c — the runtime plans the disk tier as the store builds it.
 *
 * sample_host's trainer in process, a model whose offloaded chunks exceed
 * [memory] pinned_budget (n_persist fixed at 1: with more resident chunks the
 * states may fit), [nvme] path set, the other knobs searched, the plan
 * written to plan_file. The plan's pinned bytes (less its swap pool) must be the store's
 * own figure, read from its log line ("... N pinned bytes left for the
 * chunks, plus M of staging"), at the level the store chose; the plan carries
 * the disk's rates and its I/O bytes (a level-1 record read and written once
 * per step: twice the file). The rates are timed once and cached: a second
 * trainer with a rate file planted under the cache key plans with exactly the
 * planted rates. At a budget below level 1's figure, level 2 the same way.
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "core/profiler_disk.h"
#include "sh_harness.h"
#include "test_files.h"

static sh_harness H;

/* What the store said of the last tier it built. */
typedef struct tier_log {
    int level;
    unsigned long long chunks_pinned, staging;
} tier_log;

static void on_log(void *user, int32_t level, const char *msg) {
    tier_log *t = user;
    int lv;
    unsigned long long a, b;
    if (!strncmp(msg, "plan (", 6)) memset(t, 0, sizeof *t);   /* a store built after this plan follows */
    if (sscanf(msg, "nvme tier: level %d, the offloaded chunks' %*[^:]: %llu pinned bytes left for the chunks, plus %llu",
               &lv, &a, &b) == 3) {
        t->level = lv;
        t->chunks_pinned = a;
        t->staging = b;
    }
    if (level <= 0) fprintf(stderr, "protrain: %s\n", msg);
}

static int setup(void **st) {
    (void)st;
    return sh_harness_open(&H, "test_tier_plan", "the quick brown fox jumps over the lazy dog; ", 20000, 5, 1);
}

static int teardown(void **st) {
    (void)st;
    return sh_harness_close(&H);
}

/* First number after "key": in the JSON text. */
static double jnum(const char *s, const char *key) {
    char k[80];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    if (!p) fail_msg("plan JSON has no %s", key);
    return strtod(p + strlen(k), NULL);
}

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* One trainer (profile or cached trace, search, rebuild) and one step; the
 * plan's JSON text (caller frees) and the store's last tier line. */
static char *run(const char *budget, tier_log *tl) {
    char text[1200], plan[400];
    snprintf(plan, sizeof plan, "%s/plan.json", H.dir);
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = info\nbackend = host\n[memory]\npinned_budget = %s\n"
             "device_capacity = 6MiB\n[protrain]\nchunk_size = 160KiB\nn_persist = 1\ncache_dir = %s/cache\n"
             "plan_file = %s\n"
             "[nvme]\npath = %s/tier\n",
             budget, H.dir, plan, H.dir);
    const char *path = sh_harness_ini(&H, "cfg", text);
    assert_non_null(path);
    sh_train_opts o = sh_harness_opts(&H, 3, 96, 4, 2, 64);
    o.tbl = H.plug.table;
    o.ini_path = path;
    o.log = on_log;
    o.log_user = tl;
    memset(tl, 0, sizeof *tl);
    sh_trainer *tr = NULL;
    char err[1024];
    if (sh_trainer_create(&tr, &o, err, sizeof err)) fail_msg("create: %s", err);
    double loss;
    if (sh_trainer_step(tr, 1, 1e-3f, &loss)) fail_msg("step: %s", sh_trainer_error(tr));
    assert_int_equal(sh_trainer_destroy(tr), 0);
    char *js = pt_test_slurp(plan);
    assert_non_null(js);
    return js;
}

static void test_plan_matches_store(void **state) {
    (void)state;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/cache", H.dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(dir, sizeof dir, "%s/tier", H.dir);
    assert_int_equal(mkdir(dir, 0700), 0);

    tier_log tl;
    char *js = run("4MiB", &tl);
    assert_true(tl.level >= 1);
    if (jnum(js, "nvme_tier") != tl.level)
        fail_msg("plan: level %.0f, n_persist %.0f n_swap %.0f, %.0f pinned (swap pool %.0f); store: level %d, %llu + "
                 "%llu",
                 jnum(js, "nvme_tier"), jnum(js, "n_persist"), jnum(js, "n_swap"), jnum(js, "host_bytes"),
                 jnum(js, "swap_pool_bytes"), tl.level, tl.chunks_pinned, tl.staging);
    double pinned = jnum(js, "host_bytes") - jnum(js, "swap_pool_bytes");
    if (pinned != (double)(tl.chunks_pinned + tl.staging))
        fail_msg("plan pins %.0f bytes, the store %llu + %llu", pinned, tl.chunks_pinned, tl.staging);
    double disk = jnum(js, "tier_disk_bytes"), rd = jnum(js, "tier_read_Bps"), wr = jnum(js, "tier_write_Bps");
    print_message("level %d: %.0f pinned (store %llu + %llu), %.0f on disk, n_persist %.0f, read %.3g write %.3g B/s\n",
                  tl.level, pinned, tl.chunks_pinned, tl.staging, disk, jnum(js, "n_persist"), rd, wr);
    assert_true(disk > 0);
    assert_true(jnum(js, "tier_io_bytes") == (tl.level == 1 ? 2 : 3) * disk);
    assert_true(rd > 0 && wr > 0);
    assert_true(jnum(js, "tier_io_s") > 0);
    assert_int_equal(entries(dir), 0);   /* the store removed its files, the probe left none */
    free(js);

    /* the rates came from the cache file keyed on the folder's device: plant one */
    char cache[400], rate[700], err[300];
    snprintf(cache, sizeof cache, "%s/cache", H.dir);
    assert_int_equal(pt_disk_cache_path(cache, dir, 2, rate, sizeof rate, err, sizeof err), PT_OK);
    pt_disk_rates r;
    assert_int_equal(pt_disk_probe(dir, 2, cache, &r, err, sizeof err), PT_OK);
    assert_int_equal(r.cached, 1);   /* the first trainer stored them */
    /* the JSON prints 9 significant digits */
    assert_true(fabs(r.rd_Bps - rd) <= 1e-8 * rd && fabs(r.wr_Bps - wr) <= 1e-8 * wr);
    FILE *f = fopen(rate, "w");
    assert_non_null(f);
    fprintf(f, "protrain disk rates 1\ndev %llu\nthreads 2\nbytes %llu\nread_Bps 1.5e9\nwrite_Bps 2.5e9\ndirect 1\n",
            (unsigned long long)r.dev, (unsigned long long)PT_DISK_PROBE_BYTES);
    fclose(f);
    js = run("4MiB", &tl);
    assert_true(jnum(js, "tier_read_Bps") == 1.5e9);
    assert_true(jnum(js, "tier_write_Bps") == 2.5e9);
    free(js);

    /* 3 MiB: level 1's 3.4 MiB does not fit, the whole images go to disk; the
     * plan's pinned bytes are the store's staging slots, the I/O twice the
     * file (every chunk trainable: the backward's read and a write each) plus
     * the forward's reads of the params' blocks, less than a record each */
    js = run("3MiB", &tl);
    assert_int_equal(tl.level, 2);
    assert_true(jnum(js, "nvme_tier") == 2);
    pinned = jnum(js, "host_bytes") - jnum(js, "swap_pool_bytes");
    if (pinned != (double)(tl.chunks_pinned + tl.staging))
        fail_msg("level 2: plan pins %.0f bytes, the store %llu + %llu", pinned, tl.chunks_pinned, tl.staging);
    assert_true(tl.chunks_pinned == 0);
    disk = jnum(js, "tier_disk_bytes");
    double io = jnum(js, "tier_io_bytes");
    assert_true(disk > 0 && io > 2 * disk && io < 3 * disk);
    assert_true(jnum(js, "tier_read_Bps") == 1.5e9);
    free(js);
    assert_int_equal(entries(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_plan_matches_store)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
