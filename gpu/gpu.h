/*
 * gpu.h — the one device interface runtime/ and plugin/ use. Never includes
 * CUDA, NCCL or MPI headers.
 *
 * Two layers:
 *  - pt_gpu_backend: a vtable of raw operations implemented by a backend
 *    (gpu/host/: the simulated device; gpu/cuda/: libprotrain_cuda.so, dlopened).
 *  - pt_gpu: the device object runtime code holds. Its pt_gpu_* functions add what
 *    every backend shares: capacity enforcement, exact accounting (current/peak,
 *    per tag), error strings naming bytes needed vs available.
 *
 * Streams and events have CUDA semantics: work on one stream runs in FIFO order;
 * event_record captures the work queued so far on a stream; stream_wait_event
 * makes later work on a stream wait for it; event_sync blocks the caller.
 * Pointers returned by dev_alloc are device addresses. On the host backend they
 * are ordinary addressable memory (which is what lets the C sample host compute
 * on them); on cuda they are not.
 */
#ifndef PT_GPU_H
#define PT_GPU_H

#include <stddef.h>
#include <stdint.h>

typedef struct pt_stream pt_stream;   /* opaque, backend-defined */
typedef struct pt_event pt_event;     /* opaque, backend-defined */

/* Accounting tags: fixed set so peak breakdowns are cheap. */
typedef enum pt_mem_tag {
    PT_TAG_PARAM = 0,     /* persistent params (compute dtype) */
    PT_TAG_GRAD = 1,      /* persistent grads */
    PT_TAG_OPTIM = 2,     /* device optimizer state (fp32 master, m, v) */
    PT_TAG_BUFFER = 3,    /* chunk buffer pool slots */
    PT_TAG_ACT = 4,       /* activation arenas */
    PT_TAG_SCRATCH = 5,   /* host scratch / workspace */
    PT_TAG_HOSTUSE = 6,   /* other host allocations via dev_alloc (inputs, logits) */
    PT_TAG_OTHER = 7,     /* plugin internals */
    PT_TAG_COUNT = 8
} pt_mem_tag;

const char *pt_mem_tag_name(int tag);
int pt_mem_tag_parse(const char *s); /* free text -> tag (unknown -> PT_TAG_HOSTUSE) */

typedef enum pt_gpu_copy { PT_GPU_H2D = 0,
                           PT_GPU_D2H = 1,
                           PT_GPU_D2D = 2,
                           PT_GPU_H2H = 3 } pt_gpu_copy;

/* Configuration a backend is opened with (from the INI [memory] / [host_backend]). */
/* The throttle's accepted rates. Below 1 MB/s a step's copies take hours (a
 * 2-step run looks hung); far above any link the seconds per copy underflow.
 * Both ends are refused with the value rather than run. */
#define PT_GPU_COPY_BW_MIN 1e6
#define PT_GPU_COPY_BW_MAX 1e15

typedef struct pt_gpu_config {
    int device_index;
    uint64_t capacity;          /* device bytes; 0 = backend's total (cuda) or 1 GiB (host) */
    uint64_t pinned_budget;     /* pinned host bytes; 0 = unlimited */
    double copy_bandwidth;      /* host backend: bytes/s per copy stream, 0 = unthrottled,
                                   else in [PT_GPU_COPY_BW_MIN, PT_GPU_COPY_BW_MAX] */
    int poison;                 /* host backend: poison freed device memory with NaN */
    int poison_native;          /* the same on a real device (cuda): a memset per free */
    int fail_alloc_at;          /* host backend: fail the Nth device alloc (1-based), 0 = never */
    double compute_jitter_s;    /* host backend: host_fn work first sleeps up to this, 0 = none */
    uint64_t jitter_seed;       /* host backend: seed of those delays */
    /* host backend: fail the fail_op_at-th call (1-based, once) of op fail_op
     * (pt_gpu_op) with PT_ERR_BACKEND; PT_GPU_OP_NONE or 0 = never. Appended
     * last: a backend built against the older layout reads only the prefix. */
    int fail_op;
    int fail_op_at;
    /* host backend: write every op's stream, kind, size and start/end times
     * here when the backend closes (host_trace.c); "" = off. Appended last. */
    char trace_file[512];
} pt_gpu_config;

