/*
 * nccl_sim.c — an in-process simulation of the part of NCCL and the CUDA
 * runtime the NCCL transport (gpu/coll/nccl/coll_nccl.c) uses, for
 * tests/unit/test_nccl_sim.c: ranks are threads of one process, "device"
 * memory is host memory handed out by the simulated cudaMalloc (so pointer
 * attributes tell it from host memory), a stream is a queue of operations run
 * in order when its owner polls it, and a group of ncclSend/ncclRecv completes
 * when every receive has met the peer's matching send (same byte count,
 * per-pair FIFO, as NCCL requires; a mismatch aborts the test, since real NCCL
 * would hang or corrupt). The rank-order sum kernel's contract
 * (gpu/coll/nccl/rank_sum.h) is implemented on the CPU. Knobs in sim.h.
 * Written from NCCL's and CUDA's documented behaviour; none of their code.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll.h"
#include "cuda_runtime_api.h"
#include "nccl.h"
#include "rank_sum.h"
#include "sim.h"

static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
int sim_ndev = 4;
size_t sim_malloc_limit = (size_t)1 << 40;
int sim_inprogress = 0;
int sim_sum_early = 0;
static __thread int tl_dev = 0;

typedef struct {
    char *p;
    size_t n;
    int dev;
} sim_alloc;
static sim_alloc allocs[4096];
static int nallocs;

typedef struct sim_world {
    char id[NCCL_UNIQUE_ID_BYTES];
    int nranks, joined, refs;
} sim_world;
struct sim_comm {
    sim_world *w;
    int rank, aborted, polls_left;
    ncclResult_t async_err;
};

enum { K_COPY,
       K_SUM,
       K_GROUP };
typedef struct {
    int send, peer, done;
    char *buf;
    size_t bytes;
} sim_p2p;
typedef struct sim_op {
    int kind;
    struct sim_op *next;
    /* copy */
    void *dst;
    const void *src;
    size_t bytes;
    /* sum */
    void *out;
    const void *slots;
    size_t stride, m;
    int me, world, dtype;
    double scale;
    /* group */
    ncclComm_t comm;
    sim_p2p *it;
    int nit, active;
} sim_op;
struct sim_stream {
    sim_op *head, *tail;
};

typedef struct sim_post {
    sim_world *w;
    int from, to;
    sim_p2p *item;
    struct sim_post *next;
} sim_post;
static sim_post *posts;   /* active sends, oldest first */

static __thread sim_op *tl_group;       /* being built between GroupStart and GroupEnd */
static __thread cudaStream_t tl_group_stream;
static __thread int tl_group_depth;

static void run_sum(const sim_op *o) {
    for (size_t e = 0; e < o->m; e++) {
        if (o->dtype == PT_COLL_F64) {
            double *out = o->out;
            const double *sl = o->slots;
            double acc = o->me == 0 ? out[e] : sl[e];
            for (int q = 1; q < o->world; q++) acc += q == o->me ? out[e] : sl[(size_t)q * o->stride + e];
            if (o->scale != 1.0) acc *= o->scale;
            out[e] = acc;
        } else {
            float *out = o->out;
            const float *sl = o->slots;
            float acc = o->me == 0 ? out[e] : sl[e];
            for (int q = 1; q < o->world; q++) acc += q == o->me ? out[e] : sl[(size_t)q * o->stride + e];
            if (o->scale != 1.0) acc *= (float)o->scale;
            out[e] = acc;
        }
    }
}

static void push(cudaStream_t s, sim_op *o) {
    o->next = NULL;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
}

static void free_op(sim_op *o) {
    free(o->it);
    free(o);
}

