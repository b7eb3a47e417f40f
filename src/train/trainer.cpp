#include "train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "core/device.h"
#include "core/rng.h"
#include "core/timeline.h"
#include "data/run_data.h"
#include "data/sampler.h"
#include "io/atomic_file.h"
#include "io/json_integer.h"
#include "io/model_files.h"
#include "memory/estimator.h"
#include "memory/usage.h"
#include "model/hf_dir.h"
#include "model/llama.h"
#include "model/nf4_loader.h"
#include "model/peft_adapter.h"
#include "report/html_report.h"
#include "report/tensorboard.h"
#include "shard/engine.h"
#include "train/evaluation.h"
#include "train/progress.h"
#include "train/resume.h"
#include "train/stop_signal.h"

namespace shardlm::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

TrainResult run_training(const TrainConfig& c) {
  const std::unique_ptr<comm::Communicator> local = comm::make_local_communicator();
  return run_training(c, *local);
}

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Ranks sharing this node, for hybrid meshes: what mpirun or srun says, else the whole world.
int ranks_per_node(const comm::Communicator& world) {
  const int n = comm::ranks_per_node_from_environment();
  return n > 0 ? n : world.size();
}

// ---- the parts of a run ------------------------------------------------------------------------


// Rank 0 prints and writes metrics.jsonl; the other ranks stay quiet. Every record goes one way,
// through write(): to metrics.jsonl, to the TensorBoard event file with report_to: tensorboard, and
// into the series report.html draws at the end (finish()).
class Reporter {
 public:
  Reporter(const TrainConfig& c, bool lead)
      : progress_(lead ? c.progress : ProgressMode::None, c.log_every), lead_(lead),
        metrics_path_((fs::path(c.output_dir) / c.metrics_file).string()),
        report_path_((fs::path(c.output_dir) / "report.html").string()),
        tensorboard_dir_(c.report_tensorboard ? c.tensorboard_dir() : "") {
    if (!lead) return;
    std::error_code ec;
    fs::create_directories(c.output_dir, ec);
    if (ec) throw Error(fmt::format("cannot create the output directory: {}", ec.message()), {.file = c.output_dir});
  }
  void print(const std::string& line) { progress_.print(line); }
  // The metrics file and the event file are opened (and a previous run's metrics truncated) at the
  // first record, so a run refused while loading leaves output_dir as it was.
  void write(const nlohmann::json& rec) {
    if (!lead_) return;
    if (!metrics_) metrics_ = std::make_unique<MetricsFile>(metrics_path_);
    metrics_->write(rec);
    if (!tensorboard_dir_.empty()) {
      if (!events_) events_ = std::make_unique<report::EventWriter>(tensorboard_dir_);
      events_->record(rec);
    }
    report_.add(rec);
  }
  // The end of a run (finished or stopped by a signal): report.html from the records written.
  void finish(const std::vector<std::string>& notes) {
    if (!lead_ || report_.empty()) return;
    report::write_html(report_path_, report_.page("shardlm training report", notes));
    progress_.print(fmt::format("report: {}{}", report_path_,
                                events_ ? fmt::format("; TensorBoard events: {} (tensorboard --logdir {})",
                                                      events_->path(), tensorboard_dir_)
                                        : ""));
  }
  Progress& progress() { return progress_; }

 private:
  Progress progress_;
  bool lead_;
  std::string metrics_path_, report_path_, tensorboard_dir_;
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<report::EventWriter> events_;
  report::TrainingReport report_;
};

// One training run, in parts: setup (inputs, memory plan, mesh and engine, data order), then the
// loop of train_step, with evaluation, checkpoints and reporting beside it, then the final save.
class Trainer {
 public:
  Trainer(const TrainConfig& c, comm::Communicator& world);
  TrainResult run();

 private:
  void load_or_resume();
  void print_setup();
  void skip_or_stop(int64_t step, const shard::StepStats& s);
  void log_step(int64_t step, const shard::StepStats& s, const data::StepBatch& sb, const comm::CommTiming& before);
  void write_timeline();
  void report_communication();
  void evaluate(int64_t step);
  bool save_due(int64_t step);
  bool stop_requested();
  void stop_on_signal(int64_t step, const data::SamplerState& next, bool saved_now);
  void save_checkpoint(int64_t step, const data::SamplerState& next);
  void save_model();
  void report_memory();
  std::vector<std::string> report_notes() const;

