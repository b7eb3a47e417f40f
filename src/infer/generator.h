// Text generation with a KV cache, for a batch of sequences of different lengths.
//
// The Generator reads weights it does not own (views that must outlive it) and owns the KV cache
// of a running batch: up to max_batch slots, each one sequence's block table into a paged cache
// (infer/kv_cache.h: blocks of KvCacheOptions::block_size positions, f32 or bf16, taken as the
// sequence grows and given back when it leaves, within the cache's capacity). Weights may be f32 or
// bf16 (`--dtype bf16`: ParamStore::keep_only_bf16); activations, norms, softmax and logits are
// f32 either way, and a bf16 cache holds the keys and values rounded once as they are written
// (attention reads every key and value, the new ones included, from the cache). Sequences join the batch
// and leave it (release) between forwards; one forward runs the new tokens of every listed sequence
// through each layer together: norms, projections, MLP and head as one [n, d] computation,
// attention per sequence against its own blocks (model::decoder_block_forward with paged keys and
// values, the block training runs). When the blocks run out, Batch preempts (below).
// Batch (below) is the scheduling on top: run() drives it for `shardlm generate`, the server's
// scheduler (infer/server.h) for `shardlm serve`, and generate() (one prompt) is run() with a
// batch of one.
//
// A model split over ranks (`generate --device-map`, infer/placement.h) runs the same Generator on
// every rank, in lockstep: each rank's Generator holds only its share (its layers' weights and KV
// caches, maybe the embedding and the head); a forward receives the hidden states [N, d] from the
// previous rank of the pipeline (or embeds the tokens), runs its layers, and sends them to the
// next one (or computes the logits); the head's rank then broadcasts the logits to every rank, so
// every rank samples the same tokens and runs the same scheduling (Batch) on the same requests.
//
// A model split by tensor parallelism (`generate --tensor-parallel`, infer/tensor_parallel.h) also
// runs the same Generator on every rank, each holding a slice of every weight (a ParamStore with
// the same TensorSplit) and the KV cache of its own heads: every rank runs every layer at once,
// decoder_block_forward all-reducing o_proj's and down_proj's partial sums, and the logits come
// out whole and the same on every rank (an all-gather of each rank's vocabulary columns).
//
// Ranks that cannot run the same scheduling themselves (`serve`: requests arrive at rank 0) follow
// rank 0's: rank 0 calls lead(), and then each of its forwards is first broadcast to the other
// ranks, which run it in follow() until rank 0 calls stop_followers().
//
// On a GPU (`generate --device cuda`: a ParamStore moved there, ParamStore::move_to) the Generator
// runs where its weights are: activations and KV blocks live on that device, each forward uploads
// its token ids and positions and copies back the wanted logits; scheduling and sampling stay on
// the host. One process, one GPU: not with a pipeline or tensor parallelism. On the meta device
// (core/alloc.h) the same path runs and computes nothing (the logits are zeros): the tests run the
// device path there, where any read of device memory from the host would fail.
//
// A model sharded for training (shard/engine.h) has no LlamaWeights to hand over: training's
// evaluation (train/evaluation.h) runs the Generator over a Recompute instead, the engine's
// forward of whole sequences, with the same scheduling and sampling.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "infer/kv_cache.h"
#include "infer/placement.h"
#include "model/llama.h"

namespace shardlm::infer {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  float temperature = 0.8f;        // 0 = greedy
  int64_t top_k = 0;               // 0 = off
  float top_p = 1.0f;              // 1 = off
  float repetition_penalty = 1.0f; // 1 = off; transformers' RepetitionPenaltyLogitsProcessor
  uint64_t seed = 0;
};

// One request of a batch: a tokenized prompt and how to continue it.
struct Request {
  std::vector<int32_t> prompt;
  SamplingOptions opt;
  int logprobs = -1;             // >= 0: each new token's logprob and the `logprobs` most likely; -1: none
  bool prompt_logprobs = false;  // also each prompt token's (after the first), from a prefill of every row;
                                 // with max_new_tokens 0 the prompt is scored and nothing generated
};

// A token's log-probability under the model at its position: log_softmax of the model's raw logits
// over the whole vocabulary, before the repetition penalty, temperature, top-k and top-p (what
// vLLM reports by default), and the most likely tokens there.
struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // most likely first; equal logits: the lower id first
};
// log_softmax(logits[0, V)) at `token`, and its `n` largest entries.
TokenLogprobs token_logprobs(const float* logits, int64_t V, int32_t token, int n);

enum class FinishReason { Stop, Length };
inline const char* finish_reason_name(FinishReason r) { return r == FinishReason::Stop ? "stop" : "length"; }

