// Front end of the fused output projection + cross-entropy (ops.h): validates, then dispatches.
#include <fmt/format.h>

#include <algorithm>

#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"

namespace shardlm::ops {

CrossEntropyResult linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                                        const Tensor& dx, const Tensor& dw, float grad_scale,
                                        int64_t chunk_rows) {
  constexpr const char* op = "linear_cross_entropy";
  check_arg(op, "x", x, {DType::F32, DType::BF16}, {-1, -1});
  const int64_t N = x.shape[0], D = x.shape[1];
  SHARDLM_CHECK(D >= 1, "{}: x: hidden size must be at least 1, got {}", op, x.describe());

  check_arg(op, "w", w, {DType::F32, DType::BF16}, {-1, D});
  const int64_t V = w.shape[0];
  SHARDLM_CHECK(V >= 1, "{}: w: vocabulary must not be empty, got {}", op, w.describe());

  check_arg(op, "targets", targets, {DType::I32}, {N});

  // The backward runs when dx is defined; dw undefined then means a frozen head (no dw GEMM). A dw
  // without dx has no use: the head's input always needs its gradient in training.
  SHARDLM_CHECK(dx.defined() || !dw.defined(), "{}: dw is defined but dx is not (a backward needs dx; dw may be "
                "undefined for a frozen head)", op);
  if (dx.defined()) check_arg(op, "dx", dx, {DType::F32}, {N, D});
  if (dw.defined()) check_arg(op, "dw", dw, {DType::F32}, {V, D});
  SHARDLM_CHECK(chunk_rows >= 1, "{}: chunk_rows must be at least 1, got {}", op, chunk_rows);
  const Device dev =
      check_same_device(op, {{"x", &x}, {"w", &w}, {"targets", &targets}, {"dx", &dx}, {"dw", &dw}});

  // A bad id would index outside the logits row in the kernel; report it here, where the row that
  // carries it (usually a tokenizer/vocabulary mismatch in the data) can still be named. CUDA
  // targets are copied to the host for this (it waits for the compute stream; the op returns
  // the loss to the host and waits anyway).
  const std::vector<int32_t> host_ids = host_i32(targets);
  const int32_t* ids = host_ids.data();
  for (int64_t i = 0; i < N; ++i) {
    const int32_t t = ids[i];
    if (t != kIgnoreIndex && (t < 0 || t >= V))
      throw Error(fmt::format("{}: targets: row {} has id {}, outside the vocabulary [0, {}) (use {} to ignore a row)",
                              op, i, t, V, kIgnoreIndex));
  }

  if (dev == Device::Meta) {
    cpu::cross_entropy_scratch(x, w, chunk_rows, dx.defined(), Device::Meta);  // counted, then freed
    // The logits, and in a backward their products with dx and dw.
    meta_flops(2.0 * double(N) * double(V) * double(D) * (1 + int(dx.defined()) + int(dw.defined())));
  }
  SHARDLM_DISPATCH(dev, linear_cross_entropy(x, w, targets, dx, dw, grad_scale, chunk_rows));
  return cpu::linear_cross_entropy(x, w, targets, dx, dw, grad_scale, chunk_rows);
}

int64_t cross_entropy_chunk_rows(Device device, int64_t vocab) {
  constexpr int64_t kStep = 256, kMaxRows = 1024;
  constexpr int64_t kLogitsBudget = int64_t(128) << 20;  // bytes of f32 logits per chunk
  if (device == Device::CUDA) return kStep;  // the meta device stands for a CPU rank
  const int64_t fit = kLogitsBudget / (int64_t(sizeof(float)) * std::max<int64_t>(vocab, 1)) / kStep * kStep;
  return std::clamp(fit, kStep, kMaxRows);
}

}  // namespace shardlm::ops
