#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "data/instruct.h"
#include "data/packing.h"
#include "data/sampler.h"
#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "shard/engine.h"
#include "infer/generator.h"
#include "io/model_files.h"
#include "memory/estimator.h"
#include "memory/usage.h"
#include "model/llama.h"
#include "train/hf_export.h"
#include "train/param_store.h"
#include "train/progress.h"

namespace shardlm::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kBuiltinAddition = "builtin:addition";

// The data type of a file when `data.type` is auto.
std::string resolve_type(const DataConfig& dc, const std::string& path) {
  if (dc.type != "auto") return dc.type;
  if (path == kBuiltinAddition) return kBuiltinAddition;
  if (path.ends_with(".bin") || path.ends_with(".tokens")) return "tokens";
  if (path.ends_with(".json") || path.ends_with(".jsonl")) return data::detect_json_kind(path, dc.columns);
  return "text";
}

// Record k of a file is held out when this hash of k falls below the fraction: deterministic,
// independent of the seed and of which other records were skipped, and spread over the file.
bool held_out_record(int64_t k, double fraction) {
  const auto r = philox4x32({uint32_t(k), uint32_t(uint64_t(k) >> 32), 0xe7a1, 0}, {0x5eed, 0x5711});
  return double(r[0]) < fraction * 4294967296.0;
}

}  // namespace

RunData load_run_data(const TrainConfig& c, const data::Tokenizer& tok, int64_t model_vocab_size) {
  RunData d;
  const DataConfig& dc = c.data;
  d.type = resolve_type(dc, dc.train);
  d.seq_len = c.seq_len;
  if (d.type == kBuiltinAddition) {
    d.train = std::make_unique<data::AdditionTask>(tok, dc.digits, false, dc.train_examples, c.seed);
    auto eval = std::make_unique<data::AdditionTask>(tok, dc.digits, true, dc.eval_examples, c.seed);
    d.task = eval.get();
    d.eval = std::move(eval);
    // Rows are short: no need for longer rows than the longest problem.
    d.seq_len = std::min(c.seq_len, data::AdditionTask::max_tokens(dc.digits));
    d.packing = dc.packing.value_or(false);
    d.report.push_back(fmt::format("{} ({}-digit operands, {} training problems, {} held-out)", dc.train, dc.digits,
                                   dc.train_examples, dc.eval_examples));
    return d;
  }
  if (d.type == "alpaca" || d.type == "chat") {
    d.packing = dc.packing.value_or(true);
    data::InstructOptions opt;
    opt.columns = dc.columns;
    opt.train_on_input = dc.train_on_input;
    opt.chat_format = dc.chat_format;
    opt.on_bad_row = dc.on_bad_row == "skip" ? data::BadRowPolicy::Skip : data::BadRowPolicy::Fail;
    opt.max_seq_len = c.seq_len;
    data::LoadReport rep;
    std::vector<int64_t> ordinals;
    std::vector<data::Example> all = data::load_instruct_file(dc.train, d.type, tok, opt, rep, &ordinals);
    std::vector<data::Example> train, eval;
    if (!dc.eval.empty()) {
      const std::string eval_type = resolve_type(dc, dc.eval);
      if (eval_type != d.type)
        throw Error(fmt::format("the eval file is {} data but the training file is {}", eval_type, d.type),
                    {.file = dc.eval});
      data::LoadReport erep;
      eval = data::load_instruct_file(dc.eval, d.type, tok, opt, erep);
      train = std::move(all);
      d.report.push_back(fmt::format("train {}: {}", dc.train, rep.summary()));
      d.report.push_back(fmt::format("eval {}: {}", dc.eval, erep.summary()));
    } else {
      for (size_t i = 0; i < all.size(); ++i)
        (dc.eval_fraction > 0 && held_out_record(ordinals[i], dc.eval_fraction) ? eval : train)
            .push_back(std::move(all[i]));
      // A tiny file may draw no held-out record: hold out its last example rather than none.
      if (dc.eval_fraction > 0 && eval.empty() && train.size() >= 2) {
        eval.push_back(std::move(train.back()));
        train.pop_back();
      }
      d.report.push_back(fmt::format("{}: {}", dc.train, rep.summary()));
      d.report.push_back(fmt::format("split: {} training examples, {} held out (eval_fraction {}, by a hash of "
                                     "the record number)",
                                     train.size(), eval.size(), dc.eval_fraction));
    }
    if (train.empty()) throw Error("no training examples are left after the eval split", {.file = dc.train});
    d.train = std::make_unique<data::ExampleDataset>(std::move(train));
    d.eval = std::make_unique<data::ExampleDataset>(std::move(eval));
    return d;
  }
  d.packing = dc.packing.value_or(false);
  auto load = [&](const std::string& path) {
    const std::string type = resolve_type(dc, path);
    if (type != "tokens" && type != "text")
      throw Error(fmt::format("the {} file is {} data, but the training file is {}", path, type, d.type),
                  {.file = path});
    return type == "tokens" ? data::read_token_file(path, dc.token_bytes, model_vocab_size)
                            : data::tokenize_text_file(path, tok);
  };
  std::vector<int32_t> train_tokens = load(dc.train), eval_tokens;
  if (!dc.eval.empty()) {
    eval_tokens = load(dc.eval);
  } else if (dc.eval_fraction > 0) {
    // A token stream is split at the tail: windows from either side never share text.
    const size_t split = size_t(double(train_tokens.size()) * (1.0 - dc.eval_fraction));
    eval_tokens.assign(train_tokens.begin() + int64_t(split), train_tokens.end());
    train_tokens.resize(split);
  }
  const int64_t n_train = int64_t(train_tokens.size()), n_eval = int64_t(eval_tokens.size());
  d.train = std::make_unique<data::TokenStreamDataset>(std::move(train_tokens), d.seq_len);
  d.eval = std::make_unique<data::TokenStreamDataset>(std::move(eval_tokens), d.seq_len);
  if (d.train->size() == 0)
    throw Error(fmt::format("{} training tokens make no sequence of seq_len {} + 1", n_train, d.seq_len),
                {.file = dc.train});
  d.report.push_back(fmt::format("{} ({}: {} training tokens, {} held-out tokens)", dc.train, d.type, n_train, n_eval));
  return d;
}

