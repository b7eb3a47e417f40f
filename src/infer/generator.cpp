#include "infer/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "ops/ops.h"

namespace shardlm::infer {

Generator::Generator(const ModelConfig& cfg, const model::LlamaWeights& weights, int64_t max_len, int64_t max_batch,
                     const Pipeline& pipeline, DType kv_dtype)
    : cfg_(cfg), w_(weights), max_len_(max_len), kv_dtype_(kv_dtype), comm_(pipeline.comm) {
  SHARDLM_CHECK(max_len >= 1, "generation length must be >= 1");
  SHARDLM_CHECK(kv_dtype == DType::F32 || kv_dtype == DType::BF16, "a KV cache in f32 or bf16, not {}",
                dtype_name(kv_dtype));
  SHARDLM_CHECK(max_batch >= 1, "generation batch size must be >= 1, got {}", max_batch);
  share_ = {.layer_begin = 0, .layer_end = cfg.num_hidden_layers, .embed = true, .head = true, .bytes = 0};
  if (comm_) {
    const int R = comm_->size(), me = comm_->rank();
    SHARDLM_CHECK(int(pipeline.shares.size()) == R, "a pipeline of {} shares on {} ranks", pipeline.shares.size(), R);
    share_ = pipeline.shares[size_t(me)];
    head_rank_ = -1;
    for (int r = 0; r < R; ++r)
      if (pipeline.shares[size_t(r)].head) head_rank_ = r;
    SHARDLM_CHECK(head_rank_ >= 0, "a pipeline without a head");
    // The pipeline is the ranks with something to do, in rank order (placement fills ranks in order).
    if (!share_.empty()) {
      for (int r = me - 1; r >= 0 && prev_ < 0; --r)
        if (!pipeline.shares[size_t(r)].empty()) prev_ = r;
      for (int r = me + 1; r < R && next_ < 0; ++r)
        if (!pipeline.shares[size_t(r)].empty()) next_ = r;
      SHARDLM_CHECK(share_.embed || prev_ >= 0, "rank {} has no embedding and no rank before it", me);
      SHARDLM_CHECK(share_.head || next_ >= 0, "rank {} has no head and no rank after it", me);
    }
  }
  inv_freq_ = ops::rope_inv_freq(cfg.head_dim, float(cfg.rope_theta), cfg.rope_scaling);
  slots_.resize(size_t(max_batch));
}

Generator::Generator(const ModelConfig& cfg, Recompute recompute, int64_t max_len, int64_t max_batch)
    : Generator(cfg, model::LlamaWeights{}, max_len, max_batch) {
  SHARDLM_CHECK(bool(recompute), "a generator without weights needs a forward");
  recompute_ = std::move(recompute);
}

int64_t Generator::kv_cache_bytes_per_sequence() const {
  if (recompute_) return 0;
  const int64_t kvd = cfg_.num_key_value_heads * cfg_.head_dim;
  return 2 * (share_.layer_end - share_.layer_begin) * max_len_ * kvd * int64_t(dtype_size(kv_dtype_));
}

int Generator::acquire() {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].used) {
      slots_[i].used = true;
      slots_[i].length = 0;
      return int(i);
    }
  return -1;
}

void Generator::release(int slot) {
  SHARDLM_CHECK(slot >= 0 && slot < int(slots_.size()), "no generation slot {}", slot);
  slots_[size_t(slot)].used = false;
  slots_[size_t(slot)].length = 0;
}

std::vector<float> Generator::forward(const std::vector<int>& slots, const std::vector<int32_t>& tokens) {
  return run_rows(slots, tokens, false);
}

std::vector<float> Generator::forward_all(const std::vector<int32_t>& tokens) {
  reset();
  return run_rows({0}, tokens, true);
}