/* The backend ops failure injection can target (pt_gpu_config.fail_op); the
 * names are the op names of pt_gpu_backend, which is also what error sentences
 * of the runtime call them. */
typedef enum pt_gpu_op {
    PT_GPU_OP_NONE = 0,
    PT_GPU_OP_MEMSET,            /* memset_async */
    PT_GPU_OP_MEMCPY,            /* memcpy_async (pt_gpu_memcpy / _async) */
    PT_GPU_OP_EVENT_SYNC,
    PT_GPU_OP_STREAM_SYNC,
    PT_GPU_OP_CONVERT,
    PT_GPU_OP_ADAMW,
    PT_GPU_OP_SQNORM,
    PT_GPU_OP_EVENT_RECORD,
    PT_GPU_OP_STREAM_WAIT_EVENT,
    PT_GPU_OP_EVENT_CREATE,      /* event_create and event_create_timing */
    PT_GPU_OP_EVENT_ELAPSED_MS,
    PT_GPU_OP_HOST_FN,
    PT_GPU_OP_EIGH,
    PT_GPU_OP_REKLS_EW,
    PT_GPU_OP_COUNT
} pt_gpu_op;

/* "memset", "event_sync", ...; "none" for PT_GPU_OP_NONE, "invalid" out of range. */
const char *pt_gpu_op_name(int op);
/* Parses a failure-injection spec "<op>:<n>" (op a pt_gpu_op_name, n >= 1), or
 * "" / "none" (no injection: *op = PT_GPU_OP_NONE, *at = 0). 0, or -1 with one
 * sentence in why saying what is expected. */
int pt_gpu_fail_op_parse(const char *spec, int *op, int *at, char *why, size_t whylen);

/* fp32 AdamW over a flat range; the element body is pt_adamw_elem (gpu/kernels_hd.h). */
typedef struct pt_adamw_args {
    float *param;               /* [n] fp32 master (or the param itself for fp32 params) */
    const float *grad;          /* [n] */
    float *m, *v;               /* [n] moments */
    void *param_out;            /* [n] compute-dtype copy to write, or NULL */
    int out_dtype;              /* pt_dtype of param_out */
    size_t n;
    float lr, beta1, beta2, eps, weight_decay;
    float bc1;                  /* 1 - beta1^t */
    float bc2_rsqrt;            /* 1 / sqrt(1 - beta2^t) */
    float grad_scale;           /* multiply grads by this first (clipping, averaging) */
} pt_adamw_args;

/* fp32 matrix product on row-major matrices, C = alpha * op(A) op(B) + beta * C,
 * op(X) = X or X^T: op(A) is m x k, op(B) is k x n, C is m x n; lda, ldb, ldc are
 * the row strides (elements) of A, B, C as stored. beta = 0 overwrites C (NaN in C
 * is not propagated). OpenBLAS on the host backend, cuBLAS on cuda. */
typedef struct pt_gemm_args {
    int trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    const float *a;
    int64_t lda;
    const float *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
} pt_gemm_args;

/* Row-major x (rows x cols, row stride ld) against a per-column vector s[cols]:
 *  PT_COLS_SCALE: out[i][j] = x[i][j] * s[j] (out may be x);
 *  PT_COLS_DOT:   acc[j] += sum over i ascending of x[i][j] * y[i][j], the sum
 *                 formed in fp32 in that order (pt_coldot_step, kernels_hd.h), so
 *                 both backends give the same bits. */
enum { PT_COLS_SCALE = 0,
       PT_COLS_DOT = 1 };
typedef struct pt_cols_args {
    int op;
    int64_t rows, cols, ld;
    const float *x, *y, *s;
    float *out, *acc;
} pt_cols_args;

/* Thin SVD of a row-major fp32 matrix a (m x n, device memory, destroyed), r =
 * min(m, n): u (m x r row-major), s[r] descending, vt (r x n row-major), a = u
 * diag(s) vt. LAPACKE sgesdd on the host backend, cuSOLVER gesvd on cuda. */
