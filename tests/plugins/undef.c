/*
 * undef.c — test plugin that references a function nothing defines. It links
 * (shared objects may have undefined symbols) but dlopen(RTLD_NOW) fails, which
 * the loader must report as "cannot load plugin" with dlerror's text.
 */
#include "protrain.h"

int32_t pt_test_nowhere_defined(void *ctx);

static int32_t undef_finalize(void *ctx) { return pt_test_nowhere_defined(ctx); }

const pt_plugin_v1 protrain_plugin_v1 = {
    .abi_version = 1,
    .struct_size = sizeof(pt_plugin_v1),
    .name = "undef-test",
    .finalize = undef_finalize,
};