  const TrainConfig& c_;
  comm::Communicator& world_;
  const bool lead_;
  const Clock::time_point t_start_ = Clock::now();
  RunInputs in_;
  MemoryPlan mem_;
  shard::Mesh mesh_;
  shard::ShardedModel engine_;
  model::LlamaCompute model_;
  Reporter out_;
  data::DistributedSampler sampler_;
  std::vector<std::string> resume_notes_;
  std::unique_ptr<ckpt::CheckpointReader> resume_;
  std::string load_note_;
  int64_t start_step_ = 1, tokens_seen_ = 0, skipped_in_a_row_ = 0;
  double flops_per_token_ = 0;  // model FLOPs of one trained token (model/config.h), for model_flops_per_s
  Clock::time_point t_train_, last_save_;
  TrainResult result_;
};

data::SamplerOptions sampler_options(const TrainConfig& c, const RunInputs& in, const comm::Communicator& world) {
  data::SamplerOptions so;
  so.world_size = world.size();
  so.rank = world.rank();
  so.seq_len = in.T;
  so.packing = in.data.packing;
  so.micro_batch_size = in.B;
  so.gradient_accumulation_steps = c.gradient_accumulation_steps;
  so.seed = c.seed;
  so.pad_id = in.tok->eos_id();
  return so;
}

// The members are built in order: the inputs, the memory plan, the mesh (on GPU runs its NCCL
// groups pick the GPU, before any CUDA allocation), the engine, the model's compute on the
// engine's device, the reporter and the sampler.
Trainer::Trainer(const TrainConfig& c, comm::Communicator& world)
    : c_(c),
      world_(world),
      lead_(world.rank() == 0),
      in_(load_inputs(c)),
      mem_(plan_memory(c, in_, world.size(), ranks_per_node(world))),
      mesh_([&] {
        try {
          return shard::make_mesh(world, mem_.sharding, ranks_per_node(world), c.device);
        } catch (const Error& e) {
          if (c.device != Device::CUDA) throw;
          throw Error(e.message(), {.file = c.source, .key = "device"});
        }
      }()),
      engine_(in_.model, mem_.sharding, mesh_),
      model_(in_.model, c.compute_dtype, engine_.device()),
      out_(c, lead_),
      sampler_(*in_.data.train, sampler_options(c, in_, world)) {
  load_or_resume();
  flops_per_token_ = training_flops_per_token(in_.model, in_.T);
  model_.set_checkpointing(c.activation_checkpointing);
  model_.reserve(in_.B, in_.T);
}

// Resuming: the checkpoint is opened and validated (metadata, every file's presence and size) on
// every rank before anything else, so a bad one is reported before any training. Either way each
// rank reads only the ranges it owns.
void Trainer::load_or_resume() {
  resume_ = open_resume_checkpoint(c_, in_.model, resume_notes_);
  // A LoRA run's checkpoint holds only the adapters: the frozen base always comes from the model.
  if (!resume_ || in_.model.lora) {
    const io::ModelWeights weights(c_.model);
    engine_.load(weights, c_.model, c_.seed);
  }
  if (!resume_) return;
  const auto t0 = Clock::now();
  const uint64_t bytes = ckpt::load_checkpoint(*resume_, engine_);
  const double s = seconds_since(t0);
  load_note_ = fmt::format("loaded {:.1f} MB of checkpoint state per rank in {:.2f}s ({:.0f} MB/s per rank)",
                           double(bytes) / 1e6, s, double(bytes) / 1e6 / std::max(s, 1e-9));
  start_step_ = load_training_state(*resume_, c_, sampler_) + 1;
}

