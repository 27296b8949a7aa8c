/*
 * optim.h — the optimizers subsystem's interface: a worker pool with waitable
 * task groups (thread_pool.h) and the vectorised, multi-threaded CPU AdamW
 * with its bulk dtype converters (cpu_adam.h), and the REKLS step written
 * against a table of linear-algebra operations (rekls.h); and the optimizer
 * kinds as the chunk store calls them (optim_kind.h: one table per kind, AdamW
 * and REKLS). Code outside runtime/optim includes this header only. The
 * kinds' store sides (optim_kind.c, rekls_store.c, rekls_dist.c) reach the
 * store's private header; the rest of runtime/optim depends on nothing else
 * in runtime/.
 */
#ifndef PT_OPTIM_H
#define PT_OPTIM_H

#include "thread_pool.h"
#include "cpu_adam.h"
#include "rekls.h"
#include "rekls_tp.h"
#include "optim_kind.h"

#endif
