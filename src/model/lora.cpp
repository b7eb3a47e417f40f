#include "model/lora.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

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

std::string peft_magnitude_name(int64_t layer, const std::string& module_path) {
  return fmt::format("base_model.model.model.layers.{}.{}.lora_magnitude_vector", layer, module_path);
}

std::string dora_base_weight_name(const std::string& magnitude_name) {
  const std::string_view prefix = "base_model.model.", suffix = ".lora_magnitude_vector";
  const std::string_view n = magnitude_name;
  SHARDLM_CHECK(n.starts_with(prefix) && n.ends_with(suffix), "'{}' is not the PEFT name of a DoRA magnitude vector",
                magnitude_name);
  return std::string(n.substr(prefix.size(), n.size() - prefix.size() - suffix.size())) + ".weight";
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
      if (spec.use_dora) t.m_name = peft_magnitude_name(l, r.path);
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
    if (spec.use_dora) out.push_back({t.m_name, {t.out_features}});
  }
  return out;
}

int64_t lora_parameter_count(const ModelConfig& cfg, const LoraSpec& spec) {
  int64_t n = 0;
  for (const LoraTensorInfo& t : lora_adapter_tensors(cfg, spec)) n += t.shape[0] * (t.shape.size() > 1 ? t.shape[1] : 1);
  return n;
}

void lora_merge_into(const Tensor& W, const Tensor& A, const Tensor& B, double scale, const Tensor& m) {
  SHARDLM_CHECK(W.dtype == DType::F32 && W.ndim == 2 && W.is_contiguous(), "LoRA merge: the weight must be a "
                "contiguous f32 matrix, got {}", W.describe());
  SHARDLM_CHECK(A.ndim == 2 && B.ndim == 2 && A.shape[0] == B.shape[1] && A.shape[1] == W.shape[1] &&
                    B.shape[0] == W.shape[0],
                "LoRA merge: A {} and B {} do not fit the weight {} (expected A [r, {}], B [{}, r])", A.shape_str(),
                B.shape_str(), W.shape_str(), W.shape[1], W.shape[0]);
  ops::matmul(W, B, A, false, false, float(scale), 1.0f);
  if (!m.defined()) return;
  SHARDLM_CHECK(m.ndim == 1 && m.shape[0] == W.shape[0], "DoRA merge: the magnitude {} does not fit the weight {} "
                "(expected [{}])", m.shape_str(), W.shape_str(), W.shape[0]);
  // PEFT's DoRA merge: each row of W + scale B A rescaled to its magnitude.
  const int64_t out = W.shape[0], in = W.shape[1];
  std::vector<float> norms(static_cast<size_t>(out)), mag(static_cast<size_t>(out));
  ops::row_norms(Tensor::view(norms.data(), DType::F32, {out}), W);
  ops::cast(Tensor::view(mag.data(), DType::F32, {out}), m);
  for (int64_t j = 0; j < out; ++j) {
    const float g = mag[size_t(j)] / norms[size_t(j)];
    float* row = W.f32() + j * in;
    for (int64_t k = 0; k < in; ++k) row[k] *= g;
  }
}

}  // namespace shardlm::model
