// Front ends of the optimizer-side ops: AdamW, sum of squares, gradient clipping.
#include <cmath>

#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWConfig& cfg,
                int64_t step, float grad_scale, StatePosition pos) {
  constexpr const char* op = "adamw_step";
  const Tensor* all[] = {&param, &grad, &m, &v};
  const char* names[] = {"param", "grad", "m", "v"};
  for (int i = 0; i < 4; ++i) {
    check_usable(op, names[i], *all[i]);
    if (i < 2) check_dtype(op, names[i], *all[i], {DType::F32});
    else check_dtype(op, names[i], *all[i], {DType::F32, DType::BF16});  // the moments
    check_numel(op, names[i], *all[i], param.numel());
  }
  SHARDLM_CHECK(m.dtype == v.dtype, "adamw_step: m is {} but v is {}; the moments share one dtype", dtype_name(m.dtype),
                dtype_name(v.dtype));
  SHARDLM_CHECK(pos.first >= 0, "adamw_step: the first element's position must be >= 0, got {}", pos.first);
  SHARDLM_CHECK(step >= 1, "adamw_step: step must be >= 1 (1-based), got {}", step);
  SHARDLM_CHECK(cfg.beta1 >= 0 && cfg.beta1 < 1 && cfg.beta2 >= 0 && cfg.beta2 < 1,
                "adamw_step: betas must lie in [0, 1), got ({}, {})", cfg.beta1, cfg.beta2);
  const Device dev = check_same_device(op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}});
  count_traffic(dev, {&param, &param, &grad, &m, &m, &v, &v});
  SHARDLM_DISPATCH(dev, adamw_step(param, grad, m, v, cfg, step, grad_scale, pos));
  cpu::adamw_step(param, grad, m, v, cfg, step, grad_scale, pos);
}

namespace {
void check_blockwise8(const char* op, const Tensor& codes, const Tensor& absmax, const Tensor& x) {
  check_usable(op, "codes", codes);
  check_usable(op, "absmax", absmax);
  check_usable(op, "x", x);
  check_dtype(op, "codes", codes, {DType::U8});
  check_dtype(op, "absmax", absmax, {DType::F32});
  check_dtype(op, "x", x, {DType::F32});
  check_numel(op, "codes", codes, x.numel());
  check_numel(op, "absmax", absmax, (x.numel() + kQuant8Block - 1) / kQuant8Block);
}
}  // namespace

void quantize_blockwise8(const Tensor& codes, const Tensor& absmax, const Tensor& x, bool is_signed) {
  check_blockwise8("quantize_blockwise8", codes, absmax, x);
  const Device dev = check_same_device("quantize_blockwise8", {{"codes", &codes}, {"absmax", &absmax}, {"x", &x}});
  count_traffic(dev, {&codes, &x});
  SHARDLM_DISPATCH(dev, quantize_blockwise8(codes, absmax, x, is_signed));
  cpu::quantize_blockwise8(codes, absmax, x, is_signed);
}

void dequantize_blockwise8(const Tensor& x, const Tensor& codes, const Tensor& absmax, bool is_signed) {
  check_blockwise8("dequantize_blockwise8", codes, absmax, x);
  const Device dev = check_same_device("dequantize_blockwise8", {{"codes", &codes}, {"absmax", &absmax}, {"x", &x}});
  count_traffic(dev, {&x, &codes});
  SHARDLM_DISPATCH(dev, dequantize_blockwise8(x, codes, absmax, is_signed));
  cpu::dequantize_blockwise8(x, codes, absmax, is_signed);
}

double sum_squares(const Tensor& x) {
  check_usable("sum_squares", "x", x);
  check_dtype("sum_squares", "x", x, {DType::F32, DType::BF16});
  count_traffic(x.device, {&x});
  SHARDLM_DISPATCH(x.device, sum_squares(x));
  return cpu::sum_squares(x);
}

float clip_coefficient(double total_norm, float max_norm) {
  if (!(max_norm > 0.0f)) return 1.0f;  // clipping disabled
  const double coef = double(max_norm) / (total_norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace shardlm::ops
