#include "model/gguf_export.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/instruct.h"
#include "data/tokenizer.h"
#include "io/gguf.h"
#include "io/json_parse.h"
#include "io/model_files.h"
#include "io/read_file.h"
#include "io/staged_dir.h"
#include "model/config.h"
#include "model/llama.h"
#include "ops/ops.h"

namespace shardlm {

namespace fs = std::filesystem;

namespace {

using io::GgmlType;

// Elements converted at a time: a chunk of whole rows about this large.
constexpr int64_t kChunkElements = int64_t(4) << 20;

// llama.cpp's token types (llama_token_type / gguf-py TokenType): SentencePiece's, numbered from 1.
int32_t gguf_token_type(data::TokenKind k) { return int32_t(k) + 1; }

// general.file_type (llama_ftype): what most tensors are stored as.
uint32_t file_type(GgufOutType t) {
  switch (t) {
    case GgufOutType::F32: return 0;   // ALL_F32
    case GgufOutType::F16: return 1;   // MOSTLY_F16
    case GgufOutType::Q8_0: return 7;  // MOSTLY_Q8_0
    case GgufOutType::BF16: return 32; // MOSTLY_BF16
  }
  return 0;
}

GgmlType ggml_type(GgufOutType t) {
  switch (t) {
    case GgufOutType::F32: return GgmlType::F32;
    case GgufOutType::F16: return GgmlType::F16;
    case GgufOutType::BF16: return GgmlType::BF16;
    case GgufOutType::Q8_0: return GgmlType::Q8_0;
  }
  return GgmlType::F32;
}

// The GGUF name of a Hugging Face tensor of a Llama-family model (llama.cpp's tensor names).
std::string gguf_tensor_name(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},   {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},         {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.k_proj.bias", "attn_k.bias"},         {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.v_proj.bias", "attn_v.bias"},         {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.o_proj.bias", "attn_output.bias"},    {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  constexpr std::string_view kPrefix = "model.layers.";
  if (hf.starts_with(kPrefix)) {
    const size_t dot = hf.find('.', kPrefix.size());
    if (dot != std::string::npos) {
      const std::string layer = hf.substr(kPrefix.size(), dot - kPrefix.size());
      const std::string rest = hf.substr(dot + 1);
      for (const auto& [from, to] : kLayer)
        if (rest == from) return fmt::format("blk.{}.{}", layer, to);
    }
  }
  SHARDLM_CHECK(false, "no GGUF name for tensor {}", hf);
  return "";
}

// One tensor to write: from the model's weights (hf set) or computed (data set: rope_freqs).
struct Item {
  std::string hf;
  io::GgufTensor t;
  int64_t permute_head_rows = 0;  // > 0: permute rows within blocks of this many (a head's)
  std::vector<float> data;
};

// HF's rotate-half layout -> interleaved pairs, within one head of `hd` rows of `cols` values:
// out row 2i + j = in row j * hd/2 + i (convert_hf_to_gguf.py's permute: reshape(2, hd/2) and swap).
void permute_head(const float* in, float* out, int64_t hd, int64_t cols) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; ++i)
    for (int64_t j = 0; j < 2; ++j)
      std::copy_n(in + (j * half + i) * cols, cols, out + (2 * i + j) * cols);
}

nlohmann::json read_json_if_present(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return nlohmann::json::object();
  const std::string text = io::read_file(path.string(), "tokenizer config");
  try {
    return io::parse_json(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("malformed JSON: {}", e.what()), {.file = path.string()});
  }
}

