/*
 * fakebk_small.c — fake cuda backend library: the right symbol and version, but
 * struct_size stops before the last op (convert), as a library compiled from a
 * header with fewer ops would. pt_gpu_open must refuse it: the ops past
 * struct_size are not there to call.
 */
#include <stddef.h>
#include <stdio.h>

#include "gpu.h"
#include "protrain.h"

static int fake_open(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen) {
    (void)cfg;
    if (impl) *impl = NULL;
    if (err && errlen) snprintf(err, errlen, "fakebk_small: open was called");
    return PT_ERR_BACKEND;
}

const pt_gpu_backend pt_gpu_backend_cuda_v1 = {
    .abi_version = PT_GPU_BACKEND_VERSION,
    .struct_size = (uint32_t)offsetof(pt_gpu_backend, convert),
    .name = "fake-small",
    .open = fake_open,
};
