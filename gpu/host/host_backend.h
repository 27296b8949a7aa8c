/*
 * host_backend.h — internals of the host backend (the simulated GPU), shared by
 * the .c files of gpu/host only. Nothing outside gpu/host includes this.
 *
 * Model:
 *  - Device memory: each dev_alloc is one anonymous mmap (MAP_NORESERVE, so a
 *    1 GiB reservation costs nothing until touched). The device wrapper
 *    (gpu/device.c) makes exactly one such reservation and sub-allocates it.
 *  - Streams: one worker thread per stream, draining a FIFO of ops. The NULL
 *    stream runs every op synchronously on the calling thread (no implicit
 *    synchronisation with other streams: like CUDA's per-thread default stream).
 *  - Events: record enqueues a marker op on the stream; the event targets the
 *    stream's sequence number of that marker, so it is complete exactly when all
 *    work queued before it (and the marker) has run. Re-recording retargets it.
 *  - Copy throttle (cfg.copy_bandwidth > 0): H2D, D2H and D2D copies each model
 *    one link per direction (like a GPU's copy engines): a copy of N bytes
 *    reserves its link from max(now, link_free) for N/bw seconds and completes at
 *    the end of that window. A lone copy therefore takes N/bw on its stream; two
 *    concurrent copies in the same direction share the link (serialise), two in
 *    opposite directions overlap. H2H copies are plain memcpy. Applies to the NULL
 *    stream too.
 *
 * Locking: one mutex per backend instance (hb.mu) guards every queue, sequence
 * counter, event and refcount; `progress` is broadcast whenever any op finishes.
 * Ops themselves run without the lock.
 */
#ifndef PT_HOST_BACKEND_H
#define PT_HOST_BACKEND_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu.h"

#define PT_HB_DEFAULT_CAPACITY (1ull << 30)

typedef enum hb_op_kind {
    HB_OP_MEMCPY,
    HB_OP_MEMSET,
    HB_OP_HOSTFN,
    HB_OP_RECORD,
    HB_OP_WAIT,
    HB_OP_ADAMW,
    HB_OP_SQNORM,
    HB_OP_CONVERT,
    HB_OP_GEMM,
    HB_OP_COLS,
    HB_OP_SVD,
    HB_OP_EIGH,
    HB_OP_REKLS_EW
} hb_op_kind;

typedef struct hb hb;

/* Named so an entry point fills its op in one statement (a compound literal). */
typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    int kind;
} hb_copy_args;
typedef struct {
    void *p;
    int value;
    size_t bytes;
} hb_memset_args;
typedef struct {
    void (*fn)(void *);
    void *arg;
    double delay_s;
} hb_fn_args;
typedef struct {
    const void *x;
    int dtype;
    size_t n;
    double *out;
} hb_sqnorm_args;
typedef struct {
    void *dst;
    int dst_dtype;
    const void *src;
    int src_dtype;
    size_t n;
    int acc;
} hb_convert_args;
typedef struct {
    int n;
    float *A, *w;
    int *status;
} hb_eigh_args;

typedef struct hb_op {
    hb_op_kind kind;
    struct hb_op *next;
    union {
        hb_copy_args cp;
        hb_memset_args ms;
        hb_fn_args fn;
        struct {
            pt_event *ev;
            uint64_t gen;
        } rec;
        struct {
            pt_stream *src;
            uint64_t seq;
        } wait;   /* holds a ref on src */
        pt_adamw_args adamw;
        hb_sqnorm_args sq;
        hb_convert_args cv;
        pt_gemm_args gemm;
        pt_cols_args cols;
        pt_svd_args svd;
        hb_eigh_args eig;
        pt_rekls_ew_args rew;
    } u;
} hb_op;

struct pt_stream {
    hb *owner;
    pthread_t thread;
    pthread_cond_t work;        /* signalled when an op is queued or stop is set */
    hb_op *head, *tail;         /* FIFO of ops not yet started */
    uint64_t enq_seq;           /* ops queued so far (the n-th op has sequence n) */
    uint64_t done_seq;          /* ops finished so far; ops finish in FIFO order */
    int refs;                   /* creator + events recorded on it + wait ops naming it */
    int stop;
    int id;                     /* 1, 2, ... in creation order (0 = the NULL stream), for the trace */
    struct pt_stream *lprev, *lnext; /* hb.live: streams not yet destroyed */
};

