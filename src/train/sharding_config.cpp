#include "train/sharding_config.h"

#include <fmt/format.h>

namespace shardlm::train {

namespace {
// accelerate's fsdp_config keys and the shardlm keys they stand for.
constexpr std::pair<const char*, const char*> kAccelerateAliases[] = {
    {"fsdp_config.fsdp_sharding_strategy", "sharding_strategy"},
    {"fsdp_config.fsdp_auto_wrap_policy", "auto_wrap_policy"},
    {"fsdp_config.fsdp_backward_prefetch", "backward_prefetch"},
    {"fsdp_config.fsdp_backward_prefetch_policy", "backward_prefetch"},
    {"fsdp_config.fsdp_forward_prefetch", "forward_prefetch"},
    {"fsdp_config.fsdp_min_num_params", "min_num_params"},
    {"fsdp_config.fsdp_offload_params", "offload_params"},
};

template <class Parse>
auto parse_at(const ConfigTree& t, const std::string& key, const std::string& fallback, Parse parse) {
  const std::string v = t.get(key, fallback.c_str());
  try {
    return parse(v);
  } catch (const Error& e) {
    throw t.error_at(key, e.message());
  }
}
}  // namespace

shard::ShardingConfig read_sharding_config(ConfigTree& t, Device device) {
  for (const auto& [from, to] : kAccelerateAliases) t.alias(from, to);
  shard::ShardingConfig c;
  // auto: the trainer chooses once the model and world are known (docs/memory.md).
  c.auto_strategy = t.get("sharding_strategy", "FULL_SHARD") == "auto";
  if (!c.auto_strategy) c.strategy = parse_at(t, "sharding_strategy", "FULL_SHARD", shard::parse_strategy);
  c.wrap = parse_at(t, "auto_wrap_policy", "TRANSFORMER_BASED_WRAP", shard::parse_wrap_policy);
  c.min_num_params = t.get<int64_t>("min_num_params", c.min_num_params);
  if (c.min_num_params < 1) throw t.error_at("min_num_params", "must be positive");
  c.forward_prefetch = t.get<bool>("forward_prefetch", false);
  c.backward_prefetch = parse_at(t, "backward_prefetch", "BACKWARD_PRE", shard::parse_backward_prefetch);
  c.shard_group_size = t.get<int>("shard_group_size", 0);
  if (c.shard_group_size < 0) throw t.error_at("shard_group_size", "must be >= 0 (0 = ranks per node)");
  c.reduce_every_microbatch = !t.get<bool>("no_sync", false);

  // accelerate's other fsdp_config keys: accepted where shardlm behaves that way anyway, refused
  // where it cannot honour them yet.
  const ConfigTree f = t.section("fsdp_config");
  (void)f.get("fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer");  // shardlm wraps decoder layers
  (void)f.get("fsdp_state_dict_type", "SHARDED_STATE_DICT");
  (void)f.get<bool>("fsdp_sync_module_states", true);   // every rank loads its own shard
  (void)f.get<bool>("fsdp_use_orig_params", true);
  (void)f.get<bool>("fsdp_cpu_ram_efficient_loading", true);
  (void)f.get<int>("fsdp_version", 1);
  // CPU offload moves optimizer state from GPU memory to the host: on CPU ranks it is there already.
  // Strategies that keep full gradients on every rank (NO_SHARD, ZERO1) would copy whole models
  // across PCIe every step, so offload is refused for them (`auto` is checked once it has chosen).
  c.offload_params = t.get<bool>("offload_params", false);
  if (c.offload_params && device != Device::CUDA)
    throw t.error_at("offload_params", "CPU offload needs device: cuda (on CPU ranks everything is in host memory already)");
  if (c.offload_params && !c.auto_strategy && !c.shard_gradients())
    throw t.error_at("offload_params", fmt::format("CPU offload needs a strategy that shards gradients (FULL_SHARD, "
                                                   "SHARD_GRAD_OP, HYBRID_SHARD, _HYBRID_SHARD_ZERO2), not {}",
                                                   shard::strategy_name(c.strategy)));

  // The rest of an accelerate config file describes the launch, which mpirun / shardlm launch
  // decide here: accepted and ignored, except a distributed type shardlm cannot be.
  const std::string dt = t.get("distributed_type", "FSDP");
  if (dt != "FSDP" && dt != "NO" && dt != "MULTI_CPU" && dt != "MULTI_GPU")
    throw t.error_at("distributed_type", fmt::format("'{}' is not supported (shardlm is FSDP/DDP: use FSDP)", dt));
  for (const char* key : {"compute_environment", "machine_rank", "main_process_ip", "main_training_function",
                          "rdzv_backend", "gpu_ids", "tpu_env"})
    (void)t.get(key, "");
  for (const char* key : {"num_machines", "num_processes", "main_process_port"}) (void)t.get<int64_t>(key, 0);
  for (const char* key : {"downcast_bf16", "same_network", "tpu_use_cluster", "tpu_use_sudo", "use_cpu", "debug",
                          "enable_cpu_affinity"})
    (void)t.get(key, "");

  // Mixed precision: shardlm's section, or accelerate's top-level string.
  bool mp_is_map = false;
  try {
    mp_is_map = !t.keys("mixed_precision").empty();
  } catch (const Error&) {  // a scalar: accelerate's form
  }
  if (mp_is_map) {
    const ConfigTree mp = t.section("mixed_precision");
    auto dtype = [&](const char* key) {
      return parse_at(mp, key, "f32", [](const std::string& s) {
        const DType d = parse_dtype(s);
        if (d == DType::I32) throw Error("expected f32, bf16 or f16");
        return d;
      });
    };
    c.param_dtype = dtype("param_dtype");
    c.reduce_dtype = dtype("reduce_dtype");
  } else {
    const std::string mp = t.get("mixed_precision", "no");
    if (mp == "bf16") c.param_dtype = c.reduce_dtype = DType::BF16;
    else if (mp == "fp16") throw t.error_at("mixed_precision", "fp16 is not supported (use bf16)");
    else if (mp != "no" && mp != "fp32" && mp != "f32")
      throw t.error_at("mixed_precision", fmt::format("expected no, bf16 or a {{param_dtype, reduce_dtype}} map, got '{}'", mp));
  }
  if (c.param_dtype == DType::F16 || c.reduce_dtype == DType::F16)
    throw t.error_at("mixed_precision", "f16 is not supported (use bf16)");
  return c;
}

}  // namespace shardlm::train
