#include "infer/load_weights.h"

#include <fmt/format.h>

#include "io/model_files.h"
#include "model/peft_adapter.h"
#include "model/nf4_loader.h"

namespace shardlm::infer {

void load_inference_weights(const InferenceWeights& w, const ModelConfig& cfg, ParamStore& params,
                            const std::function<void(const std::string&)>& note) {
  const bool stored_nf4 = cfg.quantization && cfg.quantization->is_bnb_nf4();
  params.load(io::ModelWeights(w.model), w.model);
  if (stored_nf4) note(fmt::format("{} is bitsandbytes NF4: its weights are dequantized to f32", w.model));
  if (w.load_in_4bit && !stored_nf4) {
    int64_t n = 0;
    for (const model::ModelPart& part : model::llama_parts(cfg))
      for (const model::ParamInfo& info : part.params) {
        // The weights QLoRA keeps in NF4; another rank's, in a split model, are not here.
        if (!model::quantized_by_qlora(part, info) || !params.has(info.name)) continue;
        model::nf4_round_in_place(params.master(info.name));
        ++n;
      }
    note(fmt::format("{}: {} Linear weights quantized to NF4 and dequantized to f32", w.load_in_4bit_role, n));
  } else if (w.load_in_4bit) {
    note(fmt::format("{}: the model is stored in NF4 already", w.load_in_4bit_role));
  }
  if (!w.adapter.empty()) {
    PeftAdapter adapter = read_peft_adapter(w.adapter, cfg);
    // A split model (generate --device-map): this rank merges the adapters of its own layers.
    std::erase_if(adapter.targets, [&](const model::LoraTarget& t) { return !params.has(t.weight_name); });
    merge_adapter_into(adapter, [&](const std::string& name) { return params.master(name); });
    note(fmt::format("LoRA adapter {} merged in memory ({} weights, rank {}, scale {:g})", w.adapter,
                     adapter.targets.size(), adapter.spec.rank, adapter.spec.scale()));
  }
  params.sync_compute();
  if (w.dtype == DType::BF16) {
    params.keep_only_bf16();
    note(fmt::format("weights rounded to bf16: {:.1f} MiB", double(params.bytes()) / (1 << 20)));
  } else {
    SHARDLM_CHECK(w.dtype == DType::F32, "generation holds weights in f32 or bf16, not {}", dtype_name(w.dtype));
  }
}

}  // namespace shardlm::infer
