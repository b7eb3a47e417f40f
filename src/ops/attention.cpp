// Front end of causal grouped-query attention: validates shapes, dtypes and devices once, then
// dispatches to the backend (see ops.h for the semantics and ops/cpu/attention.cpp for the kernel).
#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

namespace {

// The sizes every attention call agrees on, read from q and k.
struct AttnDims {
  int64_t B, Tq, Tk, H, Hkv, Dh;
};

// Checks q, k, v, lse and segment_ids, which the forward and the backward share.
AttnDims check_attention_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& lse, const Tensor& segment_ids) {
  check_usable(op, "q", q);
  check_usable(op, "k", k);
  check_usable(op, "v", v);
  check_usable(op, "lse", lse);
  check_dtype(op, "q", q, {DType::F32, DType::BF16});
  check_dtype(op, "k", k, {DType::F32, DType::BF16});
  check_dtype(op, "v", v, {DType::F32, DType::BF16});
  check_dtype(op, "lse", lse, {DType::F32});
  check_shape(op, "q", q, {-1, -1, -1, -1});
  const AttnDims d{q.shape[0], q.shape[1], k.ndim == 4 ? k.shape[1] : -1, q.shape[2],
                   k.ndim == 4 ? k.shape[2] : -1, q.shape[3]};
  check_shape(op, "k", k, {d.B, -1, -1, d.Dh});
  check_shape(op, "v", v, {d.B, d.Tk, d.Hkv, d.Dh});
  SHARDLM_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0,
                "{}: the {} query heads of q {} are not a multiple of the {} kv heads of k {}", op, d.H,
                q.describe(), d.Hkv, k.describe());
  SHARDLM_CHECK(d.Tq <= d.Tk, "{}: more queries than keys: q {} has {} positions, k {} has {}", op, q.describe(),
                d.Tq, k.describe(), d.Tk);
  check_shape(op, "lse", lse, {d.B, d.H, d.Tq});
  // segment_ids is optional: an undefined tensor means one segment per batch row.
  if (segment_ids.defined()) {
    check_arg(op, "segment_ids", segment_ids, {DType::I32}, {d.B, d.Tk});
  }
  return d;
}

// Multiply-adds of the causal scores one (batch, head) computes: query i sees the keys up to its
// own position (Tk - Tq + i), the blocks above the diagonal are skipped. Per score, the forward does
// 2 products of Dh (q.k and p.v), the backward 4 (dv, dp, dq, dk). For a dry run's time model.
double causal_score_flops(const AttnDims& d, int products) {
  const double off = double(d.Tk - d.Tq);
  const double pairs = double(d.Tq) * off + double(d.Tq) * double(d.Tq + 1) / 2;
  return 2.0 * products * double(d.Dh) * pairs * double(d.B) * double(d.H);
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& segment_ids, float scale) {
  constexpr const char* op = "attention_forward";
  const AttnDims d = check_attention_inputs(op, q, k, v, lse, segment_ids);
  check_arg(op, "out", out, {DType::F32, DType::BF16}, {d.B, d.Tq, d.H, d.Dh});
  const Device dev = check_same_device(
      op, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}, {"segment_ids", &segment_ids}});
  if (dev == Device::Meta) meta_flops(causal_score_flops(d, 2));
  SHARDLM_DISPATCH(dev, attention_forward(out, lse, q, k, v, segment_ids, scale));
  cpu::attention_forward(out, lse, q, k, v, segment_ids, scale);
}

