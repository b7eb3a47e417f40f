#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/rng.h"
#include "data/dataset.h"
#include "infer/generator.h"
#include "io/model_files.h"
#include "model/llama.h"
#include "train/hf_export.h"
#include "train/param_store.h"
#include "train/progress.h"

namespace shardlm::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kBuiltinAddition = "builtin:addition";

// The training and evaluation data of a run.
struct RunData {
  std::unique_ptr<data::Dataset> train, eval;
  const data::AdditionTask* task = nullptr;  // the eval set when it is a built-in task
  int64_t seq_len = 0;
  std::string describe;
};

RunData make_data(const TrainConfig& c, const data::Tokenizer& tok) {
  RunData d;
  const DataConfig& dc = c.data;
  if (dc.train == kBuiltinAddition) {
    d.train = std::make_unique<data::AdditionTask>(tok, dc.digits, false, dc.train_examples, c.seed);
    auto eval = std::make_unique<data::AdditionTask>(tok, dc.digits, true, dc.eval_examples, c.seed);
    d.task = eval.get();
    d.eval = std::move(eval);
    // Rows are short: no need to pad them to seq_len.
    d.seq_len = std::min(c.seq_len, data::AdditionTask::max_tokens(dc.digits));
    d.describe = fmt::format("{} ({}-digit operands, {} training problems, {} held-out)", dc.train, dc.digits,
                             dc.train_examples, dc.eval_examples);
    return d;
  }
  d.seq_len = c.seq_len;
  auto load = [&](const std::string& path) {
    const bool tokens = dc.format == "tokens" ||
                        (dc.format == "auto" && (path.ends_with(".bin") || path.ends_with(".tokens")));
    return tokens ? data::read_token_file(path, dc.token_bytes, tok.vocab_size()) : data::tokenize_text_file(path, tok);
  };
  std::vector<int32_t> train_tokens = load(dc.train), eval_tokens;
  if (!dc.eval.empty()) {
    eval_tokens = load(dc.eval);
  } else if (dc.eval_fraction > 0) {
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
  d.describe = fmt::format("{} ({} training tokens, {} held-out tokens)", dc.train, n_train, n_eval);
  return d;
}

// A deterministic pass over a dataset in shuffled order, reshuffled every epoch from (seed, epoch).
class Sampler {
 public:
  Sampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) { shuffle(); }
  int64_t next() {
    if (pos_ == n_) {
      ++epoch_;
      shuffle();
    }
    return order_[size_t(pos_++)];
  }
  int64_t epoch() const { return epoch_; }

 private:
  void shuffle() {
    order_.resize(size_t(n_));
    std::iota(order_.begin(), order_.end(), 0);
    const uint64_t stream = stream_id("sampler") ^ uint64_t(epoch_);
    for (int64_t i = n_ - 1; i > 0; --i) {  // Fisher-Yates
      const uint32_t r = philox4x32({uint32_t(i), uint32_t(i >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                                    {uint32_t(seed_), uint32_t(seed_ >> 32)})[0];
      std::swap(order_[size_t(i)], order_[size_t(r % uint32_t(i + 1))]);
    }
    pos_ = 0;
  }
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = 0, pos_ = 0;
  std::vector<int64_t> order_;
};

double eval_loss(model::LlamaCompute& model, const data::Dataset& eval, int64_t B, int64_t T, int64_t max_batches,
                 int32_t pad) {
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; b < max_batches && b * B < eval.size(); ++b) {
    std::vector<data::Example> rows;
    for (int64_t i = b * B; i < std::min(eval.size(), (b + 1) * B); ++i) rows.push_back(eval.get(i));
    while (int64_t(rows.size()) < B) rows.push_back({{pad}, {ops::kIgnoreIndex}});  // the arena's fixed shape
    const data::BatchBuffers buf = data::make_batch(rows, T, pad);
    const ops::CrossEntropyResult r = model.forward_loss(buf.batch());
    sum += r.loss_sum;
    count += r.count;
  }
  return count ? sum / double(count) : NAN;
}

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
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  const ModelConfig mcfg = load_hf_config(c.model);
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(c.model);
  if (tok->vocab_size() > mcfg.vocab_size)
    throw Error(fmt::format("the {} tokenizer has {} ids but the model's vocab_size is {}", tok->name(),
                            tok->vocab_size(), mcfg.vocab_size),
                {.file = c.model + "/config.json", .key = "vocab_size"});
  const RunData data = make_data(c, *tok);
  const int64_t T = data.seq_len, B = c.micro_batch_size;
  if (T > mcfg.max_position_embeddings)
    throw Error(fmt::format("seq_len {} exceeds the model's max_position_embeddings {}", T,
                            mcfg.max_position_embeddings),
                {.file = c.source, .key = "seq_len"});
  if (mcfg.sliding_window > 0 && T > mcfg.sliding_window)
    throw Error(fmt::format("seq_len {} exceeds the model's sliding_window {}, which shardlm does not implement", T,
                            mcfg.sliding_window),
                {.file = c.source, .key = "seq_len"});

  ParamStore params(mcfg, c.compute_dtype);
  {
    const io::ModelWeights weights(c.model);
    params.load(weights, c.model);
  }
  model::LlamaCompute model(mcfg, c.compute_dtype);
  model.set_weights(params.compute_weights());
  model.set_grads(params.grads());
  model.reserve(B, T);

  std::error_code ec;
  fs::create_directories(c.output_dir, ec);
  if (ec) throw Error(fmt::format("cannot create the output directory: {}", ec.message()), {.file = c.output_dir});
  MetricsFile metrics((fs::path(c.output_dir) / c.metrics_file).string());
  Progress progress(c.progress, c.log_every);
  const int32_t pad = tok->eos_id();

  progress.print(fmt::format("shardlm train: {} ({} layers, hidden {}, {:.2f}M parameters) in {}", c.model,
                             mcfg.num_hidden_layers, mcfg.hidden_size, double(params.numel()) / 1e6,
                             dtype_name(c.compute_dtype)));
  progress.print(fmt::format("data: {}; tokenizer: {}", data.describe, tok->name()));
  progress.print(fmt::format("batch: {} x {} tokens x {} accumulation = {} tokens per step; {} steps", B, T,
                             c.gradient_accumulation_steps, B * T * c.gradient_accumulation_steps, c.max_steps));

  TrainResult result;
  auto evaluate = [&](int64_t step) {
    const double loss = eval_loss(model, *data.eval, B, T, c.eval_batches, pad);
    nlohmann::json rec = {{"step", step}, {"eval_loss", loss}};
    std::string line = fmt::format("eval step {}: held-out loss {:.4f}", step, loss);
    double acc = -1;
    if (data.task && c.accuracy_examples > 0) {
      int64_t correct = 0;
      acc = task_accuracy(mcfg, params.compute_weights(), *data.task, *tok, c.accuracy_examples, &correct);
      rec["eval_accuracy"] = acc;
      line += fmt::format(", accuracy {:.1f}% ({}/{} held-out problems)", 100 * acc, correct,
                          std::min(c.accuracy_examples, data.task->size()));
    }
    metrics.write(rec);
    progress.print(line);
    if (step == 0) {
      result.initial_eval_loss = loss;
      result.initial_accuracy = acc;
    }
    result.eval_loss = loss;
    result.accuracy = acc;
  };
  evaluate(0);

  Sampler sampler(data.train->size(), c.seed);
  ops::AdamWConfig opt = c.optimizer;
  const auto t_train = clock::now();
  int64_t tokens_seen = 0;
  for (int64_t step = 1; step <= c.max_steps; ++step) {
    // Every micro-batch of the step is built first, so the loss can be normalized by the
    // non-ignored tokens of the whole global batch (what one big batch would do).
    std::vector<data::BatchBuffers> micro;
    for (int64_t m = 0; m < c.gradient_accumulation_steps; ++m) {
      std::vector<data::Example> rows;
      for (int64_t r = 0; r < B; ++r) rows.push_back(data.train->get(sampler.next()));
      micro.push_back(data::make_batch(rows, T, pad));
    }
    opt.lr = c.schedule.at(step);
    const StepResult sr = train_step(params, model, micro, opt, step, c.max_grad_norm);
    const double loss = sr.loss, norm = sr.grad_norm;
    if (!std::isfinite(loss)) throw Error(fmt::format("training diverged: loss is {} at step {}", loss, step));
    tokens_seen += B * T * c.gradient_accumulation_steps;

    const double elapsed = std::chrono::duration<double>(clock::now() - t_train).count();
    StepStats s{step, c.max_steps, loss, opt.lr, norm, double(tokens_seen) / elapsed, elapsed,
                MemoryTracker::for_device(Device::CPU).stats().live_total};
    progress.step(s);
    metrics.write({{"step", step}, {"loss", loss}, {"lr", opt.lr}, {"grad_norm", norm},
                   {"tokens_per_s", s.tokens_per_s}, {"elapsed_s", elapsed}, {"epoch", sampler.epoch()},
                   {"mem_live_bytes", s.mem_bytes}});
    if (step == 1) result.first_loss = loss;
    result.last_loss = loss;
    result.steps = step;
    if (c.eval_every > 0 && step % c.eval_every == 0 && step != c.max_steps) evaluate(step);
  }
  evaluate(c.max_steps);
  result.seconds = std::chrono::duration<double>(clock::now() - t_train).count();
  result.tokens_per_s = double(tokens_seen) / result.seconds;
  progress.finish();

  save_hf_model(c.output_dir, mcfg, params, c.save_dtype, io::parse_size(c.max_shard_size), c.model);
  const MemStats mem = MemoryTracker::for_device(Device::CPU).stats();
  std::string peaks;
  for (int i = 0; i < kNumMemCategories; ++i)
    if (mem.peak[size_t(i)] > 0)
      peaks += fmt::format("{}{} {}", peaks.empty() ? "" : ", ", mem_category_name(MemCategory(i)), format_bytes(mem.peak[size_t(i)]));
  progress.print(fmt::format("done: {} steps in {}, {:.0f} tokens/s; loss {:.4f} -> {:.4f}; held-out loss {:.4f} -> {:.4f}",
                             result.steps, format_duration(result.seconds), result.tokens_per_s, result.first_loss,
                             result.last_loss, result.initial_eval_loss, result.eval_loss));
  progress.print(fmt::format("peak memory: {} tracked ({})", format_bytes(mem.peak_total), peaks));
  progress.print(fmt::format("saved the trained model to {} ({} total {:.1f}s)", c.output_dir,
                             dtype_name(c.save_dtype), std::chrono::duration<double>(clock::now() - t_start).count()));
  return result;
}

}  // namespace shardlm::train
