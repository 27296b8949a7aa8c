/*
 * multi.c — test plugin exporting two majors: a v2 table (unknown to a v1 host)
 * and a valid v1 table. A v1 host must skip v2 and load v1.
 */
#include "protrain.h"

static const char *multi_last_error(void *ctx) {
    (void)ctx;
    return "multi-test";
}
static int32_t multi_finalize(void *ctx) {
    (void)ctx;
    return PT_OK;
}

typedef struct fake_v2 {
    uint32_t abi_version;
    uint32_t struct_size;
    const char *name;
    void *hooks[40];
} fake_v2;

const fake_v2 protrain_plugin_v2 = {
    .abi_version = 2,
    .struct_size = sizeof(fake_v2),
    .name = "multi-test-v2",
};

const pt_plugin_v1 protrain_plugin_v1 = {
    .abi_version = 1,
    .struct_size = sizeof(pt_plugin_v1),
    .name = "multi-test-v1",
    .version = "0.0.1",
    .last_error = multi_last_error,
    .finalize = multi_finalize,
};
