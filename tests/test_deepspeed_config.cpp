// DeepSpeed configurations (src/train/deepspeed_config.h): each key's translation into the training
// config's own keys, "auto", conflicts with the YAML, refusals and the one warning; accelerate's
// deepspeed_config section; and DeepSpeed's schedulers against their definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "testing.h"
#include "train/recipes.h"
#include "train/train_config.h"

using namespace shardlm;
using shardlm::testing::error_of;
using shardlm::testing::TempDir;

namespace {

const char* kRun = "model: m\noutput_dir: o\ndata: {train: builtin:addition}\n";

// A run.yaml naming ds.json (both in `dir`), read as `shardlm train` reads it.
train::TrainConfig read_with(const TempDir& dir, const std::string& json, const std::string& yaml_extra = "",
                             const std::vector<std::string>& overrides = {}) {
  std::ofstream(dir / "ds.json") << json;
  std::ofstream(dir / "run.yaml") << kRun << "deepspeed_config: " << (dir / "ds.json") << "\n" << yaml_extra;
  return train::load_train_config(dir / "run.yaml", overrides);
}

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

}  // namespace

TEST(DeepSpeedConfig, Stage3JsonAsHfTrainerWritesIt) {
  TempDir dir;
  const train::TrainConfig c = read_with(dir, R"({
  "bf16": {"enabled": "auto"},
  "zero_optimization": {
    "stage": 3,
    "overlap_comm": true,
    "contiguous_gradients": true,
    "stage3_prefetch_bucket_size": "auto",
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 0.5,
  "train_micro_batch_size_per_gpu": 4,
  "train_batch_size": "auto",
  "steps_per_print": 10,
  "wall_clock_breakdown": false
})");
  EXPECT_EQ(c.sharding.strategy, shard::Strategy::FullShard);
  EXPECT_EQ(c.micro_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_DOUBLE_EQ(c.max_grad_norm, 0.5);
  EXPECT_EQ(c.compute_dtype(), DType::F32);  // bf16 "auto": shardlm's own value
  EXPECT_EQ(c.deepspeed.train_batch_size, 0);
  ASSERT_EQ(c.deepspeed.warnings.size(), 1u);  // the tuning keys, in one line
  const std::string& w = c.deepspeed.warnings[0];
  EXPECT_TRUE(has(w, "ds.json: DeepSpeed keys with no effect in shardlm, ignored: zero_optimization.overlap_comm, "
                     "zero_optimization.contiguous_gradients, zero_optimization.stage3_prefetch_bucket_size, "
                     "zero_optimization.stage3_gather_16bit_weights_on_model_save, steps_per_print, "
                     "wall_clock_breakdown"))
      << w;
}

TEST(DeepSpeedConfig, EachStage) {
  const char* want[] = {"NO_SHARD", "ZERO1", "SHARD_GRAD_OP", "FULL_SHARD"};
  for (int stage = 0; stage < 4; ++stage) {
    TempDir dir;
    const train::TrainConfig c = read_with(dir, fmt::format(R"({{"zero_optimization": {{"stage": {}}}}})", stage));
    EXPECT_EQ(shard::strategy_name(c.sharding.strategy), std::string(want[stage]));
  }
  TempDir dir;
  EXPECT_EQ(read_with(dir, R"({"zero_optimization": {"stage": "auto"}})", "sharding_strategy: ZERO1\n").sharding.strategy,
            shard::Strategy::Zero1);
  const std::string e = error_of([&] { read_with(dir, R"({"zero_optimization": {"stage": 4}})"); });
  EXPECT_TRUE(has(e, "ds.json:1: key 'zero_optimization.stage': expected 0, 1, 2, 3 or \"auto\", got '4'")) << e;
  try {  // every rank reads the same configuration: its errors are printed once (core/error.h)
    read_with(dir, R"({"zero_optimization": {"stage": 4}})");
  } catch (const Error& x) {
    EXPECT_EQ(x.context().scope, ErrorScope::every_rank);
  }
}

// Absent keys: DeepSpeed's default where it changes the results (no clipping), shardlm's own
// where only memory would differ (the strategy).
TEST(DeepSpeedConfig, AbsentKeys) {
  TempDir dir;
  train::TrainConfig c = read_with(dir, "{}");
  EXPECT_EQ(c.max_grad_norm, 0.0);
  EXPECT_EQ(c.sharding.strategy, shard::Strategy::FullShard);
  EXPECT_EQ(read_with(dir, "{}", "max_grad_norm: 2.0\n").max_grad_norm, 2.0);
  EXPECT_EQ(read_with(dir, R"({"gradient_clipping": "auto"})").max_grad_norm, 1.0);  // shardlm's default
}

TEST(DeepSpeedConfig, ConflictWithTheYamlNamesBoth) {
  TempDir dir;
  const std::string e =
      error_of([&] { read_with(dir, "{\n  \"zero_optimization\": {\"stage\": 3}\n}", "sharding_strategy: SHARD_GRAD_OP\n"); });
  EXPECT_TRUE(has(e, "ds.json:2: key 'zero_optimization.stage': stage 3 (sharding_strategy: FULL_SHARD) disagrees "
                     "with sharding_strategy: SHARD_GRAD_OP at "))
      << e;
  EXPECT_TRUE(has(e, "run.yaml:5; set one of them")) << e;
  // The same value in both files is no conflict (accelerate's 1 is FULL_SHARD); the command line
  // overrides both.
  EXPECT_EQ(read_with(dir, R"({"zero_optimization": {"stage": 3}})", "sharding_strategy: 1\n").sharding.strategy,
            shard::Strategy::FullShard);
  EXPECT_EQ(read_with(dir, R"({"zero_optimization": {"stage": 3}})", "", {"sharding_strategy=NO_SHARD"}).sharding.strategy,
            shard::Strategy::NoShard);
  const std::string m = error_of([&] { read_with(dir, R"({"train_micro_batch_size_per_gpu": 2})", "micro_batch_size: 4\n"); });
  EXPECT_TRUE(has(m, "key 'train_micro_batch_size_per_gpu'") && has(m, "micro_batch_size: 4 at")) << m;
}

TEST(DeepSpeedConfig, ValuesAreCheckedByTheSameReaderAtTheJsonsLine) {
  TempDir dir;
  const std::string e = error_of([&] { read_with(dir, "{\n\n  \"gradient_accumulation_steps\": 0\n}"); });
  EXPECT_TRUE(has(e, "ds.json:3: key 'gradient_accumulation_steps': must be positive")) << e;
}

TEST(DeepSpeedConfig, Precision) {
  TempDir dir;
  train::TrainConfig c = read_with(dir, R"({"bf16": {"enabled": true}})");
  EXPECT_EQ(c.compute_dtype(), DType::BF16);
  EXPECT_EQ(c.sharding.param_dtype, DType::BF16);
  EXPECT_EQ(c.sharding.reduce_dtype, DType::BF16);  // DeepSpeed reduces in the model's dtype
  c = read_with(dir, R"({"bf16": {"enabled": true}, "communication_data_type": "fp32"})");
  EXPECT_EQ(c.sharding.param_dtype, DType::BF16);
  EXPECT_EQ(c.sharding.reduce_dtype, DType::F32);
  c = read_with(dir, R"({"bf16": {"enabled": true}})", "compute_dtype: bf16\n");  // agrees
  EXPECT_EQ(c.compute_dtype(), DType::BF16);
  c = read_with(dir, R"({"bf16": {"enabled": true}})", "mixed_precision: bf16\n");  // accelerate's form, agrees
  EXPECT_EQ(c.sharding.reduce_dtype, DType::BF16);
  std::string e = error_of([&] { read_with(dir, R"({"bf16": {"enabled": true}})", "compute_dtype: f32\n"); });
  EXPECT_TRUE(has(e, "key 'bf16.enabled': asks for bf16 but compute_dtype is f32 at")) << e;
  e = error_of([&] { read_with(dir, R"({"fp16": {"enabled": true, "loss_scale": 0}})"); });
  EXPECT_TRUE(has(e, "key 'fp16.enabled': fp16 training (f16 compute with loss scaling) is not supported")) << e;
  // fp16 off: its tuning keys are only listed.
  c = read_with(dir, R"({"fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 16}})");
  ASSERT_EQ(c.deepspeed.warnings.size(), 1u);
  EXPECT_TRUE(has(c.deepspeed.warnings[0], "fp16.loss_scale, fp16.initial_scale_power")) << c.deepspeed.warnings[0];
  e = error_of([&] { read_with(dir, R"({"communication_data_type": "fp16"})"); });
  EXPECT_TRUE(has(e, "key 'communication_data_type': f16 gradient communication is not supported")) << e;
}

