#include "train/resume.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>

#include "core/dtype.h"
#include "io/json_integer.h"

namespace shardlm::train {

namespace {

// A counter of the training state: a JSON integer >= 0 (io::json_integer).
int64_t counter(const nlohmann::json& obj, const char* key) {
  const std::optional<int64_t> v = io::json_integer(obj.at(key), 0);
  if (!v) throw Error(fmt::format("malformed training state: '{}' is {}", key, obj.at(key).dump()));
  return *v;
}

}  // namespace

void to_json(nlohmann::json& j, const TrainingState& s) {
  j = {{"step", s.step},
       {"sampler", {{"epoch", s.sampler.epoch}, {"step", s.sampler.step}}},
       {"rows_per_step", s.rows_per_step},
       {"seed", s.seed},
       {"lr", s.lr}};
}

void from_json(const nlohmann::json& j, TrainingState& s) {
  s.step = counter(j, "step");
  if (!j.at("seed").is_number_integer())
    throw Error(fmt::format("malformed training state: 'seed' is {}", j.at("seed").dump()));
  s.seed = j.at("seed").get<uint64_t>();
  s.sampler = {counter(j.at("sampler"), "epoch"), counter(j.at("sampler"), "step")};
  s.rows_per_step = counter(j, "rows_per_step");
  // JSON has no NaN: a rate that was not finite was written as null.
  s.lr = j.at("lr").is_number() ? j.at("lr").get<double>() : std::nan("");
}

std::unique_ptr<ckpt::CheckpointReader> open_resume_checkpoint(const TrainConfig& c, const ModelConfig& mcfg,
                                                               std::vector<std::string>& notes) {
  if (c.resume_from.empty()) return nullptr;
  std::string dir = c.resume_from;
  if (dir == "auto") {
    const std::optional<std::string> found =
        ckpt::latest_complete(c.checkpoint_root(), [&](const std::string& w) { notes.push_back("warning: " + w); });
    if (!found) {
      notes.push_back(fmt::format("resume_from: auto: no complete checkpoint in {}; starting from {}",
                                  c.checkpoint_root(), c.model));
      return nullptr;
    }
    dir = *found;
  }
  auto reader = std::make_unique<ckpt::CheckpointReader>(dir);
  if (reader->lora().has_value() != c.lora.has_value())
    throw Error(reader->lora() ? "a LoRA run's checkpoint (adapters only), but this config has no lora: section"
                                     : "a full fine-tune's checkpoint, but this config trains LoRA adapters",
                {.file = dir, .key = "lora"});
  if (const auto& saved_lora = reader->lora(); saved_lora && c.lora) {
    // Adapters trained at one scale do not continue at another (rank and targets differ in shape,
    // and load_checkpoint names the tensor).
    const model::LoraSpec& now = *c.lora;
    if (saved_lora->use_dora != now.use_dora)
      throw Error(fmt::format("the checkpoint's adapters were trained {} DoRA, this config {}",
                              saved_lora->use_dora ? "with" : "without", now.use_dora ? "has use_dora: true" : "has none"),
                  {.file = dir, .key = "lora.use_dora"});
    if (saved_lora->alpha != now.alpha || saved_lora->use_rslora != now.use_rslora)
      throw Error(fmt::format("the checkpoint's adapters were trained with lora_alpha {}{}, this config has {}{}",
                              saved_lora->alpha, saved_lora->use_rslora ? " (rsLoRA)" : "", now.alpha,
                              now.use_rslora ? " (rsLoRA)" : ""),
                  {.file = dir, .key = saved_lora->alpha != now.alpha ? "lora.alpha" : "lora.use_rslora"});
  }
  nlohmann::json saved = to_hf_json(reader->model()), here = to_hf_json(mcfg);
  saved.erase("torch_dtype");
  here.erase("torch_dtype");
  for (const auto& [key, value] : here.items())
    if (!saved.contains(key) || saved[key] != value)
      throw Error(fmt::format("checkpoint of another model: {} is {} in the checkpoint but {} in {}", key,
                              saved.value(key, nlohmann::json()).dump(), value.dump(), c.model),
                  {.file = dir, .key = key});
  if (reader->step() >= c.max_steps)
    throw Error(fmt::format("{} is at step {}, and max_steps is {}: nothing is left to train", dir, reader->step(),
                            c.max_steps),
                {.file = c.source, .key = "max_steps"});
  return reader;
}

int64_t load_training_state(const ckpt::CheckpointReader& r, const TrainConfig& c, data::DistributedSampler& sampler) {
  TrainingState saved;
  try {
    saved = r.metadata().at("training").get<TrainingState>();
  } catch (Error& e) {
    throw e.set_file(r.dir());
  }
  if (saved.seed != c.seed)
    throw Error(fmt::format("the checkpoint was trained with seed {} but this run's seed is {}: the data order would "
                            "not continue (set seed: {})",
                            saved.seed, c.seed, saved.seed),
                {.file = c.source, .key = "seed"});
  sampler.load_state(saved.sampler, saved.rows_per_step, {.file = c.source, .key = "micro_batch_size"});
  return r.step();
}

nlohmann::json run_description(const TrainConfig& c, const shard::ShardingConfig& sharding, int world_size,
                               const shard::Mesh& mesh) {
  return {{"config_file", c.source},
          {"model", c.model},
          {"world_size", world_size},
          {"strategy", shard::strategy_name(sharding.strategy)},
          {"shard_group_size", mesh.shard->size()},
          {"param_dtype", dtype_name(sharding.param_dtype)},
          {"reduce_dtype", dtype_name(sharding.reduce_dtype)},
          {"optimizer_state_dtype", sharding.state_dtype == DType::U8 ? "8bit" : dtype_name(sharding.state_dtype)},
          {"seq_len", c.seq_len},
          {"micro_batch_size", c.micro_batch_size},
          {"gradient_accumulation_steps", c.gradient_accumulation_steps},
          {"max_steps", c.max_steps},
          {"optimizer",
           {{"lr", c.optimizer.lr},
            {"betas", {c.optimizer.beta1, c.optimizer.beta2}},
            {"eps", c.optimizer.eps},
            {"weight_decay", c.optimizer.weight_decay}}},
          {"lr_scheduler", c.schedule.state()},
          {"max_grad_norm", c.max_grad_norm},
          {"seed", c.seed}};
}

}  // namespace shardlm::train