struct pt_event {
    hb *owner;
    pt_stream *s;               /* stream of the last record (holds a ref), NULL = NULL stream */
    uint64_t seq;               /* complete when s->done_seq >= seq */
    uint64_t gen;               /* bumped by every record; 0 = never recorded */
    uint64_t stamped_gen;       /* gen whose marker op has run */
    double t_done;              /* pt_now_s() when the marker of stamped_gen ran */
    int pending_markers;        /* marker ops queued that still point at this event */
};

struct hb {
    pt_gpu_config cfg;
    uint64_t total;             /* simulated device bytes */
    pthread_mutex_t mu;
    pthread_cond_t progress;    /* broadcast after every finished op */
    double link_free[3];        /* throttle: pt_now_s() time each link (H2D, D2H, D2D) is free */
    pt_stream *live;            /* streams created and not destroyed (close joins them) */
    uint64_t jitter_state;      /* xorshift64 state of the host-function jitter (under mu) */
    uint64_t op_calls;          /* calls of cfg.fail_op so far (under mu; injection) */
    pt_gpu_log_fn log;          /* set_log's sink (under mu), NULL until set */
    void *log_user;
    int n_streams;              /* streams created so far (their ids) */
    struct hb_trace *trace;     /* cfg.trace_file's records, NULL when off */
};

/* host_stream.c */
int pt_hb_stream_create(void *impl, pt_stream **s);
void pt_hb_stream_destroy(void *impl, pt_stream *s);
int pt_hb_stream_sync(void *impl, pt_stream *s);
int pt_hb_event_create(void *impl, pt_event **e);
void pt_hb_event_destroy(void *impl, pt_event *e);
int pt_hb_event_record(void *impl, pt_event *e, pt_stream *s);
int pt_hb_stream_wait_event(void *impl, pt_stream *s, pt_event *e);
int pt_hb_event_sync(void *impl, pt_event *e);
int pt_hb_event_query(void *impl, pt_event *e);
int pt_hb_event_elapsed_ms(void *impl, pt_event *a, pt_event *b, float *ms);
/* Queue op on s (NULL: run it now on the caller). Takes ownership of op. */
int pt_hb_submit(hb *h, pt_stream *s, hb_op *op);
hb_op *pt_hb_op_new(hb_op_kind kind);

/* host_backend.c: the shared head of an op's entry point (injection, then
 * arguments, then allocation); on PT_OK *op is a zeroed op of kind to fill and
 * pass to pt_hb_submit, else *op is NULL and the status says why. */
int pt_hb_op_start(void *impl, int inject_op, int args_ok, hb_op_kind kind, hb_op **op);

/* host_faults.c: 1 when this call of op is the one cfg.fail_op / fail_op_at
 * names (the caller then returns PT_ERR_BACKEND and does nothing); says so in
 * the log. Every entry point of an injectable op calls it first. */
int pt_hb_inject(hb *h, int op);
void pt_hb_set_log(void *impl, pt_gpu_log_fn fn, void *user);

/* host_trace.c: the op timeline of cfg.trace_file. open creates the file
 * (so a path that cannot be written fails the backend's open with a
 * sentence), add records one op (caller holds h->mu; t0/t1 from pt_now_s),
 * close writes the records and frees everything. */
int pt_hb_trace_open(hb *h, char *err, size_t errlen);
void pt_hb_trace_add(hb *h, const pt_stream *s, const hb_op *op, double t0, double t1);
void pt_hb_trace_close(hb *h);

/* host_ops.c: what each op does (runs on the stream's thread, lock not held). */
void pt_hb_exec(hb *h, hb_op *op);
/* host_linalg.c: gemm_f32, cols_f32, svd_f32 (argument checks and queueing) and
 * their bodies (OpenBLAS, LAPACKE). */
int pt_hb_gemm(void *impl, const pt_gemm_args *a, pt_stream *s);
int pt_hb_cols(void *impl, const pt_cols_args *a, pt_stream *s);
int pt_hb_svd(void *impl, const pt_svd_args *a, pt_stream *s);
void pt_hb_exec_linalg(hb_op *op);

#endif /* PT_HOST_BACKEND_H */
