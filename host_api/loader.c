/*
 * loader.c — host-side plugin loader (pt_plugin_load / pt_plugin_unload).
 *
 * Linked into the host (with util.c, for pt_fail), never into the plugin. Steps:
 *  1. Resolve `spec`: "none" -> no plugin; a path (contains '/' or ends in
 *     ".so") -> dlopen as given; a short name -> beside the running executable
 *     ("<exe dir>/<name>_plugin.so", "<exe dir>/lib<name>.so"), then through the
 *     dynamic loader path ("lib<name>.so", "<name>_plugin.so").
 *  2. Find the table: dlsym "protrain_plugin_v<N>" for every version this host
 *     has an adapter for, newest first. Each adapter validates the table it found
 *     and fills a private, zero-filled pt_plugin_v1 (the newest shape), so
 *     host code only ever sees one table layout and never reads past a short one.
 *  3. If no supported symbol exists, probe neighbouring versions to say why:
 *     ABI too new, too old, or not a protrain plugin at all.
 *
 * Status codes (pt_status): PT_ERR_INVALID_ARG bad arguments; PT_ERR_IO file not
 * found or dlopen failed; PT_ERR_FORMAT not a plugin / truncated table;
 * PT_ERR_UNSUPPORTED ABI version outside [PT_ABI_MIN_VERSION, PT_ABI_VERSION];
 * PT_ERR_HOST_OOM when the private table copy cannot be allocated.
 */
/* dladdr1 and RTLD_DL_SYMENT are GNU extensions of <dlfcn.h>. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "protrain.h"
#include "pt_util.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How far past PT_ABI_VERSION we probe to tell "too new" from "not a plugin". */
#define ABI_PROBE_AHEAD 16u

/* Mandatory core of a v1 table: every field up to and including finalize. */
#define V1_CORE_BYTES (offsetof(pt_plugin_v1, finalize) + sizeof(void *))

/* Adapter: validate the table behind `sym` (exported as protrain_plugin_v<ver>)
 * and fill `dst` (zero-filled by the caller). Returns 0 or a pt_status. */
typedef int (*adapt_fn)(const void *sym, uint32_t ver, uint32_t sym_bytes, const char *path,
                        pt_plugin_v1 *dst, char *err, size_t errlen);

typedef struct abi_entry {
    uint32_t version;
    const char *symbol;
    adapt_fn adapt;
} abi_entry;

/* The version numbers this host understands, as "v1..v1". */
static void host_range(char *buf, size_t len) {
    snprintf(buf, len, "v%u..v%u", (unsigned)PT_ABI_MIN_VERSION, (unsigned)PT_ABI_VERSION);
}

/* Shared check for a table whose symbol says `ver`: the abi_version field must agree. */
static int check_version_field(uint32_t field, uint32_t ver, const char *path, char *err,
                               size_t errlen) {
    if (field == ver) return 0;
    char range[32];
    host_range(range, sizeof range);
    if (field > ver)
        return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                       "plugin ABI too new: %s exports protrain_plugin_v%u but its table says "
                       "abi_version %u, this host speaks %s",
                       path, (unsigned)ver, (unsigned)field, range);
    return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                   "plugin ABI too old: %s exports protrain_plugin_v%u but its table says "
                   "abi_version %u, this host needs >= v%u",
                   path, (unsigned)ver, (unsigned)field, (unsigned)PT_ABI_MIN_VERSION);
}

/* v1 -> v1: validate, then copy min(struct_size, sizeof) bytes into the zeroed dst.
 * struct_size in the copy is clamped to what the copy holds, so PT_HAS_HOOK on the
 * copy agrees with what was copied (hooks past the plugin's struct_size read NULL). */
