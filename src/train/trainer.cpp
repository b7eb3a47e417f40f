#include "train/trainer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "core/rng.h"
#include "core/timeline.h"
#include "data/sampler.h"
#include "io/dir_lock.h"
#include "io/model_files.h"
#include "model/peft_adapter.h"
#include "shard/engine.h"
#include "shard/load.h"
#include "train/evaluation.h"
#include "train/preference.h"
#include "train/preflight.h"
#include "train/reporting.h"
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

// The test hook behind the restart test (tests/scripts/restart_cli.sh): with
// SHARDLM_TEST_KILL_RANK_AT_STEP=R:S[:MARKER], world rank R kills itself (SIGKILL, as the OOM killer
// or a lost node would) once step S is done. With MARKER, only if that file does not exist yet; the
// rank creates it first, so a restarted job that passes step S again runs on.
void kill_rank_at_step(int rank, int64_t step) {
  const char* v = std::getenv("SHARDLM_TEST_KILL_RANK_AT_STEP");
  if (!v) return;
  int r = -1;
  long long s = -1;
  int marker_at = 0;
  if (std::sscanf(v, "%d:%lld%n", &r, &s, &marker_at) < 2 || r != rank || s != step) return;
  if (v[marker_at] == ':') {
    const int fd = ::open(v + marker_at + 1, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) return;  // already fired once (or the marker cannot be made: then never)
    ::close(fd);
  }
  std::raise(SIGKILL);
}

// Ranks sharing this node, for hybrid meshes: what mpirun or srun says, else the whole world.
int ranks_per_node(const comm::Communicator& world) {
  const int n = comm::ranks_per_node_from_environment();
  return n > 0 ? n : world.size();
}

// One training run, in parts: setup (inputs, memory plan, mesh and engine, data order), then the
// loop of train_step, with evaluation, checkpoints and reporting beside it, then the final save.
class Trainer {
 public:
  Trainer(const TrainConfig& c, comm::Communicator& world);
  TrainResult run();

 private:
  void load_or_resume();
  void skip_or_stop(int64_t step, const shard::StepStats& s);
  void log_step(int64_t step, const shard::StepStats& s, const data::StepBatch& sb, const comm::CommTiming& before);
  void evaluate(int64_t step);
  bool save_due(int64_t step);
  bool stop_requested();
  void stop_on_signal(int64_t step, const data::SamplerState& next, bool saved_now);
  void save_checkpoint(int64_t step, const data::SamplerState& next);
  void complete_save();
  void save_model();

  const TrainConfig& c_;
  comm::Communicator& world_;
  const bool lead_;
  const Clock::time_point t_start_ = Clock::now();
  RunInputs in_;
  MemoryPlan mem_;
  shard::Mesh mesh_;
  shard::ShardedModel engine_;
  model::LlamaCompute model_;
  // DPO (a dpo: section): the reference's row losses and the loss at the engine's head stage.
  std::unique_ptr<ReferenceModel> reference_;
  std::unique_ptr<DpoObjective> dpo_;
  io::DirLock output_lock_;  // rank 0 holds output_dir from the end of setup to the run's end (io/dir_lock.h)
  ckpt::CheckpointSaver saver_;  // after engine_ and the lock: a write in flight ends before either goes
  Reporter out_;
  data::DistributedSampler sampler_;
  std::vector<std::string> resume_notes_;
  std::unique_ptr<ckpt::CheckpointReader> resume_;
  int64_t start_step_ = 1, tokens_seen_ = 0, skipped_in_a_row_ = 0;
  Clock::time_point t_train_, last_save_;
  TrainResult result_;
};

data::SamplerOptions sampler_options(const TrainConfig& c, const RunInputs& in, const comm::Communicator& world) {
  data::SamplerOptions so;
  so.world_size = world.size();
  so.rank = world.rank();
  so.seq_len = in.T;
  so.packing = in.data.packing;
  so.pairs = in.data.pairs;
  so.mixture = in.data.mixture;
  so.micro_batch_size = in.data.pairs ? in.B / 2 : in.B;  // pairs of two rows, or rows
  so.gradient_accumulation_steps = c.gradient_accumulation_steps;
  so.seed = c.seed;
  so.pad_id = in.tok->eos_id();
  return so;
}