static void drop_posts_of(ncclComm_t c) {
    sim_post **pp = &posts;
    while (*pp) {
        sim_post *p = *pp;
        if (p->w == c->w && p->from == c->rank) {
            *pp = p->next;
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

/* Run what can run at the head of s (G held). */
static void advance(cudaStream_t s) {
    while (s->head) {
        sim_op *o = s->head;
        if (o->kind == K_COPY) {
            memcpy(o->dst, o->src, o->bytes);
        } else if (o->kind == K_SUM) {
            run_sum(o);
        } else if (!o->comm->aborted) {
            if (!o->active) {
                o->active = 1;
                for (int i = 0; i < o->nit; i++) {
                    if (!o->it[i].send) continue;
                    sim_post *p = calloc(1, sizeof *p), **pp = &posts;
                    p->w = o->comm->w;
                    p->from = o->comm->rank;
                    p->to = o->it[i].peer;
                    p->item = &o->it[i];
                    while (*pp) pp = &(*pp)->next;
                    *pp = p;
                }
            }
            int left = 0;
            for (int i = 0; i < o->nit; i++) {
                sim_p2p *r = &o->it[i];
                if (!r->send && !r->done) {
                    for (sim_post **pp = &posts; *pp; pp = &(*pp)->next) {
                        sim_post *p = *pp;
                        if (p->w != o->comm->w || p->from != r->peer || p->to != o->comm->rank)
                            continue;
                        if (p->item->bytes != r->bytes) {
                            fprintf(stderr, "sim: rank %d receives %zu bytes from rank %d, which "
                                            "sends %zu\n",
                                    o->comm->rank, r->bytes, r->peer, p->item->bytes);
                            abort();   /* real NCCL would hang or corrupt: a transport bug */
                        }
                        memcpy(r->buf, p->item->buf, r->bytes);
                        p->item->done = r->done = 1;
                        *pp = p->next;
                        free(p);
                        break;
                    }
                }
                left += !r->done;
            }
            if (left) return;
        }
        /* (an aborted communicator's groups are dropped: NCCL ends its kernels) */
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        free_op(o);
    }
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = sim_ndev;
    return sim_ndev ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaGetDevice(int *d) {
    *d = tl_dev;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= sim_ndev) return cudaErrorInvalidDevice;
    tl_dev = d;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = calloc(1, sizeof **s);
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    pthread_mutex_lock(&G);
    while (s->head) {
        sim_op *o = s->head;
        s->head = o->next;
        free_op(o);
    }
    pthread_mutex_unlock(&G);
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    pthread_mutex_lock(&G);
    advance(s);
    int ready = !s->head;
    pthread_mutex_unlock(&G);
    return ready ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    if (bytes > sim_malloc_limit) return cudaErrorMemoryAllocation;
    char *m = malloc(bytes ? bytes : 1);
    if (!m) return cudaErrorMemoryAllocation;
    pthread_mutex_lock(&G);
    allocs[nallocs++] = (sim_alloc){m, bytes, tl_dev};
    pthread_mutex_unlock(&G);
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&G);
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].p == p) {
            allocs[i] = allocs[--nallocs];
            break;
        }
    pthread_mutex_unlock(&G);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
    (void)kind;
    sim_op *o = calloc(1, sizeof *o);
    o->kind = K_COPY;
    o->dst = dst;
    o->src = src;
    o->bytes = bytes;
    pthread_mutex_lock(&G);
    push(s, o);
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    pthread_mutex_lock(&G);
    for (int i = 0; i < nallocs; i++)
        if ((const char *)p >= allocs[i].p && (const char *)p < allocs[i].p + allocs[i].n) {
            a->type = cudaMemoryTypeDevice;
            a->device = allocs[i].dev;
        }
    pthread_mutex_unlock(&G);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaErrorMemoryAllocation ? "out of memory (simulated)"
           : e == cudaErrorNoDevice       ? "no CUDA-capable device is detected (simulated)"
                                          : "simulated CUDA error";
}

int pt_nccl_rank_sum(void *out, const void *slots, size_t stride, int me, int world, size_t m,
                     int32_t dtype, double scale, void *stream) {
    sim_op o = {0};
    o.kind = K_SUM;
    o.out = out;
    o.slots = slots;
    o.stride = stride;
    o.m = m;
    o.me = me;
    o.world = world;
    o.dtype = dtype;
    o.scale = scale;
    if (sim_sum_early) {   /* now, not after the receives queued before it */
        run_sum(&o);
        return 0;
    }
    sim_op *q = malloc(sizeof *q);
    *q = o;
    pthread_mutex_lock(&G);
    push(stream, q);
    pthread_mutex_unlock(&G);
    return 0;
}

