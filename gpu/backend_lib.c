/*
 * backend_lib.c — finding, loading and version-checking the cuda backend
 * library (libprotrain_cuda.so) for the device wrapper. A table is taken only
 * when the library exports this build's versioned symbol and its head
 * (abi_version, struct_size, the symbol's own size) vouches for every op this
 * build reads; otherwise one sentence says which version it has and what to use.
 */
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "device_internal.h"
#include "pt_util.h"
#include "protrain.h"

/* ---- the cuda backend library ---- */

/* How far past this build's version a library is probed, to tell "too new" from
 * "not a cuda backend". */
#define BACKEND_PROBE_AHEAD 16u

static const char self_anchor = 0; /* dladdr on this finds the file we were linked into */

static const void *find_sym(void *h, const char *name) {
    dlerror(); /* clear a stale error so the check below sees only this lookup's */
    void *p = dlsym(h, name);
    return dlerror() ? NULL : p;
}

static const void *find_version(void *h, uint32_t v) {
    char name[64];
    snprintf(name, sizeof name, "%s_v%u", PT_CUDA_BACKEND_SYMBOL_STEM, (unsigned)v);
    return find_sym(h, name);
}

/* Bytes the library's object file gives the symbol at addr; 0 when it says nothing.
 * A table may not claim more than this. */
static size_t symbol_bytes(const void *addr) {
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (!dladdr1(addr, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym) return 0;
    if (info.dli_saddr != addr) return 0;
    return (size_t)sym->st_size;
}

/* The library has no table of this build's version: say which version it has. */
static int explain_missing(void *h, const char *path, char *err, size_t errlen) {
    for (uint32_t v = PT_GPU_BACKEND_VERSION + BACKEND_PROBE_AHEAD; v > PT_GPU_BACKEND_VERSION; v--)
        if (find_version(h, v))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "cuda backend library %s is too new: it exports %s_v%u (backend "
                           "table version %u) but this plugin speaks version %u; use the "
                           "%s built with this plugin",
                           path, PT_CUDA_BACKEND_SYMBOL_STEM, (unsigned)v, (unsigned)v,
                           (unsigned)PT_GPU_BACKEND_VERSION, PT_CUDA_BACKEND_LIB);
    for (uint32_t v = PT_GPU_BACKEND_VERSION; v-- > 0;)
        if (find_version(h, v))
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "cuda backend library %s is too old: it exports %s_v%u (backend "
                           "table version %u) but this plugin speaks version %u; use the "
                           "%s built with this plugin",
                           path, PT_CUDA_BACKEND_SYMBOL_STEM, (unsigned)v, (unsigned)v,
                           (unsigned)PT_GPU_BACKEND_VERSION, PT_CUDA_BACKEND_LIB);
    if (find_sym(h, PT_CUDA_BACKEND_SYMBOL_STEM))
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s is too old: it exports only the unversioned "
                       "%s (backend table version 0, from before tables were versioned) but "
                       "this plugin speaks version %u; use the %s built with this plugin",
                       path, PT_CUDA_BACKEND_SYMBOL_STEM, (unsigned)PT_GPU_BACKEND_VERSION,
                       PT_CUDA_BACKEND_LIB);
    return pt_fail(err, errlen, PT_ERR_BACKEND,
                   "cuda backend library %s does not export %s (nor any other version of it): "
                   "it is not a protrain cuda backend",
                   path, PT_CUDA_BACKEND_SYMBOL);
}

/* Take this build's table from an opened library, or say why it is refused.
 * Nothing past the 8-byte head is read before struct_size (and the symbol's size,
 * when known) vouch for it. */
