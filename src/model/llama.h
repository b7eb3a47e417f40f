// The Llama-family decoder (Llama 2/3, Mistral, Qwen2) with explicit forward and backward.
//
// Parameters are grouped into parts, the smallest groups the sharding engine may gather and free
// (DESIGN.md): part 0 is the token embedding, part 1 + l decoder layer l, and the last part the
// head (final norm and lm_head), as torchtitan wraps them. A wrap policy groups parts into units
// (shard/plan.h). Every parameter carries its Hugging Face name; kLayerTensors and kTopTensors
// below are the one table of those names, shapes and roles.
//
// LlamaCompute owns no parameters: it is handed views (LlamaWeights) of whatever memory holds
// the full parameters in the compute dtype, and views of f32 gradient accumulators, and it owns
// only activations. A training step runs the stages in order:
//   embed_forward, block_forward(0..L-1), head_loss (forward + backward of norm, head and loss),
//   block_backward(L-1..0), embed_backward
// and the engine (shard/engine.h) gathers, frees and reduces a unit's parameters between them.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "model/config.h"
#include "ops/ops.h"

namespace shardlm::model {

// LoraKaiming / LoraGaussian: an adapter's A as PEFT initializes it (model/lora_spec.h LoraInit);
// B is Zeros. DoraMagnitude: DoRA's magnitude vector, the row norms of its base weight as the
// forward sees it (B = 0 at the start), which only loading can compute (shard/load.h).
enum class Init { Normal, Ones, Zeros, LoraKaiming, LoraGaussian, DoraMagnitude };

struct ParamInfo {
  std::string name;              // Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight"
                                 // (PEFT's for adapters: "base_model.model.model.layers.3...lora_A.weight")
  std::vector<int64_t> shape;
  Init init = Init::Normal;
  bool weight_decay = true;      // false for norms and biases, as Hugging Face's Trainer does
  // False for a LoRA run's base weights: no gradient, no optimizer state, kept in the compute dtype
  // in a flat buffer of their own (shard/plan.h).
  bool trainable = true;
  // QLoRA: a frozen Linear weight stored in NF4 (FinetuneSpec::nf4_base).
  bool nf4 = false;
  int64_t numel() const;
};

// The Linear layers of a decoder layer a LoRA adapter may target, in kLayerTensors order; their
// Hugging Face module names are model/lora.h's kLoraModules.
enum class LoraModule : uint8_t { Q, K, V, O, Gate, Up, Down };
inline constexpr int kNumLoraModules = 7;

// Views by role. Biases are undefined tensors when the architecture has none.
struct LayerWeights {
  Tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, mlp_norm, w_gate, w_up, w_down;
  // LoRA adapters by LoraModule (undefined when the module is not adapted): A [r, in], B [out, r],
  // and with DoRA the magnitude m [out] (else undefined).
  Tensor lora_a[kNumLoraModules], lora_b[kNumLoraModules], lora_m[kNumLoraModules];
};
struct LlamaWeights {
  Tensor embed, final_norm, lm_head;  // lm_head is embed when the embeddings are tied
  std::vector<LayerWeights> layers;
};

// ---- the parameter table ----------------------------------------------------------------------
// A dimension of the config, for shapes in the table.
enum class Dim : uint8_t { None, Hidden, Intermediate, QDim, KvDim, Vocab };
int64_t dim_size(const ModelConfig& cfg, Dim d);  // None -> 0
// Which architectures have the tensor.
enum class Presence : uint8_t { Always, QkvBias, OBias, Untied };

struct TensorSpec {
  const char* name;  // layer tensors: after "model.layers.N."; others: the full name
  Dim rows, cols;    // shape [rows] or [rows, cols]
  Init init;
  bool weight_decay;
  Presence presence;
};
struct LayerTensorSpec {
  TensorSpec spec;
  Tensor LayerWeights::*slot;
};
// In flat-buffer order.
inline constexpr LayerTensorSpec kLayerTensors[] = {
    {{"input_layernorm.weight", Dim::Hidden, Dim::None, Init::Ones, false, Presence::Always}, &LayerWeights::attn_norm},
    {{"self_attn.q_proj.weight", Dim::QDim, Dim::Hidden, Init::Normal, true, Presence::Always}, &LayerWeights::wq},
    {{"self_attn.q_proj.bias", Dim::QDim, Dim::None, Init::Zeros, false, Presence::QkvBias}, &LayerWeights::bq},
    {{"self_attn.k_proj.weight", Dim::KvDim, Dim::Hidden, Init::Normal, true, Presence::Always}, &LayerWeights::wk},
    {{"self_attn.k_proj.bias", Dim::KvDim, Dim::None, Init::Zeros, false, Presence::QkvBias}, &LayerWeights::bk},
    {{"self_attn.v_proj.weight", Dim::KvDim, Dim::Hidden, Init::Normal, true, Presence::Always}, &LayerWeights::wv},
    {{"self_attn.v_proj.bias", Dim::KvDim, Dim::None, Init::Zeros, false, Presence::QkvBias}, &LayerWeights::bv},
    {{"self_attn.o_proj.weight", Dim::Hidden, Dim::QDim, Init::Normal, true, Presence::Always}, &LayerWeights::wo},
    {{"self_attn.o_proj.bias", Dim::Hidden, Dim::None, Init::Zeros, false, Presence::OBias}, &LayerWeights::bo},
    {{"post_attention_layernorm.weight", Dim::Hidden, Dim::None, Init::Ones, false, Presence::Always},
     &LayerWeights::mlp_norm},
    {{"mlp.gate_proj.weight", Dim::Intermediate, Dim::Hidden, Init::Normal, true, Presence::Always},
     &LayerWeights::w_gate},
    {{"mlp.up_proj.weight", Dim::Intermediate, Dim::Hidden, Init::Normal, true, Presence::Always}, &LayerWeights::w_up},
    {{"mlp.down_proj.weight", Dim::Hidden, Dim::Intermediate, Init::Normal, true, Presence::Always},
     &LayerWeights::w_down},
};
struct TopTensorSpec {
  TensorSpec spec;
  Tensor LlamaWeights::*slot;
};
inline constexpr TopTensorSpec kEmbeddingTensor = {
    {"model.embed_tokens.weight", Dim::Vocab, Dim::Hidden, Init::Normal, true, Presence::Always}, &LlamaWeights::embed};
inline constexpr TopTensorSpec kHeadTensors[] = {
    {{"model.norm.weight", Dim::Hidden, Dim::None, Init::Ones, false, Presence::Always}, &LlamaWeights::final_norm},
    {{"lm_head.weight", Dim::Vocab, Dim::Hidden, Init::Normal, true, Presence::Untied}, &LlamaWeights::lm_head},
};

// ---- parts ------------------------------------------------------------------------------------
enum class PartKind : uint8_t { Embedding, Layer, Head };
// One LoRA adapter of a layer: its module (a LoraModule index) and the PEFT names of A and B (and
// of DoRA's magnitude; empty without DoRA).
struct LoraSlot {
  int module = 0;
  std::string a_name, b_name, m_name = "";
};
struct ModelPart {
  PartKind kind = PartKind::Layer;
  int64_t layer = -1;  // PartKind::Layer only
  std::string name;    // "model.embed_tokens", "model.layers.N", "lm_head"
  std::vector<ParamInfo> params;
  std::vector<LoraSlot> lora = {};  // a layer's adapters (FinetuneSpec::lora), which bind_part binds
  int64_t numel() const;
};
// Part 0 = the embedding, part 1 + l = layer l, the last part = the head (final norm, and lm_head
// unless the embeddings are tied: then the head computes with the embedding part's tensor).
// With a fine-tune's adapters (finetune.lora) the base is frozen and each layer's A and B follow its
// base tensors; with finetune.nf4_base the frozen Linear weights are marked NF4 (ParamInfo::nf4).
std::vector<ModelPart> llama_parts(const ModelConfig& cfg, const FinetuneSpec& finetune = {});
// Whether QLoRA keeps `info` of `part` in NF4, as bitsandbytes' Linear4bit does: the decoder's
// Linear weights; norms, biases, the embedding and lm_head stay in the compute dtype.
bool quantized_by_qlora(const ModelPart& part, const ParamInfo& info);
// Whether generation's `--dtype q8_0` holds this parameter in Q8_0 blocks (core/q8_0.h): one QLoRA
// would quantize whose rows are whole blocks of 32 (info's shape: a slice's, with tensor parallelism).
// The others are held in bf16. The one rule for the store (infer::ParamStore::keep_only_q8_0) and
// the placement's sizes (infer::part_sizes).
bool held_in_q8_0(const ModelPart& part, const ParamInfo& info);

// Points a part's slots of `w` at tensors found by Hugging Face name (lookup throws for unknown
// names), or, with an empty lookup, unbinds them (undefined tensors), so that using a freed part
// fails loudly. Binding the embedding of a tied model also sets lm_head.
using TensorLookup = std::function<Tensor(const std::string&)>;
void bind_part(const ModelConfig& cfg, const ModelPart& part, LlamaWeights& w, const TensorLookup& lookup);
// Every part at once (a whole model in one process: generation, init, tests).
LlamaWeights bind_weights(const ModelConfig& cfg, const TensorLookup& lookup);

// One micro-batch: B sequences of T tokens. positions and segment_ids may be null (then
// positions are 0..T-1 and there is one segment per sequence); packed sequences set both.
// targets[i] is the token to predict at i (kIgnoreIndex for none).
struct Batch {
  int64_t B = 0, T = 0;
  const int32_t* ids = nullptr;
  const int32_t* targets = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* segment_ids = nullptr;
  // LoRA dropout's mask stream for this micro-batch (ops::dropout); 0 = no dropout (evaluation).
  uint64_t dropout_key = 0;
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
  // LoRA: u = dropout(x) A^T [N, r] of each adapted module (the backward's input to dB), by LoraModule.
  Tensor lora_u[kNumLoraModules];
};

// What the sharding engine drives: a model's compute, stage by stage, on weights and gradient
// views the engine binds part by part (LlamaCompute).
class StagedModel {
 public:
  virtual ~StagedModel() = default;
  // Views the engine rebinds unit by unit as it gathers parameters and gradient buffers.
  LlamaWeights& weights() { return w_; }
  LlamaWeights& grads() { return g_; }
  void set_weights(const LlamaWeights& w) { w_ = w; }
  void set_grads(const LlamaWeights& g) { g_ = g; }