TEST(DeepSpeedConfig, Offload) {
  TempDir dir;
  // Offload needs device: cuda; on this CPU run the refusal names the DeepSpeed key.
  std::string e = error_of([&] { read_with(dir, R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}}})"); });
  EXPECT_TRUE(has(e, "ds.json:1: key 'zero_optimization.offload_optimizer.device': CPU offload needs device: cuda")) << e;
  e = error_of([&] { read_with(dir, R"({"zero_optimization": {"offload_param": {"device": "nvme"}}})"); });
  EXPECT_TRUE(has(e, "key 'zero_optimization.offload_param.device': NVMe offload (ZeRO-Infinity) is not supported")) << e;
  const train::TrainConfig c = read_with(dir, R"({"zero_optimization": {"offload_optimizer": {"device": "none"}}})");
  EXPECT_FALSE(c.sharding.offload_params);
}

TEST(DeepSpeedConfig, AdamWOptimizer) {
  TempDir dir;
  train::TrainConfig c = read_with(dir, R"({"optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.999],
    "eps": 1e-6, "weight_decay": 0.1, "torch_adam": true}}})");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-5);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.schedule.lr, 2e-5);
  EXPECT_TRUE(c.deepspeed.warnings.empty());
  // HF Trainer's "auto" everywhere: shardlm's (here the YAML's) values.
  c = read_with(dir, R"({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
    "weight_decay": "auto"}}})", "optimizer: {lr: 1e-3, betas: [0.8, 0.9]}\n");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
  EXPECT_DOUBLE_EQ(read_with(dir, R"({"optimizer": {"type": "Adam", "params": {"lr": 0.01}}})").optimizer.lr, 0.01);
  std::string e = error_of([&] { read_with(dir, R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"); });
  EXPECT_TRUE(has(e, "key 'optimizer.params.adam_w_mode': false (Adam with L2 regularization) is not supported")) << e;
  e = error_of([&] { read_with(dir, R"({"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01}}})"); });
  EXPECT_TRUE(has(e, "key 'optimizer.type': 'OneBitAdam' is not supported: shardlm's optimizer is AdamW")) << e;
  e = error_of([&] { read_with(dir, R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.99]}}})",
                               "optimizer: {betas: [0.9, 0.95]}\n"); });
  EXPECT_TRUE(has(e, "key 'optimizer.params.betas'") && has(e, "disagrees with optimizer.betas: [0.9, 0.95]")) << e;
}

