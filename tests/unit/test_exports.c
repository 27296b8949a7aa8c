/*
 * test_exports.c — the shared objects export exactly their ABI symbol.
 *
 * The ELF dynamic symbol table is parsed here directly (elf.h): section headers
 * -> the SHT_DYNSYM section -> its linked string table; an "export" is a symbol
 * with GLOBAL, WEAK or GNU_UNIQUE binding and st_shndx != SHN_UNDEF (imports are
 * undefined and ignored). Checks:
 *  - the parser itself on test plugins with known exports;
 *  - $PT_BUILD/protrain_plugin.so exports only protrain_plugin_v1, and its table
 *    loads with abi_version 1, struct_size sizeof(pt_plugin_v1), name "protrain",
 *    PT_HAS_HOOK true for every hook (the OSFT kernels included);
 *  - $PT_BUILD/libprotrain_cuda.so (when built) exports only pt_gpu_backend_cuda_v1
 *    (PT_CUDA_BACKEND_SYMBOL), whose head says abi_version PT_GPU_BACKEND_VERSION
 *    and struct_size sizeof(pt_gpu_backend); it names itself "cuda", fills every
 *    op, and open() either fails with "no CUDA device: ..." (no crash) on a
 *    machine without a GPU, or succeeds and then every op runs once against the
 *    host bodies of kernels_hd.h.
 */
#include <elf.h>
#include <math.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <dlfcn.h>

#include "gpu.h"
#include "kernels_hd.h"
#include "protrain.h"

#define MAX_EXPORTS 64
#define NAME_LEN 128

typedef struct exports {
    int n;
    char name[MAX_EXPORTS][NAME_LEN];
} exports;

static char g_build[1024];

static int setup_all(void **state) {
    (void)state;
    const char *b = getenv("PT_BUILD");
    if (!b || !b[0] || strlen(b) >= sizeof g_build) {
        fprintf(stderr, "test_exports: PT_BUILD is not set or too long (run through `make test`)\n");
        return -1;
    }
    strcpy(g_build, b);
    return 0;
}

static int in_bounds(uint64_t off, uint64_t len, size_t size) {
    return off <= size && len <= size - off;
}

/* List the defined exported symbols of an ELF64 little-endian shared object.
 * Returns 0, or -1 with a sentence in err. Every offset is bounds-checked so a
 * malformed file fails instead of crashing the test. */
static int list_exports(const char *path, exports *ex, char *err, size_t errlen) {
    memset(ex, 0, sizeof *ex);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = sz > 0 ? malloc((size_t)sz) : NULL;
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        free(buf);
        snprintf(err, errlen, "cannot read %s (%ld bytes)", path, sz);
        return -1;
    }
    fclose(f);
    size_t size = (size_t)sz;
    int rc = -1;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)buf;
    if (size < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 ||
        eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != ELFDATA2LSB) {
        snprintf(err, errlen, "%s is not an ELF64 little-endian file", path);
        goto out;
    }
    if (eh->e_shentsize != sizeof(Elf64_Shdr) ||
        !in_bounds(eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr), size)) {
        snprintf(err, errlen, "%s: section header table out of bounds", path);
        goto out;
    }
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(buf + eh->e_shoff);
    const Elf64_Shdr *dynsym = NULL;
    for (unsigned i = 0; i < eh->e_shnum; i++)
        if (sh[i].sh_type == SHT_DYNSYM) dynsym = &sh[i];
    if (!dynsym) {
        snprintf(err, errlen, "%s has no .dynsym section", path);
        goto out;
    }
    if (dynsym->sh_link >= eh->e_shnum || dynsym->sh_entsize != sizeof(Elf64_Sym) ||
        !in_bounds(dynsym->sh_offset, dynsym->sh_size, size)) {
        snprintf(err, errlen, "%s: malformed .dynsym", path);
        goto out;
    }
    const Elf64_Shdr *strs = &sh[dynsym->sh_link];
    if (!in_bounds(strs->sh_offset, strs->sh_size, size) || strs->sh_size == 0) {
        snprintf(err, errlen, "%s: malformed .dynstr", path);
        goto out;
    }
    const char *str = (const char *)buf + strs->sh_offset;
    const Elf64_Sym *sym = (const Elf64_Sym *)(buf + dynsym->sh_offset);
    size_t nsym = dynsym->sh_size / sizeof(Elf64_Sym);
    for (size_t i = 1; i < nsym; i++) {   /* entry 0 is the reserved null symbol */
        int bind = ELF64_ST_BIND(sym[i].st_info);
        if (sym[i].st_shndx == SHN_UNDEF) continue;
        if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) continue;
        if (sym[i].st_name >= strs->sh_size ||
            !memchr(str + sym[i].st_name, '\0', strs->sh_size - sym[i].st_name)) {
            snprintf(err, errlen, "%s: symbol %zu has a bad name offset", path, i);
            goto out;
        }
        if (ex->n == MAX_EXPORTS) {
            snprintf(err, errlen, "%s exports more than %d symbols", path, MAX_EXPORTS);
            goto out;
        }
        snprintf(ex->name[ex->n++], NAME_LEN, "%s", str + sym[i].st_name);
    }
    rc = 0;
