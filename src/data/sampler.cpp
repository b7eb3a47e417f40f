// The distributed sampler and the prefetch thread (see sampler.h). Owner: the data pipeline.
#include "data/sampler.h"

#include <fmt/format.h>

#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "data/packing.h"

namespace shardlm::data {

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // Counter = (i, epoch), key = seed, in the stream "sampler": each swap's random number depends
  // only on these, never on how many ranks there are or what ran before.
  const uint64_t stream = stream_id("sampler");
  for (int64_t i = n - 1; i > 0; --i) {
    const auto r = philox4x32({uint32_t(i), uint32_t(i >> 32), uint32_t(epoch), uint32_t(stream)},
                              {uint32_t(seed), uint32_t(seed >> 32)});
    const uint64_t x = uint64_t(r[0]) | uint64_t(r[1]) << 32;
    std::swap(order[size_t(i)], order[size_t(x % uint64_t(i + 1))]);
  }
  return order;
}

DistributedSampler::DistributedSampler(const Dataset& data, SamplerOptions opt) : data_(data), opt_(opt) {
  SHARDLM_CHECK(opt_.world_size >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world_size,
                "rank {} is outside a world of size {}", opt_.rank, opt_.world_size);
  SHARDLM_CHECK(opt_.micro_batch_size >= 1 && opt_.gradient_accumulation_steps >= 1 && opt_.seq_len >= 1,
                "micro_batch_size, gradient_accumulation_steps and seq_len must be >= 1");
  G_ = opt_.micro_batch_size * opt_.gradient_accumulation_steps * opt_.world_size;
  SHARDLM_CHECK(!(opt_.pairs && opt_.packing), "preference pairs are not packed");
  if (opt_.packing) {
    lengths_.resize(size_t(data_.size()));
    for (int64_t i = 0; i < data_.size(); ++i) lengths_[size_t(i)] = data_.length(i);
  }
  const int64_t rows = int64_t(epoch_rows(0).size());
  if (rows < G_)
    throw Error(fmt::format("the training data makes {} rows of up to {} tokens ({} examples), fewer than one global "
                            "batch of {} rows (micro_batch_size {} x gradient_accumulation_steps {} x {} ranks)",
                            rows, opt_.seq_len, data_.size(), G_, opt_.micro_batch_size,
                            opt_.gradient_accumulation_steps, opt_.world_size));
}

const std::vector<std::vector<int64_t>>& DistributedSampler::epoch_rows(int64_t epoch) {
  if (epoch == cached_epoch_) return cached_rows_;
  const int64_t units = opt_.pairs ? data_.size() / 2 : data_.size();  // examples, or pairs
  std::vector<int64_t> order;
  if (!opt_.mixture.empty()) {
    order = mixture_units(epoch);
    if (opt_.shuffle) {
      const std::vector<int64_t> perm = epoch_order(int64_t(order.size()), opt_.seed, epoch);
      std::vector<int64_t> shuffled(order.size());
      for (size_t k = 0; k < perm.size(); ++k) shuffled[k] = order[size_t(perm[k])];
      order = std::move(shuffled);
    }
  } else if (opt_.shuffle) {
    order = epoch_order(units, opt_.seed, epoch);
  } else {
    order.resize(size_t(units));
    std::iota(order.begin(), order.end(), 0);
  }
  cached_rows_.clear();
  cached_truncated_ = 0;
  if (opt_.packing) {
    cached_rows_ = pack_greedy(order, [&](int64_t i) { return lengths_[size_t(i)]; }, opt_.seq_len,
                               &cached_truncated_);
  } else {
    cached_rows_.reserve(order.size());
    for (const int64_t i : order) cached_rows_.push_back({i});
  }
  cached_epoch_ = epoch;
  return cached_rows_;
}

// Epoch e's units of a mixture, source by source (unshuffled): source i's stream positions
// [e n_i, (e + 1) n_i), position k being element k mod size_i of pass k / size_i.
std::vector<int64_t> DistributedSampler::mixture_units(int64_t epoch) const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < opt_.mixture.size(); ++i) {
    const MixPart& p = opt_.mixture[i];
    std::vector<int64_t> pass;
    int64_t pass_no = -1;
    for (int64_t k = epoch * p.per_epoch; k < (epoch + 1) * p.per_epoch; ++k) {
      if (k / p.size != pass_no) {
        pass_no = k / p.size;
        pass = epoch_order(p.size, opt_.seed + uint64_t(i) + 1, pass_no);
      }
      out.push_back(p.begin + pass[size_t(k % p.size)]);
    }
  }
  return out;
}

