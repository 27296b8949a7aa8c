/*
 * fakebk_unversioned.c — fake cuda backend library from before the backend table
 * was versioned: it exports only the bare pt_gpu_backend_cuda, whose table starts
 * with the name (no abi_version / struct_size head). pt_gpu_open must refuse it
 * as version 0 without reading it as a versioned table.
 */
typedef struct fake_v0 {
    const char *name;
    void *ops[26];
} fake_v0;

const fake_v0 pt_gpu_backend_cuda = {
    .name = "cuda",
};