out:
    free(buf);
    return rc;
}

static int has_export(const exports *ex, const char *name) {
    for (int i = 0; i < ex->n; i++)
        if (strcmp(ex->name[i], name) == 0) return 1;
    return 0;
}

/* Fail unless `name` is the only export of `path`, listing the extras if not. */
static void assert_only_export(const char *path, const char *name) {
    exports ex;
    char err[512];
    if (list_exports(path, &ex, err, sizeof err) != 0) fail_msg("%s", err);
    if (ex.n == 1 && strcmp(ex.name[0], name) == 0) return;
    char all[2048] = "";
    for (int i = 0; i < ex.n; i++) {
        strncat(all, " ", sizeof all - strlen(all) - 1);
        strncat(all, ex.name[i], sizeof all - strlen(all) - 1);
    }
    fail_msg("%s must export only %s; it exports %d symbol(s):%s", path, name, ex.n, all);
}

static void test_parser_on_known_plugins(void **state) {
    (void)state;
    char path[PATH_MAX], err[512];
    exports ex;
    snprintf(path, sizeof path, "%s/tests/plugins/multi.so", g_build);
    if (list_exports(path, &ex, err, sizeof err) != 0) fail_msg("%s", err);
    assert_true(has_export(&ex, "protrain_plugin_v1"));
    assert_true(has_export(&ex, "protrain_plugin_v2"));
    assert_false(has_export(&ex, "multi_last_error"));     /* static: not exported */

    snprintf(path, sizeof path, "%s/tests/plugins/nosym.so", g_build);
    if (list_exports(path, &ex, err, sizeof err) != 0) fail_msg("%s", err);
    assert_true(has_export(&ex, "pt_test_nosym_answer"));
    assert_false(has_export(&ex, "protrain_plugin_v1"));

    /* undef.so imports pt_test_nowhere_defined: undefined symbols are not exports. */
    snprintf(path, sizeof path, "%s/tests/plugins/undef.so", g_build);
    if (list_exports(path, &ex, err, sizeof err) != 0) fail_msg("%s", err);
    assert_true(has_export(&ex, "protrain_plugin_v1"));
    assert_false(has_export(&ex, "pt_test_nowhere_defined"));

    /* Not ELF: a clear error, no crash. */
    char src[PATH_MAX];
    snprintf(src, sizeof src, "%s/tests/unit/test_exports.c",
             getenv("PT_ROOT") ? getenv("PT_ROOT") : ".");
    assert_int_equal(list_exports(src, &ex, err, sizeof err), -1);
    assert_non_null(strstr(err, "not an ELF64"));
}

