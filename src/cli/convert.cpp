// `shardlm convert`: a sharded training checkpoint -> a Hugging Face model directory, streamed.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "memory/usage.h"
#include "core/error.h"
#include "io/model_files.h"

namespace shardlm::cli {

void register_convert(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("convert", "Turn a sharded training checkpoint into a Hugging Face model directory");
  struct Opts {
    std::string checkpoint, out, dtype = "bf16", max_shard_size = "5GB";
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("checkpoint", o->checkpoint,
                  "A checkpoint directory (step_NNNNNNNN), or a directory of them (the newest complete one is used)")
      ->required();
  cmd->add_option("--out", o->out, "Directory to write: created, or replaced whole when it holds only model files")
      ->required();
  cmd->add_option("--dtype", o->dtype, "Stored dtype: bf16, f32 or f16")->capture_default_str();
  cmd->add_option("--max-shard-size", o->max_shard_size, "Largest safetensors file, e.g. 5GB, 500MB, 2GiB")
      ->capture_default_str();
  cmd->footer(
      "Examples:\n"
      "  shardlm convert runs/alpaca/checkpoints --out runs/alpaca-hf\n"
      "  shardlm convert runs/alpaca/checkpoints/step_00000200 --out runs/alpaca-200 --dtype f32 --max-shard-size 2GB\n"
      "\n"
      "Reads the master weights (f32) tensor by tensor in small chunks, so memory stays near a few\n"
      "tens of MiB whatever the model size; writes config.json, generation_config.json, the\n"
      "tokenizer files and model.safetensors (or shards and an index) into a staging directory\n"
      "beside --out, then publishes it whole: a crash leaves the old --out or the new one, never a mix.");
  cmd->callback([o] {
    const auto t0 = std::chrono::steady_clock::now();
    ckpt::ConvertOptions opt;
    opt.out = o->out;
    opt.role = "--out";
    opt.dtype = dtype_flag("--dtype", o->dtype, {DType::F32, DType::BF16, DType::F16});
    opt.max_shard_bytes = io::parse_size(o->max_shard_size);
    std::string dir = o->checkpoint;
    if (!std::filesystem::exists(std::filesystem::path(dir) / ckpt::kMetadataName)) {
      const std::optional<std::string> found = ckpt::latest_complete(
          dir, [](const std::string& w) { fmt::print(stderr, "warning: {}\n", w); });
      if (!found) throw Error("neither a checkpoint nor a directory holding a complete one", {.file = dir});
      dir = *found;
    }
    io::refuse_output_over_input(opt.out, "--out", dir, "checkpoint");
    ckpt::CheckpointReader reader(dir);
    ckpt::convert_checkpoint(reader, opt);
    int64_t params = 0;
    for (const ckpt::StoredTensor& t : reader.tensors()) params += t.numel();
    fmt::print("converted {} (step {}, {} tensors, {:.2f}M parameters) -> {} in {} in {:.2f}s; peak RSS {}\n", dir,
               reader.step(), reader.tensors().size(), double(params) / 1e6, o->out, dtype_name(opt.dtype),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               format_bytes(std::max<int64_t>(0, memory::process_memory().rss_peak)));
  });
}

}  // namespace shardlm::cli
