// `shardlm merge`: a base model + a PEFT LoRA adapter -> a merged Hugging Face model directory, and
// `--verify`: the merged model's logits against the base's with the adapter unmerged (infer/merge_check.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <fstream>

#include "cli/commands.h"
#include "memory/usage.h"
#include "core/error.h"
#include "io/model_files.h"
#include "data/tokenizer.h"
#include "infer/merge_check.h"
#include "model/peft_adapter.h"

namespace shardlm::cli {

namespace {

// The prompts `--verify` compares logits on when no --prompts file is given: prose, code, a list.
constexpr const char* kVerifyPrompts[] = {
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "Ingredients: 2 eggs, 1 cup of flour, 3 tablespoons of sugar,",
};

// The token ids of the prompts (each with BOS): the built-in ones, or a file's non-empty lines.
std::vector<std::vector<int32_t>> verify_prompts(const std::string& base, const std::string& file) {
  const ModelConfig cfg = load_model_config(base);
  const std::unique_ptr<data::Tokenizer> tok = data::load_model_tokenizer(base, cfg.vocab_size, true);
  std::vector<std::vector<int32_t>> out;
  if (file.empty()) {
    for (const char* p : kVerifyPrompts) out.push_back(tok->encode_with(p, true, false));
    return out;
  }
  std::ifstream f(file);
  if (!f) throw Error("cannot read the prompts file", {.file = file, .key = "--prompts"});
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (line.empty()) continue;
    out.push_back(tok->encode_with(line, true, false));
    if (int64_t(out.back().size()) > cfg.max_position_embeddings)
      throw Error(fmt::format("the prompt is {} tokens, above the model's max_position_embeddings {}",
                              out.back().size(), cfg.max_position_embeddings),
                  {.file = file, .line = n});
  }
  if (out.empty()) throw Error("no prompts (one a line)", {.file = file, .key = "--prompts"});
  return out;
}

}  // namespace