void Trainer::print_setup() {
  const ModelConfig& m = in_.model;
  const shard::ShardingConfig& sc = mem_.sharding;
  const int W = world_.size(), units = engine_.num_units();
  out_.print(fmt::format("shardlm train: {} ({} layers, hidden {}, {:.2f}M parameters) in {}", c_.model,
                         m.num_hidden_layers, m.hidden_size, double(parameter_count(m)) / 1e6,
                         dtype_name(c_.compute_dtype)));
  out_.print(fmt::format("sharding: {} on {} rank{} (shard groups of {}, {} unit{}), reduce in {}",
                         shard::strategy_name(sc.strategy), W, W > 1 ? "s" : "", mesh_.shard->size(), units,
                         units > 1 ? "s" : "", dtype_name(sc.reduce_dtype)));
  if (const std::string launcher = comm::describe_launcher(); W > 1 && !launcher.empty())
    out_.print("ranks: started by " + launcher);
  if (m.lora) {
    const int64_t trainable = mem_.estimate.trainable_params, all = parameter_count(m);
    out_.print(fmt::format("{}: rank {}, alpha {} (scale {:.4g}{}), dropout {}, on {}; trainable params: {} || all "
                           "params: {} || trainable%: {:.4f}",
                           m.nf4_base ? "QLoRA" : "LoRA", m.lora->rank, m.lora->alpha, m.lora->scale(),
                           m.lora->use_rslora ? ", rsLoRA" : "", m.lora->dropout,
                           fmt::join(model::expand_lora_targets(m.lora->target_modules), " "), trainable, all,
                           100.0 * double(trainable) / double(all)));
    if (m.nf4_base)
      out_.print(fmt::format("base: Linear weights in NF4 (bitsandbytes' layout{}), dequantized to {} for each use; "
                             "norms, embedding and lm_head in {}",
                             m.nf4_double_quant ? ", double quantization" : "", dtype_name(mem_.sharding.param_dtype),
                             dtype_name(mem_.sharding.param_dtype)));
  }
  if (!in_.base_note.empty()) out_.print(in_.base_note);
  if (c_.device == Device::CUDA)
    out_.print(fmt::format("device: cuda (NCCL for parameters and gradients{})",
                           sc.offload_params ? "; master weights, gradient shard and AdamW state offloaded to pinned "
                                               "host memory, AdamW on the CPU"
                                             : ""));
  if (!mem_.auto_why.empty()) out_.print(mem_.auto_why);
  out_.print(fmt::format("memory: estimated peak {} per rank over training steps (activations {}, tracked "
                         "buffers only; `shardlm estimate-memory` has the breakdown)",
                         format_bytes(mem_.estimate.peak_total),
                         format_bytes(mem_.estimate.category_peak[size_t(MemCategory::Activations)])));
  out_.print(fmt::format("data ({}; tokenizer: {}):", in_.data.type, in_.tok->name()));
  for (const std::string& line : in_.data.report) out_.print("  " + line);
  const int64_t rows = int64_t(sampler_.epoch_rows(0).size()), truncated = sampler_.truncated_in_epoch(0);
  out_.print(fmt::format("  rows: {} {} of {} tokens from {} examples{}; {} steps per epoch of {} rows", rows,
                         in_.data.packing ? "packed rows" : "padded rows", in_.T, in_.data.train->size(),
                         truncated ? fmt::format(" ({} truncated to {} tokens)", truncated, in_.T) : "",
                         sampler_.steps_in_epoch(0), sampler_.rows_per_step()));
  for (const std::string& note : resume_notes_) out_.print(note);
  if (resume_) {
    out_.print(fmt::format("resumed from {} (step {}; data at epoch {}, step {} of the epoch)", resume_->dir(),
                           start_step_ - 1, sampler_.state().epoch, sampler_.state().step));
    out_.print(load_note_);
  }
  out_.print(fmt::format("batch: {} x {} tokens x {} accumulation x {} rank{} = {} tokens per step; {} steps", in_.B,
                         in_.T, c_.gradient_accumulation_steps, W, W > 1 ? "s" : "",
                         in_.B * in_.T * c_.gradient_accumulation_steps * W, c_.max_steps));
}

