#include "cli/inference.h"

#include <cstdio>

#include "io/model_files.h"
#include "model/peft_adapter.h"
#include "ops/nf4.h"

namespace shardlm::cli {

void load_inference_weights(const char* command, const InferenceWeights& w, const ModelConfig& cfg,
                            infer::ParamStore& params) {
  const bool stored_nf4 = cfg.quantization && cfg.quantization->is_bnb_nf4();
  params.load(io::ModelWeights(w.model), w.model);
  if (stored_nf4)
    std::fprintf(stderr, "%s: %s is bitsandbytes NF4: its weights are dequantized to f32\n", command, w.model.c_str());
  if (w.load_in_4bit && !stored_nf4) {
    ModelConfig qcfg = cfg;  // which weights QLoRA keeps in NF4: every decoder Linear weight
    qcfg.lora.emplace().target_modules = {"all-linear"};
    qcfg.nf4_base = true;
    int64_t n = 0;
    for (const model::ModelPart& part : model::llama_parts(qcfg))
      for (const model::ParamInfo& info : part.params) {
        if (!info.nf4 || !params.has(info.name)) continue;  // another rank's, in a split model
        const Tensor t = params.master(info.name);
        const ops::Nf4Layout layout = ops::Nf4Layout::of(t.numel(), true);
        const Buffer buf(layout.total_bytes, MemCategory::Workspace, false);
        const ops::Nf4Tensor q = ops::nf4_view(buf.data(), layout, info.shape, DType::F32);
        const Tensor flat = t.reshape({t.numel()});
        ops::nf4_quantize(q, flat);
        ops::nf4_dequantize(flat, q);
        ++n;
      }
    std::fprintf(stderr, "%s: --load-in-4bit: %lld Linear weights quantized to NF4 and dequantized to f32\n", command,
                 (long long)n);
  } else if (w.load_in_4bit) {
    std::fprintf(stderr, "%s: --load-in-4bit: the model is stored in NF4 already\n", command);
  }
  if (!w.adapter.empty()) {
    PeftAdapter adapter = read_peft_adapter(w.adapter, cfg);
    // A split model (generate --device-map): this rank merges the adapters of its own layers.
    std::erase_if(adapter.targets, [&](const model::LoraTarget& t) { return !params.has(t.weight_name); });
    merge_adapter_into(adapter, [&](const std::string& name) { return params.master(name); });
    std::fprintf(stderr, "%s: LoRA adapter %s merged in memory (%zu weights, rank %lld, scale %g)\n", command,
                 w.adapter.c_str(), adapter.targets.size(), (long long)adapter.spec.rank, adapter.spec.scale());
  }
  params.sync_compute();
}

}  // namespace shardlm::cli