std::vector<float> Generator::run_rows(const std::vector<int>& slots, const std::vector<int32_t>& tokens,
                                       bool all_logits) {
  const int64_t B = int64_t(slots.size());
  SHARDLM_CHECK(B >= 1 && !tokens.empty() && int64_t(tokens.size()) % B == 0,
                "{} tokens cannot be split evenly over {} sequences", tokens.size(), B);
  const int64_t Tq = int64_t(tokens.size()) / B, N = B * Tq;
  const int64_t D = cfg_.hidden_size, F = cfg_.intermediate_size, V = cfg_.vocab_size, H = cfg_.num_attention_heads;
  const int64_t qd = H * cfg_.head_dim, kvd = cfg_.num_key_value_heads * cfg_.head_dim;
  for (int64_t b = 0; b < B; ++b) {
    const int s = slots[size_t(b)];
    SHARDLM_CHECK(s >= 0 && s < int(slots_.size()), "no generation slot {}", s);
    SHARDLM_CHECK(std::count(slots.begin(), slots.end(), s) == 1, "slot {} appears twice in one step", s);
    Slot& slot = slots_[size_t(s)];
    SHARDLM_CHECK(slot.length + Tq <= max_len_, "sequence of {} tokens exceeds the generation limit of {}",
                  slot.length + Tq, max_len_);
    if (slot.k_cache.empty() && !recompute_)  // first use of this slot: a cache per layer this rank runs
      for (int64_t l = share_.layer_begin; l < share_.layer_end; ++l) {
        slot.k_cache.emplace_back(kv_dtype_, std::initializer_list<int64_t>{max_len_, kvd}, MemCategory::Activations,
                                  false);
        slot.v_cache.emplace_back(kv_dtype_, std::initializer_list<int64_t>{max_len_, kvd}, MemCategory::Activations,
                                  false);
      }
  }
  if (recompute_) {  // no cache: each sequence goes through whole, and only its last row counts
    SHARDLM_CHECK(!all_logits, "the logits of every position need a generator with weights");
    std::vector<std::vector<int32_t>> sequences;
    for (int64_t b = 0; b < B; ++b) {
      Slot& slot = slots_[size_t(slots[size_t(b)])];
      slot.tokens.resize(size_t(slot.length));  // a new occupant or a reset starts empty
      slot.tokens.insert(slot.tokens.end(), tokens.begin() + b * Tq, tokens.begin() + (b + 1) * Tq);
      slot.length += Tq;
      sequences.push_back(slot.tokens);
    }
    std::vector<float> logits = recompute_(sequences);
    SHARDLM_CHECK(int64_t(logits.size()) == B * V, "the forward returned {} logits for {} sequences of vocabulary {}",
                  logits.size(), B, V);
    return logits;
  }
  // Logits of every row for all_logits, else of each sequence's last row: [R, V].
  const int64_t R = all_logits ? N : B;
  std::vector<float> logits(static_cast<size_t>(R * V));
  if (share_.empty()) {  // a rank of a split model with no part: it only takes the logits
    for (int s : slots) slots_[size_t(s)].length += Tq;
    comm_->broadcast(Tensor::view(logits.data(), DType::F32, {R, V}), head_rank_);
    return logits;
  }
  const MemCategory ws = MemCategory::Workspace;
  auto make = [&](std::initializer_list<int64_t> shape) { return OwnedTensor(DType::F32, shape, ws, false); };
  // The block's activations for the N = B * Tq new rows (sequence b's rows are b*Tq .. b*Tq+Tq-1).
  OwnedTensor x = make({N, D}), xn1 = make({N, D}), rstd1 = make({N}), q = make({N, qd}), k = make({N, kvd}),
              v = make({N, kvd}), att = make({N, qd}), lse = make({B, H, Tq}), h1 = make({N, D}), xn2 = make({N, D}),
              rstd2 = make({N}), gate = make({N, F}), up = make({N, F}), act = make({N, F});
  OwnedTensor ids(DType::I32, {N}, ws, false), pos(DType::I32, {B, Tq}, ws, false);  // pos: each sequence's own
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tq; ++t) {
      ids.t.i32()[b * Tq + t] = tokens[size_t(b * Tq + t)];
      pos.t.i32()[b * Tq + t] = int32_t(slots_[size_t(slots[size_t(b)])].length + t);
    }
  const Tensor inv = Tensor::view(inv_freq_.data(), DType::F32, {int64_t(inv_freq_.size())});
  if (share_.embed) ops::embedding_forward(x.t, w_.embed, ids.t);
  else comm_->recv(x.t, prev_);  // the previous rank's layers' output
  model::AttentionKv kv;
  for (int64_t l = share_.layer_begin; l < share_.layer_end; ++l) {
    kv.k_seq.clear();
    kv.v_seq.clear();
    const size_t own = size_t(l - share_.layer_begin);
    for (int s : slots) {  // each sequence's cache through its Tq new rows
      const Slot& slot = slots_[size_t(s)];
      kv.k_seq.push_back(slot.k_cache[own].t.slice(0, slot.length + Tq));
      kv.v_seq.push_back(slot.v_cache[own].t.slice(0, slot.length + Tq));
    }
    model::BlockActivations a{x.t, xn1.t, rstd1.t, q.t, k.t, v.t, att.t, lse.t,
                              h1.t, xn2.t, rstd2.t, gate.t, up.t, act.t, {}};  // no adapters: merged, if any
    // x = h1 + down(act): the next block's input (x_in is read only before h1 is made).
    model::decoder_block_forward(cfg_, w_.layers[size_t(l)], a, kv, pos.t, Tensor{}, inv, B, Tq, x.t, l);
  }
  for (int s : slots) slots_[size_t(s)].length += Tq;
  if (!share_.head) {
    comm_->send(x.t, next_);
    comm_->broadcast(Tensor::view(logits.data(), DType::F32, {R, V}), head_rank_);
    return logits;
  }
  // Final norm and logits.
  Tensor rows = x.t;
  OwnedTensor last;
  if (!all_logits && Tq > 1) {
    last = make({B, D});
    for (int64_t b = 0; b < B; ++b) ops::cast(last.t.slice(b, b + 1), x.t.slice(b * Tq + Tq - 1, b * Tq + Tq));
    rows = last.t;
  }
  OwnedTensor xn = make({R, D}), rstd = make({R});
  ops::rmsnorm_forward(xn.t, rstd.t, rows, w_.final_norm, float(cfg_.rms_norm_eps));
  const Tensor out = Tensor::view(logits.data(), DType::F32, {R, V});
  ops::matmul(out, xn.t, w_.lm_head, false, true);
  if (comm_ && comm_->size() > 1) comm_->broadcast(out, head_rank_);  // every rank samples the same tokens
  return logits;
}

