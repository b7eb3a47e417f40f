// Hugging Face PEFT LoRA adapter directories, read and written.
//
// A directory holds (as PEFT's save_pretrained writes for a causal LM):
//   adapter_config.json        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8,
//                               "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": [...],
//                               "bias": "none", "use_rslora": false, ...}
//   adapter_model.safetensors  base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight [r, in]
//                              base_model.model.model.layers.{l}.self_attn.q_proj.lora_B.weight [out, r]
//                              ... for every layer and target module (mlp.gate_proj, mlp.down_proj, ...)
//                              and with "use_dora": true, DoRA's ...q_proj.lora_magnitude_vector [out]
// PEFT loads such a directory with PeftModel.from_pretrained(base, dir); see docs/lora.md.
//
// Reading accepts what merges into a Llama exactly as W' = W + scale * B A, or with DoRA as
// W' = m / ||W + scale * B A||_row * (W + scale * B A), and refuses, in one line naming the file and
// the key or tensor, everything else: another peft_type or task, bias other than "none",
// fan_in_fan_out, modules_to_save, per-layer or per-module ranks, ...
#pragma once

#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/tensor.h"
#include "io/staged_dir.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/lora.h"

namespace shardlm {

inline constexpr const char* kAdapterConfigName = "adapter_config.json";
inline constexpr const char* kAdapterWeightsName = "adapter_model.safetensors";

// adapter_config.json's content for `spec` (target_modules expanded to module names).
nlohmann::json peft_config_json(const model::LoraSpec& spec);
// The spec of an adapter_config.json; `file` names it in errors.
model::LoraSpec lora_spec_from_peft_json(const nlohmann::json& json, const std::string& file);
// adapter_config.json of the directory `dir`.
model::LoraSpec read_peft_config(const std::string& dir);

// Writes adapter_config.json and adapter_model.safetensors into `dir` (created if missing), each
// atomically. `tensors` maps every PEFT name of lora_adapter_tensors(cfg, spec) to a CPU,
// contiguous f32/bf16/f16 tensor of that shape (nothing more); they are stored in `dtype` (F32,
// BF16 or F16), in the order of lora_adapter_tensors.
void write_peft_adapter(const std::string& dir, const model::LoraSpec& spec, const ModelConfig& cfg,
                        const std::map<std::string, Tensor>& tensors, DType dtype = DType::F32);

// An adapter in memory: the spec and every A and B (and DoRA magnitude), widened to f32, by PEFT name.
struct PeftAdapter {
  model::LoraSpec spec;
  std::vector<model::LoraTarget> targets;      // lora_targets(cfg, spec)
  std::map<std::string, OwnedTensor> tensors;  // PEFT name -> f32 [r, in] or [out, r]
  DType stored_dtype = DType::F32;             // the file's dtype (of the first tensor)

  const Tensor& a(const model::LoraTarget& t) const { return tensors.at(t.a_name).t; }
  const Tensor& b(const model::LoraTarget& t) const { return tensors.at(t.b_name).t; }
  // DoRA's magnitude vector [out] (undefined without use_dora).
  Tensor m(const model::LoraTarget& t) const { return t.m_name.empty() ? Tensor{} : tensors.at(t.m_name).t; }
};

// Reads the directory `dir` for a base model of config `cfg`: the config is checked as above, and
// the file must hold exactly the tensors of lora_adapter_tensors(cfg, spec), with those shapes and
// a float dtype.
PeftAdapter read_peft_adapter(const std::string& dir, const ModelConfig& cfg);

// W += scale * B A (DoRA: then rescaled row-wise to the magnitude) for every target of the adapter, in place, on the f32 weights `lookup` gives by
// Hugging Face name (e.g. a ParamStore's master weights, for generation without a merged copy).
void merge_adapter_into(const PeftAdapter& adapter, const model::TensorLookup& lookup);

// Which base weights an adapter is merged into (`merge --merge-into`), for QLoRA adapters:
//  AsStored: the base as its directory stores it: a dense base's weights, a bitsandbytes 4-bit
//            base's NF4 weights dequantized as bitsandbytes does (what training from it saw);
//  Dequantized: the NF4 weights training saw: a bitsandbytes base's as stored, a dense base's decoder
//            Linear weights rounded through NF4 (model::nf4_round_in_place, as lora.quantize_base:
//            nf4 keeps them), so the merged model computes what the QLoRA run trained;
//  Dense: the dense base itself (an Error for a bitsandbytes base, which holds no dense weights).
enum class MergeInto { AsStored, Dequantized, Dense };
// "dequantized" / "dense" (an Error naming `role` otherwise).
MergeInto merge_into_of(const std::string& name, const std::string& role);
// Whether the base `cfg` (of directory `base`) is to be rounded through NF4 for `into`: true for
// Dequantized on a dense base; an Error naming `base` for Dense on a bitsandbytes 4-bit base.
bool rounds_base_to_nf4(const ModelConfig& cfg, const std::string& base, MergeInto into);

struct MergeOptions {
  std::string base, adapter, out;  // directories
  MergeInto merge_into = MergeInto::AsStored;
  std::optional<DType> dtype;      // of the merged weights; unset: the base's stored dtype
  uint64_t max_shard_bytes = 5'000'000'000;
  io::Publish publish = io::Publish::Replace;  // how `out` appears (io/staged_dir.h)
  std::string role = "the merged model's directory";  // names `out` in errors
};
struct MergeReport {
  model::LoraSpec spec;
  int64_t merged = 0;  // weights W + scale B A
  int64_t tensors = 0; // tensors written (the others copied, converted if --dtype asks)
  DType dtype = DType::F32;
  int64_t dequantized = 0;  // NF4 weights of a bitsandbytes 4-bit base, read dequantized (the merged model is plain)
  int64_t rounded = 0;      // weights of a dense base rounded through NF4 (MergeInto::Dequantized)
};
// A merged Hugging Face model directory: every base tensor, in the order of the model's parts,
// with W' = W + scale * B A computed in f32 from the base's stored dtype for each adapted weight,
// then stored in `dtype`; tensors the adapter does not touch are copied (bit for bit when the dtype
// is unchanged). Streamed tensor by tensor: memory holds one adapted weight in f32 and the adapter,
// never the model. config.json, generation_config.json and the base's tokenizer files are written
// beside the weights as every HF writer of shardlm does (model/hf_dir.h).
MergeReport merge_peft_adapter(const MergeOptions& opt);

}  // namespace shardlm
