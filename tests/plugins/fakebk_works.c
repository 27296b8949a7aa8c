/*
 * fakebk_works.c — fake cuda backend library that opens: the right symbol and
 * version, and a table longer than this build's (one trailing op a later build
 * of the same version might add), which must be accepted. Device memory is plain
 * heap memory.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "protrain.h"

static int fake_token;   /* what open hands back as impl */

static int fake_open(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen) {
    (void)cfg;
    (void)err;
    (void)errlen;
    *impl = &fake_token;
    return PT_OK;
}
static void fake_close(void *impl) { (void)impl; }
static void fake_device_name(void *impl, char *buf, size_t len) {
    (void)impl;
    snprintf(buf, len, "fakebk_works");
}
static uint64_t fake_total_memory(void *impl) {
    (void)impl;
    return 4u << 20;
}
static int fake_alloc(void *impl, size_t bytes, void **p) {
    (void)impl;
    *p = malloc(bytes ? bytes : 1);
    return *p ? PT_OK : PT_ERR_OOM;
}
static void fake_free(void *impl, void *p, size_t bytes) {
    (void)impl;
    (void)bytes;
    free(p);
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
        .device_name = fake_device_name,
        .total_memory = fake_total_memory,
        .dev_alloc = fake_alloc,
        .dev_free = fake_free,
        .host_alloc = fake_alloc,
        .host_free = fake_free,
        .stream_sync = fake_sync,
    },
    .later_op = NULL,
};
