/*
 * tier_int.h — the disk tier's own state, shared by tier.c (staging slots,
 * I/O threads, views) and tier_file.c (lock, file, record I/O) only.
 */
#ifndef PT_STORE_TIER_INT_H
#define PT_STORE_TIER_INT_H

#include <pthread.h>

#include "../store_internal.h"
#include "tier.h"

/* A chunk's image: not in a slot, being read into one, in one (clean unless a
 * holder marked it dirty), being written back from one. */
enum { TC_IDLE,
       TC_READING,
       TC_READY,
       TC_WRITING };

/* Byte offsets of a record's sections, UINT64_MAX where it has none. */
typedef struct tier_sec {
    uint64_t param, gstage, m, v, master, gacc;
} tier_sec;

typedef struct tier_job {
    int write;   /* 0: read chunk's record into its slot; 1: write it back */
    int chunk;
    uint64_t from, to; /* the bytes of the record (a read: the part not yet in the slot) */
    int upto;          /* a read: the image's validity after it (tier_int.h: valid) */
} tier_job;

struct pt_tier {
    pt_store *st;
    char dir[512], file[600], lock[600];
    int fd, lock_fd, direct;
    uint64_t blk, budget, total;
    int level;       /* 1: states only, 2: whole chunk images (tier.h) */
    /* per chunk (by id): record offset, length and sections in the file; image
     * state, slot, holders, queued for a slot, marks for the last drop, last use */
    uint64_t *off, *len;
    tier_sec *sec;
    int *cs, *slot, *ref, *queued, *dirty, *discard;
    int *use;        /* a holder asked for its address or contents: not taken from its slot */
    int *valid;      /* in its slot: 0 nothing, 1 the parameters (level 2's first
                      * section, plen bytes), 2 the whole record */
    int *need;       /* what its holders need (1: an upload's parameters, 2: all) */
    uint64_t *plen;  /* the record's first bytes that hold the parameters (level 2) */
    int *waiting;    /* threads waiting for its slot or read */
    uint64_t *lru, tick;
    /* staging slots: pinned allocation, its aligned start, the chunk it holds */
    int n_slots;
    uint64_t slot_bytes;
    void **slot_alloc;
    char **slot_mem;
    int *slot_chunk;
    /* held images waiting for a slot (FIFO of chunk ids) and the I/O threads' jobs */
    int *q, qh, qn;
    tier_job *jobs;
    int jh, jn, jcap, busy;
    pthread_t *th;
    int n_th, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    /* the first failure, sticky */
    int err_rc;
    char err[512];
    /* accounting (mu) */
    uint64_t rd_bytes, wr_bytes;
    double rd_s, wr_s, wait_s;
    double probe_rd_bps, probe_wr_bps;
    int64_t reads, writes, tried; /* tried: write-backs started (the testing failure) */
    /* views (state images): ordinary memory per tiered chunk */
    char **view;
};

int pt_tier_file_open(pt_tier *t, int rank, char *err, size_t errlen);
void pt_tier_file_close(pt_tier *t);
/* The sentence of a failed write (errno e) of `what`: a full disk and a
 * file-size limit named as such. */
int pt_tier_io_fail(pt_tier *t, int e, const char *what, char *err, size_t errlen);
int pt_tier_rw(pt_tier *t, int write, void *buf, uint64_t off, uint64_t len, char *err,
               size_t errlen);

#endif