// The members are built in order: the inputs, the memory plan, the mesh (on GPU runs its NCCL
// groups pick the GPU, before any CUDA allocation), the engine, the model's compute on the
// engine's device, the reporter and the sampler. Then the weights or the checkpoint are loaded,
// and only then does rank 0 lock output_dir: a run refused during setup leaves it untouched, and
// nothing is written there before the lock.
Trainer::Trainer(const TrainConfig& c, comm::Communicator& world)
    : c_(c),
      world_(world),
      lead_(world.rank() == 0),
      in_(load_inputs(c)),
      mem_(on_every_rank([&] { return plan_memory(c, in_, world.size(), ranks_per_node(world)); })),
      mesh_([&] {
        try {
          return shard::make_mesh(world, mem_.sharding, ranks_per_node(world), c.device);
        } catch (const Error& e) {
          if (c.device != Device::CUDA) throw;
          throw Error(e.message(), {.file = c.source, .key = "device"});
        }
      }()),
      engine_(in_.model, in_.finetune, mem_.sharding, mesh_),
      model_(in_.model, c.compute_dtype(), engine_.device(), in_.finetune.lora),
      saver_(c.async_checkpoint),
      out_(c, world, in_, mem_),
      sampler_(*in_.data.train, sampler_options(c, in_, world)) {
  load_or_resume();
  if (c.preference) {
    const std::string ref = c.dpo.reference_model.empty() ? c.model : c.dpo.reference_model;
    reference_ = std::make_unique<ReferenceModel>(engine_, model_, in_.finetune.lora.has_value(), ref, c.seed);
    dpo_ = std::make_unique<DpoObjective>(c.dpo);
    resume_notes_.push_back(fmt::format("dpo: loss {}, beta {}; the reference is {}", enum_name(c.dpo.loss_type),
                                        c.dpo.beta, reference_->describe()));
  }
  if (lead_) output_lock_ = io::DirLock(c.output_dir, "output_dir");
  model_.set_checkpointing(c.activation_checkpointing, c.offload_activations);
  model_.reserve(in_.B, in_.T);
}

// Resuming: the checkpoint is opened and validated (metadata, every file's presence and size) on
// every rank before anything else, so a bad one is reported before any training. Either way each
// rank reads only the ranges it owns.
void Trainer::load_or_resume() {
  resume_ = open_resume_checkpoint(c_, in_.model, resume_notes_);
  // A LoRA run's checkpoint holds only the adapters: the frozen base always comes from the model.
  if (!resume_ || in_.finetune.lora) {
    const io::ModelWeights weights(c_.model);
    shard::load_weights(engine_, weights, c_.model, c_.seed);
  }
  if (!resume_) return;
  const auto t0 = Clock::now();
  const uint64_t bytes = ckpt::load_checkpoint(*resume_, engine_);
  const double s = seconds_since(t0);
  start_step_ = load_training_state(*resume_, c_, sampler_) + 1;
  resume_notes_.push_back(fmt::format("resumed from {} (step {}; data at epoch {}, step {} of the epoch)",
                                      resume_->dir(), start_step_ - 1, sampler_.state().epoch, sampler_.state().step));
  if (!in_.data.mixture.empty()) {  // where each source's stream stands (a function of the state)
    const std::vector<int64_t> pos = sampler_.source_positions(sampler_.state());
    std::vector<std::string> parts;
    for (size_t i = 0; i < pos.size(); ++i) parts.push_back(fmt::format("{} at {}", in_.data.mixture[i].name, pos[i]));
    resume_notes_.push_back("mixture: the sources continue: " + fmt::format("{}", fmt::join(parts, ", ")));
  }
  resume_notes_.push_back(fmt::format("loaded {:.1f} MB of checkpoint state per rank in {:.2f}s ({:.0f} MB/s per rank)",
                                      double(bytes) / 1e6, s, double(bytes) / 1e6 / std::max(s, 1e-9)));
}

