/*
 * tiny.c — test plugin: the table claims a full struct_size, but the exported
 * object is only the 8-byte header plus name (a plugin that lies about its size).
 * The loader must refuse it from the ELF symbol size instead of reading past it.
 */
#include <stdint.h>

/* protrain.h declares protrain_plugin_v1 with the full table type, and this file
 * must define that symbol with a smaller one: rename the header's declaration out
 * of the way (only sizeof(pt_plugin_v1) is needed from it). */
#define protrain_plugin_v1 pt_tiny_unused_declaration
#include "protrain.h"
#undef protrain_plugin_v1

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
