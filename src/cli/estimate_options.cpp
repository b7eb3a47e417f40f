#include "cli/estimate_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "cli/commands.h"
#include "core/device.h"
#include "core/error.h"
#include "io/model_files.h"
#include "model/config.h"
#include "model/lora.h"

namespace shardlm::cli {

ModelConfig resolve_model(const std::string& m) {
  if (std::filesystem::exists(m)) return load_model_config(m);
  const std::vector<std::string> names = preset_names();
  if (std::find(names.begin(), names.end(), m) != names.end()) return preset(m);
  throw Error(fmt::format("--model {}: no such directory or config.json, and not a preset ({})", m,
                          fmt::join(names, ", ")));
}

namespace {

// An Error from a parser, with the flag it came from in front.
template <class Parse>
auto for_flag(const char* flag, const std::string& value, Parse parse) {
  try {
    return parse(value);
  } catch (const Error& e) {
    throw Error(fmt::format("{} {}: {}", flag, value, e.message()));
  }
}

int parse_checkpointing(const std::string& v) {
  if (v == "true" || v == "True" || v == "1") return 1;
  if (v == "false" || v == "False" || v == "0") return 0;
  try {
    size_t used = 0;
    const int k = std::stoi(v, &used);
    if (used == v.size() && k >= 0) return k;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("--activation-checkpointing {}: expected true, false or a layer interval k >= 1", v));
}

}  // namespace

memory::EstimateInput estimate_input(const EstimateOptions& o) {
  memory::EstimateInput in;
  in.model = resolve_model(o.model);
  in.sharding.strategy = for_flag("--sharding-strategy", o.strategy, shard::parse_strategy);
  in.sharding.param_dtype = dtype_flag("--param-dtype", o.param_dtype, {DType::F32, DType::BF16});
  in.sharding.reduce_dtype = dtype_flag("--reduce-dtype", o.reduce_dtype, {DType::F32, DType::BF16});
  in.sharding.state_dtype = o.state_dtype == "8bit" ? DType::U8
                            : dtype_flag("--optimizer-state-dtype", o.state_dtype, {DType::F32, DType::BF16});
  in.sharding.wrap = for_flag("--auto-wrap-policy", o.wrap, shard::parse_wrap_policy);
  in.sharding.min_num_params = o.min_num_params;
  in.sharding.forward_prefetch = o.forward_prefetch;
  in.sharding.backward_prefetch = for_flag("--backward-prefetch", o.backward_prefetch, shard::parse_backward_prefetch);
  in.sharding.shard_group_size = o.shard_group;
  in.sharding.reduce_every_microbatch = !o.no_sync;
  if (o.world < 1) throw Error(fmt::format("--world-size {}: must be >= 1", o.world));
  if (o.nproc < 0) throw Error(fmt::format("--nproc-per-node {}: must be >= 1", o.nproc));
  if (o.nproc > 0 && o.world % o.nproc != 0)
    throw Error(fmt::format("--nproc-per-node {} does not divide --world-size {}", o.nproc, o.world));
  in.world_size = o.world;
  in.ranks_per_node = o.nproc;
  if (o.micro_batch < 1 || o.seq_len < 1 || o.accum < 1)
    throw Error("--micro-batch-size, --seq-len and --gradient-accumulation-steps must be >= 1");
  in.micro_batch_size = o.micro_batch;
  in.seq_len = o.seq_len;
  in.grad_accum = o.accum;
  in.checkpoint_every = parse_checkpointing(o.ckpt);
  in.offload = o.offload;
  in.offload_activations = o.offload_activations;
  if (in.offload_activations && in.checkpoint_every == 0)
    throw Error("--offload-activations moves the checkpointed layers' inputs: set --activation-checkpointing");
  if (o.lora_rank < 0) throw Error(fmt::format("--lora-rank {}: must be >= 1", o.lora_rank));
  if (o.qlora && o.lora_rank == 0) throw Error("--qlora needs --lora-rank R (e.g. 16)");
  if (o.dora && o.lora_rank == 0) throw Error("--dora needs --lora-rank R (e.g. 16)");
  if (o.lora_rank > 0) {
    model::LoraSpec spec{.rank = o.lora_rank, .target_modules = o.target_modules, .use_dora = o.dora};
    try {
      model::expand_lora_targets(spec.target_modules);
    } catch (const Error& e) {
      throw Error(fmt::format("--target-modules: {}", e.message()));
    }
    in.finetune.lora = spec;
  }
  in.finetune.nf4_base = o.qlora;
  return in;
}

int64_t device_budget(const EstimateOptions& o, std::string* source) {
  int64_t budget = 0;
  *source = "--device-memory";
  if (!o.device_memory.empty()) {
    try {
      budget = int64_t(io::parse_size(o.device_memory));
    } catch (const Error& e) {
      throw Error(fmt::format("--device-memory: {}", e.message()));
    }
  } else {
    budget = device::cuda_device_memory();  // this machine's GPU, where it has one
    if (budget > 0) *source = "this machine's GPU";
  }

  return budget;
}

void add_estimate_options(CLI::App* cmd, EstimateOptions& o) {
  cmd->add_option("--model", o.model, "Model directory, config.json or preset (" + fmt::format("{}", fmt::join(preset_names(), ", ")) + ")")
      ->required();
  cmd->add_option("--sharding-strategy", o.strategy,
                  "NO_SHARD, ZERO1, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 (or accelerate's 1-5)")
      ->capture_default_str();
  cmd->add_option("--world-size", o.world, "Ranks in all (--sweep, estimate-time: the largest world tried)")->capture_default_str();
  cmd->add_option("--nproc-per-node", o.nproc, "Ranks per node: hybrid strategies shard within a node (default: one node)");
  cmd->add_option("--shard-group-size", o.shard_group, "Hybrid: ranks per shard group (default: the node)");
  cmd->add_option("--param-dtype", o.param_dtype, "Gathered parameters and compute: f32 or bf16")->capture_default_str();
  cmd->add_option("--reduce-dtype", o.reduce_dtype, "Gradient communication: f32 or bf16")->capture_default_str();
  cmd->add_option("--optimizer-state-dtype", o.state_dtype,
                  "AdamW's moments at rest: f32, bf16, or 8bit (optim: adamw_8bit)")->capture_default_str();
  cmd->add_option("--micro-batch-size", o.micro_batch, "Sequences per rank per micro-batch")->capture_default_str();
  cmd->add_option("--seq-len", o.seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--gradient-accumulation-steps", o.accum, "Micro-batches per step (matters with --no-sync)")
      ->capture_default_str();
  cmd->add_option("--activation-checkpointing", o.ckpt, "true, false, or k: every k-th layer recomputes")
      ->capture_default_str();
  cmd->add_option("--auto-wrap-policy", o.wrap, "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP")->capture_default_str();
  cmd->add_option("--min-num-params", o.min_num_params, "SIZE_BASED_WRAP: parameters per unit")->capture_default_str();
  cmd->add_flag("--forward-prefetch", o.forward_prefetch, "Gather the next unit during this one's forward");
  cmd->add_option("--backward-prefetch", o.backward_prefetch, "BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH")
      ->capture_default_str();
  cmd->add_flag("--no-sync", o.no_sync, "Keep full gradients over the micro-batches, reduce once");
  cmd->add_flag("--offload", o.offload,
                "GPU runs (offload_params): master weights, gradient shard and AdamW state in pinned host memory");
  cmd->add_flag("--offload-activations", o.offload_activations,
                "With --activation-checkpointing: the checkpointed layers' inputs in host memory between forward and "
                "backward");
  cmd->add_option("--lora-rank", o.lora_rank, "A LoRA fine-tune: adapters of rank R on a frozen base in --param-dtype");
  cmd->add_option("--target-modules", o.target_modules,
                  "With --lora-rank: the adapted modules (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or all-linear)")
      ->capture_default_str();
  cmd->add_flag("--qlora", o.qlora, "QLoRA: with --lora-rank, the frozen base's Linear weights in NF4 with double quantization");
  cmd->add_flag("--dora", o.dora, "DoRA: with --lora-rank, a trained magnitude per output feature too (lora.use_dora)");
  cmd->add_option("--device-memory", o.device_memory,
                  "Memory per rank to fit, e.g. 80GB or 24GiB (default: this machine's GPU, where it has one)");
}

}  // namespace shardlm::cli