  // Sizes the activation memory for B x T tokens; it only ever grows.
  virtual void reserve(int64_t B, int64_t T) = 0;
  virtual void embed_forward(const Batch& batch) = 0;
  virtual void block_forward(int layer) = 0;
  // Final norm, lm_head and cross-entropy. With backward, accumulates grad_scale-scaled
  // gradients of the final norm and lm_head and leaves d(last block output) for block_backward.
  virtual ops::CrossEntropyResult head_loss(const Batch& batch, float grad_scale, bool backward) = 0;
  // Final norm and lm_head of every position after the forward: out [B*T, V] f32.
  virtual void head_logits(const Tensor& out) = 0;
  // Whole-row losses, for objectives over sequences (preference tuning, train/preference.h): the
  // final norm, lm_head and, per row b < B, the sum of -log p(target) over the row's non-ignored
  // targets into row_loss[b]. With `weigh`, which turns those sums into each row's gradient scale
  // (row_scale[b] = dLoss/d row_loss[b]), the head's backward follows as head_loss's does, every
  // row's gradient scaled by its own factor.
  using RowWeigh = std::function<void(std::span<const double> row_loss, std::span<float> row_scale)>;
  virtual void head_rows(const Batch& batch, std::span<double> row_loss, const RowWeigh& weigh) = 0;
  virtual void block_backward(int layer) = 0;
  virtual void embed_backward(const Batch& batch) = 0;

