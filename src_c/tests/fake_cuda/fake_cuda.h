/*
 * fake_cuda.h - the controls of the fake CUDA runtime (fake_cuda.c), a test
 * library with the CUDA runtime's own function names and types
 * (cuda_runtime_api.h) that runs on the CPU: "device" memory in a registry,
 * one worker thread per stream that delays every copy and kernel, events,
 * contexts per device, and error injection. Tests only; never linked into
 * the library users get.
 */
#ifndef HPCDL_FAKE_CUDA_H
#define HPCDL_FAKE_CUDA_H

#include <stddef.h>
#include <cuda_runtime_api.h>

// A "kernel": fn(arg) runs on the stream's worker thread after the delay,
// in order with the stream's copies. arg is copied (bytes) at the call.
typedef void (*fake_cuda_fn)(void *arg);
cudaError_t fake_cuda_launch(cudaStream_t s, fake_cuda_fn fn, const void *arg, size_t bytes);

// The address the worker reads and writes for p: device memory is handed out
// at addresses the host cannot touch (PROT_NONE) and backed elsewhere, so a
// host memcpy on a device pointer crashes as on a GPU. Host pointers pass.
void *fake_cuda_backing(const void *p);

// Test controls (also from the environment, read at first use):
//   FAKE_CUDA_DELAY_US  microseconds each stream operation waits before it
//                       runs (default 300)
//   FAKE_CUDA_DEVICES   how many GPUs the fake has (default 2)
//   FAKE_CUDA_FAIL      "name:n": the n-th call of the function `name` fails
//                       (cudaErrorInvalidValue, or cudaErrorInsufficientDriver
//                       for cudaGetDeviceCount / cudaPointerGetAttributes)
//   FAKE_CUDA_CC        the GPUs' compute capability, e.g. 70 (default 90)
//   FAKE_CUDA_HOST_VISIBLE=1  device memory the host may touch too (stands for
//                       a CUDA-aware MPI that reads device memory itself)
//   FAKE_CUDA_PEER=0    GPUs cannot access each other's memory (default 1):
//                       cudaDeviceCanAccessPeer says 0, kernels on a peer's fail
void fake_cuda_set_delay_us(long us);
void fake_cuda_fail(const char *name, int nth, cudaError_t err);
void fake_cuda_set_host_visible(int visible);
// 1 when a context was made on dev (any allocation, stream, set-device there).
int fake_cuda_context_made(int dev);
// Bytes of device memory allocated and not freed (a peer's opened memory
// is not counted).
size_t fake_cuda_device_bytes(void);
// Copies between host (pinned or pageable) and device memory queued by this
// process so far; *bytes (if given) their bytes. The IPC path must add none.
unsigned long fake_cuda_host_copies(size_t *bytes);
// 1 when kernels on GPU dev may touch GPU peer's memory (dev == peer, or peer
// access enabled by cudaDeviceEnablePeerAccess / cudaIpcMemLazyEnablePeerAccess).
int fake_cuda_peer_enabled(int dev, int peer);

#endif // HPCDL_FAKE_CUDA_H