std::optional<bool> json_bool(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

// The name llama.cpp knows a byte-level BPE's pre-tokenizer by (tokenizer.ggml.pre), from its regexes.
std::string bpe_pre_name(const std::vector<std::string>& patterns, const std::string& dir) {
  if (patterns.size() == 1) {
    if (patterns[0] == data::kLlama3PreTokenizerPattern) return "llama-bpe";
    if (patterns[0] == data::kQwen2PreTokenizerPattern) return "qwen2";
    if (patterns[0] == data::kGpt2PreTokenizerPattern) return "gpt-2";
  }
  std::string shown;
  for (const std::string& p : patterns) shown += (shown.empty() ? "" : " then ") + p;
  throw Error(fmt::format("the tokenizer's pre-tokenizer ({}) is none llama.cpp knows by name (Llama 3's, Qwen2's or "
                          "GPT-2's regex): the GGUF file would tokenize differently",
                          shown.empty() ? "none" : shown),
              {.file = dir});
}

// The tokenizer.* keys. Returns a one-line summary for the report.
std::string add_tokenizer(io::GgufMetadata& kv, const std::string& dir, const ModelConfig& cfg) {
  const std::unique_ptr<data::Tokenizer> tok = data::load_model_tokenizer(dir, cfg.vocab_size, true);
  std::optional<data::VocabularyExport> v = tok->vocabulary();
  if (!v)
    throw Error("no tokenizer files (tokenizer.json, tokenizer.model or vocab.json + merges.txt): a GGUF file embeds "
                "the vocabulary; copy the model's tokenizer files beside its config.json",
                {.file = dir});
  const bool bpe = v->model == data::VocabularyExport::Model::ByteLevelBpe;
  const std::string pre = bpe ? bpe_pre_name(v->pre_patterns, dir) : "default";
  const size_t n = size_t(cfg.vocab_size);
  std::vector<std::string> tokens(n);
  std::vector<int32_t> types(n, gguf_token_type(data::TokenKind::Unused));
  std::vector<float> scores(bpe ? 0 : n, -10000.0f);
  for (size_t id = 0; id < n; ++id) {
    // Ids the vocabulary does not use (rows a model pads its embedding with) get placeholders, as
    // llama.cpp's converter writes them: every token text must be distinct.
    tokens[id] = id < v->pieces.size() && !v->pieces[id].empty() ? v->pieces[id] : fmt::format("[PAD{}]", id);
    if (id < v->kinds.size()) types[id] = gguf_token_type(v->kinds[id]);
    if (!bpe && id < v->scores.size()) scores[id] = v->scores[id];
  }
  kv.add_string("tokenizer.ggml.model", bpe ? "gpt2" : "llama");
  kv.add_string("tokenizer.ggml.pre", pre);
  kv.add_strings("tokenizer.ggml.tokens", tokens);
  if (!bpe) kv.add_f32s("tokenizer.ggml.scores", scores);
  kv.add_i32s("tokenizer.ggml.token_type", types);
  if (bpe) {
    std::vector<std::string> merges;
    merges.reserve(v->merges.size());
    for (const auto& [l, r] : v->merges) merges.push_back(l + " " + r);
    kv.add_strings("tokenizer.ggml.merges", merges);
  } else {
    kv.add_bool("tokenizer.ggml.add_space_prefix", v->add_dummy_prefix);
  }
  // Special ids: the tokenizer's own (tokenizer_config.json decides for tokenizer.json), else
  // config.json's, as the converter's SpecialVocab falls back.
  auto in_vocab = [&](int64_t id) { return id >= 0 && id < cfg.vocab_size; };
  const int64_t bos = tok->bos_id() >= 0 ? tok->bos_id() : cfg.bos_token_id.value_or(-1);
  const int64_t eos = tok->eos_id() >= 0 ? tok->eos_id() : (cfg.eos_token_ids.empty() ? -1 : cfg.eos_token_ids[0]);
  const int64_t pad = cfg.pad_token_id.value_or(v->pad);
  if (in_vocab(bos)) kv.add_u32("tokenizer.ggml.bos_token_id", uint32_t(bos));
  if (in_vocab(eos)) kv.add_u32("tokenizer.ggml.eos_token_id", uint32_t(eos));
  if (in_vocab(v->unk)) kv.add_u32("tokenizer.ggml.unknown_token_id", uint32_t(v->unk));
  if (in_vocab(pad)) kv.add_u32("tokenizer.ggml.padding_token_id", uint32_t(pad));
  // Whether a prompt starts with BOS: tokenizer_config.json's add_bos_token when it says, else
  // whenever the tokenizer has a BOS (shardlm prepends it in training and generation).
  const nlohmann::json tc = read_json_if_present(fs::path(dir) / "tokenizer_config.json");
  kv.add_bool("tokenizer.ggml.add_bos_token", json_bool(tc, "add_bos_token").value_or(tok->bos_id() >= 0));
  if (const auto add_eos = json_bool(tc, "add_eos_token")) kv.add_bool("tokenizer.ggml.add_eos_token", *add_eos);
  const std::string chat = data::read_chat_template(dir);
  if (!chat.empty()) kv.add_string("tokenizer.chat_template", chat);
  return bpe ? fmt::format("gpt2 ({}): {} tokens, {} merges", pre, n, v->merges.size())
             : fmt::format("llama (SentencePiece): {} tokens", n);
}

// Llama 3.1+'s frequency rescaling as llama.cpp applies it: rope_freqs[i] divides frequency i.
// The factors are what shardlm's (transformers') rescaled frequencies imply, so llama.cpp rotates
// by the same angles the model was trained with.
std::vector<float> rope_freq_factors(const ModelConfig& cfg) {
  const std::vector<float> plain = ops::rope_inv_freq(cfg.head_dim, float(cfg.rope_theta), ops::RopeScaling{});
  const std::vector<float> scaled = ops::rope_inv_freq(cfg.head_dim, float(cfg.rope_theta), cfg.rope_scaling);
  std::vector<float> f(plain.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(double(plain[i]) / double(scaled[i]));
  return f;
}

// Writes `item`'s data: the source rows in chunks, to f32, permuted, then to the file's type.
void write_item(io::GgufWriter& w, const Item& item, const io::ModelWeights& weights) {
  const std::string& name = item.t.name;
  auto emit = [&](const float* x, int64_t n) {
    switch (item.t.type) {
      case GgmlType::F32: w.write(name, x, size_t(n) * 4); break;
      case GgmlType::F16: {
        std::vector<f16_t> h(static_cast<size_t>(n));
        convert_f32_to_f16(x, h.data(), size_t(n));
        w.write(name, h.data(), h.size() * 2);
        break;
      }
      case GgmlType::BF16: {
        std::vector<bf16_t> h(static_cast<size_t>(n));
        convert_f32_to_bf16(x, h.data(), size_t(n));
        w.write(name, h.data(), h.size() * 2);
        break;
      }
      case GgmlType::Q8_0: {
        std::vector<uint8_t> q(io::ggml_nbytes(GgmlType::Q8_0, n));
        try {
          io::quantize_q8_0(x, n, q.data());
        } catch (Error& e) {
          e.set_tensor(item.hf);
          throw;
        }
        w.write(name, q.data(), q.size());
        break;
      }
    }
  };
  if (item.hf.empty()) {
    emit(item.data.data(), int64_t(item.data.size()));
    return;
  }
  const io::TensorInfo& info = weights.info(item.hf);
  const int64_t rows = info.shape[0], cols = info.numel() / rows;
  int64_t chunk = std::max<int64_t>(1, kChunkElements / cols);
  if (item.permute_head_rows > 0) chunk = std::max(item.permute_head_rows, chunk / item.permute_head_rows * item.permute_head_rows);
  std::vector<uint8_t> raw;
  std::vector<float> x, y;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t nr = std::min(chunk, rows - r0), n = nr * cols;
    raw.resize(size_t(n) * info.element_size());
    weights.read_range(item.hf, uint64_t(r0 * cols), uint64_t(n), raw.data());
    x.resize(size_t(n));
    switch (*info.dtype) {
      case DType::F32: std::copy_n(reinterpret_cast<const float*>(raw.data()), n, x.data()); break;
      case DType::BF16: convert_bf16_to_f32(reinterpret_cast<const bf16_t*>(raw.data()), x.data(), size_t(n)); break;
      case DType::F16: convert_f16_to_f32(reinterpret_cast<const f16_t*>(raw.data()), x.data(), size_t(n)); break;
      default: SHARDLM_CHECK(false, "{} is not a float tensor", item.hf);
    }
    if (item.permute_head_rows > 0) {
      y.resize(x.size());
      for (int64_t h = 0; h < nr; h += item.permute_head_rows)
        permute_head(x.data() + h * cols, y.data() + h * cols, item.permute_head_rows, cols);
      std::swap(x, y);
    }
    emit(x.data(), n);
  }
}

std::string model_name_of(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::error_code ec;
  const fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
  return (ec ? p : abs).filename().string();
}

}  // namespace

