/*
 * test_coll_pick.c — which collectives transport a configuration gets, and
 * what is refused, on a machine without a GPU (the NCCL transport itself runs
 * only in tests/gpu/nccl.sh):
 *  - pt_coll_pick over every [dist] backend x device backend x init_method:
 *    auto gives nccl on cuda and mpi on host; nccl on host, mpi on cuda,
 *    file:// with mpi, none and unknown words are refused with a sentence that
 *    names the setting;
 *  - the plugin's init with world_size 2 on the host backend refuses
 *    backend = nccl and file:// with mpi before touching MPI (the message
 *    reaches last_error);
 *  - the shared-file rendezvous: what rank 0 publishes, rank r fetches byte for
 *    byte; a file already there is refused (a stale id) and left alone; a
 *    world-size mismatch, a foreign file and a missing file (after the
 *    timeout, measured to have waited) are errors naming the path;
 *  - the front with a stand-in transport library (tests/plugins/fakenccl_works.c,
 *    world 1): the id travels through the file (the library checks its bytes),
 *    the file is gone after open, every coll.h call reaches the library with
 *    its scale applied, a failed call breaks the group so the next fails in the
 *    front without reaching the library, and close closes the library's handle;
 *  - loading the transport library: a missing file, a library without the
 *    symbol, one exporting only another version, and one with a short table are
 *    each refused with their own sentence; where libprotrain_nccl.so is built
 *    and no GPU is present, opening it fails with an error (not a crash) and
 *    leaves no rendezvous file behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coll/coll.h"
#include "coll/coll_boot.h"
#include "host_builder.h"
#include "protrain.h"
#include "pt_util.h"

static int has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static const char *build_dir(void) {
    const char *b = getenv("PT_BUILD");
    return b && *b ? b : "build";
}

static void test_pick(void **s) {
    (void)s;
    char err[512];
    const char *tr = "x";
    struct {
        const char *dist, *dev, *init, *want, *why1, *why2;
    } cases[] = {
        {"auto", "cuda", "env", "nccl", NULL, NULL},
        {"auto", "cuda", "mpi", "nccl", NULL, NULL},
        {"auto", "cuda", "file:///tmp/id", "nccl", NULL, NULL},
        {"auto", "host", "env", "mpi", NULL, NULL},
        {"auto", "host", "mpi", "mpi", NULL, NULL},
        {"nccl", "cuda", "env", "nccl", NULL, NULL},
        {"nccl", "cuda", "file:///tmp/id", "nccl", NULL, NULL},
        {"mpi", "host", "env", "mpi", NULL, NULL},
        {"nccl", "host", "env", NULL, "backend = nccl needs the cuda backend", "host backend"},
        {"mpi", "cuda", "env", NULL, "backend = mpi on the cuda backend", "use backend = nccl"},
        {"auto", "host", "file:///tmp/id", NULL, "init_method = file:///tmp/id", "mpi transport"},
        {"mpi", "host", "file:///tmp/id", NULL, "shared-file rendezvous", "env or mpi"},
        {"none", "host", "env", NULL, "backend = none", "could not agree"},
        {"none", "cuda", "env", NULL, "backend = none", "could not agree"},
        {"gloo", "host", "env", NULL, "'gloo'", "expected auto"},
        {"auto", "rocm", "env", NULL, "rocm backend", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = 0;
        tr = "x";
        int rc = pt_coll_pick(cases[i].dist, cases[i].dev, cases[i].init, &tr, err, sizeof err);
        if (cases[i].want) {
            if (rc || !tr || strcmp(tr, cases[i].want))
                fail_msg("backend = %s on %s with %s: got rc %d transport %s (%s), want %s",
                         cases[i].dist, cases[i].dev, cases[i].init, rc, tr ? tr : "NULL", err,
                         cases[i].want);
        } else {
            if (!rc || tr) fail_msg("backend = %s on %s with %s: not refused", cases[i].dist,
                                    cases[i].dev, cases[i].init);
            if (!has(err, cases[i].why1) || (cases[i].why2 && !has(err, cases[i].why2)))
                fail_msg("backend = %s on %s with %s: '%s' does not say why", cases[i].dist,
                         cases[i].dev, cases[i].init, err);
        }
    }
}

/* The plugin on the host backend, rank 0 of 2, with a [dist] section: init's
 * status and last_error. MPI is never started on these paths. */
