/*
 * test_loader.c — host_api/loader.c against the test plugins in tests/plugins/
 * (built as $PT_BUILD/tests/plugins/<name>.so): every failure class returns the
 * documented status, leaves `out` zeroed, and writes a sentence that names the
 * file and the numbers involved; good tables are copied privately.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <dlfcn.h>

#include "protrain.h"

#define CORE_BYTES (offsetof(pt_plugin_v1, finalize) + sizeof(void *))

static char g_plugdir[1024];   /* small enough that every path built from it fits PATH_MAX */

static int setup_all(void **state) {
    (void)state;
    const char *b = getenv("PT_BUILD");
    if (!b || !b[0]) {
        fprintf(stderr, "test_loader: PT_BUILD is not set (run through `make test`)\n");
        return -1;
    }
    int n = snprintf(g_plugdir, sizeof g_plugdir, "%s/tests/plugins", b);
    if (n < 0 || (size_t)n >= sizeof g_plugdir) {
        fprintf(stderr, "test_loader: PT_BUILD is too long (%zu bytes)\n", strlen(b));
        return -1;
    }
    return 0;
}

static void plug(char *buf, size_t len, const char *name) {
    snprintf(buf, len, "%s/%s.so", g_plugdir, name);
    if (access(buf, R_OK) != 0) fail_msg("test plugin %s is missing (build tests/plugins first)", buf);
}

static void assert_contains(const char *hay, const char *needle) {
    if (!strstr(hay, needle)) fail_msg("expected \"%s\" in error \"%s\"", needle, hay);
}

static void assert_zeroed(const pt_loaded_plugin *p) {
    static const pt_loaded_plugin zero;
    assert_memory_equal(p, &zero, sizeof zero);
}

/* Load test plugin `name`, expect failure `rc`, and check every substring. */
static void expect_fail(const char *name, int rc, ...) {
    char path[PATH_MAX], err[1024];
    pt_loaded_plugin p;
    memset(&p, 0xab, sizeof p);   /* the loader must zero it, not leave garbage */
    plug(path, sizeof path, name);
    int got = pt_plugin_load(path, &p, err, sizeof err);
    if (got != rc) fail_msg("%s: rc %d, want %d (err: %s)", name, got, rc, err);
    assert_zeroed(&p);
    assert_contains(err, path);
    va_list ap;
    va_start(ap, rc);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) assert_contains(err, s);
    va_end(ap);
}

static void test_none(void **state) {
    (void)state;
    pt_loaded_plugin p;
    char err[64] = "sentinel";
    memset(&p, 0x5a, sizeof p);
    assert_int_equal(pt_plugin_load("none", &p, err, sizeof err), PT_OK);
    assert_null(p.table);
    assert_null(p.dl);
    assert_string_equal(err, "");
    pt_plugin_unload(&p);
    pt_plugin_unload(&p);   /* twice is harmless */
    pt_plugin_unload(NULL);
}