ops::CrossEntropyResult eval_loss_sums(const std::function<ops::CrossEntropyResult(const model::Batch&)>& forward,
                                       const data::Dataset& eval, bool packing, int64_t B, int64_t T,
                                       int64_t max_batches, int32_t pad, int rank, int world_size) {
  if (eval.size() == 0) return {};
  std::vector<int64_t> order(static_cast<size_t>(eval.size()));
  std::iota(order.begin(), order.end(), 0);
  std::vector<std::vector<int64_t>> rows;
  if (packing) {
    rows = data::pack_greedy(order, [&](int64_t i) { return eval.length(i); }, T);
  } else {
    for (const int64_t i : order) rows.push_back({i});
  }
  double sum = 0.0;
  int64_t count = 0;
  // Global batch g holds rows [g B W, (g + 1) B W); rank r evaluates its B of them. Every rank
  // runs the same number of forward passes (they may contain collectives): a rank whose slice of
  // the last batch is empty runs one ignored row.
  const int64_t G = B * world_size, n_rows = int64_t(rows.size());
  for (int64_t g = 0; g < max_batches && g * G < n_rows; ++g) {
    const int64_t begin = std::min(n_rows, g * G + rank * B);
    const int64_t end = std::min(n_rows, begin + B);
    if (begin == end) {
      std::vector<data::Example> none = {{{pad}, {ops::kIgnoreIndex}}};
      (void)forward(data::make_padded_batch(none, T, pad).batch());
      continue;
    }
    const int64_t b0 = begin;
    data::BatchBuffers buf;
    if (packing) {
      std::vector<std::vector<data::Example>> packed;
      for (int64_t r = b0; r < end; ++r) {
        packed.emplace_back();
        for (const int64_t i : rows[size_t(r)]) packed.back().push_back(eval.get(i));
      }
      buf = data::make_packed_batch(packed, T, pad);
    } else {
      std::vector<data::Example> padded;
      for (int64_t r = b0; r < end; ++r) padded.push_back(eval.get(rows[size_t(r)][0]));
      buf = data::make_padded_batch(padded, T, pad);
    }
    const ops::CrossEntropyResult r = forward(buf.batch());
    sum += r.loss_sum;
    count += r.count;
  }
  return {sum, count};
}

