#include "train/reporting.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "core/device.h"
#include "core/timeline.h"
#include "io/atomic_file.h"
#include "memory/usage.h"
#include "model/llama.h"
#include "model/lora.h"

namespace shardlm::train {

namespace fs = std::filesystem;

Reporter::Reporter(const TrainConfig& c, comm::Communicator& world, const RunInputs& in, const MemoryPlan& mem)
    : c_(c),
      world_(world),
      in_(in),
      mem_(mem),
      lead_(world.rank() == 0),
      flops_per_token_(training_flops_per_token(in.model, in.finetune, in.T)),
      progress_(lead_ ? c.progress : ProgressMode::None, c.log_every),
      metrics_path_((fs::path(c.output_dir) / c.metrics_file).string()),
      report_path_((fs::path(c.output_dir) / "report.html").string()),
      tensorboard_dir_(c.report_tensorboard ? c.tensorboard_dir() : "") {
  if (!lead_) return;
  std::error_code ec;
  fs::create_directories(c.output_dir, ec);
  if (ec) throw Error(fmt::format("cannot create the output directory: {}", ec.message()), {.file = c.output_dir});
}

void Reporter::write(const nlohmann::json& rec) {
  if (!lead_) return;
  if (!metrics_) metrics_ = std::make_unique<MetricsFile>(metrics_path_);
  metrics_->write(rec);
  if (!tensorboard_dir_.empty()) {
    if (!events_) events_ = std::make_unique<report::EventWriter>(tensorboard_dir_);
    events_->record(rec);
  }
  report_.add(rec);
}

void Reporter::setup(int shard_group_size, int units, data::DistributedSampler& sampler,
                     const std::vector<std::string>& resume_notes) {
  const ModelConfig& m = in_.model;
  const shard::ShardingConfig& sc = mem_.sharding;
  const int W = world_.size();
  print(fmt::format("shardlm train: {} ({} layers, hidden {}, {:.2f}M parameters) in {}", c_.model, m.num_hidden_layers,
                    m.hidden_size, double(parameter_count(m, in_.finetune)) / 1e6, dtype_name(c_.compute_dtype())));
  print(fmt::format("sharding: {} on {} rank{} (shard groups of {}, {} unit{}), reduce in {}{}",
                    shard::strategy_name(sc.strategy), W, W > 1 ? "s" : "", shard_group_size, units,
                    units > 1 ? "s" : "", dtype_name(sc.reduce_dtype),
                    sc.state_dtype == DType::F32  ? ""
                    : sc.state_dtype == DType::U8 ? ", AdamW 8-bit (blockwise moments; the embedding's f32)"
                                                  : fmt::format(", AdamW moments in {}", dtype_name(sc.state_dtype))));
  if (const std::string launcher = comm::describe_launcher(); W > 1 && !launcher.empty())
    print("ranks: started by " + launcher);
  if (const model::FinetuneSpec& ft = in_.finetune; ft.lora) {
    const int64_t trainable = mem_.estimate.trainable_params, all = parameter_count(m, ft);
    print(
        fmt::format("{}: rank {}, alpha {} (scale {:.4g}{}), dropout {}, on {}; trainable params: {} || all "
                    "params: {} || trainable%: {:.4f}",
                    ft.nf4_base ? (ft.lora->use_dora ? "QDoRA" : "QLoRA") : (ft.lora->use_dora ? "DoRA" : "LoRA"), ft.lora->rank, ft.lora->alpha, ft.lora->scale(),
                    ft.lora->use_rslora ? ", rsLoRA" : "", ft.lora->dropout,
                    fmt::join(model::expand_lora_targets(ft.lora->target_modules), " "), trainable, all,
                    100.0 * double(trainable) / double(all)));
    if (ft.nf4_base)
      print(
          fmt::format("base: Linear weights in NF4 (bitsandbytes' layout{}), dequantized to {} for each use; "
                      "norms, embedding and lm_head in {}",
                      ft.nf4_double_quant ? ", double quantization" : "", dtype_name(mem_.sharding.param_dtype),
                      dtype_name(mem_.sharding.param_dtype)));
  }
  if (!in_.base_note.empty()) print(in_.base_note);
  if (c_.device == Device::CUDA)
    print(fmt::format("device: cuda (NCCL for parameters and gradients{})",
                      sc.offload_params ? "; master weights, gradient shard and AdamW state offloaded to pinned "
                                          "host memory, AdamW on the CPU"
                                        : ""));
  if (!mem_.auto_why.empty()) print(mem_.auto_why);
  print(
      fmt::format("memory: estimated peak {} per rank over training steps (activations {}, tracked "
                  "buffers only; `shardlm estimate-memory` has the breakdown)",
                  format_bytes(mem_.estimate.peak_total),
                  format_bytes(mem_.estimate.category_peak[size_t(MemCategory::Activations)])));
  print(fmt::format("data ({}; tokenizer: {}):", in_.data.type, in_.tok->name()));
  for (const std::string& line : in_.data.report) print("  " + line);
  const int64_t rows = int64_t(sampler.epoch_rows(0).size()), truncated = sampler.truncated_in_epoch(0);
  if (in_.data.type == "text" || in_.data.type == "tokens")  // a token stream: full windows, nothing padded
    print(fmt::format("  rows: {} windows of seq_len + 1 = {} tokens, one every {} tokens of the stream (each "
                      "overlaps the next by one token); {} steps per epoch of {} rows",
                      rows, in_.T + 1, in_.T, sampler.steps_in_epoch(0), sampler.rows_per_step()));
  else
    print(fmt::format("  rows: {} {} of {} tokens from {} examples{}; {} steps per epoch of {} rows", rows,
                      in_.data.packing ? "packed rows" : "padded rows", in_.T, in_.data.train->size(),
                      truncated ? fmt::format(" ({} truncated to {} tokens)", truncated, in_.T) : "",
                      sampler.steps_in_epoch(0), sampler.rows_per_step()));
  for (const std::string& note : resume_notes) print(note);
  print(fmt::format("batch: {} x {} tokens x {} accumulation x {} rank{} = {} tokens per step; {} steps", in_.B, in_.T,
                    c_.gradient_accumulation_steps, W, W > 1 ? "s" : "",
                    in_.B * in_.T * c_.gradient_accumulation_steps * W, c_.max_steps));
}

void Reporter::step(int64_t step, const shard::StepStats& s, const data::StepBatch& sb, double lr, double elapsed,
                    int64_t tokens_seen, const comm::CommTiming& before,
                    const std::vector<std::pair<std::string, double>>& extra) {
  const MemStats mem_now = MemoryTracker::for_device(Device::CPU).stats();
  const memory::ProcessMemory rss_now = memory::process_memory();
  ProgressLine line{step, c_.max_steps, s.loss, lr, s.grad_norm, double(tokens_seen) / elapsed, elapsed,
                    memory::memory_brief(mem_now, rss_now)};
  progress_.step(line);
  nlohmann::json rec = {{"step", step}, {"loss", s.loss}, {"lr", lr}, {"grad_norm", s.grad_norm},
                        {"tokens_per_s", line.tokens_per_s}, {"elapsed_s", elapsed}, {"epoch", sb.state.epoch}};
  // Model FLOPs per second over the run so far, all ranks (model/config.h's accounting), and MFU
  // against the peak the config states.
  const double flops_per_s = flops_per_token_ * line.tokens_per_s;
  rec["model_flops_per_s"] = flops_per_s;
  if (c_.peak_flops > 0) rec["mfu"] = flops_per_s / (c_.peak_flops * world_.size());
  for (const auto& [name, v] : extra) rec[name] = v;
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
  write(rec);
}

void Reporter::eval(int64_t step, const EvalResult& e) {
  nlohmann::json rec = {{"step", step}, {"eval_loss", e.loss}};
  std::string line = fmt::format("eval step {}: held-out loss {:.4f}", step, e.loss);
  if (e.accuracy >= 0) {
    rec["eval_accuracy"] = e.accuracy;
    line += fmt::format(", accuracy {:.1f}% ({}/{} held-out problems)", 100 * e.accuracy, e.correct, e.problems);
  }
  for (const auto& [name, v] : e.metrics) {
    rec[name] = v;
    if (name == "eval_rewards/margins") line += fmt::format(", reward margin {:.4f}", v);
    if (name == "eval_rewards/accuracies") line += fmt::format(", preference accuracy {:.1f}%", 100 * v);
  }
  memory::add_memory_fields(rec, MemoryTracker::for_device(Device::CPU).stats(), memory::process_memory());
  write(rec);
  print(line);
}

void Reporter::timeline() {
  timeline::stop();
  const fs::path dir = fs::path(c_.output_dir) / "trace";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create the trace directory: {}", ec.message()), {.file = dir.string()});
  io::write_text_atomic((dir / fmt::format("rank{}.json", world_.rank())).string(),
                        timeline::chrome_trace_json(world_.rank()));
  print(
      fmt::format("timeline of steps {}-{} written to {}/rank*.json (one per rank; open in ui.perfetto.dev "
                  "or chrome://tracing)",
                  c_.profile_steps[0], c_.profile_steps[1], dir.string()));
}

void Reporter::communication() {
  const comm::CommTiming t = comm::timing();
  if (world_.size() == 1 || c_.device != Device::CPU || t.busy_seconds <= 0) return;
  print(
      fmt::format("communication: {:.1f}s with collectives in flight, {:.1f}s waited on them: {:.0f}% hidden "
                  "behind compute",
                  t.busy_seconds, t.waited_seconds, 100 * t.hidden_share()));
}

int64_t Reporter::done(const TrainResult& r, double total_seconds) {
  int64_t gpu_peak = 0;
  MemStats est_stats;
  est_stats.peak = mem_.estimate.category_peak;
  est_stats.peak_total = mem_.estimate.peak_total;
  const std::vector<std::string> table = memory::memory_summary(MemoryTracker::for_device(Device::CPU).stats(),
                                                                memory::process_memory(), world_, &est_stats);
  print(fmt::format("done: {} steps in {}, {:.0f} tokens/s; loss {:.4f} -> {:.4f}; held-out loss {:.4f} -> {:.4f}",
                    r.steps, format_duration(r.seconds), r.tokens_per_s, r.first_loss, r.last_loss, r.initial_eval_loss,
                    r.eval_loss));
  for (const std::string& line : table) print(line);
  if (c_.device == Device::CUDA) {
    // The GPU's own figures: the tracker's requested bytes per category and the caching allocator's
    // rounded and reserved bytes (what nvidia-smi would show, less the CUDA context).
    const MemStats g = MemoryTracker::for_device(Device::CUDA).stats();
    const device::CudaMemoryStats a = device::cuda_memory_stats();
    print(fmt::format(
        "gpu memory (this rank): peak tracked {} (parameters {}, gradients {}, optimizer {}, "
        "activations {}, communication {}, workspace {}); allocator peak allocated {}, peak reserved {}",
        format_bytes(g.peak_total), format_bytes(g.peak[size_t(MemCategory::Parameters)]),
        format_bytes(g.peak[size_t(MemCategory::Gradients)]), format_bytes(g.peak[size_t(MemCategory::Optimizer)]),
        format_bytes(g.peak[size_t(MemCategory::Activations)]),
        format_bytes(g.peak[size_t(MemCategory::Communication)]), format_bytes(g.peak[size_t(MemCategory::Workspace)]),
        format_bytes(a.allocated_peak), format_bytes(a.reserved_peak)));
    gpu_peak = a.reserved_peak;
  }
  print(fmt::format(
      "  (the estimate covers training steps; the measured peaks also cover loading, evaluation and "
      "the final save, {} one unit at a time: up to {} for the largest)",
      c_.saves_checkpoints() ? "streamed from the last checkpoint by rank 0, read" : "gathered from the shards",
      format_bytes(mem_.estimate.save_gather_bytes)));
  print(fmt::format("saved the trained {} to {} ({}) in {:.2f}s; the run took {:.1f}s",
                    in_.finetune.lora ? "LoRA adapter (PEFT format)" : "model",
                    in_.finetune.lora ? (fs::path(c_.output_dir) / "adapter").string() : c_.output_dir,
                    dtype_name(c_.save_dtype), r.save_seconds, total_seconds));
  return gpu_peak;
}

void Reporter::finish(const TrainResult& r) {
  if (!lead_ || report_.empty()) return;
  report::write_html(report_path_, report_.page("shardlm training report", notes(r)));
  progress_.print(fmt::format(
      "report: {}{}", report_path_,
      events_ ? fmt::format("; TensorBoard events: {} (tensorboard --logdir {})", events_->path(), tensorboard_dir_)
              : ""));
}

std::vector<std::string> Reporter::notes(const TrainResult& r) const {
  const int W = world_.size();
  std::vector<std::string> notes = {
      fmt::format(
          "model {} ({:.2f}M parameters{}), {} on {} rank{}, {} x {} tokens x {} accumulation per rank and step",
          c_.model, double(parameter_count(in_.model, in_.finetune)) / 1e6, in_.finetune.lora ? ", LoRA" : "",
          shard::strategy_name(mem_.sharding.strategy), W, W > 1 ? "s" : "", in_.B, in_.T,
          c_.gradient_accumulation_steps),
      fmt::format("{} steps{} in {}, {:.0f} tokens/s; loss {:.4f} -> {:.4f}; held-out loss {:.4f} -> {:.4f}", r.steps,
                  r.stopped_by_signal ? " (stopped by a signal)" : "", format_duration(r.seconds), r.tokens_per_s,
                  r.first_loss, r.last_loss, r.initial_eval_loss, r.eval_loss),
      fmt::format("output: {} (records: {})", c_.output_dir, c_.metrics_file)};
  return notes;
}

}  // namespace shardlm::train