static int take_table(void *h, const char *path, const pt_gpu_backend **ops, char *err,
                      size_t errlen) {
    const pt_gpu_backend *b = find_sym(h, PT_CUDA_BACKEND_SYMBOL);
    if (!b) return explain_missing(h, path, err, errlen);
    const size_t head = offsetof(pt_gpu_backend, name), need = sizeof *b;
    size_t bytes = symbol_bytes(b);
    if (bytes && bytes < head)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s: its %s is only %zu bytes, too short for a "
                       "backend table of any version (this plugin speaks version %u)",
                       path, PT_CUDA_BACKEND_SYMBOL, bytes, (unsigned)PT_GPU_BACKEND_VERSION);
    if (b->abi_version != PT_GPU_BACKEND_VERSION)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s exports %s but its table says version %u, and "
                       "this plugin speaks version %u; use the %s built with this plugin",
                       path, PT_CUDA_BACKEND_SYMBOL, (unsigned)b->abi_version,
                       (unsigned)PT_GPU_BACKEND_VERSION, PT_CUDA_BACKEND_LIB);
    if (b->struct_size < need)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s: its version %u table is %u bytes, smaller than "
                       "this plugin's version %u table of %zu bytes, so it was built from other "
                       "sources; use the %s built with this plugin",
                       path, (unsigned)b->abi_version, (unsigned)b->struct_size,
                       (unsigned)PT_GPU_BACKEND_VERSION, need, PT_CUDA_BACKEND_LIB);
    if (bytes && bytes < need)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s: its version %u table says %u bytes but the "
                       "symbol %s holds only %zu, less than this plugin's version %u table of "
                       "%zu bytes",
                       path, (unsigned)b->abi_version, (unsigned)b->struct_size,
                       PT_CUDA_BACKEND_SYMBOL, bytes, (unsigned)PT_GPU_BACKEND_VERSION, need);
    if (!b->name || !b->open)
        return pt_fail(err, errlen, PT_ERR_BACKEND,
                       "cuda backend library %s: its version %u table has no %s", path,
                       (unsigned)b->abi_version, !b->name ? "name" : "open op");
    *ops = b;
    return PT_OK;
}

/* Load the cuda backend library: `lib` as given, or (lib NULL) the default search,
 * beside the file this code was linked into, then the loader path. */
int pt_gpu_load_cuda(const char *lib, const pt_gpu_backend **ops, void **dl, char *err,
                     size_t errlen) {
    char path[4096] = "";
    void *h = NULL;
    if (lib) {
        snprintf(path, sizeof path, "%s", lib);
        h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = dlerror();
            return pt_fail(err, errlen, PT_ERR_BACKEND,
                           "cuda backend library %s failed to load: %s", lib,
                           e ? e : "unknown dlopen error");
        }
    } else {
        Dl_info di;
        if (dladdr(&self_anchor, &di) && di.dli_fname) {
            const char *slash = strrchr(di.dli_fname, '/');
            if (slash) {
                snprintf(path, sizeof path, "%.*s/%s", (int)(slash - di.dli_fname), di.dli_fname,
                         PT_CUDA_BACKEND_LIB);
                if (access(path, F_OK) == 0) {
                    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
                    if (!h) {
                        const char *e = dlerror();
                        return pt_fail(err, errlen, PT_ERR_BACKEND,
                                       "cuda backend library %s exists but failed to load: %s",
                                       path, e ? e : "unknown dlopen error");
                    }
                }
            }
        }
        if (!h) {
            h = dlopen(PT_CUDA_BACKEND_LIB, RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                const char *e = dlerror();
                return pt_fail(err, errlen, PT_ERR_BACKEND,
                               "cuda backend library %s not found (tried %s, then the loader "
                               "path: %s)",
                               PT_CUDA_BACKEND_LIB, path[0] ? path : "beside the plugin",
                               e ? e : "no detail");
            }
            snprintf(path, sizeof path, "%s", PT_CUDA_BACKEND_LIB);
        }
    }
    int rc = take_table(h, path, ops, err, errlen);
    if (rc != PT_OK) {
        dlclose(h);
        return rc;
    }
    *dl = h;
    return PT_OK;
}
