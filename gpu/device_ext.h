/*
 * device_ext.h — extras of the device wrapper (gpu/device.c) beyond gpu.h:
 * checked frees, leak counting, fragmentation figures, a log hook, opening a
 * given backend library.
 *
 * Allocator facts callers and the planner may rely on:
 *  - One backend reservation of `capacity` bytes is made at pt_gpu_open; every
 *    pt_gpu_alloc is carved from it (best fit, lowest address on ties, split
 *    remainders >= 256 bytes, neighbours coalesced on free). Fragmentation is
 *    therefore real and the same on every backend.
 *  - Every block is a multiple of PT_GPU_ALIGN bytes and starts on a multiple of
 *    it. Accounting (current/peak/per tag) counts these rounded footprints, which
 *    is what capacity is spent on; pt_gpu_alloc_size returns the requested size.
 *    A 0-byte request gets a distinct PT_GPU_ALIGN-byte block (like malloc(0)).
 *  - Fresh blocks are NOT zeroed (like cudaMalloc): callers memset what they need.
 *    With cfg.poison, a block is filled with 0xFF bytes (NaN in fp32/bf16/fp16)
 *    synchronously inside pt_gpu_free, before it can be handed out again.
 *  - pt_gpu_free does not wait for in-flight stream work on the block (like a
 *    caching allocator, unlike cudaFree): sync the streams that use it first.
 *  - usage.n_allocs counts successful pt_gpu_alloc calls since open.
 *  - cfg.fail_alloc_at = N fails the N-th pt_gpu_alloc call (1-based, counting
 *    every call, failed ones included) with PT_ERR_OOM, once.
 */
#ifndef PT_DEVICE_EXT_H
#define PT_DEVICE_EXT_H

#include <stddef.h>
#include <stdint.h>

#include "gpu.h"

#define PT_GPU_ALIGN 256u

/* Footprint pt_gpu_alloc charges for a request of `bytes` (0 -> PT_GPU_ALIGN). */
uint64_t pt_gpu_round_size(uint64_t bytes);

/* pt_gpu_free that reports a pointer that is not a live allocation (never
 * allocated here, freed twice, interior pointer) as PT_ERR_INVALID_ARG with one
 * sentence, and changes nothing. NULL is a no-op returning 0. */
int pt_gpu_free_checked(pt_gpu *g, void *p, char *err, size_t errlen);

/* The host's own allocations (dev_alloc): pt_gpu_alloc with the block marked
 * as the host's. pt_gpu_free_host frees only such a block, given by its start
 * (s NULL: at once, else stream-ordered like pt_gpu_free_on_stream); any other
 * address (the plugin's parameter storage or arena, an interior pointer, a
 * freed block) is PT_ERR_INVALID_ARG with a sentence saying what it is, and
 * nothing changes. */
int pt_gpu_alloc_host(pt_gpu *g, size_t bytes, int tag, void **p, char *err, size_t errlen);
int pt_gpu_free_host(pt_gpu *g, void *p, pt_stream *s, char *err, size_t errlen);

/* 1 when the host may copy `bytes` at device address p: [p, p + bytes) lies
 * inside the requested bytes of one live block that is the host's or one the
 * plugin hands the host (parameters, gradients, arenas, scratch). Else 0 and
 * `why` completes "the destination %p ..." (not device memory; the plugin's
 * optimizer state; runs past the end of its block, with how many bytes fit). */
int pt_gpu_host_range(const pt_gpu *g, const void *p, size_t bytes, char *why, size_t whylen);

/* Stream-ordered free (see device.c): the bytes are free for the allocator at
 * once; the poison fill (when on) is queued on s behind the work that uses them. */
int pt_gpu_free_on_stream(pt_gpu *g, void *p, pt_stream *s, char *err, size_t errlen);

/* pt_gpu_memcpy with one sentence in err on failure naming the op that failed
 * (the copy, or the wait for it) and the backend's status as the return code. */
int pt_gpu_memcpy_sync(pt_gpu *g, void *dst, const void *src, size_t bytes, int kind, char *err,
                       size_t errlen);

/* The host's native compute stream (pt_host_v1.compute_stream) as a pt_stream
 * the plugin records events on and makes wait, without owning it (never
 * destroy it). Only backends with native streams (cuda: a cudaStream_t) take
 * one; the host backend refuses with a sentence. */
int pt_gpu_adopt_stream(pt_gpu *g, void *native, pt_stream **s, char *err, size_t errlen);

/* An event whose elapsed time can be read (the backend's event_create_timing;
 * event_create where a backend has none). Ordering events come from
 * ops->event_create, which on cuda are untimed and wait without spinning. */
int pt_gpu_event_create_timing(pt_gpu *g, pt_event **e);

