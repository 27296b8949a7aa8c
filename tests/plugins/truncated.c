/*
 * truncated.c — test plugin: struct_size stops just before finalize, so the
 * mandatory core (every hook through finalize) is incomplete.
 */
#include <stddef.h>

#include "protrain.h"

const pt_plugin_v1 protrain_plugin_v1 = {
    .abi_version = 1,
    .struct_size = (uint32_t)offsetof(pt_plugin_v1, finalize),
    .name = "truncated-test",
};