static void test_bad_args(void **state) {
    (void)state;
    pt_loaded_plugin p;
    char err[256];
    assert_int_equal(pt_plugin_load("none", NULL, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_contains(err, "out is NULL");
    assert_int_equal(pt_plugin_load(NULL, &p, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_contains(err, "empty plugin spec");
    assert_zeroed(&p);
    assert_int_equal(pt_plugin_load("", &p, NULL, 0), PT_ERR_INVALID_ARG);   /* no err buffer */

    /* A path longer than pt_loaded_plugin.path is refused, never truncated. */
    char longp[700];
    memset(longp, 'a', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = '\0';
    assert_int_equal(pt_plugin_load(longp, &p, err, sizeof err), PT_ERR_INVALID_ARG);
    assert_contains(err, "plugin path too long: 699 bytes");
    assert_zeroed(&p);
}

static void test_good(void **state) {
    (void)state;
    char path[PATH_MAX], err[256] = "";
    pt_loaded_plugin p;
    plug(path, sizeof path, "good");
    assert_int_equal(pt_plugin_load(path, &p, err, sizeof err), PT_OK);
    assert_string_equal(err, "");
    assert_non_null(p.dl);
    assert_non_null(p.table);
    assert_int_equal(p.abi_version, 1);
    assert_string_equal(p.path, path);
    const pt_plugin_v1 *t = p.table;
    assert_int_equal(t->abi_version, 1);
    assert_int_equal(t->struct_size, sizeof(pt_plugin_v1));
    assert_string_equal(t->name, "good-test");
    assert_string_equal(t->version, "0.0.1");

    /* The table is a private copy with the same bytes as the plugin's object. */
    const pt_plugin_v1 *orig = dlsym(p.dl, "protrain_plugin_v1");
    assert_non_null(orig);
    assert_ptr_not_equal(orig, t);
    assert_memory_equal(orig, t, sizeof *t);

    /* Hooks work through the copy. */
    assert_true(PT_HAS_HOOK(t, init));
    assert_true(PT_HAS_HOOK(t, finalize));
    assert_false(PT_HAS_HOOK(t, dev_alloc));   /* NULL in good.c */
    void *ctx = NULL;
    assert_int_equal(t->init(NULL, NULL, &ctx), PT_OK);
    assert_non_null(ctx);
    assert_string_equal(t->last_error(ctx), "good-test: no error");
    assert_int_equal(t->finalize(ctx), PT_OK);
    assert_int_equal(t->finalize(NULL), PT_ERR_INVALID_ARG);

    pt_plugin_unload(&p);
    assert_zeroed(&p);
}

static void test_missing_file(void **state) {
    (void)state;
    char path[PATH_MAX], err[512];
    pt_loaded_plugin p;
    snprintf(path, sizeof path, "%s/no_such_plugin.so", g_plugdir);
    assert_int_equal(pt_plugin_load(path, &p, err, sizeof err), PT_ERR_IO);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "plugin file not found: %s", path);
    assert_string_equal(err, want);
    assert_zeroed(&p);

    /* A bare file name ending in .so goes through the loader path. */
    assert_int_equal(pt_plugin_load("libpt_no_such_plugin.so", &p, err, sizeof err), PT_ERR_IO);
    assert_string_equal(err, "plugin file not found: libpt_no_such_plugin.so");

    /* A bare .so name is not looked up in the current directory; say so. */
    char cwd[PATH_MAX];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(g_plugdir), 0);
    int rc = pt_plugin_load("good.so", &p, err, sizeof err);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(rc, PT_ERR_IO);
    assert_contains(err, "plugin file not found: good.so");
    assert_contains(err, "pass ./good.so");

    /* A short name that resolves nowhere lists what was tried. */
    assert_int_equal(pt_plugin_load("pt_no_such_thing", &p, err, sizeof err), PT_ERR_IO);
    assert_contains(err, "plugin file not found: pt_no_such_thing");
    assert_contains(err, "pt_no_such_thing_plugin.so");
    assert_contains(err, "libpt_no_such_thing.so");
    assert_zeroed(&p);
}

static void test_small_err_buffer(void **state) {
    (void)state;
    pt_loaded_plugin p;
    char err[16];
    memset(err, 'x', sizeof err);
    assert_int_equal(pt_plugin_load("/nonexistent/x.so", &p, err, 8), PT_ERR_IO);
    assert_int_equal(strlen(err), 7);            /* truncated and terminated inside 8 bytes */
    assert_memory_equal(err, "plugin ", 7);
    assert_int_equal(err[8], 'x');               /* nothing written past errlen */
    memset(err, 'x', sizeof err);
    assert_int_equal(pt_plugin_load("/nonexistent/x.so", &p, err, 0), PT_ERR_IO);
    assert_int_equal(err[0], 'x');               /* errlen 0: untouched */
}

static void test_nosym(void **state) {
    (void)state;
    expect_fail("nosym", PT_ERR_FORMAT, "not a protrain plugin: ",
                "exports no protrain_plugin_v* symbol", NULL);
}

static void test_newer(void **state) {
    (void)state;
    char range[64];
    snprintf(range, sizeof range, "this host speaks v%u..v%u", PT_ABI_MIN_VERSION, PT_ABI_VERSION);
    expect_fail("newer", PT_ERR_UNSUPPORTED, "plugin ABI too new: ", "speaks protrain ABI v2",
                range, NULL);
}

static void test_older(void **state) {
    (void)state;
    char need[64];
    snprintf(need, sizeof need, "this host needs >= v%u", PT_ABI_MIN_VERSION);
    expect_fail("older", PT_ERR_UNSUPPORTED, "plugin ABI too old: ", "speaks protrain ABI v0",
                need, NULL);
}

static void test_version_field_mismatch(void **state) {
    (void)state;
    /* Symbol v1, field 2: both numbers appear. */
    expect_fail("mismatch", PT_ERR_UNSUPPORTED, "plugin ABI too new: ", "protrain_plugin_v1",
                "abi_version 2", NULL);
    /* Symbol v1, field 0. */
    expect_fail("oldfield", PT_ERR_UNSUPPORTED, "plugin ABI too old: ", "protrain_plugin_v1",
                "abi_version 0", NULL);
}

static void test_truncated(void **state) {
    (void)state;
    char want[128];
    snprintf(want, sizeof want, "plugin table truncated: struct_size %zu bytes, need at least %zu",
             offsetof(pt_plugin_v1, finalize), CORE_BYTES);
    expect_fail("truncated", PT_ERR_FORMAT, want, NULL);
}

static void test_symbol_smaller_than_struct_size(void **state) {
    (void)state;
    /* tiny.c exports a 16-byte object claiming sizeof(pt_plugin_v1). */
    char want[128];
    snprintf(want, sizeof want, "struct_size says %zu bytes", sizeof(pt_plugin_v1));
    expect_fail("tiny", PT_ERR_FORMAT, "plugin table truncated: ", want, "only 16 bytes", NULL);
}

static void test_short_table_hides_tail(void **state) {
    (void)state;
    char path[PATH_MAX], err[256];
    pt_loaded_plugin p;
    plug(path, sizeof path, "short");
    assert_int_equal(pt_plugin_load(path, &p, err, sizeof err), PT_OK);
    const pt_plugin_v1 *t = p.table;
    assert_int_equal(t->struct_size, CORE_BYTES);
    assert_true(PT_HAS_HOOK(t, finalize));
    assert_false(PT_HAS_HOOK(t, init));          /* inside, but NULL */
    assert_false(PT_HAS_HOOK(t, dev_alloc));     /* outside struct_size */
    assert_null(t->dev_alloc);                   /* and zero in the copy, even read directly */
    assert_null(t->read_param);
    /* The plugin's own object does carry dev_alloc: the copy is what hid it. */
    const pt_plugin_v1 *orig = dlsym(p.dl, "protrain_plugin_v1");
    assert_non_null(orig);
    assert_non_null(orig->dev_alloc);
    assert_string_equal(t->last_error(NULL), "short-test");
    pt_plugin_unload(&p);
}

static void test_multi_prefers_supported(void **state) {
    (void)state;
    char path[PATH_MAX], err[256];
    pt_loaded_plugin p;
    plug(path, sizeof path, "multi");
    assert_int_equal(pt_plugin_load(path, &p, err, sizeof err), PT_OK);
    assert_int_equal(p.abi_version, 1);
    assert_string_equal(p.table->name, "multi-test-v1");
    pt_plugin_unload(&p);
}

static void test_cannot_load(void **state) {
    (void)state;
    /* Undefined symbol: dlopen(RTLD_NOW) fails; dlerror names the symbol. */
    expect_fail("undef", PT_ERR_IO, "cannot load plugin ", "pt_test_nowhere_defined", NULL);

    /* A file that exists but is not ELF. */
    char dir[] = "/tmp/pt_loader_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[PATH_MAX], err[512];
    snprintf(path, sizeof path, "%s/garbage.so", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("this is not an ELF file\n", f);
    fclose(f);
    pt_loaded_plugin p;
    assert_int_equal(pt_plugin_load(path, &p, err, sizeof err), PT_ERR_IO);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "cannot load plugin %s: ", path);
    assert_contains(err, want);
    assert_true(strlen(err) > strlen(want));   /* dlerror text follows */
    assert_zeroed(&p);
    unlink(path);
    rmdir(dir);
}

/* Short names resolve beside the running executable: link test plugins there
 * under unique names, load by short name, remove the links. */
static void test_short_name_beside_exe(void **state) {
    (void)state;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';

    char name[64], a[PATH_MAX + 128], b[PATH_MAX + 128], good[PATH_MAX], multi[PATH_MAX];
    snprintf(name, sizeof name, "ptl%ld", (long)getpid());
    snprintf(a, sizeof a, "%s/%s_plugin.so", exe, name);
    snprintf(b, sizeof b, "%s/lib%s.so", exe, name);
    plug(good, sizeof good, "good");
    plug(multi, sizeof multi, "multi");
    unlink(a);
    unlink(b);
    if (symlink(good, a) != 0 || symlink(multi, b) != 0) fail_msg("cannot create links in %s", exe);

    char err[512] = "";
    pt_loaded_plugin p;
    /* Both exist: <name>_plugin.so wins. */
    int rc = pt_plugin_load(name, &p, err, sizeof err);
    unlink(a);
    if (rc != PT_OK) {
        unlink(b);
        fail_msg("short name %s: %s", name, err);
    }
    assert_string_equal(p.path, a);
    assert_string_equal(p.table->name, "good-test");
    pt_plugin_unload(&p);

    /* Only lib<name>.so left. */
    rc = pt_plugin_load(name, &p, err, sizeof err);
    unlink(b);
    if (rc != PT_OK) fail_msg("short name %s (lib form): %s", name, err);
    assert_string_equal(p.path, b);
    assert_string_equal(p.table->name, "multi-test-v1");
    pt_plugin_unload(&p);
}

/* Short names and bare file names fall back to the dynamic loader's search path;
 * libcmocka.so is on it (this test links it), and is not a plugin. */
static void test_loader_path(void **state) {
    (void)state;
    char err[512];
    pt_loaded_plugin p;
    assert_int_equal(pt_plugin_load("cmocka", &p, err, sizeof err), PT_ERR_FORMAT);
    assert_contains(err, "not a protrain plugin: /");   /* resolved to an absolute path */
    assert_contains(err, "libcmocka.so");
    assert_zeroed(&p);
    assert_int_equal(pt_plugin_load("libcmocka.so", &p, err, sizeof err), PT_ERR_FORMAT);
    assert_contains(err, "not a protrain plugin: /");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_small_err_buffer),
        cmocka_unit_test(test_nosym),
        cmocka_unit_test(test_newer),
        cmocka_unit_test(test_older),
        cmocka_unit_test(test_version_field_mismatch),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_symbol_smaller_than_struct_size),
        cmocka_unit_test(test_short_table_hides_tail),
        cmocka_unit_test(test_multi_prefers_supported),
        cmocka_unit_test(test_cannot_load),
        cmocka_unit_test(test_short_name_beside_exe),
        cmocka_unit_test(test_loader_path),
    };
    return cmocka_run_group_tests(tests, setup_all, NULL);
}