typedef struct pt_svd_args {
    int64_t m, n;
    float *a, *u, *s, *vt;
    int32_t *info;    /* device int: 0 when the SVD converged, else the solver's code */
} pt_svd_args;

/* One REKLS element-wise kernel over n elements (bodies in gpu/kernels_hd.h,
 * loop in gpu/rekls_ew.h). Which fields a kind reads is listed beside it. */
typedef enum pt_rekls_ew_kind {
    PT_RK_GRAD_IN = 0,   /* x[i] = load(src, src_dtype, i) * a      (widen + clip scale) */
    PT_RK_SCALE_COLS,    /* x[r*cols+c] = y[r*cols+c] * inv(lam[c], b, c0): rows*cols = n,
                            inv = 1/(b * max(lam, c0)) (b = the factor's size, c0 = eps) */
    PT_RK_LERP,          /* x[i] = x[i] + a * (y[i] - x[i]) */
    PT_RK_COPY,          /* x[i] = y[i] */
    PT_RK_ADAM,          /* x = G~ in, U out; m, v moments; a = 1-b1, b = 1-b2, c0 = bc1,
                            c1 = bc2, c2 = eps */
    PT_RK_APPLY,         /* x = fp32 param: x = x - c0*x - a*y (c0 = the decay, a = lr,
                            y = delta); dst (dst_dtype) gets a copy of the new x when not NULL */
    PT_RK_AXPY           /* x[i] = x[i] + a * y[i]   (l2 decay: G += wd W) */
} pt_rekls_ew_kind;

typedef struct pt_rekls_ew_args {
    int kind;                   /* pt_rekls_ew_kind */
    size_t n;
    float *x;                   /* [n] written */
    const float *y;             /* [n] read (LERP, COPY, SCALE_COLS, APPLY, AXPY) */
    const void *src;            /* [n] GRAD_IN source, src_dtype */
    int src_dtype;
    void *dst;                  /* [n] APPLY compute-dtype copy, or NULL */
    int dst_dtype;
    float *m, *v;               /* [n] ADAM moments */
    const float *lam;           /* [cols] SCALE_COLS eigenvalues */
    size_t cols;
    float a, b, c0, c1, c2;
} pt_rekls_ew_args;

/*
 * Version of the pt_gpu_backend layout. The cuda backend is a separate shared
 * object that may come from another build than the plugin loading it, so its
 * table says which layout it was compiled against: the exported symbol carries
 * the version in its name (PT_CUDA_BACKEND_SYMBOL) and the table starts with
 * abi_version and struct_size. pt_gpu_open refuses a library whose symbol or
 * abi_version differ from this build's, or whose struct_size is smaller than
 * this build's table (a table with more trailing ops is accepted). Any change to
 * the ops below that an older library would get wrong (an op removed, reordered
 * or given another signature) bumps the version; appending an op does not, as
 * struct_size covers it.
 */
#define PT_GPU_BACKEND_VERSION 1u

/* Log sink a backend may be handed (level: pt_log_level, msg: one sentence). */
typedef void (*pt_gpu_log_fn)(void *user, int32_t level, const char *msg);