TEST(DeepSpeedConfig, Refusals) {
  TempDir dir;
  for (const auto& [text, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"sparse_attention": {"mode": "fixed"}})", "key 'sparse_attention': DeepSpeed's sparse attention"},
           {R"({"pipeline": {"stages": 2}})", "key 'pipeline': pipeline parallelism is not supported"},
           {R"({"moe": {"enabled": true}})", "key 'moe': mixture of experts"},
           {R"({"curriculum_learning": {"enabled": true}})", "key 'curriculum_learning'"},
           {R"({"amp": {"enabled": true}})", "key 'amp.enabled'"},
           {R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true}})",
            "key 'zero_optimization.zero_quantized_weights': ZeRO++"},
           {R"({"data_types": {"grad_accum_dtype": "bf16"}})", "key 'data_types.grad_accum_dtype'"},
           {R"({"scheduler": {"type": "OneCycle", "params": {}}})", "key 'scheduler.type': 'OneCycle' is not supported"},
       })
    // (text captured by copy: clang before 16 cannot capture a structured binding)
    EXPECT_TRUE(has(error_of([&, json = text] { read_with(dir, json); }), needle)) << text;
  // A refused feature switched off is fine.
  EXPECT_NO_THROW(read_with(dir, R"({"curriculum_learning": {"enabled": false, "curriculum_type": "seqlen"}})"));
}

