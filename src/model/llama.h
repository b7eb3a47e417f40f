// The Llama-family decoder (Llama 2/3, Mistral, Qwen2) with explicit forward and backward.
//
// Parameters are grouped into units, the granularity at which the sharding engine gathers and
// frees them (DESIGN.md). Unit 0 is the root: the token embedding, the final norm and the
// lm_head (FSDP's root instance holds exactly these under transformer wrapping); unit 1 + l is
// decoder layer l. Every parameter carries its Hugging Face name.
//
// LlamaCompute owns no parameters: it is handed views (LlamaWeights) of whatever memory holds
// the full parameters in the compute dtype, and views of f32 gradient accumulators, and it owns
// only activations. A training step runs the units in order:
//   embed_forward, block_forward(0..L-1), head_loss (forward + backward of norm, head and loss),
//   block_backward(L-1..0), embed_backward
// and the engine may gather, free or reduce a unit's parameters between those calls.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "ops/ops.h"

namespace shardlm::model {

enum class Init { Normal, Ones, Zeros };

struct ParamInfo {
  std::string name;              // Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  Init init = Init::Normal;
  bool weight_decay = true;      // false for norms and biases, as Hugging Face's Trainer does
  int64_t numel() const;
};

struct UnitLayout {
  std::string name;  // "root" or "model.layers.N"
  std::vector<ParamInfo> params;
  int64_t numel() const;
};

// Unit 0 = root, unit 1 + l = layer l. Tied embeddings: no lm_head.weight parameter.
std::vector<UnitLayout> llama_units(const ModelConfig& cfg);

// Views by role. Biases are undefined tensors when the architecture has none.
struct LayerWeights {
  Tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, mlp_norm, w_gate, w_up, w_down;
};
struct LlamaWeights {
  Tensor embed, final_norm, lm_head;  // lm_head is embed when the embeddings are tied
  std::vector<LayerWeights> layers;
};
// Looks every parameter up by its Hugging Face name (lookup throws for unknown names).
LlamaWeights bind_weights(const ModelConfig& cfg, const std::function<Tensor(const std::string&)>& lookup);
// The same for one decoder layer, or for the root unit's tensors (embedding, final norm, head).
LayerWeights bind_layer(const ModelConfig& cfg, int64_t layer, const std::function<Tensor(const std::string&)>& lookup);
void bind_root(const ModelConfig& cfg, LlamaWeights& w, const std::function<Tensor(const std::string&)>& lookup);

// One micro-batch: B sequences of T tokens. positions and segment_ids may be null (then
// positions are 0..T-1 and there is one segment per sequence); packed sequences set both.
// targets[i] is the token to predict at i (kIgnoreIndex for none).
struct Batch {
  int64_t B = 0, T = 0;
  const int32_t* ids = nullptr;
  const int32_t* targets = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* segment_ids = nullptr;
};

// Activations one decoder block keeps for its backward (all [N, *] with N = B*T rows).
struct BlockActivations {
  Tensor x_in;              // block input (the residual stream)
  Tensor xn1, rstd1;        // attention norm output and its 1/rms
  Tensor q, k, v;           // projections after bias and RoPE: [N, H*Dh], [N, Hkv*Dh]
  Tensor att, lse;          // attention output [N, H*Dh] and log-sum-exp [B, H, T]
  Tensor h1;                // x_in + o_proj(att)
  Tensor xn2, rstd2;        // MLP norm output and its 1/rms
  Tensor gate, up, act;     // [N, F]: projections and silu(gate) * up
};

class LlamaCompute {
 public:
  // act_dtype: f32 or bf16 activations (matches the compute dtype of the weights).
  // device: where the arena lives and every op runs; the weights and gradient views bound to it
  // must be on the same device. On CUDA each batch's ids, targets, positions and segment ids are
  // uploaded into the arena (Batch holds host pointers), and nothing here reads device memory
  // from the host except the loss sums the ops return.
  LlamaCompute(const ModelConfig& cfg, DType act_dtype, Device device = Device::CPU);
  ~LlamaCompute();

  const ModelConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  void set_weights(const LlamaWeights& w) { w_ = w; }
  void set_grads(const LlamaWeights& g) { g_ = g; }
  // Views the engine rebinds unit by unit as it gathers parameters and gradient buffers.
  LlamaWeights& weights() { return w_; }
  LlamaWeights& grads() { return g_; }

  // Activation checkpointing: every k-th decoder layer (layer % k == 0; k = 1: all, 0: none) keeps
  // only its input in the forward and recomputes the rest in its backward.
  void set_checkpointing(int every);
  bool checkpointed(int layer) const;

  // Sizes the activation arena for B x T tokens; it only ever grows, and any batch shape with at
  // most that many tokens reuses it.
  void reserve(int64_t B, int64_t T);

  // ---- the unit-by-unit step -----------------------------------------------------------------
  void embed_forward(const Batch& batch);
  void block_forward(int layer);
  // Final norm, lm_head and cross-entropy. With backward, accumulates grad_scale-scaled
  // gradients of the final norm and lm_head and leaves d(last block output) for block_backward.
  ops::CrossEntropyResult head_loss(const Batch& batch, float grad_scale, bool backward);
  void block_backward(int layer);
  void embed_backward(const Batch& batch);

  // All of the above in order: forward, loss, backward. Returns the loss sum and token count.
  ops::CrossEntropyResult forward_backward(const Batch& batch, float grad_scale);
  // Forward and loss only (evaluation).
  ops::CrossEntropyResult forward_loss(const Batch& batch);
  // Forward to the logits of every position: out [B*T, V] f32 on this object's device (tests, scoring tools).
  void logits(const Batch& batch, const Tensor& out);

  // Activations of layer l (for tests).
  const BlockActivations& activations(int layer) const { return acts_[size_t(layer)]; }

 private:
  struct Arena;
  void bind_positions(const Batch& batch);
  void bind_shape(int64_t B, int64_t T);
  void block_activations(int layer);  // the block's forward, without writing its output

  ModelConfig cfg_;
  DType act_dtype_;
  Device device_;
  LlamaWeights w_, g_;
  std::vector<float> inv_freq_;
  OwnedTensor inv_freq_device_;  // CUDA: inv_freq_ uploaded once
  Tensor inv_freq_t_;            // the view the ops read: of inv_freq_ (CPU) or inv_freq_device_
  int64_t B_ = 0, T_ = 0;
  int checkpoint_every_ = 0;
  std::unique_ptr<Arena> arena_;
  std::vector<BlockActivations> acts_;
  Batch batch_;
};

// The forward of one decoder block on rows x_in (B*Tq rows), writing into `a` (whose tensors
// must already be sized). k_all / v_all are the keys and values attention reads
// ([B, Tk, Hkv, Dh]); the new rows' keys and values are written into a.k / a.v first, which
// for training are k_all / v_all themselves and for generation the tail of a KV cache.
// Shared by training and generation so that both compute exactly the same function.
void decoder_block_forward(const ModelConfig& cfg, const LayerWeights& w, const BlockActivations& a,
                           const Tensor& k_all, const Tensor& v_all, const Tensor& positions,
                           const Tensor& segment_ids, const Tensor& inv_freq, int64_t B, int64_t Tq, int64_t Tk);

}  // namespace shardlm::model
