// NF4 (QLoRA) 4-bit weight quantization, bit-compatible with bitsandbytes (quant_type "nf4",
// blocksize 64, optionally compress_statistics=True, "double quantization").
//
// The format (bitsandbytes' CUDA kernels kQuantizeBlockwise / kDequantizeBlockwise):
//  - The flattened tensor of n elements is cut into blocks of 64 (the last one may be partial).
//    absmax[b] (f32) = max |x| over block b; each element is scaled by inv = 1.0f / absmax[b]
//    (one f32 division per block, then an f32 product per element) and becomes the 4-bit code of
//    the nearest NF4 value, decided by comparisons `x * inv > t` against the 15 thresholds t of
//    bitsandbytes' decision tree (its decimal literals of the midpoints between neighbouring
//    codes, converted to f32; the code is the number of thresholds below the value). NaN scaled values get code 0: an all-zero block has absmax 0,
//    0 * inf = NaN, so its codes are all 0 and it dequantizes to -0.0.
//  - Two codes per byte, element 2j in the HIGH nibble and 2j+1 in the low one: ceil(n/2) bytes.
//    For odd n, the last byte's low nibble is the code of bitsandbytes' zero padding (0 * inv:
//    7, or 0 if that block's absmax is 0); dequantization ignores it.
//  - Double quantization: offset = mean(absmax) (shardlm: sequential double sum / count, rounded
//    to f32; bitsandbytes takes torch's f32 mean on its device, so a fresh quantization may differ
//    from bitsandbytes' in that rounding; a loaded state is used as stored), then absmax - offset
//    is quantized in blocks of 256 with the signed 8-bit dynamic map (create_dynamic_map(
//    signed=True)) exactly as bitsandbytes' dQuantize<0> does (binary search, then the midpoint
//    with the neighbour): u8 codes qabsmax [blocks] and f32 nested_absmax [ceil(blocks/256)].
//  - Dequantization: absmax[b] = dyn[qabsmax[b]] * nested_absmax[b / 256] + offset (two f32
//    roundings, as bitsandbytes' two steps), out[i] = NF4[code_i] * absmax[i / 64] in f32,
//    rounded once to the output dtype (round to nearest even).
//
// Sharding rule: the ops work on any range of WHOLE blocks. A rank that owns blocks [b0, b1)
// quantizes elements [64 b0, min(64 b1, n)) into packed bytes [32 b0, ...) and absmax [b0, b1).
// Only the tensor's last range may end inside a block (at n). Double quantization works on whole
// groups of 256 blocks (16384 elements): its ranges start at a multiple of 16384 elements, and the
// offset is the mean over ALL blocks of the tensor (the engine all-reduces nf4_absmax_sum and
// calls nf4_offset_from_sum). Nf4Layout gives the byte offsets of each section and of a range.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/dynamic_map.h"

namespace shardlm::ops {

inline constexpr int64_t kNf4BlockSize = 64;         // elements per absmax value
inline constexpr int64_t kNf4NestedBlockSize = 256;  // absmax values per nested absmax value

// bitsandbytes' NF4 quant_map (get_4bit_type("nf4")): code c dequantizes to kNf4Code[c] * absmax.
extern const std::array<float, 16> kNf4Code;
// The 15 decision thresholds: bitsandbytes' dQuantizeNF4 literals (the midpoints between codes,
// printed as decimals) as f32. Four of them are the f32 neighbour of the exact midpoint's f32
// (near-ties), so they are kept as bitsandbytes wrote them, not recomputed.
extern const std::array<float, 15> kNf4Thresholds;
// The nested quant_map is ops/dynamic_map.h's kDynamicMapSigned.

// The flat byte buffer of one quantized tensor: its sections in this order, each starting at a
// multiple of 16 bytes (so f32 sections are aligned and the buffer can be all-gathered whole):
//   packed        U8  [ceil(n/2)]        two codes per byte
//   absmax        F32 [blocks]           (plain)   or U8 [blocks] codes (nested)
//   nested_absmax F32 [ceil(blocks/256)] (nested only)
//   offset        F32 [1]                (nested only)
// The code tables are constants (kNf4Code, kDynamicMapSigned) and are not stored per tensor.
struct Nf4Layout {
  int64_t numel = 0;
  bool nested = false;
  int64_t blocks = 0;         // ceil(numel / 64)
  int64_t nested_blocks = 0;  // ceil(blocks / 256) when nested, else 0
  size_t packed_offset = 0, packed_bytes = 0;
  size_t absmax_offset = 0, absmax_bytes = 0;
  size_t nested_absmax_offset = 0, nested_absmax_bytes = 0;
  size_t offset_offset = 0, offset_bytes = 0;
  size_t total_bytes = 0;