TrainResult Trainer::run() {
  out_.setup(mesh_.shard->size(), engine_.num_units(), sampler_, resume_notes_);
  evaluate(start_step_ - 1);
  // The next step's micro-batches are assembled on a background thread while this one trains.
  // Every micro-batch of a step is built before the step, so the loss is normalized by the
  // non-ignored tokens of the whole global batch. From here on only that thread touches the sampler.
  data::Prefetcher prefetch([this] { return sampler_.next(); });
  stop_signals_now_save();  // from here a stop signal finishes the step and saves
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
    if (in_.finetune.lora && in_.finetune.lora->dropout > 0)  // LoRA dropout: a mask stream per micro-batch and rank
      for (size_t i = 0; i < micro.size(); ++i)
        micro[i].dropout_key = stream_id(fmt::format("lora_dropout/{}/{}/{}/{}", c_.seed, step, i, world_.rank())) | 1;
    ops::AdamWConfig opt = c_.optimizer;
    opt.lr = c_.schedule.at(step);
    const comm::CommTiming comm_before = comm::timing();
    if (dpo_) {  // the reference's forwards of the step's micro-batches, before the policy's visits
      const timeline::Span span("reference forward", "compute");
      std::vector<std::vector<double>> ref;
      for (const model::Batch& b : micro) ref.push_back(reference_->row_losses(b));
      dpo_->set_reference(std::move(ref));
    }
    const shard::StepStats s = engine_.train_step(model_, micro, opt, step, c_.max_grad_norm, dpo_.get());
    if (!s.finite) skip_or_stop(step, s);
    log_step(step, s, sb, comm_before);
    kill_rank_at_step(world_.rank(), step);
    step_span.reset();
    if (timeline::recording() && (step == c_.profile_steps[1] || step == c_.max_steps)) out_.timeline();
    if (c_.eval_every > 0 && step % c_.eval_every == 0 && step != c_.max_steps) evaluate(step);
    const bool saved = save_due(step);
    if (saved) save_checkpoint(step, sb.next);
    if (c_.save_on_signal && stop_requested()) {
      if (timeline::recording()) out_.timeline();
      stop_on_signal(step, sb.next, saved);
      return result_;
    }
  }
  evaluate(c_.max_steps);  // while the last checkpoint (async) is written
  complete_save();  // before save_model reads it
  result_.seconds = seconds_since(t_train_);
  result_.tokens_per_s = double(tokens_seen_) / result_.seconds;
  out_.progress().finish();
  out_.communication();
  const auto t_save = Clock::now();
  save_model();
  result_.save_seconds = seconds_since(t_save);
  result_.gpu_peak_reserved_bytes = out_.done(result_, seconds_since(t_start_));
  out_.finish(result_);
  return result_;
}

// A step whose loss or gradient norm is NaN or Inf took no optimizer step (the engine saw to it);
// on_nonfinite says whether the run goes on. One whose update made the weights non-finite cannot be
// skipped (the weights are already changed): it always ends the run, before anything is saved.
void Trainer::skip_or_stop(int64_t step, const shard::StepStats& s) {
  if (s.weights_nonfinite)
    throw Error(fmt::format("step {}: the loss ({:.6g}) and the gradient norm ({:.6g}) were finite, but the optimizer step made "
                            "the weights non-finite, first {}; the learning rate is likely far too large (the last "
                            "checkpoint, if any, is intact)",
                            step, s.loss, s.grad_norm, s.nonfinite),
                {.file = c_.source, .key = "optimizer.lr"});
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
  Metrics extra;
  if (dpo_) {  // TRL's rewards/ and logps/ records, over every rank's pairs (the loss is the step's)
    PreferenceSums sums = dpo_->sums();
    sums.all_reduce(world_);
    extra = sums.means("");
  }
  out_.step(step, s, sb, c_.schedule.at(step), seconds_since(t_train_), tokens_seen_, before, extra);
  result_.losses.push_back(s.loss);
  result_.grad_norms.push_back(s.grad_norm);
  if (step == start_step_) result_.first_loss = s.loss;
  result_.last_loss = s.loss;
  result_.steps = step;
}

// Held-out loss and, for a built-in task, accuracy (evaluation.h), recorded and printed.
void Trainer::evaluate(int64_t step) {
  EvalResult e;
  if (dpo_) {  // DPO's loss, rewards and accuracy over held-out pairs
    const PreferenceSums sums = evaluate_preference(engine_, model_, *reference_, c_.dpo, *in_.data.eval, in_.B / 2,
                                                    in_.T, c_.eval_batches * (in_.B / 2) * world_.size(),
                                                    in_.tok->eos_id(), world_);
    e.loss = sums.mean_loss();
    e.metrics = sums.means("eval_");
  } else {
    e = train::evaluate(engine_, model_, in_, c_, world_);
  }
  out_.eval(step, e);
  if (step == start_step_ - 1) {
    result_.initial_eval_loss = e.loss;
    result_.initial_accuracy = e.accuracy;
  }
  result_.eval_loss = e.loss;
  result_.accuracy = e.accuracy;
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
  complete_save();
  out_.print(fmt::format("stopped by a signal after step {}: checkpoint {} is complete; continue with the same config "
                         "and resume_from=auto",
                         step, (fs::path(c_.checkpoint_root()) / ckpt::step_dir_name(step)).string()));
  out_.finish(result_);
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
  // One save in flight at a time: the previous (async) one is completed before this one starts.
  complete_save();
  saver_.start(so, engine_, in_.model, world_);
  last_save_ = Clock::now();
  if (!c_.async_checkpoint) complete_save();
}