static void test_plugin_exports(void **state) {
    (void)state;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/protrain_plugin.so", g_build);
    if (access(path, R_OK) != 0)
        fail_msg("%s does not exist: build the plugin first (make)", path);
    assert_only_export(path, PT_PLUGIN_SYMBOL);

    pt_loaded_plugin p;
    char err[1024];
    if (pt_plugin_load(path, &p, err, sizeof err) != PT_OK) fail_msg("loading %s: %s", path, err);
    const pt_plugin_v1 *t = p.table;
    assert_int_equal(p.abi_version, 1);
    assert_int_equal(t->abi_version, 1);
    assert_int_equal(t->struct_size, sizeof(pt_plugin_v1));
    assert_non_null(t->name);
    assert_string_equal(t->name, "protrain");
    assert_non_null(t->version);
    assert_true(strlen(t->version) > 0);
    /* The mandatory core (init through finalize) is implemented. */
    assert_true(PT_HAS_HOOK(t, init));
    assert_true(PT_HAS_HOOK(t, last_error));
    assert_true(PT_HAS_HOOK(t, post_model_load));
    assert_true(PT_HAS_HOOK(t, create_optimizer));
    assert_true(PT_HAS_HOOK(t, pre_step));
    assert_true(PT_HAS_HOOK(t, block_pre_forward));
    assert_true(PT_HAS_HOOK(t, block_post_forward));
    assert_true(PT_HAS_HOOK(t, block_pre_backward));
    assert_true(PT_HAS_HOOK(t, block_post_backward));
    assert_true(PT_HAS_HOOK(t, optimizer_step));
    assert_true(PT_HAS_HOOK(t, post_step));
    assert_true(PT_HAS_HOOK(t, finalize));
    /* Every other hook this build implements. */
    assert_true(PT_HAS_HOOK(t, dev_alloc));
    assert_true(PT_HAS_HOOK(t, dev_free));
    assert_true(PT_HAS_HOOK(t, activation_arena));
    assert_true(PT_HAS_HOOK(t, activation_arena_get));
    assert_true(PT_HAS_HOOK(t, memcpy));
    assert_true(PT_HAS_HOOK(t, get_stats));
    assert_true(PT_HAS_HOOK(t, read_param));
    assert_true(PT_HAS_HOOK(t, save_state));
    assert_true(PT_HAS_HOOK(t, load_state));
    assert_true(PT_HAS_HOOK(t, set_lr));
    assert_true(PT_HAS_HOOK(t, launch));
    assert_true(PT_HAS_HOOK(t, stream_sync));
    /* OSFT's factorised linear layer (ABI 1.4 reports the targets in stats) */
    assert_true(PT_HAS_HOOK(t, osft_linear_forward));
    assert_true(PT_HAS_HOOK(t, osft_linear_backward));
    /* TiledMLP is built (ABI 1.2 adds its scratch hook) */
    assert_true(PT_HAS_HOOK(t, tiled_mlp_forward));
    assert_true(PT_HAS_HOOK(t, tiled_mlp_backward));
    assert_true(PT_HAS_HOOK(t, tiled_mlp_scratch));
    /* data parallel (ABI 1.3): the host's loss summed over the ranks */
    assert_true(PT_HAS_HOOK(t, dist_allreduce));
    /* the host's gradient clipping (ABI 1.6) */
    assert_true(PT_HAS_HOOK(t, clip_grad_norm));
    /* ABI 1.6: a failed step dropped; another batch shape planned */
    assert_true(PT_HAS_HOOK(t, discard_step));
    assert_true(PT_HAS_HOOK(t, replan));
    assert_true(PT_HAS_HOOK(t, dist_abort));   /* ABI 1.6: a rank that stops tells the others */
    assert_true(PT_HAS_HOOK(t, write_param));  /* ABI 1.6, appended */
    /* The list above is every slot (no reserved slot is left): count the
     * non-NULL ones through the last field so a hook added to the table later
     * has to be added here too. */
    int present = 0;
    for (const void *const *h = (const void *const *)&t->init;
         h <= (const void *const *)&t->write_param; h++)
        present += *h != NULL;
    assert_int_equal(present, 35);
    assert_non_null(t->last_error(NULL));   /* "never NULL; ctx may be NULL" */
    pt_plugin_unload(&p);
}

static void set_flag(void *arg) { *(volatile int *)arg = 1; }

/* Only on a machine with a GPU: every op once, results against the host bodies of
 * kernels_hd.h. n is not a multiple of the block size so the tails are covered. */