TrainResult Trainer::run() {
  print_setup();
  evaluate(start_step_ - 1);
  // The next step's micro-batches are assembled on a background thread while this one trains.
  // Every micro-batch of a step is built before the step, so the loss is normalized by the
  // non-ignored tokens of the whole global batch. From here on only that thread touches the sampler.
  data::Prefetcher prefetch([this] { return sampler_.next(); });
  t_train_ = last_save_ = Clock::now();
  for (int64_t step = start_step_; step <= c_.max_steps; ++step) {
    if (!c_.profile_steps.empty() && step == c_.profile_steps[0]) timeline::start();
    // Ended (reset) before the window's trace is written.
    std::optional<timeline::Span> step_span(std::in_place, [&] { return fmt::format("step {}", step); }, "step");
    const data::StepBatch sb = [&] {
      const timeline::Span span("data wait", "data");
      return prefetch.next();
    }();
    std::vector<model::Batch> micro;
    for (const data::BatchBuffers& mb : sb.micro) micro.push_back(mb.batch());
    if (in_.model.lora && in_.model.lora->dropout > 0)  // LoRA dropout: a mask stream per micro-batch and rank
      for (size_t i = 0; i < micro.size(); ++i)
        micro[i].dropout_key = stream_id(fmt::format("lora_dropout/{}/{}/{}/{}", c_.seed, step, i, world_.rank())) | 1;
    ops::AdamWConfig opt = c_.optimizer;
    opt.lr = c_.schedule.at(step);
    const comm::CommTiming comm_before = comm::timing();
    const shard::StepStats s = engine_.train_step(model_, micro, opt, step, c_.max_grad_norm);
    if (!s.finite) skip_or_stop(step, s);
    log_step(step, s, sb, comm_before);
    step_span.reset();
    if (timeline::recording() && (step == c_.profile_steps[1] || step == c_.max_steps)) write_timeline();
    if (c_.eval_every > 0 && step % c_.eval_every == 0 && step != c_.max_steps) evaluate(step);
    const bool saved = save_due(step);
    if (saved) save_checkpoint(step, sb.next);
    if (c_.save_on_signal && stop_requested()) {
      if (timeline::recording()) write_timeline();
      stop_on_signal(step, sb.next, saved);
      return result_;
    }
  }
  evaluate(c_.max_steps);
  result_.seconds = seconds_since(t_train_);
  result_.tokens_per_s = double(tokens_seen_) / result_.seconds;
  out_.progress().finish();
  report_communication();
  save_model();
  report_memory();
  out_.finish(report_notes());
  return result_;
}

// A step whose loss or gradient norm is NaN or Inf took no optimizer step (the engine saw to it);
// on_nonfinite says whether the run goes on.
void Trainer::skip_or_stop(int64_t step, const shard::StepStats& s) {
  const std::string what = fmt::format("step {}: the loss is {} and the gradient norm {}{}", step, s.loss, s.grad_norm,
                                       s.nonfinite.empty() ? std::string(" (every gradient is finite)")
                                                           : "; the first non-finite gradient is " + s.nonfinite);
  if (c_.on_nonfinite == NonFinitePolicy::Stop)
    throw Error(what + " (on_nonfinite: skip would skip such steps)", {.file = c_.source, .key = "on_nonfinite"});
  if (++skipped_in_a_row_ > c_.max_skipped_steps)
    throw Error(fmt::format("{}: {} non-finite steps in a row", what, skipped_in_a_row_),
                {.file = c_.source, .key = "max_skipped_steps"});
  ++result_.skipped_steps;
  out_.print(what + ": skipped (weights and optimizer state unchanged)");
}

void Trainer::log_step(int64_t step, const shard::StepStats& s, const data::StepBatch& sb,
                       const comm::CommTiming& before) {
  if (s.finite) skipped_in_a_row_ = 0;
  for (const data::BatchBuffers& mb : sb.micro) tokens_seen_ += mb.B * mb.T * world_.size();
  const double elapsed = seconds_since(t_train_), lr = c_.schedule.at(step);
  const MemStats mem_now = MemoryTracker::for_device(Device::CPU).stats();
  const memory::ProcessMemory rss_now = memory::process_memory();
  ProgressLine line{step, c_.max_steps, s.loss, lr, s.grad_norm, double(tokens_seen_) / elapsed, elapsed,
                    memory::memory_brief(mem_now, rss_now)};
  out_.progress().step(line);
  nlohmann::json rec = {{"step", step}, {"loss", s.loss}, {"lr", lr}, {"grad_norm", s.grad_norm},
                        {"tokens_per_s", line.tokens_per_s}, {"elapsed_s", elapsed}, {"epoch", sb.state.epoch}};
  // Model FLOPs per second over the run so far, all ranks (model/config.h's accounting), and MFU
  // against the peak the config states.
  const double flops_per_s = flops_per_token_ * line.tokens_per_s;
  rec["model_flops_per_s"] = flops_per_s;
  if (c_.peak_flops > 0) rec["mfu"] = flops_per_s / (c_.peak_flops * world_.size());
  if (!s.finite) {
    // JSON has no NaN: a skipped step's loss and norm are recorded as null.
    rec["loss"] = nullptr;
    rec["grad_norm"] = nullptr;
    rec["skipped"] = true;
  }
  memory::add_memory_fields(rec, mem_now, rss_now);  // this rank's (rank 0 writes the file)
  if (world_.size() > 1 && c_.device == Device::CPU) {
    // This rank's step: seconds with a collective in flight, and seconds it waited on one.
    const comm::CommTiming now = comm::timing();
    rec["comm_busy_s"] = now.busy_seconds - before.busy_seconds;
    rec["comm_wait_s"] = now.waited_seconds - before.waited_seconds;
  }
  if (c_.device == Device::CUDA) {
    const device::CudaMemoryStats g = device::cuda_memory_stats();
    rec["gpu_allocated_peak_bytes"] = g.allocated_peak;
    rec["gpu_reserved_peak_bytes"] = g.reserved_peak;
  }
  out_.write(rec);
  result_.losses.push_back(s.loss);
  result_.grad_norms.push_back(s.grad_norm);
  if (step == start_step_) result_.first_loss = s.loss;
  result_.last_loss = s.loss;
  result_.steps = step;
}