GgufOutType gguf_outtype_of(const std::string& name, const std::string& role) {
  if (name == "f32") return GgufOutType::F32;
  if (name == "f16") return GgufOutType::F16;
  if (name == "bf16") return GgufOutType::BF16;
  if (name == "q8_0") return GgufOutType::Q8_0;
  throw Error(fmt::format("'{}': expected f32, f16, bf16 or q8_0", name), {.key = role});
}

const char* gguf_outtype_name(GgufOutType t) {
  switch (t) {
    case GgufOutType::F32: return "f32";
    case GgufOutType::F16: return "f16";
    case GgufOutType::BF16: return "bf16";
    case GgufOutType::Q8_0: return "q8_0";
  }
  return "?";
}

GgufExportReport export_gguf(const GgufExportOptions& opt) {
  const ModelConfig cfg = load_model_config(opt.model);
  const fs::path dir(opt.model);
  if (cfg.quantization && cfg.quantization->quant_method == "bitsandbytes")
    throw Error("a bitsandbytes-quantized model: export the dense model it was quantized from, or a merged fine-tune",
                {.file = (dir / "config.json").string(), .key = "quantization_config"});
  // The output must not be the model directory or any file it reads.
  {
    std::error_code ec;
    if (fs::is_directory(opt.out, ec))
      throw Error("is a directory; give the path of the .gguf file to write", {.file = opt.out});
  }
  io::refuse_output_over_input(opt.out, "the output", opt.model, "model directory");
  const io::ModelWeights weights(opt.model);
  for (const io::SafetensorsFile& f : weights.files())
    io::refuse_output_over_input(opt.out, "the output", f.path(), "weights file");
  for (const char* f : {"config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer.model",
                        "tokenizer_config.json", "vocab.json", "merges.txt", "generation_config.json"})
    io::refuse_output_over_input(opt.out, "the output", (dir / f).string(), f);

  GgufExportReport report;
  const bool qwen2 = cfg.architecture == Architecture::Qwen2;
  report.architecture = qwen2 ? "qwen2" : "llama";
  const std::string& arch = report.architecture;

  // Every tensor of the model, checked against the files, in llama.cpp's order (rope_freqs first).
  std::vector<Item> items;
  if (cfg.rope_scaling.kind == ops::RopeScaling::Kind::Llama3) {
    Item it;
    it.data = rope_freq_factors(cfg);
    it.t = {"rope_freqs.weight", {int64_t(it.data.size())}, GgmlType::F32};
    items.push_back(std::move(it));
    report.rope_freqs = true;
  }
  std::set<std::string> known;
  for (const model::ModelPart& part : model::llama_parts(cfg))
    for (const model::ParamInfo& p : part.params) {
      if (!weights.has(p.name)) throw Error("missing from the model's weights", {.file = opt.model, .tensor = p.name});
      known.insert(p.name);
      const io::TensorInfo& info = weights.float_info(p.name, p.shape);
      Item it;
      it.hf = p.name;
      it.t.name = gguf_tensor_name(p.name);
      it.t.shape = p.shape;
      // Norms, biases and every 1-D tensor stay F32 (llama.cpp's converter: most of ggml's code
      // takes them only in F32); the weight matrices take the chosen type.
      const bool matrix = p.shape.size() == 2 && it.t.name.ends_with(".weight") && !it.t.name.ends_with("_norm.weight");
      it.t.type = matrix ? ggml_type(opt.outtype) : GgmlType::F32;
      if (it.t.type == GgmlType::Q8_0 && p.shape.back() % io::kQ8_0Block != 0) {
        it.t.type = GgmlType::F16;
        report.f16_fallback.push_back(it.t.name);
      }
      const bool q = p.name.ends_with("self_attn.q_proj.weight") || p.name.ends_with("self_attn.q_proj.bias");
      const bool k = p.name.ends_with("self_attn.k_proj.weight") || p.name.ends_with("self_attn.k_proj.bias");
      if (!qwen2 && (q || k)) it.permute_head_rows = cfg.head_dim;
      report.parameters += info.numel();
      items.push_back(std::move(it));
    }
  for (const std::string& name : weights.names())
    if (!known.count(name) && name.find("rotary_emb.inv_freq") == std::string::npos)
      throw Error("in the weights but not in the model config.json describes", {.file = weights.file_of(name), .tensor = name});

  io::GgufMetadata kv;
  kv.add_string("general.architecture", arch);
  kv.add_string("general.type", "model");
  kv.add_string("general.name", opt.name.empty() ? model_name_of(opt.model) : opt.name);
  kv.add_u32("general.file_type", file_type(opt.outtype));
  kv.add_u32("general.quantization_version", 2);  // GGML_QUANT_VERSION
  kv.add_u32(arch + ".vocab_size", uint32_t(cfg.vocab_size));
  kv.add_u32(arch + ".context_length", uint32_t(cfg.max_position_embeddings));
  kv.add_u32(arch + ".embedding_length", uint32_t(cfg.hidden_size));
  kv.add_u32(arch + ".block_count", uint32_t(cfg.num_hidden_layers));
  kv.add_u32(arch + ".feed_forward_length", uint32_t(cfg.intermediate_size));
  kv.add_u32(arch + ".attention.head_count", uint32_t(cfg.num_attention_heads));
  kv.add_u32(arch + ".attention.head_count_kv", uint32_t(cfg.num_key_value_heads));
  kv.add_u32(arch + ".attention.key_length", uint32_t(cfg.head_dim));
  kv.add_u32(arch + ".attention.value_length", uint32_t(cfg.head_dim));
  kv.add_f32(arch + ".attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps));
  kv.add_f32(arch + ".rope.freq_base", float(cfg.rope_theta));
  kv.add_u32(arch + ".rope.dimension_count", uint32_t(cfg.head_dim));
  try {
    report.tokenizer = add_tokenizer(kv, opt.model, cfg);
  } catch (Error& e) {
    if (e.context().file.empty()) e.set_file(opt.model);
    throw;
  }
  if (cfg.sliding_window > 0 && cfg.sliding_window < cfg.max_position_embeddings)
    report.notes.push_back(fmt::format("sliding_window {} is not in the file: llama.cpp's llama architecture attends to "
                                       "the whole context (as its own converter leaves it)",
                                       cfg.sliding_window));

  std::vector<io::GgufTensor> plan;
  for (const Item& it : items) {
    plan.push_back(it.t);
    ++report.tensors_by_type[io::ggml_type_name(it.t.type)];
  }
  report.tensors = int64_t(plan.size());
  io::GgufWriter w(opt.out, std::move(kv), std::move(plan));
  for (const Item& it : items) write_item(w, it, weights);
  w.finish();
  report.file_bytes = w.file_size();
  return report;
}

}  // namespace shardlm
