#include "model/peft_adapter.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_parse.h"
#include "io/model_files.h"
#include "io/staged_dir.h"
#include "model/hf_dir.h"
#include "model/nf4_loader.h"
#include "io/safetensors.h"
#include "ops/ops.h"

namespace shardlm {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string brief(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// A key whose value must be `ok` (absent or null counts as the default, which is always ok).
void refuse_unless(const json& j, const std::string& file, const char* key, bool ok, const std::string& why) {
  if (!ok) throw Error(fmt::format("{}: {}", brief(j.at(key)), why), {.file = file, .key = key});
}
bool absent(const json& j, const char* key) { return !j.contains(key) || j.at(key).is_null(); }
bool false_or_absent(const json& j, const char* key) {
  return absent(j, key) || (j.at(key).is_boolean() && !j.at(key).get<bool>());
}
bool empty_or_absent(const json& j, const char* key) {
  return absent(j, key) || ((j.at(key).is_object() || j.at(key).is_array()) && j.at(key).empty());
}

// A target_modules entry PEFT would match against a Llama layer's Linear: the module name
// ("q_proj") or its path in the layer ("self_attn.q_proj"); returns the module name.
std::string target_name(const std::string& entry) {
  for (const char* m : model::kLoraModules) {
    if (entry == m) return entry;
    for (const char* parent : {"self_attn.", "mlp."})
      if (entry == std::string(parent) + m) return m;
  }
  return entry;  // unknown: expand_lora_targets names it
}

}  // namespace

json peft_config_json(const model::LoraSpec& spec) {
  model::validate_lora_spec(spec);
  json j;
  // The keys PEFT's LoraConfig has had since 0.10 (older and newer versions load them), with
  // PEFT's values for the options shardlm does not use. Sorted, as PEFT writes them.
  j["alpha_pattern"] = json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = spec.base_model_name_or_path.empty() ? json(nullptr) : json(spec.base_model_name_or_path);
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = spec.init == model::LoraInit::Gaussian ? json("gaussian") : json(true);
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["loftq_config"] = json::object();
  if (spec.alpha == std::floor(spec.alpha) && std::fabs(spec.alpha) < 1e15) j["lora_alpha"] = int64_t(spec.alpha);
  else j["lora_alpha"] = spec.alpha;
  j["lora_dropout"] = spec.dropout;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = spec.rank;
  j["rank_pattern"] = json::object();
  j["revision"] = nullptr;
  j["target_modules"] = model::expand_lora_targets(spec.target_modules);
  j["task_type"] = spec.task_type.empty() ? json(nullptr) : json(spec.task_type);
  j["use_dora"] = spec.use_dora;
  j["use_rslora"] = spec.use_rslora;
  return j;
}

model::LoraSpec lora_spec_from_peft_json(const json& j, const std::string& file) {
  if (!j.is_object()) throw Error("expected a JSON object", {.file = file});
  auto need = [&](const char* key) -> const json& {
    if (absent(j, key)) throw Error("missing (a PEFT LoRA adapter_config.json has it)", {.file = file, .key = key});
    return j.at(key);
  };
  const json& type = need("peft_type");
  if (!type.is_string() || type.get<std::string>() != "LORA")
    throw Error(fmt::format("{}: only LoRA adapters (\"LORA\") are supported", brief(type)), {.file = file, .key = "peft_type"});
  model::LoraSpec spec;
  if (!absent(j, "task_type")) {
    const json& t = j.at("task_type");
    if (!t.is_string() || t.get<std::string>() != "CAUSAL_LM")
      throw Error(fmt::format("{}: only CAUSAL_LM adapters (of a ...ForCausalLM model) are supported", brief(t)),
                  {.file = file, .key = "task_type"});
    spec.task_type = "CAUSAL_LM";
  }
  const json& r = need("r");
  if (!r.is_number_integer() || r.get<int64_t>() <= 0)
    throw Error(fmt::format("{}: expected a positive integer", brief(r)), {.file = file, .key = "r"});
  spec.rank = r.get<int64_t>();
  const json& alpha = need("lora_alpha");
  if (!alpha.is_number()) throw Error(fmt::format("{}: expected a number", brief(alpha)), {.file = file, .key = "lora_alpha"});
  spec.alpha = alpha.get<double>();
  if (!absent(j, "lora_dropout")) {
    if (!j.at("lora_dropout").is_number())
      throw Error(fmt::format("{}: expected a number", brief(j.at("lora_dropout"))), {.file = file, .key = "lora_dropout"});
    spec.dropout = j.at("lora_dropout").get<double>();
  }
  const json& targets = need("target_modules");
  if (targets.is_string()) {
    if (targets.get<std::string>() != model::kLoraAllLinear)
      throw Error(fmt::format("{}: a regular expression is not supported; list the module names (q_proj k_proj "
                              "v_proj o_proj gate_proj up_proj down_proj) or use \"all-linear\"",
                              brief(targets)),
                  {.file = file, .key = "target_modules"});
    spec.target_modules = {model::kLoraAllLinear};
  } else if (targets.is_array()) {
    for (const json& t : targets) {
      if (!t.is_string())
        throw Error(fmt::format("{}: expected a list of module names", brief(targets)), {.file = file, .key = "target_modules"});
      spec.target_modules.push_back(target_name(t.get<std::string>()));
    }
  } else {
    throw Error(fmt::format("{}: expected a list of module names or \"all-linear\"", brief(targets)),
                {.file = file, .key = "target_modules"});
  }
  if (!absent(j, "use_rslora")) {
    if (!j.at("use_rslora").is_boolean())
      throw Error(fmt::format("{}: expected true or false", brief(j.at("use_rslora"))), {.file = file, .key = "use_rslora"});
    spec.use_rslora = j.at("use_rslora").get<bool>();
  }
  if (!absent(j, "use_dora")) {
    if (!j.at("use_dora").is_boolean())
      throw Error(fmt::format("{}: expected true or false", brief(j.at("use_dora"))), {.file = file, .key = "use_dora"});
    spec.use_dora = j.at("use_dora").get<bool>();
  }
  if (!absent(j, "base_model_name_or_path") && j.at("base_model_name_or_path").is_string())
    spec.base_model_name_or_path = j.at("base_model_name_or_path").get<std::string>();

  // What would make W' = W + scale * B A wrong or incomplete.
  refuse_unless(j, file, "bias", absent(j, "bias") || j.at("bias") == "none",
                "only \"none\" (adapters that train biases are not supported)");
  refuse_unless(j, file, "fan_in_fan_out", false_or_absent(j, "fan_in_fan_out"),
                "Llama's Linear weights are [out, in] (fan_in_fan_out is for GPT-2's Conv1D)");
  refuse_unless(j, file, "modules_to_save", empty_or_absent(j, "modules_to_save"),
                "adapters that save whole modules are not supported");
  refuse_unless(j, file, "layers_to_transform", absent(j, "layers_to_transform"),
                "adapters of some layers only are not supported");
  refuse_unless(j, file, "rank_pattern", empty_or_absent(j, "rank_pattern"), "per-module ranks are not supported");
  refuse_unless(j, file, "alpha_pattern", empty_or_absent(j, "alpha_pattern"), "per-module alphas are not supported");
  refuse_unless(j, file, "layer_replication", empty_or_absent(j, "layer_replication"), "layer replication is not supported");
  refuse_unless(j, file, "lora_bias", false_or_absent(j, "lora_bias"), "LoRA biases are not supported");
  refuse_unless(j, file, "use_qalora", false_or_absent(j, "use_qalora"), "QA-LoRA is not supported");
  refuse_unless(j, file, "exclude_modules", empty_or_absent(j, "exclude_modules"), "excluded modules are not supported");
  refuse_unless(j, file, "target_parameters", empty_or_absent(j, "target_parameters"),
                "adapters of parameters (not modules) are not supported");
  refuse_unless(j, file, "trainable_token_indices", empty_or_absent(j, "trainable_token_indices"),
                "trainable tokens are not supported");
  refuse_unless(j, file, "alora_invocation_tokens", empty_or_absent(j, "alora_invocation_tokens"),
                "activated LoRA (aLoRA) is not supported");
  try {
    model::validate_lora_spec(spec);
  } catch (Error& e) {
    e.set_file(file);
    throw;
  }
  return spec;
}

model::LoraSpec read_peft_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterConfigName).string();
  if (!fs::is_directory(dir)) throw Error("not an adapter directory (expected adapter_config.json)", {.file = dir});
  std::ifstream f(path);
  if (!f) throw Error("missing: not a PEFT adapter directory", {.file = path});
  json j;
  try {
    j = io::parse_json(f);
  } catch (const json::exception& e) {
    throw Error(fmt::format("invalid JSON: {}", e.what()), {.file = path});
  }
  return lora_spec_from_peft_json(j, path);
}

