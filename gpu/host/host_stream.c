/*
 * host_stream.c — streams (one worker thread each, FIFO) and events with CUDA
 * semantics for the host backend. See host_backend.h for the model.
 *
 * Sequence numbers: the n-th op queued on a stream has sequence n; ops finish in
 * order, so "everything queued up to op n has run" is just done_seq >= n. An event
 * record is itself a (marker) op, so the event is complete exactly when the marker
 * has run; the marker also stamps the completion time for event_elapsed_ms.
 */
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "host_backend.h"
#include "protrain.h"
#include "pt_util.h"

hb_op *pt_hb_op_new(hb_op_kind kind) {
    hb_op *op = calloc(1, sizeof *op);
    if (op) op->kind = kind;
    return op;
}

/* Drop one reference; the struct goes when the creator and every event / wait op
 * naming it are done with it. Caller holds h->mu. */
static void stream_unref(pt_stream *s) {
    if (--s->refs == 0) {
        pthread_cond_destroy(&s->work);
        free(s);
    }
}

/* Caller holds h->mu. */
static int event_complete(const pt_event *e) {
    return e->gen == 0 || e->s == NULL || e->s->done_seq >= e->seq;
}

static void *worker(void *arg) {
    pt_stream *s = arg;
#ifdef __linux__
    /* A copy's throttle sleeps until its end time; Linux's default 50 us
     * timer slack made every copy, however small, last >= 50 us more than
     * its bytes allow (a GPU's copy engine starts in a few us). */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
    hb *h = s->owner;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work, &h->mu);
        if (!s->head) break; /* stop requested and queue empty */
        hb_op *op = s->head;
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        if (op->kind == HB_OP_WAIT) {
            pt_stream *src = op->u.wait.src;
            double t0 = h->trace ? pt_now_s() : 0;
            while (src->done_seq < op->u.wait.seq) pthread_cond_wait(&h->progress, &h->mu);
            if (h->trace) pt_hb_trace_add(h, s, op, t0, pt_now_s());
            stream_unref(src);
        } else if (op->kind == HB_OP_RECORD) {
            pt_event *e = op->u.rec.ev;
            if (e->gen == op->u.rec.gen) {
                e->t_done = pt_now_s();
                if (h->trace) pt_hb_trace_add(h, s, op, e->t_done, e->t_done);
                e->stamped_gen = e->gen;
            }
            e->pending_markers--;
        } else {
            double t0 = h->trace ? pt_now_s() : 0;   /* h->trace is fixed from open to close */
            pthread_mutex_unlock(&h->mu);
            pt_hb_exec(h, op);
            double t1 = t0 > 0 ? pt_now_s() : 0;
            pthread_mutex_lock(&h->mu);
            if (h->trace) pt_hb_trace_add(h, s, op, t0, t1);
        }
        s->done_seq++;
        pthread_cond_broadcast(&h->progress);
        free(op);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

int pt_hb_stream_create(void *impl, pt_stream **out) {
    hb *h = impl;
    if (!h || !out) return PT_ERR_INVALID_ARG;
    pt_stream *s = calloc(1, sizeof *s);
    if (!s) return PT_ERR_HOST_OOM;
    s->owner = h;
    s->refs = 1;
    if (pthread_cond_init(&s->work, NULL) != 0) {
        free(s);
        return PT_ERR_BACKEND;
    }
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        pthread_cond_destroy(&s->work);
        free(s);
        return PT_ERR_BACKEND;
    }
    pthread_mutex_lock(&h->mu);
    s->id = ++h->n_streams;   /* read by the trace only after an op was queued */
    s->lnext = h->live;
    if (h->live) h->live->lprev = s;
    h->live = s;
    pthread_mutex_unlock(&h->mu);
    *out = s;
    return PT_OK;
}

void pt_hb_stream_destroy(void *impl, pt_stream *s) {
    hb *h = impl;
    if (!h || !s) return;
    /* Like cudaStreamDestroy, queued work still completes: drain, then stop. */
    pthread_mutex_lock(&h->mu);
    while (s->done_seq < s->enq_seq) pthread_cond_wait(&h->progress, &h->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&h->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&h->mu);
    if (s->lprev) s->lprev->lnext = s->lnext;
    else h->live = s->lnext;
    if (s->lnext) s->lnext->lprev = s->lprev;
    stream_unref(s);
    pthread_mutex_unlock(&h->mu);
}

int pt_hb_stream_sync(void *impl, pt_stream *s) {
    hb *h = impl;
    if (!h) return PT_ERR_INVALID_ARG;
    if (pt_hb_inject(h, PT_GPU_OP_STREAM_SYNC)) return PT_ERR_BACKEND;
    if (!s) return PT_OK; /* NULL-stream work already ran on the caller */
    pthread_mutex_lock(&h->mu);
    uint64_t target = s->enq_seq; /* work queued before this call, not after */
    while (s->done_seq < target) pthread_cond_wait(&h->progress, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return PT_OK;
}

int pt_hb_submit(hb *h, pt_stream *s, hb_op *op) {
    if (!s) {
        double t0 = h->trace ? pt_now_s() : 0;
        pt_hb_exec(h, op);
        if (h->trace) {
            double t1 = pt_now_s();
            pthread_mutex_lock(&h->mu);
            pt_hb_trace_add(h, NULL, op, t0, t1);
            pthread_mutex_unlock(&h->mu);
        }
        free(op);
        return PT_OK;
    }
    pthread_mutex_lock(&h->mu);
    op->next = NULL;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    s->enq_seq++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&h->mu);
    return PT_OK;
}