struct Completion {
  std::vector<int32_t> tokens;  // new tokens, without the stop token that ended them
  FinishReason finish = FinishReason::Length;
  double prefill_seconds = 0.0;  // wall time of the steps from its admission until its prompt was prefilled
  double decode_seconds = 0.0;   // wall time of the steps after (each shared with the batch's other work)
  std::vector<TokenLogprobs> logprobs;         // one per token of `tokens` (Request::logprobs >= 0)
  std::vector<TokenLogprobs> prompt_logprobs;  // prompt[1..] (Request::prompt_logprobs)
  int preemptions = 0;  // times its KV blocks were taken for older requests (then recomputed: same tokens)
};

// A model split over the ranks of `comm` (which must outlive the Generator): shares[r] is rank
// r's. The default, no communicator, is the whole model in this process.
struct Pipeline {
  comm::Communicator* comm = nullptr;
  std::vector<RankShare> shares;  // one per rank of comm
};

// A model split over the ranks of `comm` by tensor parallelism (infer/tensor_parallel.h): rank r
// holds slice r of `comm->size()`. comm must outlive the Generator. The default: not split.
struct TensorParallel {
  comm::Communicator* comm = nullptr;
};

// A model that is not held as LlamaWeights and keeps no KV cache, such as the training engine
// (shard/engine.h: its parameters are sharded over ranks and gathered one unit at a time for each
// forward). Given every sequence of a step, whole (prompt and tokens so far), it returns the logits
// of each one's last position, [sequences, vocab]. Over ranks it is collective: every rank's
// Generator is driven with the same requests, and the function returns the same logits on every
// rank, so all of them take the same scheduling decisions.
using Recompute = std::function<std::vector<float>(const std::vector<std::vector<int32_t>>& sequences)>;

// Prompt tokens one step of a Batch prefills at most, over all its members (see Batch).
constexpr int64_t kDefaultPrefillChunk = 256;

class Generator {
 public:
  // max_len: positions per sequence (prompt + new tokens); max_batch: sequences held at once.
  // With a pipeline, `weights` need only this rank's share bound; with tensor parallelism they are
  // this rank's slices (ParamStore with TensorSplit{rank, size}). `cfg` is the whole model's.
  // kv: the KV cache's dtype, block size and memory limit (on one rank; split over ranks, the
  // blocks that fit on the fullest rank, so that every rank's cache holds the same positions). It
  // must hold one sequence of max_len.
  Generator(const ModelConfig& cfg, const model::LlamaWeights& weights, int64_t max_len, int64_t max_batch = 1,
            const Pipeline& pipeline = {}, const TensorParallel& tp = {}, const KvCacheOptions& kv = {});
  // Every forward runs through `recompute` over the sequences' whole tokens (no KV cache here);
  // the scheduling and sampling are the same. forward_all is not available.
  Generator(const ModelConfig& cfg, Recompute recompute, int64_t max_len, int64_t max_batch = 1);

  int64_t max_len() const { return max_len_; }
  // The KV cache on this rank: its blocks' size, and how many it may hold, holds and has made. A
  // Recompute generator keeps none (all zero).
  struct KvCacheStats {
    int64_t block_size = 0, bytes_per_block = 0, capacity = 0, in_use = 0, made = 0;
  };
  KvCacheStats kv_cache_stats() const;
  int64_t max_batch() const { return int64_t(slots_.size()); }
  int64_t vocab_size() const { return cfg_.vocab_size; }

  // ---- the running batch ------------------------------------------------------------------------
  // A free slot, or -1 when all max_batch are in use.
  int acquire();
  // Frees a slot (its sequence leaves the batch; its KV blocks go back to the cache).
  void release(int slot);
  // Takes the KV blocks for `new_tokens` more positions of the sequence in `slot` (a forward takes
  // them itself; Batch asks first, to preempt when they are not there). False, taking none, when
  // the cache has too few. Always true without a cache.
  bool reserve(int slot, int64_t new_tokens);
  // Empties a slot that stays in use: its KV blocks go back to the cache and its length to 0 (a
  // preempted sequence, to be prefilled again).
  void evict(int slot);
  // Whether the sequence in `slot` holds KV blocks.
  bool holds_cache(int slot) const { return !slots_[size_t(slot)].table.ids.empty(); }
  int64_t length(int slot) const { return slots_[size_t(slot)].length; }
  // One sequence's part of a forward: `tokens` appended to the sequence in `slot`, and whether the
  // logits of every new position are wanted (prompt logprobs; not with a Recompute) or only the last.
  struct Rows {
    int slot = 0;
    std::vector<int32_t> tokens;
    bool all_logits = false;
  };
  // One forward of several sequences (distinct slots), each with its own number of new tokens: a
  // decode step of some and prefill chunks of others together. Returns the wanted logits, sequence
  // after sequence: [sum over parts of (all_logits ? tokens : 1), vocab].
  std::vector<float> forward_parts(const std::vector<Rows>& parts);
  // Appends tokens[b] to the sequence in slots[b] (B distinct slots, each given tokens.size() / B
  // tokens) and returns the logits of each sequence's last new position, [B, vocab].
  std::vector<float> forward(const std::vector<int>& slots, const std::vector<int32_t>& tokens);

