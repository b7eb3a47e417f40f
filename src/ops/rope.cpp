// Rotary position embedding front end: the inverse frequencies, and validation of the rotation.
//
// rope_inv_freq reproduces transformers' float32 arithmetic operation by operation, so that the
// frequencies (and hence every angle) agree with Hugging Face bit for bit, not just closely:
// a 1-ulp difference in a frequency becomes a visible difference in the angle at position 8000.
// Where the Python mixes a Python float with a float32 tensor, the Python float is rounded to
// f32 first, and `scalar / tensor` is evaluated by torch as reciprocal(tensor) * scalar; both are
// mirrored below.

// Fused multiply-adds would round differently from torch's separate multiply and add.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"

namespace shardlm::ops {

std::vector<float> rope_inv_freq(int64_t head_dim, float theta, const RopeScaling& scaling) {
  const char* op = "rope_inv_freq";
  SHARDLM_CHECK(head_dim > 0 && head_dim % 2 == 0, "{}: head_dim: expected a positive even number, got {}", op,
                head_dim);
  SHARDLM_CHECK(std::isfinite(theta) && theta > 0.0f, "{}: theta: expected a positive number, got {}", op, theta);

  // _compute_default_rope_parameters:
  //   1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
  // The exponent is an f32 division. torch's f32 pow agrees with the correctly rounded power,
  // which the double pow rounded to f32 gives; 1.0 / t is reciprocal(t) in f32.
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = float(2 * i) / float(head_dim);
    const float power = float(std::pow(double(theta), double(exponent)));
    inv[size_t(i)] = 1.0f / power;
  }
  if (scaling.kind == RopeScaling::Kind::None) return inv;

  // _compute_llama3_parameters.
  SHARDLM_CHECK(std::isfinite(scaling.factor) && scaling.factor > 0.0f,
                "{}: rope_scaling.factor: expected a positive number, got {}", op, scaling.factor);
  SHARDLM_CHECK(scaling.low_freq_factor > 0.0f && scaling.high_freq_factor > scaling.low_freq_factor,
                "{}: rope_scaling: expected 0 < low_freq_factor < high_freq_factor, got {} and {}", op,
                scaling.low_freq_factor, scaling.high_freq_factor);
  SHARDLM_CHECK(scaling.original_max_position_embeddings > 0,
                "{}: rope_scaling.original_max_position_embeddings: expected a positive number, got {}", op,
                scaling.original_max_position_embeddings);
  // Python-float quantities (computed in double by Python, then rounded to f32 by torch).
  const double old_context_len = double(scaling.original_max_position_embeddings);
  const float low_freq_wavelen = float(old_context_len / double(scaling.low_freq_factor));
  const float high_freq_wavelen = float(old_context_len / double(scaling.high_freq_factor));
  const float two_pi = float(2.0 * std::numbers::pi);
  const float old_context_len_f = float(old_context_len);
  const float factor = scaling.factor;
  const float low_freq_factor = scaling.low_freq_factor;
  const float factor_span = float(double(scaling.high_freq_factor) - double(scaling.low_freq_factor));

  for (float& f : inv) {
    // wavelen = 2 * math.pi / inv_freq
    const float wavelen = (1.0f / f) * two_pi;
    // inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    const float llama = wavelen > low_freq_wavelen ? f / factor : f;
    // smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    const float smooth = ((1.0f / wavelen) * old_context_len_f - low_freq_factor) / factor_span;
    // smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    const float smoothed = ((1.0f - smooth) * llama) / factor + smooth * llama;
    // is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : llama;
  }
  return inv;
}

namespace {

// x and out [B, T, H, Dh], positions [B, T], inv_freq [Dh / 2]. `xname`/`outname` are the
// caller's argument names (x/out forward, dout/dx backward).
void check_rope(const char* op, const char* outname, const Tensor& out, const char* xname, const Tensor& x,
                const Tensor& positions, const Tensor& inv_freq) {
  check_usable(op, xname, x);
  check_dtype(op, xname, x, {DType::F32, DType::BF16});
  check_shape(op, xname, x, {-1, -1, -1, -1});
  const int64_t B = x.shape[0], T = x.shape[1], H = x.shape[2], Dh = x.shape[3];
  SHARDLM_CHECK(Dh % 2 == 0, "{}: {}: head dimension must be even, got {}", op, xname, x.describe());
  check_usable(op, outname, out);
  check_dtype(op, outname, out, {DType::F32, DType::BF16});
  check_shape(op, outname, out, {B, T, H, Dh});
  // In place is supported (each pair is read before it is written); any other overlap is not.
  const char* xb = static_cast<const char*>(x.data);
  const char* ob = static_cast<const char*>(out.data);
  const bool overlap = ob < xb + x.nbytes() && xb < ob + out.nbytes();
  if (overlap)
    SHARDLM_CHECK(ob == xb && out.dtype == x.dtype, "{}: {}: overlaps {} without being the same tensor", op,
                  outname, xname);
  check_arg(op, "positions", positions, {DType::I32}, {B, T});
  check_arg(op, "inv_freq", inv_freq, {DType::F32}, {Dh / 2});
  check_same_device(op, {{xname, &x}, {outname, &out}, {"positions", &positions}, {"inv_freq", &inv_freq}});
}

}  // namespace

void rope_forward(const Tensor& out, const Tensor& x, const Tensor& positions, const Tensor& inv_freq) {
  check_rope("rope_forward", "out", out, "x", x, positions, inv_freq);
  count_traffic(x.device, {&out, &x});
  SHARDLM_DISPATCH(x.device, rope_apply(out, x, positions, inv_freq, +1.0f));
  cpu::rope_apply(out, x, positions, inv_freq, +1.0f);
}

void rope_backward(const Tensor& dx, const Tensor& dout, const Tensor& positions, const Tensor& inv_freq) {
  check_rope("rope_backward", "dx", dx, "dout", dout, positions, inv_freq);
  count_traffic(dout.device, {&dx, &dout});
  SHARDLM_DISPATCH(dout.device, rope_apply(dx, dout, positions, inv_freq, -1.0f));
  cpu::rope_apply(dx, dout, positions, inv_freq, -1.0f);
}

}  // namespace shardlm::ops
