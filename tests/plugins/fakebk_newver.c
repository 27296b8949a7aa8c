/*
 * fakebk_newver.c — fake cuda backend library from a later build: it exports
 * only the version-2 symbol, with a head saying version 2. A version-1 plugin
 * must refuse it as too new, naming both versions.
 */
#include <stdint.h>

typedef struct fake_v2 {
    uint32_t abi_version;
    uint32_t struct_size;
    const char *name;
    void *ops[40];
} fake_v2;

const fake_v2 pt_gpu_backend_cuda_v2 = {
    .abi_version = 2,
    .struct_size = sizeof(fake_v2),
    .name = "fake-newver",
};