  // ---- rank 0 drives the others (serve over ranks) -----------------------------------------------
  // Rank 0: from now on every forward is broadcast to the other ranks before it runs.
  void lead();
  // Ranks other than 0: runs rank 0's forwards, as they come, until it calls stop_followers().
  void follow();
  // Rank 0: ends the others' follow(). Idempotent.
  void stop_followers();

  // ---- one sequence in slot 0 (tests, scoring) -----------------------------------------------------
  // Runs `tokens` through the model after what slot 0 holds and returns the last logits, [vocab].
  std::vector<float> forward(const std::vector<int32_t>& tokens) { return forward(std::vector<int>{0}, tokens); }
  // Logits of every position of `tokens` from an empty slot 0, [T, vocab].
  std::vector<float> forward_all(const std::vector<int32_t>& tokens);
  void reset() { slots_[0].length = 0; }
  int64_t length() const { return slots_[0].length; }

  // ---- scheduling -------------------------------------------------------------------------------
  // on_token(request, token, logprobs) sees each new token of a request as it is produced
  // (streaming, stop strings), with its logprobs when the request asked for them (else null);
  // returning true ends that request with FinishReason::Stop, the token kept.
  using TokenHook = std::function<bool(size_t request, int32_t token, const TokenLogprobs* logprobs)>;
  // Runs every request to completion, at most max_batch at a time, in a Batch (below) that
  // prefills at most prefill_chunk prompt tokens per step: a request enters the batch as soon as
  // a slot is free, is prefilled beside the others' decoding, and leaves it when it stops (one of
  // stop_ids, the hook), reaches its max_new_tokens or max_len. Each request's tokens depend only
  // on its own prompt and options: sampling draws from the counter-based RNG at (its seed, its own
  // step), so the batch it shares changes nothing (at temperature 0 the result is token for token
  // the one-at-a-time one).
  std::vector<Completion> run(const std::vector<Request>& requests, const std::vector<int32_t>& stop_ids,
                              const TokenHook& on_token = {}, int64_t prefill_chunk = kDefaultPrefillChunk);

  // One prompt: run() with a batch of one. on_token (optional) sees each new token.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SamplingOptions& opt,
                                const std::vector<int32_t>& stop_ids,
                                const std::function<void(int32_t)>& on_token = {});

 private:
  struct Slot {
    bool used = false;
    int64_t length = 0;            // positions cached
    BlockTable table;              // its blocks in cache_, for length positions or more (reserved)
    std::vector<int32_t> tokens;   // with a Recompute: the sequence so far
  };
  // Gives back the blocks of `slot` past `positions` (release, evict; a follower mirroring them).
  void trim(int slot, int64_t positions);
  // Tensor parallelism: x [N, D] = the embedding rows of ids [N] (this rank's vocabulary slice,
  // all-reduced), and out [R, V] = the logits of xn [R, D] (this rank's columns, all-gathered).
  void embed_vocab_slice(const Tensor& x, const Tensor& ids);
  void logits_vocab_slices(const Tensor& out, const Tensor& xn);

  ModelConfig cfg_;
  ModelConfig part_cfg_;  // the shapes this rank computes with: cfg_, or its slices' (tensor parallel)
  model::LlamaWeights w_;
  int64_t max_len_;
  // This rank's part of the model (the whole model without a pipeline) and its neighbours.
  comm::Communicator* comm_ = nullptr;
  RankShare share_;
  int prev_ = -1, next_ = -1;  // the ranks hidden states come from (no embedding) and go to (no head)
  int head_rank_ = 0;          // the rank whose logits every rank samples from
  comm::Communicator* tp_ = nullptr;  // tensor parallelism over these ranks
  bool leading_ = false;              // lead(): forwards are broadcast to the followers first
  Recompute recompute_;        // set: forwards go through it, and w_ is unbound
  Device device_ = Device::CPU;  // where the weights are, and so the activations and the KV cache
  OwnedTensor inv_freq_;         // RoPE's inverse frequencies [head_dim / 2], on device_
  std::unique_ptr<KvCache> cache_;  // none with a Recompute
  std::vector<Slot> slots_;
  std::vector<int64_t> freed_;  // lead(): slots released or evicted since the last broadcast forward
};