void write_peft_adapter(const std::string& dir, const model::LoraSpec& spec, const ModelConfig& cfg,
                        const std::map<std::string, Tensor>& tensors, DType dtype) {
  SHARDLM_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
                "LoRA adapters are stored in f32, bf16 or f16, not {}", dtype_name(dtype));
  const std::vector<model::LoraTensorInfo> want = model::lora_adapter_tensors(cfg, spec);
  std::set<std::string> names;
  std::vector<io::PlannedTensor> plan;
  for (const model::LoraTensorInfo& t : want) {
    names.insert(t.name);
    const auto it = tensors.find(t.name);
    if (it == tensors.end()) throw Error("no data given for this adapter tensor", {.file = dir, .tensor = t.name});
    const Tensor& x = it->second;
    const Tensor shaped = Tensor::view(nullptr, DType::F32, t.shape.data(), int(t.shape.size()));
    if (std::vector<int64_t>(x.shape.begin(), x.shape.begin() + x.ndim) != t.shape)
      throw Error(fmt::format("shape {} given, but rank {} on this model needs {}", x.shape_str(), spec.rank,
                              shaped.shape_str()),
                  {.file = dir, .tensor = t.name});
    if (x.device != Device::CPU || !x.is_contiguous() || !is_float(x.dtype))
      throw Error(fmt::format("expected a contiguous float CPU tensor, got {}", x.describe()), {.file = dir, .tensor = t.name});
    plan.emplace_back(t.name, dtype, t.shape);
  }
  for (const auto& [name, t] : tensors)
    if (!names.count(name))
      throw Error("not a tensor of this adapter (its names are lora_adapter_tensors(config, spec))", {.file = dir, .tensor = name});

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create the directory: {}", ec.message()), {.file = dir});
  // Each file atomically, the weights first and the config that describes them last.
  io::SafetensorsWriter w((fs::path(dir) / kAdapterWeightsName).string(), plan, {{"format", "pt"}});
  for (const model::LoraTensorInfo& t : want) {
    const Tensor& x = tensors.at(t.name);
    if (x.dtype == dtype) {
      w.write(t.name, x.data, x.nbytes());
    } else {
      const OwnedTensor y(dtype, {x.numel()}, MemCategory::Workspace, false);
      ops::cast(y.t, Tensor::view(x.data, x.dtype, {x.numel()}));
      w.write(t.name, y.t.data, y.t.nbytes());
    }
  }
  w.finish();
  io::write_text_atomic((fs::path(dir) / kAdapterConfigName).string(), peft_config_json(spec).dump(2) + "\n");
}

