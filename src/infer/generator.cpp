#include "infer/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/device.h"
#include "core/rng.h"
#include "infer/tensor_parallel.h"
#include "ops/ops.h"

namespace shardlm::infer {

Generator::Generator(const ModelConfig& cfg, const model::LlamaWeights& weights, int64_t max_len, int64_t max_batch,
                     const Pipeline& pipeline, const TensorParallel& tp, const KvCacheOptions& kv)
    : cfg_(cfg), part_cfg_(cfg), w_(weights), max_len_(max_len), comm_(pipeline.comm), tp_(tp.comm) {
  SHARDLM_CHECK(max_len >= 1, "generation length must be >= 1");
  SHARDLM_CHECK(kv.dtype == DType::F32 || kv.dtype == DType::BF16, "a KV cache in f32 or bf16, not {}",
                dtype_name(kv.dtype));
  SHARDLM_CHECK(kv.block_size >= 1, "KV cache blocks of {} positions: at least 1", kv.block_size);
  SHARDLM_CHECK(kv.max_bytes >= 0, "a KV cache limit of {} bytes", kv.max_bytes);
  SHARDLM_CHECK(!(comm_ && tp_), "a model is split over ranks either as a pipeline or by tensor parallelism");
  if (tp_ && tp_->size() > 1) part_cfg_ = sliced_config(cfg, tp_->size());
  else tp_ = nullptr;  // one rank holds whole tensors
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
  for (const Tensor* t : {&weights.embed, &weights.lm_head, &weights.final_norm})
    if (t->defined()) device_ = t->device;
  SHARDLM_CHECK(device_ == Device::CPU || (!comm_ && !tp_),
                "a model split over ranks (--device-map, --tensor-parallel) generates on CPU ranks; on {} one "
                "process holds the whole model", device_name(device_));
  const std::vector<float> inv_freq = ops::rope_inv_freq(cfg.head_dim, float(cfg.rope_theta), cfg.rope_scaling);
  inv_freq_ = OwnedTensor(DType::F32, {int64_t(inv_freq.size())}, MemCategory::Workspace, false, device_);
  device::copy_bytes(inv_freq_.t.data, device_, inv_freq.data(), Device::CPU, inv_freq.size() * sizeof(float));
  slots_.resize(size_t(max_batch));
  // The cache: blocks of at most max_len positions (a larger block would only hold unused ones),
  // as many as max_batch sequences of max_len need, or fewer to stay within kv.max_bytes on the
  // rank that runs the most layers (every rank must hold the same positions: they take the same
  // blocks in lockstep).
  const int64_t block = std::min(kv.block_size, max_len), per_seq = (max_len + block - 1) / block;
  int64_t layers = share_.layer_end - share_.layer_begin, most_layers = layers;
  for (const RankShare& s : pipeline.shares) most_layers = std::max(most_layers, s.layer_end - s.layer_begin);
  const int64_t fullest_block_bytes = 2 * most_layers * block * part_cfg_.kv_dim() * int64_t(dtype_size(kv.dtype));
  int64_t capacity = max_batch * per_seq;
  if (kv.max_bytes > 0 && fullest_block_bytes > 0) {
    const int64_t fit = kv.max_bytes / fullest_block_bytes;
    if (fit < per_seq)
      throw Error(fmt::format("a KV cache of at most {} holds {} blocks of {} positions ({} each), fewer than the {} "
                              "one sequence of {} positions needs ({}): raise the limit or lower the length",
                              format_bytes(kv.max_bytes), fit, block, format_bytes(fullest_block_bytes), per_seq,
                              max_len, format_bytes(per_seq * fullest_block_bytes)),
                  {.key = kv.limit_key});
    capacity = std::min(capacity, fit);
  }
  cache_ = std::make_unique<KvCache>(layers, part_cfg_.num_key_value_heads, part_cfg_.head_dim, kv.dtype, block,
                                     capacity, device_);
}

Generator::Generator(const ModelConfig& cfg, Recompute recompute, int64_t max_len, int64_t max_batch)
    : Generator(cfg, model::LlamaWeights{}, max_len, max_batch) {
  SHARDLM_CHECK(bool(recompute), "a generator without weights needs a forward");
  recompute_ = std::move(recompute);
  cache_.reset();
}

Generator::KvCacheStats Generator::kv_cache_stats() const {
  if (!cache_) return {};
  return {cache_->block_size(), cache_->bytes_per_block(), cache_->capacity(), cache_->in_use(), cache_->made()};
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
  evict(slot);
  slots_[size_t(slot)].used = false;
}

void Generator::evict(int slot) {
  SHARDLM_CHECK(slot >= 0 && slot < int(slots_.size()), "no generation slot {}", slot);
  trim(slot, 0);
  slots_[size_t(slot)].length = 0;
  if (leading_) freed_.push_back(slot);  // the followers give back the same blocks
}

void Generator::trim(int slot, int64_t positions) {
  if (cache_) cache_->shrink(slots_[size_t(slot)].table, positions);
}

bool Generator::reserve(int slot, int64_t new_tokens) {
  SHARDLM_CHECK(slot >= 0 && slot < int(slots_.size()), "no generation slot {}", slot);
  Slot& s = slots_[size_t(slot)];
  SHARDLM_CHECK(s.length + new_tokens <= max_len_, "sequence of {} tokens exceeds the generation limit of {}",
                s.length + new_tokens, max_len_);
  return !cache_ || cache_->grow(s.table, s.length + new_tokens);
}

std::vector<float> Generator::forward(const std::vector<int>& slots, const std::vector<int32_t>& tokens) {
  const size_t B = slots.size();
  SHARDLM_CHECK(B >= 1 && !tokens.empty() && tokens.size() % B == 0,
                "{} tokens cannot be split evenly over {} sequences", tokens.size(), B);
  const size_t Tq = tokens.size() / B;
  std::vector<Rows> parts(B);
  for (size_t b = 0; b < B; ++b)
    parts[b] = {slots[b], std::vector<int32_t>(tokens.begin() + int64_t(b * Tq), tokens.begin() + int64_t((b + 1) * Tq))};
  return forward_parts(parts);
}

std::vector<float> Generator::forward_all(const std::vector<int32_t>& tokens) {
  reset();
  return forward_parts({Rows{0, tokens, true}});
}

// What lead() broadcasts before each forward: kOpForward (parts, tokens in all, slots freed), then
// the slots released or evicted since the last forward (the followers give back their blocks too,
// so that every rank's cache holds the same), then per part its slot, its length before the
// forward, its token count and all_logits, then the tokens; kOpStop ends follow().
namespace {
enum : int64_t { kOpStop = 0, kOpForward = 1 };
}

void Generator::lead() {
  SHARDLM_CHECK(tp_ || comm_, "lead(): the model is not split over ranks");
  SHARDLM_CHECK((tp_ ? tp_ : comm_)->rank() == 0, "lead(): rank 0 drives the others");
  leading_ = true;
}

void Generator::stop_followers() {
  if (!leading_) return;
  leading_ = false;
  int64_t head[4] = {kOpStop, 0, 0, 0};
  (tp_ ? tp_ : comm_)->broadcast_bytes(head, sizeof(head), 0);
}

void Generator::follow() {
  comm::Communicator* c = tp_ ? tp_ : comm_;
  SHARDLM_CHECK(c && c->rank() != 0, "follow(): rank 0 drives the others");
  for (;;) {
    int64_t head[4];
    c->broadcast_bytes(head, sizeof(head), 0);
    if (head[0] == kOpStop) return;
    const int64_t B = head[1], T = head[2], F = head[3];
    SHARDLM_CHECK(B >= 1 && B <= int64_t(slots_.size()) && T >= B && T <= B * max_len_ && F >= 0 &&
                      F <= (int64_t(1) << 24),
                  "a forward of {} sequences and {} tokens, {} slots freed, from rank 0", B, T, F);
    std::vector<int64_t> body(size_t(F + 4 * B + T));
    c->broadcast_bytes(body.data(), body.size() * sizeof(int64_t), 0);
    for (int64_t f = 0; f < F; ++f) {  // rank 0's release and evict
      const int64_t s = body[size_t(f)];
      SHARDLM_CHECK(s >= 0 && s < int64_t(slots_.size()), "no generation slot {}", s);
      trim(int(s), 0);
      slots_[size_t(s)].length = 0;
    }
    std::vector<Rows> parts(static_cast<size_t>(B));
    const auto part = body.begin() + F;
    auto token = part + 4 * B;
    for (int64_t b = 0; b < B; ++b) {
      Rows& p = parts[size_t(b)];
      p.slot = int(part[4 * b]);
      SHARDLM_CHECK(p.slot >= 0 && p.slot < int(slots_.size()), "no generation slot {}", p.slot);
      Slot& slot = slots_[size_t(p.slot)];  // rank 0's acquire and reset, as they left it
      slot.used = true;
      slot.length = part[4 * b + 1];
      SHARDLM_CHECK(slot.length >= 0 && slot.length <= max_len_, "slot {} of length {} from rank 0", p.slot,
                    slot.length);
      const int64_t n = part[4 * b + 2];
      SHARDLM_CHECK(n >= 1 && token + n <= body.end(), "a part of {} tokens from rank 0", n);
      p.tokens.assign(token, token + n);
      token += n;
      p.all_logits = part[4 * b + 3] != 0;
    }
    forward_parts(parts);
  }
}

std::vector<float> Generator::forward_parts(const std::vector<Rows>& parts) {
  const int64_t B = int64_t(parts.size());
  SHARDLM_CHECK(B >= 1, "a forward of no sequences");
  if (leading_) {
    std::vector<int64_t> body = std::move(freed_);
    freed_.clear();
    const int64_t F = int64_t(body.size());
    int64_t T = 0;
    for (const Rows& p : parts) {
      const bool ok = p.slot >= 0 && p.slot < int(slots_.size());
      body.insert(body.end(), {int64_t(p.slot), ok ? slots_[size_t(p.slot)].length : 0, int64_t(p.tokens.size()),
                               int64_t(p.all_logits)});
      T += int64_t(p.tokens.size());
    }
    for (const Rows& p : parts) body.insert(body.end(), p.tokens.begin(), p.tokens.end());
    int64_t head[4] = {kOpForward, B, T, F};
    comm::Communicator* c = tp_ ? tp_ : comm_;
    c->broadcast_bytes(head, sizeof(head), 0);
    c->broadcast_bytes(body.data(), body.size() * sizeof(int64_t), 0);
  }
  // With tensor parallelism the block computes this rank's heads and MLP columns (part_cfg_).
  const int64_t D = cfg_.hidden_size, F = part_cfg_.intermediate_size, V = cfg_.vocab_size,
                H = part_cfg_.num_attention_heads;
  const int64_t qd = part_cfg_.q_dim(), kvd = part_cfg_.kv_dim();
  int64_t N = 0, R = 0;  // new rows; rows whose logits are wanted
  std::vector<int64_t> q_rows;
  std::vector<bool> in_step(slots_.size());  // a linear check: a server's step may hold 1024 slots
  for (const Rows& p : parts) {
    const int s = p.slot;
    const int64_t n = int64_t(p.tokens.size());
    SHARDLM_CHECK(s >= 0 && s < int(slots_.size()), "no generation slot {}", s);
    SHARDLM_CHECK(n >= 1, "slot {}: a forward of no tokens", s);
    SHARDLM_CHECK(!in_step[size_t(s)], "slot {} appears twice in one step", s);
    in_step[size_t(s)] = true;
    SHARDLM_CHECK(reserve(s, n), "slot {}: the KV cache has no free block for {} more positions ({} of {} in use)",
                  s, n, cache_ ? cache_->in_use() : 0, cache_ ? cache_->capacity() : 0);
    q_rows.push_back(n);
    N += n;
    R += p.all_logits ? n : 1;
  }
  if (recompute_) {  // no cache: each sequence goes through whole, and only its last row counts
    std::vector<std::vector<int32_t>> sequences;
    for (const Rows& p : parts) {
      SHARDLM_CHECK(!p.all_logits, "the logits of every position need a generator with weights");
      Slot& slot = slots_[size_t(p.slot)];
      slot.tokens.resize(size_t(slot.length));  // a new occupant or a reset starts empty
      slot.tokens.insert(slot.tokens.end(), p.tokens.begin(), p.tokens.end());
      slot.length += int64_t(p.tokens.size());
      sequences.push_back(slot.tokens);
    }
    std::vector<float> logits = recompute_(sequences);
    SHARDLM_CHECK(int64_t(logits.size()) == B * V, "the forward returned {} logits for {} sequences of vocabulary {}",
                  logits.size(), B, V);
    return logits;
  }
  // The wanted logits: [R, V].
  std::vector<float> logits(static_cast<size_t>(R * V));
  if (share_.empty()) {  // a rank of a split model with no part: it only takes the logits
    for (const Rows& p : parts) slots_[size_t(p.slot)].length += int64_t(p.tokens.size());
    comm_->broadcast(Tensor::view(logits.data(), DType::F32, {R, V}), head_rank_);
    return logits;
  }
  const MemCategory ws = MemCategory::Workspace;
  auto make = [&](std::initializer_list<int64_t> shape) { return OwnedTensor(DType::F32, shape, ws, false, device_); };
  // The block's activations for the N new rows, sequence after sequence.
  OwnedTensor x = make({N, D}), xn1 = make({N, D}), rstd1 = make({N}), q = make({N, qd}), k = make({N, kvd}),
              v = make({N, kvd}), att = make({N, qd}), lse = make({N, H}), h1 = make({N, D}), xn2 = make({N, D}),
              rstd2 = make({N}), gate = make({N, F}), up = make({N, F}), act = make({N, F});
  // The new tokens and their positions (each sequence's own), made on the host and moved to device_.
  std::vector<int32_t> ids_host, pos_host;
  ids_host.reserve(size_t(N));
  pos_host.reserve(size_t(N));
  for (const Rows& p : parts)
    for (size_t t = 0; t < p.tokens.size(); ++t) {
      ids_host.push_back(p.tokens[t]);
      pos_host.push_back(int32_t(slots_[size_t(p.slot)].length + int64_t(t)));
    }
  OwnedTensor ids(DType::I32, {N}, ws, false, device_), pos(DType::I32, {1, N}, ws, false, device_);
  device::copy_bytes(ids.t.data, device_, ids_host.data(), Device::CPU, size_t(N) * sizeof(int32_t));
  device::copy_bytes(pos.t.data, device_, pos_host.data(), Device::CPU, size_t(N) * sizeof(int32_t));
  const Tensor inv = inv_freq_.t;
  if (tp_) embed_vocab_slice(x.t, ids.t);
  else if (share_.embed) ops::embedding_forward(x.t, w_.embed, ids.t);
  else comm_->recv(x.t, prev_);  // the previous rank's layers' output
  model::PartialSums sums;  // tensor parallelism: o_proj's and down_proj's partial sums, all-reduced
  if (tp_) sums = {.sum = [this](const Tensor& t) { tp_->all_reduce(t, comm::ReduceOp::Sum); },
                   .residual = tp_->rank() == 0};
  model::AttentionKv kv;
  kv.q_rows = q_rows;
  kv.paged.resize(size_t(B));
  for (int64_t l = share_.layer_begin; l < share_.layer_end; ++l) {
    const size_t own = size_t(l - share_.layer_begin);
    for (size_t b = 0; b < parts.size(); ++b) {  // each sequence's blocks, through its new rows
      const Slot& slot = slots_[size_t(parts[b].slot)];
      kv.paged[b] = {&slot.table.k[own], &slot.table.v[own], slot.length + int64_t(parts[b].tokens.size())};
    }
    model::BlockActivations a{x.t, xn1.t, rstd1.t, q.t, k.t, v.t, att.t, lse.t,
                              h1.t, xn2.t, rstd2.t, gate.t, up.t, act.t, {}};  // no adapters: merged, if any
    // x = h1 + down(act): the next block's input (x_in is read only before h1 is made).
    model::decoder_block_forward(part_cfg_, w_.layers[size_t(l)], a, kv, pos.t, Tensor{}, inv, B, 0, x.t, l, {},
                                 sums);
  }
  for (const Rows& p : parts) slots_[size_t(p.slot)].length += int64_t(p.tokens.size());
  if (!share_.head) {
    comm_->send(x.t, next_);
    comm_->broadcast(Tensor::view(logits.data(), DType::F32, {R, V}), head_rank_);
    return logits;
  }
  // Final norm and logits, of the wanted rows only.
  Tensor rows = x.t;
  OwnedTensor wanted;
  if (R < N) {
    wanted = make({R, D});
    int64_t r = 0, w = 0;
    for (const Rows& p : parts) {
      const int64_t n = int64_t(p.tokens.size()), keep = p.all_logits ? n : 1;
      ops::cast(wanted.t.slice(w, w + keep), x.t.slice(r + n - keep, r + n));
      r += n;
      w += keep;
    }
    rows = wanted.t;
  }
  OwnedTensor xn = make({R, D}), rstd = make({R});
  ops::rmsnorm_forward(xn.t, rstd.t, rows, w_.final_norm, float(cfg_.rms_norm_eps));
  const Tensor out = Tensor::view(logits.data(), DType::F32, {R, V});
  if (tp_) {
    logits_vocab_slices(out, xn.t);
    return logits;
  }
  if (device_ != Device::CPU) {  // computed there, read here (waits for the device)
    OwnedTensor there = make({R, V});
    ops::matmul(there.t, xn.t, w_.lm_head, false, true);
    device::copy_bytes(logits.data(), Device::CPU, there.t.data, device_, logits.size() * sizeof(float));
    return logits;
  }
  ops::matmul(out, xn.t, w_.lm_head, false, true);
  if (comm_ && comm_->size() > 1) comm_->broadcast(out, head_rank_);  // every rank samples the same tokens
  return logits;
}

void Generator::embed_vocab_slice(const Tensor& x, const Tensor& ids) {
  // Rank r holds the embedding rows of tokens [r Vr, (r+1) Vr): it looks up the tokens there and
  // leaves zeros for the others, and the all-reduce adds each token's one nonzero row (exactly).
  const int64_t Vr = part_cfg_.vocab_size, first = int64_t(tp_->rank()) * Vr, N = ids.numel();
  OwnedTensor local(DType::I32, {N}, MemCategory::Workspace, false);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t id = ids.i32()[n];
    SHARDLM_CHECK(id >= 0 && id < cfg_.vocab_size, "token {} outside the vocabulary of {}", id, cfg_.vocab_size);
    local.t.i32()[n] = id >= first && id < first + Vr ? int32_t(id - first) : 0;
  }
  ops::embedding_forward(x, w_.embed, local.t);
  for (int64_t n = 0; n < N; ++n)
    if (int64_t(ids.i32()[n]) - first < 0 || int64_t(ids.i32()[n]) - first >= Vr) ops::zero(x.slice(n, n + 1));
  tp_->all_reduce(x, comm::ReduceOp::Sum);
}

