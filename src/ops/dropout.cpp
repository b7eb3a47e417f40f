// Front end of dropout (ops.h): validates, then dispatches. The mask is drawn, not stored: see
// ops/cpu/dropout.cpp for the arithmetic both backends share.
#include <cmath>
#include <cstdint>

#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"

namespace shardlm::ops {

void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key, uint64_t stream) {
  constexpr const char* op = "dropout";
  check_arg(op, "x", x, {DType::F32, DType::BF16}, {-1, -1});
  check_arg(op, "out", out, {DType::F32, DType::BF16}, {x.shape[0], x.shape[1]});
  // Written so that NaN fails too.
  SHARDLM_CHECK(p >= 0.0f && p < 1.0f, "{}: p: expected 0 <= p < 1, got {}", op, p);
  // In place is out == x (same memory, same dtype); any other overlap would read elements the op
  // has already written.
  const auto* ob = static_cast<const uint8_t*>(out.data);
  const auto* xb = static_cast<const uint8_t*>(x.data);
  const bool overlap = ob < xb + x.nbytes() && xb < ob + out.nbytes();
  SHARDLM_CHECK(!overlap || (ob == xb && out.dtype == x.dtype),
                "{}: out: overlaps x without being x itself (out {}, x {}): in place needs the same memory and dtype",
                op, out.describe(), x.describe());
  const Device dev = check_same_device(op, {{"out", &out}, {"x", &x}});
  if (p == 0.0f) return cast(out, x);  // every element kept, times 1: a copy (or a cast)
  count_traffic(dev, {&out, &x});
  SHARDLM_DISPATCH(dev, dropout(out, x, p, key, stream));
  cpu::dropout(out, x, p, key, stream);
}

}  // namespace shardlm::ops
