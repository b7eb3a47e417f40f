// Argument validation shared by the op front ends (ops/*.cpp). Each check throws an Error that
// names the op and the argument, e.g. "rmsnorm_forward: w: expected shape [64], got f32[65] on cpu".
//
// Dispatch: after validation a front end calls SHARDLM_DISPATCH(device, op(args...)). On the meta
// device (core/alloc.h) it returns at once, with the op's result type value-initialized (0, an
// empty result): shapes were checked, there is no math to do. A front end whose CPU kernel
// allocates scratch makes that scratch on the meta device first, so dry runs count it. On a CUDA
// device it returns ops::gpu::op(args...) (ops/cuda/cuda_ops.h). Otherwise it falls through to
// the CPU kernel. In a build without CUDA the CUDA branch is absent: check_usable has already
// refused CUDA tensors with "built without CUDA".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/tensor.h"

#ifdef SHARDLM_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#define SHARDLM_DISPATCH_GPU(device, call) \
  if ((device) == ::shardlm::Device::CUDA) return ::shardlm::ops::gpu::call
#else
#define SHARDLM_DISPATCH_GPU(device, call) static_cast<void>(device)
#endif

#define SHARDLM_DISPATCH(device, call)                                                                      \
  do {                                                                                                      \
    if ((device) == ::shardlm::Device::Meta) return decltype(::shardlm::ops::cpu::call)();                  \
    SHARDLM_DISPATCH_GPU(device, call);                                                                     \
  } while (0)

namespace shardlm::ops {

void check_defined(const char* op, const char* arg, const Tensor& t);
// Defined, contiguous, and on a device this build has a backend for (the CPU, meta, and CUDA
// when built with it).
void check_usable(const char* op, const char* arg, const Tensor& t);
void check_dtype(const char* op, const char* arg, const Tensor& t, std::initializer_list<DType> allowed);
// Exact shape; -1 in `shape` matches any size.
void check_shape(const char* op, const char* arg, const Tensor& t, std::initializer_list<int64_t> shape);
void check_numel(const char* op, const char* arg, const Tensor& t, int64_t n);
// The usual trio for one argument: check_usable, check_dtype, check_shape, in that order.
void check_arg(const char* op, const char* arg, const Tensor& t, std::initializer_list<DType> allowed,
               std::initializer_list<int64_t> shape);

// All the defined tensors of one call must be on the same device; returns that device. The
// Error names the first tensor that is elsewhere, e.g.
// "matmul: B: on cpu, but A is on cuda (all tensors of one op must be on one device)".
struct NamedTensor {
  const char* name;
  const Tensor* t;
};
Device check_same_device(const char* op, std::initializer_list<NamedTensor> tensors);

// On the meta device, reports to the dry run (core/alloc.h's meta_traffic) the bytes a
// memory-bound op moves: the sum of the listed tensors' sizes, each tensor it reads and each it
// writes, one it updates in place listed twice. The step-time model charges them at a memory
// bandwidth (memory/step_time.h). Elsewhere it does nothing.
void count_traffic(Device dev, std::initializer_list<const Tensor*> moved);

// The values of an i32 tensor on the host (copied from the GPU when it lives there, which waits
// for the compute stream): front ends validate ids with it so a bad id is reported by position.
std::vector<int32_t> host_i32(const Tensor& t);

}  // namespace shardlm::ops