// The profile window's timeline: every rank writes its own trace (atomically).
void Trainer::write_timeline() {
  timeline::stop();
  const fs::path dir = fs::path(c_.output_dir) / "trace";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create the trace directory: {}", ec.message()), {.file = dir.string()});
  io::write_text_atomic((dir / fmt::format("rank{}.json", world_.rank())).string(), timeline::chrome_trace_json(world_.rank()));
  out_.print(fmt::format("timeline of steps {}-{} written to {}/rank*.json (one per rank; open in ui.perfetto.dev "
                         "or chrome://tracing)",
                         c_.profile_steps[0], c_.profile_steps[1], dir.string()));
}

// How much of the run's communication ran behind compute (rank 0's view; CPU ranks over MPI).
void Trainer::report_communication() {
  const comm::CommTiming t = comm::timing();
  if (world_.size() == 1 || c_.device != Device::CPU || t.busy_seconds <= 0) return;
  out_.print(fmt::format("communication: {:.1f}s with collectives in flight, {:.1f}s waited on them: {:.0f}% hidden "
                         "behind compute",
                         t.busy_seconds, t.waited_seconds, 100 * t.hidden_share()));
}

// Held-out loss and, for a built-in task, accuracy (evaluation.h), recorded and printed.
void Trainer::evaluate(int64_t step) {
  const EvalResult e = train::evaluate(engine_, model_, in_, c_, world_);
  const double loss = e.loss, acc = e.accuracy;
  nlohmann::json rec = {{"step", step}, {"eval_loss", loss}};
  std::string line = fmt::format("eval step {}: held-out loss {:.4f}", step, loss);
  if (acc >= 0) {
    rec["eval_accuracy"] = acc;
    line += fmt::format(", accuracy {:.1f}% ({}/{} held-out problems)", 100 * acc, e.correct, e.problems);
  }
  memory::add_memory_fields(rec, MemoryTracker::for_device(Device::CPU).stats(), memory::process_memory());
  out_.write(rec);
  out_.print(line);
  if (step == start_step_ - 1) {
    result_.initial_eval_loss = loss;
    result_.initial_accuracy = acc;
  }
  result_.eval_loss = loss;
  result_.accuracy = acc;
}

// Whether any rank got a stop signal: every rank learns it at the same step (one scalar sum).
bool Trainer::stop_requested() { return world_.all_reduce_sum(stop_signal_received() ? 1.0 : 0.0) > 0; }

// Preemption: the step is done; checkpoint it (unless that just happened) and end cleanly.
void Trainer::stop_on_signal(int64_t step, const data::SamplerState& next, bool saved_now) {
  out_.progress().finish();
  result_.stopped_by_signal = true;
  result_.seconds = seconds_since(t_train_);
  result_.tokens_per_s = double(tokens_seen_) / result_.seconds;
  if (!c_.saves_checkpoints()) {
    out_.print(fmt::format("stopped by a signal after step {}: nothing was saved (no checkpointing configured: set "
                           "save_every or save_every_minutes to make a stop resumable)",
                           step));
    return;
  }
  if (!saved_now) save_checkpoint(step, next);
  out_.print(fmt::format("stopped by a signal after step {}: checkpoint {} is complete; continue with the same config "
                         "and resume_from=auto",
                         step, (fs::path(c_.checkpoint_root()) / ckpt::step_dir_name(step)).string()));
  out_.finish(report_notes());
}