void apply_repetition_penalty(std::vector<float>& logits, const std::vector<int32_t>& seen, float penalty) {
  if (penalty == 1.0f) return;
  std::vector<int32_t> ids = seen;  // each distinct token once, as transformers' gather/scatter does
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int32_t id : ids) {
    if (id < 0 || size_t(id) >= logits.size()) continue;
    float& l = logits[size_t(id)];
    l = l < 0.0f ? l * penalty : l / penalty;
  }
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

TokenLogprobs token_logprobs(const float* logits, int64_t V, int32_t token, int n) {
  SHARDLM_CHECK(token >= 0 && token < V, "token {} outside the vocabulary of {}", token, V);
  float top = logits[0];
  for (int64_t i = 1; i < V; ++i) top = std::max(top, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - double(top));
  const double lse = double(top) + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = float(double(logits[token]) - lse);
  // The n largest, kept sorted (n is small: a pass over the vocabulary, an insertion now and then).
  std::vector<std::pair<int32_t, float>>& best = out.top;
  if (n > 0) {
    best.reserve(size_t(n) + 1);
    for (int64_t i = 0; i < V; ++i) {
      const float l = logits[i];
      if (int(best.size()) == n && !(l > best.back().second)) continue;
      auto at = std::upper_bound(best.begin(), best.end(), l, [](float v, const auto& e) { return v > e.second; });
      best.insert(at, {int32_t(i), l});
      if (int(best.size()) > n) best.pop_back();
    }
    for (auto& e : best) e.second = float(double(e.second) - lse);
  }
  return out;
}

Batch::Admit Batch::admit(size_t id, const Request& r) {
  const int64_t P = int64_t(r.prompt.size());
  SHARDLM_CHECK(P >= 1, "request {}: the prompt is empty", id);
  SHARDLM_CHECK(P <= gen_.max_len(), "request {}: a prompt of {} tokens exceeds the generation limit of {}", id, P,
                gen_.max_len());
  // No position for a new token: nothing to do, unless the prompt is to be scored.
  const bool nothing = r.opt.max_new_tokens <= 0 || P == gen_.max_len();
  if (nothing && !r.prompt_logprobs) return Admit::NothingToDo;
  const int slot = gen_.acquire();
  if (slot < 0) return Admit::Full;
  const auto t0 = std::chrono::steady_clock::now();
  Active a{id, slot, r, r.prompt, {}, {}, nothing};
  try {
    if (r.prompt_logprobs) {  // every row's logits: row t predicts prompt[t + 1], the last the next token
      const int64_t V = gen_.vocab_size();
      const std::vector<float> rows = gen_.forward_rows(slot, r.prompt);
      a.out.prompt_logprobs.reserve(size_t(P - 1));
      for (int64_t t = 0; t + 1 < P; ++t)
        a.out.prompt_logprobs.push_back(token_logprobs(rows.data() + t * V, V, r.prompt[size_t(t + 1)],
                                                       std::max(r.logprobs, 0)));
      a.logits.assign(rows.end() - V, rows.end());
    } else {
      a.logits = gen_.forward(std::vector<int>{slot}, r.prompt);
    }
  } catch (...) {
    gen_.release(slot);
    throw;
  }
  a.out.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  active_.push_back(std::move(a));
  return Admit::Joined;
}

