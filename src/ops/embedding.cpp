#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

namespace {
void check_ids(const char* op, const Tensor& ids, int64_t vocab) {
  const int32_t* p = ids.i32();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    SHARDLM_CHECK(p[i] >= 0 && p[i] < vocab, "{}: token id {} at position {} is outside the vocabulary [0, {})", op,
                  p[i], i, vocab);
  }
}
}  // namespace

void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& ids) {
  constexpr const char* op = "embedding_forward";
  check_usable(op, "out", out);
  check_usable(op, "weight", weight);
  check_usable(op, "ids", ids);
  check_dtype(op, "weight", weight, {DType::F32, DType::BF16});
  check_dtype(op, "out", out, {DType::F32, DType::BF16});
  check_dtype(op, "ids", ids, {DType::I32});
  check_shape(op, "weight", weight, {-1, -1});
  check_shape(op, "out", out, {ids.numel(), weight.shape[1]});
  check_ids(op, ids, weight.shape[0]);
  cpu::embedding_forward(out, weight, ids);
}

void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& ids) {
  constexpr const char* op = "embedding_backward";
  check_usable(op, "dweight", dweight);
  check_usable(op, "dout", dout);
  check_usable(op, "ids", ids);
  check_dtype(op, "dweight", dweight, {DType::F32});
  check_dtype(op, "dout", dout, {DType::F32, DType::BF16});
  check_dtype(op, "ids", ids, {DType::I32});
  check_shape(op, "dweight", dweight, {-1, -1});
  check_shape(op, "dout", dout, {ids.numel(), dweight.shape[1]});
  check_ids(op, ids, dweight.shape[0]);
  cpu::embedding_backward(dweight, dout, ids);
}

}  // namespace shardlm::ops
