// `shardlm estimate-memory`: per-rank memory of a training run from a model config alone.
#include <fmt/format.h>

#include <filesystem>

#include "cli/commands.h"
#include "cli/estimate_options.h"
#include "core/device.h"
#include "core/error.h"
#include "io/model_files.h"
#include "memory/estimator.h"
#include "memory/levers.h"
#include "model/config.h"
#include "model/lora.h"

namespace shardlm::cli {

namespace {

// A lever (memory/levers.h) as this command's flags say it.
std::string lever_flag(const memory::LeverStep& s) {
  using memory::Lever;
  switch (s.lever) {
    case Lever::StateBf16: return "--optimizer-state-dtype bf16";
    case Lever::State8bit: return "--optimizer-state-dtype 8bit";
    case Lever::ComputeBf16: return "--param-dtype bf16";
    case Lever::FullShard: return "--sharding-strategy FULL_SHARD";
    case Lever::ActivationCheckpointing: return "--activation-checkpointing true";
    case Lever::OffloadActivations: return "--offload-activations";
    case Lever::SmallerMicroBatch:
      return fmt::format("--micro-batch-size {} --gradient-accumulation-steps {}", s.input.micro_batch_size,
                         s.input.grad_accum);
    case Lever::Offload: return "--offload (GPU runs)";
  }
  return "?";
}

// The table of one estimate, per rank, by category.
// budget: bytes per rank to fit (0: none), from `budget_source` (the flag, or this machine's GPU).
void print_estimate(const memory::EstimateInput& in, const memory::Estimate& e, int64_t budget,
                    const std::string& budget_source) {
  const bool host = in.offload || in.offload_activations;
  fmt::print("\nper rank:\n");
  fmt::print("  {:<44} {:>12} {:>12}  {}\n", "what", "at peak", "own peak", host ? "where" : "tracker category");
  for (int i = 0; i < memory::kNumTerms; ++i) {
    const memory::Term t = memory::Term(i);
    const bool on_host = t == memory::Term::OffloadedActivations ||
                         (in.offload && (t == memory::Term::ParamsAtRest || t == memory::Term::GradShard ||
                                         t == memory::Term::Optimizer));
    const char* name = t == memory::Term::ParamsAtRest && in.finetune.lora ? "parameters at rest (f32 LoRA master)"
                                                                         : memory::term_name(t);
    fmt::print("  {:<44} {:>12} {:>12}  {}\n", name, format_bytes(e.at_peak[size_t(i)]),
               format_bytes(e.peak[size_t(i)]), host ? (on_host ? "host" : "device") : mem_category_name(memory::term_category(t)));
  }
  fmt::print("  {:<44} {:>12}\n", "total (peak of the sum)", format_bytes(e.peak_total));
  if (host)
    fmt::print("  {:<44} {:>12}\n  {:<44} {:>12}\n", "  of which host memory", format_bytes(e.host_bytes),
               "  of which device memory", format_bytes(e.device_bytes));
  if (budget > 0) {
    const double used = double(e.device_bytes) / double(budget);
    fmt::print("  {:<44} {:>12}  {}\n", fmt::format("budget ({})", budget_source), format_bytes(budget),
               e.device_bytes <= budget ? fmt::format("fits ({:.0f}% used)", 100 * used)
                                        : fmt::format("does NOT fit ({:.0f}%)", 100 * used));
    if (e.device_bytes > budget) {
      const std::vector<memory::LeverStep> levers = memory::levers_to_fit(in, budget, true);
      fmt::print("\nto fit {}, try, in order of cost to speed (each with the peak per rank it gives):\n  {}\n",
                 format_bytes(budget), memory::describe_levers(levers, budget, lever_flag));
      if (levers.empty() || levers.back().device_bytes > budget)
        fmt::print("  beyond that: more ranks (--world-size), a shorter --seq-len, or LoRA/QLoRA (--lora-rank, --qlora)\n");
    }
  }
  fmt::print("\ncommunication: {} per rank per step ({} of it between nodes), ring accounting\n",
             format_bytes(int64_t(e.comm_bytes_per_step)), format_bytes(int64_t(e.inter_node_bytes_per_step)));
  fmt::print("final save: one unit at a time, never the whole model: a run without checkpoints gathers each unit\n"
             "  in f32 for rank 0 to stream out, up to {} (the largest unit); with save_every /\n"
             "  save_every_minutes rank 0 streams it from the last checkpoint (~24 MiB)\n",
             format_bytes(e.save_gather_bytes));
  fmt::print("not counted: what the tracker cannot see (allocator slack, BLAS/MPI/OpenMP buffers, per-thread\n"
             "attention scratch, the data pipeline, the program itself): compare RSS in a training run's summary\n");
  for (const std::string& n : e.notes) fmt::print("note: {}\n", n);
}

void print_accelerate(const ModelConfig& cfg, const model::FinetuneSpec& ft) {
  fmt::print("\naccelerate estimate-memory's table, computed for this engine (model states only, one process):\n");
  fmt::print("  {:<17}| {:>13} | {:>11} | {:>26} | {:>15}\n", "dtype", "Largest Layer", "Total Size",
             "Training using Adam", "accelerate says");
  for (const memory::AccelerateRow& r : memory::accelerate_table(cfg, ft)) {
    const std::string adam = r.adam_training < 0
                                 ? std::string("n/a (see --qlora)")
                                 : fmt::format("{} ({} B/param)", format_bytes(r.adam_training),
                                               r.adam_training / std::max<int64_t>(1, parameter_count(cfg, ft)));
    fmt::print("  {:<17}| {:>13} | {:>11} | {:>26} | {:>15}\n", r.dtype, format_bytes(r.largest_layer),
               format_bytes(r.total_size), adam, format_bytes(r.accelerate_says));
  }
  fmt::print(
      "  accelerate multiplies each dtype's size by 4 (weights, gradients, 2 Adam moments in that dtype). Mixed\n"
      "  precision keeps f32 master weights, f32 gradients and f32 moments (16 B/param) plus the bf16 copy it\n"
      "  computes with (2 B/param): 18 B/param, not 8. Quantized weights cannot be trained with Adam at all.\n"
      "  None of it counts activations, logits or communication buffers, or divides anything by sharding:\n"
      "  the per-rank table above does.\n");
}

void run(const EstimateOptions& o, bool sweep) {
  memory::EstimateInput in = estimate_input(o);
  std::string budget_source;
  const int64_t budget = device_budget(o, &budget_source);

  const ModelConfig& m = in.model;
  // Printed once the inputs are known to be possible, so a refused mesh is one line, not a header
  // and then an error.
  auto print_header = [&] {
    const double params = double(parameter_count(m, in.finetune));
    fmt::print("shardlm estimate-memory: {} ({} parameters, {} layers, hidden {}, vocab {})\n", o.model,
               params >= 1e9 ? fmt::format("{:.2f}B", params / 1e9) : fmt::format("{:.2f}M", params / 1e6),
               m.num_hidden_layers, m.hidden_size, m.vocab_size);
  };
  const std::string ckpt = (in.checkpoint_every == 0   ? std::string("no activation checkpointing")
                            : in.checkpoint_every == 1 ? std::string("activation checkpointing on every layer")
                                                       : fmt::format("activation checkpointing every {} layers",
                                                                     in.checkpoint_every)) +
                           (in.offload_activations ? ", their inputs offloaded to host" : "");
  if (sweep) {
    const std::vector<shard::Strategy> all = {shard::Strategy::NoShard, shard::Strategy::Zero1,
                                              shard::Strategy::ShardGradOp, shard::Strategy::FullShard,
                                              shard::Strategy::HybridShard, shard::Strategy::HybridShardZero2};
    print_header();
    fmt::print("peak per rank (tracked), param {}, micro-batch {} x {} tokens, {}{}\n", dtype_name(in.sharding.param_dtype),
               in.micro_batch_size, in.seq_len, ckpt,
               budget > 0 ? fmt::format("; * = fits {}", format_bytes(budget)) : "");
    fmt::print("  {:>5}", "world");
    for (shard::Strategy s : all) fmt::print(" {:>20}", shard::strategy_name(s));
    fmt::print("\n");
    for (int w = 1; w <= o.world; ++w) {
      fmt::print("  {:>5}", w);
      for (shard::Strategy s : all) {
        memory::EstimateInput x = in;
        x.world_size = w;
        x.ranks_per_node = o.nproc > 0 ? std::min(o.nproc, w) : 0;
        x.sharding.strategy = s;
        std::string cell = "-";  // a hybrid mesh this world cannot form
        try {
          const memory::Estimate e = memory::estimate(x);
          cell = format_bytes(e.device_bytes) + (budget > 0 ? (e.device_bytes <= budget ? " *" : "  ") : "");
        } catch (const Error&) {
        }
        fmt::print(" {:>20}", cell);
      }
      fmt::print("\n");
    }
    fmt::print("(hybrid strategies shard within a node of --nproc-per-node ranks{})\n",
               o.nproc > 0 ? "" : "; without it the node is the whole world, as FULL_SHARD / SHARD_GRAD_OP");
    if (budget > 0) {
      std::string why;
      try {
        memory::choose_strategy(in, budget, &why, [&](const memory::EstimateInput& smallest) {
          return "try, in order of cost to speed: " +
                 memory::describe_levers(memory::levers_to_fit(smallest, budget, true), budget, lever_flag);
        });
        fmt::print("at world size {}: {}\n", o.world, why);
      } catch (const Error& e) {
        fmt::print("at world size {}: {}\n", o.world, e.message());
      }
    }
    return;
  }
  memory::Estimate e;
  try {
    e = memory::estimate(in);
  } catch (const Error& err) {  // the mesh: name the flags, not the training config's key
    throw Error(fmt::format("{} (--world-size {}, --nproc-per-node / --shard-group-size)", err.message(), in.world_size));
  }
  print_header();
  fmt::print("{} on {} rank{} (shard groups of {}, {} units), param {}, reduce {}{}; micro-batch {} x {} tokens, {} "
             "accumulation step{}, {}\n",
             shard::strategy_name(in.sharding.strategy), in.world_size, in.world_size > 1 ? "s" : "", e.shard_group,
             e.num_units, dtype_name(in.sharding.param_dtype), dtype_name(in.sharding.reduce_dtype),
             in.sharding.state_dtype == DType::F32 ? ""
             : in.sharding.state_dtype == DType::U8 ? ", AdamW moments 8-bit blockwise"
                                                    : fmt::format(", AdamW moments {}", dtype_name(in.sharding.state_dtype)),
             in.micro_batch_size, in.seq_len, in.grad_accum, in.grad_accum > 1 ? "s" : "", ckpt);
  print_estimate(in, e, budget, budget_source);
  print_accelerate(m, in.finetune);
}

}  // namespace

void register_estimate_memory(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("estimate-memory",
                                     "Per-rank memory of a training run, by category, from a model config alone");
  auto o = std::make_shared<EstimateOptions>();
  auto sweep = std::make_shared<bool>(false);
  add_estimate_options(cmd, *o);
  cmd->add_flag("--sweep", *sweep, "Every strategy at world sizes 1..--world-size, marking what fits --device-memory");
  cmd->footer(
      "The estimate replays what the engine allocates (docs/memory.md): for its tracked buffers it is the\n"
      "byte count a run reports. Defaults are `shardlm train`'s (micro_batch_size 8, seq_len 256, f32).\n"
      "Examples:\n"
      "  shardlm estimate-memory --model llama2-7b --world-size 8 --param-dtype bf16 --micro-batch-size 1 --seq-len 4096\n"
      "  shardlm estimate-memory --model runs/tiny --sharding-strategy NO_SHARD\n"
      "  shardlm estimate-memory --model llama3-8b --sweep --world-size 8 --device-memory 80GB --param-dtype bf16\n"
      "  shardlm estimate-memory --model llama2-70b --lora-rank 16 --target-modules all-linear --qlora --world-size 2 --param-dtype bf16");
  cmd->callback([o, sweep] { run(*o, *sweep); });
}

}  // namespace shardlm::cli
