// Reading a Hugging Face directory saved by transformers from a model loaded in 4-bit with
// bitsandbytes (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")), without
// re-quantizing anything.
//
// What such a directory holds (bitsandbytes' Linear4bit._save_to_state_dict + QuantState.as_dict(
// packed=True)), for every quantized linear weight W of n elements:
//   W                                   U8 [(n+1)/2, 1]: two NF4 codes per byte (ops/nf4.h)
//                                       (another storage dtype if bnb_4bit_quant_storage says so)
//   W.absmax                            F32 [blocks], or U8 [blocks] with double quantization
//   W.quant_map                         F32 [16]: the NF4 values
//   W.nested_absmax                     F32 [ceil(blocks/256)]        (double quantization)
//   W.nested_quant_map                  F32 [256]: the dynamic map    (double quantization)
//   W.quant_state.bitsandbytes__nf4     U8 [k]: UTF-8 JSON {"quant_type": "nf4", "blocksize": 64,
//                                       "dtype": "bfloat16", "shape": [out, in], and with double
//                                       quantization "nested_blocksize": 256, "nested_dtype":
//                                       "float32", "nested_offset": <f32 value>}
// with blocks = ceil(n / 64). Other tensors (embeddings, norms, lm_head) are stored as usual.
// config.json carries "quantization_config" (model/config.h: QuantizationConfig).
//
// Errors name the directory, the weight and the entry at fault. Supported: quant_type nf4,
// blocksize 64, nested_blocksize 256, dtype float32/bfloat16/float16; quant_map must be the NF4
// table. A nested_quant_map other than shardlm's kDynamicMapSigned (another bitsandbytes or torch
// version) is honoured: the weight's f32 absmax is then computed from the stored map on the host,
// exactly as bitsandbytes dequantizes it, and the weight is returned with a plain state.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/model_files.h"
#include "model/config.h"
#include "ops/nf4.h"

namespace shardlm::model {

// The quant_state of one weight, as stored (validated).
struct Nf4State {
  std::vector<int64_t> shape;
  DType dtype = DType::BF16;  // the weight's dtype before quantization ("dtype")
  bool nested = false;
  float offset = 0.0f;        // "nested_offset"
  bool standard_nested_map = true;  // nested_quant_map == ops::kDynamicMapSigned
  // The layout a read produces (nested only when the stored map is the standard one).
  ops::Nf4Layout layout() const;
};

// A quantized weight read into memory it owns: one flat buffer (ops::Nf4Layout) and its views.
struct Nf4Weight {
  std::string name;
  Nf4State state;
  ops::Nf4Layout layout;
  Buffer buffer;   // layout.total_bytes, CPU, MemCategory::Parameters
  ops::Nf4Tensor q;  // views of `buffer`
};

class Nf4ModelReader {
 public:
  // Opens the weights (io::ModelWeights) and config.json of `dir`. A directory without
  // quantization_config, or without quantized weights, opens too (everything is then plain).
  explicit Nf4ModelReader(std::string dir);
  // Over weights already open (the engine's load): borrowed, so they must outlive the reader;
  // `config` is the model's (config() returns it).
  Nf4ModelReader(const io::ModelWeights& weights, ModelConfig config);

  const std::string& dir() const { return weights_->dir(); }
  const io::ModelWeights& weights() const { return *weights_; }
  const ModelConfig& config() const { return config_; }
  // config().quantization, if any.
  const std::optional<QuantizationConfig>& quantization() const { return config_.quantization; }

  // Weights stored in NF4 (those with a ".quant_state.bitsandbytes__nf4" entry), sorted.
  const std::vector<std::string>& quantized_names() const { return quantized_; }
  bool is_quantized(const std::string& name) const;
  // The model's tensor names: quantized weights plus the plain tensors, without the state entries.
  std::vector<std::string> names() const;

  // The validated quant state of a quantized weight.
  Nf4State state(const std::string& name) const;
  // Whether reads keep every quantized weight's double quantization as stored: true when each is
  // double-quantized with the standard nested map, false when any is not (its state then reads as
  // plain f32 absmax values, exactly), nullopt when the directory has no quantized weights.
  std::optional<bool> double_quant_as_stored() const;
  // The whole quantized weight, read as stored.
  Nf4Weight read(const std::string& name) const;
  // Blocks [b0, b1) of a quantized weight into the matching byte ranges of a flat buffer laid out
  // by state(name).layout() (ops::Nf4Layout::range: the sharding rule), touching only those
  // pages of the file; with a nested state it also writes the offset. What a rank owning those
  // blocks reads.
  void read_blocks(const std::string& name, int64_t b0, int64_t b1, void* flat) const;
  // Blocks [b0, b1) of a quantized weight into `out`: CPU views sized for exactly those blocks
  // (packed [ceil(m/2)] for their m elements, absmax [b1 - b0], and when out.nested the
  // nested_absmax of their 256-groups and the offset), as a rank's NF4 chunk holds them. Only
  // those byte ranges of the file are read. out.nested needs a state double-quantized with the
  // standard nested map (copied as stored; b0 a multiple of 256) and throws otherwise; a plain
  // `out` takes any state, a nested one as f32 absmax values computed as bitsandbytes does.
  void read_chunk(const std::string& name, int64_t b0, int64_t b1, const ops::Nf4Tensor& out) const;
  // Elements [begin, end) of a quantized weight (flattened), dequantized to f32 exactly as
  // dequantize_f32 does, reading only the blocks that hold them.
  void dequantize_range(const std::string& name, int64_t begin, int64_t end, float* out) const;
  // Any tensor of the model as f32 (CPU): quantized weights dequantized exactly as bitsandbytes
  // does (in f32, before its final rounding to the stored dtype), plain float tensors widened.
  OwnedTensor dequantize_f32(const std::string& name) const;

 private:
  void find_quantized();
  std::unique_ptr<io::ModelWeights> owned_;  // when opened by directory
  const io::ModelWeights* weights_ = nullptr;
  ModelConfig config_;
  std::vector<std::string> quantized_;
};

// Every tensor of the directory as f32, quantized weights dequantized (Nf4ModelReader::dequantize_f32).
std::map<std::string, OwnedTensor> load_dequantized_f32(const std::string& dir);

// A dense weight (f32, CPU, contiguous) replaced by its NF4 rounding: quantized to NF4 (blocksize
// 64, with double quantization of the absmax values unless double_quant is false) and dequantized
// back, the values a QLoRA run (lora.quantize_base: nf4) trains its adapter against.
// `generate --load-in-4bit` and `merge --merge-into dequantized` round a dense base with it, and
// DoRA's magnitudes start from the row norms of a weight so rounded (shard/load.cpp).
void nf4_round_in_place(const Tensor& w, bool double_quant = true);

}  // namespace shardlm::model
