/* The allocator torch.cuda.memory.CUDAPluggableAllocator loads: every CUDA
 * allocation of torch goes to the plugin's dev_alloc, every free to its
 * dev_free, so the plugin's capacity, peak and plan count torch's bytes too.
 *
 * torch calls alloc(size, device, stream) and free(ptr, size, device, stream);
 * the plugin serves one device, set with pt_torch_alloc_set, so a request for
 * another device is refused (NULL). A failed allocation returns NULL, which
 * torch reports as an out-of-memory error; a failed free cannot be reported
 * through torch's void free, so it is counted (pt_torch_alloc_failures). The
 * plugin's own sentence stays in its last_error. torch may allocate from
 * several threads (autograd's device threads); the mutex serialises them. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef int32_t (*alloc_fn)(void *ctx, uint64_t bytes, const char *tag, void **ptr);
typedef int32_t (*free_fn)(void *ctx, void *ptr);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_ctx;
static alloc_fn g_alloc;
static free_fn g_free;
static int g_device = -1;
static uint64_t g_failures;

/* ctx NULL unsets the hooks: every later request is refused. */
void pt_torch_alloc_set(void *ctx, alloc_fn a, free_fn f, int device) {
    pthread_mutex_lock(&mu);
    g_ctx = ctx;
    g_alloc = ctx ? a : NULL;
    g_free = ctx ? f : NULL;
    g_device = device;
    pthread_mutex_unlock(&mu);
}

uint64_t pt_torch_alloc_failures(void) {
    pthread_mutex_lock(&mu);
    uint64_t n = g_failures;
    pthread_mutex_unlock(&mu);
    return n;
}

void *pt_torch_alloc(size_t size, int device, void *stream) {
    (void)stream; /* the plugin orders its own work against the host's stream */
    void *p = NULL;
    if (size == 0) return NULL; /* nothing to count; torch keeps no bytes */
    pthread_mutex_lock(&mu);
    if (!g_alloc || device != g_device || g_alloc(g_ctx, (uint64_t)size, "torch", &p) != 0) {
        p = NULL;
        g_failures++;
    }
    pthread_mutex_unlock(&mu);
    return p;
}

void pt_torch_free(void *ptr, size_t size, int device, void *stream) {
    (void)size;
    (void)stream;
    if (!ptr) return;
    pthread_mutex_lock(&mu);
    if (!g_free || device != g_device || g_free(g_ctx, ptr) != 0) g_failures++;
    pthread_mutex_unlock(&mu);
}