TEST(DeepSpeedConfig, TrainBatchSizeIsCheckedAgainstTheWorld) {
  TempDir dir;
  const train::TrainConfig c = read_with(dir, R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2})");
  EXPECT_EQ(c.deepspeed.train_batch_size, 32);
  EXPECT_EQ(train::with_batch_size(c, 4).micro_batch_size, 4);
  const std::string e = error_of([&] { train::with_batch_size(c, 2); });
  EXPECT_TRUE(has(e, "ds.json:1: key 'train_batch_size': 32 is not micro_batch_size 4 x gradient_accumulation_steps 2 "
                     "x 2 ranks = 16"))
      << e;
}

// As DeepSpeed does: the one of micro-batch and accumulation not given is derived.
TEST(DeepSpeedConfig, TrainBatchSizeDerivesWhatIsNotGiven) {
  TempDir dir;
  train::TrainConfig c = train::with_batch_size(read_with(dir, R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2})"), 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  c = train::with_batch_size(read_with(dir, R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})"), 4);
  EXPECT_EQ(c.micro_batch_size, 4);
  c = train::with_batch_size(read_with(dir, R"({"train_batch_size": 32})"), 4);  // neither: accumulation 1
  EXPECT_EQ(c.micro_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  c = train::with_batch_size(read_with(dir, R"({"train_batch_size": 32})", "micro_batch_size: 4\n"), 2);  // the YAML's
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  const std::string e = error_of([&] { train::with_batch_size(read_with(dir, R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})"), 2); });
  EXPECT_TRUE(has(e, "key 'train_batch_size': 30 is not micro_batch_size 4 x gradient_accumulation_steps 1 x 2 ranks = 8"))
      << e;
}

TEST(DeepSpeedConfig, Schedulers) {
  TempDir dir;
  // WarmupLR: absent parameters take DeepSpeed's defaults (log warmup over 1000 steps to 0.001).
  train::TrainConfig c = read_with(dir, R"({"scheduler": {"type": "WarmupLR"}})");
  EXPECT_EQ(c.schedule.kind, train::LrSchedule::Kind::Constant);
  EXPECT_EQ(c.schedule.warmup, train::LrSchedule::Warmup::Log);
  EXPECT_EQ(c.schedule.warmup_steps, 1000);
  EXPECT_DOUBLE_EQ(c.schedule.lr, 0.001);
  c = read_with(dir, R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 50, "warmup_min_lr": 1e-5,
    "warmup_max_lr": 1e-4, "warmup_num_steps": 5, "warmup_type": "linear"}}})");
  EXPECT_EQ(c.schedule.kind, train::LrSchedule::Kind::Linear);
  EXPECT_EQ(c.schedule.total_steps, 50);
  EXPECT_DOUBLE_EQ(c.schedule.lr, 1e-4);
  EXPECT_NEAR(c.schedule.warmup_min_ratio, 0.1, 1e-12);
  EXPECT_NEAR(c.schedule.min_lr_ratio, 0.1, 1e-12);
  c = read_with(dir, R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto",
    "warmup_num_steps": 1, "cos_min_ratio": 0.01, "warmup_min_ratio": 0.1}}})", "max_steps: 40\n");
  EXPECT_EQ(c.schedule.kind, train::LrSchedule::Kind::DeepSpeedCosine);
  EXPECT_EQ(c.schedule.total_steps, 40);  // "auto": max_steps
  EXPECT_EQ(c.schedule.warmup_steps, 2);  // DeepSpeed raises warmup_num_steps to 2
  EXPECT_DOUBLE_EQ(c.schedule.min_lr_ratio, 0.01);
  std::string e = error_of([&] { read_with(dir, R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})"); });
  EXPECT_TRUE(has(e, "key 'scheduler.params.total_num_steps': WarmupDecayLR needs total_num_steps")) << e;
  e = error_of([&] { read_with(dir, R"({"scheduler": {"type": "WarmupLR"}})", "lr_scheduler: {type: cosine}\n"); });
  EXPECT_TRUE(has(e, "key 'scheduler.type': WarmupLR (lr_scheduler.type: constant) disagrees with lr_scheduler.type: "
                     "cosine"))
      << e;
}