static void cuda_smoke(const pt_gpu_backend *be, void *impl) {
    enum { N = 10007 };
    static float x[N], y[N], p[N], g[N], m[N], v[N], got[N];
    static uint16_t h16[N], got16[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)((i % 97) - 48) * 0.03125f + 0.001f * (float)(i % 7);
        p[i] = 0.5f - 0.0001f * (float)i;
        g[i] = (float)((i * 37) % 101 - 50) * 0.01f;
        m[i] = 0.01f * (float)(i % 5);
        v[i] = 0.001f * (float)(i % 3);
    }
    const size_t fb = sizeof(float) * N;
    float *dx, *dp, *dg, *dm, *dv;
    double *dout;
    uint16_t *d16;
    assert_int_equal(be->dev_alloc(impl, fb, (void **)&dx), 0);
    assert_int_equal(be->dev_alloc(impl, fb, (void **)&dp), 0);
    assert_int_equal(be->dev_alloc(impl, fb, (void **)&dg), 0);
    assert_int_equal(be->dev_alloc(impl, fb, (void **)&dm), 0);
    assert_int_equal(be->dev_alloc(impl, fb, (void **)&dv), 0);
    assert_int_equal(be->dev_alloc(impl, sizeof(double), (void **)&dout), 0);
    assert_int_equal(be->dev_alloc(impl, sizeof(uint16_t) * N, (void **)&d16), 0);
    assert_int_equal(be->memcpy_async(impl, dx, x, fb, PT_GPU_H2D, NULL), 0);

    /* sqnorm: double partial sums in a different order than the host's sequential
     * double sum; 1e-12 relative covers double rounding over ~1e4 positive terms. */
    double ref = 0;
    for (int i = 0; i < N; i++) ref += (double)x[i] * x[i];
    double out = -1;
    assert_int_equal(be->memset_async(impl, dout, 0, sizeof(double), NULL), 0);
    assert_int_equal(be->sqnorm(impl, dx, PT_F32, N, dout, NULL), 0);
    assert_int_equal(be->memcpy_async(impl, &out, dout, sizeof out, PT_GPU_D2H, NULL), 0);
    assert_true(fabs(out - ref) <= 1e-12 * ref);

    /* fp32 -> bf16 is bit-identical to the host body. */
    assert_int_equal(be->convert(impl, d16, PT_BF16, dx, PT_F32, N, 0, NULL), 0);
    assert_int_equal(be->memcpy_async(impl, got16, d16, sizeof(uint16_t) * N, PT_GPU_D2H, NULL), 0);
    for (int i = 0; i < N; i++) h16[i] = pt_f32_to_bf16(x[i]);
    assert_memory_equal(got16, h16, sizeof h16);
    /* accumulate: x += bf16(x), one fp32 add per element, so exact. */
    assert_int_equal(be->convert(impl, dx, PT_F32, d16, PT_BF16, N, 1, NULL), 0);
    assert_int_equal(be->memcpy_async(impl, got, dx, fb, PT_GPU_D2H, NULL), 0);
    for (int i = 0; i < N; i++) y[i] = x[i] + pt_bf16_to_f32(h16[i]);
    assert_memory_equal(got, y, fb);

    /* AdamW step, param_out as f16. nvcc contracts mul+add into FMA, so allow a
     * few ulp (2e-6 relative) against the host body. */
    assert_int_equal(be->memcpy_async(impl, dp, p, fb, PT_GPU_H2D, NULL), 0);
    assert_int_equal(be->memcpy_async(impl, dg, g, fb, PT_GPU_H2D, NULL), 0);
    assert_int_equal(be->memcpy_async(impl, dm, m, fb, PT_GPU_H2D, NULL), 0);
    assert_int_equal(be->memcpy_async(impl, dv, v, fb, PT_GPU_H2D, NULL), 0);
    float bc1, bc2r;
    pt_adamw_bias(0.9f, 0.999f, 3, &bc1, &bc2r);
    pt_adamw_args a = {.param = dp, .grad = dg, .m = dm, .v = dv, .param_out = d16,
                       .out_dtype = PT_F16, .n = N, .lr = 1e-3f, .beta1 = 0.9f,
                       .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f, .bc1 = bc1,
                       .bc2_rsqrt = bc2r, .grad_scale = 0.5f};
    assert_int_equal(be->adamw(impl, &a, NULL), 0);
    assert_int_equal(be->memcpy_async(impl, got, dp, fb, PT_GPU_D2H, NULL), 0);
    pt_adamw_consts c = pt_adamw_make_consts(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, bc1,
                                             bc2r, a.grad_scale);
    for (int i = 0; i < N; i++) {
        float want = pt_adamw_elem(&c, p[i], g[i], &m[i], &v[i]);
        if (fabsf(got[i] - want) > 2e-6f * fabsf(want) + 1e-9f)
            fail_msg("adamw[%d]: gpu %.9g host %.9g", i, got[i], want);
    }

    /* Streams, events, host functions, pinned memory. */
    pt_stream *s = NULL;
    pt_event *e0 = NULL, *e1 = NULL;
    float *pin = NULL;
    volatile int flag = 0;
    float ms = -1;
    assert_int_equal(be->stream_create(impl, &s), 0);
    assert_int_equal(be->event_create(impl, &e0), 0);
    assert_int_equal(be->event_create(impl, &e1), 0);
    assert_int_equal(be->host_alloc(impl, fb, (void **)&pin), 0);
    assert_int_equal(be->event_record(impl, e0, s), 0);
    assert_int_equal(be->memcpy_async(impl, pin, dp, fb, PT_GPU_D2H, s), 0);
    assert_int_equal(be->host_fn(impl, s, set_flag, (void *)&flag), 0);
    assert_int_equal(be->event_record(impl, e1, s), 0);
    assert_int_equal(be->stream_wait_event(impl, NULL, e1), 0);
    assert_int_equal(be->event_sync(impl, e1), 0);
    assert_int_equal(be->event_query(impl, e1), 1);
    assert_int_equal(be->stream_sync(impl, s), 0);
    assert_int_equal(flag, 1);
    assert_memory_equal(pin, got, fb);
    assert_int_equal(be->event_elapsed_ms(impl, e0, e1, &ms), 0);
    assert_true(ms >= 0.0f);
    be->host_free(impl, pin, fb);
    be->event_destroy(impl, e0);
    be->event_destroy(impl, e1);
    be->stream_destroy(impl, s);
    be->dev_free(impl, dx, fb);
    be->dev_free(impl, dp, fb);
    be->dev_free(impl, dg, fb);
    be->dev_free(impl, dm, fb);
    be->dev_free(impl, dv, fb);
    be->dev_free(impl, dout, sizeof(float));
    be->dev_free(impl, d16, sizeof(uint16_t) * N);
}

