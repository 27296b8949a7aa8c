/*
 * tier.h — the disk tier ([nvme] path): where the optimizer states of the
 * offloaded chunks live when the chunks do not fit [memory] pinned_budget.
 *
 * A tiered chunk keeps h_param and h_gstage in pinned memory (the upload source
 * and the gradient landing zone); its fp32 Adam moments m, v (and the fp32
 * masters of its 16-bit regions) live in one file per rank under the folder,
 * one record per chunk: [m | v | master], E fp32 words each (E = the chunk's
 * n_state), the record padded to [nvme] block_size. Outside a step the chunk's
 * h_m / h_v / h_master are NULL. A step passes through one of staging_slots
 * pinned buffers, each as large as the largest record:
 *
 *   want (hook thread, where the step's task is queued): the record's read is
 *        queued; it starts once a slot is free and no write of the same chunk
 *        is in flight (reads start in the order they were wanted);
 *   begin (the step's task, on a CPU worker): waits for the read, points h_m,
 *        h_v, h_master into the slot;
 *   end  (same task, after the step): the pointers cleared, the record's
 *        write-back queued; the slot is free once it is on disk.
 *
 * So the CPU steps chunk k while io_threads read the chunks after it and
 * write the ones before it back. Reads are wanted in the order the tasks are
 * queued and the worker pool starts tasks in FIFO order, so every slot is held
 * by a chunk whose task has started: a task waiting for its read never waits
 * on a task that cannot run.
 *
 * The tier is scratch: state images and files read and write the states
 * through views (ordinary memory, read from and written to the file), so a
 * resume refills it; the files are removed when the store is destroyed.
 */
#ifndef PT_STORE_TIER_H
#define PT_STORE_TIER_H

#include <stddef.h>
#include <stdint.h>

struct pt_store;
struct cs_chunk;
typedef struct pt_tier pt_tier;

/* Pinned bytes the staging buffers take for the chunks marked tiered, each
 * allocation rounded as the pinned arena carves it when rounded. */
uint64_t pt_tier_staging_bytes(const struct pt_store *st, int rounded);
/* Open the tier for the chunks marked tiered: lock, file (reserved in full),
 * staging buffers, I/O threads. Refusals name the folder and the cause. */
int pt_tier_open(struct pt_store *st, char *err, size_t errlen);
/* Wait for every read and write, stop the threads, remove the files, free the
 * staging buffers; logs what the tier moved. NULL-safe. */
void pt_tier_close(struct pt_store *st);
/* Hook thread: chunk c's step will be queued next; its read is queued now. */
void pt_tier_want(struct pt_store *st, struct cs_chunk *c);
/* The step's task: wait for c's states in a slot (queued here if no want did)
 * and point c's h_m / h_v / h_master at them. Non-zero: the read failed (the
 * tier keeps the sentence); end(c, 0) must still follow. */
int pt_tier_begin(struct pt_store *st, struct cs_chunk *c);
/* After the step: write = 1 queues the write-back, 0 drops the slot. */
void pt_tier_end(struct pt_store *st, struct cs_chunk *c, int write);
/* Every queued read and write done; the first I/O failure (with its sentence). */
int pt_tier_sync(struct pt_store *st, char *err, size_t errlen);
/* The first I/O failure so far, without waiting (0: none). */
int pt_tier_failed(struct pt_store *st, char *err, size_t errlen);
/* The states of every tiered chunk in ordinary memory (fill: read from the
 * file, else zeroed), for state images and the initial fill; close writes them
 * back when store, then frees them. */
int pt_tier_views_open(struct pt_store *st, int fill, char *err, size_t errlen);
int pt_tier_views_close(struct pt_store *st, int store, char *err, size_t errlen);

/* One chunk's states in ordinary memory (after its steps and I/O are done),
 * for a parameter written between steps; close writes them back when store. */
int pt_tier_chunk_open(struct pt_store *st, struct cs_chunk *c, char *err, size_t errlen);
int pt_tier_chunk_close(struct pt_store *st, struct cs_chunk *c, int store, char *err,
                        size_t errlen);

/* What the tier has moved since it opened (zeros when there is no tier):
 * bytes and I/O-thread seconds each way, and the seconds the steps, uploads
 * and gradient copies waited for a chunk's image (its read, and a free slot
 * before it): the tier's exposed time. hidden share = 1 - wait_s / (rd_s + wr_s)
 * bounds how much of the I/O ran under other work. */
typedef struct pt_tier_counters {
    uint64_t rd_bytes, wr_bytes;
    int64_t reads, writes;
    double rd_s, wr_s, wait_s;
    double probe_rd_bps, probe_wr_bps; /* the rates timed at open (one record each way) */
    int level;                         /* 0: no tier, 1: states, 2: whole chunk images */
} pt_tier_counters;
void pt_tier_get_counters(const struct pt_store *st, pt_tier_counters *out);

#endif
