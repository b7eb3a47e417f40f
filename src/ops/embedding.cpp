#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

namespace {
// CUDA ids are copied to the host for this, which waits for the compute stream: a bad id in the
// data is then an Error naming its position rather than an out-of-bounds read in a kernel.
void check_ids(const char* op, const Tensor& ids, int64_t vocab) {
  const std::vector<int32_t> host = host_i32(ids);
  const int32_t* p = host.data();
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
  const Device dev = check_same_device(op, {{"out", &out}, {"weight", &weight}, {"ids", &ids}});
  check_ids(op, ids, weight.shape[0]);
  count_traffic(dev, {&out, &out});  // the rows read, the rows written
  SHARDLM_DISPATCH(dev, embedding_forward(out, weight, ids));
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
  const Device dev = check_same_device(op, {{"dweight", &dweight}, {"dout", &dout}, {"ids", &ids}});
  check_ids(op, ids, dweight.shape[0]);
  count_traffic(dev, {&dout, &dout, &dout});  // dout read; its rows of dweight updated
  SHARDLM_DISPATCH(dev, embedding_backward(dweight, dout, ids));
  cpu::embedding_backward(dweight, dout, ids);
}

}  // namespace shardlm::ops