PeftAdapter read_peft_adapter(const std::string& dir, const ModelConfig& cfg) {
  PeftAdapter out;
  out.spec = read_peft_config(dir);
  const std::string path = (fs::path(dir) / kAdapterWeightsName).string();
  if (!fs::exists(path)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin"))
      throw Error("missing; adapter_model.bin (a pickle) is not read: save the adapter with PEFT's "
                  "save_pretrained(safe_serialization=True)",
                  {.file = path});
    throw Error("missing: not a PEFT adapter directory", {.file = path});
  }
  const io::SafetensorsFile file(path);
  const std::string config_path = (fs::path(dir) / kAdapterConfigName).string();
  try {
    out.targets = model::lora_targets(cfg, out.spec);
  } catch (Error& e) {
    e.set_file(config_path);
    throw;
  }
  const std::vector<model::LoraTensorInfo> want = model::lora_adapter_tensors(cfg, out.spec);
  std::set<std::string> expected;
  for (const model::LoraTensorInfo& t : want) expected.insert(t.name);
  for (const io::TensorInfo& info : file.tensors()) {
    if (expected.count(info.name)) continue;
    std::string why = "not a LoRA tensor of the target modules in adapter_config.json";
    if (info.name.find("lora_magnitude_vector") != std::string::npos)
      why = out.spec.use_dora ? "a DoRA magnitude vector of no target module in adapter_config.json"
                              : "a DoRA magnitude vector, but adapter_config.json does not say use_dora: true";
    else if (info.name.find("lora_embedding") != std::string::npos) why = "an embedding adapter (not supported)";
    else if (info.name.find(".default.") != std::string::npos)
      why = "names carry the adapter name \"default\"; PEFT's save_pretrained writes them without it";
    throw Error(why, {.file = path, .tensor = info.name});
  }
  for (const model::LoraTensorInfo& t : want) {
    if (!file.has(t.name))
      throw Error(fmt::format("missing (adapter_config.json targets {} at rank {} on all {} layers)",
                              fmt::join(model::expand_lora_targets(out.spec.target_modules), " "), out.spec.rank,
                              cfg.num_hidden_layers),
                  {.file = path, .tensor = t.name});
    const io::TensorInfo& info = file.info(t.name);
    if (info.shape != t.shape) {
      const Tensor shaped = Tensor::view(nullptr, DType::F32, t.shape.data(), int(t.shape.size()));
      throw Error(fmt::format("shape {} in the file, but r = {} on this base model needs {} ({})", info.shape_str(),
                              out.spec.rank, shaped.shape_str(),
                              t.name.find("lora_A") != std::string::npos   ? "[r, in_features]"
                              : t.name.find("lora_B") != std::string::npos ? "[out_features, r]"
                                                                           : "DoRA's magnitude: [out_features]"),
                  {.file = path, .tensor = t.name});
    }
    if (!info.dtype || !is_float(*info.dtype))
      throw Error(fmt::format("dtype {} is not a float type", info.dtype_name), {.file = path, .tensor = t.name});
    if (out.tensors.empty()) out.stored_dtype = *info.dtype;
    OwnedTensor f32(DType::F32, t.shape.data(), int(t.shape.size()), MemCategory::Parameters, false);
    const OwnedTensor raw(*info.dtype, {info.numel()}, MemCategory::Workspace, false);
    file.read_range(t.name, 0, uint64_t(info.numel()), raw.t.data);
    ops::cast(Tensor::view(f32.t.data, DType::F32, {info.numel()}), raw.t);
    for (int64_t i = 0; i < info.numel(); ++i)
      if (!std::isfinite(f32.t.f32()[i]))
        throw Error(fmt::format("element {} is not finite", i), {.file = path, .tensor = t.name});
    out.tensors.emplace(t.name, std::move(f32));
  }
  return out;
}

}  // namespace shardlm

