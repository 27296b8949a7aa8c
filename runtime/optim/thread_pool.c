/*
 * thread_pool.c — pthread worker pool with task groups (see thread_pool.h).
 *
 * One mutex guards everything: the FIFO queue, the free list of task nodes,
 * every group's counters and the shutdown state. Tasks are coarse (a CPU Adam
 * slice is tens of microseconds at least), so one lock is not a bottleneck and
 * keeps the invariants easy to check:
 *   pending(g) = queued tasks of g + running tasks of g
 *   a worker exits only when shutdown && queue empty && active == 0, because a
 *   running task (active > 0) may still submit more work that must be drained.
 *
 * Bounded spin (pt_pool_set_spin): a worker that finds the queue empty, and a
 * waiter whose group's last tasks run elsewhere, first poll an atomic counter
 * for up to spin_ns before sleeping on their condition variable. A futex wake
 * costs 5-50 us (more on a loaded VM), up to half of a 256K-param step on
 * two threads; back-to-back steps and chained slice tasks then find the workers
 * already running. The decision to sleep is still taken under the mutex after
 * re-checking the queue, so a spinner that gives up cannot miss a submission:
 * every submit enqueues under the mutex first. A submit signals work_cv only
 * when the queued tasks outnumber the spinners (a spinner takes one itself).
 * The spin costs at most spin_ns of CPU per idle period, so a loaded machine
 * loses little: the worker then sleeps as usual.
 */
#include "thread_pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "protrain.h"
#include "pt_util.h"

typedef struct node {
    struct node *next;
    pt_task_fn fn;
    void *arg;
    pt_task_group *g;
} node;

struct pt_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* workers: queue became non-empty, or shutdown progress */
    pthread_cond_t done_cv;   /* waiters: some group's pending count reached zero */
    node *head, *tail;        /* FIFO of queued tasks */
    node *free_nodes;         /* recycled nodes (grows to the peak queue depth) */
    size_t active;            /* tasks running now (on workers or helping waiters) */
    size_t n_queued;          /* tasks in the queue (mu) */
    atomic_size_t queued_pub; /* n_queued, published for spinners (written under mu) */
    atomic_size_t done_pub;   /* tasks finished so far: a spinning waiter's epoch */
    atomic_size_t spinning;   /* workers polling queued_pub now */
    atomic_llong spin_ns;     /* pt_pool_set_spin; 0 = sleep at once */
    atomic_size_t sleeps;     /* statistics: worker and waiter sleeps on a cv */
    int shutdown;             /* pt_pool_destroy has begun draining */
    int closed;               /* drain finished: no more submissions */
    int n_threads;
    pthread_t *threads;       /* [n_threads] */
};

static int online_cpus(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Called with mu held after a task ran: account for it and recycle its node. */
static void finish(pt_pool *p, node *t) {
    pt_task_group *g = t->g;
    p->active--;
    atomic_fetch_add_explicit(&p->done_pub, 1, memory_order_release);
    if (g && --g->pending == 0) pthread_cond_broadcast(&p->done_cv);
    if (p->shutdown && p->active == 0 && !p->head) pthread_cond_broadcast(&p->work_cv);
    t->next = p->free_nodes;
    p->free_nodes = t;
}

/* Called with mu held; returns with mu held. */
static void run_locked(pt_pool *p, node *t) {
    p->active++;
    pthread_mutex_unlock(&p->mu);
    t->fn(t->arg);
    pthread_mutex_lock(&p->mu);
    finish(p, t);
}

static void set_queued(pt_pool *p, size_t n) {
    p->n_queued = n;
    atomic_store_explicit(&p->queued_pub, n, memory_order_release);
}

static node *pop_head(pt_pool *p) {
    node *t = p->head;
    if (t) {
        p->head = t->next;
        if (!p->head) p->tail = NULL;
        set_queued(p, p->n_queued - 1);
    }
    return t;
}

/* First queued task of group g (FIFO among g's tasks), unlinked; NULL if none. */
static node *pop_group(pt_pool *p, const pt_task_group *g) {
    node *prev = NULL;
    for (node *t = p->head; t; prev = t, t = t->next) {
        if (t->g != g) continue;
        if (prev) prev->next = t->next;
        else p->head = t->next;
        if (p->tail == t) p->tail = prev;
        set_queued(p, p->n_queued - 1);
        return t;
    }
    return NULL;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Poll *x (without the lock) until it differs from `from` or the host clock
 * reaches `until`. Every 64 polls (a few us of pauses) the clock is read and
 * the core offered to any other runnable thread (sched_yield returns at once
 * when there is none): on an oversubscribed machine the thread we wait for
 * may be queued on this very core, and a pure spin would delay it. */
static void spin_until_change(const atomic_size_t *x, size_t from, double until) {
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(x, memory_order_acquire) != from) return;
        cpu_relax();
        if ((i & 63) == 0) {
            if (pt_now_s() >= until) return;
            sched_yield();
        }
    }
}