// DeepSpeed's schedulers (deepspeed/runtime/lr_schedules.py), written from their definitions with
// DeepSpeed's iteration count (0 at the first update), against LrSchedule at the same steps.
TEST(DeepSpeedConfig, SchedulesMatchDeepSpeedsDefinitions) {
  const auto gamma_warmup = [](bool log, int64_t it, int64_t w) {
    return log ? std::log(double(it + 1)) / std::log(double(w)) : double(it) / double(w);
  };
  for (const bool log : {true, false}) {
    const int64_t W = 10, T = 60;
    const double min_lr = 1e-5, max_lr = 1e-3;
    train::LrSchedule decay{.kind = train::LrSchedule::Kind::Linear,
                            .warmup = log ? train::LrSchedule::Warmup::Log : train::LrSchedule::Warmup::Linear,
                            .lr = max_lr, .warmup_steps = W, .warmup_min_ratio = min_lr / max_lr, .total_steps = T,
                            .min_lr_ratio = min_lr / max_lr};
    train::LrSchedule warm = decay;
    warm.kind = train::LrSchedule::Kind::Constant;
    const double cos_min = 1e-4, warm_min = 0.05;
    train::LrSchedule cosine{.kind = train::LrSchedule::Kind::DeepSpeedCosine, .warmup = decay.warmup, .lr = max_lr,
                             .warmup_steps = W, .warmup_min_ratio = warm_min, .total_steps = T,
                             .min_lr_ratio = cos_min};
    for (int64_t it = 0; it < 2 * T; ++it) {
      // WarmupLR and WarmupDecayLR: min + (max - min) * gamma.
      const double g_warm = it < W ? gamma_warmup(log, it, W) : 1.0;
      const double g_decay = it < W ? g_warm : std::max(0.0, double(T - it) / double(std::max<int64_t>(1, T - W)));
      EXPECT_NEAR(warm.at(it + 1), min_lr + (max_lr - min_lr) * g_warm, 1e-15) << it;
      EXPECT_NEAR(decay.at(it + 1), min_lr + (max_lr - min_lr) * g_decay, 1e-15) << it;
      // WarmupCosineLR: a ratio of the optimizer's lr.
      double ratio;
      if (it < W) {
        ratio = warm_min + (1 - warm_min) * gamma_warmup(log, it, W);
      } else {
        const double real = double(it - W + 1), total = double(T - W);
        ratio = std::max(0.0, cos_min + (1 - cos_min) * (1 + std::cos(M_PI * real / total)) / 2);
      }
      EXPECT_NEAR(cosine.at(it + 1), max_lr * ratio, 1e-15) << it;
    }
  }
}