static int init_dist(const char *dist, char *msg, size_t cap) {
    char text[512];
    snprintf(text, sizeof text, "[plugin]\nbackend = host\nlog_level = error\n[memory]\n"
                                "device_capacity = 4MiB\n[dist]\n%s",
             dist);
    pt_host_v1 host = hb_host(NULL);
    host.world_size = 2;
    host.rank = 0;
    host.device_kind = PT_DEVICE_HOST;
    void *ctx = NULL;
    int rc = hb_init(&protrain_plugin_v1, text, &host, &ctx);
    snprintf(msg, cap, "%s", protrain_plugin_v1.last_error(ctx));
    if (ctx) protrain_plugin_v1.finalize(ctx);
    return rc;
}

static void test_plugin_refuses(void **s) {
    (void)s;
    char msg[1024];
    int rc = init_dist("backend = nccl\n", msg, sizeof msg);
    assert_int_equal(rc, PT_ERR_UNSUPPORTED);
    if (!has(msg, "backend = nccl needs the cuda backend")) fail_msg("nccl on host: '%s'", msg);
    rc = init_dist("backend = mpi\ninit_method = file:///tmp/pt_never\n", msg, sizeof msg);
    assert_int_equal(rc, PT_ERR_UNSUPPORTED);
    if (!has(msg, "init_method = file:///tmp/pt_never")) fail_msg("file:// with mpi: '%s'", msg);
    rc = init_dist("backend = none\n", msg, sizeof msg);
    assert_int_equal(rc, PT_ERR_UNSUPPORTED);
    if (!has(msg, "backend = none")) fail_msg("none with 2 ranks: '%s'", msg);
}

/* Warnings the plugin logs during init, one per line. */
static char warned[4096];
static void warn_log(void *user, int32_t level, const char *msg) {
    (void)user;
    if (level <= PT_LOG_WARN && strlen(warned) + strlen(msg) + 2 < sizeof warned)
        strcat(strcat(warned, msg), "\n");
}

/* backend = nccl, mpi or host with one rank: init goes on (nothing to refuse: no
 * collective runs) and a warning names the key, the value and the one rank;
 * the control: backend = auto and none with one rank say nothing of it. */
static void test_one_rank_backend_warns(void **s) {
    (void)s;
    static const struct {
        const char *backend;
        int warns;
    } cases[] = {
        {"nccl", 1}, {"mpi", 1}, {"host", 1}, {"auto", 0}, {"none", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256], want[64];
        snprintf(text, sizeof text, "[plugin]\nbackend = host\nlog_level = warn\n[memory]\n"
                                    "device_capacity = 4MiB\n[dist]\nbackend = %s\n",
                 cases[i].backend);
        pt_host_v1 host = hb_host(NULL);
        host.log = warn_log;
        warned[0] = '\0';
        void *ctx = hb_open(&protrain_plugin_v1, text, &host);
        assert_int_equal(protrain_plugin_v1.finalize(ctx), PT_OK);
        snprintf(want, sizeof want, "[dist] backend = %s has no effect with one rank",
                 cases[i].backend);
        if (has(warned, want) != cases[i].warns || has(warned, "with one rank") != cases[i].warns)
            fail_msg("backend = %s, one rank: warnings '%s'", cases[i].backend, warned);
    }
}

static void path_for(char *p, size_t cap, const char *tag) {
    snprintf(p, cap, "/tmp/pt_coll_rdzv_%d_%s", (int)getpid(), tag);
    unlink(p);
}

