/*
 * nccl.h (simulated) — the part of NCCL's API the NCCL transport
 * (gpu/coll/nccl/coll_nccl.c) uses, declared for tests/unit/test_nccl_sim.c, which
 * implements it in-process (ranks are threads, "device" memory is host memory)
 * so the transport's own logic runs on a machine without a GPU. Names and
 * meanings follow NCCL's documentation; nothing here is NCCL's code.
 */
#ifndef PT_SIM_NCCL_H
#define PT_SIM_NCCL_H

#include <stddef.h>

#include "cuda_runtime_api.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)
#define NCCL_UNIQUE_ID_BYTES 128

typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct sim_comm *ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclInt8 = 0,
               ncclUint8 = 1,
               ncclFloat32 = 7,
               ncclFloat64 = 8 } ncclDataType_t;

typedef struct {
    size_t size;
    unsigned magic, version;
    int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION_CODE, -1}

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
const char *ncclGetErrorString(ncclResult_t r);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream);

#endif
