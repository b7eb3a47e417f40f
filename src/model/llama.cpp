#include "model/llama.h"

#include <fmt/format.h>

#include <cmath>

#include "core/device.h"
#include "core/q8_0.h"
#include "model/lora.h"

namespace shardlm::model {

int64_t ParamInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t ModelPart::numel() const {
  int64_t n = 0;
  for (const ParamInfo& p : params) n += p.numel();
  return n;
}

int64_t dim_size(const ModelConfig& c, Dim d) {
  switch (d) {
    case Dim::None: return 0;
    case Dim::Hidden: return c.hidden_size;
    case Dim::Intermediate: return c.intermediate_size;
    case Dim::QDim: return c.q_dim();
    case Dim::KvDim: return c.kv_dim();
    case Dim::Vocab: return c.vocab_size;
  }
  return 0;
}

namespace {

bool present(const ModelConfig& c, Presence p) {
  switch (p) {
    case Presence::Always: return true;
    case Presence::QkvBias: return c.qkv_bias;
    case Presence::OBias: return c.o_bias;
    case Presence::Untied: return !c.tie_word_embeddings;
  }
  return false;
}

ParamInfo param_info(const ModelConfig& c, const TensorSpec& s, const std::string& prefix) {
  ParamInfo p{prefix + s.name, {dim_size(c, s.rows)}, s.init, s.weight_decay};
  if (s.cols != Dim::None) p.shape.push_back(dim_size(c, s.cols));
  return p;
}

std::string layer_prefix(int64_t l) { return fmt::format("model.layers.{}.", l); }

int lora_module_index(const std::string& module) {
  for (int m = 0; m < kNumLoraModules; ++m)
    if (module == kLoraModules[m]) return m;
  throw Error(fmt::format("unknown LoRA module '{}'", module));
}

}  // namespace

bool quantized_by_qlora(const ModelPart& part, const ParamInfo& info) {
  return part.kind == PartKind::Layer && info.shape.size() == 2;
}

bool held_in_q8_0(const ModelPart& part, const ParamInfo& info) {
  return quantized_by_qlora(part, info) && info.shape.back() % kQ8_0Block == 0;
}

std::vector<ModelPart> llama_parts(const ModelConfig& c, const FinetuneSpec& ft) {
  std::vector<ModelPart> parts;
  parts.push_back({PartKind::Embedding, -1, "model.embed_tokens", {param_info(c, kEmbeddingTensor.spec, "")}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ModelPart p{PartKind::Layer, l, fmt::format("model.layers.{}", l), {}};
    for (const LayerTensorSpec& t : kLayerTensors)
      if (present(c, t.spec.presence)) p.params.push_back(param_info(c, t.spec, layer_prefix(l)));
    parts.push_back(std::move(p));
  }
  ModelPart head{PartKind::Head, -1, "lm_head", {}};
  for (const TopTensorSpec& t : kHeadTensors)
    if (present(c, t.spec.presence)) head.params.push_back(param_info(c, t.spec, ""));
  parts.push_back(std::move(head));
  SHARDLM_CHECK(!ft.nf4_base || ft.lora, "an NF4 base (QLoRA) needs LoRA adapters to train");
  if (ft.lora) {
    // LoRA: the base is frozen; each layer's adapters follow its base tensors, A then B per module.
    for (ModelPart& p : parts)
      for (ParamInfo& info : p.params) {
        info.trainable = false;
        info.nf4 = ft.nf4_base && quantized_by_qlora(p, info);
      }
    const LoraSpec& lora = *ft.lora;
    const Init a_init = lora.init == LoraInit::Gaussian ? Init::LoraGaussian : Init::LoraKaiming;
    for (const LoraTarget& t : lora_targets(c, lora)) {
      ModelPart& layer = parts[size_t(1 + t.layer)];
      layer.params.push_back({t.a_name, {lora.rank, t.in_features}, a_init, true, true});
      layer.params.push_back({t.b_name, {t.out_features, lora.rank}, Init::Zeros, true, true});
      // DoRA's magnitude is decayed like A and B: Hugging Face's Trainer exempts only biases and norms.
      if (lora.use_dora) layer.params.push_back({t.m_name, {t.out_features}, Init::DoraMagnitude, true, true});
      layer.lora.push_back({lora_module_index(t.module), t.a_name, t.b_name, t.m_name});
    }
  }
  return parts;
}

void bind_part(const ModelConfig& c, const ModelPart& part, LlamaWeights& w, const TensorLookup& lookup) {
  auto get = [&](const TensorSpec& s, const std::string& prefix) {
    return lookup && present(c, s.presence) ? lookup(prefix + s.name) : Tensor{};
  };
  switch (part.kind) {
    case PartKind::Embedding:
      w.embed = get(kEmbeddingTensor.spec, "");
      if (c.tie_word_embeddings) w.lm_head = w.embed;
      return;
    case PartKind::Layer: {
      if (w.layers.size() != size_t(c.num_hidden_layers)) w.layers.resize(size_t(c.num_hidden_layers));
      LayerWeights& L = w.layers[size_t(part.layer)];
      for (const LayerTensorSpec& t : kLayerTensors) L.*t.slot = get(t.spec, layer_prefix(part.layer));
      for (const LoraSlot& slot : part.lora) {
        L.lora_a[slot.module] = lookup ? lookup(slot.a_name) : Tensor{};
        L.lora_b[slot.module] = lookup ? lookup(slot.b_name) : Tensor{};
        L.lora_m[slot.module] = lookup && !slot.m_name.empty() ? lookup(slot.m_name) : Tensor{};
      }
      return;
    }
    case PartKind::Head:
      for (const TopTensorSpec& t : kHeadTensors)
        if (present(c, t.spec.presence)) w.*t.slot = get(t.spec, "");
      return;
  }
}

}  // namespace shardlm::model

namespace shardlm {
int64_t parameter_count(const ModelConfig& c, const model::FinetuneSpec& ft) {
  int64_t n = 0;
  for (const model::ModelPart& p : model::llama_parts(c, ft)) n += p.numel();
  return n;
}

double training_flops_per_token(const ModelConfig& c, const model::FinetuneSpec& ft, int64_t seq_len) {
  const double d = double(c.hidden_size), L = double(c.num_hidden_layers);
  const double per_layer = d * double(c.q_dim()) * 2 + d * double(c.kv_dim()) * 2 + 3 * d * double(c.intermediate_size);
  const double matmul = L * per_layer + double(c.vocab_size) * d;  // the decoder layers' projections and the head
  const double attention = 12 * L * double(c.q_dim()) * double(seq_len);
  if (!ft.lora) return 6 * matmul + attention;
  return 4 * matmul + 6 * double(model::lora_parameter_count(c, *ft.lora)) + attention;
}
}  // namespace shardlm

namespace shardlm::model {

LlamaWeights bind_weights(const ModelConfig& c, const TensorLookup& lookup) {
  LlamaWeights w;
  for (const ModelPart& p : llama_parts(c)) bind_part(c, p, w, lookup);
  return w;
}

// ---- forward of one block ------------------------------------------------------------------

namespace {
// y = x W^T + beta * y: W f32|bf16, or q8_0 (u8 rows of blocks, core/q8_0.h: only generation with
// --dtype q8_0 binds such weights, infer/param_store.h).
void project(const Tensor& y, const Tensor& x, const Tensor& w, float beta = 0.0f) {
  if (w.dtype == DType::U8) return ops::matmul_q8_0(y, x, w, 1.0f, beta);
  ops::matmul(y, x, w, false, true, 1.0f, beta);
}
// y = x W^T (+ b).
void linear(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  project(y, x, w);
  if (b.defined()) ops::add_bias(y, b);
}
// Copy src into dst (same element count, any float dtypes).
void copy(const Tensor& dst, const Tensor& src) { ops::cast(dst, src); }

// LoRA dropout's mask stream of one adapter: the same in its forward, its backward and a
// recomputed forward.
uint64_t dropout_stream(int64_t layer, int module) { return uint64_t(layer) * kNumLoraModules + uint64_t(module) + 1; }

// DoRA's weight norm: norm[j] = ||W_j + scale (B A)_j|| for every row j of the module's weight
// W [out, in], taken over chunks of rows assembled in `scratch` (f32, at least `in` elements), so
// no weight-sized buffer is needed. PEFT computes it afresh in every forward, from the weight as
// the layer uses it (a QLoRA base dequantized), and treats it as a constant (no gradient).
void dora_weight_norm(const Tensor& norm, const Tensor& W, const Tensor& A, const Tensor& B, float scale,
                      const Tensor& scratch) {
  const int64_t out = W.shape[0], in = W.shape[1];
  const int64_t rows = std::min(out, scratch.numel() / in);
  SHARDLM_CHECK(rows >= 1, "DoRA: scratch of {} elements for rows of {}", scratch.numel(), in);
  for (int64_t j = 0; j < out; j += rows) {
    const int64_t n = std::min(rows, out - j);
    const Tensor v = Tensor::view(scratch.data, DType::F32, {n, in}, scratch.device);
    copy(v, W.slice(j, j + n));
    ops::matmul(v, B.slice(j, j + n), A, false, false, scale, 1.0f);
    ops::row_norms(norm.slice(j, j + n), v);
  }
}

// DoRA's scratch for N rows of a module of `out` features: its base term z, its LoRA term l (each
// [N, out]) and its weight norm [out].
struct DoraScratch {
  Tensor z, l, norm;
};
DoraScratch dora_scratch(const LoraForward& lf, int64_t N, int64_t out) {
  const Device d = lf.dora_z.device;
  SHARDLM_CHECK(lf.dora_z.defined(), "DoRA weights are bound, but the forward was given no DoRA scratch");
  return {Tensor::view(lf.dora_z.data, DType::F32, {N, out}, d), Tensor::view(lf.dora_l.data, DType::F32, {N, out}, d),
          lf.dora_norm.slice(0, out)};
}

// PEFT's lora.Linear on top of a base projection already in y [N, out]:
//   u = dropout(x) A^T  [N, r] (saved for the backward),   y += scale * u B^T.
// x [N, in]; A [r, in]; B [out, r]; W [out, in] the module's base weight. Nothing when the module
// has no adapter; only u when y is undefined (a recomputed forward that does not rewrite the
// block's output). With DoRA (a magnitude m bound), PEFT's DoraLinearLayer instead: with
// g = m / ||W + scale B A||_row (the norm a constant),
//   y += (g - 1) * dropout(x) W^T + g * scale * u B^T,
// i.e. without dropout y = g * (x (W + scale B A)^T) (+ bias, which is not rescaled). With dropout
// PEFT's base term uses the dropped x as the LoRA term does (its DoRA variant passes dropout(x)
// and recomputes the base product), so this does too.
void lora_forward(const LayerWeights& w, int m, const Tensor& W, const Tensor& y, const Tensor& x, const Tensor& u,
                  int64_t layer, const LoraForward& lf) {
  if (!w.lora_a[m].defined()) return;
  Tensor in = x;
  if (lf.key != 0 && lf.dropout > 0) {
    in = Tensor::view(lf.scratch.data, DType::F32, {x.shape[0], x.shape[1]}, lf.scratch.device);
    ops::dropout(in, x, lf.dropout, lf.key, dropout_stream(layer, m));
  }
  ops::matmul(u, in, w.lora_a[m], false, true);
  if (!y.defined()) return;
  if (!w.lora_m[m].defined()) {
    ops::matmul(y, u, w.lora_b[m], false, true, lf.scale, 1.0f);
    return;
  }
  const DoraScratch d = dora_scratch(lf, x.shape[0], W.shape[0]);
  dora_weight_norm(d.norm, W, w.lora_a[m], w.lora_b[m], lf.scale, lf.dora_z);
  ops::matmul(d.z, in, W, false, true);
  ops::matmul(d.l, u, w.lora_b[m], false, true, lf.scale, 0.0f);
  ops::dora_forward(y, d.z, d.l, w.lora_m[m], d.norm);
}
}  // namespace

void decoder_block_forward(const ModelConfig& c, const LayerWeights& w, const BlockActivations& a,
                           const AttentionKv& kv, const Tensor& positions, const Tensor& segment_ids,
                           const Tensor& inv_freq, int64_t B, int64_t Tq, const Tensor& out, int64_t layer,
                           const LoraForward& lf, const PartialSums& tp) {
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, Dh = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  using M = LoraModule;
  auto lora = [&](M m, const Tensor& W, const Tensor& y, const Tensor& x) {
    lora_forward(w, int(m), W, y, x, a.lora_u[int(m)], layer, lf);
  };
  ops::rmsnorm_forward(a.xn1, a.rstd1, a.x_in, w.attn_norm, eps);
  linear(a.q, a.xn1, w.wq, w.bq);
  lora(M::Q, w.wq, a.q, a.xn1);
  linear(a.k, a.xn1, w.wk, w.bk);
  lora(M::K, w.wk, a.k, a.xn1);
  linear(a.v, a.xn1, w.wv, w.bv);
  lora(M::V, w.wv, a.v, a.xn1);
  const float scale = 1.0f / std::sqrt(float(Dh));
  if (kv.paged.empty()) {
    const Tensor q4 = a.q.reshape({B, Tq, H, Dh}), k4 = a.k.reshape({B, Tq, Hkv, Dh});
    ops::rope_forward(q4, q4, positions, inv_freq);
    ops::rope_forward(k4, k4, positions, inv_freq);
    ops::attention_forward(a.att.reshape({B, Tq, H, Dh}), a.lse, q4, kv.k_all.reshape({B, kv.Tk, Hkv, Dh}),
                           kv.v_all.reshape({B, kv.Tk, Hkv, Dh}), segment_ids, scale);
  } else {
    SHARDLM_CHECK(int64_t(kv.paged.size()) == B && !segment_ids.defined() &&
                      (kv.q_rows.empty() || int64_t(kv.q_rows.size()) == B),
                  "paged keys and values: {} sequences' blocks and {} row counts for {} sequences", kv.paged.size(),
                  kv.q_rows.size(), B);
    // RoPE is per row (each row's own position), so all N rows rotate as one sequence.
    const int64_t N = a.q.shape[0];
    SHARDLM_CHECK(positions.numel() == N, "{} positions for {} rows", positions.numel(), N);
    const Tensor q4 = a.q.reshape({1, N, H, Dh}), k4 = a.k.reshape({1, N, Hkv, Dh});
    const Tensor pos = positions.reshape({1, N});
    ops::rope_forward(q4, q4, pos, inv_freq);
    ops::rope_forward(k4, k4, pos, inv_freq);
    const Tensor lse = a.lse.reshape({a.lse.numel()});  // H per row, sequence after sequence
    const Tensor k3 = a.k.reshape({N, Hkv, Dh}), v3 = a.v.reshape({N, Hkv, Dh});
    int64_t r0 = 0;  // sequence b's first row
    for (int64_t b = 0; b < B; ++b) {
      const PagedKv& p = kv.paged[size_t(b)];
      const int64_t n = kv.q_rows.empty() ? Tq : kv.q_rows[size_t(b)], Tk = p.length;
      SHARDLM_CHECK(p.k && p.v && !p.k->empty() && p.k->size() == p.v->size(), "sequence {}: no KV blocks", b);
      const std::vector<Tensor>&kb = *p.k, &vb = *p.v;
      const int64_t block = kb.front().shape[0];
      SHARDLM_CHECK(Tk >= n && r0 + n <= N && int64_t(kb.size()) * block >= Tk,
                    "sequence {}: {} blocks of {} positions for {} keys, {} of them new", b, kb.size(), block, Tk, n);
      // Sequence b's new keys and values go to its positions Tk - n .. Tk - 1 (a run of rows in
      // each block they fall into); its queries sit there too (attention's convention), which
      // reads the keys causally.
      for (int64_t t = Tk - n; t < Tk;) {
        const int64_t in_block = t % block, run = std::min(block - in_block, Tk - t), row = r0 + t - (Tk - n);
        copy(kb[size_t(t / block)].slice(in_block, in_block + run), k3.slice(row, row + run));
        copy(vb[size_t(t / block)].slice(in_block, in_block + run), v3.slice(row, row + run));
        t += run;
      }
      ops::attention_forward_paged(a.att.slice(r0, r0 + n).reshape({1, n, H, Dh}),
                                   lse.slice(H * r0, H * (r0 + n)).reshape({1, H, n}),
                                   a.q.slice(r0, r0 + n).reshape({1, n, H, Dh}), kb, vb, Tk, scale);
      r0 += n;
    }
    SHARDLM_CHECK(r0 == N, "{} rows for sequences of {} new rows in all", N, r0);
  }
  // h1 = x_in + o_proj(att): start from the residual and let the matmul accumulate onto it (over
  // ranks: this rank's partial sum, the residual on one rank only, then the sum of all of them).
  const float residual = tp.residual ? 1.0f : 0.0f;
  if (tp.residual) copy(a.h1, a.x_in);
  project(a.h1, a.att, w.wo, residual);
  if (w.bo.defined() && tp.residual) ops::add_bias(a.h1, w.bo);
  lora(M::O, w.wo, a.h1, a.att);
  if (tp.sum) tp.sum(a.h1);
  ops::rmsnorm_forward(a.xn2, a.rstd2, a.h1, w.mlp_norm, eps);
  project(a.gate, a.xn2, w.w_gate);
  lora(M::Gate, w.w_gate, a.gate, a.xn2);
  project(a.up, a.xn2, w.w_up);
  lora(M::Up, w.w_up, a.up, a.xn2);
  ops::swiglu_forward(a.act, a.gate, a.up);
  // out = h1 + down_proj(act).
  if (out.defined()) {
    if (tp.residual) copy(out, a.h1);
    project(out, a.act, w.w_down, residual);
  }
  lora(M::Down, w.w_down, out, a.act);
  if (tp.sum) {
    SHARDLM_CHECK(out.defined(), "a block split over ranks needs its output");
    tp.sum(out);
  }
}

// ---- LlamaCompute --------------------------------------------------------------------------

// The views of the arena's top and workspace buffers for the current batch shape (LlamaCompute's
// arena holds them; a table below binds each by member pointer).
struct ArenaViews {
  Tensor v_h_final, v_xnf, v_rstdf, v_ids, v_positions, v_segments, v_targets;
  Tensor v_dh, v_dtmp, v_dxn, v_datt, v_dq, v_dk, v_dv, v_d_act, v_dgate, v_dup;
  Tensor v_du, v_drop_x, v_drop_dx;
  Tensor v_dora_z, v_dora_l, v_dora_norm;
};

// Everything LlamaCompute allocates, sized for a capacity of tokens (rows). Each batch works on
// views of the first B*T rows, so batches of varying shape (padding to the longest row) reuse one
// allocation. Saved activations are charged to Activations; buffers that only carry gradients
// through the backward are Workspace.
struct LlamaCompute::Arena : ArenaViews {
  int64_t capacity = 0;                          // tokens
  std::vector<std::vector<OwnedTensor>> layer;   // per layer: kBlockBuffers' then the LoRA u buffers, or
                                                 // only x_in for a checkpointed layer
  std::vector<OwnedTensor> recompute;            // checkpointed layers' others, shared (recomputed)
  // Activation offload: the device slots the offloaded layers' inputs take turns in, and each
  // offloaded layer's input at rest in host memory (by offload order: layer l is entry l / k).
  std::vector<OwnedTensor> slots, host_inputs;
  std::vector<OwnedTensor> top, workspace;       // kTopBuffers' and kWorkspaceBuffers' that exist
};

namespace {

// The widths of LlamaCompute's arena, per token row. Each entry is a buffer of N rows of `width`
// elements of `dtype`.
struct ArenaBuffer {
  DType dtype;
  int64_t width;
  bool per_token = true;  // N rows of `width`; else one vector of `width` (whatever N is)
};
struct ArenaWidths {
  std::vector<ArenaBuffer> layer;      // per decoder layer, in BlockActivations order (x_in first; then
                                       // lora_u of each adapted module)
  std::vector<ArenaBuffer> top;        // h_final, xnf, rstdf, ids, positions, segments (+ targets on a GPU)
  std::vector<ArenaBuffer> workspace;  // the backward's d-buffers: dh dtmp dxn datt dq dk dv d_act dgate dup;
                                       // with LoRA also du [r] (f32), with LoRA dropout the
                                       // dropped input and its gradient [widest input] (f32), and
                                       // with DoRA its scratch (f32; LoraForward)
};

// ---- the arena's table ---------------------------------------------------------------------------
// Every arena buffer is N rows of a width, in the activation dtype or f32 or i32, and is viewed as
// [N, width], [N], [B, H, T] or [B, T]. One table sizes the arena (arena_widths) and binds each
// buffer to its member, as kLayerTensors binds weights. The memory estimator counts the arena by
// running LlamaCompute on the meta device.
enum class Elem : uint8_t { Act, F32, I32 };
enum class Width : uint8_t { One, Hidden, QDim, KvDim, Heads, Intermediate, LoraRank, LoraWidest, LoraWidestOut, DoraZ };
// Vector: not rows at all, one [width] vector.
enum class RowView : uint8_t { Rows, Flat, HeadsByTokens, Grid, Vector };
// Which runs have the buffer.
enum class Needs : uint8_t { Always, Device, Lora, LoraDropout, Dora };
template <class Owner>
struct ArenaSlot {
  Tensor Owner::*view;
  Elem elem;
  Width width;
  RowView shape = RowView::Rows;
  Needs needs = Needs::Always;
};

// BlockActivations, x_in first (the one buffer a checkpointed layer keeps); each adapted module's
// lora_u [N, r] follows them.
constexpr ArenaSlot<BlockActivations> kBlockBuffers[] = {
    {&BlockActivations::x_in, Elem::Act, Width::Hidden},
    {&BlockActivations::xn1, Elem::Act, Width::Hidden},
    {&BlockActivations::rstd1, Elem::F32, Width::One, RowView::Flat},
    {&BlockActivations::q, Elem::Act, Width::QDim},
    {&BlockActivations::k, Elem::Act, Width::KvDim},
    {&BlockActivations::v, Elem::Act, Width::KvDim},
    {&BlockActivations::att, Elem::Act, Width::QDim},
    {&BlockActivations::lse, Elem::F32, Width::Heads, RowView::HeadsByTokens},
    {&BlockActivations::h1, Elem::Act, Width::Hidden},
    {&BlockActivations::xn2, Elem::Act, Width::Hidden},
    {&BlockActivations::rstd2, Elem::F32, Width::One, RowView::Flat},
    {&BlockActivations::gate, Elem::Act, Width::Intermediate},
    {&BlockActivations::up, Elem::Act, Width::Intermediate},
    {&BlockActivations::act, Elem::Act, Width::Intermediate},
};
// The final norm's input and output, and the batch (its targets uploaded only where the arena is
// on a device: a CPU run reads the batch's own array).
constexpr ArenaSlot<ArenaViews> kTopBuffers[] = {
    {&ArenaViews::v_h_final, Elem::Act, Width::Hidden},
    {&ArenaViews::v_xnf, Elem::Act, Width::Hidden},
    {&ArenaViews::v_rstdf, Elem::F32, Width::One, RowView::Flat},
    {&ArenaViews::v_ids, Elem::I32, Width::One, RowView::Flat},
    {&ArenaViews::v_positions, Elem::I32, Width::One, RowView::Grid},
    {&ArenaViews::v_segments, Elem::I32, Width::One, RowView::Grid},
    {&ArenaViews::v_targets, Elem::I32, Width::One, RowView::Flat, Needs::Device},
};
// The backward's gradient buffers (f32); with LoRA du [r], and with LoRA dropout the dropped
// input and its gradient [widest adapted input].
constexpr ArenaSlot<ArenaViews> kWorkspaceBuffers[] = {
    {&ArenaViews::v_dh, Elem::F32, Width::Hidden},
    {&ArenaViews::v_dtmp, Elem::F32, Width::Hidden},
    {&ArenaViews::v_dxn, Elem::F32, Width::Hidden},
    {&ArenaViews::v_datt, Elem::F32, Width::QDim},
    {&ArenaViews::v_dq, Elem::F32, Width::QDim},
    {&ArenaViews::v_dk, Elem::F32, Width::KvDim},
    {&ArenaViews::v_dv, Elem::F32, Width::KvDim},
    {&ArenaViews::v_d_act, Elem::F32, Width::Intermediate},
    {&ArenaViews::v_dgate, Elem::F32, Width::Intermediate},
    {&ArenaViews::v_dup, Elem::F32, Width::Intermediate},
    {&ArenaViews::v_du, Elem::F32, Width::LoraRank, RowView::Rows, Needs::Lora},
    {&ArenaViews::v_drop_x, Elem::F32, Width::LoraWidest, RowView::Rows, Needs::LoraDropout},
    {&ArenaViews::v_drop_dx, Elem::F32, Width::LoraWidest, RowView::Rows, Needs::LoraDropout},
    {&ArenaViews::v_dora_z, Elem::F32, Width::DoraZ, RowView::Rows, Needs::Dora},
    {&ArenaViews::v_dora_l, Elem::F32, Width::LoraWidestOut, RowView::Rows, Needs::Dora},
    {&ArenaViews::v_dora_norm, Elem::F32, Width::LoraWidestOut, RowView::Vector, Needs::Dora},
};

// The LoraModule indices a layer adapts (every layer adapts the same), ascending.
std::vector<int> lora_layer_modules(const LoraSpec& lora) {
  std::vector<int> out;
  for (const std::string& m : expand_lora_targets(lora.target_modules)) out.push_back(lora_module_index(m));
  std::sort(out.begin(), out.end());
  return out;
}
// The widest input (the dropout scratch's width) or output of an adapted module: `side` is
// &LoraTarget::in_features or &LoraTarget::out_features.
int64_t lora_widest(const ModelConfig& c, const LoraSpec& lora, int64_t LoraTarget::*side) {
  int64_t w = 0;
  for (const LoraTarget& t : lora_targets(c, lora)) w = std::max(w, t.*side);
  return w;
}

bool needed(Needs n, const std::optional<LoraSpec>& lora, Device device) {
  switch (n) {
    case Needs::Always: return true;
    case Needs::Device: return device == Device::CUDA;  // the meta device stands for a CPU rank
    case Needs::Lora: return lora.has_value();
    case Needs::LoraDropout: return lora && lora->dropout > 0;
    case Needs::Dora: return lora && lora->use_dora;
  }
  return false;
}

template <class Owner>
ArenaBuffer buffer_of(const ArenaSlot<Owner>& s, const ModelConfig& c, const std::optional<LoraSpec>& lora, DType act) {
  int64_t w = 1;
  switch (s.width) {
    case Width::One: w = 1; break;
    case Width::Hidden: w = c.hidden_size; break;
    case Width::QDim: w = c.q_dim(); break;
    case Width::KvDim: w = c.kv_dim(); break;
    case Width::Heads: w = c.num_attention_heads; break;
    case Width::Intermediate: w = c.intermediate_size; break;
    case Width::LoraRank: w = lora->rank; break;
    case Width::LoraWidest: w = lora_widest(c, *lora, &LoraTarget::in_features); break;
    case Width::LoraWidestOut: w = lora_widest(c, *lora, &LoraTarget::out_features); break;
    // DoRA's base term [N, out], which also holds whole rows of a weight [., in] for its norm.
    case Width::DoraZ:
      w = std::max(lora_widest(c, *lora, &LoraTarget::in_features), lora_widest(c, *lora, &LoraTarget::out_features));
      break;
  }
  return {s.elem == Elem::Act ? act : s.elem == Elem::F32 ? DType::F32 : DType::I32, w, s.shape != RowView::Vector};
}

// The view of a buffer's first B x T rows, shaped as the slot says.
template <class Owner>
Tensor view_of(const ArenaSlot<Owner>& s, const OwnedTensor& t, int64_t B, int64_t T, int64_t H) {
  if (s.shape == RowView::Vector) return t.t.reshape({t.t.numel()});
  const Tensor rows = t.t.slice(0, B * T);
  switch (s.shape) {
    case RowView::Rows: return rows;
    case RowView::Flat: return rows.reshape({B * T});
    case RowView::HeadsByTokens: return rows.reshape({B, H, T});
    case RowView::Grid: return rows.reshape({B, T});
    case RowView::Vector: break;  // above
  }
  return rows;
}

ArenaWidths arena_widths(const ModelConfig& c, const std::optional<LoraSpec>& lora, DType a, Device device) {
  ArenaWidths w;
  for (const auto& s : kBlockBuffers) w.layer.push_back(buffer_of(s, c, lora, a));
  if (lora)
    for (size_t i = 0; i < lora_layer_modules(*lora).size(); ++i) w.layer.push_back({a, lora->rank});  // lora_u
  for (const auto& s : kTopBuffers)
    if (needed(s.needs, lora, device)) w.top.push_back(buffer_of(s, c, lora, a));
  for (const auto& s : kWorkspaceBuffers)
    if (needed(s.needs, lora, device)) w.workspace.push_back(buffer_of(s, c, lora, a));
  return w;
}

}  // namespace

LlamaCompute::LlamaCompute(const ModelConfig& cfg, DType act_dtype, Device device, const std::optional<LoraSpec>& lora)
    : cfg_(cfg), lora_(lora), act_dtype_(act_dtype), device_(device) {
  SHARDLM_CHECK(act_dtype == DType::F32 || act_dtype == DType::BF16,
                "activations must be f32 or bf16, got {}", dtype_name(act_dtype));
  inv_freq_ = ops::rope_inv_freq(cfg.head_dim, float(cfg.rope_theta), cfg.rope_scaling);
  inv_freq_t_ = Tensor::view(inv_freq_.data(), DType::F32, {int64_t(inv_freq_.size())});
  if (device_ == Device::CUDA) {
    inv_freq_device_ = device::copy_to_device(inv_freq_t_, MemCategory::Other, device_);
    inv_freq_t_ = inv_freq_device_.t;
  }
  inv_freq_t_.device = device_;  // on the meta device, the host table stands in (never read)
}

LlamaCompute::~LlamaCompute() = default;

void LlamaCompute::reserve(int64_t B, int64_t T) {
  const int64_t N = B * T;
  if (arena_ && N <= arena_->capacity) return;
  release_arena();  // free the old arena before allocating the larger one
  const MemCategory act = MemCategory::Activations, ws = MemCategory::Workspace;
  const Device dev = device_;
  const ArenaWidths widths = arena_widths(cfg_, lora_, act_dtype_, device_);
  auto make = [&](const ArenaBuffer& b, MemCategory c) {
    return OwnedTensor(b.dtype, std::initializer_list<int64_t>{b.per_token ? N : 1, b.width}, c, false, dev);
  };
  auto arena = std::make_unique<Arena>();
  arena->capacity = N;
  // A checkpointed layer keeps only its input; its other activations live in one set shared by all
  // checkpointed layers and are recomputed in its backward.
  bool any_checkpointed = false;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    std::vector<OwnedTensor>& t = arena->layer.emplace_back();
    const bool ckpt = checkpointed(int(l));
    any_checkpointed = any_checkpointed || ckpt;
    if (offloaded(int(l))) {  // its input: a shared device slot, and its own host buffer
      // Host memory for the host's copy: pinned beside a GPU (asynchronous copies), else the
      // device's own kind (the CPU, or the meta device of a dry run), tagged as host memory.
      const size_t bytes = size_t(N) * size_t(widths.layer[0].width) * dtype_size(widths.layer[0].dtype);
      OwnedTensor& h = arena->host_inputs.emplace_back();
      h.buffer = dev == Device::CUDA ? Buffer::pinned_host(bytes, MemCategory::OffloadedActivations, false, mem_tag::kHost)
                                     : Buffer(bytes, MemCategory::OffloadedActivations, false, dev, mem_tag::kHost);
      h.t = Tensor::view(h.buffer.data(), widths.layer[0].dtype, {N, widths.layer[0].width},
                         dev == Device::Meta ? Device::Meta : Device::CPU);
      continue;
    }
    t.reserve(widths.layer.size());
    for (const ArenaBuffer& b : widths.layer) {
      t.push_back(make(b, act));
      if (ckpt) break;  // x_in only
    }
  }
  if (!arena->host_inputs.empty())
    for (int s = 0; s < 2; ++s) arena->slots.push_back(make(widths.layer[0], act));
  if (any_checkpointed) {
    arena->recompute.emplace_back();  // slot 0 (the input) is each layer's own
    for (size_t i = 1; i < widths.layer.size(); ++i) arena->recompute.push_back(make(widths.layer[i], act));
  }
  for (const ArenaBuffer& b : widths.top) arena->top.push_back(make(b, act));
  for (const ArenaBuffer& b : widths.workspace) arena->workspace.push_back(make(b, ws));
  arena_ = std::move(arena);
  B_ = T_ = 0;  // views must be rebuilt
}

void LlamaCompute::bind_shape(int64_t B, int64_t T) {
  reserve(B, T);
  if (B == B_ && T == T_) return;
  B_ = B;
  T_ = T;
  const int64_t N = B * T, H = cfg_.num_attention_heads;
  Arena& r = *arena_;
  acts_.assign(size_t(cfg_.num_hidden_layers), {});
  const std::vector<int> lora_modules = lora_ ? lora_layer_modules(*lora_) : std::vector<int>{};
  const size_t block = std::size(kBlockBuffers);
  for (size_t l = 0; l < acts_.size(); ++l) {
    // A checkpointed layer: its own input (an offloaded one's: its slot), the shared recompute set
    // for the rest.
    auto buffer = [&](size_t i) -> const OwnedTensor& {
      if (i == 0 && offloaded(int(l))) return r.slots[size_t(offload_slot(int(l)))];
      return i < r.layer[l].size() ? r.layer[l][i] : r.recompute[i];
    };
    for (size_t i = 0; i < block; ++i) acts_[l].*kBlockBuffers[i].view = view_of(kBlockBuffers[i], buffer(i), B, T, H);
    for (size_t i = 0; i < lora_modules.size(); ++i) acts_[l].lora_u[lora_modules[i]] = buffer(block + i).t.slice(0, N);
  }
  // The top and workspace buffers that exist, in their tables' order.
  auto bind = [&](const auto& table, const std::vector<OwnedTensor>& buffers) {
    size_t next = 0;
    for (const auto& s : table)
      if (needed(s.needs, lora_, device_)) r.*s.view = view_of(s, buffers.at(next++), B, T, H);
  };
  bind(kTopBuffers, r.top);
  bind(kWorkspaceBuffers, r.workspace);
}

void LlamaCompute::bind_positions(const Batch& batch) {
  SHARDLM_CHECK(batch.B >= 1 && batch.T >= 1 && batch.ids, "empty batch");
  bind_shape(batch.B, batch.T);
  batch_ = batch;
  const int64_t N = batch.B * batch.T;
  if (device_ == Device::Meta) return;  // no values to place
  if (device_ == Device::CPU) {
    int32_t* pos = arena_->v_positions.i32();
    for (int64_t i = 0; i < N; ++i) pos[i] = batch.positions ? batch.positions[i] : int32_t(i % batch.T);
    if (batch.segment_ids) std::copy(batch.segment_ids, batch.segment_ids + N, arena_->v_segments.i32());
    std::copy(batch.ids, batch.ids + N, arena_->v_ids.i32());
    return;
  }
  // A device arena: the default positions are made on the host, then everything is uploaded
  // (synchronous copies; the batch's host arrays may change as soon as this returns).
  const size_t bytes = size_t(N) * sizeof(int32_t);
  std::vector<int32_t> pos;
  if (!batch.positions) {
    pos.resize(size_t(N));
    for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(i % batch.T);
  }
  device::copy_bytes(arena_->v_positions.data, device_, batch.positions ? batch.positions : pos.data(), Device::CPU,
                     bytes);
  if (batch.segment_ids) device::copy_bytes(arena_->v_segments.data, device_, batch.segment_ids, Device::CPU, bytes);
  device::copy_bytes(arena_->v_ids.data, device_, batch.ids, Device::CPU, bytes);
}

void LlamaCompute::embed_forward(const Batch& batch) {
  bind_positions(batch);
  if (cfg_.num_hidden_layers > 0) claim_slot(0);
  const Tensor out = cfg_.num_hidden_layers > 0 ? acts_[0].x_in : arena_->v_h_final;
  ops::embedding_forward(out, w_.embed, arena_->v_ids);
}

void LlamaCompute::block_activations(int layer, bool write_output) {
  const BlockActivations& a = acts_[size_t(layer)];
  const Tensor seg = batch_.segment_ids ? arena_->v_segments : Tensor{};
  // The block's output is the next block's input (or the final hidden state).
  Tensor out;
  if (write_output && layer + 1 < cfg_.num_hidden_layers) claim_slot(layer + 1);
  if (write_output) out = layer + 1 < cfg_.num_hidden_layers ? acts_[size_t(layer) + 1].x_in : arena_->v_h_final;
  const AttentionKv kv{.k_all = a.k, .v_all = a.v, .Tk = T_, .paged = {}};
  const LoraForward lf = lora_ ? LoraForward{float(lora_->scale()), float(lora_->dropout), batch_.dropout_key,
                                             arena_->v_drop_x, arena_->v_dora_z, arena_->v_dora_l, arena_->v_dora_norm}
                              : LoraForward{};
  if (!adapters_enabled_) {  // the base alone: the block sees no adapter bound
    LayerWeights base = w_.layers[size_t(layer)];
    for (int m = 0; m < kNumLoraModules; ++m) base.lora_a[m] = base.lora_b[m] = base.lora_m[m] = Tensor{};
    decoder_block_forward(cfg_, base, a, kv, arena_->v_positions, seg, inv_freq_t_, B_, T_, out, layer, lf);
    return;
  }
  decoder_block_forward(cfg_, w_.layers[size_t(layer)], a, kv, arena_->v_positions, seg, inv_freq_t_, B_, T_, out,
                        layer, lf);
}

void LlamaCompute::set_checkpointing(int every, bool offload) {
  SHARDLM_CHECK(every >= 0, "activation checkpointing interval must be >= 0, got {}", every);
  SHARDLM_CHECK(!offload || every > 0, "activation offload moves checkpointed layers' inputs: it needs activation "
                "checkpointing");
  if (every == checkpoint_every_ && offload == offload_) return;
  release_arena();  // the layout of the arena changes
  checkpoint_every_ = every;
  offload_ = offload;
  if (offload_ && !lane_) lane_ = std::make_unique<device::CopyLane>();
  slot_layer_[0] = slot_layer_[1] = -1;
  B_ = T_ = 0;
}

bool LlamaCompute::checkpointed(int layer) const { return checkpoint_every_ > 0 && layer % checkpoint_every_ == 0; }

// ---- activation offload ----------------------------------------------------------------------------
void LlamaCompute::release_arena() {
  // Copies still running on the lane read or write the arena's buffers, device and pinned host
  // ones: the compute stream waits for them, and the host for the compute stream, before any is
  // freed.
  if (lane_) {
    for (int s = 0; s < 2; ++s) {
      lane_->wait(slot_saved_[s]);
      lane_->wait(slot_loaded_[s]);
      slot_layer_[s] = -1;
    }
    if (device_ == Device::CUDA) device::synchronize();
  }
  arena_.reset();
}

// Offloaded layers are every k-th, and take the two slots in turn: layer l is the (l / k)-th.
int LlamaCompute::offload_slot(int layer) const { return (layer / checkpoint_every_) % 2; }

void LlamaCompute::claim_slot(int layer) {
  if (!offloaded(layer)) return;
  const int s = offload_slot(layer);
  // The slot's last occupant must have left for host memory, and a prefetch into it arrived,
  // before anything is written into it.
  lane_->wait(slot_saved_[s]);
  lane_->wait(slot_loaded_[s]);
  slot_layer_[s] = layer;
}

void LlamaCompute::offload_input(int layer) {
  const int s = offload_slot(layer);
  slot_saved_[s] = lane_->copy(arena_->host_inputs[size_t(layer / checkpoint_every_)].t.slice(0, B_ * T_),
                               acts_[size_t(layer)].x_in);
}

void LlamaCompute::reload_input(int layer) {
  auto load = [&](int l) {
    const int s = offload_slot(l);
    if (slot_layer_[s] == l) return;  // still there (the last offloaded layer, or prefetched)
    lane_->wait(slot_loaded_[s]);     // a load into it must not land after this one
    slot_loaded_[s] = lane_->copy(acts_[size_t(l)].x_in, arena_->host_inputs[size_t(l / checkpoint_every_)].t.slice(0, B_ * T_));
    slot_layer_[s] = l;
  };
  load(layer);
  lane_->wait(slot_loaded_[offload_slot(layer)]);
  // The next offloaded layer down comes back while this one's backward computes: its slot's last
  // reader (the backward above this one) is already enqueued, and the lane starts after it.
  if (layer - checkpoint_every_ >= 0) load(layer - checkpoint_every_);
}

void LlamaCompute::block_forward(int layer) {
  block_activations(layer, true);
  if (offloaded(layer)) offload_input(layer);
}

// The final norm of the last hidden state, and the batch's targets where the ops read them.
Tensor LlamaCompute::head_forward(const Batch& batch) {
  SHARDLM_CHECK(batch.targets, "the batch has no targets");
  ops::rmsnorm_forward(arena_->v_xnf, arena_->v_rstdf, arena_->v_h_final, w_.final_norm, float(cfg_.rms_norm_eps));
  Tensor targets = Tensor::view(const_cast<int32_t*>(batch.targets), DType::I32, {B_ * T_});
  if (device_ == Device::CUDA) {  // the targets go up next to the other batch arrays
    device::copy(arena_->v_targets, targets);
    return arena_->v_targets;
  }
  targets.device = device_;  // on the meta device the host array stands in (never read)
  return targets;
}

ops::CrossEntropyResult LlamaCompute::head_loss(const Batch& batch, float grad_scale, bool backward) {
  const Tensor targets = head_forward(batch);
  const int64_t chunk = ops::cross_entropy_chunk_rows(device_, cfg_.vocab_size);
  if (!backward) return ops::linear_cross_entropy(arena_->v_xnf, w_.lm_head, targets, Tensor{}, Tensor{}, 1.0f, chunk);
  const ops::CrossEntropyResult r =
      ops::linear_cross_entropy(arena_->v_xnf, w_.lm_head, targets, arena_->v_dxn, g_.lm_head, grad_scale, chunk);
  ops::rmsnorm_backward(arena_->v_dh, g_.final_norm, arena_->v_dxn, arena_->v_h_final, w_.final_norm, arena_->v_rstdf);
  return r;
}

// Row b's logits are computed by itself (rows [bT, (b+1)T) of the normed hidden state), so its loss
// sum comes straight from the fused cross-entropy, and its backward takes its own scale; the head's
// weight gradient accumulates over the rows. The backward recomputes each row's logits (the fused
// op keeps none): one more lm_head GEMM per step than head_loss, for no [N, V] buffer.
void LlamaCompute::head_rows(const Batch& batch, std::span<double> row_loss, const RowWeigh& weigh) {
  SHARDLM_CHECK(int64_t(row_loss.size()) == B_, "head_rows: {} row sums for {} rows", row_loss.size(), B_);
  SHARDLM_CHECK(!weigh || adapters_enabled_, "head_rows: a backward with the adapters disabled");
  const Tensor targets = head_forward(batch);
  const int64_t chunk = ops::cross_entropy_chunk_rows(device_, cfg_.vocab_size);
  auto rows = [&](const Tensor& t, int64_t b) { return t.slice(b * T_, (b + 1) * T_); };
  for (int64_t b = 0; b < B_; ++b)
    row_loss[size_t(b)] =
        ops::linear_cross_entropy(rows(arena_->v_xnf, b), w_.lm_head, rows(targets, b), Tensor{}, Tensor{}, 1.0f, chunk)
            .loss_sum;
  if (!weigh) return;
  std::vector<float> scale(size_t(B_), 0.0f);
  weigh(row_loss, scale);
  for (int64_t b = 0; b < B_; ++b)
    ops::linear_cross_entropy(rows(arena_->v_xnf, b), w_.lm_head, rows(targets, b), rows(arena_->v_dxn, b), g_.lm_head,
                              scale[size_t(b)], chunk);
  ops::rmsnorm_backward(arena_->v_dh, g_.final_norm, arena_->v_dxn, arena_->v_h_final, w_.final_norm, arena_->v_rstdf);
}

// The backward of lora_forward: with dy = dL/dy [N, out] (f32) and x the module's input,
//   dB += scale dy^T u,   du = scale dy B  [N, r],   dA += du^T dropout(x),   dx += dropout(du A),
// the dropout's mask regenerated from its key. Nothing when the module has no adapter or its
// adapter is not being trained (no gradient bound). DoRA recomputes its norm and terms z and l
// (lora_forward), gets dm, dz = (g - 1) dy and dl = g dy from ops::dora_backward, uses dl where
// LoRA uses dy, and adds dz W to the dropped input's gradient (the base term's path).
void LlamaCompute::lora_backward(int layer, int m, const Tensor& dx, const Tensor& dy, const Tensor& x,
                                 const Tensor& W) {
  const LayerWeights& w = w_.layers[size_t(layer)];
  const LayerWeights& g = g_.layers[size_t(layer)];
  if (!w.lora_a[m].defined() || !g.lora_a[m].defined()) return;
  const Arena& r = *arena_;
  const float scale = float(lora_->scale());
  const Tensor& u = acts_[size_t(layer)].lora_u[m];
  const bool drop = batch_.dropout_key != 0 && lora_->dropout > 0;
  const float p = float(lora_->dropout);
  const uint64_t stream = dropout_stream(layer, m);
  const int64_t N = x.shape[0], in = x.shape[1];
  Tensor xd = x;  // the adapter's input: x, or dropout(x) regenerated
  if (drop) {
    xd = Tensor::view(r.v_drop_x.data, DType::F32, {N, in}, device_);
    ops::dropout(xd, x, p, batch_.dropout_key, stream);
  }
  Tensor dl = dy, dz;  // the gradients of the LoRA term and (DoRA) of the base term
  if (w.lora_m[m].defined()) {
    const LoraForward lf{.scale = scale, .dora_z = r.v_dora_z, .dora_l = r.v_dora_l, .dora_norm = r.v_dora_norm};
    const DoraScratch d = dora_scratch(lf, N, W.shape[0]);
    dora_weight_norm(d.norm, W, w.lora_a[m], w.lora_b[m], scale, r.v_dora_z);
    ops::matmul(d.z, xd, W, false, true);
    ops::matmul(d.l, u, w.lora_b[m], false, true, scale, 0.0f);
    ops::dora_backward(d.z, d.l, g.lora_m[m], dy, d.z, d.l, w.lora_m[m], d.norm);
    dz = d.z;
    dl = d.l;
  }
  ops::matmul(g.lora_b[m], dl, u, true, false, scale, 1.0f);
  ops::matmul(r.v_du, dl, w.lora_b[m], false, false, scale, 0.0f);
  ops::matmul(g.lora_a[m], r.v_du, xd, true, false, 1.0f, 1.0f);
  if (!drop) {
    ops::matmul(dx, r.v_du, w.lora_a[m], false, false, 1.0f, 1.0f);
    if (dz.defined()) ops::matmul(dx, dz, W, false, false, 1.0f, 1.0f);
    return;
  }
  const Tensor dxd = Tensor::view(r.v_drop_dx.data, DType::F32, {N, in}, device_);
  ops::matmul(dxd, r.v_du, w.lora_a[m]);
  if (dz.defined()) ops::matmul(dxd, dz, W, false, false, 1.0f, 1.0f);
  ops::dropout(dxd, dxd, p, batch_.dropout_key, stream);
  ops::add_inplace(dx, dxd);
}

void LlamaCompute::block_backward(int layer) {
  // On entry dh holds d(block output); on exit d(block input). A checkpointed layer first
  // recomputes its activations from its saved input (the same kernels on the same input give the
  // same bits, so gradients equal the non-checkpointed run's exactly). Frozen weights (a LoRA
  // run's base) have no gradient bound: their dW is not computed, only what flows through them.
  if (offloaded(layer)) reload_input(layer);
  if (checkpointed(layer)) block_activations(layer, false);
  const ModelConfig& c = cfg_;
  const BlockActivations& a = acts_[size_t(layer)];
  const LayerWeights& w = w_.layers[size_t(layer)];
  const LayerWeights& g = g_.layers[size_t(layer)];
  Arena& r = *arena_;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, Dh = c.head_dim;
  using M = LoraModule;
  // dW += dy^T x, for a trained weight.
  auto weight_grad = [](const Tensor& dw, const Tensor& dy, const Tensor& x) {
    if (dw.defined()) ops::matmul(dw, dy, x, true, false, 1.0f, 1.0f);
  };

  // MLP branch: out = h1 + down(silu(gate) * up), gate/up = xn2 W^T, xn2 = norm(h1).
  ops::matmul(r.v_d_act, r.v_dh, w.w_down);
  weight_grad(g.w_down, r.v_dh, a.act);
  lora_backward(layer, int(M::Down), r.v_d_act, r.v_dh, a.act, w.w_down);
  ops::swiglu_backward(r.v_dgate, r.v_dup, r.v_d_act, a.gate, a.up);
  ops::matmul(r.v_dxn, r.v_dgate, w.w_gate);
  ops::matmul(r.v_dxn, r.v_dup, w.w_up, false, false, 1.0f, 1.0f);
  weight_grad(g.w_gate, r.v_dgate, a.xn2);
  weight_grad(g.w_up, r.v_dup, a.xn2);
  lora_backward(layer, int(M::Gate), r.v_dxn, r.v_dgate, a.xn2, w.w_gate);
  lora_backward(layer, int(M::Up), r.v_dxn, r.v_dup, a.xn2, w.w_up);
  ops::rmsnorm_backward(r.v_dtmp, g.mlp_norm, r.v_dxn, a.h1, w.mlp_norm, a.rstd2);
  ops::add_inplace(r.v_dh, r.v_dtmp);  // dh = d h1

  // Attention branch: h1 = x_in + o(att), att = attention(rope(q), rope(k), v), q/k/v = xn1 W^T + b.
  ops::matmul(r.v_datt, r.v_dh, w.wo);
  weight_grad(g.wo, r.v_dh, a.att);
  if (g.bo.defined()) ops::bias_backward(g.bo, r.v_dh);
  lora_backward(layer, int(M::O), r.v_datt, r.v_dh, a.att, w.wo);
  const Tensor seg = batch_.segment_ids ? r.v_segments : Tensor{};
  const Tensor dq4 = r.v_dq.reshape({B_, T_, H, Dh}), dk4 = r.v_dk.reshape({B_, T_, Hkv, Dh});
  ops::attention_backward(dq4, dk4, r.v_dv.reshape({B_, T_, Hkv, Dh}), r.v_datt.reshape({B_, T_, H, Dh}),
                          a.q.reshape({B_, T_, H, Dh}), a.k.reshape({B_, T_, Hkv, Dh}),
                          a.v.reshape({B_, T_, Hkv, Dh}), a.att.reshape({B_, T_, H, Dh}), a.lse, seg,
                          1.0f / std::sqrt(float(Dh)));
  ops::rope_backward(dq4, dq4, r.v_positions, inv_freq_t_);
  ops::rope_backward(dk4, dk4, r.v_positions, inv_freq_t_);
  if (g.bq.defined()) {
    ops::bias_backward(g.bq, r.v_dq);
    ops::bias_backward(g.bk, r.v_dk);
    ops::bias_backward(g.bv, r.v_dv);
  }
  ops::matmul(r.v_dxn, r.v_dq, w.wq);
  ops::matmul(r.v_dxn, r.v_dk, w.wk, false, false, 1.0f, 1.0f);
  ops::matmul(r.v_dxn, r.v_dv, w.wv, false, false, 1.0f, 1.0f);
  weight_grad(g.wq, r.v_dq, a.xn1);
  weight_grad(g.wk, r.v_dk, a.xn1);
  weight_grad(g.wv, r.v_dv, a.xn1);
  lora_backward(layer, int(M::Q), r.v_dxn, r.v_dq, a.xn1, w.wq);
  lora_backward(layer, int(M::K), r.v_dxn, r.v_dk, a.xn1, w.wk);
  lora_backward(layer, int(M::V), r.v_dxn, r.v_dv, a.xn1, w.wv);
  ops::rmsnorm_backward(r.v_dtmp, g.attn_norm, r.v_dxn, a.x_in, w.attn_norm, a.rstd1);
  ops::add_inplace(r.v_dh, r.v_dtmp);  // dh = d x_in
}

void LlamaCompute::embed_backward(const Batch& batch) {
  (void)batch;
  if (g_.embed.defined()) ops::embedding_backward(g_.embed, arena_->v_dh, arena_->v_ids);  // frozen: nothing to do
}

void LlamaCompute::head_logits(const Tensor& out) {
  ops::rmsnorm_forward(arena_->v_xnf, arena_->v_rstdf, arena_->v_h_final, w_.final_norm, float(cfg_.rms_norm_eps));
  ops::matmul(out, arena_->v_xnf, w_.lm_head, false, true);
}

void LlamaCompute::logits(const Batch& batch, const Tensor& out) {
  embed_forward(batch);
  for (int l = 0; l < int(cfg_.num_hidden_layers); ++l) block_forward(l);
  head_logits(out);
}

}  // namespace shardlm::model