 protected:
  LlamaWeights w_, g_;
};

class LlamaCompute final : public StagedModel {
 public:
  // act_dtype: f32 or bf16 activations (matches the compute dtype of the weights).
  // device: where the arena lives and every op runs; the weights and gradient views bound to it
  // must be on the same device. On CUDA each batch's ids, targets, positions and segment ids are
  // uploaded into the arena (Batch holds host pointers), and nothing here reads device memory
  // from the host except the loss sums the ops return. On the meta device (core/alloc.h) it
  // allocates what it would on the CPU and computes nothing: the memory estimator's dry run.
  // lora: the adapters' spec when the parts bound to it have adapters (FinetuneSpec::lora; none:
  // the model config.json describes. NF4 is the engine's alone: the weights bound here are
  // already dequantized).
  LlamaCompute(const ModelConfig& cfg, DType act_dtype, Device device = Device::CPU,
               const std::optional<LoraSpec>& lora = std::nullopt);
  ~LlamaCompute() override;

  const ModelConfig& config() const { return cfg_; }
  Device device() const { return device_; }

  // Activation checkpointing: every k-th decoder layer (layer % k == 0; k = 1: all, 0: none) keeps
  // only its input in the forward and recomputes the rest in its backward. With offload
  // (offload_activations) that input goes to host memory after the layer's forward (pinned beside
  // a GPU, copied on a lane of its own while the next layers compute; on a CPU rank a buffer
  // charged to MemCategory::OffloadedActivations) and comes back before its backward, the next
  // checkpointed layer's prefetched while this one's backward runs. On the device the checkpointed
  // layers' inputs then share two buffers. The bits computed are the same either way.
  void set_checkpointing(int every, bool offload = false);
  bool checkpointed(int layer) const;
  bool offloaded(int layer) const { return offload_ && checkpointed(layer); }

