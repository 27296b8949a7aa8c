/*
 * ord_bits.h — the orderings a test may switch off, one bit each: the mask of
 * [testing] debug_skip_ordering (accepted only with PROTRAIN_TESTING=1). Not
 * part of the store's interface (store.h): the store's internals and the
 * runtime code that honours an ordering test the bits, and tests name them
 * for their negative controls. tests/check_layers.sh lets this header, besides
 * store.h, cross the store's boundary.
 */
#ifndef PT_STORE_ORD_BITS_H
#define PT_STORE_ORD_BITS_H

/* The orderings after an asynchronous host's compute, one bit each so a test
 * can drop one at a time ([testing] debug_skip_ordering) and show that it
 * fails without it. */
enum {
    PT_ORD_UPLOAD = 1,   /* the compute stream waits for uploads (chunks, swap-ins) */
    PT_ORD_SLOT = 2,     /* a buffer slot is refilled or its gradient zeroed only after
                            the compute stream's last use of it */
    PT_ORD_GRAD = 4,     /* a gradient copy to the host starts after the backward */
    PT_ORD_SWAP = 8,     /* swap-out after the forward; swap-in after frees in compute order */
    PT_ORD_FREE = 16,    /* frees (and their poison) in the compute stream's order */
    PT_ORD_STEP = 32,    /* optimizer_step's slot poison and parameter reads after compute */
    PT_ORD_HOSTIO = 64,  /* the host's memcpy after its launched work */
    PT_ORD_OSFT = 128,   /* OSFT's gradient projection behind the block's backward on
                            s_compute (skipped: at once, on the host's thread) */
    PT_ORD_DEFER = 256,  /* a chunk's upload after its deferred CPU step */
    PT_ORD_SHARD = 512,  /* mode C: a chunk's all-gather after its part's upload, its
                            reduce-scatter after the host's backward */
    PT_ORD_BUCKET = 1024, /* several ranks: a gradient bucket's all-reduce starts once the
                             gradient is final (resident: the compute stream finished
                             the chunk's backward; offloaded: its CPU task formed the sum) */
    PT_ORD_STEPPED = 2048, /* chunk_stepped after a chunk's CPU step, inside the step's
                            task (skipped: before the step) */
    PT_ORD_RKSHARD = 4096, /* mode C REKLS: the owner's update reaches the other ranks'
                            * parts of the param (skipped: only the owner's part moves) */
    PT_ORD_RKLOAD = 8192,  /* mode C REKLS: a restored state's REKLS part reaches each
                            * param's owner (skipped: the owners keep what they had) */
    PT_ORD_TIER_READ = 16384, /* the disk tier reads a chunk's states into its staging
                               * buffer before the step (skipped: the buffer keeps what
                               * it held) */
    PT_ORD_TIER_WRITE = 32768, /* the disk tier writes a stepped chunk's states back
                                * (skipped: dropped) */
    PT_ORD_ALL = 65535
};

#endif