namespace {

// Exact-match accuracy of greedy answers to held-out problems.
double task_accuracy(const ModelConfig& cfg, const model::LlamaWeights& w, const data::AdditionTask& task,
                     const data::Tokenizer& tok, int64_t n, int64_t* correct_out) {
  n = std::min(n, task.size());
  infer::Generator gen(cfg, w, data::AdditionTask::max_tokens(9) + 4);
  infer::SamplingOptions greedy;
  greedy.temperature = 0.0f;
  greedy.max_new_tokens = 12;
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t> out = gen.generate(tok.encode_with(task.prompt(i), true, false), greedy, {tok.eos_id()});
    correct += tok.decode(out) == task.answer(i);
  }
  if (correct_out) *correct_out = correct;
  return n ? double(correct) / double(n) : 0.0;
}

}  // namespace

StepResult train_step(ParamStore& params, model::LlamaCompute& model, const std::vector<data::BatchBuffers>& micro,
                      const ops::AdamWConfig& opt, int64_t step, double max_grad_norm) {
  StepResult r;
  for (const data::BatchBuffers& mb : micro) r.tokens += mb.count_targets();
  params.zero_grads();
  double loss_sum = 0.0;
  const float grad_scale = r.tokens ? 1.0f / float(r.tokens) : 0.0f;
  for (const data::BatchBuffers& mb : micro) loss_sum += model.forward_backward(mb.batch(), grad_scale).loss_sum;
  r.loss = r.tokens ? loss_sum / double(r.tokens) : 0.0;
  r.grad_norm = std::sqrt(params.grad_sum_squares());
  params.adamw_step(opt, step, ops::clip_coefficient(r.grad_norm, float(max_grad_norm)));
  return r;
}

TrainResult run_training(const TrainConfig& c) {
  const std::unique_ptr<comm::Communicator> local = comm::make_local_communicator();
  return run_training(c, *local);
}

namespace {
// Ranks sharing this node, for hybrid meshes: what mpirun or Slurm says, else the whole world.
int ranks_per_node(const comm::Communicator& world) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v); s && std::atoi(s) > 0) return std::atoi(s);
  return world.size();
}
}  // namespace

namespace {

// The checkpoint to resume from, opened and checked against this run, or null to start from the
// model. Notes for the log (skipped incomplete checkpoints, "nothing to resume") go to `notes`.
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

// Puts the sampler where the checkpointed run would have read next and returns the checkpoint's
// step. The data order continues exactly when the global batch (rows per step) is unchanged, on
// any world size; a different global batch continues at the same row when it divides the rows read.
int64_t resume_training_state(const ckpt::CheckpointReader& r, const TrainConfig& c, data::DistributedSampler& sampler) {
  const nlohmann::json& t = r.metadata().at("training");
  const uint64_t seed = t.at("seed").get<uint64_t>();
  if (seed != c.seed)
    throw Error(fmt::format("the checkpoint was trained with seed {} but this run's seed is {}: the data order would "
                            "not continue (set seed: {})",
                            seed, c.seed, seed),
                {.file = c.source, .key = "seed"});
  data::SamplerState next{t.at("sampler").at("epoch").get<int64_t>(), t.at("sampler").at("step").get<int64_t>()};
  const int64_t saved_rows = t.at("rows_per_step").get<int64_t>(), rows = sampler.rows_per_step();
  if (saved_rows != rows) {
    const int64_t read = next.step * saved_rows;  // rows of the epoch already trained on
    if (read % rows != 0)
      throw Error(fmt::format("the checkpoint's global batch is {} rows per step and this run's is {}, which does not "
                              "divide the {} rows of epoch {} already read; choose micro_batch_size x "
                              "gradient_accumulation_steps x ranks to match",
                              saved_rows, rows, read, next.epoch),
                  {.file = c.source, .key = "micro_batch_size"});
    next.step = read / rows;
    if (next.step >= sampler.steps_in_epoch(next.epoch)) next = {next.epoch + 1, 0};
  }
  sampler.set_state(next);
  return r.step();
}

// What a checkpoint records about the run that wrote it (for people and for checks on resume).
nlohmann::json run_description(const TrainConfig& c, const shard::ShardingConfig& sharding, int world_size,
                               const shard::Mesh& mesh) {
  return {{"config_file", c.source},
          {"model", c.model},
          {"world_size", world_size},
          {"strategy", shard::strategy_name(sharding.strategy)},
          {"shard_group_size", mesh.shard->size()},
          {"param_dtype", dtype_name(sharding.param_dtype)},
          {"reduce_dtype", dtype_name(sharding.reduce_dtype)},
          {"seq_len", c.seq_len},
          {"micro_batch_size", c.micro_batch_size},
          {"gradient_accumulation_steps", c.gradient_accumulation_steps},
          {"max_steps", c.max_steps},
          {"optimizer",
           {{"lr", c.optimizer.lr},
            {"betas", {c.optimizer.beta1, c.optimizer.beta2}},
            {"eps", c.optimizer.eps},
            {"weight_decay", c.optimizer.weight_decay}}},
          {"lr_scheduler",
           {{"kind", int(c.schedule.kind)},
            {"warmup_steps", c.schedule.warmup_steps},
            {"total_steps", c.schedule.total_steps},
            {"min_lr_ratio", c.schedule.min_lr_ratio}}},
          {"max_grad_norm", c.max_grad_norm},
          {"seed", c.seed}};
}

}  // namespace

