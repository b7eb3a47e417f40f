// `shardlm merge`: a base model + a PEFT LoRA adapter -> a merged Hugging Face model directory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <fstream>

#include "cli/commands.h"
#include "memory/usage.h"
#include "core/error.h"
#include "io/model_files.h"
#include "model/peft_adapter.h"

namespace shardlm::cli {

void register_merge(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("merge", "Merge a PEFT LoRA adapter into its base model (a new Hugging Face directory)");
  struct Opts {
    std::string base, adapter, out, dtype, max_shard_size = "5GB";
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--base", o->base, "The base model's Hugging Face directory")->required();
  cmd->add_option("--adapter", o->adapter, "A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors)")
      ->required();
  cmd->add_option("--out", o->out, "Directory to write: created, or replaced whole when it holds only model files")
      ->required();
  cmd->add_option("--dtype", o->dtype, "Stored dtype of the merged model: f32, bf16 or f16 (default: the base's)");
  cmd->add_option("--max-shard-size", o->max_shard_size, "Largest safetensors file, e.g. 5GB, 500MB, 2GiB")
      ->capture_default_str();
  cmd->footer(
      "Examples:\n"
      "  shardlm merge --base models/llama2-7b --adapter runs/alpaca-lora/adapter --out runs/alpaca-merged\n"
      "  shardlm merge --base runs/tiny --adapter runs/tiny-lora --out runs/tiny-merged --dtype f32\n"
      "\n"
      "Every adapted weight becomes W + scale * B A (scale = lora_alpha / r, or lora_alpha / sqrt(r)\n"
      "with use_rslora), computed in f32 from the base's stored dtype, then stored in --dtype; for a\n"
      "DoRA adapter (use_dora) each row of it is then scaled to its magnitude m / ||row||. The\n"
      "other tensors are copied. Streams tensor by tensor (memory: one weight in f32 and the adapter).\n"
      "Writes config.json, generation_config.json, the base's tokenizer files and model.safetensors\n"
      "(or shards and an index) into a staging directory beside --out, then publishes it whole.\n"
      "See docs/lora.md.");
  cmd->callback([o] {
    const auto t0 = std::chrono::steady_clock::now();
    MergeOptions opt;
    opt.base = o->base;
    opt.adapter = o->adapter;
    opt.out = o->out;
    opt.role = "--out";
    if (!o->dtype.empty()) opt.dtype = dtype_flag("--dtype", o->dtype, {DType::F32, DType::BF16, DType::F16});
    opt.max_shard_bytes = io::parse_size(o->max_shard_size);
    const MergeReport r = merge_peft_adapter(opt);
    fmt::print("merged {} weights ({} per layer: {}) of {} with rank {}, lora_alpha {}, scale {:g}{} -> {} ({} tensors in "
               "{}) in {:.2f}s; peak RSS {}\n",
               r.merged, model::expand_lora_targets(r.spec.target_modules).size(),
               fmt::join(model::expand_lora_targets(r.spec.target_modules), " "), o->adapter, r.spec.rank, r.spec.alpha,
               r.spec.scale(),
               fmt::format("{}{}", r.spec.use_rslora ? " (rsLoRA: alpha / sqrt(r))" : " (alpha / r)",
                           r.spec.use_dora ? ", DoRA: rows scaled to their magnitudes" : ""),
               o->out, r.tensors,
               dtype_name(r.dtype), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               format_bytes(std::max<int64_t>(0, memory::process_memory().rss_peak)));
    if (r.dequantized > 0)
      fmt::print("base: {} is a bitsandbytes 4-bit model: merged into the dequantized NF4 weights ({} weights read as "
                 "bitsandbytes dequantizes them); {} is a plain model, without quantization_config\n",
                 o->base, r.dequantized, o->out);
  });
}

}  // namespace shardlm::cli