static int adapt_v1(const void *sym, uint32_t ver, uint32_t sym_bytes, const char *path,
                    pt_plugin_v1 *dst, char *err, size_t errlen) {
    const pt_plugin_v1 *t = (const pt_plugin_v1 *)sym;
    /* The ELF symbol size (when the plugin's object recorded one) bounds how many
     * bytes really exist behind the symbol; never read past it. */
    const size_t head = offsetof(pt_plugin_v1, name);   /* abi_version, struct_size */
    if (sym_bytes != 0 && sym_bytes < head)
        return pt_fail(err, errlen, PT_ERR_FORMAT,
                       "plugin table truncated: the symbol protrain_plugin_v%u in %s is only %u "
                       "bytes, need at least %zu",
                       (unsigned)ver, path, (unsigned)sym_bytes, (size_t)V1_CORE_BYTES);
    int rc = check_version_field(t->abi_version, ver, path, err, errlen);
    if (rc) return rc;
    if (t->struct_size < V1_CORE_BYTES)
        return pt_fail(err, errlen, PT_ERR_FORMAT,
                       "plugin table truncated: struct_size %u bytes, need at least %zu "
                       "(every hook through finalize) in %s",
                       (unsigned)t->struct_size, (size_t)V1_CORE_BYTES, path);
    size_t n = t->struct_size < sizeof *dst ? t->struct_size : sizeof *dst;
    if (sym_bytes != 0 && sym_bytes < n)
        return pt_fail(err, errlen, PT_ERR_FORMAT,
                       "plugin table truncated: struct_size says %u bytes but the symbol "
                       "protrain_plugin_v%u in %s is only %u bytes",
                       (unsigned)t->struct_size, (unsigned)ver, path, (unsigned)sym_bytes);
    memcpy(dst, t, n);
    dst->struct_size = (uint32_t)n;
    return 0;
}

/* Versions this host accepts, newest first. A future v2 host adds
 * {2, "protrain_plugin_v2", adapt_v2} at the top and keeps adapt_v1 to wrap old
 * plugins into the v2 shape (new hooks NULL); a v0 adapter would go at the end.
 * Every entry's version must lie in [PT_ABI_MIN_VERSION, PT_ABI_VERSION]. */
static const abi_entry k_abi[] = {
    {1u, "protrain_plugin_v1", adapt_v1},
};
#define N_ABI (sizeof k_abi / sizeof k_abi[0])

/* Size in bytes of the ELF symbol at addr, 0 if unknown. */
static uint32_t symbol_bytes(const void *addr) {
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (!dladdr1(addr, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym) return 0;
    if (info.dli_saddr != addr) return 0;
    return sym->st_size > UINT32_MAX ? UINT32_MAX : (uint32_t)sym->st_size;
}

static const void *find_sym(void *dl, const char *name) {
    dlerror();                      /* clear any stale error */
    void *p = dlsym(dl, name);
    if (dlerror() != NULL) return NULL;
    return p;
}

static const void *find_version(void *dl, uint32_t v) {
    char name[48];
    snprintf(name, sizeof name, "protrain_plugin_v%u", (unsigned)v);
    return find_sym(dl, name);
}

/* No supported symbol: explain why. Newer versions are probed newest first so the
 * message names the newest one the plugin speaks. */
static int explain_missing(void *dl, const char *path, char *err, size_t errlen) {
    char range[32];
    host_range(range, sizeof range);
    for (uint32_t v = PT_ABI_VERSION + ABI_PROBE_AHEAD; v > PT_ABI_VERSION; v--) {
        if (find_version(dl, v))
            return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                           "plugin ABI too new: %s speaks protrain ABI v%u, this host speaks %s",
                           path, (unsigned)v, range);
    }
    for (uint32_t v = PT_ABI_MIN_VERSION; v-- > 0;) {
        if (find_version(dl, v))
            return pt_fail(err, errlen, PT_ERR_UNSUPPORTED,
                           "plugin ABI too old: %s speaks protrain ABI v%u, this host needs >= v%u",
                           path, (unsigned)v, (unsigned)PT_ABI_MIN_VERSION);
    }
    return pt_fail(err, errlen, PT_ERR_FORMAT,
                   "not a protrain plugin: %s exports no protrain_plugin_v* symbol", path);
}

