#include "model/lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "core/error.h"
#include "model/llama.h"
#include "ops/ops.h"

namespace shardlm::model {

double LoraSpec::scale() const {
  return use_rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

std::vector<std::string> expand_lora_targets(const std::vector<std::string>& target_modules) {
  if (target_modules.empty())
    throw Error(fmt::format("no target modules (expected some of {} or \"{}\")", fmt::join(kLoraModules, " "),
                            kLoraAllLinear),
                {.key = "target_modules"});
  std::vector<bool> want(std::size(kLoraModules), false);
  for (const std::string& t : target_modules) {
    if (t == kLoraAllLinear) {
      std::fill(want.begin(), want.end(), true);
      continue;
    }
    const auto it = std::find_if(std::begin(kLoraModules), std::end(kLoraModules),
                                 [&](const char* m) { return t == m; });
    if (it == std::end(kLoraModules))
      throw Error(fmt::format("unknown target module '{}' (a Llama layer has {}; or \"{}\")", t,
                              fmt::join(kLoraModules, " "), kLoraAllLinear),
                  {.key = "target_modules"});
    want[size_t(it - std::begin(kLoraModules))] = true;
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i]) out.emplace_back(kLoraModules[i]);
  return out;
}

void validate_lora_spec(const LoraSpec& spec) {
  if (spec.rank <= 0) throw Error(fmt::format("rank must be positive, got {}", spec.rank), {.key = "r"});
  if (!std::isfinite(spec.alpha) || spec.alpha <= 0)
    throw Error(fmt::format("must be a positive number, got {}", spec.alpha), {.key = "lora_alpha"});
  if (!(spec.dropout >= 0 && spec.dropout < 1))
    throw Error(fmt::format("must be in [0, 1), got {}", spec.dropout), {.key = "lora_dropout"});
  expand_lora_targets(spec.target_modules);
}

std::string peft_lora_name(int64_t layer, const std::string& module_path, char a_or_b) {
  return fmt::format("base_model.model.model.layers.{}.{}.lora_{}.weight", layer, module_path, a_or_b);
}

std::vector<LoraTarget> lora_targets(const ModelConfig& cfg, const LoraSpec& spec) {
  validate_lora_spec(spec);
  const std::vector<std::string> modules = expand_lora_targets(spec.target_modules);
  // Each module's row of the layer tensor table: the weight named "<path>.<module>.weight".
  struct Row {
    std::string module, path;
    const TensorSpec* t;
  };
  std::vector<Row> rows;
  for (const std::string& m : modules) {
    const std::string suffix = "." + m + ".weight";
    const TensorSpec* found = nullptr;
    for (const LayerTensorSpec& lt : kLayerTensors) {
      const std::string_view name = lt.spec.name;
      if (name.size() > suffix.size() && name.ends_with(suffix)) found = &lt.spec;
    }
    SHARDLM_CHECK(found != nullptr, "LoRA target module '{}' has no weight in the layer tensor table", m);
    const std::string name = found->name;
    rows.push_back({m, name.substr(0, name.size() - 7), found});  // drop ".weight"
  }
  std::vector<LoraTarget> out;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (const Row& r : rows) {
      LoraTarget t;
      t.layer = l;
      t.module = r.module;
      t.module_path = r.path;
      t.weight_name = fmt::format("model.layers.{}.{}", l, r.t->name);
      t.a_name = peft_lora_name(l, r.path, 'A');
      t.b_name = peft_lora_name(l, r.path, 'B');
      t.out_features = dim_size(cfg, r.t->rows);
      t.in_features = dim_size(cfg, r.t->cols);
      out.push_back(std::move(t));
    }
  return out;
}

std::vector<LoraTensorInfo> lora_adapter_tensors(const ModelConfig& cfg, const LoraSpec& spec) {
  std::vector<LoraTensorInfo> out;
  for (const LoraTarget& t : lora_targets(cfg, spec)) {
    out.push_back({t.a_name, {spec.rank, t.in_features}});
    out.push_back({t.b_name, {t.out_features, spec.rank}});
  }
  return out;
}

int64_t lora_parameter_count(const ModelConfig& cfg, const LoraSpec& spec) {
  int64_t n = 0;
  for (const LoraTensorInfo& t : lora_adapter_tensors(cfg, spec)) n += t.shape[0] * t.shape[1];
  return n;
}

void lora_merge_into(const Tensor& W, const Tensor& A, const Tensor& B, double scale) {
  SHARDLM_CHECK(W.dtype == DType::F32 && W.ndim == 2 && W.is_contiguous(), "LoRA merge: the weight must be a "
                "contiguous f32 matrix, got {}", W.describe());
  SHARDLM_CHECK(A.ndim == 2 && B.ndim == 2 && A.shape[0] == B.shape[1] && A.shape[1] == W.shape[1] &&
                    B.shape[0] == W.shape[0],
                "LoRA merge: A {} and B {} do not fit the weight {} (expected A [r, {}], B [{}, r])", A.shape_str(),
                B.shape_str(), W.shape_str(), W.shape[1], W.shape[0]);
  ops::matmul(W, B, A, false, false, float(scale), 1.0f);
}

}  // namespace shardlm::model
