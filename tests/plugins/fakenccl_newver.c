/*
 * fakenccl_newver.c — fake NCCL transport library from a later build: it
 * exports only pt_nccl_coll_v2. A version-1 plugin must refuse it, naming both
 * versions.
 */
#include <stdint.h>

typedef struct fake_v2 {
    uint32_t abi_version;
    uint32_t struct_size;
    void *ops[16];
} fake_v2;

const fake_v2 pt_nccl_coll_v2 = {.abi_version = 2, .struct_size = sizeof(fake_v2)};
