/*
 * thread_pool.h — a small pthread worker pool with waitable task groups.
 *
 * Used by the CPU Adam (cpu_adam.h) and the chunk store so that one chunk's
 * optimizer update can be queued the moment its gradient lands on the host
 * and run on the workers while the device keeps doing backward (the CPU step
 * hides behind backward instead of following it), and by anything else that
 * wants a parallel-for.
 *
 * Semantics:
 *  - Workers start tasks in submission order (one FIFO queue, no priorities);
 *    a waiting caller may pull its own group's tasks ahead of that order.
 *  - A pt_task_group counts the tasks submitted with it that have not finished.
 *    pt_pool_wait(pool, g) returns when that count is zero. While waiting,
 *    the caller runs queued tasks of the SAME group itself (never other
 *    groups' tasks, so a wait is not delayed by unrelated long work). Nested
 *    fork-join (a task that submits to its own sub-group and waits on it) is
 *    therefore deadlock-free for any pool size >= 1. (A task must not wait
 *    on a group it belongs to itself: that waits for its own return.)
 *  - Submitting from any thread (including from inside a task) is safe.
 *  - pt_pool_destroy drains: every task already queued, and every task those
 *    tasks submit while the pool drains, runs before the workers are joined.
 *    Submissions that arrive after the drain finished are refused.
 *  - A group is bound to the pool of its first submission; using it with a
 *    second pool is refused (PT_ERR_INVALID_ARG).
 *  - Idle threads spin briefly before sleeping: a worker that finds the queue
 *    empty, and a waiter whose group's remaining tasks run on other threads,
 *    poll for up to the pool's spin time (pt_pool_set_spin; default
 *    PT_POOL_SPIN_NS_DEFAULT) before blocking on a condition variable. Waking
 *    a sleeping thread costs 5-50 us, a large part of an in-cache CPU Adam
 *    step; the spin is bounded, so an idle pool still sleeps.
 *
 * Errors: pt_pool_create and pt_pool_submit return a pt_status
 * (host_api/protrain.h, 0 = PT_OK) and write one sentence into the caller's
 * err buffer (may be NULL); pt_pool_wait and pt_pool_parallel_for fail only
 * on misuse and return the code alone.
 */
#ifndef PT_THREAD_POOL_H
#define PT_THREAD_POOL_H

#include <stddef.h>

typedef struct pt_pool pt_pool;

/* Default idle spin: 30 us. It covers what a back-to-back step waits for (the
 * next submission, a few us; the last slice on the other thread, ~20 us for
 * 32K elements) and a futex wake-up (5-50 us), while a pool that gets one burst
 * of work per few milliseconds burns under 1% of a core. Measured on 2 threads
 * (bench_cpu_adam, loaded 2-core VM): 20 us already gives most of the in-cache
 * gain; the runtime's chunk tasks come milliseconds apart, so a longer spin
 * only burns CPU the host's own threads may need. A build may
 * override it (EXTRA_CFLAGS=-DPT_POOL_SPIN_NS_DEFAULT=0LL: the pool without
 * spinning, for comparisons). */
#ifndef PT_POOL_SPIN_NS_DEFAULT
#define PT_POOL_SPIN_NS_DEFAULT 30000LL
#endif

/* A waitable set of tasks. Zero-initialise (PT_TASK_GROUP_INIT) before first
 * use; no destroy needed. Fields are private:
 * they are read and written only under the owning pool's lock. */
typedef struct pt_task_group {
    pt_pool *pool;        /* pool of the first submission, NULL until then */
    size_t pending;       /* submitted and not yet finished */
    size_t submitted;     /* total ever submitted (statistics, tests) */
} pt_task_group;

#define PT_TASK_GROUP_INIT {0, 0, 0}

typedef void (*pt_task_fn)(void *arg);
/* Body of a parallel-for slice: process [begin, end). */
typedef void (*pt_range_fn)(void *arg, size_t begin, size_t end);

/* Create a pool of n_threads workers into *out; 0 = the CPUs this process may
 * run on (sched_getaffinity count, else sysconf online cores). PT_OK, or
 * PT_ERR_INVALID_ARG (negative n_threads, NULL out) or PT_ERR_HOST_OOM (no
 * memory, or a worker thread could not start) with *out NULL. */
int pt_pool_create(int n_threads, pt_pool **out, char *err, size_t errlen);

/* Drain every queued task (see above), join the workers, free the pool.
 * Must not be called from one of the pool's own tasks. NULL is a no-op. */
void pt_pool_destroy(pt_pool *pool);

int pt_pool_threads(const pt_pool *pool);

/* Idle spin before sleeping, in seconds (0 = sleep at once, the behaviour
 * without spinning); takes effect at the next idle period. PT_OK, or
 * PT_ERR_INVALID_ARG for a NULL pool or a value outside [0, 1] s. */
int pt_pool_set_spin(pt_pool *pool, double seconds);
double pt_pool_get_spin(const pt_pool *pool);
/* How many times a worker or a waiter blocked on a condition variable so
 * far (statistics: tests check that a spin avoids them). */
size_t pt_pool_sleeps(const pt_pool *pool);

/* Queue fn(arg). g may be NULL (fire and forget; pt_pool_destroy still runs
 * it). Returns PT_OK, PT_ERR_INVALID_ARG (NULL pool/fn, group bound to another
 * pool), PT_ERR_HOST_OOM (no memory for the task node) or PT_ERR_ORDER (the
 * pool has finished draining). */
int pt_pool_submit(pt_pool *pool, pt_task_fn fn, void *arg, pt_task_group *g, char *err, size_t errlen);

/* Block until every task of g has finished, running g's queued tasks on the
 * calling thread meanwhile. A group that was never submitted to returns at
 * once. Returns PT_OK, or PT_ERR_INVALID_ARG without a sentence: it fails only
 * on misuse (NULL pool or group, a group bound to another pool). */
int pt_pool_wait(pt_pool *pool, pt_task_group *g);

/* Number of g's tasks not yet finished (a snapshot). */
size_t pt_pool_pending(pt_pool *pool, const pt_task_group *g);

/* Run fn over [0, n) in slices of `grain` elements (the last may be shorter),
 * spread over the workers and the caller, and wait. grain 0 picks
 * ceil(n / threads). pool NULL runs fn(arg, 0, n) inline. A helper task that
 * cannot be queued only means fewer runners: the caller still covers every
 * slice. Returns PT_OK, or PT_ERR_INVALID_ARG without a sentence for a NULL
 * fn (misuse). */
int pt_pool_parallel_for(pt_pool *pool, size_t n, size_t grain, pt_range_fn fn, void *arg);

#endif /* PT_THREAD_POOL_H */
