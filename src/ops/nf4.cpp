// NF4 quantization: constants, layout helpers and the op front ends (validation, dispatch).
#include "ops/nf4.h"

#include <fmt/format.h>

#include "core/device.h"
#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

// bitsandbytes' get_4bit_type("nf4") (the QLoRA paper's NormalFloat4), as f32.
const std::array<float, 16> kNf4Code = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// The constants of bitsandbytes' dQuantizeNF4 decision tree, as written there (decimal midpoints
// between neighbouring codes; the compiler rounds each to f32 directly, and four land on the other
// side of a near-tie than the exact midpoint would: see Nf4.ThresholdsAreTheMidpointsOfTheCode).
const std::array<float, 15> kNf4Thresholds = {
    -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,
    0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f};

namespace {

constexpr size_t kSectionAlign = 16;
size_t align_up(size_t v) { return (v + kSectionAlign - 1) / kSectionAlign * kSectionAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_u8(const char* op, const char* arg, const Tensor& t, int64_t n) {
  check_usable(op, arg, t);
  check_dtype(op, arg, t, {DType::U8});
  check_numel(op, arg, t, n);
}
void check_f32(const char* op, const char* arg, const Tensor& t, int64_t n) {
  check_usable(op, arg, t);
  check_dtype(op, arg, t, {DType::F32});
  check_numel(op, arg, t, n);
}
void check_values(const char* op, const char* arg, const Tensor& t) {
  check_usable(op, arg, t);
  check_dtype(op, arg, t, {DType::F32, DType::BF16, DType::F16});
  SHARDLM_CHECK(t.numel() > 0, "{}: {}: expected at least one element, got {}", op, arg, t.describe());
}

}  // namespace

// ---- layout ------------------------------------------------------------------------------------
Nf4Layout Nf4Layout::of(int64_t numel, bool nested) {
  SHARDLM_CHECK(numel > 0, "Nf4Layout: expected a positive element count, got {}", numel);
  Nf4Layout l;
  l.numel = numel;
  l.nested = nested;
  l.blocks = ceil_div(numel, kNf4BlockSize);
  l.nested_blocks = nested ? ceil_div(l.blocks, kNf4NestedBlockSize) : 0;
  l.packed_offset = 0;
  l.packed_bytes = size_t((numel + 1) / 2);
  l.absmax_offset = align_up(l.packed_offset + l.packed_bytes);
  l.absmax_bytes = size_t(l.blocks) * (nested ? 1 : 4);
  size_t end = l.absmax_offset + l.absmax_bytes;
  if (nested) {
    l.nested_absmax_offset = align_up(end);
    l.nested_absmax_bytes = size_t(l.nested_blocks) * 4;
    l.offset_offset = align_up(l.nested_absmax_offset + l.nested_absmax_bytes);
    l.offset_bytes = 4;
    end = l.offset_offset + l.offset_bytes;
  } else {
    l.nested_absmax_offset = l.offset_offset = end;
  }
  l.total_bytes = align_up(end);
  return l;
}

Nf4Layout::Range Nf4Layout::range(int64_t b0, int64_t b1) const {
  SHARDLM_CHECK(0 <= b0 && b0 < b1 && b1 <= blocks, "Nf4Layout::range: blocks [{}, {}) outside [0, {})", b0, b1,
                blocks);
  if (nested)
    SHARDLM_CHECK(b0 % kNf4NestedBlockSize == 0 && (b1 % kNf4NestedBlockSize == 0 || b1 == blocks),
                  "Nf4Layout::range: blocks [{}, {}) of a double-quantized tensor must start at a multiple of {} "
                  "and end at one or at the last block ({})",
                  b0, b1, kNf4NestedBlockSize, blocks);
  Range r{};
  r.elem_begin = b0 * kNf4BlockSize;
  r.elem_end = std::min(b1 * kNf4BlockSize, numel);
  r.packed_begin = packed_offset + size_t(r.elem_begin / 2);
  r.packed_end = packed_offset + size_t((r.elem_end + 1) / 2);
  const size_t esize = nested ? 1 : 4;
  r.absmax_begin = absmax_offset + size_t(b0) * esize;
  r.absmax_end = absmax_offset + size_t(b1) * esize;
  if (nested) {
    r.nested_absmax_begin = nested_absmax_offset + size_t(b0 / kNf4NestedBlockSize) * 4;
    r.nested_absmax_end = nested_absmax_offset + size_t(ceil_div(b1, kNf4NestedBlockSize)) * 4;
  } else {
    r.nested_absmax_begin = r.nested_absmax_end = nested_absmax_offset;
  }
  return r;
}

int64_t Nf4Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Nf4Tensor nf4_view(void* base, const Nf4Layout& l, const std::vector<int64_t>& shape, DType dtype, Device device) {
  Nf4Tensor q;
  q.shape = shape;
  q.dtype = dtype;
  q.nested = l.nested;
  SHARDLM_CHECK(q.numel() == l.numel, "nf4_view: shape has {} elements but the layout {}", q.numel(), l.numel);
  auto* b = static_cast<uint8_t*>(base);
  q.packed = Tensor::view(b + l.packed_offset, DType::U8, {int64_t(l.packed_bytes)}, device);
  if (l.nested) {
    q.absmax = Tensor::view(b + l.absmax_offset, DType::U8, {l.blocks}, device);
    q.nested_absmax = Tensor::view(b + l.nested_absmax_offset, DType::F32, {l.nested_blocks}, device);
    q.offset = Tensor::view(b + l.offset_offset, DType::F32, {1}, device);
  } else {
    q.absmax = Tensor::view(b + l.absmax_offset, DType::F32, {l.blocks}, device);
  }
  return q;
}

// ---- ops ---------------------------------------------------------------------------------------
void nf4_quantize(const Tensor& packed, const Tensor& absmax, const Tensor& x) {
  constexpr const char* op = "nf4_quantize";
  check_values(op, "x", x);
  const int64_t n = x.numel();
  check_u8(op, "packed", packed, (n + 1) / 2);
  check_f32(op, "absmax", absmax, ceil_div(n, kNf4BlockSize));
  const Device dev = check_same_device(op, {{"packed", &packed}, {"absmax", &absmax}, {"x", &x}});
  SHARDLM_DISPATCH(dev, nf4_quantize(packed, absmax, x));
  cpu::nf4_quantize(packed, absmax, x);
}

double nf4_absmax_sum(const Tensor& absmax) {
  constexpr const char* op = "nf4_absmax_sum";
  check_usable(op, "absmax", absmax);
  check_dtype(op, "absmax", absmax, {DType::F32});
  if (absmax.device == Device::Meta) return 0.0;  // shapes only
  if (absmax.device != Device::CPU) {
    OwnedTensor host = device::copy_to_host(absmax, MemCategory::Workspace);
    return cpu::nf4_absmax_sum(host.t);
  }
  return cpu::nf4_absmax_sum(absmax);
}

float nf4_offset_from_sum(double sum, int64_t count) {
  SHARDLM_CHECK(count > 0, "nf4_offset_from_sum: expected a positive count, got {}", count);
  return float(sum / double(count));
}

namespace {
// The arguments of double quantization, either way: absmax f32 [m], qabsmax u8 [m], nested_absmax
// f32 [ceil(m / 256)], offset f32 [1], on one device (returned).
Device check_double_quant_args(const char* op, const Tensor& absmax, const Tensor& qabsmax,
                               const Tensor& nested_absmax, const Tensor& offset) {
  check_usable(op, "absmax", absmax);
  check_dtype(op, "absmax", absmax, {DType::F32});
  const int64_t m = absmax.numel();
  SHARDLM_CHECK(m > 0, "{}: absmax: expected at least one element, got {}", op, absmax.describe());
  check_u8(op, "qabsmax", qabsmax, m);
  check_f32(op, "nested_absmax", nested_absmax, ceil_div(m, kNf4NestedBlockSize));
  check_f32(op, "offset", offset, 1);
  return check_same_device(
      op, {{"qabsmax", &qabsmax}, {"nested_absmax", &nested_absmax}, {"absmax", &absmax}, {"offset", &offset}});
}
}  // namespace

void nf4_quantize_absmax(const Tensor& qabsmax, const Tensor& nested_absmax, const Tensor& absmax,
                         const Tensor& offset) {
  const Device dev = check_double_quant_args("nf4_quantize_absmax", absmax, qabsmax, nested_absmax, offset);
  SHARDLM_DISPATCH(dev, nf4_quantize_absmax(qabsmax, nested_absmax, absmax, offset));
  cpu::nf4_quantize_absmax(qabsmax, nested_absmax, absmax, offset);
}

void nf4_dequantize_absmax(const Tensor& absmax, const Tensor& qabsmax, const Tensor& nested_absmax,
                           const Tensor& offset) {
  const Device dev = check_double_quant_args("nf4_dequantize_absmax", absmax, qabsmax, nested_absmax, offset);
  SHARDLM_DISPATCH(dev, nf4_dequantize_absmax(absmax, qabsmax, nested_absmax, offset));
  cpu::nf4_dequantize_absmax(absmax, qabsmax, nested_absmax, offset);
}

void nf4_dequantize(const Tensor& out, const Tensor& packed, const Tensor& absmax) {
  constexpr const char* op = "nf4_dequantize";
  check_values(op, "out", out);
  const int64_t n = out.numel();
  check_u8(op, "packed", packed, (n + 1) / 2);
  check_f32(op, "absmax", absmax, ceil_div(n, kNf4BlockSize));
  const Device dev = check_same_device(op, {{"out", &out}, {"packed", &packed}, {"absmax", &absmax}});
  count_traffic(dev, {&out, &packed});
  SHARDLM_DISPATCH(dev, nf4_dequantize(out, packed, absmax));
  cpu::nf4_dequantize(out, packed, absmax);
}

void nf4_dequantize_nested(const Tensor& out, const Tensor& packed, const Tensor& qabsmax,
                           const Tensor& nested_absmax, const Tensor& offset) {
  constexpr const char* op = "nf4_dequantize_nested";
  check_values(op, "out", out);
  const int64_t n = out.numel();
  const int64_t blocks = ceil_div(n, kNf4BlockSize);
  check_u8(op, "packed", packed, (n + 1) / 2);
  check_u8(op, "qabsmax", qabsmax, blocks);
  check_f32(op, "nested_absmax", nested_absmax, ceil_div(blocks, kNf4NestedBlockSize));
  check_f32(op, "offset", offset, 1);
  const Device dev = check_same_device(op, {{"out", &out},
                                            {"packed", &packed},
                                            {"qabsmax", &qabsmax},
                                            {"nested_absmax", &nested_absmax},
                                            {"offset", &offset}});
  count_traffic(dev, {&out, &packed});
  SHARDLM_DISPATCH(dev, nf4_dequantize_nested(out, packed, qabsmax, nested_absmax, offset));
  cpu::nf4_dequantize_nested(out, packed, qabsmax, nested_absmax, offset);
}

void nf4_quantize(const Nf4Tensor& q, const Tensor& x) {
  SHARDLM_CHECK(q.blocksize == kNf4BlockSize, "nf4_quantize: blocksize {} is not supported (only {})", q.blocksize,
                kNf4BlockSize);
  SHARDLM_CHECK(x.numel() == q.numel(), "nf4_quantize: x has {} elements but the quantized tensor {}", x.numel(),
                q.numel());
  if (!q.nested) {
    nf4_quantize(q.packed, q.absmax, x);
    return;
  }
  const int64_t blocks = ceil_div(x.numel(), kNf4BlockSize);
  Buffer scratch(size_t(blocks) * 4, MemCategory::Workspace, false, x.device);
  const Tensor absmax = Tensor::of(scratch, DType::F32, {blocks});
  nf4_quantize(q.packed, absmax, x);
  const float offset = nf4_offset_from_sum(nf4_absmax_sum(absmax), blocks);
  check_f32("nf4_quantize", "offset", q.offset, 1);
  device::copy_bytes(q.offset.data, q.offset.device, &offset, Device::CPU, 4);
  nf4_quantize_absmax(q.absmax, q.nested_absmax, absmax, q.offset);
}

void nf4_dequantize(const Tensor& out, const Nf4Tensor& q) {
  SHARDLM_CHECK(q.blocksize == kNf4BlockSize, "nf4_dequantize: blocksize {} is not supported (only {})", q.blocksize,
                kNf4BlockSize);
  SHARDLM_CHECK(out.numel() == q.numel(), "nf4_dequantize: out has {} elements but the quantized tensor {}",
                out.numel(), q.numel());
  if (q.nested)
    nf4_dequantize_nested(out, q.packed, q.absmax, q.nested_absmax, q.offset);
  else
    nf4_dequantize(out, q.packed, q.absmax);
}

}  // namespace shardlm::ops