static void test_cuda_backend_exports(void **state) {
    (void)state;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", g_build, PT_CUDA_BACKEND_LIB);
    if (access(path, R_OK) != 0) {
        printf("note: %s not built (no nvcc, or a sanitizer build); skipping its checks\n", path);
        skip();
    }
    assert_only_export(path, PT_CUDA_BACKEND_SYMBOL);

    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) fail_msg("cannot dlopen %s: %s", path, dlerror());
    const pt_gpu_backend *be = dlsym(dl, PT_CUDA_BACKEND_SYMBOL);
    assert_non_null(be);
    assert_int_equal(be->abi_version, PT_GPU_BACKEND_VERSION);
    assert_int_equal(be->struct_size, sizeof(pt_gpu_backend));
    assert_string_equal(be->name, "cuda");
    /* The symbol name carries the same version as the head. */
    char want[64];
    snprintf(want, sizeof want, "%s_v%u", PT_CUDA_BACKEND_SYMBOL_STEM, PT_GPU_BACKEND_VERSION);
    assert_string_equal(PT_CUDA_BACKEND_SYMBOL, want);
    /* Every op is implemented. */
#define OP(f) if (!be->f) fail_msg(PT_CUDA_BACKEND_SYMBOL "." #f " is NULL")
    OP(open); OP(close); OP(set_log); OP(device_name); OP(total_memory);
    OP(dev_alloc); OP(dev_free); OP(host_alloc); OP(host_free);
    OP(stream_create); OP(stream_destroy); OP(stream_sync);
    OP(event_create); OP(event_destroy); OP(event_record); OP(stream_wait_event);
    OP(event_sync); OP(event_query); OP(event_elapsed_ms);
    OP(memset_async); OP(memcpy_async); OP(host_fn);
    OP(adamw); OP(sqnorm); OP(convert);
#undef OP

    pt_gpu_config cfg = {0};
    void *impl = NULL;
    char err[512] = "";
    int rc = be->open(&cfg, &impl, err, sizeof err);
    if (rc == 0) {
        /* A machine with a GPU: the basics answer sensibly. */
        char name[256] = "";
        be->device_name(impl, name, sizeof name);
        assert_true(strlen(name) > 0);
        assert_true(be->total_memory(impl) > 0);
        cuda_smoke(be, impl);
        be->close(impl);
        printf("note: cuda backend opened %s\n", name);
    } else {
        assert_null(impl);
        if (strncmp(err, "no CUDA device: ", 16) != 0) fail_msg("unexpected open error: %s", err);
        assert_true(strlen(err) > 16);   /* the CUDA error text follows */
        printf("note: cuda backend open failed as expected here: %s\n", err);
    }
    /* A device index past the count fails cleanly too. */
    cfg.device_index = 1 << 20;
    impl = NULL;
    assert_int_not_equal(be->open(&cfg, &impl, err, sizeof err), 0);
    assert_null(impl);
    assert_true(strlen(err) > 0);
    dlclose(dl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parser_on_known_plugins),
        cmocka_unit_test(test_plugin_exports),
        cmocka_unit_test(test_cuda_backend_exports),
    };
    return cmocka_run_group_tests(tests, setup_all, NULL);
}
