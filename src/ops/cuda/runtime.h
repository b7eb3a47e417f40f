// The CUDA runtime as shardlm uses it: error checks that become shardlm Errors, and the one
// compute stream every CUDA op runs on. Included only by code built with SHARDLM_HAVE_CUDA.
//
// Streams: ops enqueue on compute_stream(); the NCCL communicator runs collectives on streams of
// its own and orders them against the compute stream with events, so prefetched gathers overlap
// compute. Nothing here synchronizes the device except where a function says it does.
#pragma once

#include <cuda_runtime.h>

namespace shardlm::cuda {

// Throws shardlm::Error("CUDA error <name>: <what> (file:line)") when err is not cudaSuccess.
void check(cudaError_t err, const char* what, const char* file, int line);
#define SHARDLM_CUDA_CHECK(expr) ::shardlm::cuda::check((expr), #expr, __FILE__, __LINE__)

// True when this process sees at least one usable CUDA device (never throws).
bool available();

// The stream ops run on, created on first use for the current device; owned by the process and
// never destroyed (it lives as long as the CUDA context).
cudaStream_t compute_stream();

// Copies `bytes` of host memory at `src` to device memory at `dst` in order on the compute stream,
// without waiting for the device: a small array a kernel reads that a launch's arguments cannot
// hold (paged attention's block table). The bytes go through pinned staging memory (slots of
// kUploadSlotBytes, taken in turn; a slot is reused once the copy that read it has run), so `src`
// may change as soon as this returns. Larger arrays are staged by the driver, which may wait for
// the stream. Thread-safe.
constexpr size_t kUploadSlotBytes = size_t(64) << 10;
void upload_async(void* dst, const void* src, size_t bytes);

}  // namespace shardlm::cuda
