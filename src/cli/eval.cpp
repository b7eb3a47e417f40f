// `shardlm eval`: the loss and perplexity of a model (and, optionally, a PEFT LoRA adapter) on a
// data set, on one process or many. It sets a run up as `shardlm train` does (run_setup.h: the
// model, tokenizer and data; the strategy; the engine) and calls the trainer's own held-out loss
// (train::eval_loss), so its loss is the trainer's eval_loss on the same rows; docs/training.md.
#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "io/atomic_file.h"
#include "io/staged_dir.h"
#include "io/model_files.h"
#include "model/llama.h"
#include "model/peft_adapter.h"
#include "shard/engine.h"
#include "shard/load.h"
#include "train/evaluation.h"
#include "train/run_setup.h"
#include "train/train_config.h"

namespace shardlm::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Opts {
  std::string model, data, config, adapter, data_type, output;
  int64_t seq_len = 0, micro_batch_size = 0, max_rows = -1;
  std::vector<std::string> overrides;
  bool quiet = false;
};

// The run as a training config: --config's file (its data section and settings), or the flags
// alone on the training defaults, then key=value overrides and the flags that replace keys.
train::TrainConfig eval_config(const Opts& o) {
  std::vector<std::string> overrides = o.overrides;
  if (!o.data_type.empty()) overrides.push_back("data.type=" + o.data_type);
  if (o.seq_len > 0) overrides.push_back(fmt::format("seq_len={}", o.seq_len));
  if (o.micro_batch_size > 0) overrides.push_back(fmt::format("micro_batch_size={}", o.micro_batch_size));
  ConfigTree tree = [&] {
    if (!o.config.empty()) return ConfigTree::load(o.config);
    // A JSON string is a YAML scalar, whatever characters a path holds. output_dir is required of
    // a training config, and eval writes none: read_inputs does not look at it.
    return ConfigTree::parse(fmt::format("model: {}\noutput_dir: {}\ndata:\n  train: {}\n", json(o.model).dump(),
                                         json(o.model).dump(), json(o.data).dump()),
                             "command line");
  }();
  tree.apply_overrides(overrides);
  train::TrainConfig c = train::read_train_config(tree);
  if (!o.model.empty()) c.model = o.model;
  if (!o.data.empty()) {
    c.data.train = o.data;
    c.data.eval.clear();
    c.data.evaluate_whole_file = true;
  }
  // The model evaluated is --model with --adapter: a config's own lora section describes adapters
  // it would train, not ones to read. lora.quantize_base (QLoRA) still says how the base is held.
  c.lora.reset();
  if (!o.adapter.empty()) {
    c.lora = read_peft_config(o.adapter);
    c.lora->dropout = 0;  // dropout is training's alone; eval batches draw no masks either way
  }
  return c;
}

// The JSON written by --output must not replace a file the evaluation reads, nor go into a
// directory it reads (io::refuse_output_over_input compares resolved paths, files too).
void check_output(const Opts& o, const train::TrainConfig& c) {
  if (o.output.empty()) return;
  io::refuse_output_over_input(o.output, "--output", c.data.train, "data file");
  io::refuse_output_over_input(o.output, "--output", c.data.eval, "held-out data file");
  io::refuse_output_over_input(o.output, "--output", o.config, "config file");
  const fs::path out(o.output);
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  // Found now, not after the evaluation has run.
  if (!fs::is_directory(parent, ec))
    throw Error(fmt::format("--output {}: the directory {} does not exist", o.output, parent.string()),
                {.key = "--output"});
  io::refuse_output_over_input(parent.string(), "--output's directory", c.model, "model directory");
  io::refuse_output_over_input(parent.string(), "--output's directory", o.adapter, "adapter directory");
}

