/*
 * fakebk_openfail.c — fake cuda backend library that passes every version check
 * (right symbol, version and struct_size) and whose open fails with its own
 * sentence, as the real library does on a machine without a GPU. pt_gpu_open must
 * call open and pass the sentence through.
 */
#include <stdio.h>

#include "gpu.h"
#include "protrain.h"

static int fake_open(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen) {
    (void)cfg;
    if (impl) *impl = NULL;
    if (err && errlen) snprintf(err, errlen, "fakebk_openfail: no device behind this fake");
    return PT_ERR_BACKEND;
}

const pt_gpu_backend pt_gpu_backend_cuda_v1 = {
    .abi_version = PT_GPU_BACKEND_VERSION,
    .struct_size = sizeof(pt_gpu_backend),
    .name = "fake-openfail",
    .open = fake_open,
};
