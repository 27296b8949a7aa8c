/*
 * optim.h — the optimizers subsystem's interface: a worker pool with waitable
 * task groups (thread_pool.h) and the vectorised, multi-threaded CPU AdamW
 * with its bulk dtype converters (cpu_adam.h), the REKLS step written against
 * a table of linear-algebra operations (rekls.h, rekls_tp.h), AdamW over a
 * chunk's narrow view (optim_chunk.h: its regions, copies and state, as the
 * store hands them to the kinds), and the kind-neutral terms a kind's state
 * and work amount to per chunk (optim_terms.h). Code outside runtime/optim includes this header only.
 * runtime/optim is the math: it depends on nothing else in runtime/ (the
 * kinds' tables, which know the chunk store's layout, are the store's:
 * runtime/store/kinds).
 */
#ifndef PT_OPTIM_H
#define PT_OPTIM_H

#include "thread_pool.h"
#include "cpu_adam.h"
#include "rekls.h"
#include "rekls_tp.h"
#include "optim_terms.h"
#include "optim_chunk.h"

#endif
