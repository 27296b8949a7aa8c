/*
 * test_sh_paths.c — sample_host's output paths are checked before the first step,
 * and a final save that fails still leaves the model somewhere it can be found.
 *  - --save into a folder that does not exist, --save naming a folder, --metrics
 *    into a missing folder, --checkpoint-dir under a missing parent: sh_run fails
 *    with a sentence naming the flag and the path, and no metrics file was written
 *    (no step ran: the metrics file is created before the first step);
 *  - sh_paths_save_model with a --save path that cannot be written (its "folder" is a
 *    file) writes the model to the checkpoint folder instead, byte-identical to a
 *    normal save, and says where.
 */
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

#include "test_files.h"

#include "sh_ckpt.h"
#include "sh_config.h"
#include "sh_paths.h"
#include "sh_run.h"

static char DIR_[64], TEXT[300];

static int setup(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_sh_paths.XXXXXX");
    return pt_test_corpus_dir(DIR_, TEXT, sizeof TEXT);
}

static int teardown(void **st) {
    (void)st;
    return pt_test_rm_dir(DIR_);
}

static void cfg(sh_config *c, const char *metrics) {
    sh_config_defaults(c);
    c->layers = 1;
    c->heads = 2;
    c->channels = 16;
    c->seq = 8;
    c->batch = 2;
    c->steps = 30;
    c->val_every = 0;
    c->gen_every = 0;
    c->quiet = 1;
    c->no_plugin = 1;
    snprintf(c->data, sizeof c->data, "%s", TEXT);
    snprintf(c->metrics, sizeof c->metrics, "%s", metrics);
}

/* sh_run must fail naming flag and path, with no metrics file written. */
static void refused(const sh_config *c, const char *metrics, const char *flag, const char *path) {
    char err[1024] = "";
    int rc = sh_run(c, err, sizeof err);
    printf("  %s\n", err);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, flag));
    assert_non_null(strstr(err, path));
    assert_int_not_equal(access(metrics, F_OK), 0);
}

static void test_checked_before_step_1(void **st) {
    (void)st;
    char m[300], p[300], file[300];
    snprintf(m, sizeof m, "%s/m.jsonl", DIR_);
    sh_config c;
    cfg(&c, m);
    snprintf(c.save, sizeof c.save, "%s/no/such/dir/out.bin", DIR_);
    refused(&c, m, "--save", "no/such/dir");
    cfg(&c, m);
    snprintf(c.save, sizeof c.save, "%s", DIR_);
    refused(&c, m, "--save", "is a folder");
    cfg(&c, m);
    snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s/missing/ck", DIR_);
    refused(&c, m, "--checkpoint-dir", "missing");
    snprintf(p, sizeof p, "%s/gone/m.jsonl", DIR_);
    cfg(&c, p);
    refused(&c, p, "--metrics", "gone");
    /* a "folder" that is a file */
    snprintf(file, sizeof file, "%s/plain", DIR_);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    cfg(&c, m);
    snprintf(c.save, sizeof c.save, "%s/out.bin", file);
    refused(&c, m, "--save", "is not a folder");
    /* and a good set of paths trains (so the refusals above are the paths') */
    cfg(&c, m);
    c.steps = 2;
    snprintf(c.save, sizeof c.save, "%s/ok.bin", DIR_);
    char err[1024] = "";
    int rc = sh_run(&c, err, sizeof err);
    if (rc) fail_msg("sh_run: %s", err);
    assert_int_equal(access(c.save, F_OK), 0);
}

static void test_save_fallback(void **st) {
    (void)st;
    char err[1024] = "", good[300], written[600];
    sh_dims d = {.V = 64, .Vp = 0, .maxT = 8, .L = 1, .NH = 2, .C = 8};
    sh_model m;
    assert_int_equal(sh_model_create(&m, &d, err, sizeof err), 0);
    sh_model_init_random(&m, 5);
    snprintf(good, sizeof good, "%s/good.bin", DIR_);
    assert_int_equal(sh_ckpt_save(good, &m, m.init, err, sizeof err), 0);
    sh_config c;
    sh_config_defaults(&c);
    /* the disk state changed after the check: the folder is now a file */
    snprintf(c.save, sizeof c.save, "%s/plain2/out.bin", DIR_);
    char file[300];
    snprintf(file, sizeof file, "%s/plain2", DIR_);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s/ck", DIR_);
    int rc = sh_paths_save_model(&c, &m, m.init, written, sizeof written, err, sizeof err);
    printf("  %s\n", err);
    assert_int_equal(rc, -1);
    assert_true(strncmp(written, c.checkpoint_dir, strlen(c.checkpoint_dir)) == 0);
    assert_non_null(strstr(err, written));   /* says where */
    char *a = pt_test_slurp(good), *b = pt_test_slurp(written);
    struct stat sa, sb;
    assert_int_equal(stat(good, &sa), 0);
    assert_int_equal(stat(written, &sb), 0);
    assert_int_equal(sa.st_size, sb.st_size);
    assert_memory_equal(a, b, (size_t)sa.st_size);
    free(a);
    free(b);
    sh_model_destroy(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checked_before_step_1),
        cmocka_unit_test(test_save_fallback),
    };
    return cmocka_run_group_tests_name("sample_host output paths", tests, setup, teardown);
}
