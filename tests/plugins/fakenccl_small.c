/*
 * fakenccl_small.c — fake NCCL transport library whose version-1 table is
 * shorter than this build's (built from other sources): refused before any op
 * is read.
 */
#include <stdint.h>

typedef struct fake_small {
    uint32_t abi_version;
    uint32_t struct_size;
    void *ops[2];
} fake_small;

const fake_small pt_nccl_coll_v1 = {.abi_version = 1, .struct_size = sizeof(fake_small)};