std::vector<int64_t> DistributedSampler::source_positions(const SamplerState& s) {
  std::vector<int64_t> pos;
  for (const MixPart& p : opt_.mixture) pos.push_back(s.epoch * p.per_epoch);
  const auto& rows = epoch_rows(s.epoch);
  for (int64_t r = 0; r < std::min<int64_t>(s.step * G_, int64_t(rows.size())); ++r)
    for (const int64_t u : rows[size_t(r)])
      for (size_t i = 0; i < opt_.mixture.size(); ++i)
        if (u >= opt_.mixture[i].begin && u < opt_.mixture[i].begin + opt_.mixture[i].size) ++pos[i];
  return pos;
}

int64_t DistributedSampler::truncated_in_epoch(int64_t epoch) {
  epoch_rows(epoch);
  if (opt_.packing) return cached_truncated_;
  int64_t n = 0;
  for (const auto& row : cached_rows_) {
    if (!opt_.pairs) n += data_.length(row[0]) > opt_.seq_len;
    else n += (data_.length(2 * row[0]) > opt_.seq_len) + (data_.length(2 * row[0] + 1) > opt_.seq_len);
  }
  return n;
}

void DistributedSampler::load_state(const SamplerState& saved, int64_t saved_rows_per_step, const ErrorContext& batch_at) {
  SamplerState next = saved;
  if (saved_rows_per_step != G_) {
    const int64_t read = next.step * saved_rows_per_step;  // rows of the epoch already trained on
    if (read % G_ != 0)
      throw Error(fmt::format("the checkpoint's global batch is {} rows per step and this run's is {}, which does not "
                              "divide the {} rows of epoch {} already read; choose micro_batch_size x "
                              "gradient_accumulation_steps x ranks to match",
                              saved_rows_per_step, G_, read, next.epoch),
                  batch_at);
    next.step = read / G_;
    if (next.step >= steps_in_epoch(next.epoch)) next = {next.epoch + 1, 0};
  }
  set_state(next);
}

void DistributedSampler::set_state(const SamplerState& s) {
  SHARDLM_CHECK(s.epoch >= 0 && s.step >= 0 && s.step <= steps_in_epoch(s.epoch),
                "sampler state epoch {} step {} is outside the data ({} steps in that epoch)", s.epoch, s.step,
                steps_in_epoch(s.epoch));
  state_ = s;
}

StepBatch DistributedSampler::next() {
  if (state_.step >= steps_in_epoch(state_.epoch)) state_ = {state_.epoch + 1, 0};
  StepBatch out;
  out.state = state_;
  const auto& rows = epoch_rows(state_.epoch);
  const int64_t per_rank = G_ / opt_.world_size;
  const int64_t first = state_.step * G_ + opt_.rank * per_rank;
  for (int64_t m = 0; m < opt_.gradient_accumulation_steps; ++m) {
    std::vector<std::vector<Example>> packed;
    std::vector<Example> padded;
    for (int64_t b = 0; b < opt_.micro_batch_size; ++b) {
      const std::vector<int64_t>& row = rows[size_t(first + m * opt_.micro_batch_size + b)];
      if (opt_.pairs) {
        for (const int64_t i : {2 * row[0], 2 * row[0] + 1}) {
          out.rows.push_back({i});
          padded.push_back(data_.get(i));
        }
        continue;
      }
      out.rows.push_back(row);
      if (opt_.packing) {
        packed.emplace_back();
        for (const int64_t i : row) packed.back().push_back(data_.get(i));
      } else {
        padded.push_back(data_.get(row[0]));
      }
    }
    out.micro.push_back(opt_.packing ? make_packed_batch(packed, opt_.seq_len, opt_.pad_id)
                                     : make_padded_batch(padded, opt_.seq_len, opt_.pad_id));
  }
  ++state_.step;
  if (state_.step >= steps_in_epoch(state_.epoch)) state_ = {state_.epoch + 1, 0};
  out.next = state_;
  return out;
}

// ---- prefetch --------------------------------------------------------------------------------

Prefetcher::Prefetcher(std::function<StepBatch()> produce, size_t depth)
    : produce_(std::move(produce)), depth_(depth < 1 ? 1 : depth), thread_([this] { run(); }) {}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Prefetcher::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || queue_.size() < depth_; });
      if (stop_) return;
    }
    try {
      StepBatch b = produce_();  // outside the lock: this is the work that overlaps training
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    cv_.notify_all();
  }
}

StepBatch Prefetcher::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  if (queue_.empty()) std::rethrow_exception(error_);
  StepBatch b = std::move(queue_.front());
  queue_.pop_front();
  cv_.notify_all();
  return b;
}

}  // namespace shardlm::data