typedef struct pt_gpu_backend {
    uint32_t abi_version;       /* PT_GPU_BACKEND_VERSION the table was compiled with */
    uint32_t struct_size;       /* sizeof(pt_gpu_backend) as the table was compiled */
    const char *name;           /* "host" / "cuda" */
    /* Open/close. impl receives backend state. err gets one sentence on failure. */
    int (*open)(const pt_gpu_config *cfg, void **impl, char *err, size_t errlen);
    void (*close)(void *impl);
    /* Where the backend reports what an op's status code cannot carry (which
     * driver call failed and the driver's own text). The device wrapper calls it
     * right after open and again once its log hook exists, both times from the
     * opening thread before any op runs elsewhere. NULL: the backend has nothing
     * to report. Until it is called a backend stays silent. */
    void (*set_log)(void *impl, pt_gpu_log_fn fn, void *user);
    void (*device_name)(void *impl, char *buf, size_t len);
    uint64_t (*total_memory)(void *impl);     /* physical/simulated device bytes */

    int (*dev_alloc)(void *impl, size_t bytes, void **p);   /* 0 or PT_ERR_OOM */
    void (*dev_free)(void *impl, void *p, size_t bytes);
    int (*host_alloc)(void *impl, size_t bytes, void **p);  /* pinned */
    void (*host_free)(void *impl, void *p, size_t bytes);

    int (*stream_create)(void *impl, pt_stream **s);
    void (*stream_destroy)(void *impl, pt_stream *s);
    int (*stream_sync)(void *impl, pt_stream *s);
    int (*event_create)(void *impl, pt_event **e);
    void (*event_destroy)(void *impl, pt_event *e);
    int (*event_record)(void *impl, pt_event *e, pt_stream *s);
    int (*stream_wait_event)(void *impl, pt_stream *s, pt_event *e);
    int (*event_sync)(void *impl, pt_event *e);
    int (*event_query)(void *impl, pt_event *e);             /* 1 done, 0 pending */
    int (*event_elapsed_ms)(void *impl, pt_event *a, pt_event *b, float *ms);

    int (*memset_async)(void *impl, void *p, int value, size_t bytes, pt_stream *s);
    int (*memcpy_async)(void *impl, void *dst, const void *src, size_t bytes, int kind,
                        pt_stream *s);
    /* Run fn(arg) on the host once all earlier work on s is done (cudaLaunchHostFunc). */
    int (*host_fn)(void *impl, pt_stream *s, void (*fn)(void *), void *arg);

    /* Kernels (device-side math). */
    int (*adamw)(void *impl, const pt_adamw_args *a, pt_stream *s);
    /* *out (device double) += sum(x[i]^2) over n fp32/bf16/f16 elements, formed in
     * double so a host that sums per-parameter squares in double matches it. */
    int (*sqnorm)(void *impl, const void *x, int dtype, size_t n, double *out, pt_stream *s);
    /* dst[i] = convert(src[i]) between dtypes (fp32 <-> bf16/f16); dst += src when acc.
     * sqnorm, convert and adamw take the floating-point dtypes only: PT_U8 (frozen
     * bytes, no gradient, no optimizer) is PT_ERR_INVALID_ARG. */
    int (*convert)(void *impl, void *dst, int dst_dtype, const void *src, int src_dtype,
                   size_t n, int accumulate, pt_stream *s);
    /* An event event_elapsed_ms may read. event_create's events only order work
     * (on cuda: no timing, and a host thread waiting on one sleeps instead of
     * spinning); the profiler's edge events come from here. */
    int (*event_create_timing)(void *impl, pt_event **e);
    /* Dense linear algebra (OSFT's factorised layers and projections). NULL in a
     * backend built before they were appended: pt_gpu_has_linalg says whether a
     * table has them. */
    int (*gemm_f32)(void *impl, const pt_gemm_args *a, pt_stream *s);
    int (*cols_f32)(void *impl, const pt_cols_args *a, pt_stream *s);
    int (*svd_f32)(void *impl, const pt_svd_args *a, pt_stream *s);
    /* ---- REKLS (appended; NULL = not implemented by this backend); its GEMMs
     * go through gemm_f32 ----
     * Symmetric eigendecomposition in place: A [n x n] row-major symmetric in,
     * eigenvectors out as columns; w [n] the eigenvalues, both sorted descending.
     * fp32 first, retried in fp64 when fp32 does not converge. *status (device
     * int), when not NULL, is set non-zero when both failed (A and w then hold
     * NaN) and left as it was otherwise, so one zeroing covers many calls. */
    int (*eigh)(void *impl, int n, float *A, float *w, int *status, pt_stream *s);
    int (*rekls_ew)(void *impl, const pt_rekls_ew_args *a, pt_stream *s);
} pt_gpu_backend;

/* The table holds gemm_f32, cols_f32 and svd_f32 (inside its struct_size, non-NULL). */
#define pt_gpu_has_linalg(ops) \
    ((ops)->struct_size >= sizeof(pt_gpu_backend) && (ops)->gemm_f32 && (ops)->cols_f32 && \
     (ops)->svd_f32)