const Completion* Batch::progress(size_t id) const {
  for (const Active& s : active_)
    if (s.id == id) return &s.out;
  return nullptr;
}

void Batch::step(const Generator::TokenHook& on_token, const DoneHook& on_done) {
  if (active_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = gen_.vocab_size();
  // Each sequence samples its next token from its own logits, at its own step; those that finish
  // leave the batch, the rest go through one decode step together.
  std::vector<Active> running, finished;
  std::vector<int> step_slots;
  std::vector<int32_t> step_tokens;
  for (Active& s : active_) {
    Completion& c = s.out;
    if (s.score_only) {  // scored at admission; nothing to generate
      c.finish = FinishReason::Length;
      gen_.release(s.slot);
      finished.push_back(std::move(s));
      continue;
    }
    // Logprobs are the raw logits': kept before the repetition penalty changes them.
    std::vector<float> raw;
    if (s.req.logprobs >= 0 && s.req.opt.repetition_penalty != 1.0f) raw = s.logits;
    apply_repetition_penalty(s.logits, s.seen, s.req.opt.repetition_penalty);
    const int32_t tok = sample_token(s.logits, s.req.opt, uint64_t(c.tokens.size()));
    bool done = true;
    if (std::find(stop_ids_.begin(), stop_ids_.end(), tok) != stop_ids_.end()) {
      c.finish = FinishReason::Stop;
    } else {
      c.tokens.push_back(tok);
      s.seen.push_back(tok);
      const TokenLogprobs* lp = nullptr;
      if (s.req.logprobs >= 0) {
        c.logprobs.push_back(token_logprobs(raw.empty() ? s.logits.data() : raw.data(), V, tok, s.req.logprobs));
        lp = &c.logprobs.back();
      }
      if (on_token && on_token(s.id, tok, lp)) c.finish = FinishReason::Stop;
      else if (int64_t(c.tokens.size()) >= s.req.opt.max_new_tokens ||
               int64_t(s.req.prompt.size() + c.tokens.size()) >= gen_.max_len())
        c.finish = FinishReason::Length;  // the next token would have no position
      else
        done = false;
    }
    if (done) {
      gen_.release(s.slot);
      finished.push_back(std::move(s));
      continue;
    }
    step_slots.push_back(s.slot);
    step_tokens.push_back(tok);
    running.push_back(std::move(s));
  }
  active_ = std::move(running);
  if (!active_.empty()) {
    const std::vector<float> logits = gen_.forward(step_slots, step_tokens);  // [B, V]
    for (size_t b = 0; b < active_.size(); ++b)
      active_[b].logits.assign(logits.begin() + int64_t(b) * V, logits.begin() + int64_t(b + 1) * V);
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (Active& s : active_) s.out.decode_seconds += dt;
  for (Active& s : finished) {
    s.out.decode_seconds += dt;
    on_done(s.id, std::move(s.out));
  }
}

std::vector<size_t> Batch::clear() {
  std::vector<size_t> ids;
  for (const Active& s : active_) {
    gen_.release(s.slot);
    ids.push_back(s.id);
  }
  active_.clear();
  return ids;
}

std::vector<Completion> Generator::run(const std::vector<Request>& requests, const std::vector<int32_t>& stop_ids,
                                      const TokenHook& on_token) {
  std::vector<Completion> out(requests.size());
  Batch batch(*this, stop_ids);
  size_t next = 0;
  while (next < requests.size() || !batch.empty()) {
    // Sequences join while slots are free (a request with nothing to generate keeps its empty
    // completion).
    while (next < requests.size() && batch.admit(next, requests[next]) != Batch::Admit::Full) ++next;
    batch.step(on_token, [&](size_t id, Completion&& c) { out[id] = std::move(c); });
  }
  return out;
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, const SamplingOptions& opt,
                                         const std::vector<int32_t>& stop_ids,
                                         const std::function<void(int32_t)>& on_token) {
  TokenHook hook;
  if (on_token) hook = [&](size_t, int32_t id, const TokenLogprobs*) {
    on_token(id);
    return false;
  };
  return run({{prompt, opt}}, stop_ids, hook)[0].tokens;
}

}  // namespace shardlm::infer