  static Nf4Layout of(int64_t numel, bool nested);

  // Byte ranges [begin, end) within each section for the blocks [b0, b1) (b1 <= blocks): what a
  // rank owning those blocks reads, writes or sends. Throws if the range is empty or out of
  // bounds; with nested = true, b0 must be a multiple of 256 and b1 a multiple of 256 or blocks.
  struct Range {
    int64_t elem_begin, elem_end;  // elements [64 b0, min(64 b1, numel))
    size_t packed_begin, packed_end;
    size_t absmax_begin, absmax_end;
    size_t nested_absmax_begin, nested_absmax_end;  // empty when not nested
  };
  Range range(int64_t b0, int64_t b1) const;
};

// A quantized tensor: views of its sections (usually of one flat buffer laid out by Nf4Layout,
// see nf4_view) plus what bitsandbytes keeps in its quant_state.
struct Nf4Tensor {
  std::vector<int64_t> shape;  // the logical shape of the weight
  DType dtype = DType::BF16;   // quant_state dtype: what the weight was, and what it dequantizes to
  int64_t blocksize = kNf4BlockSize;
  bool nested = false;
  Tensor packed;         // U8 [ceil(n/2)]
  Tensor absmax;         // F32 [blocks], or U8 [blocks] when nested
  Tensor nested_absmax;  // F32 [ceil(blocks/256)] (nested only)
  Tensor offset;         // F32 [1] (nested only)

  int64_t numel() const;
  Nf4Layout layout() const { return Nf4Layout::of(numel(), nested); }
};

// Views of the sections of a flat buffer (`base`, layout.total_bytes, on `device`).
Nf4Tensor nf4_view(void* base, const Nf4Layout& layout, const std::vector<int64_t>& shape, DType dtype,
                   Device device = Device::CPU);

// ---- ops (CPU reference kernels in ops/cpu/nf4.cpp, CUDA in ops/cuda/nf4.cu) --------------------
// Quantize x (F32|BF16|F16, contiguous, n elements, any shape: a range of whole blocks, see the
// sharding rule) into packed U8 [ceil(n/2)] and absmax F32 [ceil(n/64)] (both written).
void nf4_quantize(const Tensor& packed, const Tensor& absmax, const Tensor& x);
// Sum of the absmax values (F32, any length) in double, in index order (copied to the host first
// when on CUDA, so both backends add in the same order). Waits for the stream on CUDA.
double nf4_absmax_sum(const Tensor& absmax);
// bitsandbytes' offset: the mean of all absmax values of the tensor, f32(sum / count).
float nf4_offset_from_sum(double sum, int64_t count);
// Double quantization of absmax F32 [m] (a range of whole 256-groups): qabsmax U8 [m] and
// nested_absmax F32 [ceil(m/256)] written; offset F32 [1] is read (on the tensors' device).
void nf4_quantize_absmax(const Tensor& qabsmax, const Tensor& nested_absmax, const Tensor& absmax,
                         const Tensor& offset);
// absmax F32 [m] = kDynamicMapSigned[qabsmax] * nested_absmax[i / 256] + offset (written).
void nf4_dequantize_absmax(const Tensor& absmax, const Tensor& qabsmax, const Tensor& nested_absmax,
                           const Tensor& offset);
// out (F32|BF16|F16, n elements, any shape) = kNf4Code[code_i] * absmax[i / 64], written.
// packed U8 [ceil(n/2)], absmax F32 [ceil(n/64)].
void nf4_dequantize(const Tensor& out, const Tensor& packed, const Tensor& absmax);
// The same with a nested state (qabsmax U8, nested_absmax F32, offset F32 [1]); the absmax values
// are recomputed per block exactly as nf4_dequantize_absmax computes them (nothing allocated).
void nf4_dequantize_nested(const Tensor& out, const Tensor& packed, const Tensor& qabsmax,
                           const Tensor& nested_absmax, const Tensor& offset);

// Whole tensors. Quantizes x into q's views (q.nested decides double quantization; for nested,
// the f32 absmax lives in a Workspace buffer and the offset is computed from all of it), and
// dequantizes q into out (same element count; dtype F32|BF16|F16, need not be q.dtype).
void nf4_quantize(const Nf4Tensor& q, const Tensor& x);
void nf4_dequantize(const Tensor& out, const Nf4Tensor& q);

}  // namespace shardlm::ops
