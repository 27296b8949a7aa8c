/*
 * test_run_capacity.c — the built sample_host binary under a device smaller than
 * the model's all-resident footprint: the run trains, and every line
 * of its --metrics file reports a device peak within the device capacity.
 * A second run forces everything resident under the same capacity and must fail
 * with a clear out-of-memory sentence and a non-zero exit, not a crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_files.h"

static char DIR_[64];

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* Runs sample_host with the INI; returns its exit status; output in DIR_/out.txt. */
static int run(const char *ini_text, const char *extra) {
    const char *b = getenv("PT_BUILD"), *root = getenv("PT_ROOT");
    char ini[256], cmd[2048];
    snprintf(ini, sizeof ini, "%s/run.ini", DIR_);
    write_file(ini, ini_text);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && OMP_WAIT_POLICY=PASSIVE '%s/sample_host' --config '%s' --plugin "
             "'%s/protrain_plugin.so' --layers 4 --channels 64 --heads 4 --batch 4 --seq 64 "
             "--steps 12 --val-every 0 --gen-every 0 --progress off --quiet %s > '%s/out.txt' 2>&1",
             root ? root : ".", b ? b : "build", ini, b ? b : "build", extra, DIR_);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The last run's output (the caller frees it). */
static char *out_text(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/out.txt", DIR_);
    char *all = pt_test_slurp(path);
    assert_non_null(all);
    return all;
}

/* A failed run's output on the test's own, so the failure can be read. */
static void show_out(int rc) {
    if (!rc) return;
    char *all = out_text();
    fputs(all, stdout);
    free(all);
}

static void test_metrics_within_capacity(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_run_capacity.XXXXXX");
    assert_non_null(mkdtemp(DIR_));
    /* this model's all-resident footprint is about 12 MiB (params, grads, Adam
     * moments ~3.2 MiB; activations ~6 MiB; logits and scratch) */
    const char *small = "[plugin]\nbackend = host\nlog_level = warn\n"
                        "[memory]\ndevice_capacity = 6MiB\n";
    char extra[300];
    snprintf(extra, sizeof extra, "--metrics '%s/m.jsonl'", DIR_);
    int rc = run(small, extra);
    show_out(rc);
    assert_int_equal(rc, 0);
    char path[256];
    snprintf(path, sizeof path, "%s/m.jsonl", DIR_);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    double first = 0, last = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long peak = 0, cap = 0;
        double loss = 0;
        const char *p = strstr(line, "\"dev_peak\":"), *c = strstr(line, "\"dev_capacity\":"),
                   *l = strstr(line, "\"loss\":");
        assert_non_null(p);
        assert_non_null(c);
        assert_non_null(l);
        assert_int_equal(sscanf(p, "\"dev_peak\":%llu", &peak), 1);
        assert_int_equal(sscanf(c, "\"dev_capacity\":%llu", &cap), 1);
        assert_int_equal(sscanf(l, "\"loss\":%lf", &loss), 1);
        assert_int_equal(cap, 6u << 20);
        assert_true(peak > 0 && peak <= cap);
        if (!n) first = loss;
        last = loss;
        n++;
    }
    fclose(f);
    assert_int_equal(n, 12);
    printf("  12 steps under 6 MiB: loss %.4f -> %.4f, every dev_peak <= dev_capacity\n", first,
           last);
    assert_true(last < first);

    /* the same capacity with everything forced resident: a clear error, exit != 0 */
    rc = run("[plugin]\nbackend = host\nlog_level = warn\n[memory]\ndevice_capacity = 6MiB\n"
             "[protrain]\nforce_all_persistent = true\nn_checkpoint = 0\nn_swap = 0\n",
             "");
    assert_int_not_equal(rc, 0);
    char *all = out_text();
    printf("  forced resident: %s", strstr(all, "out of memory") ? strstr(all, "out of memory") : all);
    assert_non_null(strstr(all, "out of memory"));
    assert_non_null(strstr(all, "bytes"));
    free(all);
    assert_int_equal(pt_test_rm_dir(DIR_), 0);
}