// The lines under report.html's title: what ran, and how it ended.
std::vector<std::string> Trainer::report_notes() const {
  const int W = world_.size();
  const TrainResult& r = result_;
  std::vector<std::string> notes = {
      fmt::format("model {} ({:.2f}M parameters{}), {} on {} rank{}, {} x {} tokens x {} accumulation per rank and step",
                  c_.model, double(parameter_count(in_.model)) / 1e6, in_.model.lora ? ", LoRA" : "",
                  shard::strategy_name(mem_.sharding.strategy), W, W > 1 ? "s" : "", in_.B, in_.T,
                  c_.gradient_accumulation_steps),
      fmt::format("{} steps{} in {}, {:.0f} tokens/s; loss {:.4f} -> {:.4f}; held-out loss {:.4f} -> {:.4f}", r.steps,
                  r.stopped_by_signal ? " (stopped by a signal)" : "", format_duration(r.seconds), r.tokens_per_s,
                  r.first_loss, r.last_loss, r.initial_eval_loss, r.eval_loss),
      fmt::format("output: {} (records: {})", c_.output_dir, c_.metrics_file)};
  return notes;
}

// Checkpoints: by step count, by time (rank 0's clock decides, so every rank agrees), and at the end.
bool Trainer::save_due(int64_t step) {
  if (!c_.saves_checkpoints()) return false;
  if (step == c_.max_steps || (c_.save_every > 0 && step % c_.save_every == 0)) return true;
  if (c_.save_every_minutes <= 0) return false;
  const bool late = lead_ && seconds_since(last_save_) / 60.0 >= c_.save_every_minutes;
  return world_.all_reduce_sum(late ? 1.0 : 0.0) > 0;
}

void Trainer::save_checkpoint(int64_t step, const data::SamplerState& next) {
  const std::string root = c_.checkpoint_root();
  ckpt::SaveOptions so;
  so.dir = (fs::path(root) / ckpt::step_dir_name(step)).string();
  so.step = step;
  so.training = TrainingState{step, next, sampler_.rows_per_step(), c_.seed, c_.schedule.at(step)};
  so.run = run_description(c_, mem_.sharding, world_.size(), mesh_);
  so.tokenizer_source = c_.model;
  const ckpt::SaveReport r = ckpt::save_checkpoint(so, engine_, in_.model, world_);
  last_save_ = Clock::now();
  if (lead_ && c_.keep_last_n > 0) ckpt::prune_checkpoints(root, c_.keep_last_n);
  const double mb = double(r.rank_bytes) / 1e6, rate = mb / std::max(r.rank_seconds, 1e-9);
  out_.print(fmt::format("checkpoint step {} -> {}: {:.1f} MB from each rank in {:.2f}s ({:.0f} MB/s per rank), "
                         "{:.1f} MB in all, complete after {:.2f}s",
                         step, so.dir, mb, r.rank_seconds, rate, double(r.total_bytes) / 1e6, r.seconds));
  out_.write({{"step", step}, {"checkpoint", so.dir}, {"checkpoint_bytes", r.total_bytes},
              {"checkpoint_seconds", r.seconds}, {"checkpoint_rank_mb_per_s", rate}});
}

