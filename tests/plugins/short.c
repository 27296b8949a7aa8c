/*
 * short.c — test plugin: a valid table whose struct_size covers exactly the
 * mandatory core (through finalize). The object itself is a full v1 struct with
 * dev_alloc set, so a test can check that the loader's copy hides every hook
 * past struct_size (PT_HAS_HOOK false, pointer NULL).
 */
#include <stddef.h>

#include "protrain.h"

static const char *short_last_error(void *ctx) {
    (void)ctx;
    return "short-test";
}
static int32_t short_finalize(void *ctx) {
    (void)ctx;
    return PT_OK;
}
static int32_t short_dev_alloc(void *ctx, uint64_t b, const char *tag, void **p) {
    (void)ctx;
    (void)b;
    (void)tag;
    (void)p;
    return PT_ERR_INTERNAL;
}

const pt_plugin_v1 protrain_plugin_v1 = {
    .abi_version = 1,
    .struct_size = (uint32_t)(offsetof(pt_plugin_v1, finalize) + sizeof(void *)),
    .name = "short-test",
    .version = "0.0.1",
    .last_error = short_last_error,
    .finalize = short_finalize,
    .dev_alloc = short_dev_alloc,   /* past struct_size: must read as absent */
};
