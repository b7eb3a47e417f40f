// What a training run tells people, and nothing training depends on: rank 0 prints (a progress bar
// or lines, and the lines of setup, evaluation, checkpoints and the end) and writes the metrics
// records; every record goes one way, through write(): to metrics.jsonl, to the TensorBoard event
// file with report_to: tensorboard, and into the series report.html draws at the end (finish()).
// Beside them: the profile window's timeline (every rank writes its own), and the communication
// and memory reports at the end. The other ranks stay quiet. Owner: the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "data/sampler.h"
#include "report/html_report.h"
#include "report/tensorboard.h"
#include "shard/engine.h"
#include "train/evaluation.h"
#include "train/progress.h"
#include "train/run_setup.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace shardlm::train {

class Reporter {
 public:
  // Rank 0 creates output_dir (the others need not see it yet). `in` and `mem` must outlive the
  // Reporter.
  Reporter(const TrainConfig& c, comm::Communicator& world, const RunInputs& in, const MemoryPlan& mem);

  void print(const std::string& line) { progress_.print(line); }
  // The metrics file and the event file are opened (and a previous run's metrics truncated) at the
  // first record, so a run refused while loading leaves output_dir as it was.
  void write(const nlohmann::json& rec);
  Progress& progress() { return progress_; }

  // What runs, on what, over which data, before the first step; resume_notes: what resuming found.
  void setup(int shard_group_size, int units, data::DistributedSampler& sampler,
             const std::vector<std::string>& resume_notes);
  // One step's record (metrics, progress): its stats, learning rate, seconds and tokens since
  // training began (all ranks), and the communication timing before it (comm::timing()).
  // extra: more named scalars for the record (DPO's rewards/...).
  void step(int64_t step, const shard::StepStats& s, const data::StepBatch& sb, double lr, double elapsed_s,
            int64_t tokens_seen, const comm::CommTiming& before,
            const std::vector<std::pair<std::string, double>>& extra = {});
  void eval(int64_t step, const EvalResult& e);
  // The profile window's timeline: every rank writes its own trace (atomically).
  void timeline();
  // How much of the run's communication ran behind compute (rank 0's view; CPU ranks over MPI).
  void communication();
  // The end of a finished run: its summary, the memory table (every rank takes part in gathering
  // its figures) and where the model went. Returns the GPU's peak reservation (0 on CPU).
  int64_t done(const TrainResult& r, double total_seconds);
  // The end of a run (finished or stopped by a signal): report.html from the records written,
  // under lines saying what ran and how it ended.
  void finish(const TrainResult& r);

 private:
  std::vector<std::string> notes(const TrainResult& r) const;

  const TrainConfig& c_;
  comm::Communicator& world_;
  const RunInputs& in_;
  const MemoryPlan& mem_;
  const bool lead_;
  const double flops_per_token_;  // model FLOPs of one trained token (model/config.h), for model_flops_per_s
  Progress progress_;
  std::string metrics_path_, report_path_, tensorboard_dir_;
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<report::EventWriter> events_;
  report::TrainingReport report_;
};

}  // namespace shardlm::train