int pt_hb_event_create(void *impl, pt_event **out) {
    hb *h = impl;
    if (!h || !out) return PT_ERR_INVALID_ARG;
    if (pt_hb_inject(h, PT_GPU_OP_EVENT_CREATE)) return PT_ERR_BACKEND;
    pt_event *e = calloc(1, sizeof *e);
    if (!e) return PT_ERR_HOST_OOM;
    e->owner = h;
    *out = e;
    return PT_OK;
}

void pt_hb_event_destroy(void *impl, pt_event *e) {
    hb *h = impl;
    if (!h || !e) return;
    /* Queued markers still point at e: let them run before freeing it. */
    pthread_mutex_lock(&h->mu);
    while (e->pending_markers > 0) pthread_cond_wait(&h->progress, &h->mu);
    if (e->s) stream_unref(e->s);
    pthread_mutex_unlock(&h->mu);
    free(e);
}

int pt_hb_event_record(void *impl, pt_event *e, pt_stream *s) {
    hb *h = impl;
    if (!h || !e) return PT_ERR_INVALID_ARG;
    if (pt_hb_inject(h, PT_GPU_OP_EVENT_RECORD)) return PT_ERR_BACKEND;
    hb_op *op = NULL;
    if (s && !(op = pt_hb_op_new(HB_OP_RECORD))) return PT_ERR_HOST_OOM;
    pthread_mutex_lock(&h->mu);
    if (e->s != s) {
        if (e->s) stream_unref(e->s);
        e->s = s;
        if (s) s->refs++;
    }
    e->gen++;
    if (!s) { /* NULL stream: everything before this call already ran */
        e->seq = 0;
        e->t_done = pt_now_s();
        e->stamped_gen = e->gen;
        pthread_mutex_unlock(&h->mu);
        return PT_OK;
    }
    op->u.rec.ev = e;
    op->u.rec.gen = e->gen;
    e->pending_markers++;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    e->seq = ++s->enq_seq;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&h->mu);
    return PT_OK;
}

int pt_hb_stream_wait_event(void *impl, pt_stream *s, pt_event *e) {
    hb *h = impl;
    if (!h || !e) return PT_ERR_INVALID_ARG;
    if (pt_hb_inject(h, PT_GPU_OP_STREAM_WAIT_EVENT)) return PT_ERR_BACKEND;
    hb_op *op = NULL;
    if (s && !(op = pt_hb_op_new(HB_OP_WAIT))) return PT_ERR_HOST_OOM;
    pthread_mutex_lock(&h->mu);
    if (event_complete(e)) { /* nothing to wait for (also: never recorded) */
        pthread_mutex_unlock(&h->mu);
        free(op);
        return PT_OK;
    }
    if (!s) { /* later NULL-stream work runs on the caller, so the caller waits */
        while (!event_complete(e)) pthread_cond_wait(&h->progress, &h->mu);
        pthread_mutex_unlock(&h->mu);
        return PT_OK;
    }
    /* Capture the event's state now (CUDA semantics: a later re-record does not
     * change what this wait waits for). */
    op->u.wait.src = e->s;
    op->u.wait.seq = e->seq;
    e->s->refs++;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    s->enq_seq++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&h->mu);
    return PT_OK;
}

int pt_hb_event_sync(void *impl, pt_event *e) {
    hb *h = impl;
    if (!h || !e) return PT_ERR_INVALID_ARG;
    if (pt_hb_inject(h, PT_GPU_OP_EVENT_SYNC)) return PT_ERR_BACKEND;
    pthread_mutex_lock(&h->mu);
    while (!event_complete(e)) pthread_cond_wait(&h->progress, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return PT_OK;
}

int pt_hb_event_query(void *impl, pt_event *e) {
    hb *h = impl;
    if (!h || !e) return 1;
    pthread_mutex_lock(&h->mu);
    int done = event_complete(e);
    pthread_mutex_unlock(&h->mu);
    return done;
}

int pt_hb_event_elapsed_ms(void *impl, pt_event *a, pt_event *b, float *ms) {
    hb *h = impl;
    if (!h || !a || !b || !ms) return PT_ERR_INVALID_ARG;
    if (pt_hb_inject(h, PT_GPU_OP_EVENT_ELAPSED_MS)) return PT_ERR_BACKEND;
    pthread_mutex_lock(&h->mu);
    /* Both must be recorded and complete (cudaErrorNotReady / invalid otherwise). */
    int ok = a->gen && b->gen && event_complete(a) && event_complete(b);
    if (ok) *ms = (float)((b->t_done - a->t_done) * 1e3);
    pthread_mutex_unlock(&h->mu);
    return ok ? PT_OK : PT_ERR_INVALID_ARG;
}
