/*
 * host_builder.h — the one way a test starts the plugin from INI text: the
 * text goes to a scratch file, a host descriptor is filled, and the plugin's
 * init reads that file (the file is removed right after, so a test leaves
 * nothing behind). INI text in, plugin context out.
 *
 *   pt_host_v1 h = hb_host(user);          rank 0 of 1, ABI fields set
 *   h.log = my_log;                        the test's callbacks, if any
 *   void *ctx = hb_open(P, ini_text, &h);  init, or the test fails with its message
 *
 * hb_init returns init's status instead, for tests that expect a refusal.
 * The table is the plugin linked into the test (&protrain_plugin_v1) or one a
 * test loaded (sh_harness's H.plug.table).
 * Header-only (static functions, cmocka asserts): include after <cmocka.h>.
 */
#ifndef PT_HOST_BUILDER_H
#define PT_HOST_BUILDER_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protrain.h"

/* A host descriptor for rank 0 of a world of one, this ABI's version and size,
 * every callback NULL and the device from the INI; the test sets what it needs. */
static inline pt_host_v1 hb_host(void *user) {
    pt_host_v1 h;
    memset(&h, 0, sizeof h);
    h.abi_version = PT_ABI_VERSION;
    h.struct_size = sizeof h;
    h.world_size = 1;
    h.user = user;
    return h;
}

/* Writes ini to a scratch file, calls table->init(file, host, ctx) (host NULL:
 * no descriptor) and removes the file. Returns init's status; on failure *ctx
 * is what init left (NULL) and table->last_error(NULL) says why. */
static inline int hb_init(const pt_plugin_v1 *table, const char *ini, const pt_host_v1 *host,
                          void **ctx) {
    char path[] = "/tmp/pt_test_ini_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(ini);
    assert_true(write(fd, ini, n) == (ssize_t)n);
    assert_int_equal(close(fd), 0);
    int rc = table->init(path, host, ctx);
    unlink(path);
    return rc;
}

/* hb_init that fails the test with init's message. */
static inline void *hb_open(const pt_plugin_v1 *table, const char *ini, const pt_host_v1 *host) {
    void *ctx = NULL;
    if (hb_init(table, ini, host, &ctx)) fail_msg("init: %s", table->last_error(NULL));
    return ctx;
}

#endif
