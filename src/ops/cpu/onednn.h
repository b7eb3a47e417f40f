// bf16 matrix multiply on the CPU through oneDNN (the bf16 path of ops/cpu_bf16.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace shardlm::ops::cpu {

// C [M, N] = alpha * op(A) op(B) + beta * C, A and B bf16 (row-major, op(X) = X^T when its flag is
// set), C f32 or bf16 (c_dtype), accumulated in f32. Only when cpu_bf16_enabled(); M, N, K > 0.
// The primitive for each (shape, transposes, C dtype, alpha, beta, thread count) is made once and
// cached. oneDNN runs on the same OpenMP runtime (libgomp) and thread count as the other kernels.
void onednn_matmul(void* c, DType c_dtype, const bf16_t* a, const bf16_t* b, int64_t M, int64_t N, int64_t K,
                   bool trans_a, bool trans_b, float alpha, float beta);

}  // namespace shardlm::ops::cpu
