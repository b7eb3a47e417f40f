#include "train/sharding_config.h"

#include <fmt/format.h>

namespace shardlm::train {

namespace {
using shard::ShardingConfig;
using F = ConfigFields<ShardingConfig>;

// `mixed_precision` is shardlm's map {param_dtype, reduce_dtype} or accelerate's top-level string.
bool mixed_precision_is_map(const ConfigTree& t) {
  try {
    return !t.keys("mixed_precision").empty();
  } catch (const Error&) {  // a scalar: accelerate's form
    return false;
  }
}

// mixed_precision.param_dtype / reduce_dtype (f16 is refused with the other rules, below).
ConfigField<ShardingConfig> mixed_precision_dtype(const char* key, DType ShardingConfig::*member, const char* doc) {
  return F::custom(
      key,
      [member](const ConfigTree& t, const std::string& k, ShardingConfig& c) {
        if (!mixed_precision_is_map(t)) return;
        const std::string s = t.get(k, "f32");
        try {
          c.*member = parse_dtype(s);
          if (c.*member == DType::I32) throw Error("expected f32, bf16 or f16");
        } catch (const Error& e) {
          throw t.error_at(k, e.message());
        }
      },
      doc);
}

std::vector<ConfigField<ShardingConfig>> make_table() {
  // accelerate's launch keys: accepted and ignored, since mpirun / shardlm launch decide them.
  const char* launch_doc = "accelerate's launch settings: accepted and ignored (mpirun / shardlm launch decide them)";
  std::vector<ConfigField<ShardingConfig>> table = {
      F::custom(
           "sharding_strategy",
           [](const ConfigTree& t, const std::string& k, ShardingConfig& c) {
             const std::string s = t.get(k, "FULL_SHARD");
             // auto: the trainer chooses once the model and world are known (docs/memory.md).
             c.auto_strategy = s == "auto";
             if (c.auto_strategy) return;
             try {
               c.strategy = shard::parse_strategy(s);
             } catch (const Error& e) {
               throw t.error_at(k, e.message());
             }
           },
           "NO_SHARD, ZERO1, SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD, _HYBRID_SHARD_ZERO2 (or accelerate's 1-5), "
           "or auto")
          .alias("fsdp_config.fsdp_sharding_strategy"),
      F::parsed("auto_wrap_policy", &ShardingConfig::wrap, shard::parse_wrap_policy,
                "units: TRANSFORMER_BASED_WRAP (a decoder layer each), SIZE_BASED_WRAP, NO_WRAP")
          .alias("fsdp_config.fsdp_auto_wrap_policy"),
      F::field("min_num_params", &ShardingConfig::min_num_params, "SIZE_BASED_WRAP: parameters per unit",
               [](int64_t v) { return v >= 1 ? std::string() : "must be positive"; })
          .alias("fsdp_config.fsdp_min_num_params"),
      F::field("forward_prefetch", &ShardingConfig::forward_prefetch,
               "issue the next unit's all-gather before computing this one")
          .alias("fsdp_config.fsdp_forward_prefetch"),
      F::parsed("backward_prefetch", &ShardingConfig::backward_prefetch, shard::parse_backward_prefetch,
                "BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH")
          .alias("fsdp_config.fsdp_backward_prefetch")
          .alias("fsdp_config.fsdp_backward_prefetch_policy"),
      F::field("shard_group_size", &ShardingConfig::shard_group_size, "hybrid: ranks per shard group",
               non_negative("must be >= 0 (0 = ranks per node)")),
      F::setter<bool>(
          "no_sync", [](ShardingConfig& c, bool no_sync) { c.reduce_every_microbatch = !no_sync; },
          "defer gradient reduction to the last micro-batch"),
      // accelerate's other fsdp_config keys: accepted where shardlm behaves that way anyway, refused
      // where it cannot honour them yet.
      F::ignored<std::string>("fsdp_config.fsdp_transformer_layer_cls_to_wrap",
                              "accepted and ignored: shardlm wraps decoder layers"),
      F::ignored<std::string>("fsdp_config.fsdp_state_dict_type",
                              "accepted and ignored: checkpoints are sharded, the final model a full HF directory"),
      F::ignored<bool>("fsdp_config.fsdp_sync_module_states", "accepted and ignored: every rank loads its own shard"),
      F::ignored<bool>("fsdp_config.fsdp_use_orig_params", "accepted and ignored"),
      F::ignored<bool>("fsdp_config.fsdp_cpu_ram_efficient_loading",
                       "accepted and ignored: no rank ever holds the whole model"),
      F::ignored<int>("fsdp_config.fsdp_version", "accepted and ignored"),
      // CPU offload moves optimizer state from GPU memory to the host; its rules are below.
      F::field("offload_params", &ShardingConfig::offload_params,
               "device: cuda: master shard, gradient shard and AdamW state in pinned host memory")
          .alias("fsdp_config.fsdp_offload_params"),
      // The rest of an accelerate config file describes the launch: accepted and ignored, except a
      // distributed type shardlm cannot be.
      F::custom(
          "distributed_type",
          [](const ConfigTree& t, const std::string& k, ShardingConfig&) {
            const std::optional<std::string> dt = t.get_optional<std::string>(k);
            if (!dt || *dt == "FSDP" || *dt == "NO" || *dt == "MULTI_CPU" || *dt == "MULTI_GPU") return;
            // accelerate's DeepSpeed files: their deepspeed_config section is translated (docs/deepspeed.md).
            if (*dt == "DEEPSPEED" && t.has("deepspeed_config")) return;
            throw t.error_at(k, *dt == "DEEPSPEED"
                                    ? std::string("DEEPSPEED needs a deepspeed_config (a JSON file or accelerate's section)")
                                    : fmt::format("'{}' is not supported (shardlm is FSDP/DDP: use FSDP)", *dt));
          },
          "accelerate's: FSDP, NO, MULTI_CPU, MULTI_GPU, or DEEPSPEED with a deepspeed_config; ignored"),
  };
  for (const char* key : {"compute_environment", "machine_rank", "main_process_ip", "main_training_function",
                          "rdzv_backend", "gpu_ids", "tpu_env"})
    table.push_back(F::ignored<std::string>(key, launch_doc));
  for (const char* key : {"num_machines", "num_processes", "main_process_port"})
    table.push_back(F::ignored<int64_t>(key, launch_doc));
  for (const char* key : {"downcast_bf16", "same_network", "tpu_use_cluster", "tpu_use_sudo", "use_cpu", "debug",
                          "enable_cpu_affinity"})
    table.push_back(F::ignored<std::string>(key, launch_doc));

  // Mixed precision: shardlm's section, or accelerate's top-level string.
  table.push_back(F::custom(
      "mixed_precision",
      [](const ConfigTree& t, const std::string& k, ShardingConfig& c) {
        if (mixed_precision_is_map(t)) return;  // the two keys below
        const std::string mp = t.get(k, "no");
        if (mp == "bf16") c.param_dtype = c.reduce_dtype = DType::BF16;
        else if (mp == "fp16") throw t.error_at(k, "fp16 is not supported (use bf16)");
        else if (mp != "no" && mp != "fp32" && mp != "f32")
          throw t.error_at(k, fmt::format("expected no, bf16 or a {{param_dtype, reduce_dtype}} map, got '{}'", mp));
      },
      "accelerate's form: no or bf16 (parameters and gradient communication)"));
  table.push_back(mixed_precision_dtype("mixed_precision.param_dtype", &ShardingConfig::param_dtype,
                                        "dtype of gathered parameters and compute"));
  table.push_back(mixed_precision_dtype("mixed_precision.reduce_dtype", &ShardingConfig::reduce_dtype,
                                        "dtype of gradient communication"));
  return table;
}
}  // namespace

const std::vector<ConfigField<ShardingConfig>>& sharding_config_fields() {
  static const std::vector<ConfigField<ShardingConfig>> table = make_table();
  return table;
}

void check_sharding_config(const ConfigTree& t, const ShardingConfig& c, Device device) {
  // CPU offload moves optimizer state from GPU memory to the host: on CPU ranks it is there already.
  // Strategies that keep full gradients on every rank (NO_SHARD, ZERO1) would copy whole models
  // across PCIe every step, so offload is refused for them (`auto` is checked once it has chosen).
  if (c.offload_params && device != Device::CUDA)
    throw t.error_at("offload_params", "CPU offload needs device: cuda (on CPU ranks everything is in host memory already)");
  if (c.offload_params && !c.auto_strategy && !c.shard_gradients())
    throw t.error_at("offload_params", fmt::format("CPU offload needs a strategy that shards gradients (FULL_SHARD, "
                                                   "SHARD_GRAD_OP, HYBRID_SHARD, _HYBRID_SHARD_ZERO2), not {}",
                                                   shard::strategy_name(c.strategy)));
  if (c.param_dtype == DType::F16 || c.reduce_dtype == DType::F16)
    throw t.error_at("mixed_precision", "f16 is not supported (use bf16)");
}

ShardingConfig read_sharding_config(ConfigTree& t, Device device) {
  ShardingConfig c;
  read_fields(sharding_config_fields(), t, c);
  check_sharding_config(t, c, device);
  return c;
}

}  // namespace shardlm::train