/* The number a pinned-memory refusal asks for works in one round: from
 * pinned_budget = 1, set it to what the message says and the run trains (the
 * chunks' bytes alone would fail again in profiling). */
static void test_pinned_one_round(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_run_capacity.XXXXXX");
    assert_non_null(mkdtemp(DIR_));
    char ini[256];
    snprintf(ini, sizeof ini, "[plugin]\nbackend = host\nlog_level = warn\n"
                              "[memory]\ndevice_capacity = 6MiB\npinned_budget = 1\n");
    assert_int_not_equal(run(ini, "--steps 2"), 0);
    char *all = out_text();
    const char *at = strstr(all, "pinned_budget to at least ");
    if (!at) fail_msg("the refusal names no budget to set: %s", all);
    unsigned long long want = 0;
    assert_int_equal(sscanf(at, "pinned_budget to at least %llu", &want), 1);
    free(all);
    printf("  pinned_budget = 1: the refusal asks for %llu bytes\n", want);
    snprintf(ini, sizeof ini, "[plugin]\nbackend = host\nlog_level = warn\n"
                              "[memory]\ndevice_capacity = 6MiB\npinned_budget = %llu\n",
             want);
    int rc = run(ini, "--steps 2");
    show_out(rc);
    assert_int_equal(rc, 0);
    printf("  pinned_budget = %llu: trains\n", want);
    assert_int_equal(pt_test_rm_dir(DIR_), 0);
}

/* The device size a refusal names works in one round: from a capacity far too
 * small (1 MiB, where the host's own buffers do not fit) and from one nearer
 * the need (3 MiB), set device_capacity to the number the message says and the
 * run trains. Counts the runs as a user would (set it, run again) and asserts
 * 2: the refusal, then training (a device failing at its first allocation
 * past the capacity would take one run per failing allocation). A host buffer larger than the whole
 * capacity is refused at once, before the measurement, and costs a round of
 * its own; this model's host buffers are all below 1 MiB. */
static int rounds_from(const char *start, unsigned long long *said) {
    char cap[64], ini[256];
    snprintf(cap, sizeof cap, "%s", start);
    for (int r = 1; r <= 20; r++) {
        snprintf(ini, sizeof ini, "[plugin]\nbackend = host\nlog_level = warn\n"
                                  "[memory]\ndevice_capacity = %s\n",
                 cap);
        if (run(ini, "--steps 3") == 0) return r;
        char *all = out_text();
        const char *at = strstr(all, "it needs ");
        if (!at) at = strstr(all, "needs at least ");
        unsigned long long want = 0;
        if (!at || sscanf(strchr(at, ' ') + 1, "%*[a-z ]%llu", &want) != 1 || !want)
            fail_msg("round %d (device_capacity = %s) names no device size: %s", r, cap, all);
        free(all);
        printf("  round %d: device_capacity = %s -> it needs %llu bytes\n", r, cap, want);
        *said = want;
        snprintf(cap, sizeof cap, "%llu", want);
    }
    return 99;
}

static void test_device_one_round(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_run_capacity.XXXXXX");
    assert_non_null(mkdtemp(DIR_));
    const char *starts[] = {"1MiB", "3MiB"};
    for (int i = 0; i < 2; i++) {
        unsigned long long said = 0;
        int r = rounds_from(starts[i], &said);
        printf("  from %s: %d run(s) until it trains (with %llu bytes)\n", starts[i], r, said);
        assert_int_equal(r, 2);
    }
    assert_int_equal(pt_test_rm_dir(DIR_), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_metrics_within_capacity),
                                       cmocka_unit_test(test_pinned_one_round),
                                       cmocka_unit_test(test_device_one_round)};
    return cmocka_run_group_tests_name("sample_host under a small device", tests, NULL, NULL);
}