/* The end of the spin window that starts now (or already started: *until >=
 * 0); 0 when the window is over or spinning is off: sleep. */
static double spin_window(pt_pool *p, double *until) {
    long long ns = atomic_load_explicit(&p->spin_ns, memory_order_relaxed);
    if (ns <= 0) return 0;
    double now = pt_now_s();
    if (*until < 0) *until = now + (double)ns * 1e-9;
    return now < *until ? *until : 0;
}

static void *worker(void *arg) {
    pt_pool *p = arg;
    double until = -1; /* end of the current idle spin window; -1: none yet */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        node *t = pop_head(p);
        if (t) {
            run_locked(p, t);
            until = -1;
            continue;
        }
        if (p->shutdown && p->active == 0) {
            p->closed = 1;
            pthread_cond_broadcast(&p->work_cv); /* let the other idle workers see it */
            break;
        }
        double end = p->shutdown ? 0 : spin_window(p, &until);
        if (end > 0) {
            /* the queue is empty now (n_queued == 0 under mu); any submit from
             * here on changes queued_pub, and the loop re-checks under mu */
            atomic_fetch_add_explicit(&p->spinning, 1, memory_order_relaxed);
            pthread_mutex_unlock(&p->mu);
            spin_until_change(&p->queued_pub, 0, end);
            pthread_mutex_lock(&p->mu);
            atomic_fetch_sub_explicit(&p->spinning, 1, memory_order_relaxed);
            continue;
        }
        atomic_fetch_add_explicit(&p->sleeps, 1, memory_order_relaxed);
        pthread_cond_wait(&p->work_cv, &p->mu);
        until = -1;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int pt_pool_create(int n_threads, pt_pool **out, char *err, size_t errlen) {
    if (!out) return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "thread_pool: NULL output pool pointer");
    *out = NULL;
    if (n_threads < 0)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "thread_pool: n_threads = %d is negative (0 = all CPUs)",
                       n_threads);
    if (n_threads == 0) n_threads = online_cpus();
    pt_pool *p = calloc(1, sizeof *p);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    if (!p || !th) {
        free(p);
        free(th);
        return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                       "thread_pool: out of host memory creating a pool of %d threads", n_threads);
    }
    p->threads = th;
    atomic_init(&p->queued_pub, 0);
    atomic_init(&p->done_pub, 0);
    atomic_init(&p->spinning, 0);
    atomic_init(&p->spin_ns, (long long)PT_POOL_SPIN_NS_DEFAULT);
    atomic_init(&p->sleeps, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (int i = 0; i < n_threads; i++) {
        int rc = pthread_create(&th[i], NULL, worker, p);
        if (rc != 0) {
            p->n_threads = i; /* join the ones that started */
            pt_pool_destroy(p);
            return pt_fail(err, errlen, PT_ERR_HOST_OOM,
                           "thread_pool: pthread_create failed for worker %d of %d: %s", i, n_threads, strerror(rc));
        }
    }
    p->n_threads = n_threads;
    *out = p;
    return PT_OK;
}

