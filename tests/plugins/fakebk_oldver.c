/*
 * fakebk_oldver.c — fake cuda backend library: exports this build's symbol name
 * (PT_CUDA_BACKEND_SYMBOL) but its table's head says version 0, as a library
 * whose name and contents disagree would. pt_gpu_open must refuse it before
 * calling any op; open reports itself so a test can tell if it ran.
 */
#include <stdio.h>

#include "gpu.h"
#include "protrain.h"

static int fake_open(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen) {
    (void)cfg;
    if (impl) *impl = NULL;
    if (err && errlen) snprintf(err, errlen, "fakebk_oldver: open was called");
    return PT_ERR_BACKEND;
}

const pt_gpu_backend pt_gpu_backend_cuda_v1 = {
    .abi_version = 0,
    .struct_size = sizeof(pt_gpu_backend),
    .name = "fake-oldver",
    .open = fake_open,
};
