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

}  // namespace shardlm::cuda