  // Sizes the activation arena for B x T tokens; it only ever grows, and any batch shape with at
  // most that many tokens reuses it.
  void reserve(int64_t B, int64_t T) override;

  // ---- the stages (StagedModel) --------------------------------------------------------------
  void embed_forward(const Batch& batch) override;
  void block_forward(int layer) override;
  ops::CrossEntropyResult head_loss(const Batch& batch, float grad_scale, bool backward) override;
  void head_logits(const Tensor& out) override;
  void head_rows(const Batch& batch, std::span<double> row_loss, const RowWeigh& weigh) override;
  void block_backward(int layer) override;
  void embed_backward(const Batch& batch) override;

  // Whether the forward applies the bound LoRA adapters (default true). Off, the blocks compute
  // the frozen base alone (PEFT's disable_adapter()): DPO's reference model under LoRA, with no
  // second copy of the weights. Only forwards may run with them off.
  void set_adapters_enabled(bool on) { adapters_enabled_ = on; }

  // Forward to the logits of every position with every part bound (a whole model in one process:
  // tests and scoring tools): out [B*T, V] f32 on this object's device.
  void logits(const Batch& batch, const Tensor& out);

  // Activations of layer l (for tests).
  const BlockActivations& activations(int layer) const { return acts_[size_t(layer)]; }

 private:
  struct Arena;
  void bind_positions(const Batch& batch);
  Tensor head_forward(const Batch& batch);
  void bind_shape(int64_t B, int64_t T);
  // The block's forward; its output (the next block's input) only with write_output (a
  // recomputing backward must not rewrite it).
  void block_activations(int layer, bool write_output);
  // Adds module m's LoRA gradients of layer `layer` and its input gradient into dx (see llama.cpp);
  // W is the module's base weight (DoRA's backward reads it).
  void lora_backward(int layer, int m, const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& W);
  // Activation offload (see set_checkpointing): the device slot of an offloaded layer's input, made
  // free for that layer's input to be written into it; its copy to host after the forward; its
  // return before the backward, with the next offloaded layer below prefetched.
  void release_arena();
  int offload_slot(int layer) const;
  void claim_slot(int layer);
  void offload_input(int layer);
  void reload_input(int layer);

