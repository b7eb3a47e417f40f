#include "train/train_config.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "io/model_files.h"
#include "train/sharding_config.h"

namespace shardlm::train {

namespace {
template <class T>
T positive(const ConfigTree& t, const std::string& key, T fallback) {
  const T v = t.get<T>(key, fallback);
  if (!(v > 0)) throw t.error_at(key, fmt::format("must be positive, got {}", v));
  return v;
}
DType read_dtype(const ConfigTree& t, const std::string& key, const char* fallback) {
  const std::string s = t.get(key, fallback);
  try {
    const DType d = parse_dtype(s);
    if (d != DType::F32 && d != DType::BF16 && d != DType::F16) throw Error("");
    return d;
  } catch (const Error&) {
    throw t.error_at(key, fmt::format("expected f32, bf16 or f16, got '{}'", s));
  }
}
}  // namespace

TrainConfig read_train_config(ConfigTree& t) {
  TrainConfig c;
  c.source = t.file();
  c.model = t.require<std::string>("model");
  c.output_dir = t.require<std::string>("output_dir");
  c.seed = t.get<uint64_t>("seed", c.seed);
  c.compute_dtype = read_dtype(t, "compute_dtype", "f32");
  if (c.compute_dtype == DType::F16) throw t.error_at("compute_dtype", "f16 compute is not supported (use bf16)");

  // `data.format` was this key's name before instruction data existed.
  t.alias("data.format", "data.type");
  const ConfigTree d = t.section("data");
  c.data.type = d.get("type", "auto");
  static const char* kTypes[] = {"auto", "text", "tokens", "alpaca", "chat", "builtin:addition"};
  if (std::find(std::begin(kTypes), std::end(kTypes), c.data.type) == std::end(kTypes))
    throw d.error_at("type", fmt::format("expected auto, text, tokens, alpaca, chat or builtin:addition, got '{}'",
                                         c.data.type));
  c.data.train = c.data.type == "builtin:addition" ? d.get("train", "builtin:addition")
                                                   : d.require<std::string>("train");
  c.data.token_bytes = d.get<int>("token_bytes", 2);
  if (c.data.token_bytes != 2 && c.data.token_bytes != 4) throw d.error_at("token_bytes", "must be 2 or 4");
  c.data.eval = d.get("eval", "");
  c.data.eval_fraction = d.get<double>("eval_fraction", c.data.eval_fraction);
  if (c.data.eval_fraction < 0 || c.data.eval_fraction >= 1)
    throw d.error_at("eval_fraction", "must be in [0, 1)");
  const ConfigTree cols = d.section("columns");
  for (auto [key, field] : {std::pair{"instruction", &c.data.columns.instruction},
                            std::pair{"input", &c.data.columns.input}, std::pair{"output", &c.data.columns.output}}) {
    *field = cols.get(key, field->c_str());
    if (field->empty()) throw cols.error_at(key, "must name a field");
  }
  c.data.train_on_input = d.get<bool>("train_on_input", false);
  c.data.chat_format = d.get("chat_format", "auto");
  if (c.data.chat_format != "auto" && c.data.chat_format != "llama3" && c.data.chat_format != "llama2")
    throw d.error_at("chat_format", fmt::format("expected auto, llama3 or llama2, got '{}'", c.data.chat_format));
  c.data.packing = d.get_optional<bool>("packing");
  c.data.on_bad_row = d.get("on_bad_row", "fail");
  if (c.data.on_bad_row != "fail" && c.data.on_bad_row != "skip")
    throw d.error_at("on_bad_row", fmt::format("expected fail or skip, got '{}'", c.data.on_bad_row));
  c.data.digits = d.get<int>("digits", c.data.digits);
  c.data.train_examples = positive<int64_t>(d, "train_examples", c.data.train_examples);
  c.data.eval_examples = positive<int64_t>(d, "eval_examples", c.data.eval_examples);

  c.seq_len = positive<int64_t>(t, "seq_len", c.seq_len);
  c.micro_batch_size = positive<int64_t>(t, "micro_batch_size", c.micro_batch_size);
  c.gradient_accumulation_steps = positive<int64_t>(t, "gradient_accumulation_steps", c.gradient_accumulation_steps);
  c.max_steps = positive<int64_t>(t, "max_steps", c.max_steps);

  const ConfigTree o = t.section("optimizer");
  c.optimizer.lr = positive<double>(o, "lr", 3e-4);
  const std::vector<double> betas = o.get<std::vector<double>>("betas", {0.9, 0.95});
  if (betas.size() != 2 || betas[0] < 0 || betas[0] >= 1 || betas[1] < 0 || betas[1] >= 1)
    throw o.error_at("betas", "expected two values in [0, 1), e.g. [0.9, 0.95]");
  c.optimizer.beta1 = betas[0];
  c.optimizer.beta2 = betas[1];
  c.optimizer.eps = positive<double>(o, "eps", 1e-8);
  c.optimizer.weight_decay = o.get<double>("weight_decay", 0.0);
  if (c.optimizer.weight_decay < 0) throw o.error_at("weight_decay", "must be >= 0");

  const ConfigTree s = t.section("lr_scheduler");
  try {
    c.schedule.kind = parse_schedule_kind(s.get("type", "cosine"));
  } catch (const Error& e) {
    throw s.error_at("type", e.message());
  }
  c.schedule.lr = c.optimizer.lr;
  c.schedule.warmup_steps = s.get<int64_t>("warmup_steps", 0);
  if (c.schedule.warmup_steps < 0) throw s.error_at("warmup_steps", "must be >= 0");
  c.schedule.min_lr_ratio = s.get<double>("min_lr_ratio", 0.0);
  if (c.schedule.min_lr_ratio < 0 || c.schedule.min_lr_ratio > 1) throw s.error_at("min_lr_ratio", "must be in [0, 1]");
  c.schedule.total_steps = c.max_steps;

  c.max_grad_norm = t.get<double>("max_grad_norm", c.max_grad_norm);
  if (c.max_grad_norm < 0) throw t.error_at("max_grad_norm", "must be >= 0 (0 disables clipping)");
  c.eval_every = t.get<int64_t>("eval_every", c.eval_every);
  if (c.eval_every < 0) throw t.error_at("eval_every", "must be >= 0");
  c.eval_batches = positive<int64_t>(t, "eval_batches", c.eval_batches);
  c.accuracy_examples = t.get<int64_t>("accuracy_examples", c.accuracy_examples);
  c.log_every = positive<int64_t>(t, "log_every", c.log_every);
  c.progress = t.get("progress", "auto");
  if (c.progress != "auto" && c.progress != "bar" && c.progress != "lines" && c.progress != "none")
    throw t.error_at("progress", fmt::format("expected auto, bar, lines or none, got '{}'", c.progress));
  c.metrics_file = t.get("metrics_file", c.metrics_file.c_str());
  c.save_dtype = read_dtype(t, "save_dtype", "f32");
  c.max_shard_size = t.get("max_shard_size", c.max_shard_size.c_str());
  try {
    (void)io::parse_size(c.max_shard_size);
  } catch (const Error& e) {
    throw t.error_at("max_shard_size", e.message());
  }
  // Hugging Face Trainer's names are accepted too.
  t.alias("save_steps", "save_every");
  t.alias("save_total_limit", "keep_last_n");
  t.alias("resume_from_checkpoint", "resume_from");
  c.save_every = t.get<int64_t>("save_every", 0);
  if (c.save_every < 0) throw t.error_at("save_every", "must be >= 0 (0: no checkpoints by step count)");
  c.save_every_minutes = t.get<double>("save_every_minutes", 0.0);
  if (!(c.save_every_minutes >= 0)) throw t.error_at("save_every_minutes", "must be >= 0 (0: no checkpoints by time)");
  c.keep_last_n = t.get<int>("keep_last_n", 0);
  if (c.keep_last_n < 0) throw t.error_at("keep_last_n", "must be >= 0 (0 keeps every checkpoint)");
  c.checkpoint_dir = t.get("checkpoint_dir", "");
  c.resume_from = t.get("resume_from", "");
  if (c.resume_from == "false" || c.resume_from == "False") c.resume_from = "";
  if (c.resume_from == "true" || c.resume_from == "True") c.resume_from = "auto";  // HF Trainer's boolean form
  // The device is checked here, before any data or model is read, so that a run asking for a GPU it
  // cannot have stops at once with the key's line rather than after loading.
  const std::string dev = t.get("device", "cpu");
  if (dev == "cuda") {
    c.device = Device::CUDA;
    std::string why;
    if (!device::cuda_available(&why)) {
      throw t.error_at("device", why == "built without CUDA" ? std::string("cuda asked for, but this shardlm was built without CUDA")
                                                             : "cuda asked for, but " + why);
    }
    if (!comm::nccl_built())
      throw t.error_at("device", "cuda asked for, but this shardlm was built without NCCL (GPU runs move tensors over NCCL)");
  } else if (dev != "cpu") {
    throw t.error_at("device", fmt::format("expected cpu or cuda, got '{}'", dev));
  }
  c.sharding = read_sharding_config(t, c.device);
  if (t.has("max_memory_per_rank")) {
    try {
      c.max_memory_per_rank = int64_t(io::parse_size(t.get("max_memory_per_rank", "")));
    } catch (const Error& e) {
      throw t.error_at("max_memory_per_rank", e.message());
    }
    if (c.max_memory_per_rank <= 0) throw t.error_at("max_memory_per_rank", "must be positive, e.g. 24GB");
  }
  // Sharded checkpoints read and write the optimizer state as host memory; GPU-resident state is
  // not wired into them yet.
  if (c.device == Device::CUDA && c.saves_checkpoints())
    throw t.error_at(c.save_every > 0 ? "save_every" : "save_every_minutes",
                     "checkpoints are not implemented yet for device: cuda");
  if (c.device == Device::CUDA && !c.resume_from.empty())
    throw t.error_at("resume_from", "resuming is not implemented yet for device: cuda");
  if (c.sharding.auto_strategy && c.max_memory_per_rank == 0)
    throw t.error_at("sharding_strategy", "auto needs max_memory_per_rank (the memory budget of one rank, e.g. 24GB)");
  // activation_checkpointing: true (every layer), false, or k (every k-th layer); accelerate's
  // fsdp_config.fsdp_activation_checkpointing: true means every layer.
  if (t.has("activation_checkpointing")) {
    const std::string v = t.get("activation_checkpointing", "false");
    if (v == "true" || v == "True") c.activation_checkpointing = 1;
    else if (v == "false" || v == "False") c.activation_checkpointing = 0;
    else {
      const int k = t.get<int>("activation_checkpointing", 0);
      if (k < 0) throw t.error_at("activation_checkpointing", "expected true, false or a layer interval >= 1");
      c.activation_checkpointing = k;
    }
  }
  if (t.get<bool>("fsdp_config.fsdp_activation_checkpointing", false)) c.activation_checkpointing = 1;
  // One compute dtype: mixed_precision.param_dtype when given, else compute_dtype.
  if (t.has("mixed_precision")) {
    if (t.has("compute_dtype") && c.compute_dtype != c.sharding.param_dtype)
      throw t.error_at("compute_dtype", "disagrees with mixed_precision's parameter dtype; set one of them");
    c.compute_dtype = c.sharding.param_dtype;
  } else {
    c.sharding.param_dtype = c.compute_dtype;
  }
  t.reject_unknown_keys();
  return c;
}

std::string TrainConfig::checkpoint_root() const {
  return checkpoint_dir.empty() ? output_dir + "/checkpoints" : checkpoint_dir;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  ConfigTree tree = ConfigTree::load(path);
  tree.apply_overrides(overrides);
  return read_train_config(tree);
}

}  // namespace shardlm::train