TrainResult run_training(const TrainConfig& c, comm::Communicator& world) {
  const bool lead = world.rank() == 0;  // the rank that prints, writes metrics and saves
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  const ModelConfig mcfg = load_hf_config(c.model);
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(c.model);
  if (tok->vocab_size() > mcfg.vocab_size)
    throw Error(fmt::format("the {} tokenizer has {} ids but the model's vocab_size is {}", tok->name(),
                            tok->vocab_size(), mcfg.vocab_size),
                {.file = c.model + "/config.json", .key = "vocab_size"});
  const RunData data = load_run_data(c, *tok, mcfg.vocab_size);
  const int64_t T = data.seq_len, B = c.micro_batch_size;
  if (T > mcfg.max_position_embeddings)
    throw Error(fmt::format("seq_len {} exceeds the model's max_position_embeddings {}", T,
                            mcfg.max_position_embeddings),
                {.file = c.source, .key = "seq_len"});
  if (mcfg.sliding_window > 0 && T > mcfg.sliding_window)
    throw Error(fmt::format("seq_len {} exceeds the model's sliding_window {}, which shardlm does not implement", T,
                            mcfg.sliding_window),
                {.file = c.source, .key = "seq_len"});

  // What the estimator expects this run to hold per rank (docs/memory.md); `sharding_strategy: auto`
  // picks the strategy with it.
  shard::ShardingConfig sharding = c.sharding;
  memory::EstimateInput est_in{.model = mcfg, .sharding = sharding, .world_size = world.size(),
                               .ranks_per_node = ranks_per_node(world), .micro_batch_size = B, .seq_len = T,
                               .grad_accum = c.gradient_accumulation_steps,
                               .checkpoint_every = c.activation_checkpointing};
  std::string auto_why;
  if (sharding.auto_strategy) {
    try {
      sharding.strategy = est_in.sharding.strategy = memory::choose_strategy(est_in, c.max_memory_per_rank, &auto_why);
    } catch (const Error& e) {
      throw Error(e.message(), {.file = c.source, .key = "max_memory_per_rank"});
    }
  }
  if (sharding.offload_params && !sharding.shard_gradients())
    throw Error(fmt::format("CPU offload needs a strategy that shards gradients, and sharding_strategy: auto chose {}",
                            shard::strategy_name(sharding.strategy)),
                {.file = c.source, .key = "offload_params"});
  const memory::Estimate mem_estimate = memory::estimate(est_in);

  // The sharding engine drives every run; one process is world size 1 through the same path.
  // `mesh` is over the CPU world. A GPU run also builds the same mesh over NCCL (the world
  // communicator bootstraps it, and make_mesh's splits give the same groups): device tensors go over
  // NCCL, while the engine's scalar sums and the trainer's own (eval, checkpoint timing) stay on the
  // CPU communicators. The NCCL communicator must exist before any CUDA allocation (it picks the GPU).
  shard::Mesh mesh = shard::make_mesh(world, sharding, ranks_per_node(world));
  std::unique_ptr<comm::Communicator> gpu_world;
  std::optional<shard::Mesh> gpu_mesh;
  if (c.device == Device::CUDA) {
    try {
      gpu_world = comm::make_nccl_communicator(world, comm::local_rank_from_environment());
    } catch (const Error& e) {
      throw Error(e.message(), {.file = c.source, .key = "device"});
    }
    gpu_mesh = shard::make_mesh(*gpu_world, sharding, ranks_per_node(world));
  }
  shard::ShardedModel engine(mcfg, sharding, gpu_mesh ? *gpu_mesh : mesh, gpu_mesh ? &mesh : nullptr);
  // Resuming: the checkpoint is opened and validated (metadata, every file's presence and size) on
  // every rank before anything else, so a bad one is reported before any training.
  std::vector<std::string> resume_notes;
  std::unique_ptr<ckpt::CheckpointReader> resume = open_resume_checkpoint(c, mcfg, resume_notes);
  std::string load_note;
  if (resume) {
    const auto t0 = clock::now();
    const uint64_t bytes = ckpt::load_checkpoint(*resume, engine);  // each rank reads only the ranges it owns
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    load_note = fmt::format("loaded {:.1f} MB of checkpoint state per rank in {:.2f}s ({:.0f} MB/s per rank)",
                            double(bytes) / 1e6, s, double(bytes) / 1e6 / std::max(s, 1e-9));
  } else {
    const io::ModelWeights weights(c.model);
    engine.load(weights, c.model);  // each rank reads only its shard's byte ranges
  }
  model::LlamaCompute model(mcfg, c.compute_dtype, engine.device());
  model.set_checkpointing(c.activation_checkpointing);
  model.reserve(B, T);
  // Full f32 weights on every rank, for generation (built-in task accuracy) and the final save:
  // gathered from the shards (a collective, so every rank runs it).
  auto gather_full = [&]() {
    auto full = std::make_unique<ParamStore>(mcfg, DType::F32, ParamStore::Mode::WeightsOnly);
    for (const std::string& name : engine.names()) engine.gather_tensor(name, full->master(name));
    return full;
  };

  std::unique_ptr<MetricsFile> metrics_file;
  if (lead) {
    std::error_code ec;
    fs::create_directories(c.output_dir, ec);
    if (ec) throw Error(fmt::format("cannot create the output directory: {}", ec.message()), {.file = c.output_dir});
    metrics_file = std::make_unique<MetricsFile>((fs::path(c.output_dir) / c.metrics_file).string());
  }
  auto write_metrics = [&](const nlohmann::json& rec) {
    if (metrics_file) metrics_file->write(rec);
  };
  Progress progress(lead ? c.progress : "none", c.log_every);
  const int32_t pad = tok->eos_id();

  progress.print(fmt::format("shardlm train: {} ({} layers, hidden {}, {:.2f}M parameters) in {}", c.model,
                             mcfg.num_hidden_layers, mcfg.hidden_size, double(parameter_count(mcfg)) / 1e6,
                             dtype_name(c.compute_dtype)));
  progress.print(fmt::format("sharding: {} on {} rank{} (shard groups of {}, {} unit{}), reduce in {}",
                             shard::strategy_name(sharding.strategy), world.size(), world.size() > 1 ? "s" : "",
                             mesh.shard->size(), engine.num_units(), engine.num_units() > 1 ? "s" : "",
                             dtype_name(sharding.reduce_dtype)));
  if (c.device == Device::CUDA)
    progress.print(fmt::format("device: cuda (NCCL for parameters and gradients{})",
                               sharding.offload_params ? "; master weights, gradient shard and AdamW state offloaded "
                                                         "to pinned host memory, AdamW on the CPU"
                                                       : ""));
  if (!auto_why.empty()) progress.print(auto_why);
  progress.print(fmt::format("memory: estimated peak {} per rank over training steps (activations {}, tracked "
                             "buffers only; `shardlm estimate-memory` has the breakdown)",
                             format_bytes(mem_estimate.peak_total),
                             format_bytes(mem_estimate.category_peak[size_t(MemCategory::Activations)])));
  data::SamplerOptions so;
  so.world_size = world.size();
  so.rank = world.rank();
  so.seq_len = T;
  so.packing = data.packing;
  so.micro_batch_size = B;
  so.gradient_accumulation_steps = c.gradient_accumulation_steps;
  so.seed = c.seed;
  so.pad_id = pad;
  data::DistributedSampler sampler(*data.train, so);
  progress.print(fmt::format("data ({}; tokenizer: {}):", data.type, tok->name()));
  for (const std::string& line : data.report) progress.print("  " + line);
  {
    const int64_t rows = int64_t(sampler.epoch_rows(0).size()), truncated = sampler.truncated_in_epoch(0);
    progress.print(fmt::format("  rows: {} {} of {} tokens from {} examples{}; {} steps per epoch of {} rows",
                               rows, data.packing ? "packed rows" : "padded rows", T, data.train->size(),
                               truncated ? fmt::format(" ({} truncated to {} tokens)", truncated, T) : "",
                               sampler.steps_in_epoch(0), sampler.rows_per_step()));
  }
  for (const std::string& note : resume_notes) progress.print(note);
  int64_t start_step = 1;
  if (resume) {
    start_step = resume_training_state(*resume, c, sampler) + 1;
    progress.print(fmt::format("resumed from {} (step {}; data at epoch {}, step {} of the epoch)", resume->dir(),
                               start_step - 1, sampler.state().epoch, sampler.state().step));
    progress.print(load_note);
  }
  progress.print(fmt::format("batch: {} x {} tokens x {} accumulation x {} rank{} = {} tokens per step; {} steps", B, T,
                             c.gradient_accumulation_steps, world.size(), world.size() > 1 ? "s" : "",
                             B * T * c.gradient_accumulation_steps * world.size(), c.max_steps));

  TrainResult result;
  auto evaluate = [&](int64_t step) {
    // The same held-out rows for any world size: each rank evaluates its slice of each global batch.
    const ops::CrossEntropyResult part =
        eval_loss_sums([&](const model::Batch& b) { return engine.forward_loss(model, b); }, *data.eval, data.packing,
                       B, T, c.eval_batches, pad, world.rank(), world.size());
    const double sum = world.all_reduce_sum(part.loss_sum), count = world.all_reduce_sum(double(part.count));
    const double loss = count > 0 ? sum / count : NAN;
    nlohmann::json rec = {{"step", step}, {"eval_loss", loss}};
    std::string line = fmt::format("eval step {}: held-out loss {:.4f}", step, loss);
    double acc = -1;
    if (data.task && c.accuracy_examples > 0) {
      int64_t correct = 0;
      const std::unique_ptr<ParamStore> full = gather_full();
      acc = task_accuracy(mcfg, full->compute_weights(), *data.task, *tok, c.accuracy_examples, &correct);
      rec["eval_accuracy"] = acc;
      line += fmt::format(", accuracy {:.1f}% ({}/{} held-out problems)", 100 * acc, correct,
                          std::min(c.accuracy_examples, data.task->size()));
    }
    memory::add_memory_fields(rec, MemoryTracker::for_device(Device::CPU).stats(), memory::process_memory());
    write_metrics(rec);
    progress.print(line);
    if (step == start_step - 1) {
      result.initial_eval_loss = loss;
      result.initial_accuracy = acc;
    }
    result.eval_loss = loss;
    result.accuracy = acc;
  };
  evaluate(start_step - 1);

  // Checkpoints: by step count, by time (rank 0's clock decides, so every rank agrees), and at the end.
  const std::string ckpt_root = c.checkpoint_root();
  auto last_save = clock::now();
  auto save = [&](int64_t step, const data::SamplerState& next) {
    ckpt::SaveOptions so;
    so.dir = (fs::path(ckpt_root) / ckpt::step_dir_name(step)).string();
    so.step = step;
    so.training = {{"step", step},
                   {"sampler", {{"epoch", next.epoch}, {"step", next.step}}},
                   {"rows_per_step", sampler.rows_per_step()},
                   {"seed", c.seed},
                   {"lr", c.schedule.at(step)}};
    so.run = run_description(c, sharding, world.size(), mesh);
    so.tokenizer_source = c.model;
    const ckpt::SaveReport r = ckpt::save_checkpoint(so, engine, mcfg, world);
    last_save = clock::now();
    if (lead && c.keep_last_n > 0) ckpt::prune_checkpoints(ckpt_root, c.keep_last_n);
    const double mb = double(r.rank_bytes) / 1e6;
    progress.print(fmt::format("checkpoint step {} -> {}: {:.1f} MB from each rank in {:.2f}s ({:.0f} MB/s per rank), "
                               "{:.1f} MB in all, complete after {:.2f}s",
                               step, so.dir, mb, r.rank_seconds, mb / std::max(r.rank_seconds, 1e-9),
                               double(r.total_bytes) / 1e6, r.seconds));
    write_metrics({{"step", step}, {"checkpoint", so.dir}, {"checkpoint_bytes", r.total_bytes},
                   {"checkpoint_seconds", r.seconds}, {"checkpoint_rank_mb_per_s", mb / std::max(r.rank_seconds, 1e-9)}});
  };
  auto save_due = [&](int64_t step) {
    if (!c.saves_checkpoints()) return false;
    if (step == c.max_steps || (c.save_every > 0 && step % c.save_every == 0)) return true;
    if (c.save_every_minutes <= 0) return false;
    const double minutes = std::chrono::duration<double>(clock::now() - last_save).count() / 60.0;
    return world.all_reduce_sum(lead && minutes >= c.save_every_minutes ? 1.0 : 0.0) > 0;
  };

  ops::AdamWConfig opt = c.optimizer;
  const auto t_train = clock::now();
  int64_t tokens_seen = 0;
  // The next step's micro-batches are assembled on a background thread while this one trains.
  // Every micro-batch of a step is built before the step, so the loss can be normalized by the
  // non-ignored tokens of the whole global batch (what one big batch would do). From here on
  // only the prefetch thread touches the sampler.
  data::Prefetcher prefetch([&sampler] { return sampler.next(); });
  for (int64_t step = start_step; step <= c.max_steps; ++step) {
    const data::StepBatch sb = prefetch.next();
    const std::vector<data::BatchBuffers>& micro = sb.micro;
    opt.lr = c.schedule.at(step);
    std::vector<model::Batch> batches;
    for (const data::BatchBuffers& mb : micro) batches.push_back(mb.batch());
    const shard::StepStats sr = engine.train_step(model, batches, opt, step, c.max_grad_norm);
    const double loss = sr.loss, norm = sr.grad_norm;
    if (!std::isfinite(loss)) throw Error(fmt::format("training diverged: loss is {} at step {}", loss, step));
    for (const data::BatchBuffers& mb : micro) tokens_seen += mb.B * mb.T * world.size();

    const double elapsed = std::chrono::duration<double>(clock::now() - t_train).count();
    const MemStats mem_now = MemoryTracker::for_device(Device::CPU).stats();
    const memory::ProcessMemory rss_now = memory::process_memory();
    StepStats s{step, c.max_steps, loss, opt.lr, norm, double(tokens_seen) / elapsed, elapsed,
                memory::memory_brief(mem_now, rss_now)};
    progress.step(s);
    nlohmann::json rec = {{"step", step}, {"loss", loss}, {"lr", opt.lr}, {"grad_norm", norm},
                          {"tokens_per_s", s.tokens_per_s}, {"elapsed_s", elapsed}, {"epoch", sb.state.epoch}};
    memory::add_memory_fields(rec, mem_now, rss_now);  // this rank's (rank 0 writes the file)
    if (c.device == Device::CUDA) {
      const device::CudaMemoryStats g = device::cuda_memory_stats();
      rec["gpu_allocated_peak_bytes"] = g.allocated_peak;
      rec["gpu_reserved_peak_bytes"] = g.reserved_peak;
    }
    write_metrics(rec);
    result.losses.push_back(loss);
    if (step == start_step) result.first_loss = loss;
    result.last_loss = loss;
    result.steps = step;
    if (c.eval_every > 0 && step % c.eval_every == 0 && step != c.max_steps) evaluate(step);
    if (save_due(step)) save(step, sb.next);
  }
  evaluate(c.max_steps);
  result.seconds = std::chrono::duration<double>(clock::now() - t_train).count();
  result.tokens_per_s = double(tokens_seen) / result.seconds;
  progress.finish();

  if (c.saves_checkpoints()) {
    // The final checkpoint streamed into the Hugging Face directory by rank 0, tensor by tensor in
    // small chunks: no rank ever holds the whole model.
    if (lead) {
      ckpt::CheckpointReader final_ckpt((fs::path(ckpt_root) / ckpt::step_dir_name(c.max_steps)).string());
      ckpt::convert_checkpoint(final_ckpt, {.out = c.output_dir, .dtype = c.save_dtype,
                                            .max_shard_bytes = io::parse_size(c.max_shard_size)});
    }
    world.barrier();
  } else {
    // Without checkpoints: gathered to every rank, written by rank 0.
    const std::unique_ptr<ParamStore> full = gather_full();
    if (lead) save_hf_model(c.output_dir, mcfg, *full, c.save_dtype, io::parse_size(c.max_shard_size), c.model);
    world.barrier();
  }
  // Every rank takes part in gathering the table's figures; rank 0 prints it.
  MemStats est_stats;
  est_stats.peak = mem_estimate.category_peak;
  est_stats.peak_total = mem_estimate.peak_total;
  const std::vector<std::string> mem_table = memory::memory_summary(
      MemoryTracker::for_device(Device::CPU).stats(), memory::process_memory(), world, &est_stats);
  progress.print(fmt::format("done: {} steps in {}, {:.0f} tokens/s; loss {:.4f} -> {:.4f}; held-out loss {:.4f} -> {:.4f}",
                             result.steps, format_duration(result.seconds), result.tokens_per_s, result.first_loss,
                             result.last_loss, result.initial_eval_loss, result.eval_loss));
  for (const std::string& line : mem_table) progress.print(line);
  if (c.device == Device::CUDA) {
    // The GPU's own figures: the tracker's requested bytes per category and the caching allocator's
    // rounded and reserved bytes (what nvidia-smi would show, less the CUDA context).
    const MemStats g = MemoryTracker::for_device(Device::CUDA).stats();
    const device::CudaMemoryStats a = device::cuda_memory_stats();
    progress.print(fmt::format("gpu memory (this rank): peak tracked {} (parameters {}, gradients {}, optimizer {}, "
                               "activations {}, communication {}, workspace {}); allocator peak allocated {}, "
                               "peak reserved {}",
                               format_bytes(g.peak_total), format_bytes(g.peak[size_t(MemCategory::Parameters)]),
                               format_bytes(g.peak[size_t(MemCategory::Gradients)]),
                               format_bytes(g.peak[size_t(MemCategory::Optimizer)]),
                               format_bytes(g.peak[size_t(MemCategory::Activations)]),
                               format_bytes(g.peak[size_t(MemCategory::Communication)]),
                               format_bytes(g.peak[size_t(MemCategory::Workspace)]), format_bytes(a.allocated_peak),
                               format_bytes(a.reserved_peak)));
    result.gpu_peak_reserved_bytes = a.reserved_peak;
  }
  progress.print(c.saves_checkpoints()
                     ? std::string("  (the estimate covers training steps; the measured peaks also cover loading, "
                                   "evaluation and the final save, streamed from the last checkpoint by rank 0)")
                     : fmt::format("  (the estimate covers training steps; the measured peaks also cover loading, "
                                   "evaluation and the final save, which gathers the whole model in f32 on every "
                                   "rank: up to {})",
                                   format_bytes(mem_estimate.save_gather_bytes)));
  progress.print(fmt::format("saved the trained model to {} ({} total {:.1f}s)", c.output_dir,
                             dtype_name(c.save_dtype), std::chrono::duration<double>(clock::now() - t_start).count()));
  return result;
}

}  // namespace shardlm::train
