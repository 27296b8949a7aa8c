/*
 * test_sh_plugin_ini.c — the plugin's INI sections are never silently ignored or
 * overridden by sample_host:
 *  - [optimizer] type = rekls with no optimizer chosen for sample_host: the INI's
 *    section decides (optimizer = ini), not sample_host's default AdamW;
 *  - an explicit --optimizer adamw wins over it and is noted; [sample_host]
 *    optimizer = adamw beside [optimizer] type = rekls in one file is refused;
 *  - --no-plugin with [optimizer] type = rekls is refused (sample_host's own
 *    optimizer is AdamW);
 *  - --no-plugin with an unknown key in a plugin section: refused with the
 *    plugin's sentence naming it; a valid section trains.
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

#include "sh_config.h"
#include "sh_run.h"

static char DIR_[64], TEXT[300], PLUGIN[400];

static int setup(void **st) {
    (void)st;
    snprintf(DIR_, sizeof DIR_, "/tmp/test_sh_plugin_ini.XXXXXX");
    const char *b = getenv("PT_BUILD");
    snprintf(PLUGIN, sizeof PLUGIN, "%s/protrain_plugin.so", b ? b : "build");
    return pt_test_corpus_dir(DIR_, TEXT, sizeof TEXT);
}

static int teardown(void **st) {
    (void)st;
    return pt_test_rm_dir(DIR_);
}

static const char *ini(const char *name, const char *text) {
    static char p[300];
    snprintf(p, sizeof p, "%s/%s.ini", DIR_, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    return p;
}

/* sh_config_from_args on "--config INI" plus extra flags (NULL-terminated). */
static int parse(sh_config *c, const char *path, const char *a1, const char *a2, char *err,
                 size_t errlen) {
    char *argv[6] = {"sample_host", "--config", (char *)path, (char *)a1, (char *)a2, NULL};
    int argc = 3 + (a1 != NULL) + (a2 != NULL);
    sh_config_defaults(c);
    return sh_config_from_args(c, argc, argv, err, errlen);
}

static void test_optimizer_type(void **st) {
    (void)st;
    const char *rk = ini("rk", "[plugin]\nbackend = host\n[optimizer]\ntype = rekls\n");
    sh_config c;
    char err[1024] = "";
    assert_int_equal(parse(&c, rk, NULL, NULL, err, sizeof err), 0);
    assert_int_equal(c.optim_from_ini, 1);   /* the INI's REKLS, not sample_host's AdamW */
    assert_int_equal(parse(&c, rk, "--optimizer", "adamw", err, sizeof err), 0);
    assert_int_equal(c.optim_from_ini, 0);   /* the flag wins ... */
    assert_int_equal(c.optim_note, 2);       /* ... and is said */
    assert_int_equal(parse(&c, rk, "--no-plugin", NULL, err, sizeof err), -1);
    printf("  %s\n", err);
    assert_non_null(strstr(err, "type = rekls"));
    const char *both = ini("both", "[sample_host]\noptimizer = adamw\n[optimizer]\ntype = rekls\n");
    assert_int_equal(parse(&c, both, NULL, NULL, err, sizeof err), -1);
    printf("  %s\n", err);
    assert_non_null(strstr(err, "optimizer = adamw"));
    /* an INI naming adamw changes nothing (sample_host's AdamW settings stay) */
    const char *aw = ini("aw", "[optimizer]\ntype = adamw\n");
    assert_int_equal(parse(&c, aw, NULL, NULL, err, sizeof err), 0);
    assert_int_equal(c.optim_from_ini, 0);
}

static void small(sh_config *c, const char *path) {
    c->layers = 1;
    c->heads = 2;
    c->channels = 16;
    c->seq = 8;
    c->batch = 2;
    c->steps = 1;
    c->val_every = 0;
    c->gen_every = 0;
    c->quiet = 1;
    snprintf(c->data, sizeof c->data, "%s", TEXT);
    snprintf(c->plugin, sizeof c->plugin, "%s", PLUGIN);
    (void)path;
}

static void test_no_plugin_sections(void **st) {
    (void)st;
    if (access(PLUGIN, R_OK) != 0) {
        printf("  %s not built: skipped\n", PLUGIN);
        skip();
    }
    const char *bad = ini("bad", "[plugin]\nbackend = host\n[memory]\ndevice_capacity = 1GiB\n"
                                 "no_such_key = 1\n");
    sh_config c;
    char err[1024] = "";
    assert_int_equal(parse(&c, bad, "--no-plugin", NULL, err, sizeof err), 0);
    small(&c, bad);
    int rc = sh_run(&c, err, sizeof err);
    printf("  %s\n", err);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "no_such_key"));
    const char *good = ini("good", "[plugin]\nbackend = host\n[memory]\ndevice_capacity = 1GiB\n");
    assert_int_equal(parse(&c, good, "--no-plugin", NULL, err, sizeof err), 0);
    small(&c, good);
    rc = sh_run(&c, err, sizeof err);
    if (rc) fail_msg("sh_run: %s", err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizer_type),
        cmocka_unit_test(test_no_plugin_sections),
    };
    return cmocka_run_group_tests_name("sample_host and the plugin's INI sections", tests, setup,
                                       teardown);
}