TEST(DeepSpeedConfig, AccelerateSection) {
  // As `accelerate config` writes a DeepSpeed setup (default_config.yaml), plus shardlm's run keys.
  ConfigTree t = ConfigTree::parse(std::string(kRun) +
                                       "compute_environment: LOCAL_MACHINE\n"
                                       "distributed_type: DEEPSPEED\n"
                                       "deepspeed_config:\n"
                                       "  gradient_accumulation_steps: 4\n"
                                       "  gradient_clipping: 1.0\n"
                                       "  offload_optimizer_device: none\n"
                                       "  offload_param_device: none\n"
                                       "  zero3_init_flag: true\n"
                                       "  zero3_save_16bit_model: true\n"
                                       "  zero_stage: 2\n"
                                       "mixed_precision: bf16\n"
                                       "num_processes: 2\n",
                                   "acc.yaml");
  const train::TrainConfig c = train::read_train_config(t);
  EXPECT_EQ(c.sharding.strategy, shard::Strategy::ShardGradOp);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.compute_dtype(), DType::BF16);
  EXPECT_TRUE(c.deepspeed.warnings.empty());
  // An unknown key of the section is listed, not an error; DEEPSPEED needs the section.
  ConfigTree u = ConfigTree::parse(std::string(kRun) + "deepspeed_config:\n  zero_stage: 3\n  zero_hpz: 2\n", "acc.yaml");
  const train::TrainConfig cu = train::read_train_config(u);
  ASSERT_EQ(cu.deepspeed.warnings.size(), 1u);
  EXPECT_TRUE(has(cu.deepspeed.warnings[0], "acc.yaml: deepspeed_config: a DeepSpeed key with no effect in shardlm, "
                                            "ignored: deepspeed_config.zero_hpz"))
      << cu.deepspeed.warnings[0];
  ConfigTree d = ConfigTree::parse(std::string(kRun) + "distributed_type: DEEPSPEED\n", "acc.yaml");
  EXPECT_TRUE(has(error_of([&] { train::read_train_config(d); }), "key 'distributed_type': DEEPSPEED needs a "
                                                                     "deepspeed_config"));
}

TEST(DeepSpeedConfig, AccelerateSectionWithAJsonFile) {
  TempDir dir;
  std::ofstream(dir / "ds.json") << R"({"zero_optimization": {"stage": 1}})";
  ConfigTree t = ConfigTree::parse(std::string(kRun) + "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                                       "  deepspeed_config_file: " + (dir / "ds.json") +
                                       "\n  zero3_init_flag: false\n",
                                   "acc.yaml");
  EXPECT_EQ(train::read_train_config(t).sharding.strategy, shard::Strategy::Zero1);
  ConfigTree both = ConfigTree::parse(std::string(kRun) + "deepspeed_config:\n  deepspeed_config_file: " +
                                          (dir / "ds.json") + "\n  zero_stage: 2\n",
                                      "acc.yaml");
  EXPECT_TRUE(has(error_of([&] { train::read_train_config(both); }),
                  "acc.yaml:6: key 'deepspeed_config.zero_stage': set in deepspeed_config_file"));
  ConfigTree missing = ConfigTree::parse(std::string(kRun) + "deepspeed_config: /nonexistent/ds.json\n", "run.yaml");
  EXPECT_TRUE(has(error_of([&] { train::read_train_config(missing); }),
                  "run.yaml:4: key 'deepspeed_config': cannot read the DeepSpeed config '/nonexistent/ds.json'"));
}

// Every built-in recipe reads as `shardlm train` would read it (the memory and shape checks are in
// the `recipes_validate` CLI test).
TEST(RecipeConfigs, EveryRecipeReads) {
  EXPECT_GE(train::recipes().size(), 30u);
  for (const train::Recipe& r : train::recipes()) {
    ConfigTree t = ConfigTree::parse(r.yaml, r.name);
    train::TrainConfig c;
    EXPECT_NO_THROW(c = train::read_train_config(t)) << r.name;
    const bool dpo = r.method.starts_with("dpo-");
    const std::string tune = dpo ? r.method.substr(4) : r.method;
    EXPECT_EQ(c.preference, dpo) << r.name;
    EXPECT_EQ(c.lora.has_value(), tune != "full") << r.name;
    EXPECT_EQ(c.lora_quantize_base, tune == "qlora") << r.name;
  }
  EXPECT_EQ(&train::find_recipe("llama3_1-8b-lora-single-device"), &train::find_recipe("llama3_1-8b-lora-single-device"));
  const std::string e = error_of([] { train::find_recipe("llama3_1-8b-lora"); });
  EXPECT_TRUE(has(e, "unknown recipe 'llama3_1-8b-lora'; close: llama3_1-8b-full-distributed, "
                     "llama3_1-8b-lora-single-device"))
      << e;
}
