// The order in which training reads its rows, for any number of data-parallel ranks, and a
// background thread that prepares the next step's batches. Owner: the data pipeline.
//
// Semantics (docs/data.md):
//  - Epoch e visits the examples in a deterministic shuffle of (seed, e) (Philox, core/rng.h).
//  - Rows are formed from that global order alone: greedy packing (packing: true) or one example
//    per row. They never depend on the world size.
//  - Step s of epoch e is global rows [s*G, (s+1)*G), G = micro_batch_size *
//    gradient_accumulation_steps * world_size. Rank r reads its contiguous slice of G/W rows,
//    micro-batch m being rows [m*B, (m+1)*B) of that slice. Hence the global batch is the same
//    for every W that divides G. Rows left over at the end of an epoch (fewer than G) are
//    dropped, as DistributedSampler(drop_last=True) would; the next epoch reshuffles.
//  - The state {epoch, step} (the next step to read) can be saved and restored exactly.
//
// The datasets are tokenized up front (instruct.h); a rank materializes Examples (Dataset::get)
// only for its own rows, but packing needs every example's length, which every rank computes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"
#include "data/run_data.h"

namespace shardlm::data {

struct SamplerState {
  int64_t epoch = 0;
  int64_t step = 0;  // the next step of the epoch to read
  bool operator==(const SamplerState&) const = default;
};

struct SamplerOptions {
  int64_t seq_len = 256;    // packed rows have exactly this many tokens; padded rows at most this
  bool packing = false;
  int64_t micro_batch_size = 1;  // rows per micro-batch on each rank (B)
  int64_t gradient_accumulation_steps = 1;
  int64_t world_size = 1, rank = 0;
  uint64_t seed = 0;
  bool shuffle = true;  // false: the dataset's own order every epoch (evaluation, previews)
  // Preference pairs (RunData::pairs): the unit read is pair i, examples 2i and 2i+1 (chosen,
  // rejected), which become two consecutive rows of a micro-batch; micro_batch_size and the global
  // batch count pairs (TRL's per_device_train_batch_size), so a micro-batch has 2 x B rows.
  bool pairs = false;
  int32_t pad_id = 0;
  // A mixture (RunData::mixture): epoch e takes, from source i, units [e n_i, (e + 1) n_i) of
  // that source's endless stream of shuffled passes (pass c: epoch_order(size_i, seed + i + 1, c)),
  // and shuffles them all together (epoch_order(sum n_i, seed, e)). Empty: every unit once per epoch.
  std::vector<MixPart> mixture;
};

// One optimizer step's data on this rank.
struct StepBatch {
  SamplerState state;  // which step this is
  SamplerState next;   // the state to save to continue after this step
  std::vector<BatchBuffers> micro;             // gradient_accumulation_steps micro-batches
  std::vector<std::vector<int64_t>> rows;      // this rank's rows as example indices, in order
};

// The deterministic permutation of [0, n) for (seed, epoch): Fisher-Yates driven by Philox.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

class DistributedSampler {
 public:
  // Throws when one epoch's rows cannot fill a single global batch.
  DistributedSampler(const Dataset& data, SamplerOptions opt);

  int64_t rows_per_step() const { return G_; }  // G, over all ranks
  // The global rows of an epoch (example indices per row).
  const std::vector<std::vector<int64_t>>& epoch_rows(int64_t epoch);
  int64_t steps_in_epoch(int64_t epoch) { return int64_t(epoch_rows(epoch).size()) / G_; }
  // Examples of the epoch cut to seq_len by packing (padded mode: rows longer than seq_len).
  int64_t truncated_in_epoch(int64_t epoch);

  SamplerState state() const { return state_; }
  void set_state(const SamplerState& s);  // throws for a step beyond its epoch
  // Continues a run whose sampler would have read `saved` next, its steps counting
  // `saved_rows_per_step` rows. The data order continues exactly when the global batch is unchanged,
  // on any world size; a different global batch continues at the same row when it divides the rows
  // of the epoch already read, else an Error (with `batch_at`: where this run's batch is configured).
  void load_state(const SamplerState& saved, int64_t saved_rows_per_step, const ErrorContext& batch_at = {});
  StepBatch next();                       // this rank's batches of the current step; advances
  // A mixture's position in each source at `s`: the units of each drawn so far, from its stream.
  std::vector<int64_t> source_positions(const SamplerState& s);

 private:
  std::vector<int64_t> mixture_units(int64_t epoch) const;

  const Dataset& data_;
  SamplerOptions opt_;
  int64_t G_;
  std::vector<int64_t> lengths_;
  SamplerState state_;
  int64_t cached_epoch_ = -1, cached_truncated_ = 0;
  std::vector<std::vector<int64_t>> cached_rows_;
};

// Runs `produce` on a background thread, keeping up to `depth` results ready, so that the next
// step's batches are assembled while the current step trains. An exception thrown by produce is
// rethrown (same type and message) by the next() that would have returned its result. The
// destructor stops and joins the thread.
class Prefetcher {
 public:
  explicit Prefetcher(std::function<StepBatch()> produce, size_t depth = 2);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  StepBatch next();

 private:
  void run();
  std::function<StepBatch()> produce_;
  size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StepBatch> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace shardlm::data
