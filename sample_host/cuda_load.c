/*
 * cuda_load.c — finding, checking and opening libsample_cuda.so (sh_cuda.h). The
 * library is only dlopened, so sample_host itself never needs CUDA to link or run.
 */
#include "sh_cuda.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Candidate path i (0: $SH_CUDA_LIB, 1: beside the executable, 2: $PT_BUILD, 3: the
 * bare name for the loader path); 0 when candidate i does not apply. */
static int candidate(int i, char *out, size_t n) {
    const char *e;
    switch (i) {
    case 0:
        e = getenv("SH_CUDA_LIB");
        return e && *e && snprintf(out, n, "%s", e) < (int)n;
    case 1: {
        char exe[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (k <= 0) return 0;
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (!slash) return 0;
        *slash = '\0';
        return snprintf(out, n, "%s/%s", exe, SH_CUDA_LIB) < (int)n && exists(out);
    }
    case 2:
        e = getenv("PT_BUILD");
        return e && *e && snprintf(out, n, "%s/%s", e, SH_CUDA_LIB) < (int)n && exists(out);
    case 3:
        return snprintf(out, n, "%s", SH_CUDA_LIB) < (int)n;
    }
    return 0;
}

int sh_cuda_load(sh_cuda *c, int device, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    char path[512];
    const char *why = "not found";
    int forced = getenv("SH_CUDA_LIB") && *getenv("SH_CUDA_LIB");
    for (int i = 0; i < 4 && !c->dl; i++) {
        if (!candidate(i, path, sizeof path)) continue;
        c->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!c->dl) {
            const char *d = dlerror();
            why = d ? d : "dlopen failed";
            /* a library that exists but cannot load (a missing libcublas, say) is the
             * answer; do not hide it behind a later "not found" */
            if (forced || (i < 3 && exists(path))) break;
        }
    }
    if (!c->dl) {
        snprintf(err, errlen, "--device cuda needs %s, which could not be loaded (%s); "
                              "build it with nvcc (make) or use --device cpu",
                 SH_CUDA_LIB, why);
        return -1;
    }
    snprintf(c->path, sizeof c->path, "%s", path);
    const sh_cuda_api *api = (const sh_cuda_api *)dlsym(c->dl, SH_CUDA_SYMBOL);
    if (!api || api->version != SH_CUDA_VERSION || api->struct_size < sizeof *api) {
        snprintf(err, errlen, "%s is not a matching sample_host CUDA library (symbol %s %s); "
                              "rebuild it with this sample_host",
                 c->path, SH_CUDA_SYMBOL,
                 api ? "has another version or size" : "missing");
        sh_cuda_unload(c);
        return -1;
    }
    char oerr[384] = "";
    if (api->open(device, &c->ctx, oerr, sizeof oerr) != 0) {
        snprintf(err, errlen, "--device cuda: %s", oerr[0] ? oerr : "the CUDA device did not open");
        c->ctx = NULL;
        sh_cuda_unload(c);
        return -1;
    }
    c->api = api;
    c->ops = api->layers;
    c->ops.ctx = c->ctx;
    return 0;
}

void sh_cuda_unload(sh_cuda *c) {
    if (c->api && c->ctx) c->api->close(c->ctx);
    /* The handle is not dlclosed: the library carries a static CUDA runtime whose exit
     * handlers must still find their code at process exit. */
    memset(c, 0, sizeof *c);
}