void pt_pool_destroy(pt_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->shutdown = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    /* With zero workers (failed create) nothing ran the queue; it is empty then,
     * because create never returned the pool to anyone who could submit. */
    for (node *t = p->free_nodes; t;) {
        node *nx = t->next;
        free(t);
        t = nx;
    }
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int pt_pool_threads(const pt_pool *p) { return p ? p->n_threads : 0; }

int pt_pool_set_spin(pt_pool *p, double seconds) {
    if (!p || !(seconds >= 0) || seconds > 1.0) return PT_ERR_INVALID_ARG;
    atomic_store_explicit(&p->spin_ns, (long long)(seconds * 1e9), memory_order_relaxed);
    return PT_OK;
}

double pt_pool_get_spin(const pt_pool *p) {
    return p ? (double)atomic_load_explicit(&p->spin_ns, memory_order_relaxed) * 1e-9 : 0.0;
}

size_t pt_pool_sleeps(const pt_pool *p) {
    return p ? atomic_load_explicit(&p->sleeps, memory_order_relaxed) : 0;
}

int pt_pool_submit(pt_pool *p, pt_task_fn fn, void *arg, pt_task_group *g, char *err, size_t errlen) {
    if (!p || !fn)
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "thread_pool: submit with a NULL %s",
                       p ? "task function" : "pool");
    pthread_mutex_lock(&p->mu);
    if (p->closed) {
        pthread_mutex_unlock(&p->mu);
        return pt_fail(err, errlen, PT_ERR_ORDER,
                       "thread_pool: submit after the pool finished draining for destroy");
    }
    if (g && g->pool && g->pool != p) {
        pthread_mutex_unlock(&p->mu);
        return pt_fail(err, errlen, PT_ERR_INVALID_ARG, "thread_pool: the task group belongs to another pool");
    }
    node *t = p->free_nodes;
    if (t) {
        p->free_nodes = t->next;
    } else {
        /* malloc under the lock is rare (only while the free list grows). */
        t = malloc(sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&p->mu);
            return pt_fail(err, errlen, PT_ERR_HOST_OOM, "thread_pool: out of host memory for a task node");
        }
    }
    t->next = NULL;
    t->fn = fn;
    t->arg = arg;
    t->g = g;
    if (g) {
        g->pool = p;
        g->pending++;
        g->submitted++;
    }
    if (p->tail) p->tail->next = t;
    else p->head = t;
    p->tail = t;
    set_queued(p, p->n_queued + 1);
    /* a spinner takes a task without being woken; more tasks than spinners
     * need a sleeper (a spinner that is just giving up re-checks under mu) */
    if (p->n_queued > atomic_load_explicit(&p->spinning, memory_order_relaxed))
        pthread_cond_signal(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    return PT_OK;
}

int pt_pool_wait(pt_pool *p, pt_task_group *g) {
    if (!p || !g) return PT_ERR_INVALID_ARG;
    pthread_mutex_lock(&p->mu);
    if (g->pool && g->pool != p) {
        pthread_mutex_unlock(&p->mu);
        return PT_ERR_INVALID_ARG;
    }
    double until = -1; /* end of the current spin window; -1: none yet */
    while (g->pending > 0) {
        node *t = pop_group(p, g);
        if (t) {
            run_locked(p, t);
            until = -1;
            continue;
        }
        /* Everything left of g is running on other threads: poll for a
         * finish first (once per wake-up), then sleep. */
        double end = spin_window(p, &until);
        if (end > 0) {
            /* any finish (this group's or another's) ends a poll; the loop
             * re-checks g under mu and polls on until the window closes */
            size_t epoch = atomic_load_explicit(&p->done_pub, memory_order_acquire);
            pthread_mutex_unlock(&p->mu);
            spin_until_change(&p->done_pub, epoch, end);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        atomic_fetch_add_explicit(&p->sleeps, 1, memory_order_relaxed);
        pthread_cond_wait(&p->done_cv, &p->mu);
        until = -1;
    }
    pthread_mutex_unlock(&p->mu);
    return PT_OK;
}

size_t pt_pool_pending(pt_pool *p, const pt_task_group *g) {
    if (!p || !g) return 0;
    pthread_mutex_lock(&p->mu);
    size_t n = g->pool == p ? g->pending : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* ---- parallel-for: pieces of `grain` handed out by an atomic counter ---- */

typedef struct pf_job {
    pt_range_fn fn;
    void *arg;
    size_t n, grain, pieces;  /* pieces = ceil(n / grain) */
    atomic_size_t next;       /* next piece index to hand out */
} pf_job;

static void pf_task(void *a) {
    pf_job *j = a;
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->pieces) break;
        size_t b = i * j->grain;
        size_t e = j->n - b < j->grain ? j->n : b + j->grain;
        j->fn(j->arg, b, e);
    }
}

int pt_pool_parallel_for(pt_pool *p, size_t n, size_t grain, pt_range_fn fn, void *arg) {
    if (!fn) return PT_ERR_INVALID_ARG;
    if (n == 0) return PT_OK;
    if (!p) {
        fn(arg, 0, n);
        return PT_OK;
    }
    size_t nt = (size_t)p->n_threads;
    if (grain == 0) grain = (n + nt - 1) / nt;
    pf_job j = {.fn = fn, .arg = arg, .n = n, .grain = grain, .pieces = n / grain + (n % grain != 0)};
    atomic_init(&j.next, 0);
    /* The caller is one of the runners, so queue at most threads-1 helpers.
     * Pieces are pulled dynamically, so a failed submit only means fewer
     * runners: the caller's own loop still covers every piece. */
    size_t helpers = (j.pieces < nt ? j.pieces : nt) - 1;
    pt_task_group g = PT_TASK_GROUP_INIT;
    for (size_t i = 0; i < helpers; i++)
        if (pt_pool_submit(p, pf_task, &j, &g, NULL, 0) != PT_OK) break;
    pf_task(&j);
    return pt_pool_wait(p, &g);
}