ncclResult_t ncclGetVersion(int *v) {
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static unsigned counter;
    pthread_mutex_lock(&G);
    unsigned k = ++counter;
    pthread_mutex_unlock(&G);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "sim-%d-%u", (int)getpid(), k);
    return ncclSuccess;
}
static sim_world *worlds[64];
static struct sim_comm *live[256];   /* for sim_fail_comms */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg) {
    if (cfg->blocking != 0) return ncclInvalidUsage;   /* the transport must not block */
    struct sim_comm *c = calloc(1, sizeof *c);
    pthread_mutex_lock(&G);
    sim_world *w = NULL;
    for (int i = 0; i < 64 && !w; i++)
        if (worlds[i] && !memcmp(worlds[i]->id, id.internal, NCCL_UNIQUE_ID_BYTES)) w = worlds[i];
    if (!w) {
        w = calloc(1, sizeof *w);
        memcpy(w->id, id.internal, NCCL_UNIQUE_ID_BYTES);
        w->nranks = nranks;
        for (int i = 0; i < 64; i++)
            if (!worlds[i]) {
                worlds[i] = w;
                break;
            }
    }
    w->joined++;
    w->refs++;
    c->w = w;
    c->rank = rank;
    c->polls_left = sim_inprogress;
    for (int i = 0; i < 256; i++)
        if (!live[i]) {
            live[i] = c;
            break;
        }
    pthread_mutex_unlock(&G);
    *comm = c;
    return ncclInProgress;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state) {
    pthread_mutex_lock(&G);
    if (c->async_err) *state = c->async_err;
    else if (c->w->joined < c->w->nranks) *state = ncclInProgress;
    else if (c->polls_left > 0) {
        c->polls_left--;
        *state = ncclInProgress;
    } else *state = ncclSuccess;
    pthread_mutex_unlock(&G);
    return ncclSuccess;
}
static void comm_free(ncclComm_t c) {
    pthread_mutex_lock(&G);
    drop_posts_of(c);
    for (int i = 0; i < 256; i++)
        if (live[i] == c) live[i] = NULL;
    if (--c->w->refs == 0) {
        for (int i = 0; i < 64; i++)
            if (worlds[i] == c->w) worlds[i] = NULL;
        free(c->w);
    }
    pthread_mutex_unlock(&G);
    free(c);
}
static int aborts;
ncclResult_t ncclCommAbort(ncclComm_t c) {
    pthread_mutex_lock(&G);
    c->aborted = 1;
    aborts++;
    pthread_mutex_unlock(&G);
    comm_free(c);
    return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t c) {
    (void)c;
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    comm_free(c);
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclRemoteError ? "remote process exited or there was a network error (simulated)"
                                : "simulated NCCL error";
}
const char *ncclGetLastError(ncclComm_t c) {
    (void)c;
    return "simulated detail";
}
ncclResult_t ncclGroupStart(void) {
    if (tl_group_depth++ == 0) {
        tl_group = calloc(1, sizeof *tl_group);
        tl_group->kind = K_GROUP;
        tl_group_stream = NULL;
    }
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (--tl_group_depth > 0) return ncclSuccess;
    sim_op *g = tl_group;
    tl_group = NULL;
    if (!g->nit) {
        free_op(g);
        return ncclSuccess;
    }
    pthread_mutex_lock(&G);
    push(tl_group_stream, g);
    ncclResult_t r = g->comm->polls_left > 0 ? ncclInProgress : ncclSuccess;
    if (sim_inprogress) g->comm->polls_left = sim_inprogress;
    pthread_mutex_unlock(&G);
    return r;
}
static ncclResult_t p2p(int send, const void *buf, size_t count, ncclDataType_t t, int peer,
                        ncclComm_t comm, cudaStream_t s) {
    size_t es = t == ncclFloat64 ? 8 : t == ncclFloat32 ? 4
                                                        : 1;
    int solo = tl_group_depth == 0;
    if (solo) ncclGroupStart();
    sim_op *g = tl_group;
    if (g->comm && (g->comm != comm || tl_group_stream != s)) return ncclInvalidUsage;
    g->comm = comm;
    tl_group_stream = s;
    g->it = realloc(g->it, sizeof *g->it * (size_t)(g->nit + 1));
    g->it[g->nit++] = (sim_p2p){send, peer, 0, (char *)buf, count * es};
    return solo ? ncclGroupEnd() : ncclSuccess;
}
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    return p2p(1, buf, count, t, peer, comm, s);
}
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t s) {
    return p2p(0, buf, count, t, peer, comm, s);
}

int sim_aborts(void) {
    pthread_mutex_lock(&G);
    int n = aborts;
    pthread_mutex_unlock(&G);
    return n;
}

int sim_live_allocs(void) {
    pthread_mutex_lock(&G);
    int n = nallocs;
    pthread_mutex_unlock(&G);
    return n;
}

void sim_fail_comms(int r) {
    pthread_mutex_lock(&G);
    for (int i = 0; i < 256; i++)
        if (live[i]) live[i]->async_err = (ncclResult_t)r;
    pthread_mutex_unlock(&G);
}
