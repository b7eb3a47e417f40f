#include "infer/load_weights.h"

#include <fmt/format.h>

#include "io/model_files.h"
#include "model/peft_adapter.h"
#include "model/nf4_loader.h"

namespace shardlm::infer {

namespace {
// The f32 weights `w` asks for (NF4 rounding, an adapter merged) into `params`.
void load_f32(const InferenceWeights& w, const ModelConfig& cfg, ParamStore& params,
              const std::function<void(const std::string&)>& note) {
  const bool stored_nf4 = cfg.quantization && cfg.quantization->is_bnb_nf4();
  if (params.split().active() && (!w.adapter.empty() || (w.load_in_4bit && !stored_nf4))) {
    // Merging and NF4 rounding work on whole tensors: do them on a whole copy of the model, then
    // keep this rank's slices (the whole model in f32 is held meanwhile).
    ParamStore whole(cfg, DType::F32);
    load_f32(w, cfg, whole, note);
    params.load_slices(whole);
    return;
  }
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
}
}  // namespace

void load_inference_weights(const InferenceWeights& w, const ModelConfig& cfg, ParamStore& params,
                            const std::function<void(const std::string&)>& note) {
  SHARDLM_CHECK(w.dtype == DType::F32 || w.dtype == DType::BF16, "generation holds weights in f32 or bf16, not {}",
                dtype_name(w.dtype));
  SHARDLM_CHECK(!w.q8_0 || w.dtype == DType::BF16, "q8_0 weights go with bf16 for the others, not {}",
                dtype_name(w.dtype));
  load_f32(w, cfg, params, note);
  if (w.q8_0) {
    std::vector<std::string> left;
    const int n = params.keep_only_q8_0(&left);
    note(fmt::format("{} Linear weights quantized to q8_0, the rest rounded to bf16: {:.1f} MiB{}", n,
                     double(params.bytes()) / (1 << 20),
                     left.empty() ? "" : fmt::format(" ({} kept in bf16, rows not whole blocks of 32, e.g. {})",
                                                     left.size(), left.front())));
  } else if (w.dtype == DType::BF16) {
    params.keep_only_bf16();
    note(fmt::format("weights rounded to bf16: {:.1f} MiB", double(params.bytes()) / (1 << 20)));
  }
  if (w.device != Device::CPU) {
    params.move_to(w.device);
    note(fmt::format("weights moved to {}: {:.1f} MiB", device_name(w.device), double(params.bytes()) / (1 << 20)));
  }
}

}  // namespace shardlm::infer