// Completes the save in flight, if any (collective; every rank calls it at the same point of the
// loop): metadata.json and COMPLETE, then keep_last_n, the log line and the metrics record.
void Trainer::complete_save() {
  if (!saver_.in_flight()) return;
  const ckpt::SaveReport r = saver_.finish(world_);
  if (lead_ && c_.keep_last_n > 0) ckpt::prune_checkpoints(c_.checkpoint_root(), c_.keep_last_n);
  const double mb = double(r.rank_bytes) / 1e6, rate = mb / std::max(r.rank_seconds, 1e-9);
  out_.print(fmt::format("checkpoint step {} -> {}: {:.1f} MB from each rank in {:.2f}s ({:.0f} MB/s per rank), "
                         "{:.1f} MB in all, complete after {:.2f}s{}; training waited {:.3f}s",
                         r.step, r.dir, mb, r.rank_seconds, rate, double(r.total_bytes) / 1e6, r.seconds,
                         c_.async_checkpoint ? " (written in the background)" : "", r.blocked_seconds));
  out_.write({{"step", r.step}, {"checkpoint", r.dir}, {"checkpoint_bytes", r.total_bytes},
              {"checkpoint_seconds", r.seconds}, {"checkpoint_rank_mb_per_s", rate},
              {"checkpoint_blocked_seconds", r.blocked_seconds}});
}

// The trained model as a Hugging Face directory, streamed: from the final checkpoint by rank 0
// when there is one, else gathered from the engine one unit at a time. No rank ever holds the
// whole model.
void Trainer::save_model() {
  // A LoRA run writes its adapters as a PEFT directory, output_dir/adapter, and with merge_on_save
  // also the merged model, output_dir/merged.
  // The adapter and merged directories are the run's alone and appear whole; output_dir itself
  // also holds checkpoints and metrics, so a full model is written into it file by file.
  const std::string out = in_.finetune.lora ? (fs::path(c_.output_dir) / "adapter").string() : c_.output_dir;
  const ckpt::ConvertOptions opt{.out = out,
                                 .dtype = c_.save_dtype,
                                 .max_shard_bytes = io::parse_size(c_.max_shard_size),
                                 .publish = in_.finetune.lora ? io::Publish::Replace : io::Publish::InPlace,
                                 .role = in_.finetune.lora ? "output_dir/adapter" : "output_dir"};
  if (c_.saves_checkpoints()) {
    if (lead_) {
      ckpt::CheckpointReader final_ckpt((fs::path(c_.checkpoint_root()) / ckpt::step_dir_name(c_.max_steps)).string());
      ckpt::convert_checkpoint(final_ckpt, opt);
    }
    world_.barrier();
  } else {
    ckpt::export_model(engine_, in_.model, opt, c_.model, world_);
  }
  if (in_.finetune.lora && c_.merge_on_save) {
    if (lead_) {
      const MergeReport r = merge_peft_adapter({.base = c_.model, .adapter = out,
                                                .out = (fs::path(c_.output_dir) / "merged").string(),
                                                .dtype = c_.save_dtype, .max_shard_bytes = opt.max_shard_bytes,
                                                .publish = io::Publish::Replace, .role = "output_dir/merged"});
      out_.print(fmt::format("merge_on_save: merged {} weights (W + {:.4g} B A) into {}/merged{}", r.merged,
                             r.spec.scale(), c_.output_dir,
                             r.dequantized > 0 ? " (merged into the dequantized NF4 weights of the bitsandbytes 4-bit "
                                                 "base, as training saw them; a plain model)"
                             : in_.finetune.nf4_base ? " (into the base as stored in the model directory, not its NF4 "
                                                    "rounding that training saw)"
                                                  : ""));
    }
    world_.barrier();
  }
}

}  // namespace

TrainResult run_training(const TrainConfig& config, comm::Communicator& world) {
  // A DeepSpeed train_batch_size completes or checks the batch shape once the world is known.
  const TrainConfig c = with_batch_size(config, world.size());
  comm::set_collective_timeout(c.collective_timeout);
  const StopSignalGuard signals(c.save_on_signal);
  // Before anything is loaded: every rank is there and the links carry data (preflight.h).
  // Printed with the setup lines (stderr; not with progress: none).
  if (const std::string line = preflight_check(world); !line.empty() && c.progress != ProgressMode::None)
    std::fprintf(stderr, "%s\n", line.c_str());
  return Trainer(c, world).run();
}

}  // namespace shardlm::train