static void test_file_rendezvous(void **s) {
    (void)s;
    char p[256], err[512];
    unsigned char id[PT_NCCL_ID_BYTES], got[PT_NCCL_ID_BYTES];
    for (int i = 0; i < PT_NCCL_ID_BYTES; i++) id[i] = (unsigned char)(i * 37 + 11);
    /* round trip, every byte (including '\n' and 0 bytes in the id) */
    id[5] = '\n';
    id[6] = 0;
    path_for(p, sizeof p, "ok");
    assert_int_equal(pt_coll_file_publish(p, 3, id, sizeof id, err, sizeof err), PT_OK);
    memset(got, 0, sizeof got);
    if (pt_coll_file_fetch(p, 2, 3, 1.0, got, sizeof got, err, sizeof err))
        fail_msg("fetch: %s", err);
    assert_memory_equal(got, id, sizeof id);
    /* a second publish (a stale file) is refused and the file is left as it was */
    unsigned char other[PT_NCCL_ID_BYTES];
    memset(other, 0x55, sizeof other);
    assert_int_equal(pt_coll_file_publish(p, 3, other, sizeof other, err, sizeof err),
                     PT_ERR_CONFIG);
    if (!has(err, p) || !has(err, "already exists") || !has(err, "remove it"))
        fail_msg("stale file: '%s'", err);
    assert_int_equal(pt_coll_file_fetch(p, 1, 3, 1.0, got, sizeof got, err, sizeof err), PT_OK);
    assert_memory_equal(got, id, sizeof id);
    /* a rank of another world size */
    assert_int_equal(pt_coll_file_fetch(p, 1, 4, 1.0, got, sizeof got, err, sizeof err),
                     PT_ERR_CONFIG);
    if (!has(err, "world 3") || !has(err, "rank 1 is in world 4")) fail_msg("world: '%s'", err);
    pt_coll_file_remove(p);
    struct stat st;
    assert_int_not_equal(stat(p, &st), 0);
    /* no temporary file left beside it */
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", p, (int)getpid());
    assert_int_not_equal(stat(tmp, &st), 0);
    /* not ours */
    path_for(p, sizeof p, "foreign");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("hello\n", f);
    fclose(f);
    assert_int_equal(pt_coll_file_fetch(p, 1, 2, 1.0, got, sizeof got, err, sizeof err),
                     PT_ERR_CONFIG);
    if (!has(err, "not a protrain NCCL id file")) fail_msg("foreign: '%s'", err);
    unlink(p);
    /* nobody publishes: the deadline, then an error naming the rank and path */
    path_for(p, sizeof p, "never");
    double t0 = pt_now_s();
    assert_int_equal(pt_coll_file_fetch(p, 1, 2, 0.3, got, sizeof got, err, sizeof err),
                     PT_ERR_BACKEND);
    double waited = pt_now_s() - t0;
    if (waited < 0.3) fail_msg("gave up after %.3f s, before the 0.3 s timeout", waited);
    if (!has(err, "rank 1") || !has(err, p) || !has(err, "timeout = 0.3 s"))
        fail_msg("timeout: '%s'", err);
}

/* pt_coll_open with the nccl transport and library lib, world 1 through a
 * file: the status, err filled. */
static int open_nccl(const char *lib, const char *rdzv, char *err, size_t errlen) {
    char init[300];
    snprintf(init, sizeof init, "file://%s", rdzv);
    pt_coll_config cfg = {1, 0, init, 5.0, -1, "nccl", 0, lib, NULL};
    pt_coll *c = NULL;
    int rc = pt_coll_open(&cfg, &c, err, errlen);
    if (!rc) {
        assert_string_equal(pt_coll_transport(c), "nccl");
        pt_coll_close(c);
    }
    return rc;
}

static void test_library_refusals(void **s) {
    (void)s;
    char lib[4096], err[1024], p[256];
    path_for(p, sizeof p, "lib");
    snprintf(lib, sizeof lib, "%s/no_such_dir/libprotrain_nccl.so", build_dir());
    assert_int_equal(open_nccl(lib, p, err, sizeof err), PT_ERR_BACKEND);
    if (!has(err, "the nccl transport needs") || !has(err, "failed to load"))
        fail_msg("missing: '%s'", err);
    snprintf(lib, sizeof lib, "%s/tests/plugins/tiny.so", build_dir());
    assert_int_equal(open_nccl(lib, p, err, sizeof err), PT_ERR_BACKEND);
    if (!has(err, "does not export pt_nccl_coll_v1")) fail_msg("no symbol: '%s'", err);
    snprintf(lib, sizeof lib, "%s/tests/plugins/fakenccl_newver.so", build_dir());
    assert_int_equal(open_nccl(lib, p, err, sizeof err), PT_ERR_BACKEND);
    if (!has(err, "pt_nccl_coll_v2 (table version 2)") || !has(err, "speaks version 1"))
        fail_msg("new version: '%s'", err);
    snprintf(lib, sizeof lib, "%s/tests/plugins/fakenccl_small.so", build_dir());
    assert_int_equal(open_nccl(lib, p, err, sizeof err), PT_ERR_BACKEND);
    if (!has(err, "table says version 1") || !has(err, "use the libprotrain_nccl.so"))
        fail_msg("short table: '%s'", err);
    struct stat st;
    assert_int_not_equal(stat(p, &st), 0);   /* refused before any rendezvous */
}

