// Test support: a model directory in the layout transformers saves from a model loaded in 4-bit
// with bitsandbytes (model/nf4_loader.h describes it), written from a ParamStore's weights with
// shardlm's NF4 ops, which are bit-compatible with bitsandbytes' (tests/parity_nf4.cpp checks
// them, and the reader, against PyTorch references).
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/llama.h"
#include "model/nf4_loader.h"
#include "ops/nf4.h"
#include "ops/ops.h"
#include "infer/param_store.h"

namespace shardlm::testing {

struct BnbDirOptions {
  bool double_quant = true;          // bnb_4bit_use_double_quant
  // false: the stored nested_quant_map is kDynamicMapSigned with its non-zero entries scaled by
  // (1 - 2^-8), as another bitsandbytes version might store it; the codes stay as quantized, so
  // only the dequantized absmax values (and the weights) change.
  bool standard_nested_map = true;
  DType dtype = DType::BF16;         // of the plain tensors, and what the NF4 weights were quantized from
};

// Writes the model in `store` (config `cfg`, no LoRA) to `dir`: config.json with a
// quantization_config, one model.safetensors holding every Linear weight of the decoder layers
// (q/k/v/o/gate/up/down) as bitsandbytes' NF4 state and every other tensor in o.dtype.
inline void write_bnb_dir(const std::string& dir, const ModelConfig& cfg, const infer::ParamStore& store,
                          const BnbDirOptions& o = {}) {
  store.save(dir, o.dtype, uint64_t(1) << 40, "");  // config.json (and a model.safetensors replaced below)
  model::FinetuneSpec qlora;  // which tensors QLoRA keeps in NF4
  qlora.lora.emplace().target_modules = {"all-linear"};
  qlora.nf4_base = true;
  std::vector<std::string> nf4_names;
  for (const model::ModelPart& part : model::llama_parts(cfg, qlora))
    for (const model::ParamInfo& info : part.params)
      if (info.nf4) nf4_names.push_back(info.name);

  std::vector<std::vector<uint8_t>> keep;  // the bytes the tensors below view
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto add = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    keep.push_back(std::move(bytes));
    tensors.emplace_back(name, Tensor::view(keep.back().data(), dtype, shape.data(), int(shape.size())));
  };
  auto f32_bytes = [](const float* v, size_t n) {
    std::vector<uint8_t> b(n * 4);
    std::memcpy(b.data(), v, b.size());
    return b;
  };
  for (const std::string& name : store.names()) {
    const Tensor w = store.master(name);
    const int64_t n = w.numel();
    std::vector<uint8_t> rounded(size_t(n) * dtype_size(o.dtype));  // the weight as the model held it
    ops::cast(Tensor::view(rounded.data(), o.dtype, {n}), Tensor::view(w.data, DType::F32, {n}));
    if (std::find(nf4_names.begin(), nf4_names.end(), name) == nf4_names.end()) {
      add(name, o.dtype, std::vector<int64_t>(w.shape.begin(), w.shape.begin() + w.ndim), std::move(rounded));
      continue;
    }
    const ops::Nf4Layout l = ops::Nf4Layout::of(n, o.double_quant);
    std::vector<uint8_t> flat(l.total_bytes);
    const ops::Nf4Tensor q = ops::nf4_view(flat.data(), l, {n}, o.dtype);
    ops::nf4_quantize(q, Tensor::view(rounded.data(), o.dtype, {n}));
    auto section = [&](size_t offset, size_t bytes) {
      return std::vector<uint8_t>(flat.begin() + ptrdiff_t(offset), flat.begin() + ptrdiff_t(offset + bytes));
    };
    add(name, DType::U8, {int64_t(l.packed_bytes), 1}, section(l.packed_offset, l.packed_bytes));
    add(name + ".absmax", o.double_quant ? DType::U8 : DType::F32, {l.blocks}, section(l.absmax_offset, l.absmax_bytes));
    add(name + ".quant_map", DType::F32, {16}, f32_bytes(ops::kNf4Code.data(), 16));
    nlohmann::json state = {{"quant_type", "nf4"},
                            {"blocksize", ops::kNf4BlockSize},
                            {"dtype", o.dtype == DType::BF16 ? "bfloat16" : o.dtype == DType::F16 ? "float16" : "float32"},
                            {"shape", std::vector<int64_t>(w.shape.begin(), w.shape.begin() + w.ndim)}};
    if (o.double_quant) {
      add(name + ".nested_absmax", DType::F32, {l.nested_blocks},
          section(l.nested_absmax_offset, l.nested_absmax_bytes));
      std::array<float, 256> map = ops::kDynamicMapSigned;
      if (!o.standard_nested_map)
        for (float& v : map) v *= 1.0f - 1.0f / 256.0f;
      add(name + ".nested_quant_map", DType::F32, {256}, f32_bytes(map.data(), 256));
      float offset = 0;
      std::memcpy(&offset, flat.data() + l.offset_offset, 4);
      state["nested_blocksize"] = ops::kNf4NestedBlockSize;
      state["nested_dtype"] = "float32";
      state["nested_offset"] = double(offset);
    }
    const std::string blob = state.dump();
    add(name + ".quant_state.bitsandbytes__nf4", DType::U8, {int64_t(blob.size())},
        std::vector<uint8_t>(blob.begin(), blob.end()));
  }
  io::write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});

  nlohmann::json config;
  std::ifstream(dir + "/config.json") >> config;
  config["quantization_config"] = {{"quant_method", "bitsandbytes"},
                                   {"load_in_4bit", true},
                                   {"load_in_8bit", false},
                                   {"bnb_4bit_quant_type", "nf4"},
                                   {"bnb_4bit_use_double_quant", o.double_quant},
                                   {"bnb_4bit_compute_dtype", "bfloat16"},
                                   {"bnb_4bit_quant_storage", "uint8"}};
  std::ofstream(dir + "/config.json") << config.dump(2);
}

// The directory's every tensor as Nf4ModelReader::dequantize_f32 reads it, saved in f32 to `out`
// (config.json without the quantization_config): the dense model bitsandbytes computes with.
inline void write_dequantized_dir(const std::string& bnb_dir, const std::string& out) {
  std::filesystem::create_directories(out);
  const std::map<std::string, OwnedTensor> all = model::load_dequantized_f32(bnb_dir);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : all) tensors.emplace_back(name, t.t);
  io::write_safetensors(out + "/model.safetensors", tensors, {{"format", "pt"}});
  nlohmann::json config;
  std::ifstream(bnb_dir + "/config.json") >> config;
  config.erase("quantization_config");
  std::ofstream(out + "/config.json") << config.dump(2);
}

}  // namespace shardlm::testing
