/*
 * fakenccl_works.c — a stand-in NCCL transport library (table version 1) for
 * the collectives front's tests on a machine without NCCL's GPUs: world 1
 * only, no device. unique_id hands out a recognisable pattern and open checks
 * that exactly those bytes arrived (so the id provably travelled through the
 * rendezvous); the collectives apply the scale (world 1's sum is the buffer)
 * and count calls; a collective whose name contains "FAIL" fails, so the front's
 * broken-group handling can be seen. fakenccl_calls() returns the count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/coll_nccl.h"

static int calls, closes;
__attribute__((visibility("default"))) int fakenccl_calls(void) { return calls; }
__attribute__((visibility("default"))) int fakenccl_closes(void) { return closes; }

static void describe(char *buf, size_t cap) { snprintf(buf, cap, "fake NCCL"); }
static int unique_id(unsigned char id[PT_NCCL_ID_BYTES], char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    for (int i = 0; i < PT_NCCL_ID_BYTES; i++) id[i] = (unsigned char)(255 - i);
    return 0;
}
static int fopen_(const unsigned char id[PT_NCCL_ID_BYTES], int rank, int world, int device,
                  double timeout_s, void **out, char *err, size_t errlen) {
    (void)device;
    (void)timeout_s;
    for (int i = 0; i < PT_NCCL_ID_BYTES; i++)
        if (id[i] != (unsigned char)(255 - i)) {
            snprintf(err, errlen, "fake NCCL: id byte %d did not arrive", i);
            return 6;
        }
    if (world != 1 || rank != 0) {
        snprintf(err, errlen, "fake NCCL: world 1 only");
        return 8;
    }
    *out = malloc(1);
    return 0;
}
static void fclose_(void *h) {
    closes++;
    free(h);
}
static int scale_(void *buf, size_t n, int32_t dtype, double scale, const char *what, char *err,
                  size_t errlen) {
    calls++;
    if (strstr(what, "FAIL")) {
        snprintf(err, errlen, "fake NCCL: %s failed on purpose", what);
        return 6;
    }
    for (size_t i = 0; i < n; i++) {
        if (dtype == PT_COLL_F64) ((double *)buf)[i] *= scale;
        else ((float *)buf)[i] *= (float)scale;
    }
    return 0;
}
static int allreduce(void *h, void *buf, size_t n, int32_t dtype, double scale, const char *what,
                     char *err, size_t errlen) {
    (void)h;
    return scale_(buf, n, dtype, scale, what, err, errlen);
}
static int allgather(void *h, void *buf, size_t n, size_t es, const char *what, char *err,
                     size_t errlen) {
    (void)h;
    (void)es;
    return scale_(buf, 0 * n, PT_COLL_F32, 1.0, what, err, errlen);
}
static int barrier(void *h, char *err, size_t errlen) {
    (void)h;
    return scale_(NULL, 0, PT_COLL_F32, 1.0, "barrier", err, errlen);
}

__attribute__((visibility("default"))) const pt_nccl_coll_ops pt_nccl_coll_v1 = {
    PT_NCCL_COLL_VERSION,
    (uint32_t)sizeof(pt_nccl_coll_ops),
    describe,
    unique_id,
    fopen_,
    fclose_,
    allreduce,
    allgather,
    allreduce,
    barrier,
};
