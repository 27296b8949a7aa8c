/* mismatch.c — test plugin: symbol protrain_plugin_v1 but the table says abi_version 2. */
#include "protrain.h"

const pt_plugin_v1 protrain_plugin_v1 = {
    .abi_version = 2,
    .struct_size = sizeof(pt_plugin_v1),
    .name = "mismatch-test",
};
