/*
 * newer.c — test plugin from the future: exports only protrain_plugin_v2, whose
 * table starts with the same {abi_version, struct_size} header as every version.
 */
#include <stdint.h>

typedef struct fake_v2 {
    uint32_t abi_version;
    uint32_t struct_size;
    const char *name;
    void *hooks[40];
} fake_v2;

const fake_v2 protrain_plugin_v2 = {
    .abi_version = 2,
    .struct_size = sizeof(fake_v2),
    .name = "newer-test",
};