namespace shardlm {

void merge_adapter_into(const PeftAdapter& adapter, const model::TensorLookup& lookup) {
  const double scale = adapter.spec.scale();
  for (const model::LoraTarget& t : adapter.targets) {
    const Tensor w = lookup(t.weight_name);
    try {
      model::lora_merge_into(w, adapter.a(t), adapter.b(t), scale, adapter.m(t));
    } catch (Error& e) {
      e.set_tensor(t.weight_name);
      throw;
    }
  }
}

MergeInto merge_into_of(const std::string& name, const std::string& role) {
  if (name == "dequantized") return MergeInto::Dequantized;
  if (name == "dense") return MergeInto::Dense;
  throw Error(fmt::format("'{}': expected dequantized (the NF4 weights a QLoRA run trained against) or dense (the "
                          "dense base itself)",
                          name),
              {.key = role});
}

bool rounds_base_to_nf4(const ModelConfig& cfg, const std::string& base, MergeInto into) {
  const bool stored_nf4 = cfg.quantization && cfg.quantization->is_bnb_nf4();
  if (into == MergeInto::Dense && stored_nf4)
    throw Error("a bitsandbytes 4-bit model holds no dense weights to merge into (merge into its dequantized NF4 "
                "weights, or give the dense model it was quantized from)",
                {.file = (fs::path(base) / "config.json").string(), .key = "quantization_config"});
  return into == MergeInto::Dequantized && !stored_nf4;
}

MergeReport merge_peft_adapter(const MergeOptions& opt) {
  io::refuse_output_over_input(opt.out, opt.role, opt.base, "base model directory");
  io::refuse_output_over_input(opt.out, opt.role, opt.adapter, "adapter directory");
  const ModelConfig cfg = load_model_config(opt.base);
  const bool round_nf4 = rounds_base_to_nf4(cfg, opt.base, opt.merge_into);
  const io::ModelWeights weights(opt.base);
  // A directory saved by transformers from a bitsandbytes 4-bit model: its NF4 weights are read as
  // bitsandbytes dequantizes them (in f32), and the merged model is a plain one.
  const model::Nf4ModelReader nf4(weights, cfg);
  const PeftAdapter adapter = read_peft_adapter(opt.adapter, cfg);
  std::map<std::string, const model::LoraTarget*> adapted;
  for (const model::LoraTarget& t : adapter.targets) adapted[t.weight_name] = &t;

  // Every tensor of the model, in part order, checked against the base files.
  std::vector<io::PlannedTensor> plan;
  std::set<std::string> known, rounded;
  MergeReport report;
  report.spec = adapter.spec;
  std::optional<DType> stored;
  for (const model::ModelPart& part : model::llama_parts(cfg))
    for (const model::ParamInfo& p : part.params) {
      if (!weights.has(p.name)) throw Error("missing from the base model's weights", {.file = opt.base, .tensor = p.name});
      known.insert(p.name);
      if (round_nf4 && model::quantized_by_qlora(part, p)) rounded.insert(p.name);
      plan.emplace_back(p.name, DType::F32, p.shape);  // dtype set below
      if (nf4.is_quantized(p.name)) {
        const model::Nf4State st = nf4.state(p.name);
        if (st.shape != p.shape) {
          const Tensor want = Tensor::view(nullptr, DType::F32, p.shape.data(), int(p.shape.size()));
          const Tensor got = Tensor::view(nullptr, DType::F32, st.shape.data(), int(st.shape.size()));
          throw Error(fmt::format("NF4 shape {} in the file, but config.json implies {}", got.shape_str(), want.shape_str()),
                      {.file = weights.file_of(p.name), .tensor = p.name});
        }
        // The dtype the weight had before quantization (the quant_state's), not its U8 storage.
        if (!stored) stored = st.dtype;
        ++report.dequantized;
        continue;
      }
      const io::TensorInfo& info = weights.float_info(p.name, p.shape);
      if (!stored) stored = *info.dtype;
    }
  for (const std::string& name : nf4.names())
    if (!known.count(name) && name.find("rotary_emb.inv_freq") == std::string::npos)
      throw Error("in the weights but not in the model described by config.json", {.file = opt.base, .tensor = name});
  report.dtype = opt.dtype.value_or(*stored);
  SHARDLM_CHECK(report.dtype == DType::F32 || report.dtype == DType::BF16 || report.dtype == DType::F16,
                "merged weights are stored in f32, bf16 or f16, not {}", dtype_name(report.dtype));
  for (io::PlannedTensor& p : plan) p.dtype = io::safetensors_dtype_name(report.dtype);
  report.tensors = int64_t(plan.size());

  const double scale = adapter.spec.scale();
  constexpr int64_t kChunk = int64_t(4) << 20;  // elements converted at a time when copying
  io::publish_dir(opt.out, opt.publish, opt.role, [&](const std::string& out) {
  io::write_model_weights_streaming(out, plan, opt.max_shard_bytes, [&](const std::string& name, const io::TensorSink& sink) {
    const auto it = adapted.find(name);
    if (it != adapted.end() || nf4.is_quantized(name) || rounded.count(name)) {
      // The whole weight in f32 (an NF4 one dequantized as bitsandbytes does; a dense one rounded
      // through NF4 for MergeInto::Dequantized), W += scale * B A when adapted (rescaled row by row
      // to the magnitude for DoRA), then stored in the output dtype.
      OwnedTensor w;
      if (nf4.is_quantized(name)) {
        w = nf4.dequantize_f32(name);
      } else {
        const io::TensorInfo& info = weights.info(name);
        w = OwnedTensor(DType::F32, info.shape.data(), int(info.shape.size()), MemCategory::Workspace, false);
        const OwnedTensor raw(*info.dtype, {info.numel()}, MemCategory::Workspace, false);
        weights.read_range(name, 0, uint64_t(info.numel()), raw.t.data);
        ops::cast(Tensor::view(w.t.data, DType::F32, {info.numel()}), raw.t);
        if (rounded.count(name)) {
          model::nf4_round_in_place(w.t);
          ++report.rounded;
        }
      }
      const int64_t n = w.t.numel();
      if (it != adapted.end()) {
        try {
          model::lora_merge_into(w.t, adapter.a(*it->second), adapter.b(*it->second), scale, adapter.m(*it->second));
        } catch (Error& e) {
          e.set_tensor(name);
          throw;
        }
        ++report.merged;
      }
      if (report.dtype == DType::F32) {
        sink(w.t.data, w.t.nbytes());
      } else {
        const OwnedTensor low(report.dtype, {n}, MemCategory::Workspace, false);
        ops::cast(low.t, Tensor::view(w.t.data, DType::F32, {n}));
        sink(low.t.data, low.t.nbytes());
      }
    } else {
      // Copied in chunks; bytes as they are when the dtype does not change.
      const io::TensorInfo& info = weights.info(name);
      const DType from = *info.dtype;
      const int64_t n = info.numel();
      const OwnedTensor raw(from, {std::min(kChunk, n)}, MemCategory::Workspace, false);
      OwnedTensor conv;
      if (from != report.dtype) conv = OwnedTensor(report.dtype, {std::min(kChunk, n)}, MemCategory::Workspace, false);
      for (int64_t pos = 0; pos < n; pos += kChunk) {
        const int64_t m = std::min(kChunk, n - pos);
        weights.read_range(name, uint64_t(pos), uint64_t(m), raw.t.data);
        if (from == report.dtype) {
          sink(raw.t.data, size_t(m) * dtype_size(from));
        } else {
          ops::cast(conv.t.slice(0, m), raw.t.slice(0, m));
          sink(conv.t.data, size_t(m) * dtype_size(report.dtype));
        }
      }
    }
    weights.file_holding(name).drop_resident_pages();
  });
  write_hf_side_files(out, cfg, report.dtype, opt.base);
  // The base's own generation settings, when it has them, rather than the defaults from config.json.
  const fs::path gen = fs::path(opt.base) / "generation_config.json";
  if (fs::exists(gen)) {
    std::ifstream f(gen, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    io::write_text_atomic((fs::path(out) / "generation_config.json").string(), bytes);
  }
  });
  SHARDLM_CHECK(report.merged == int64_t(adapter.targets.size()), "merged {} of the adapter's {} weights",
                report.merged, adapter.targets.size());
  return report;
}

}  // namespace shardlm