// The trained model as a Hugging Face directory, streamed: from the final checkpoint by rank 0
// when there is one, else gathered from the engine one unit at a time. No rank ever holds the
// whole model.
void Trainer::save_model() {
  // A LoRA run writes its adapters as a PEFT directory, output_dir/adapter, and with merge_on_save
  // also the merged model, output_dir/merged.
  const std::string out = in_.model.lora ? (fs::path(c_.output_dir) / "adapter").string() : c_.output_dir;
  const ckpt::ConvertOptions opt{.out = out, .dtype = c_.save_dtype, .max_shard_bytes = io::parse_size(c_.max_shard_size)};
  if (c_.saves_checkpoints()) {
    if (lead_) {
      ckpt::CheckpointReader final_ckpt((fs::path(c_.checkpoint_root()) / ckpt::step_dir_name(c_.max_steps)).string());
      ckpt::convert_checkpoint(final_ckpt, opt);
    }
    world_.barrier();
  } else {
    ckpt::export_model(engine_, in_.model, opt, c_.model, world_);
  }
  if (in_.model.lora && c_.merge_on_save) {
    if (lead_) {
      const MergeReport r = merge_peft_adapter({.base = c_.model, .adapter = out,
                                                .out = (fs::path(c_.output_dir) / "merged").string(),
                                                .dtype = c_.save_dtype, .max_shard_bytes = opt.max_shard_bytes});
      out_.print(fmt::format("merge_on_save: merged {} weights (W + {:.4g} B A) into {}/merged{}", r.merged,
                             r.spec.scale(), c_.output_dir,
                             r.dequantized > 0 ? " (merged into the dequantized NF4 weights of the bitsandbytes 4-bit "
                                                 "base, as training saw them; a plain model)"
                             : in_.model.nf4_base ? " (into the base as stored in the model directory, not its NF4 "
                                                    "rounding that training saw)"
                                                  : ""));
    }
    world_.barrier();
  }
}

// Every rank takes part in gathering the table's figures; rank 0 prints it.
void Trainer::report_memory() {
  MemStats est_stats;
  est_stats.peak = mem_.estimate.category_peak;
  est_stats.peak_total = mem_.estimate.peak_total;
  const std::vector<std::string> table = memory::memory_summary(MemoryTracker::for_device(Device::CPU).stats(),
                                                                memory::process_memory(), world_, &est_stats);
  const TrainResult& r = result_;
  out_.print(fmt::format("done: {} steps in {}, {:.0f} tokens/s; loss {:.4f} -> {:.4f}; held-out loss {:.4f} -> {:.4f}",
                         r.steps, format_duration(r.seconds), r.tokens_per_s, r.first_loss, r.last_loss,
                         r.initial_eval_loss, r.eval_loss));
  for (const std::string& line : table) out_.print(line);
  if (c_.device == Device::CUDA) {
    // The GPU's own figures: the tracker's requested bytes per category and the caching allocator's
    // rounded and reserved bytes (what nvidia-smi would show, less the CUDA context).
    const MemStats g = MemoryTracker::for_device(Device::CUDA).stats();
    const device::CudaMemoryStats a = device::cuda_memory_stats();
    out_.print(fmt::format("gpu memory (this rank): peak tracked {} (parameters {}, gradients {}, optimizer {}, "
                           "activations {}, communication {}, workspace {}); allocator peak allocated {}, peak reserved {}",
                           format_bytes(g.peak_total), format_bytes(g.peak[size_t(MemCategory::Parameters)]),
                           format_bytes(g.peak[size_t(MemCategory::Gradients)]),
                           format_bytes(g.peak[size_t(MemCategory::Optimizer)]),
                           format_bytes(g.peak[size_t(MemCategory::Activations)]),
                           format_bytes(g.peak[size_t(MemCategory::Communication)]),
                           format_bytes(g.peak[size_t(MemCategory::Workspace)]), format_bytes(a.allocated_peak),
                           format_bytes(a.reserved_peak)));
    result_.gpu_peak_reserved_bytes = a.reserved_peak;
  }
  out_.print(fmt::format("  (the estimate covers training steps; the measured peaks also cover loading, evaluation and "
                         "the final save, {} one unit at a time: up to {} for the largest)",
                         c_.saves_checkpoints() ? "streamed from the last checkpoint by rank 0, read"
                                                : "gathered from the shards",
                         format_bytes(mem_.estimate.save_gather_bytes)));
  out_.print(fmt::format("saved the trained {} to {} ({} total {:.1f}s)",
                         in_.model.lora ? "LoRA adapter (PEFT format)" : "model",
                         in_.model.lora ? (fs::path(c_.output_dir) / "adapter").string() : c_.output_dir,
                         dtype_name(c_.save_dtype), seconds_since(t_start_)));
}

}  // namespace

TrainResult run_training(const TrainConfig& config, comm::Communicator& world) {
  // A DeepSpeed train_batch_size completes or checks the batch shape once the world is known.
  const TrainConfig c = with_batch_size(config, world.size());
  comm::set_collective_timeout(c.collective_timeout);
  const StopSignalGuard signals(c.save_on_signal);
  return Trainer(c, world).run();
}

}  // namespace shardlm::train