void attention_forward_paged(const Tensor& out, const Tensor& lse, const Tensor& q, const std::vector<Tensor>& k_blocks,
                             const std::vector<Tensor>& v_blocks, int64_t Tk, float scale) {
  constexpr const char* op = "attention_forward_paged";
  check_usable(op, "q", q);
  check_usable(op, "lse", lse);
  check_usable(op, "out", out);
  check_dtype(op, "q", q, {DType::F32, DType::BF16});
  check_dtype(op, "lse", lse, {DType::F32});
  check_dtype(op, "out", out, {DType::F32, DType::BF16});
  check_shape(op, "q", q, {1, -1, -1, -1});
  const int64_t Tq = q.shape[1], H = q.shape[2], Dh = q.shape[3];
  check_shape(op, "out", out, {1, Tq, H, Dh});
  check_shape(op, "lse", lse, {1, H, Tq});
  SHARDLM_CHECK(!k_blocks.empty() && k_blocks.size() == v_blocks.size(),
                "{}: {} key blocks and {} value blocks (the same number, at least one)", op, k_blocks.size(),
                v_blocks.size());
  const Tensor& k0 = k_blocks.front();
  check_shape(op, "k_blocks[0]", k0, {-1, -1, Dh});
  const int64_t block = k0.shape[0], Hkv = k0.shape[1];
  SHARDLM_CHECK(block >= 1 && Hkv >= 1 && H % Hkv == 0,
                "{}: the {} query heads of q {} are not a multiple of the {} kv heads of k_blocks[0] {}", op, H,
                q.describe(), Hkv, k0.describe());
  const Device dev = check_same_device(op, {{"q", &q}, {"out", &out}, {"lse", &lse}});
  for (size_t i = 0; i < k_blocks.size(); ++i)
    for (const Tensor* t : {&k_blocks[i], &v_blocks[i]}) {
      const char* arg = t == &k_blocks[i] ? "k_blocks[i]" : "v_blocks[i]";
      check_usable(op, arg, *t);
      SHARDLM_CHECK(t->dtype == k0.dtype && t->device == dev,
                    "{}: block {} is {} on {}; every block is {} on {}, where q is", op, i, dtype_name(t->dtype),
                    device_name(t->device), dtype_name(k0.dtype), device_name(dev));
      check_shape(op, arg, *t, {block, Hkv, Dh});
    }
  check_dtype(op, "k_blocks[0]", k0, {DType::F32, DType::BF16});
  SHARDLM_CHECK(Tq <= Tk && Tk <= int64_t(k_blocks.size()) * block,
                "{}: {} keys for {} queries in {} blocks of {} positions", op, Tk, Tq, k_blocks.size(), block);
  SHARDLM_DISPATCH(dev, attention_forward_paged(out, lse, q, k_blocks, v_blocks, Tk, scale));
  cpu::attention_forward_paged(out, lse, q, k_blocks, v_blocks, Tk, scale);
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& segment_ids, float scale) {
  constexpr const char* op = "attention_backward";
  const AttnDims d = check_attention_inputs(op, q, k, v, lse, segment_ids);
  check_usable(op, "out", out);
  check_usable(op, "dout", dout);
  check_usable(op, "dq", dq);
  check_usable(op, "dk", dk);
  check_usable(op, "dv", dv);
  check_dtype(op, "out", out, {DType::F32, DType::BF16});
  check_dtype(op, "dout", dout, {DType::F32, DType::BF16});
  check_dtype(op, "dq", dq, {DType::F32});
  check_dtype(op, "dk", dk, {DType::F32});
  check_dtype(op, "dv", dv, {DType::F32});
  check_shape(op, "out", out, {d.B, d.Tq, d.H, d.Dh});
  check_shape(op, "dout", dout, {d.B, d.Tq, d.H, d.Dh});
  check_shape(op, "dq", dq, {d.B, d.Tq, d.H, d.Dh});
  check_shape(op, "dk", dk, {d.B, d.Tk, d.Hkv, d.Dh});
  check_shape(op, "dv", dv, {d.B, d.Tk, d.Hkv, d.Dh});
  const Device dev = check_same_device(op, {{"dq", &dq},
                                            {"dk", &dk},
                                            {"dv", &dv},
                                            {"dout", &dout},
                                            {"q", &q},
                                            {"k", &k},
                                            {"v", &v},
                                            {"out", &out},
                                            {"lse", &lse},
                                            {"segment_ids", &segment_ids}});
  if (dev == Device::Meta) meta_flops(causal_score_flops(d, 4));
  SHARDLM_DISPATCH(dev, attention_backward(dq, dk, dv, dout, q, k, v, out, lse, segment_ids, scale));
  cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, segment_ids, scale);
}

}  // namespace shardlm::ops
