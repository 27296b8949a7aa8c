/*
 * tiny.c — test plugin: the table claims a full struct_size, but the exported
 * object is only the 8-byte header plus name (a plugin that lies about its size).
 * The loader must refuse it from the ELF symbol size instead of reading past it.
 */
#include <stdint.h>

#include "protrain.h"

typedef struct tiny_head {
    uint32_t abi_version;
    uint32_t struct_size;
    const char *name;
} tiny_head;

const tiny_head protrain_plugin_v1 = {
    .abi_version = 1,
    .struct_size = sizeof(pt_plugin_v1),
    .name = "tiny-test",
};
