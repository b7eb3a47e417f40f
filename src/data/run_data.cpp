#include "data/run_data.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "data/packing.h"

namespace shardlm::data {

namespace {

constexpr const char* kBuiltinAddition = "builtin:addition";

// The data type of a file when `data.type` is auto.
std::string resolve_type(const DataConfig& dc, const std::string& path) {
  if (dc.type != DataType::Auto) return std::string(enum_name(dc.type));
  if (path == kBuiltinAddition) return kBuiltinAddition;
  if (path.ends_with(".bin") || path.ends_with(".tokens")) return "tokens";
  if (path.ends_with(".json") || path.ends_with(".jsonl")) return detect_json_kind(path, dc.columns);
  return "text";
}

// Record k of a file is held out when this hash of k falls below the fraction: deterministic,
// independent of the seed and of which other records were skipped, and spread over the file.
bool held_out_record(int64_t k, double fraction) {
  const auto r = philox4x32({uint32_t(k), uint32_t(uint64_t(k) >> 32), 0xe7a1, 0}, {0x5eed, 0x5711});
  return double(r[0]) < fraction * 4294967296.0;
}

}  // namespace

bool reads_text(const DataConfig& dc) {
  if (!dc.mixture.empty())
    return std::any_of(dc.mixture.begin(), dc.mixture.end(), [](const DataSource& s) { return reads_text(s.data); });
  const std::string type = resolve_type(dc, dc.train);
  return type == "text" || type == "alpaca" || type == "chat" || type == "preference";
}

namespace {

// A mixture: each source loaded as a run's data of its own, then concatenated, with each source's
// units per epoch for the sampler (MixPart).
RunData load_mixture(const DataConfig& dc, int64_t seq_len, uint64_t seed, const Tokenizer& tok,
                     int64_t model_vocab_size) {
  RunData d;
  d.seq_len = seq_len;
  std::vector<std::unique_ptr<Dataset>> train, eval;
  std::vector<std::string> types;
  std::optional<bool> packing;  // as the sources set it: they must agree
  bool any_packs = false;
  for (size_t i = 0; i < dc.mixture.size(); ++i) {
    DataConfig sc = dc.mixture[i].data;
    sc.chat_template = dc.chat_template;
    sc.evaluate_whole_file = dc.evaluate_whole_file;
    const ErrorContext at{.file = sc.train};
    RunData p = load_run_data(sc, seq_len, seed, tok, model_vocab_size);
    if (p.task) throw Error("builtin:addition cannot be part of a mixture", at);
    if (i > 0 && p.pairs != d.pairs)
      throw Error(fmt::format("{} data cannot be mixed with {} data: preference pairs mix only with pairs", p.type,
                              types[0]),
                  at);
    if (sc.packing) {
      if (packing && *packing != *sc.packing)
        throw Error("the sources of a mixture disagree on data.packing (their rows are formed together)", at);
      packing = sc.packing;
    }
    any_packs |= p.packing;
    d.pairs = p.pairs;
    types.push_back(p.type);
    for (const std::string& line : p.report) d.report.push_back(fmt::format("source {} ({}): {}", i + 1, sc.train, line));
    for (auto& load : p.loads) d.loads.push_back(std::move(load));
    train.push_back(std::move(p.train));
    eval.push_back(std::move(p.eval));
  }
  d.packing = packing.value_or(any_packs);
  // Units: examples, or pairs of two.
  const int64_t per = d.pairs ? 2 : 1;
  int64_t total = 0, begin = 0;
  double weights = 0;
  for (size_t i = 0; i < train.size(); ++i) {
    total += train[i]->size() / per;
    weights += dc.mixture[i].weight;
  }
  std::vector<std::string> parts;
  for (size_t i = 0; i < train.size(); ++i) {
    const DataSource& src = dc.mixture[i];
    const int64_t size = train[i]->size() / per;
    const double share = src.weight > 0 ? src.weight / weights * double(total) / double(size)
                                        : src.epochs > 0 ? src.epochs : 1.0;
    const int64_t n = std::max<int64_t>(1, std::llround(share * double(size)));
    d.mixture.push_back({src.data.train, begin, size, n});
    begin += size;
    parts.push_back(fmt::format("{} {} ({:.2f} passes)", src.data.train, n, double(n) / double(size)));
  }
  int64_t epoch = 0;
  for (const MixPart& m : d.mixture) epoch += m.per_epoch;
  d.report.push_back(fmt::format("mixture: an epoch of {} {}: {}", epoch, d.pairs ? "pairs" : "examples",
                                 fmt::join(parts, ", ")));
  d.type = fmt::format("mixture ({})", fmt::join(types, ", "));
  d.train = std::make_unique<ConcatDataset>(std::move(train));
  d.eval = std::make_unique<ConcatDataset>(std::move(eval));
  return d;
}

}  // namespace

RunData load_run_data(const DataConfig& dc, int64_t seq_len, uint64_t seed, const Tokenizer& tok,
                      int64_t model_vocab_size) {
  if (!dc.mixture.empty()) return load_mixture(dc, seq_len, seed, tok, model_vocab_size);
  RunData d;
  d.type = resolve_type(dc, dc.train);
  d.seq_len = seq_len;
  if (d.type == kBuiltinAddition) {
    d.train = std::make_unique<AdditionTask>(tok, dc.digits, false, dc.train_examples, seed);
    auto eval = std::make_unique<AdditionTask>(tok, dc.digits, true, dc.eval_examples, seed);
    d.task = eval.get();
    d.eval = std::move(eval);
    // Rows are short: no need for longer rows than the longest problem.
    d.seq_len = std::min(seq_len, AdditionTask::max_tokens(dc.digits));
    d.packing = dc.packing.value_or(false);
    d.report.push_back(fmt::format("{} ({}-digit operands, {} training problems, {} held-out)", dc.train, dc.digits,
                                   dc.train_examples, dc.eval_examples));
    return d;
  }
  if (d.type == "alpaca" || d.type == "chat" || d.type == "preference") {
    d.pairs = d.type == "preference";
    if (d.pairs && dc.packing.value_or(false))
      throw Error("preference pairs are not packed: each row is one side of a pair (set data.packing: false)",
                  {.file = dc.train});
    d.packing = dc.packing.value_or(!d.pairs);
    InstructOptions opt;
    opt.columns = dc.columns;
    opt.train_on_input = dc.train_on_input;
    opt.chat_format = std::string(enum_name(dc.chat_format));
    opt.chat_template = dc.chat_template;
    opt.on_bad_row = dc.on_bad_row;
    opt.max_seq_len = seq_len;
    LoadReport rep;
    std::vector<int64_t> ordinals;
    std::vector<Example> all = load_instruct_file(dc.train, d.type, tok, opt, rep, &ordinals);
    d.loads.emplace_back(dc.train, rep);
    std::vector<Example> train, eval;
    if (dc.evaluate_whole_file) {
      eval = std::move(all);
      d.report.push_back(fmt::format("{}: {}; every example evaluated", dc.train, rep.summary()));
      if (eval.empty()) throw Error("no examples to evaluate", {.file = dc.train});
      d.train = std::make_unique<ExampleDataset>(std::vector<Example>{});
      d.eval = std::make_unique<ExampleDataset>(std::move(eval));
      return d;
    }
    if (!dc.eval.empty()) {
      const std::string eval_type = resolve_type(dc, dc.eval);
      if (eval_type != d.type)
        throw Error(fmt::format("the eval file is {} data but the training file is {}", eval_type, d.type),
                    {.file = dc.eval});
      LoadReport erep;
      eval = load_instruct_file(dc.eval, d.type, tok, opt, erep);
      d.loads.emplace_back(dc.eval, erep);
      train = std::move(all);
      d.report.push_back(fmt::format("train {}: {}", dc.train, rep.summary()));
      d.report.push_back(fmt::format("eval {}: {}", dc.eval, erep.summary()));
    } else {
      for (size_t i = 0; i < all.size(); ++i)
        (dc.eval_fraction > 0 && held_out_record(ordinals[i], dc.eval_fraction) ? eval : train)
            .push_back(std::move(all[i]));
      // A tiny file may draw no held-out record: hold out its last example (pair) rather than none.
      const size_t unit = d.pairs ? 2 : 1;
      if (dc.eval_fraction > 0 && eval.empty() && train.size() >= 2 * unit) {
        eval.assign(std::make_move_iterator(train.end() - int64_t(unit)), std::make_move_iterator(train.end()));
        train.resize(train.size() - unit);
      }
      d.report.push_back(fmt::format("{}: {}", dc.train, rep.summary()));
      d.report.push_back(fmt::format("split: {} training examples, {} held out (eval_fraction {}, by a hash of "
                                     "the record number)",
                                     train.size(), eval.size(), dc.eval_fraction));
    }
    if (train.empty()) throw Error("no training examples are left after the eval split", {.file = dc.train});
    d.train = std::make_unique<ExampleDataset>(std::move(train));
    d.eval = std::make_unique<ExampleDataset>(std::move(eval));
    return d;
  }
  d.packing = dc.packing.value_or(false);
  auto load = [&](const std::string& path) {
    const std::string type = resolve_type(dc, path);
    if (type != "tokens" && type != "text")
      throw Error(fmt::format("the {} file is {} data, but the training file is {}", path, type, d.type),
                  {.file = path});
    return type == "tokens" ? read_token_file(path, dc.token_bytes, model_vocab_size)
                            : tokenize_text_file(path, tok);
  };
  std::vector<int32_t> train_tokens = load(dc.train), eval_tokens;
  if (dc.evaluate_whole_file) {
    const int64_t n = int64_t(train_tokens.size());
    d.train = std::make_unique<TokenStreamDataset>(std::vector<int32_t>{}, d.seq_len);
    d.eval = std::make_unique<TokenStreamDataset>(std::move(train_tokens), d.seq_len);
    if (d.eval->size() == 0)
      throw Error(fmt::format("{} tokens make no sequence of seq_len {} + 1", n, d.seq_len), {.file = dc.train});
    d.report.push_back(fmt::format("{} ({}: {} tokens, every one evaluated)", dc.train, d.type, n));
    return d;
  }
  if (!dc.eval.empty()) {
    eval_tokens = load(dc.eval);
  } else if (dc.eval_fraction > 0) {
    // A token stream is split at the tail: windows from either side never share text.
    const size_t split = size_t(double(train_tokens.size()) * (1.0 - dc.eval_fraction));
    eval_tokens.assign(train_tokens.begin() + int64_t(split), train_tokens.end());
    train_tokens.resize(split);
  }
  const int64_t n_train = int64_t(train_tokens.size()), n_eval = int64_t(eval_tokens.size());
  d.train = std::make_unique<TokenStreamDataset>(std::move(train_tokens), d.seq_len);
  d.eval = std::make_unique<TokenStreamDataset>(std::move(eval_tokens), d.seq_len);
  if (d.train->size() == 0)
    throw Error(fmt::format("{} training tokens make no sequence of seq_len {} + 1", n_train, d.seq_len),
                {.file = dc.train});
  d.report.push_back(fmt::format("{} ({}: {} training tokens, {} held-out tokens)", dc.train, d.type, n_train, n_eval));
  return d;
}

EvalSums eval_loss_sums(const std::function<ops::CrossEntropyResult(const model::Batch&)>& forward, const Dataset& eval,
                        bool packing, int64_t B, int64_t T, int64_t max_rows, int32_t pad, int rank, int world_size) {
  if (eval.size() == 0 || max_rows == 0) return {};
  std::vector<int64_t> order(static_cast<size_t>(eval.size()));
  std::iota(order.begin(), order.end(), 0);
  std::vector<std::vector<int64_t>> rows;
  if (packing) {
    rows = pack_greedy(order, [&](int64_t i) { return eval.length(i); }, T);
  } else {
    for (const int64_t i : order) rows.push_back({i});
  }
  EvalSums sums;
  // Global batch g holds rows [g B W, (g + 1) B W); rank r evaluates its B of them. Every rank
  // runs the same number of forward passes (they may contain collectives): a rank whose slice of
  // the last batch is empty runs one ignored row.
  const int64_t G = B * world_size;
  const int64_t n_rows = max_rows < 0 ? int64_t(rows.size()) : std::min(int64_t(rows.size()), max_rows);
  for (int64_t g = 0; g * G < n_rows; ++g) {
    const int64_t begin = std::min(n_rows, g * G + rank * B);
    const int64_t end = std::min(n_rows, begin + B);
    if (begin == end) {
      std::vector<Example> none = {{{pad}, {ops::kIgnoreIndex}}};
      (void)forward(make_padded_batch(none, T, pad).batch());
      continue;
    }
    const int64_t b0 = begin;
    BatchBuffers buf;
    if (packing) {
      std::vector<std::vector<Example>> packed;
      for (int64_t r = b0; r < end; ++r) {
        packed.emplace_back();
        for (const int64_t i : rows[size_t(r)]) packed.back().push_back(eval.get(i));
      }
      buf = make_packed_batch(packed, T, pad);
    } else {
      std::vector<Example> padded;
      for (int64_t r = b0; r < end; ++r) padded.push_back(eval.get(rows[size_t(r)][0]));
      buf = make_padded_batch(padded, T, pad);
    }
    const ops::CrossEntropyResult r = forward(buf.batch());
    sums.loss_sum += r.loss_sum;
    sums.tokens += r.count;
    sums.rows += end - begin;
  }
  return sums;
}

}  // namespace shardlm::data
