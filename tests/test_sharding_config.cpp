// Reading the sharding configuration: shardlm's keys, accelerate's fsdp_config, errors.
#include <gtest/gtest.h>

#include "testing.h"
#include "train/sharding_config.h"
#include "train/train_config.h"

using namespace shardlm;
using shardlm::testing::error_of;

TEST(ShardingConfig, ShardlmKeys) {
  ConfigTree t = ConfigTree::parse(
      "sharding_strategy: HYBRID_SHARD\nauto_wrap_policy: SIZE_BASED_WRAP\nmin_num_params: 1000\n"
      "forward_prefetch: true\nbackward_prefetch: BACKWARD_POST\nshard_group_size: 2\nno_sync: true\n"
      "mixed_precision: {param_dtype: bf16, reduce_dtype: f32}\n");
  const shard::ShardingConfig c = train::read_sharding_config(t);
  EXPECT_EQ(c.strategy, shard::Strategy::HybridShard);
  EXPECT_EQ(c.wrap, shard::WrapPolicy::SizeBased);
  EXPECT_EQ(c.min_num_params, 1000);
  EXPECT_TRUE(c.forward_prefetch);
  EXPECT_EQ(c.backward_prefetch, shard::BackwardPrefetch::Post);
  EXPECT_EQ(c.shard_group_size, 2);
  EXPECT_FALSE(c.reduce_every_microbatch);
  EXPECT_EQ(c.param_dtype, DType::BF16);
  EXPECT_EQ(c.reduce_dtype, DType::F32);
  EXPECT_NO_THROW(t.reject_unknown_keys());
}

TEST(ShardingConfig, AccelerateFsdpConfigIsAccepted) {
  // As `accelerate config` writes it (FSDP section of default_config.yaml).
  ConfigTree t = ConfigTree::parse(
      "mixed_precision: bf16\n"
      "fsdp_config:\n"
      "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
      "  fsdp_backward_prefetch: BACKWARD_PRE\n"
      "  fsdp_cpu_ram_efficient_loading: true\n"
      "  fsdp_forward_prefetch: false\n"
      "  fsdp_offload_params: false\n"
      "  fsdp_sharding_strategy: SHARD_GRAD_OP\n"
      "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
      "  fsdp_sync_module_states: true\n"
      "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
      "  fsdp_use_orig_params: true\n");
  const shard::ShardingConfig c = train::read_sharding_config(t);
  EXPECT_EQ(c.strategy, shard::Strategy::ShardGradOp);
  EXPECT_EQ(c.param_dtype, DType::BF16);
  EXPECT_NO_THROW(t.reject_unknown_keys());
  ConfigTree n = ConfigTree::parse("fsdp_config:\n  fsdp_sharding_strategy: 1\n");  // older numeric form
  EXPECT_EQ(train::read_sharding_config(n).strategy, shard::Strategy::FullShard);
}

TEST(ShardingConfig, ErrorsNameTheKey) {
  ConfigTree a = ConfigTree::parse("sharding_strategy: FULLSHARD\n", "run.yaml");
  EXPECT_NE(error_of([&] { train::read_sharding_config(a); }).find("run.yaml:1: key 'sharding_strategy'"),
            std::string::npos);
  ConfigTree b = ConfigTree::parse("fsdp_config:\n  fsdp_offload_params: true\n", "acc.yaml");  // refused
  EXPECT_NE(error_of([&] { train::read_sharding_config(b); }).find("key 'fsdp_config.fsdp_offload_params'"),
            std::string::npos);
  ConfigTree c = ConfigTree::parse("sharding_strategy: NO_SHARD\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n",
                                   "both.yaml");
  EXPECT_NE(error_of([&] { train::read_sharding_config(c); }).find("both.yaml"), std::string::npos);
  ConfigTree d = ConfigTree::parse("mixed_precision: fp16\n", "mp.yaml");
  EXPECT_NE(error_of([&] { train::read_sharding_config(d); }).find("fp16 is not supported"), std::string::npos);
}

// One compute dtype: compute_dtype and mixed_precision.param_dtype set the same field; given both,
// they must agree, and the error names compute_dtype's line.
TEST(ShardingConfig, OneComputeDtypeFromEitherKey) {
  const std::string head = "model: m\noutput_dir: o\ndata: {train: x.txt}\n";  // lines 1-3
  auto read = [&](const std::string& yaml) {
    ConfigTree t = ConfigTree::parse(head + yaml, "run.yaml");
    return train::read_train_config(t);
  };
  EXPECT_EQ(read("").compute_dtype(), DType::F32);
  EXPECT_EQ(read("compute_dtype: bf16\n").sharding.param_dtype, DType::BF16);
  EXPECT_EQ(read("mixed_precision: bf16\n").compute_dtype(), DType::BF16);
  EXPECT_EQ(read("mixed_precision: {param_dtype: bf16}\ncompute_dtype: bf16\n").compute_dtype(), DType::BF16);
  const std::string e = error_of([&] { read("mixed_precision: {param_dtype: f32}\ncompute_dtype: bf16\n"); });
  EXPECT_NE(e.find("run.yaml:5: key 'compute_dtype': disagrees with mixed_precision"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { read("compute_dtype: f16\n"); }).find("key 'compute_dtype': f16 compute is not supported"),
            std::string::npos);
}
