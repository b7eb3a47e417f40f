// Argument validation shared by the op front ends (ops/*.cpp). Each check throws an Error that
// names the op and the argument, e.g. "rmsnorm_forward: w: expected shape [64], got f32[65] on cpu".
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace shardlm::ops {

void check_defined(const char* op, const char* arg, const Tensor& t);
// Defined, contiguous, on the CPU (the only backend in this build's dispatch so far).
void check_usable(const char* op, const char* arg, const Tensor& t);
void check_dtype(const char* op, const char* arg, const Tensor& t, std::initializer_list<DType> allowed);
// Exact shape; -1 in `shape` matches any size.
void check_shape(const char* op, const char* arg, const Tensor& t, std::initializer_list<int64_t> shape);
void check_numel(const char* op, const char* arg, const Tensor& t, int64_t n);

}  // namespace shardlm::ops