/* Reserve one pinned arena of `bytes` (rounded up to PT_GPU_ALIGN) that later
 * pt_gpu_pinned_alloc calls are carved from; their frees return blocks to it
 * without a driver call (on cuda, cudaFreeHost waits for the whole device). An
 * allocation the arena cannot hold gets its own backend allocation, counted in
 * usage.pinned_own_allocs. Reserving again replaces the arena (only while
 * nothing in it is live: else PT_ERR_INVALID_ARG); 0 drops it. The arena must
 * fit the pinned budget (PT_ERR_HOST_OOM otherwise, nothing changed). */
int pt_gpu_pinned_reserve(pt_gpu *g, size_t bytes, char *err, size_t errlen);

/* Device allocations still live (finalize tests assert 0 before pt_gpu_close). */
size_t pt_gpu_live_allocs(const pt_gpu *g);
/* Pinned allocations still live. */
size_t pt_gpu_live_pinned(const pt_gpu *g);

/* 1 when [p, p + bytes) lies inside the device's reservation (every allocation
 * pt_gpu_alloc hands out lies there), 0 otherwise: ordinary host memory given
 * where a device address belongs. */
int pt_gpu_in_device(const pt_gpu *g, const void *p, size_t bytes);

/* Measuring a setup that does not fit. Between begin and end, a recorded
 * allocation (not pt_gpu_try_alloc) that finds no room within the capacity
 * is placed in an overflow range instead of failing, and counted in the usage
 * as usual; pt_gpu_measure_end returns the device size the allocations since
 * open needed (the highest end offset, the overflow range counted as lying
 * right after the capacity), or 0 when nothing overflowed. Only where the
 * backend can give address space beyond the device (the simulated device:
 * begin returns 1); elsewhere begin returns 0 and allocations fail as always.
 * Overflow blocks stay valid until freed. */
int pt_gpu_measure_begin(pt_gpu *g);
uint64_t pt_gpu_measure_end(pt_gpu *g);
/* 1 between a pt_gpu_measure_begin that returned 1 and pt_gpu_measure_end. */
int pt_gpu_measuring(const pt_gpu *g);

/* What the last failed device allocation wanted: the capacity it would have
 * needed (bytes in use then + its rounded size) and the bytes in use per tag at
 * that moment. 0 when no allocation has failed since open. */
uint64_t pt_gpu_last_oom(const pt_gpu *g, uint64_t tag_current[PT_TAG_COUNT]);
/* pt_gpu_alloc for a buffer the caller can do without (a timing buffer): a
 * request that does not fit fails the same way but leaves the record of the
 * last out-of-memory (pt_gpu_last_oom) as it was, so a later, unrelated
 * failure is not explained by it. */
int pt_gpu_try_alloc(pt_gpu *g, size_t bytes, int tag, void **p, char *err, size_t errlen);
/* Forget the last failure, so a later pt_gpu_last_oom speaks of a new one only. */
void pt_gpu_oom_reset(pt_gpu *g);

/* The fragmentation factor of a usage reading: span_peak / peak, the device
 * range the allocation pattern needed over the bytes it had in use at its peak
 * (1 = the live blocks were packed without holes; a device of capacity
 * factor * peak runs the same pattern). Rounding is not in it: peak already
 * counts rounded blocks. 1.0 for a NULL usage or a zero peak. */
double pt_gpu_frag_factor(const pt_gpu_usage *u);

/* Fragmentation figures: the largest free extent and the number of free extents. */
uint64_t pt_gpu_largest_free(const pt_gpu *g);
size_t pt_gpu_free_extents(const pt_gpu *g);

/* Where pt_gpu_close reports leaks, and where the backend reports failed driver
 * calls (level: pt_log_level). NULL fn = stderr. May be called from any thread. */
void pt_gpu_set_log(pt_gpu *g, pt_gpu_log_fn fn, void *user);

/*
 * pt_gpu_open, with the cuda backend library taken from `lib` (passed to dlopen
 * as given: a path with a '/' names that file, a bare name goes through the
 * loader path) instead of the default search. lib NULL is the default search
 * (beside the file this code is linked into, then the loader path), so
 * pt_gpu_open(kind, ...) is pt_gpu_open_lib(kind, NULL, ...). kind "host" never
 * loads a library. Tests use it to load fake backend libraries.
 *
 * The library must export PT_CUDA_BACKEND_SYMBOL with abi_version ==
 * PT_GPU_BACKEND_VERSION and struct_size >= sizeof(pt_gpu_backend); otherwise it
 * is refused with PT_ERR_BACKEND and one sentence naming the library's version
 * and this build's (a library with only the unversioned symbol counts as
 * version 0). Like a missing library or a failed backend open, a refusal makes
 * "auto" fall back to the host backend; "cuda" returns it.
 */
int pt_gpu_open_lib(const char *kind, const char *lib, const pt_gpu_config *cfg, pt_gpu **out,
                    char *err, size_t errlen);

/* When "auto" fell back to the host backend: the sentence saying why cuda did
 * not open (missing, refused or failed library). "" otherwise. Valid until
 * pt_gpu_close. */
const char *pt_gpu_fallback_reason(const pt_gpu *g);

#endif /* PT_DEVICE_EXT_H */
