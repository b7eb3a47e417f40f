// `shardlm export --format gguf`: a Hugging Face model directory -> one GGUF file for llama.cpp
// (model/gguf_export.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>

#include "cli/commands.h"
#include "core/error.h"
#include "memory/usage.h"
#include "model/gguf_export.h"

namespace shardlm::cli {

void register_export(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("export", "Export a Hugging Face model directory to another format (GGUF, for llama.cpp)");
  struct Opts {
    std::string format, outtype = "f16", model, out, name;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--format", o->format, "Output format: gguf (llama.cpp's)")->required();
  cmd->add_option("--outtype", o->outtype,
                  "Type of the weight matrices: f32, f16, bf16 or q8_0 (norms, biases and rope_freqs stay f32)")
      ->capture_default_str();
  cmd->add_option("--name", o->name, "general.name in the file (default: the model directory's name)");
  cmd->add_option("model", o->model, "A Hugging Face model directory (config.json, *.safetensors, tokenizer files)")
      ->required();
  cmd->add_option("out", o->out, "The .gguf file to write (replaced atomically; never one of the model's files)")->required();
  cmd->footer(
      "Examples:\n"
      "  shardlm export --format gguf --outtype q8_0 runs/alpaca-hf alpaca-q8_0.gguf\n"
      "  shardlm export --format gguf --outtype bf16 models/llama3.2-1b llama3.2-1b-bf16.gguf\n"
      "  shardlm merge --base models/llama2-7b --adapter runs/lora/adapter --out runs/lora-merged\n"
      "  shardlm export --format gguf --outtype f16 runs/lora-merged lora-merged-f16.gguf\n"
      "\n"
      "Llama 2/3 and Mistral become GGUF architecture llama, Qwen2 qwen2, with llama.cpp's tensor names\n"
      "and metadata; llama's q and k rows are permuted to the pairs llama.cpp's RoPE rotates, and Llama 3.1+\n"
      "rope scaling becomes the rope_freqs tensor. The tokenizer is embedded: byte-level BPE\n"
      "(tokenizer.json, Llama 3's tiktoken tokenizer.model, vocab.json + merges.txt) as gpt2, SentencePiece\n"
      "as llama, with the chat template. q8_0 stores blocks of 32 values as an f16 scale and 32 int8; a\n"
      "weight whose rows are not a multiple of 32 is stored f16 instead. A LoRA fine-tune is exported by\n"
      "merging it into its base first (shardlm merge), then exporting the merged directory. A training\n"
      "checkpoint is first converted (shardlm convert). Streams tensor by tensor. See docs/export.md.");
  cmd->callback([o] {
    if (o->format != "gguf") throw Error(fmt::format("'{}': the only export format is gguf", o->format), {.key = "--format"});
    const auto t0 = std::chrono::steady_clock::now();
    const GgufExportOptions opt{.model = o->model, .out = o->out, .outtype = gguf_outtype_of(o->outtype, "--outtype"),
                                .name = o->name};
    const GgufExportReport r = export_gguf(opt);
    std::vector<std::string> types;
    for (const auto& [type, n] : r.tensors_by_type) types.push_back(fmt::format("{} {}", n, type));
    fmt::print("exported {} ({}, {:.2f}M parameters) -> {}: GGUF {}, {} tensors ({}){}, {}; tokenizer {}; {:.1f} MiB "
               "in {:.2f}s; peak RSS {}\n",
               o->model, r.architecture, double(r.parameters) / 1e6, o->out, gguf_outtype_name(opt.outtype), r.tensors,
               fmt::join(types, ", "), r.rope_freqs ? " with rope_freqs (Llama 3 rope scaling)" : "",
               r.architecture == "llama" ? "q/k rows permuted for llama.cpp's RoPE" : "q/k as stored (NEOX RoPE)",
               r.tokenizer, double(r.file_bytes) / (1 << 20),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               format_bytes(std::max<int64_t>(0, memory::process_memory().rss_peak)));
    if (!r.f16_fallback.empty())
      fmt::print("note: {} weights have rows not a multiple of 32, which Q8_0 cannot store: written F16 ({})\n",
                 r.f16_fallback.size(), fmt::join(r.f16_fallback, " "));
    for (const std::string& n : r.notes) fmt::print("note: {}\n", n);
  });
}

}  // namespace shardlm::cli
