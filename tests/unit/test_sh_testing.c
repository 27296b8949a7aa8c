/*
 * test_sh_testing.c — sample_host's testing knobs ([sample_host] debug_nan_step
 * and debug_save_sleep_ms, which make it misbehave on purpose) are accepted only
 * when the environment sets PROTRAIN_TESTING=1, as the plugin's [testing]
 * section is:
 *  - without it (unset, or another value) an INI key is refused at its
 *    file:line, and a flag on the command line, each with a sentence naming the
 *    key and the variable; with it both are read;
 *  - sample_host --help, sample_host/README.md and conf/default.ini name none
 *    of them; tests/README.md lists them, in a table generated from sample_host's
 *    key table (sh_config_testing_markdown) and checked here: when it is out of
 *    date the current text is written to $PT_BUILD/SH_TESTING.generated.md.
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

static char DIR_[64];
static char KEEP[16];   /* PROTRAIN_TESTING as the test found it ("" = unset) */
static int HAD;

static int setup(void **st) {
    (void)st;
    const char *v = getenv("PROTRAIN_TESTING");
    HAD = v != NULL;
    snprintf(KEEP, sizeof KEEP, "%s", v ? v : "");
    snprintf(DIR_, sizeof DIR_, "/tmp/test_sh_testing.XXXXXX");
    return mkdtemp(DIR_) ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    if (HAD) setenv("PROTRAIN_TESTING", KEEP, 1);
    else unsetenv("PROTRAIN_TESTING");
    return pt_test_rm_dir(DIR_);
}

/* value NULL: unset */
static void testing_env(const char *value) {
    if (value) assert_int_equal(setenv("PROTRAIN_TESTING", value, 1), 0);
    else assert_int_equal(unsetenv("PROTRAIN_TESTING"), 0);
}

static int parse(sh_config *c, int argc, char **argv, char *err, size_t errlen) {
    sh_config_defaults(c);
    err[0] = '\0';
    return sh_config_from_args(c, argc, argv, err, errlen);
}

static void test_ini_key_gated(void **st) {
    (void)st;
    char path[128];
    snprintf(path, sizeof path, "%s/t.ini", DIR_);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("[sample_host]\nsteps = 2\ndebug_nan_step = 3\n", f);
    assert_int_equal(fclose(f), 0);
    char *argv[] = {"sample_host", "--config", path, NULL};
    char err[600], want[300];
    sh_config c;
    snprintf(want, sizeof want, "%s:3: key 'debug_nan_step' in [sample_host] is a testing knob",
             path);
    static const char *const off[] = {NULL, "0", "yes"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        testing_env(off[i]);
        assert_int_equal(parse(&c, 3, argv, err, sizeof err), -1);
        if (!strstr(err, want) || !strstr(err, "PROTRAIN_TESTING=1"))
            fail_msg("PROTRAIN_TESTING=%s: got '%s', want '%s ... PROTRAIN_TESTING=1'",
                     off[i] ? off[i] : "(unset)", err, want);
    }
    printf("  refused: %s\n", err);
    testing_env("1");
    if (parse(&c, 3, argv, err, sizeof err)) fail_msg("with PROTRAIN_TESTING=1: %s", err);
    assert_int_equal(c.debug_nan_step, 3);
    assert_int_equal(c.steps, 2);
}

static void test_flag_gated(void **st) {
    (void)st;
    char *argv[] = {"sample_host", "--debug-save-sleep-ms", "7", "--steps", "2", NULL};
    char err[600];
    sh_config c;
    testing_env(NULL);
    assert_int_equal(parse(&c, 5, argv, err, sizeof err), -1);
    assert_non_null(strstr(err, "command line: flag --debug-save-sleep-ms is a testing knob"));
    assert_non_null(strstr(err, "PROTRAIN_TESTING=1"));
    printf("  refused: %s\n", err);
    /* an ordinary flag is read with the variable unset */
    char *plain[] = {"sample_host", "--steps", "2", NULL};
    if (parse(&c, 3, plain, err, sizeof err)) fail_msg("plain flags: %s", err);
    testing_env("1");
    if (parse(&c, 5, argv, err, sizeof err)) fail_msg("with PROTRAIN_TESTING=1: %s", err);
    assert_int_equal(c.debug_save_sleep_ms, 7);
}

static char *slurp(const char *rel) {
    const char *root = getenv("PT_ROOT");
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root ? root : ".", rel);
    char *b = pt_test_slurp(p);
    if (!b) fail_msg("cannot read %s", p);
    return b;
}

static void test_user_docs_and_help_silent(void **st) {
    (void)st;
    static const char *const docs[] = {"sample_host/README.md", "conf/default.ini"};
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        char *t = slurp(docs[i]);
        if (strstr(t, "debug_nan_step") || strstr(t, "debug_save_sleep_ms"))
            fail_msg("%s names a testing knob", docs[i]);
        free(t);
    }
    const char *b = getenv("PT_BUILD");
    char exe[512], cmd[800], out[128];
    snprintf(exe, sizeof exe, "%s/sample_host", b ? b : "build");
    if (access(exe, X_OK) != 0) {
        printf("  %s not built: --help not checked\n", exe);
        return;
    }
    snprintf(out, sizeof out, "%s/help.txt", DIR_);
    snprintf(cmd, sizeof cmd, "'%s' --help > '%s' 2>&1", exe, out);
    assert_int_equal(system(cmd), 0);
    char *h = pt_test_slurp(out);
    assert_non_null(h);
    assert_non_null(strstr(h, "--checkpoint-every"));   /* the flags are listed */
    assert_null(strstr(h, "--debug-"));
    free(h);
}

static void test_readme_table(void **st) {
    (void)st;
    static char gen[8192];
    assert_int_equal(sh_config_testing_markdown(gen, sizeof gen), 0);
    assert_non_null(strstr(gen, "`debug_nan_step`"));
    assert_non_null(strstr(gen, "`--debug-save-sleep-ms`"));
    char small[32];
    assert_int_equal(sh_config_testing_markdown(small, sizeof small), -1);
    char *md = slurp("tests/README.md");
    static const char B[] = "<!-- BEGIN GENERATED SAMPLE_HOST KEYS -->\n",
                      E[] = "<!-- END GENERATED SAMPLE_HOST KEYS -->";
    const char *b = strstr(md, B), *e = strstr(md, E);
    assert_non_null(b);
    assert_non_null(e);
    b += strlen(B);
    int same = e >= b && (size_t)(e - b) == strlen(gen) && !memcmp(b, gen, strlen(gen));
    if (!same) {
        const char *build = getenv("PT_BUILD");
        char p[1024];
        snprintf(p, sizeof p, "%s/SH_TESTING.generated.md", build ? build : "/tmp");
        FILE *f = fopen(p, "w");
        if (f) fputs(gen, f), fclose(f);
        print_error("tests/README.md is out of date with sample_host's key table; paste %s "
                    "between the SAMPLE_HOST markers\n",
                    p);
    }
    assert_true(same);
    free(md);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ini_key_gated),
        cmocka_unit_test(test_flag_gated),
        cmocka_unit_test(test_user_docs_and_help_silent),
        cmocka_unit_test(test_readme_table),
    };
    return cmocka_run_group_tests_name("sample_host's testing knobs need PROTRAIN_TESTING=1", tests,
                                       setup, teardown);
}
