/*
 * test_profile_cache.c — the profile cache is keyed on everything that changes
 * what a profile measured, not only the model and shapes.
 *
 * Each run creates a trainer (post_model_load profiles, or takes a cached
 * trace) with `[protrain] cache_dir` set, and the number of trace files in the
 * cache folder says whether the run hit (no new file) or missed (one more).
 * The same configuration twice must hit; a different chunk_size, device
 * capacity, copy throttle or compute jitter must miss. A run with another
 * chunk_size against a cache filled with the first size once failed at start
 * ("n_buffer = 1 is too small"): every run here must start and take a step.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "planner/trace_cache.h"
#include "sh_harness.h"

static sh_harness H;

static int setup(void **st) {
    (void)st;
    sh_harness_log_level = 0;   /* errors only */
    return sh_harness_open(&H, "test_profile_cache",
                           "the quick brown fox jumps over the lazy dog; ", 20000, 5, 1);
}

static int teardown(void **st) {
    (void)st;
    return sh_harness_close(&H);
}

static int count_traces(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/cache", H.dir);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* One trainer under `extra` (INI lines) with the shared cache; one step. */
static void run(const char *extra) {
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = error\nbackend = host\n[memory]\ndevice_capacity = 64MiB\n"
             "[protrain]\ncache_dir = %s/cache\n%s\n",
             H.dir, extra);
    /* extra adds [protrain] keys, or a section the template does not have */
    const char *path = sh_harness_ini(&H, "cfg", text);
    assert_non_null(path);
    sh_train_opts o = sh_harness_opts(&H, 2, 64, 2, 2, 32);
    o.tbl = H.plug.table;
    o.ini_path = path;
    sh_trainer *tr = NULL;
    char err[1024];
    int rc = sh_trainer_create(&tr, &o, err, sizeof err);
    if (rc) fail_msg("create (%s): %s", extra, err);
    double loss;
    rc = sh_trainer_step(tr, 1, 1e-3f, &loss);
    if (rc) fail_msg("step (%s): %s", extra, sh_trainer_error(tr));
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

/* A trainer created (it profiles, or takes a cached trace) and destroyed, under
 * the INI text written as <name>.ini, for a model of 2 blocks of C channels,
 * NH heads, batch B x T. */
static void start_only(const char *name, const char *text, int C, int NH, int B, int T) {
    const char *path = sh_harness_ini(&H, name, text);
    assert_non_null(path);
    sh_train_opts o = sh_harness_opts(&H, 2, C, NH, B, T);
    o.tbl = H.plug.table;
    o.ini_path = path;
    sh_trainer *tr = NULL;
    char err[1024];
    if (sh_trainer_create(&tr, &o, err, sizeof err)) fail_msg("create (%s): %s", name, err);
    assert_int_equal(sh_trainer_destroy(tr), 0);
}

static void expect(const char *extra, int more, const char *why) {
    int before = count_traces();
    run(extra);
    int after = count_traces();
    if (after != before + more)
        fail_msg("%s: %d trace file(s) before, %d after (expected %s)", why, before, after,
                 more ? "a miss: one more" : "a hit: none more");
}

static void test_key_inputs(void **st) {
    (void)st;
    expect("chunk_size = 64KiB", 1, "first run");
    expect("chunk_size = 64KiB", 0, "the same configuration again");
    expect("chunk_size = 128KiB", 1, "another chunk_size");
    expect("chunk_size = 128KiB", 0, "that chunk_size again");
    expect("chunk_size = 64KiB\n[host_backend]\ncopy_bandwidth = 2GB/s", 1, "a copy throttle");
    expect("chunk_size = 64KiB\n[testing]\ncompute_jitter = 1us", 1, "compute jitter");
    /* a knob that changes the plan, not what was measured, still hits */
    expect("chunk_size = 64KiB\nn_swap = 0", 0, "a plan knob (n_swap)");
}

static void test_capacity(void **st) {
    (void)st;
    /* device_capacity sits in the template; a second [memory] section would be a
     * duplicate, so this case writes its own file */
    int before = count_traces();
    char text[1024];
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = error\nbackend = host\n[memory]\ndevice_capacity = 96MiB\n"
             "[protrain]\ncache_dir = %s/cache\nchunk_size = 64KiB\n",
             H.dir);
    start_only("cap", text, 64, 2, 2, 32);
    assert_int_equal(count_traces(), before + 1);
}

/* What the profiler measures beside the passes, read back from the cached
 * trace of one run on the host backend (which poisons every free):
 *  - the arena frees after each backward and (every profiled block is CKPT)
 *    after each forward were timed: free_Bps, free_fwd_Bps > 0;
 *  - the device AdamW between passes ran on scratch holding 16 bytes per
 *    trainable element (param, grad, m, v), more than the passes ever hold
 *    here, yet the fragmentation reading (the highest window peak) stays below
 *    that: the scratch lives outside every window's reading. */
static void test_between_passes(void **st) {
    (void)st;
    char text[1024], dir[512], err[1024];
    snprintf(dir, sizeof dir, "%s/probe", H.dir);
    snprintf(text, sizeof text,
             "[plugin]\nlog_level = error\nbackend = host\n[memory]\ndevice_capacity = 64MiB\n"
             "[protrain]\ncache_dir = %s\nchunk_size = 64KiB\n",
             dir);
    start_only("probe", text, 256, 4, 1, 16);   /* wide and short: state over activations */
    DIR *d = opendir(dir);
    assert_non_null(d);
    char file[1024] = "";
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".trace")) snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
    closedir(d);
    assert_true(file[0]);
    pt_trace t;
    pt_trace_init(&t);
    assert_int_equal(pt_trace_read_file(file, NULL, &t, err, sizeof err), 0);
    uint64_t scratch = 0;
    for (int k = 0; k < t.n_chunk; k++) scratch += 16 * t.chunks[k].trainable_elems;
    printf("  free %.3g B/s (after forward %.3g), device AdamW %.3g elements/s, fragmentation reading at a %llu-byte "
           "peak, sweep scratch %llu bytes\n",
           t.hw.free_Bps, t.hw.free_fwd_Bps, t.hw.dev_adam_elems_per_s,
           (unsigned long long)t.frag.peak_bytes, (unsigned long long)scratch);
    assert_true(t.hw.free_Bps > 0);
    assert_true(t.hw.free_fwd_Bps > 0);   /* every profiled block is CKPT: freed after forward too */
    assert_true(t.hw.dev_adam_elems_per_s > 0);
    assert_true(t.frag.peak_bytes > 0 && t.frag.peak_bytes < scratch);
    pt_trace_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_inputs),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_between_passes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
