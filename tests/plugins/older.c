/* older.c — test plugin from the past: exports only protrain_plugin_v0. */
#include <stdint.h>

typedef struct fake_v0 {
    uint32_t abi_version;
    uint32_t struct_size;
    const char *name;
    void *hooks[8];
} fake_v0;

const fake_v0 protrain_plugin_v0 = {
    .abi_version = 0,
    .struct_size = sizeof(fake_v0),
    .name = "older-test",
};
