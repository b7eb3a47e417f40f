#include "infer/generator.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "ops/ops.h"

namespace shardlm::infer {

Generator::Generator(const ModelConfig& cfg, const model::LlamaWeights& weights, int64_t max_len)
    : cfg_(cfg), w_(weights), max_len_(max_len) {
  SHARDLM_CHECK(max_len >= 1, "generation length must be >= 1");
  inv_freq_ = ops::rope_inv_freq(cfg.head_dim, float(cfg.rope_theta), cfg.rope_scaling);
  const int64_t kvd = cfg.num_key_value_heads * cfg.head_dim;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    k_cache_.emplace_back(DType::F32, std::initializer_list<int64_t>{max_len, kvd}, MemCategory::Activations, false);
    v_cache_.emplace_back(DType::F32, std::initializer_list<int64_t>{max_len, kvd}, MemCategory::Activations, false);
  }
}

std::vector<float> Generator::forward(const std::vector<int32_t>& tokens) { return run(tokens, false); }

std::vector<float> Generator::forward_all(const std::vector<int32_t>& tokens) {
  reset();
  return run(tokens, true);
}

std::vector<float> Generator::run(const std::vector<int32_t>& tokens, bool all_logits) {
  const int64_t Tq = int64_t(tokens.size());
  SHARDLM_CHECK(Tq >= 1, "nothing to run: no tokens");
  SHARDLM_CHECK(length_ + Tq <= max_len_, "sequence of {} tokens exceeds the generation limit of {}", length_ + Tq,
                max_len_);
  const int64_t Tk = length_ + Tq, D = cfg_.hidden_size, F = cfg_.intermediate_size, V = cfg_.vocab_size;
  const int64_t qd = cfg_.num_attention_heads * cfg_.head_dim;
  const MemCategory ws = MemCategory::Workspace;
  auto make = [&](std::initializer_list<int64_t> shape) { return OwnedTensor(DType::F32, shape, ws, false); };
  OwnedTensor x = make({Tq, D}), xn1 = make({Tq, D}), rstd1 = make({Tq}), q = make({Tq, qd}), att = make({Tq, qd}),
              lse = make({1, cfg_.num_attention_heads, Tq}), h1 = make({Tq, D}), xn2 = make({Tq, D}),
              rstd2 = make({Tq}), gate = make({Tq, F}), up = make({Tq, F}), act = make({Tq, F});
  OwnedTensor ids(DType::I32, {Tq}, ws, false), pos(DType::I32, {1, Tq}, ws, false);
  for (int64_t t = 0; t < Tq; ++t) {
    ids.t.i32()[t] = tokens[size_t(t)];
    pos.t.i32()[t] = int32_t(length_ + t);
  }
  const Tensor inv = Tensor::view(inv_freq_.data(), DType::F32, {int64_t(inv_freq_.size())});
  ops::embedding_forward(x.t, w_.embed, ids.t);
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    const Tensor kc = k_cache_[size_t(l)].t, vc = v_cache_[size_t(l)].t;
    model::BlockActivations a{x.t, xn1.t, rstd1.t, q.t, kc.slice(length_, Tk), vc.slice(length_, Tk), att.t, lse.t,
                              h1.t, xn2.t, rstd2.t, gate.t, up.t, act.t, {}};  // no adapters: merged, if any
    // x = h1 + down(act): the next block's input (x_in is read only before h1 is made).
    model::decoder_block_forward(cfg_, w_.layers[size_t(l)], a, kc.slice(0, Tk), vc.slice(0, Tk), pos.t, Tensor{},
                                 inv, 1, Tq, Tk, x.t, l);
  }
  length_ = Tk;
  // Final norm and logits: of every row for forward_all, else of the last row only.
  const Tensor rows = all_logits ? x.t : x.t.slice(Tq - 1, Tq);
  OwnedTensor xn = make({rows.shape[0], D}), rstd = make({rows.shape[0]});
  ops::rmsnorm_forward(xn.t, rstd.t, rows, w_.final_norm, float(cfg_.rms_norm_eps));
  std::vector<float> logits(static_cast<size_t>(rows.shape[0] * V));
  ops::matmul(Tensor::view(logits.data(), DType::F32, {rows.shape[0], V}), xn.t, w_.lm_head, false, true);
  return logits;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& opt, uint64_t step) {
  const int64_t V = int64_t(logits.size());
  if (opt.temperature <= 0.0f) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  int64_t keep = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  std::vector<double> p(static_cast<size_t>(keep));
  const double top = logits[size_t(order[0])];
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    p[size_t(i)] = std::exp((double(logits[size_t(order[size_t(i)])]) - top) / opt.temperature);
    total += p[size_t(i)];
  }
  if (opt.top_p < 1.0f) {  // nucleus: the smallest prefix whose probability reaches top_p
    double mass = 0.0;
    int64_t n = 0;
    while (n < keep && mass < opt.top_p * total) mass += p[size_t(n++)];
    keep = std::max<int64_t>(n, 1);
    total = mass;
  }
  double u = double(rng_uniform(opt.seed, stream_id("sample"), step)) * total;
  for (int64_t i = 0; i < keep; ++i) {
    u -= p[size_t(i)];
    if (u < 0.0) return order[size_t(i)];
  }
  return order[size_t(keep - 1)];
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, const SamplingOptions& opt,
                                         const std::vector<int32_t>& stop_ids,
                                         const std::function<void(int32_t)>& on_token) {
  reset();
  std::vector<int32_t> out;
  std::vector<float> logits = forward(prompt);
  for (int64_t step = 0; step < opt.max_new_tokens && length_ < max_len_; ++step) {
    const int32_t next = sample_token(logits, opt, uint64_t(step));
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
    out.push_back(next);
    if (on_token) on_token(next);
    if (step + 1 == opt.max_new_tokens || length_ >= max_len_) break;
    logits = forward({next});
  }
  return out;
}

}  // namespace shardlm::infer