static void test_front_dispatch(void **s) {
    (void)s;
    char lib[4096], err[1024], p[256], init[300];
    snprintf(lib, sizeof lib, "%s/tests/plugins/fakenccl_works.so", build_dir());
    path_for(p, sizeof p, "front");
    snprintf(init, sizeof init, "file://%s", p);
    pt_coll_config cfg = {1, 0, init, 5.0, -1, "nccl", 0, lib, NULL};
    pt_coll *c = NULL;
    if (pt_coll_open(&cfg, &c, err, sizeof err)) fail_msg("open: %s", err);
    struct stat st;
    assert_int_not_equal(stat(p, &st), 0);   /* rank 0 removed its id file */
    assert_string_equal(pt_coll_transport(c), "nccl");
    assert_int_equal(pt_coll_world(c), 1);
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    int (*calls)(void) = (int (*)(void))dlsym(h, "fakenccl_calls");
    int (*closes)(void) = (int (*)(void))dlsym(h, "fakenccl_closes");
    assert_non_null(calls);
    assert_non_null(closes);
    int c0 = calls(), k0 = closes();
    float v[3] = {2, 4, 8};
    double dv[2] = {3, 5};
    assert_int_equal(pt_coll_allreduce(c, v, 3, PT_COLL_F32, 0.5, "a", err, sizeof err), PT_OK);
    assert_true(v[0] == 1 && v[1] == 2 && v[2] == 4);
    assert_int_equal(pt_coll_reduce_scatter(c, dv, 2, PT_COLL_F64, 2.0, "r", err, sizeof err),
                     PT_OK);
    assert_true(dv[0] == 6 && dv[1] == 10);
    assert_int_equal(pt_coll_allgather(c, v, 3, 4, "g", err, sizeof err), PT_OK);
    assert_int_equal(pt_coll_barrier(c, err, sizeof err), PT_OK);
    assert_int_equal(calls() - c0, 4);
    assert_int_equal(pt_coll_allreduce(c, v, 3, PT_COLL_F32, 1, "FAIL here", err, sizeof err),
                     PT_ERR_BACKEND);
    if (!has(err, "failed on purpose")) fail_msg("'%s'", err);
    assert_int_equal(pt_coll_allreduce(c, v, 3, PT_COLL_F32, 1, "after", err, sizeof err),
                     PT_ERR_BACKEND);
    if (!has(err, "after: an earlier collective failed")) fail_msg("'%s'", err);
    assert_int_equal(calls() - c0, 5);   /* the last call never reached the library */
    pt_coll_close(c);
    assert_int_equal(closes() - k0, 1);
    dlclose(h);
    /* an id file already there: refused, left alone, nothing opened */
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("stale\n", f);
    fclose(f);
    c = NULL;
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_CONFIG);
    assert_null(c);
    if (!has(err, "already exists")) fail_msg("stale: '%s'", err);
    assert_int_equal(stat(p, &st), 0);
    unlink(p);
    /* file:// with the mpi transport never reaches MPI */
    cfg.transport = "mpi";
    assert_int_equal(pt_coll_open(&cfg, &c, err, sizeof err), PT_ERR_UNSUPPORTED);
    if (!has(err, "needs the nccl transport")) fail_msg("file with mpi: '%s'", err);
}

/* The real library, where it is built, on a machine without a GPU: a clear
 * error and no rendezvous file left for the next run to trip over. */
static void test_real_library_without_gpu(void **s) {
    (void)s;
    char lib[4096], err[1024], p[256];
    snprintf(lib, sizeof lib, "%s/libprotrain_nccl.so", build_dir());
    struct stat st;
    if (stat(lib, &st) != 0) {
        printf("test_coll_pick: %s not built (no nvcc or nccl.h, or a sanitizer build): "
               "real-library check skipped\n",
               lib);
        skip();
    }
    if (getenv("PT_TEST_HAVE_GPU")) {
        printf("test_coll_pick: PT_TEST_HAVE_GPU set: the no-GPU check is skipped "
               "(tests/gpu/nccl.sh runs the GPU checks)\n");
        skip();
    }
    path_for(p, sizeof p, "real");
    err[0] = 0;
    int rc = open_nccl(lib, p, err, sizeof err);
    if (rc == PT_OK) {
        printf("test_coll_pick: the NCCL transport opened: this machine has a GPU\n");
    } else {
        printf("test_coll_pick: without a GPU: %s\n", err);
        if (!has(err, "[dist]")) fail_msg("the error does not name [dist]: '%s'", err);
    }
    assert_int_not_equal(stat(p, &st), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_plugin_refuses),
        cmocka_unit_test(test_one_rank_backend_warns),
        cmocka_unit_test(test_file_rendezvous),
        cmocka_unit_test(test_library_refusals),
        cmocka_unit_test(test_front_dispatch),
        cmocka_unit_test(test_real_library_without_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
