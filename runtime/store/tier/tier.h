/*
 * tier.h — the disk tier ([nvme] path): where the offloaded chunks live when
 * they do not fit [memory] pinned_budget. One file per rank under the folder,
 * one record per tiered chunk, padded to [nvme] block_size, at two levels:
 *
 *   1 (states): [m | v | masters of 16-bit regions], E fp32 words each (E =
 *     the chunk's n_state); h_param, h_gstage and h_gacc stay pinned;
 *   2 (whole images, when level 1 still does not fit): [params U | gradient
 *     landing zone U | m | v | masters | fp32 gradient sum], U the chunk's
 *     parameter bytes; nothing of the chunk stays pinned.
 *
 * Pinned memory holds staging_slots buffers, each the largest record plus one
 * block. The slots cache images: a chunk's host pointers (h_m, h_v, h_master;
 * at level 2 h_param, h_gstage, h_gacc too) point into its slot only while
 * somebody holds it, else NULL.
 *
 *   hold  (any thread): one more holder; the image's read is queued unless it
 *         is in a slot already. Images get slots in the order they were first
 *         held (a read ahead), an image some thread waits for first; a slot
 *         goes to the next one when it is free or holds a clean image nobody
 *         holds (the least recently used);
 *   slot  (hook thread): wait until the held image has its slot and point the
 *         chunk at it, so a device copy can be queued at that address behind
 *         pt_tier_stream_ready on its stream;
 *   ready (a CPU task): wait until the image is in its slot and point at it;
 *   drop  (clean, dirty: the holder changed it, discard: its changes are not
 *         to be kept): the last holder's drop queues the write-back of a dirty
 *         image; the slot keeps the image, clean, once it is on disk.
 *
 * Why it cannot deadlock: an image in use (its holder asked for its slot or
 * its contents) stays in its slot until its last holder drops it, and every
 * such holder finishes without another slot (a task steps the chunk; a device
 * copy runs on its stream behind copies of images in use and deferred steps of
 * chunks whose images it holds). A thread that waits for an image gets the
 * next slot that is free, clean and unheld, or held but not in use yet (that
 * image goes back to the queue) before any read ahead does.
 *
 * The tier is scratch: state images and files read and write the records
 * through views (ordinary memory, read from and written to the file, with the
 * image out of every slot), so a resume refills it; the files are removed
 * when the store is destroyed.
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
enum { PT_TIER_CLEAN,
       PT_TIER_DIRTY,
       PT_TIER_DISCARD };
/* The tier's level (0: no tier). */
int pt_tier_level(const struct pt_store *st);
void pt_tier_hold(struct pt_store *st, struct cs_chunk *c);
/* Level 2, an upload: a hold that needs only the parameters, so only the
 * record's first blocks are read (the rest as well where another holder
 * needs them). */
void pt_tier_hold_params(struct pt_store *st, struct cs_chunk *c);
void pt_tier_slot(struct pt_store *st, struct cs_chunk *c);
/* Non-zero: the tier failed (it keeps the sentence); drop must still follow. */
int pt_tier_ready(struct pt_store *st, struct cs_chunk *c);
void pt_tier_drop(struct pt_store *st, struct cs_chunk *c, int how);
/* Host functions on a device stream (arg: the chunk, its owner the store):
 * wait for the image in its slot; drop a clean hold after an upload. */
void pt_tier_stream_ready(void *chunk);
void pt_tier_stream_drop(void *chunk);
/* Automatic staging slots (staging_slots = auto) beyond 3 given back, as many
 * as bytes more pinned bytes need under pinned_budget, after every step and
 * I/O is done (the gradient sums several micro-batches allocate at their first
 * step). No tier, fixed slots, or room enough: nothing. */
int pt_tier_make_room(struct pt_store *st, uint64_t bytes, char *err, size_t errlen);
/* Every queued read and write done; the first I/O failure (with its sentence). */
int pt_tier_sync(struct pt_store *st, char *err, size_t errlen);
/* The first I/O failure so far, without waiting (0: none). */
int pt_tier_failed(struct pt_store *st, char *err, size_t errlen);
/* Every tiered chunk's record in ordinary memory, for state images; close
 * writes them back when store, then frees them. */
int pt_tier_views_open(struct pt_store *st, int fill, char *err, size_t errlen);
int pt_tier_views_close(struct pt_store *st, int store, char *err, size_t errlen);

/* One chunk's record in ordinary memory (fill: read from the file, else
 * zeroed), after its holders are done: a parameter read or written between
 * steps, the initial values; close writes it back when store. */
int pt_tier_chunk_open(struct pt_store *st, struct cs_chunk *c, int fill, char *err,
                       size_t errlen);
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
