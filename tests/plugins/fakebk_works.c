/*
 * fakebk_works.c — fake cuda backend library that opens: the right symbol and
 * version, and a table longer than this build's (one trailing op a later build
 * of the same version might add), which must be accepted. Device memory is plain
 * heap memory, 4 MiB of it. memset_async always fails, and so does a device
 * allocation past 4 MiB; both say so through the log sink the wrapper installed
 * with set_log, so a test can check that path end to end.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "protrain.h"

typedef struct fake {
    pt_gpu_log_fn log;
    void *log_user;
} fake;

static int fake_open(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen) {
    (void)cfg;
    fake *f = calloc(1, sizeof *f);
    if (!f) {
        if (err && errlen) snprintf(err, errlen, "fakebk_works: out of host memory");
        return PT_ERR_HOST_OOM;
    }
    *impl = f;
    return PT_OK;
}
static void fake_close(void *impl) { free(impl); }
static void fake_set_log(void *impl, pt_gpu_log_fn fn, void *user) {
    fake *f = impl;
    f->log = fn;
    f->log_user = user;
}
static void fake_device_name(void *impl, char *buf, size_t len) {
    (void)impl;
    snprintf(buf, len, "fakebk_works");
}
#define FAKE_TOTAL (4u << 20)
static uint64_t fake_total_memory(void *impl) {
    (void)impl;
    return FAKE_TOTAL;
}
static void say(fake *f, const char *msg) {
    if (f->log) f->log(f->log_user, PT_LOG_ERROR, msg);
}
static int fake_dev_alloc(void *impl, size_t bytes, void **p) {
    *p = NULL;
    if (bytes > FAKE_TOTAL) {
        char msg[128];
        snprintf(msg, sizeof msg, "fakebk_works: no room for %zu bytes", bytes);
        say(impl, msg);
        return PT_ERR_OOM;
    }
    *p = malloc(bytes ? bytes : 1);
    return *p ? PT_OK : PT_ERR_OOM;
}
static int fake_host_alloc(void *impl, size_t bytes, void **p) {
    (void)impl;
    *p = malloc(bytes ? bytes : 1);
    return *p ? PT_OK : PT_ERR_HOST_OOM;
}
static void fake_free(void *impl, void *p, size_t bytes) {
    (void)impl;
    (void)bytes;
    free(p);
}
static int fake_memset(void *impl, void *p, int value, size_t bytes, pt_stream *s) {
    (void)p;
    (void)value;
    (void)s;
    char msg[128];
    snprintf(msg, sizeof msg, "fakebk_works: memset_async of %zu bytes refused", bytes);
    say(impl, msg);
    return PT_ERR_BACKEND;
}
static int fake_sync(void *impl, pt_stream *s) {
    (void)impl;
    (void)s;
    return PT_OK;
}

typedef struct longer_table {
    pt_gpu_backend b;
    void (*later_op)(void *impl);
} longer_table;

const longer_table pt_gpu_backend_cuda_v1 = {
    .b = {
        .abi_version = PT_GPU_BACKEND_VERSION,
        .struct_size = sizeof(longer_table),
        .name = "fake-works",
        .open = fake_open,
        .close = fake_close,
        .set_log = fake_set_log,
        .device_name = fake_device_name,
        .total_memory = fake_total_memory,
        .dev_alloc = fake_dev_alloc,
        .dev_free = fake_free,
        .host_alloc = fake_host_alloc,
        .host_free = fake_free,
        .stream_sync = fake_sync,
        .memset_async = fake_memset,
    },
    .later_op = NULL,
};
