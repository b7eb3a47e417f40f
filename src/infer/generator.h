// Text generation with a KV cache, one sequence at a time.
//
// The Generator reads weights it does not own (views that must outlive it) and owns its caches:
// per layer, keys and values of every position so far ([max_len, Hkv * Dh], f32). Each decoder
// block runs model::decoder_block_forward, the same code training uses.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "model/llama.h"

namespace shardlm::infer {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  float temperature = 0.8f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
};

class Generator {
 public:
  Generator(const ModelConfig& cfg, const model::LlamaWeights& weights, int64_t max_len);

  // Runs `tokens` through the model after what is cached (prefill or one decode step) and returns
  // the logits of the last position, [vocab].
  std::vector<float> forward(const std::vector<int32_t>& tokens);
  // Logits of every position of `tokens` from an empty cache, [T, vocab] (for tests).
  std::vector<float> forward_all(const std::vector<int32_t>& tokens);
  void reset() { length_ = 0; }
  int64_t length() const { return length_; }

  // Prompt in, new tokens out; stops at any of `stop_ids`, at max_new_tokens or at max_len.
  // on_token (optional) sees each new token as it is produced (for streaming output).
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const SamplingOptions& opt,
                                const std::vector<int32_t>& stop_ids,
                                const std::function<void(int32_t)>& on_token = {});

 private:
  std::vector<float> run(const std::vector<int32_t>& tokens, bool all_logits);

  ModelConfig cfg_;
  model::LlamaWeights w_;
  int64_t max_len_;
  int64_t length_ = 0;
  std::vector<float> inv_freq_;
  std::vector<OwnedTensor> k_cache_, v_cache_;
};

// Picks a token from logits: greedy at temperature 0, else softmax(logits / temperature)
// restricted to the top_k largest and the smallest set whose mass reaches top_p, sampled with
// the counter-based RNG at (seed, "sample", step).
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& opt, uint64_t step);

}  // namespace shardlm::infer