void register_merge(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("merge", "Merge a PEFT LoRA adapter into its base model (a new Hugging Face directory)");
  struct Opts {
    std::string base, adapter, out, merged, dtype, max_shard_size = "5GB", merge_into, prompts;
    bool verify = false;
    double tolerance = -1;  // unset: default_merge_tolerance
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--base", o->base, "The base model's Hugging Face directory")->required();
  cmd->add_option("--adapter", o->adapter, "A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors)")
      ->required();
  auto* out = cmd->add_option("--out", o->out, "Directory to write: created, or replaced whole when it holds only model files");
  auto* dtype = cmd->add_option("--dtype", o->dtype, "Stored dtype of the merged model: f32, bf16 or f16 (default: the base's)");
  auto* shard = cmd->add_option("--max-shard-size", o->max_shard_size, "Largest safetensors file, e.g. 5GB, 500MB, 2GiB")
      ->capture_default_str();
  cmd->add_option("--merge-into", o->merge_into,
                  "For QLoRA adapters, the base weights to merge into: dequantized (the NF4 weights the run trained "
                  "against; a dense base's decoder Linear weights are rounded through NF4) or dense (the dense base "
                  "itself). Default: the base as stored (a bitsandbytes 4-bit base dequantized, a dense one as it is)");
  cmd->add_flag("--verify", o->verify,
                "After merging, compare the logits of the merged model with those of the base and the adapter "
                "unmerged on a few prompts; exit 1 when the largest difference is above --tolerance");
  auto* merged = cmd->add_option("--merged", o->merged,
                                 "Verify this existing merged model directory instead of writing one (implies "
                                 "--verify)");
  merged->excludes(out)->excludes(dtype)->excludes(shard);
  cmd->add_option("--prompts", o->prompts, "A text file of prompts for --verify, one a line (default: 4 built-in ones)");
  cmd->add_option("--tolerance", o->tolerance,
                  "--verify's largest logit difference allowed, relative to the largest |logit| (default: 1e-4 for "
                  "a merged model stored in f32, 4e-3 in f16, 3e-2 in bf16)")
      ->check(CLI::NonNegativeNumber);
  cmd->footer(
      "Examples:\n"
      "  shardlm merge --base models/llama2-7b --adapter runs/alpaca-lora/adapter --out runs/alpaca-merged\n"
      "  shardlm merge --base runs/tiny --adapter runs/tiny-lora --out runs/tiny-merged --dtype f32 --verify\n"
      "  shardlm merge --base models/llama2-7b --adapter runs/lora/adapter --merged runs/lora/merged\n"
      "  shardlm merge --base models/llama2-7b --adapter runs/qlora/adapter --out runs/qlora-merged "
      "--merge-into dequantized --verify\n"
      "\n"
      "Every adapted weight becomes W + scale * B A (scale = lora_alpha / r, or lora_alpha / sqrt(r)\n"
      "with use_rslora), computed in f32 from the base's stored dtype, then stored in --dtype; for a\n"
      "DoRA adapter (use_dora) each row of it is then scaled to its magnitude m / ||row||. The\n"
      "other tensors are copied. Streams tensor by tensor (memory: one weight in f32 and the adapter).\n"
      "Writes config.json, generation_config.json, the base's tokenizer files and model.safetensors\n"
      "(or shards and an index) into a staging directory beside --out, then publishes it whole.\n"
      "--verify computes the logits of every position of the prompts twice, in f32: from the base with\n"
      "the adapter beside each weight (x W^T + scale (x A^T) B^T, as training computes it; the base as\n"
      "--merge-into says) and from the merged model, one whole model in f32 in memory at a time, and\n"
      "prints the largest difference. See docs/lora.md.");
  cmd->callback([o] {
    if (o->out.empty() && o->merged.empty()) throw Error("give --out DIR (to merge) or --merged DIR (to verify)");
    const MergeInto into = o->merge_into.empty() ? MergeInto::AsStored : merge_into_of(o->merge_into, "--merge-into");
    const bool verify = o->verify || !o->merged.empty();
    // Read before merging, so that a bad prompts file writes nothing.
    const std::vector<std::vector<int32_t>> prompts = verify ? verify_prompts(o->base, o->prompts)
                                                             : std::vector<std::vector<int32_t>>{};
    if (!o->out.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      MergeOptions opt;
      opt.base = o->base;
      opt.adapter = o->adapter;
      opt.out = o->out;
      opt.role = "--out";
      opt.merge_into = into;
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
      if (r.rounded > 0)
        fmt::print("base: {}'s {} decoder Linear weights rounded through NF4 (blocksize 64, double quantization) before "
                   "merging, as a QLoRA run trains against them (--merge-into dequantized)\n",
                   o->base, r.rounded);
    }
    if (!verify) return;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string dir = o->merged.empty() ? o->out : o->merged;
    const infer::MergeCheck c =
        infer::check_merge({.base = o->base, .adapter = o->adapter, .merged = dir, .merge_into = into, .prompts = prompts});
    const bool default_tolerance = o->tolerance < 0;
    const double tolerance = default_tolerance ? infer::default_merge_tolerance(c.merged_dtype) : o->tolerance;
    const std::string what = fmt::format(
        "largest |logit difference| {:.3g} at prompt {} position {} token {}, {:.3g} of the largest |logit| {:.3g}; "
        "--tolerance {:.3g}{}",
        c.max_abs_diff, c.at_prompt + 1, c.at_position, c.at_token, c.relative(), c.max_abs_logit, tolerance,
        !default_tolerance ? "" : fmt::format(" (the default for {} weights)", dtype_name(c.merged_dtype)));
    if (!(c.relative() <= tolerance))
      throw Error(fmt::format("not the base with the adapter {} unmerged ({}): {} prompts, {} positions: {}", o->adapter,
                              c.reference, c.prompts, c.positions, what),
                  {.file = dir});
    fmt::print("verify: {} computes what {} with the adapter {} unmerged computes: {} prompts, {} positions: {} "
               "(in {:.2f}s)\n",
               dir, c.reference, o->adapter, c.prompts, c.positions, what,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
}

}  // namespace shardlm::cli