static int is_path_spec(const char *spec) {
    size_t n = strlen(spec);
    return strchr(spec, '/') != NULL || (n >= 3 && strcmp(spec + n - 3, ".so") == 0);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Directory of the running executable (no trailing slash), or "" if unknown. */
static void exe_dir(char *buf, size_t len) {
    char tmp[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", tmp, sizeof tmp - 1);
    buf[0] = '\0';
    if (n <= 0) return;
    tmp[n] = '\0';
    char *slash = strrchr(tmp, '/');
    if (!slash) return;
    *slash = '\0';
    if (strlen(tmp) < len) strcpy(buf, tmp);
}

/* dlerror() text says ENOENT this way in glibc; any other dlopen failure (bad ELF,
 * missing dependency, undefined symbol) is "cannot load", not "not found". */
static int dl_not_found(const char *msg) {
    return msg && strstr(msg, "No such file or directory") != NULL &&
           strstr(msg, "cannot open shared object file") != NULL;
}

/* Copy a path into out[len]; a path that does not fit is an error, never truncated. */
static int copy_path(char *out, size_t len, const char *p, char *err, size_t errlen) {
    size_t n = strlen(p);
    if (n >= len)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "plugin path too long: %zu bytes, the limit is %zu: %.64s...", n, len - 1,
                       p);
    memcpy(out, p, n + 1);
    return 0;
}

/* The file a handle opened through the loader path actually came from. */
static int handle_path(void *dl, const char *fallback, char *out, size_t len, char *err,
                       size_t errlen) {
    struct link_map *lm = NULL;
    const char *p = fallback;
    if (dlinfo(dl, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0]) p = lm->l_name;
    return copy_path(out, len, p, err, errlen);
}

/* dlopen `file`; on failure write the right sentence and return NULL. `missing` is
 * set when the file does not exist (as opposed to existing but failing to load). */
static void *open_file(const char *file, int *missing, char *err, size_t errlen) {
    *missing = 0;
    void *dl = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (dl) return dl;
    const char *msg = dlerror();
    if ((strchr(file, '/') && !file_exists(file)) || (!strchr(file, '/') && dl_not_found(msg))) {
        *missing = 1;
        /* dlopen never looks in the current directory for a name without '/'. */
        if (!strchr(file, '/') && file_exists(file))
            pt_fail(err, errlen, PT_ERR_IO,
                    "plugin file not found: %s on the loader path (a file of that name is in "
                    "the current directory: pass ./%s)",
                    file, file);
        else
            pt_fail(err, errlen, PT_ERR_IO, "plugin file not found: %s", file);
    } else {
        pt_fail(err, errlen, PT_ERR_IO, "cannot load plugin %s: %s", file,
                msg ? msg : "unknown dlopen error");
    }
    return NULL;
}

/* A path spec: dlopen as given. One without '/' ("libx.so") is searched on the
 * loader path by dlopen itself; record the file it came from. */
static int open_path(const char *spec, void **dl, char *path, size_t pathlen, char *err,
                     size_t errlen) {
    int missing, rc;
    if ((rc = copy_path(path, pathlen, spec, err, errlen))) return rc;
    if (!(*dl = open_file(spec, &missing, err, errlen))) return PT_ERR_IO;
    if (!strchr(spec, '/') && (rc = handle_path(*dl, spec, path, pathlen, err, errlen))) {
        dlclose(*dl);
        *dl = NULL;
        return rc;
    }
    return 0;
}

/* One directory of the short-name search: NAME_plugin.so, then libNAME.so in dir.
 * Returns 1 when a candidate exists there (*rc: 0 loaded, or the error of loading
 * it), 0 when neither file is there. */
static int try_dir(const char *dir, const char *name, void **dl, char *path, size_t pathlen,
                   char *err, size_t errlen, int *rc) {
    static const char *const forms[] = {"%s/%s_plugin.so", "%s/lib%s.so"};
    char cand[PATH_MAX + 64];
    int missing;
    for (size_t i = 0; dir[0] && i < 2; i++) {
        int n = snprintf(cand, sizeof cand, forms[i], dir, name);
        if (n < 0 || (size_t)n >= sizeof cand || !file_exists(cand)) continue;
        if ((*rc = copy_path(path, pathlen, cand, err, errlen))) return 1;
        *rc = (*dl = open_file(cand, &missing, err, errlen)) ? 0 : PT_ERR_IO;
        return 1;
    }
    return 0;
}

/* Short name, searched in this order (protrain.h):
 *   1. each directory of $PROTRAIN_PLUGIN_PATH (colon-separated), so a user can
 *      point any host at another build without touching its command line;
 *   2. the directory of the host executable (a build tree, a bundled install);
 *   3. the library directory the loader was installed into (PT_INSTALL_LIBDIR,
 *      compiled in by `make install`), so an installed host needs no setup;
 *   4. the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache): libNAME.so, then
 *      NAME_plugin.so.
 * A candidate that exists but fails to load stops the search (report that, do not
 * mask it with another file). */
static int open_short(const char *name, void **dl, char *path, size_t pathlen, char *err,
                      size_t errlen) {
    char dir[PATH_MAX];
    char cand[PATH_MAX + 64];
    int missing, rc = 0;
    *dl = NULL;
    const char *env = getenv("PROTRAIN_PLUGIN_PATH");
    for (const char *p = env; p && *p;) {
        size_t len = strcspn(p, ":");
        if (len > 0 && len < sizeof dir) {
            memcpy(dir, p, len);
            dir[len] = '\0';
            if (try_dir(dir, name, dl, path, pathlen, err, errlen, &rc)) return rc;
        }
        p += len;
        if (*p == ':') p++;
    }
    exe_dir(dir, sizeof dir);
    if (try_dir(dir, name, dl, path, pathlen, err, errlen, &rc)) return rc;
#ifdef PT_INSTALL_LIBDIR
    if (try_dir(PT_INSTALL_LIBDIR, name, dl, path, pathlen, err, errlen, &rc)) return rc;
#define PT_LIBDIR_NOTE ", " PT_INSTALL_LIBDIR
#else
#define PT_LIBDIR_NOTE ""
#endif
    static const char *const onpath[] = {"lib%s.so", "%s_plugin.so"};
    for (size_t i = 0; i < 2; i++) {
        int n = snprintf(cand, sizeof cand, onpath[i], name);
        if (n < 0 || (size_t)n >= sizeof cand) continue;
        if ((*dl = open_file(cand, &missing, err, errlen))) {
            if ((rc = handle_path(*dl, cand, path, pathlen, err, errlen))) {
                dlclose(*dl);
                *dl = NULL;
            }
            return rc;
        }
        if (!missing) return PT_ERR_IO;
    }
    return pt_fail(err, errlen, PT_ERR_IO,
                   "plugin file not found: %s (looked for %s_plugin.so and lib%s.so in "
                   "$PROTRAIN_PLUGIN_PATH%s%s, beside the executable (%s)" PT_LIBDIR_NOTE
                   ", then on the loader path)",
                   name, name, name, env && *env ? " = " : " (unset)", env && *env ? env : "",
                   dir[0] ? dir : "unknown");
}

int pt_plugin_load(const char *spec, pt_loaded_plugin *out, char *err, uint64_t errlen64) {
    size_t errlen = errlen64 > SIZE_MAX ? SIZE_MAX : (size_t)errlen64;
    if (err && errlen) err[0] = '\0';
    if (!out) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "pt_plugin_load: out is NULL");
    memset(out, 0, sizeof *out);
    if (!spec || !spec[0])
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG,
                       "pt_plugin_load: empty plugin spec (give a path, a short name or \"none\")");
    if (strcmp(spec, "none") == 0) return PT_OK;

    char path[sizeof out->path];
    void *dl = NULL;
    int rc = is_path_spec(spec) ? open_path(spec, &dl, path, sizeof path, err, errlen)
                                : open_short(spec, &dl, path, sizeof path, err, errlen);
    if (rc) return rc;

    pt_plugin_v1 *copy = calloc(1, sizeof *copy);
    if (!copy) {
        dlclose(dl);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "pt_plugin_load: cannot allocate %zu bytes for the table copy",
                       sizeof *copy);
    }
    for (size_t i = 0; i < N_ABI; i++) {
        const void *sym = find_sym(dl, k_abi[i].symbol);
        if (!sym) continue;
        rc = k_abi[i].adapt(sym, k_abi[i].version, symbol_bytes(sym), path, copy, err, errlen);
        if (rc) {
            free(copy);
            dlclose(dl);
            return rc;
        }
        out->dl = dl;
        out->table = copy;
        out->abi_version = k_abi[i].version;
        memcpy(out->path, path, strlen(path) + 1);
        return PT_OK;
    }
    free(copy);
    rc = explain_missing(dl, path, err, errlen);
    dlclose(dl);
    return rc;
}

void pt_plugin_unload(pt_loaded_plugin *p) {
    if (!p) return;
    /* table points at our private calloc'd copy, never into the plugin. */
    free((void *)p->table);
    if (p->dl) dlclose(p->dl);
    memset(p, 0, sizeof *p);
}