/* The host backend is always linked in. */
extern const pt_gpu_backend pt_gpu_backend_host;

/* Symbol the cuda backend library exports (resolved with dlsym): the stem plus
 * "_v<PT_GPU_BACKEND_VERSION>". Libraries built before the table was versioned
 * export the bare stem. */
#define PT_CUDA_BACKEND_SYMBOL_STEM "pt_gpu_backend_cuda"
#define PT_CUDA_BACKEND_SYMBOL "pt_gpu_backend_cuda_v1"
#define PT_CUDA_BACKEND_LIB "libprotrain_cuda.so"

typedef struct pt_gpu pt_gpu;

/*
 * Open a device. kind: "host", "cuda" or "auto" (cuda when the library loads and
 * reports a device, else host). The cuda library is looked up beside the plugin
 * .so, then on the loader path. Returns 0, or a pt_status with err filled.
 */
int pt_gpu_open(const char *kind, const pt_gpu_config *cfg, pt_gpu **out, char *err,
                size_t errlen);
void pt_gpu_close(pt_gpu *g);   /* reports (to err log) any allocation not freed */
const char *pt_gpu_backend_name(const pt_gpu *g);
void pt_gpu_device_name(const pt_gpu *g, char *buf, size_t len);

/* Device memory with accounting. Fails (PT_ERR_OOM) with err naming bytes needed,
 * available and capacity, and changes nothing. */
int pt_gpu_alloc(pt_gpu *g, size_t bytes, int tag, void **p, char *err, size_t errlen);
void pt_gpu_free(pt_gpu *g, void *p);
size_t pt_gpu_alloc_size(const pt_gpu *g, const void *p);   /* 0 if not ours */
int pt_gpu_pinned_alloc(pt_gpu *g, size_t bytes, void **p, char *err, size_t errlen);
void pt_gpu_pinned_free(pt_gpu *g, void *p);

typedef struct pt_gpu_usage {
    uint64_t capacity;
    uint64_t current, peak;
    uint64_t tag_current[PT_TAG_COUNT], tag_peak[PT_TAG_COUNT];
    uint64_t pinned_current, pinned_peak, pinned_budget;
    uint64_t pinned_arena;      /* bytes of the pinned arena (pt_gpu_pinned_reserve), 0 = none */
    uint64_t pinned_own_allocs; /* pinned allocations that got their own backend host_alloc */
    uint64_t h2d_bytes, d2h_bytes;
    uint64_t n_allocs;
    /* Fragmentation of the device reservation (offsets from its start), measured
     * by the allocator itself since open or the last pt_gpu_reset_peak:
     *   span_peak          highest end offset any live block reached: the address
     *                      range the allocation pattern needed, holes included
     *                      (>= peak; equal when nothing was ever left behind a hole)
     *   req_current        bytes the live blocks' callers asked for (current minus
     *                      this is lost to PT_GPU_ALIGN rounding)
     * at the moment `peak` was last raised:
     *   peak_req           req_current then (peak - peak_req: rounding at the peak)
     *   peak_largest_free  the largest free block then; the free bytes then are
     *                      capacity - peak, so 1 - peak_largest_free / (capacity -
     *                      peak) is the free space's fragmentation at the peak
     * pt_gpu_frag_factor (device_ext.h) turns them into the planner's factor. */
    uint64_t span_peak, req_current, peak_req, peak_largest_free;
} pt_gpu_usage;
void pt_gpu_usage_get(const pt_gpu *g, pt_gpu_usage *u);
void pt_gpu_reset_peak(pt_gpu *g);

/* Thin pass-throughs (the backend's stream/event/copy/kernel ops). */
const pt_gpu_backend *pt_gpu_ops(const pt_gpu *g);
void *pt_gpu_impl(const pt_gpu *g);
/* Copies also count h2d/d2h traffic. */
int pt_gpu_memcpy_async(pt_gpu *g, void *dst, const void *src, size_t bytes, int kind,
                        pt_stream *s);
int pt_gpu_memcpy(pt_gpu *g, void *dst, const void *src, size_t bytes, int kind); /* sync */

#endif /* PT_GPU_H */