  ModelConfig cfg_;
  std::optional<LoraSpec> lora_;
  DType act_dtype_;
  Device device_;
  std::vector<float> inv_freq_;
  OwnedTensor inv_freq_device_;  // CUDA: inv_freq_ uploaded once
  Tensor inv_freq_t_;            // the view the ops read: of inv_freq_ (CPU) or inv_freq_device_
  int64_t B_ = 0, T_ = 0;
  int checkpoint_every_ = 0;
  bool offload_ = false;
  bool adapters_enabled_ = true;
  std::unique_ptr<Arena> arena_;
  // Offload: per slot the layer whose input it holds (-1: none) and the fences of the last copy out
  // of it and into it.
  std::unique_ptr<device::CopyLane> lane_;
  int slot_layer_[2] = {-1, -1};
  device::CopyLane::Fence slot_saved_[2] = {0, 0}, slot_loaded_[2] = {0, 0};
  std::vector<BlockActivations> acts_;
  Batch batch_;
};

// How the adapters bound in a block's weights apply in its forward: PEFT's scale (LoraSpec::scale)
// and dropout: its probability, the micro-batch's mask key (0: none, as in evaluation) and f32
// scratch for a dropped input (at least rows x the widest adapted input). DoRA (weights with a
// magnitude bound) also needs f32 scratch: dora_z [rows, max(widest in, widest out)] (its base
// term, and the rows of W + scale B A while their norms are taken), dora_l [rows, widest out]
// (its LoRA term) and dora_norm [widest out].
struct LoraForward {
  float scale = 1;
  float dropout = 0;
  uint64_t key = 0;
  Tensor scratch = {};
  Tensor dora_z = {}, dora_l = {}, dora_norm = {};
};

// One sequence's keys and values in a paged KV cache (infer/kv_cache.h), at one layer: blocks
// [block, Hkv, Dh] in position order, holding its first `length` positions once the block has
// written its new ones (views; the cache owns them).
struct PagedKv {
  const std::vector<Tensor>* k = nullptr;
  const std::vector<Tensor>* v = nullptr;
  int64_t length = 0;
};

// The keys and values attention reads in decoder_block_forward, in one of two layouts.
//  Shared (training; paged empty): k_all / v_all [B, Tk, Hkv, Dh] hold every sequence's keys and
//    values; the block writes its new rows into a.k / a.v, which the caller makes the last Tq
//    positions of k_all / v_all (in training they are the same tensors and Tk == Tq).
//  Paged (generation, B sequences of different lengths in one batch): paged[b] holds sequence b's
//    blocks, through its new positions (Tk_b = paged[b].length). Sequence b has q_rows[b] new rows
//    (Tq each when q_rows is empty; different counts let a decode step of some sequences and
//    prefill chunks of others share one forward), which follow sequence b-1's in x (N rows in
//    all), and Tk_b >= its rows. The block computes the new keys and values of all N rows into
//    a.k / a.v (scratch) with one matmul each, copies sequence b's rows into its last positions,
//    and runs attention per sequence: its queries against its own Tk_b keys
//    (ops::attention_forward_paged). Everything else in the block (norms, projections, MLP) is
//    one [N, *] computation for the batch.
struct AttentionKv {
  Tensor k_all, v_all;
  int64_t Tk = 0;  // shared layout: the key length
  std::vector<PagedKv> paged;
  std::vector<int64_t> q_rows = {};  // per sequence: its new rows; empty: Tq each
};

// The forward of one decoder block on rows x_in (B*Tq rows, or the sum of kv.q_rows), writing into
// `a` (whose tensors must already be sized) and, when `out` is defined, the block's output
// out = h1 + down(act) [rows, D] (a recomputing backward leaves it undefined). `kv` says where
// attention reads keys and values (above); positions [B, Tq] (with q_rows: [1, rows]) are the new
// rows' positions (RoPE), and lse holds H floats per row, sequence after sequence.
// Adapters bound in `w` (w.lora_a, and w.lora_m for DoRA) are applied as PEFT does, as `lora` says,
// their u saved in a.lora_u.
// Shared by training and generation so that both compute exactly the same function.
// With tensor parallelism (generation over ranks, infer/tensor_parallel.h) `w` holds this rank's
// slices and `cfg` counts this rank's heads and intermediate width (Megatron-LM's split), so
// o_proj's and down_proj's products are partial sums over the ranks: `tp` sums them.
struct PartialSums {
  // Sums a tensor over the ranks, in place (an all-reduce); empty: one process, nothing to sum.
  std::function<void(const Tensor&)> sum;
  // The residual stream (and o_proj's bias) enters the sum once: from the rank where this is true.
  bool residual = true;
};
void decoder_block_forward(const ModelConfig& cfg, const LayerWeights& w, const BlockActivations& a,
                           const AttentionKv& kv, const Tensor& positions, const Tensor& segment_ids,
                           const Tensor& inv_freq, int64_t B, int64_t Tq, const Tensor& out, int64_t layer = 0,
                           const LoraForward& lora = {}, const PartialSums& tp = {});

}  // namespace shardlm::model