void run_eval(const Opts& o) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  comm::Communicator& w = world();
  const bool lead = w.rank() == 0;
  if (o.config.empty() && o.model.empty()) throw Error("give --model DIR (or --config FILE naming a model)");
  if (o.config.empty() && o.data.empty()) throw Error("give --data FILE (or --config FILE with a data section)");
  const train::TrainConfig c = train::with_batch_size(eval_config(o), w.size());
  check_output(o, c);
  comm::set_collective_timeout(c.collective_timeout);
  const train::RunInputs in = train::read_inputs(c);
  // Read whole before any engine exists: an adapter for another model is refused naming its file
  // and tensor. Adapters are small next to the model.
  std::optional<PeftAdapter> adapter;
  if (!o.adapter.empty()) adapter = read_peft_adapter(o.adapter, in.model);
  const int node_ranks = comm::ranks_per_node_from_environment() > 0 ? comm::ranks_per_node_from_environment()
                                                                       : w.size();
  const train::MemoryPlan mem = train::plan_memory(c, in, w.size(), node_ranks, false);
  shard::Mesh mesh = shard::make_mesh(w, mem.sharding, node_ranks, c.device);
  shard::ShardedModel engine(in.model, in.finetune, mem.sharding, mesh, shard::EngineUse::Evaluate);
  model::LlamaCompute m(in.model, c.compute_dtype(), engine.device(), in.finetune.lora);
  shard::AdapterLookup lookup;
  if (adapter) lookup = [&](const std::string& name) { return adapter->tensors.at(name).t; };
  shard::load_weights(engine, io::ModelWeights(c.model), c.model, c.seed, lookup);
  m.reserve(in.B, in.T);
  if (lead && !o.quiet) {
    for (const std::string& line : in.data.report) fmt::print(stderr, "data: {}\n", line);
    if (adapter)
      fmt::print(stderr, "adapter: {} ({} weights, rank {}, scale {:g}), unmerged, as training evaluates it\n",
                 o.adapter, adapter->targets.size(), adapter->spec.rank, adapter->spec.scale());
  }
  const train::EvalResult r = train::eval_loss(engine, m, in, o.max_rows, w);
  if (r.tokens == 0) throw Error("no target token to evaluate: every row is masked out", {.file = c.data.train});
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!lead) return;
  const double ppl = std::exp(r.loss);
  fmt::print("eval: loss {:.6f}, perplexity {:.4f}, {} tokens in {} rows of seq_len {} on {} rank{} ({:.1f}s)\n", r.loss,
             ppl, r.tokens, r.rows, in.T, w.size(), w.size() == 1 ? "" : "s", seconds);
  std::fflush(stdout);
  if (o.output.empty()) return;
  json j = {{"loss", r.loss}, {"perplexity", ppl}, {"tokens", r.tokens}, {"rows", r.rows},
            {"model", c.model}, {"adapter", o.adapter.empty() ? json(nullptr) : json(o.adapter)},
            {"data", c.data.evaluate_whole_file || c.data.eval.empty() ? c.data.train : c.data.eval},
            {"split", c.data.evaluate_whole_file && in.data.type != "builtin:addition" ? "whole file" : "held out"},
            {"data_type", in.data.type}, {"packing", in.data.packing}, {"seq_len", in.T},
            {"micro_batch_size", in.B}, {"max_rows", o.max_rows < 0 ? json(nullptr) : json(o.max_rows)},
            {"world_size", w.size()}, {"compute_dtype", dtype_name(c.compute_dtype())}, {"seconds", seconds}};
  io::write_text_atomic(o.output, j.dump(2) + "\n");
}

}  // namespace

// CLI11's PositiveNumber says "not in range 0 to 1.8e308" of a 0; say what is wanted.
const CLI::Validator kPositive(
    [](const std::string& v) {
      int64_t n = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      return ec == std::errc() && end == v.data() + v.size() && n > 0 ? std::string()
                                                                       : "expected a positive integer, got '" + v + "'";
    },
    "N > 0");

void register_eval(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("eval", "Loss and perplexity of a model (and LoRA adapter) on a data set");
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Hugging Face model directory (default: --config's model)");
  cmd->add_option("--data", o->data,
                  "Data file, every row of it evaluated: text, token file, Alpaca or chat JSON/JSONL, or "
                  "builtin:addition (type by extension and content, as data.type: auto; see docs/data.md)");
  cmd->add_option("--config", o->config,
                  "A training configuration (YAML): its model, data section and settings; without --data, "
                  "the run's held-out data (data.eval or the eval_fraction split), as the trainer evaluates it");
  cmd->add_option("--adapter", o->adapter, "A PEFT LoRA adapter directory for --model, applied unmerged as in training");
  cmd->add_option("--data-type", o->data_type, "data.type: auto, text, tokens, alpaca, chat or builtin:addition");
  cmd->add_option("--seq-len", o->seq_len, "Row length in tokens (default: the config's seq_len, else 256)")
      ->check(kPositive);
  cmd->add_option("--micro-batch-size", o->micro_batch_size,
                  "Rows per forward per rank (default: the config's micro_batch_size, else 8)")
      ->check(kPositive);
  cmd->add_option("--max-rows", o->max_rows, "Evaluate only the first N rows (default: all)")
      ->check(kPositive);
  cmd->add_option("--output", o->output, "Also write the result as JSON to this file (replaced atomically)");
  cmd->add_flag("--quiet", o->quiet, "Leave out the data and adapter lines on stderr");
  cmd->add_option("overrides", o->overrides,
                  "key=value training-config settings (as for train), e.g. data.packing=true "
                  "data.token_bytes=4 compute_dtype=bf16 sharding_strategy=NO_SHARD");
  cmd->footer(
      "Prints one line (loss, perplexity, target tokens, rows); rank 0 writes --output:\n"
      "  {\"loss\", \"perplexity\", \"tokens\", \"rows\", \"model\", \"adapter\", \"data\", \"split\", \"data_type\",\n"
      "   \"packing\", \"seq_len\", \"micro_batch_size\", \"max_rows\", \"world_size\", \"compute_dtype\", \"seconds\"}\n"
      "The loss is the mean cross-entropy over every target token in the loss (the trainer's held-out loss;\n"
      "prompt tokens of Alpaca/chat data are masked unless data.train_on_input), perplexity exp(loss). Rows are\n"
      "formed as training forms them (text: windows of seq_len + 1 tokens every seq_len tokens) and are the same\n"
      "on any number of ranks. The trainer evaluates eval_batches x micro_batch_size x ranks rows; --max-rows\n"
      "with that number gives its eval_loss.\n"
      "Examples:\n"
      "  shardlm eval --model runs/tiny --data valid.txt --seq-len 128\n"
      "  shardlm eval --config run.yaml --model runs/x --output eval.json   the run's held-out data\n"
      "  shardlm eval --model models/llama2-7b --adapter runs/x/adapter --data alpaca.json --seq-len 512\n"
      "  shardlm launch --nproc-per-node 2 -- eval --model runs/tiny --data valid.txt\n"
      "  mpirun -np 2 shardlm eval --model runs/tiny --data valid.bin --data-type tokens data.token_bytes=4");
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace shardlm::cli
