/*
 * cuda_runtime_api.h (simulated) — the CUDA runtime calls the NCCL transport
 * uses, declared for tests/unit/test_nccl_sim.c, which implements them on the
 * host (see nccl.h here). Not NVIDIA's header.
 */
#ifndef PT_SIM_CUDA_RUNTIME_API_H
#define PT_SIM_CUDA_RUNTIME_API_H

#include <stddef.h>

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNotReady = 600,
} cudaError_t;

typedef struct sim_stream *cudaStream_t;

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1,
                      cudaMemcpyDeviceToHost = 2 };
#define cudaStreamNonBlocking 0x01

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);

#endif
