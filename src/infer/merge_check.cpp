#include "infer/merge_check.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "infer/load_weights.h"
#include "infer/param_store.h"
#include "io/model_files.h"
#include "model/hf_dir.h"
#include "model/lora.h"

namespace shardlm::infer {

namespace {

// The logits of every position of every prompt, [positions of prompt p, V] each, computed by
// `compute` over weights bound to it.
std::vector<std::vector<float>> all_logits(model::LlamaCompute& compute, const ModelConfig& cfg,
                                           const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<std::vector<float>> out;
  for (const std::vector<int32_t>& ids : prompts) {
    model::Batch b;
    b.B = 1;
    b.T = int64_t(ids.size());
    b.ids = ids.data();
    compute.reserve(b.B, b.T);
    std::vector<float>& l = out.emplace_back(size_t(b.T * cfg.vocab_size));
    compute.logits(b, Tensor::view(l.data(), DType::F32, {b.T, cfg.vocab_size}));
  }
  return out;
}

}  // namespace

double default_merge_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F32: return 1e-4;
    case DType::F16: return 4e-3;
    case DType::BF16: return 3e-2;
    default: return 3e-2;
  }
}

MergeCheck check_merge(const MergeCheckOptions& opt) {
  MergeCheck r;
  SHARDLM_CHECK(!opt.prompts.empty(), "no prompts to compare the logits of");
  const ModelConfig cfg = load_hf_config(opt.base);
  const bool round_nf4 = rounds_base_to_nf4(cfg, opt.base, opt.merge_into);
  for (const std::vector<int32_t>& p : opt.prompts) {
    SHARDLM_CHECK(!p.empty() && int64_t(p.size()) <= cfg.max_position_embeddings,
                  "a prompt of {} tokens (the model takes 1 to {})", p.size(), cfg.max_position_embeddings);
    r.positions += int64_t(p.size());
  }
  r.prompts = int64_t(opt.prompts.size());
  const bool stored_nf4 = cfg.quantization && cfg.quantization->is_bnb_nf4();
  r.reference = stored_nf4  ? fmt::format("{}'s NF4 weights dequantized as bitsandbytes does", opt.base)
                : round_nf4 ? fmt::format("{} with its decoder Linear weights rounded through NF4", opt.base)
                            : fmt::format("{} as stored", opt.base);

  // The base with the adapter beside it, unmerged: LoRA's forward as training runs it.
  std::vector<std::vector<float>> want;
  {
    ParamStore base(cfg, DType::F32);
    load_inference_weights({.model = opt.base, .adapter = "", .load_in_4bit = round_nf4,
                            .load_in_4bit_role = "--merge-into dequantized"},
                           cfg, base, [](const std::string&) {});
    const PeftAdapter adapter = read_peft_adapter(opt.adapter, cfg);
    // The adapted model's parts bound as training binds them: the base's f32 weights, and the
    // adapter's A, B (and DoRA's magnitude) by PEFT name.
    model::LlamaWeights w;
    for (const model::ModelPart& part : model::llama_parts(cfg, model::FinetuneSpec{.lora = adapter.spec}))
      model::bind_part(cfg, part, w, [&](const std::string& name) {
        const auto it = adapter.tensors.find(name);
        return it != adapter.tensors.end() ? it->second.t : base.master(name);
      });
    model::LlamaCompute compute(cfg, DType::F32, Device::CPU, adapter.spec);
    compute.set_weights(w);
    want = all_logits(compute, cfg, opt.prompts);
  }

  // The merged model, as generate and serve load it.
  const ModelConfig mcfg = load_hf_config(opt.merged);
  if (mcfg.quantization)
    throw Error("a merged model is plain; this one has a quantization_config",
                {.file = (std::filesystem::path(opt.merged) / "config.json").string(), .key = "quantization_config"});
  if (mcfg.vocab_size != cfg.vocab_size || mcfg.hidden_size != cfg.hidden_size ||
      mcfg.num_hidden_layers != cfg.num_hidden_layers || mcfg.intermediate_size != cfg.intermediate_size)
    throw Error(fmt::format("not a model of the base's shape (vocab {} hidden {} layers {} intermediate {}; the base "
                            "has {} {} {} {})",
                            mcfg.vocab_size, mcfg.hidden_size, mcfg.num_hidden_layers, mcfg.intermediate_size,
                            cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size),
                {.file = (std::filesystem::path(opt.merged) / "config.json").string()});
  std::vector<std::vector<float>> got;
  {
    const io::ModelWeights files(opt.merged);
    const io::TensorInfo& embed = files.info(model::kEmbeddingTensor.spec.name);
    if (!embed.dtype || !is_float(*embed.dtype))
      throw Error(fmt::format("dtype {} is not a float type", embed.dtype_name),
                  {.file = files.file_of(embed.name), .tensor = embed.name});
    r.merged_dtype = *embed.dtype;
    ParamStore merged(mcfg, DType::F32);
    merged.load(files, opt.merged);
    model::LlamaCompute compute(mcfg, DType::F32);
    compute.set_weights(merged.compute_weights());
    got = all_logits(compute, mcfg, opt.prompts);
  }

  for (size_t p = 0; p < want.size(); ++p)
    for (size_t i = 0; i < want[p].size(); ++i) {
      const double a = want[p][i], b = got[p][i];
      r.max_abs_logit = std::max(r.max_abs_logit, std::fabs(a));
      const double d = std::fabs(a - b);
      if (d > r.max_abs_diff || std::isnan(d)) {
        r.max_abs_diff = std::isnan(d) ? INFINITY : d;
        r.at_prompt = int64_t(p);
        r.at_position = int64_t(i) / cfg.vocab_size;
        r.at_token = int64_t(i) % cfg.vocab_size;
      }
    }
  return r;
}

}  // namespace shardlm::infer
