/*
 * optim_kind.h — an optimizer kind as the chunk store sees it: one table per
 * kind (AdamW, REKLS), so the store's step code calls the table and never
 * names a kind. The store holds the table in force (pt_store.ok) and one
 * pointer each to the kind's own state per store and per chunk; the kind
 * allocates and frees that state. The tables' code lives beside this header
 * in runtime/store/kinds (optim_kind.c: the tables and AdamW's chunk steps;
 * rekls_store.c and rekls_dist.c: REKLS's), the one place where a kind's code
 * knows the store's layout; the math they call (CPU AdamW, the REKLS step,
 * the worker pool) is runtime/optim's, which knows no store
 * (tests/check_layers.sh).
 *
 * What the store calls, in the order of a run:
 *  layout      plan_chunk per chunk, then plan_store: the planner terms
 *              (pt_optim_terms, kept in the chunk) of the kind planned for,
 *              the one create_optimizer chose or before that the INI's;
 *  create_optimizer   init (after the Adam moments exist), with the kind
 *              chosen; a store laid out for another kind first hands that
 *              kind's state back (its fini);
 *  optimizer_step     dev_step per resident trainable chunk; cpu_step per
 *              offloaded chunk (whole_task: one task on one worker, else the
 *              AdamW runners every worker shares); pass after the global norm
 *              and before the chunk steps (the steps that need collectives);
 *              failed after the CPU tasks are waited for;
 *  state images       param_state per trainable root param (the words the
 *              image holds beyond master, m and v), and in mode C views_open
 *              / views_close around the walk;
 *  teardown    fini.
 * And for the profiler (through the store, pt_store_chunk_optim_cpu_s):
 * cpu_seconds, the planner's CPU time of a chunk's optimizer-own work.
 * A NULL entry: the kind has nothing to do there.
 */
#ifndef PT_OPTIM_KIND_H
#define PT_OPTIM_KIND_H

#include <stddef.h>
#include <stdint.h>

#include "optim/optim.h"

struct pt_store;
struct cs_chunk;

/* One CPU step of a chunk: AdamW constants, gradient from the fp32 accumulator
 * (from_acc) or the staged copy, lr, clip scale and 1-based step; grp NULL
 * steps it on this thread, else AdamW's runners go into grp with hooks h. */
typedef struct pt_optim_cpu {
    const pt_adamw_consts *k;
    int from_acc;
    float lr, gs;
    int64_t step;
    pt_task_group *grp;
    const pt_cpu_adam_hooks *h;
} pt_optim_cpu;

typedef struct pt_optim_kind {
    const char *name;
    int id;   /* its PT_OPTIM_* (protrain.h): what a state file records */
    void (*plan_chunk)(struct pt_store *st, struct cs_chunk *c);
    int (*plan_store)(struct pt_store *st, char *err, size_t errlen);
    int (*init)(struct pt_store *st, char *err, size_t errlen);
    void (*fini)(struct pt_store *st);
    /* 1: chunk c's CPU step is one task on one worker */
    int (*whole_task)(const struct cs_chunk *c);
    /* resident chunk c on the compute stream (its gradient is zeroed after) */
    int (*dev_step)(struct pt_store *st, struct cs_chunk *c, float lr, float gs, char *err,
                    size_t errlen);
    void (*cpu_step)(struct pt_store *st, struct cs_chunk *c, const pt_optim_cpu *a);
    int (*pass)(struct pt_store *st, float lr, float gs, char *err, size_t errlen);
    /* a CPU step's failure (non-zero status), taken: the next call returns 0 */
    int (*failed)(struct pt_store *st);
    /* root param i's state words in an image: *words of them at the result
     * (NULL: this rank holds none while words > 0); 0 words: none */
    float *(*param_state)(struct pt_store *st, int i, uint64_t *words);
    int (*views_open)(struct pt_store *st, int gather, char *err, size_t errlen);
    void (*views_close)(struct pt_store *st, int scatter);
    /* seconds of one step, on one CPU thread, of the work the kind adds to
     * the Adam update for a chunk with terms t (0 when t holds none) */
    double (*cpu_seconds)(pt_optim_rates *r, const pt_optim_terms *t);
} pt_optim_kind;

extern const pt_optim_kind pt_optk_adamw, pt_optk_rekls;

/* The table of optimizer type t (PT_OPTIM_*; 0 and unknown read as AdamW). */
const pt_optim_kind *pt_optk_of(int t);
/* The table whose id is id, or NULL when no kind has it. */
const pt_optim_kind *pt_optk_find(int id);

#endif