void Generator::logits_vocab_slices(const Tensor& out, const Tensor& xn) {
  // Each rank's lm_head rows give its columns of the logits; the all-gather stacks them by rank,
  // [ranks, R, Vr], and they are laid out as [R, V]: the same bytes on every rank.
  const int64_t R = xn.shape[0], Vr = part_cfg_.vocab_size, P = tp_->size();
  OwnedTensor mine(DType::F32, {R, Vr}, MemCategory::Workspace, false),
      all(DType::F32, {P, R, Vr}, MemCategory::Workspace, false);
  ops::matmul(mine.t, xn, w_.lm_head, false, true);
  tp_->all_gather(all.t.reshape({P * R * Vr}), mine.t.reshape({R * Vr}));
  const float* from = all.t.f32();
  float* to = out.f32();
  for (int64_t p = 0; p < P; ++p)
    for (int64_t r = 0; r < R; ++r)
      std::copy(from + (p * R + r) * Vr, from + (p * R + r + 1) * Vr, to + r * cfg_.vocab_size + p * Vr);
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

Batch::Batch(Generator& gen, std::vector<int32_t> stop_ids, int64_t prefill_chunk)
    : gen_(gen), stop_ids_(std::move(stop_ids)), prefill_chunk_(prefill_chunk) {
  SHARDLM_CHECK(prefill_chunk >= 0, "the prefill chunk must be >= 0 tokens (0: whole prompts), got {}", prefill_chunk);
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
  active_.push_back(Active{id, slot, r, r.prompt, {}, {}, nothing});
  if (r.prompt_logprobs) active_.back().out.prompt_logprobs.reserve(size_t(P - 1));
  return Admit::Joined;
}

const Completion* Batch::progress(size_t id) const {
  for (const Active& s : active_)
    if (s.id == id) return &s.out;
  return nullptr;
}

void Batch::preempt(Active& s) {
  gen_.evict(s.slot);
  s.prefilled = 0;  // its prompt and every token so far are cached again, then it samples on
  s.decoding = false;
  s.logits.clear();
  ++s.out.preemptions;
  ++preemptions_;
}

bool Batch::make_room(size_t m, int64_t n) {
  Active& s = active_[m];
  for (size_t young = active_.size(); !gen_.reserve(s.slot, n);) {
    while (young > m + 1 && !gen_.holds_cache(active_[young - 1].slot)) --young;
    if (young == m + 1) {  // no younger member holds blocks: m gives its own back and waits
      preempt(s);
      return false;
    }
    preempt(active_[--young]);
  }
  return true;
}

void Batch::step(const Generator::TokenHook& on_token, const DoneHook& on_done) {
  if (active_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t V = gen_.vocab_size();
  // 1. Each member with its next token's logits samples it at its own step; those that finish
  //    leave the batch.
  std::vector<Active> running, finished;
  for (Active& s : active_) {
    Completion& c = s.out;
    if (!s.prefilled_all()) {
      running.push_back(std::move(s));
      continue;
    }
    bool done = true;
    if (s.score_only) {  // its prompt is scored; nothing to generate
      c.finish = FinishReason::Length;
    } else {
      // Logprobs are the raw logits': kept before the repetition penalty changes them.
      std::vector<float> raw;
      if (s.req.logprobs >= 0 && s.req.opt.repetition_penalty != 1.0f) raw = s.logits;
      apply_repetition_penalty(s.logits, s.seen, s.req.opt.repetition_penalty);
      const int32_t tok = sample_token(s.logits, s.req.opt, uint64_t(c.tokens.size()));
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
    }
    if (done) {
      gen_.release(s.slot);
      finished.push_back(std::move(s));
    } else {
      s.decoding = true;  // its new token goes into the cache in this step's forward
      running.push_back(std::move(s));
    }
  }
  active_ = std::move(running);
  // 2. The rest go through one forward together, in admission order, each with its KV blocks: a
  //    decoding member with its new token, a member being prefilled with the next chunk of what
  //    it must cache (its prompt, or after a preemption all it has seen), as long as this step's
  //    budget lasts. A member that cannot get blocks preempts younger ones (make_room), unless it
  //    has not started: then it and every later one that has not started wait, as they all do in
  //    a step that preempted.
  std::vector<Generator::Rows> parts;
  std::vector<size_t> member;  // per part: its member in active_
  int64_t budget = prefill_chunk_ > 0 ? prefill_chunk_ : std::numeric_limits<int64_t>::max();
  bool starts_wait = false;
  for (size_t m = 0; m < active_.size(); ++m) {
    Active& s = active_[m];
    const bool decoding = s.decoding;
    const int64_t n = decoding ? 1 : std::min(int64_t(s.seen.size()) - s.prefilled, budget);
    if (n <= 0) continue;
    const bool starting = !decoding && s.prefilled == 0;
    if (starting && (starts_wait || !gen_.reserve(s.slot, n))) {
      starts_wait = true;
      continue;
    }
    if (!starting) {
      const int64_t preempted = preemptions_;
      const bool room = make_room(m, n);
      // After a preemption nothing starts in this step: the blocks given back are for the older.
      if (preemptions_ != preempted) starts_wait = true;
      if (!room) continue;
    }
    const int64_t P = int64_t(s.req.prompt.size());
    if (decoding) {
      parts.push_back({s.slot, {s.seen.back()}, false});
    } else {
      const auto from = s.seen.begin() + s.prefilled;
      parts.push_back({s.slot, std::vector<int32_t>(from, from + n),
                       s.req.prompt_logprobs && int64_t(s.out.prompt_logprobs.size()) < P - 1});
      budget -= n;
    }
    member.push_back(m);
  }
  if (!parts.empty()) {
    const std::vector<float> logits = gen_.forward_parts(parts);  // the parts' wanted rows, [*, V]
    const float* row = logits.data();
    for (size_t i = 0; i < parts.size(); ++i) {
      Active& s = active_[member[i]];
      const Generator::Rows& p = parts[i];
      const int64_t n = int64_t(p.tokens.size());
      if (p.all_logits) {  // row t of the chunk predicts the token after it: a prompt logprob, once
        const int64_t P = int64_t(s.req.prompt.size());
        for (int64_t t = 0; t < n; ++t, row += V) {
          const int64_t next = s.prefilled + t + 1;
          if (next < P && next == int64_t(s.out.prompt_logprobs.size()) + 1)
            s.out.prompt_logprobs.push_back(token_logprobs(row, V, s.req.prompt[size_t(next)], std::max(s.req.logprobs, 0)));
        }
        row -= V;  // the chunk's last row is also its logits below
      }
      s.prefilled += n;
      if (s.prefilled_all()) s.logits.assign(row, row + V);
      row += V;
    }
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (Active& s : active_)  // the step's time: to its first token, or to its next
    (s.out.tokens.empty() ? s.out.prefill_seconds : s.out.decode_seconds) += dt;
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
                                      const TokenHook& on_token, int64_t prefill_chunk) {
  std::vector<Completion> out(requests.size());
  Batch batch(*this, stop_ids, prefill_chunk);
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
