#include "train/evaluation.h"

#include <algorithm>

#include "infer/generator.h"

namespace shardlm::train {

namespace {

// The answers are a few digits: longer ones are wrong anyway.
constexpr int64_t kMaxNewTokens = 12;

// The logits of each sequence's last position through the engine, identical on every rank.
// Collective: rank r runs its contiguous share of the sequences as one batch, right-padded to the
// longest with `pad` (causal attention: padding after a row's end changes nothing before it), and
// the ranks exchange their rows in one all-gather. A rank with no sequence still runs one padding
// row, so that every rank takes part in each unit's gather.
std::vector<float> last_logits(shard::ShardedModel& engine, model::LlamaCompute& m,
                               const std::vector<std::vector<int32_t>>& sequences, int32_t pad,
                               comm::Communicator& world) {
  const int64_t n = int64_t(sequences.size()), W = world.size(), V = m.config().vocab_size;
  const int64_t per_rank = (n + W - 1) / W, lo = std::min(n, world.rank() * per_rank), hi = std::min(n, lo + per_rank);
  std::vector<std::vector<int32_t>> mine(sequences.begin() + lo, sequences.begin() + hi);
  if (mine.empty()) mine.push_back({pad});
  size_t cols = 0;
  for (const auto& s : mine) cols = std::max(cols, s.size());
  data::BatchBuffers buf;
  buf.B = int64_t(mine.size());
  buf.T = int64_t(cols);
  buf.ids.assign(size_t(buf.B) * cols, pad);
  buf.targets.assign(size_t(buf.B) * cols, ops::kIgnoreIndex);
  for (size_t b = 0; b < mine.size(); ++b) std::copy(mine[b].begin(), mine[b].end(), buf.ids.begin() + int64_t(b * cols));
  std::vector<float> logits(size_t(buf.B) * cols * size_t(V));
  engine.forward_logits(m, buf.batch(), Tensor::view(logits.data(), DType::F32, {buf.B * int64_t(cols), V}));
  std::vector<float> rows(size_t(per_rank * V)), all(size_t(W * per_rank * V));
  for (int64_t b = 0; b < hi - lo; ++b) {
    const float* row = logits.data() + (size_t(b) * cols + mine[size_t(b)].size() - 1) * size_t(V);
    std::copy(row, row + V, rows.begin() + b * V);
  }
  world.all_gather(Tensor::view(all.data(), DType::F32, {W * per_rank * V}),
                   Tensor::view(rows.data(), DType::F32, {per_rank * V}));
  all.resize(size_t(n * V));  // rank r's rows are sequences r * per_rank ...: in order, then unused rows
  return all;
}

}  // namespace

EvalResult task_accuracy(shard::ShardedModel& engine, model::LlamaCompute& m, const data::AdditionTask& task,
                         const data::Tokenizer& tok, int64_t n, int64_t B, int64_t T, comm::Communicator& world) {
  EvalResult r;
  r.problems = std::min(n, task.size());
  const int32_t eos = tok.eos_id();
  // At most B rows per rank in a forward, of at most T positions (prompt and answer fit a training
  // row), so decoding never grows the activation arena beyond training's.
  infer::Generator gen(
      m.config(), [&](const std::vector<std::vector<int32_t>>& seqs) { return last_logits(engine, m, seqs, eos, world); },
      T, B * world.size());
  std::vector<infer::Request> requests;
  for (int64_t i = 0; i < r.problems; ++i)
    requests.push_back({tok.encode_with(task.prompt(i), true, false), {.max_new_tokens = kMaxNewTokens, .temperature = 0}});
  // Whole prompts in one step: without a cache, each prefill chunk would recompute its whole sequence.
  const std::vector<infer::Completion> answers = gen.run(requests, {eos}, {}, 0);
  for (int64_t i = 0; i < r.problems; ++i) r.correct += tok.decode(answers[size_t(i)].tokens) == task.answer(i);
  r.accuracy = r.problems ? double(r.correct) / double(r.problems) : 0.0;
  return r;
}

EvalResult eval_loss(shard::ShardedModel& engine, model::LlamaCompute& m, const RunInputs& in, int64_t max_rows,
                     comm::Communicator& world) {
  const data::EvalSums part = data::eval_loss_sums(
      [&](const model::Batch& b) { return engine.forward_loss(m, b); }, *in.data.eval, in.data.packing, in.B, in.T,
      max_rows, in.tok->eos_id(), world.rank(), world.size());
  const double sum = world.all_reduce_sum(part.loss_sum), count = world.all_reduce_sum(double(part.tokens));
  EvalResult r;
  r.loss = count > 0 ? sum / count : NAN;
  r.tokens = int64_t(count);
  r.rows = int64_t(world.all_reduce_sum(double(part.rows)));
  return r;
}

EvalResult evaluate(shard::ShardedModel& engine, model::LlamaCompute& m, const RunInputs& in, const TrainConfig& c,
                    comm::Communicator& world) {
  const EvalResult l = eval_loss(engine, m, in, c.eval_batches * in.B * world.size(), world);
  EvalResult r;
  if (in.data.task && c.accuracy_examples > 0)
    r = task_accuracy(engine, m, *in.data.task, *in.tok, c.accuracy_examples, in.B, in.T, world);
  r.loss = l.loss;
  r.tokens = l.tokens;
  r.rows = l.rows;
  return r;
}

}  // namespace shardlm::train