// A running batch on a Generator: the scheduling that run() (`shardlm generate`) and the server's
// scheduler (infer/server.h: continuous batching) share, so both produce the same tokens.
// Requests join between steps (admit: a free slot) and leave when they finish. Each step() is one
// forward of the batch: every member that has its next token's logits samples it at its own step
// and hands it to on_token, the finished leave (on_done, their slots freed), and the rest go
// through the model together, each decoding member with its new token and each member still
// being prefilled with the next chunk of its prompt: in admission order, at most prefill_chunk
// prompt tokens per step over all of them (0: no limit, whole prompts). So a long prompt that
// arrives mid-stream delays the running members' next token by one chunk's compute, not by its
// whole prefill (chunked prefill), and prompts that arrive together are prefilled in one forward
// (batched prefill). A member's first token is sampled in the step after its prefill completes.
//
// KV blocks (preemption, as vLLM's recompute preemption): the step takes each member's blocks for
// its new positions in admission order. A member whose blocks are not there takes those of the
// youngest members (the last admitted), which give them all back and start over: their prompt and
// tokens so far are prefilled again when blocks are free, in chunks like any prompt, and they go
// on sampling where they stopped (Completion::preemptions counts it; the tokens are the same, as
// sampling depends only on a request's own step). A member not yet started (nothing cached) does
// not preempt: it and those after it wait for free blocks (all of them do in a step that has
// preempted). The Generator's cache holds at least
// one sequence of max_len, so the oldest member always proceeds.
//
// Requests are named by the caller's ids. The Batch uses `gen` (which must outlive it) and holds
// its slots until their requests finish, clear() or its destruction; one thread at a time drives it.
class Batch {
 public:
  using DoneHook = std::function<void(size_t id, Completion&& c)>;
  Batch(Generator& gen, std::vector<int32_t> stop_ids, int64_t prefill_chunk = kDefaultPrefillChunk);
  ~Batch() { clear(); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  enum class Admit {
    Joined,       // holds a slot: its prefill runs in the coming steps, then its tokens come
    Full,         // no free slot: try again after a step()
    NothingToDo,  // max_new_tokens 0, or a prompt of max_len tokens: an empty completion ("length"),
                  // unless it asks for prompt logprobs: then it joins, and ends once they are computed
  };
  // Errors (an empty prompt, one longer than max_len) name the request as "request ID".
  Admit admit(size_t id, const Request& r);
  // One forward of the batch; see the class comment. on_token may be empty.
  void step(const Generator::TokenHook& on_token, const DoneHook& on_done);
  // A member's completion so far; null when not a member.
  const Completion* progress(size_t id) const;
  bool empty() const { return active_.empty(); }
  size_t size() const { return active_.size(); }
  int64_t preemptions() const { return preemptions_; }  // since it was made
  // Ends every member without a result (their slots freed) and returns their ids.
  std::vector<size_t> clear();

 private:
  struct Active {
    size_t id;
    int slot;
    Request req;
    std::vector<int32_t> seen;  // prompt + generated (the repetition penalty's tokens)
    std::vector<float> logits;  // [V]: the next token's, once the prompt is prefilled
    Completion out;
    bool score_only = false;    // prompt logprobs and nothing to generate: ends once they are computed
    int64_t prefilled = 0;      // tokens of `seen` in the cache; all of them before the next token is
                                // sampled (the prompt, then each token; after a preemption, all again)
    bool decoding = false;      // its prompt is cached and it samples: one new token a step
    bool prefilled_all() const { return prefilled == int64_t(seen.size()); }
  };
  // Takes member m's blocks for n more positions, preempting younger members (the last first, m
  // itself at the latest) while they are not there. False when m was preempted.
  bool make_room(size_t m, int64_t n);
  void preempt(Active& s);
  Generator& gen_;
  std::vector<int32_t> stop_ids_;
  int64_t prefill_chunk_;
  std::vector<Active> active_;
  int64_t preemptions_ = 0;
};

// transformers' RepetitionPenaltyLogitsProcessor: for every distinct token of `seen` (prompt and
// tokens generated so far), a positive logit is divided by `penalty`, a negative one multiplied.
void apply_repetition_penalty(std::vector<float>& logits, const std::vector<int32_t>& seen, float penalty);

// Picks a token from logits: greedy at temperature 0, else softmax(logits / temperature)
// restricted to the top_k largest and the smallest set whose mass reaches top_p, sampled with
// the counter-based RNG at (seed, "sample", step). (The repetition penalty is applied before, by
// the caller, which knows the sequence.)
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& opt, uint64_t step);

}  // namespace shardlm::infer
