#include "model/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "io/json_parse.h"

namespace shardlm {

namespace {

// An ErrorContext naming only a file (designated initializers would warn about the rest).
ErrorContext file_context(std::string file) {
  ErrorContext ctx;
  ctx.file = std::move(file);
  return ctx;
}

using json = nlohmann::json;

Error key_error(const std::string& key, std::string message) {
  Error e(std::move(message));
  e.set_key(key);
  return e;
}

// A value as the user wrote it, short enough for a one-line message.
std::string brief(const json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return fmt::format("{} {}", v.type_name(), s);
}

constexpr Architecture kArchitectures[] = {Architecture::Llama, Architecture::Mistral, Architecture::Qwen2};

std::string supported_architectures() {
  std::vector<std::string> names;
  for (Architecture a : kArchitectures) names.emplace_back(architecture_name(a));
  return fmt::format("{}", fmt::join(names, ", "));
}

// Typed access to the fields of one JSON object. Absent and null both mean "not given":
// HF writes null for unset optional fields (rope_scaling, head_dim, sliding_window).
class Fields {
 public:
  Fields(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  std::string key(const std::string& name) const { return prefix_.empty() ? name : prefix_ + "." + name; }
  bool present(const std::string& name) const { return obj_.contains(name); }
  const json* find(const std::string& name) const {
    auto it = obj_.find(name);
    return (it == obj_.end() || it->is_null()) ? nullptr : &*it;
  }

  int64_t to_int(const json& v, const std::string& k) const {
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        throw key_error(k, fmt::format("integer {} is too large", v.get<uint64_t>()));
      return int64_t(v.get<uint64_t>());
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    // 4096.0 is an integer written by a float-happy tool; 2.5 is not.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return int64_t(d);
    }
    throw key_error(k, fmt::format("expected an integer, got {}", brief(v)));
  }
  std::optional<int64_t> opt_int(const std::string& name) const {
    const json* v = find(name);
    if (!v) return std::nullopt;
    return to_int(*v, key(name));
  }
  int64_t req_int(const std::string& name) const {
    auto v = opt_int(name);
    if (!v) throw key_error(key(name), "missing required key (expected an integer)");
    return *v;
  }

  std::optional<double> opt_number(const std::string& name) const {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw key_error(key(name), fmt::format("expected a number, got {}", brief(*v)));
    return v->get<double>();
  }
  double req_number(const std::string& name) const {
    auto v = opt_number(name);
    if (!v) throw key_error(key(name), "missing required key (expected a number)");
    return *v;
  }

  std::optional<bool> opt_bool(const std::string& name) const {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw key_error(key(name), fmt::format("expected true or false, got {}", brief(*v)));
    return v->get<bool>();
  }

  std::optional<std::string> opt_string(const std::string& name) const {
    const json* v = find(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw key_error(key(name), fmt::format("expected a string, got {}", brief(*v)));
    return v->get<std::string>();
  }

  const json& obj() const { return obj_; }

 private:
  const json& obj_;
  std::string prefix_;
};

Architecture parse_architecture(const std::string& name) {
  for (Architecture a : kArchitectures)
    if (name == architecture_name(a)) return a;
  throw key_error("architectures", fmt::format("unsupported architecture '{}'; supported: {}", name,
                                               supported_architectures()));
}

Architecture architecture_from_model_type(const std::string& model_type) {
  for (Architecture a : kArchitectures)
    if (model_type == architecture_model_type(a)) return a;
  throw key_error("model_type", fmt::format("unsupported model_type '{}' (and no 'architectures' key); supported: {}",
                                            model_type, supported_architectures()));
}

// rope_scaling (or transformers 5's rope_parameters) -> ops::RopeScaling.
// `key` is the JSON key the object came from, for messages.
ops::RopeScaling parse_rope_scaling(const json& obj, const std::string& key) {
  if (!obj.is_object()) throw key_error(key, fmt::format("expected an object or null, got {}", brief(obj)));
  const Fields f(obj, key);
  // transformers renamed "type" to "rope_type"; configs in the wild carry either.
  const std::string type_key = f.present("rope_type") ? "rope_type" : "type";
  const std::string type = f.opt_string(type_key).value_or("default");
  ops::RopeScaling s;
  if (type == "default") return s;  // transformers' name for "no scaling"
  if (type != "llama3")
    throw key_error(f.key(type_key), fmt::format("unsupported rope scaling '{}'; supported: llama3 (or null for none)", type));
  s.kind = ops::RopeScaling::Kind::Llama3;
  s.factor = float(f.req_number("factor"));
  s.low_freq_factor = float(f.req_number("low_freq_factor"));
  s.high_freq_factor = float(f.req_number("high_freq_factor"));
  s.original_max_position_embeddings = f.req_int("original_max_position_embeddings");
  return s;
}

std::vector<int64_t> parse_token_ids(const json& v, const std::string& key, const Fields& f) {
  if (v.is_array()) {
    std::vector<int64_t> ids;
    for (size_t i = 0; i < v.size(); ++i) ids.push_back(f.to_int(v[i], fmt::format("{}[{}]", key, i)));
    return ids;
  }
  if (v.is_number()) return {f.to_int(v, key)};
  throw key_error(key, fmt::format("expected an integer or a list of integers, got {}", brief(v)));
}

bool is_llama3(const ops::RopeScaling& s) { return s.kind == ops::RopeScaling::Kind::Llama3; }

void check_token_id(int64_t id, int64_t vocab_size, const std::string& key) {
  if (id < 0 || id >= vocab_size)
    throw key_error(key, fmt::format("token id {} outside the vocabulary [0, {})", id, vocab_size));
}

}  // namespace

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::Llama: return "LlamaForCausalLM";
    case Architecture::Mistral: return "MistralForCausalLM";
    case Architecture::Qwen2: return "Qwen2ForCausalLM";
  }
  return "?";
}

const char* architecture_model_type(Architecture arch) {
  switch (arch) {
    case Architecture::Llama: return "llama";
    case Architecture::Mistral: return "mistral";
    case Architecture::Qwen2: return "qwen2";
  }
  return "?";
}

bool operator==(const ModelConfig& a, const ModelConfig& b) {
  auto rope_tuple = [](const ops::RopeScaling& s) {
    return std::tuple(s.kind, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings);
  };
  auto tuple = [&](const ModelConfig& c) {
    return std::tuple(c.architecture, c.model_type, c.vocab_size, c.hidden_size, c.intermediate_size,
                      c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                      c.rms_norm_eps, c.rope_theta, rope_tuple(c.rope_scaling), c.max_position_embeddings,
                      c.tie_word_embeddings, c.qkv_bias, c.o_bias, c.sliding_window, c.bos_token_id,
                      c.eos_token_ids, c.pad_token_id, c.torch_dtype, c.initializer_range);
  };
  return tuple(a) == tuple(b);
}

namespace {

constexpr int64_t kMaxWidth = int64_t(1) << 20;      // hidden, intermediate, head_dim (405B: 53248)
constexpr int64_t kMaxCount = int64_t(1) << 16;      // layers, heads
constexpr int64_t kMaxPositions = int64_t(1) << 24;  // context length (Llama 3.1: 131072)
constexpr double kMaxParameters = 0x1p40;            // 1.1e12 (Llama 3.1 405B: 4.1e11)

// The parameters the config describes, counted in double (each dimension within its bound, the
// product still may not fit 64 bits), refused past kMaxParameters naming the key that dominates.
void check_parameter_count(const ModelConfig& c) {
  const double h = double(c.hidden_size), q = double(c.num_attention_heads * c.head_dim),
               kv = double(c.num_key_value_heads * c.head_dim), inter = double(c.intermediate_size);
  const double embeddings = double(c.vocab_size) * h * (c.tie_word_embeddings ? 1 : 2);
  const double attention = h * q * 2 + h * kv * 2, mlp = 3 * h * inter;
  const double layers = double(c.num_hidden_layers) * (attention + mlp + 2 * h);
  const double total = embeddings + layers + h;
  if (total <= kMaxParameters) return;
  const char* key = embeddings >= layers                  ? "vocab_size"
                    : c.num_hidden_layers > 1024          ? "num_hidden_layers"
                    : mlp >= attention                    ? "intermediate_size"
                    : c.num_attention_heads > c.hidden_size ? "num_attention_heads"
                                                            : "hidden_size";
  throw key_error(key, fmt::format("the model would have {:.3g} parameters ({:.3g} in embeddings, {} layers of "
                                   "{:.3g}), more than shardlm's limit of {:.3g}",
                                   total, embeddings, c.num_hidden_layers, attention + mlp + 2 * h, kMaxParameters));
}

}  // namespace

void validate_model_config(const ModelConfig& c) {
  auto positive = [](int64_t v, const char* key) {
    if (v <= 0) throw key_error(key, fmt::format("must be positive, got {}", v));
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.hidden_size, "hidden_size");
  positive(c.intermediate_size, "intermediate_size");
  positive(c.num_hidden_layers, "num_hidden_layers");
  positive(c.num_attention_heads, "num_attention_heads");
  positive(c.num_key_value_heads, "num_key_value_heads");
  positive(c.head_dim, "head_dim");
  positive(c.max_position_embeddings, "max_position_embeddings");
  // Upper bounds far past any Llama-family model's, so that sizes computed from the config fit in
  // 64 bits and a typo (or a hostile file) is refused by key, not met later as a SIGFPE or an
  // allocation of petabytes (issue 30). Token ids are int32.
  auto at_most = [](int64_t v, int64_t most, const char* key) {
    if (v > most) throw key_error(key, fmt::format("must be at most {}, got {}", most, v));
  };
  at_most(c.vocab_size, std::numeric_limits<int32_t>::max(), "vocab_size");
  at_most(c.hidden_size, kMaxWidth, "hidden_size");
  at_most(c.intermediate_size, kMaxWidth, "intermediate_size");
  at_most(c.head_dim, kMaxWidth, "head_dim");
  at_most(c.num_hidden_layers, kMaxCount, "num_hidden_layers");
  at_most(c.num_attention_heads, kMaxCount, "num_attention_heads");
  at_most(c.num_key_value_heads, kMaxCount, "num_key_value_heads");
  at_most(c.max_position_embeddings, kMaxPositions, "max_position_embeddings");
  check_parameter_count(c);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw key_error("num_key_value_heads",
                    fmt::format("num_attention_heads ({}) must be divisible by num_key_value_heads ({})",
                                c.num_attention_heads, c.num_key_value_heads));
  // RoPE rotates pairs (i, i + head_dim/2).
  if (c.head_dim % 2 != 0) throw key_error("head_dim", fmt::format("must be even for RoPE, got {}", c.head_dim));
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    throw key_error("rms_norm_eps", fmt::format("must be positive, got {}", c.rms_norm_eps));
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    throw key_error("rope_theta", fmt::format("must be positive, got {}", c.rope_theta));
  if (is_llama3(c.rope_scaling)) {
    const ops::RopeScaling& s = c.rope_scaling;
    if (!(s.factor > 0)) throw key_error("rope_scaling.factor", fmt::format("must be positive, got {}", s.factor));
    if (!(s.low_freq_factor > 0))
      throw key_error("rope_scaling.low_freq_factor", fmt::format("must be positive, got {}", s.low_freq_factor));
    // Llama 3 smooths between the two wavelength bounds, dividing by their difference.
    if (!(s.high_freq_factor > s.low_freq_factor))
      throw key_error("rope_scaling.high_freq_factor",
                      fmt::format("must be greater than low_freq_factor ({}), got {}", s.low_freq_factor,
                                  s.high_freq_factor));
    if (s.original_max_position_embeddings <= 0)
      throw key_error("rope_scaling.original_max_position_embeddings",
                      fmt::format("must be positive, got {}", s.original_max_position_embeddings));
  }
  if (c.sliding_window < 0)
    throw key_error("sliding_window", fmt::format("must be positive (or null for none), got {}", c.sliding_window));
  if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16")
    throw key_error("torch_dtype",
                    fmt::format("unsupported dtype '{}'; supported: float32, bfloat16, float16", c.torch_dtype));
  if (!(c.initializer_range >= 0) || !std::isfinite(c.initializer_range))
    throw key_error("initializer_range", fmt::format("must be non-negative, got {}", c.initializer_range));
  if (c.bos_token_id) check_token_id(*c.bos_token_id, c.vocab_size, "bos_token_id");
  for (int64_t id : c.eos_token_ids) check_token_id(id, c.vocab_size, "eos_token_id");
  // pad_token_id is not checked: some published configs point it past the vocabulary.
}

std::vector<int64_t> eos_token_ids_from_json(const json& v, int64_t vocab_size) {
  if (v.is_null()) return {};
  static const json kNoObject = json::object();  // only Fields' integer reading is used
  std::vector<int64_t> ids = parse_token_ids(v, "eos_token_id", Fields(kNoObject, ""));
  for (int64_t id : ids) check_token_id(id, vocab_size, "eos_token_id");
  return ids;
}

ModelConfig model_config_from_json(const json& j) {
  if (!j.is_object()) throw Error(fmt::format("config.json must be a JSON object, got {}", brief(j)));
  const Fields f(j, "");
  ModelConfig c;

  // transformers instantiates architectures[0]; model_type is the fallback it uses too.
  const std::optional<std::string> model_type = f.opt_string("model_type");
  if (const json* a = f.find("architectures")) {
    if (a->is_string()) {
      c.architecture = parse_architecture(a->get<std::string>());
    } else if (a->is_array() && !a->empty() && (*a)[0].is_string()) {
      c.architecture = parse_architecture((*a)[0].get<std::string>());
    } else {
      throw key_error("architectures", fmt::format("expected a list of class names, got {}", brief(*a)));
    }
  } else if (model_type) {
    c.architecture = architecture_from_model_type(*model_type);
  } else {
    throw key_error("architectures", fmt::format("missing (and no model_type); supported: {}",
                                                 supported_architectures()));
  }
  c.model_type = model_type.value_or(architecture_model_type(c.architecture));
  const bool llama = c.architecture == Architecture::Llama;
  const bool mistral = c.architecture == Architecture::Mistral;
  const bool qwen2 = c.architecture == Architecture::Qwen2;

  if (auto act = f.opt_string("hidden_act"); act && *act != "silu")
    throw key_error("hidden_act", fmt::format("unsupported activation '{}'; only 'silu' is supported", *act));

  c.vocab_size = f.req_int("vocab_size");
  c.hidden_size = f.req_int("hidden_size");
  c.intermediate_size = f.req_int("intermediate_size");
  c.num_hidden_layers = f.req_int("num_hidden_layers");
  c.num_attention_heads = f.req_int("num_attention_heads");
  c.num_key_value_heads = f.opt_int("num_key_value_heads").value_or(c.num_attention_heads);
  if (auto hd = f.opt_int("head_dim")) {
    c.head_dim = *hd;  // Llama 3.2 and Mistral-Nemo state it; it need not be hidden/heads
  } else if (c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw key_error("hidden_size", fmt::format("hidden_size ({}) must be divisible by num_attention_heads ({}) "
                                                 "when head_dim is not given",
                                                 c.hidden_size, c.num_attention_heads));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  // Defaults are transformers' own, so a sparse config means what it means to transformers.
  c.rms_norm_eps = f.opt_number("rms_norm_eps").value_or(1e-6);
  c.max_position_embeddings = f.opt_int("max_position_embeddings").value_or(llama ? 2048 : mistral ? 131072 : 32768);
  c.tie_word_embeddings = f.opt_bool("tie_word_embeddings").value_or(false);
  c.initializer_range = f.opt_number("initializer_range").value_or(0.02);

  c.rope_theta = f.opt_number("rope_theta").value_or(10000.0);
  if (const json* rs = f.find("rope_scaling")) {
    c.rope_scaling = parse_rope_scaling(*rs, "rope_scaling");
  } else if (const json* rp = f.find("rope_parameters")) {
    // transformers 5 folds rope_theta and the scaling into one object.
    c.rope_scaling = parse_rope_scaling(*rp, "rope_parameters");
    if (auto theta = Fields(*rp, "rope_parameters").opt_number("rope_theta")) c.rope_theta = *theta;
  }

  // Biases follow the modeling code, not a uniform key: Qwen2 always has q/k/v biases and no
  // o bias; Llama's attention_bias puts biases on all four; Mistral has none.
  if (qwen2) {
    c.qkv_bias = true;
    c.o_bias = false;
  } else if (llama) {
    c.qkv_bias = c.o_bias = f.opt_bool("attention_bias").value_or(false);
  }
  if (f.opt_bool("mlp_bias").value_or(false))
    throw key_error("mlp_bias", "biases on the MLP projections are not supported");

  if (mistral) c.sliding_window = f.opt_int("sliding_window").value_or(0);
  // Qwen2 carries sliding_window but applies it only when use_sliding_window is set.
  if (qwen2 && f.opt_bool("use_sliding_window").value_or(false))
    throw key_error("use_sliding_window", "sliding-window attention for Qwen2 is not supported");

  // Absent ids take transformers' defaults (Llama/Mistral: bos 1, eos 2); null means none.
  if (!f.present("bos_token_id")) {
    if (!qwen2) c.bos_token_id = 1;
  } else {
    c.bos_token_id = f.opt_int("bos_token_id");
  }
  if (!f.present("eos_token_id")) {
    if (!qwen2) c.eos_token_ids = {2};
  } else if (const json* eos = f.find("eos_token_id")) {
    c.eos_token_ids = parse_token_ids(*eos, "eos_token_id", f);
  }
  // Old conversions write pad_token_id -1 for "no padding token".
  c.pad_token_id = f.opt_int("pad_token_id");
  if (c.pad_token_id && *c.pad_token_id < 0) c.pad_token_id.reset();

  // transformers >= 4.56 writes "dtype" instead of "torch_dtype".
  if (auto dt = f.opt_string("torch_dtype")) {
    c.torch_dtype = *dt;
  } else if (auto dt2 = f.opt_string("dtype")) {
    c.torch_dtype = *dt2;
  }

  if (const json* q = f.find("quantization_config")) c.quantization = quantization_config_from_json(*q);

  validate_model_config(c);
  return c;
}

QuantizationConfig quantization_config_from_json(const json& j) {
  const std::string prefix = "quantization_config";
  if (!j.is_object()) throw key_error(prefix, fmt::format("expected an object, got {}", brief(j)));
  const Fields f(j, prefix);
  QuantizationConfig q;
  q.quant_method = f.opt_string("quant_method").value_or("");
  // transformers writes both "load_in_4bit" and its private mirror "_load_in_4bit".
  q.load_in_4bit = f.opt_bool("load_in_4bit").value_or(f.opt_bool("_load_in_4bit").value_or(false));
  q.load_in_8bit = f.opt_bool("load_in_8bit").value_or(f.opt_bool("_load_in_8bit").value_or(false));
  // BitsAndBytesConfig's default quant type is fp4.
  q.quant_type = f.opt_string("bnb_4bit_quant_type").value_or(q.load_in_4bit ? "fp4" : "");
  q.double_quant = f.opt_bool("bnb_4bit_use_double_quant").value_or(false);
  q.compute_dtype = f.opt_string("bnb_4bit_compute_dtype").value_or("");
  q.quant_storage = f.opt_string("bnb_4bit_quant_storage").value_or("uint8");
  if (const json* skip = f.find("llm_int8_skip_modules")) {
    if (!skip->is_array()) throw key_error(f.key("llm_int8_skip_modules"), fmt::format("expected a list, got {}", brief(*skip)));
    for (const json& m : *skip) {
      if (!m.is_string())
        throw key_error(f.key("llm_int8_skip_modules"), fmt::format("expected module names, got {}", brief(m)));
      q.skip_modules.push_back(m.get<std::string>());
    }
  }
  return q;
}

std::string QuantizationConfig::describe() const {
  std::string s = quant_method.empty() ? std::string("unknown method") : quant_method;
  if (load_in_4bit) {
    s += fmt::format(" 4-bit {}", quant_type);
    if (double_quant) s += ", double quant";
    if (!compute_dtype.empty()) s += fmt::format(", compute {}", compute_dtype);
    s += fmt::format(", storage {}", quant_storage);
  } else if (load_in_8bit) {
    s += " 8-bit";
  }
  return s;
}

ModelConfig load_model_config(const std::string& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file)) file /= "config.json";
  const std::string name = file.string();
  std::ifstream in(file);
  if (!in) throw Error("cannot open model config", file_context(name));
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = io::parse_json(text.str());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large
    throw Error(fmt::format("invalid JSON: {}", e.what()), file_context(name));
  }
  try {
    return model_config_from_json(j);
  } catch (Error& e) {
    e.set_file(name);
    throw;
  }
}

json to_hf_json(const ModelConfig& c) {
  validate_model_config(c);
  // Refuse what transformers' modeling code cannot express rather than write a config that
  // loads into a different model.
  const bool llama = c.architecture == Architecture::Llama;
  const bool mistral = c.architecture == Architecture::Mistral;
  const bool qwen2 = c.architecture == Architecture::Qwen2;
  if (qwen2 && !(c.qkv_bias && !c.o_bias))
    throw key_error("attention_bias", "Qwen2 always has q/k/v biases and no o_proj bias");
  if (mistral && (c.qkv_bias || c.o_bias)) throw key_error("attention_bias", "Mistral has no attention biases");
  if (llama && c.qkv_bias != c.o_bias)
    throw key_error("attention_bias", "Llama's attention_bias sets biases on q, k, v and o together");
  if (!mistral && c.sliding_window != 0)
    throw key_error("sliding_window", fmt::format("only Mistral supports a sliding window, not {}",
                                                  architecture_name(c.architecture)));

  json j;
  j["architectures"] = json::array({architecture_name(c.architecture)});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (is_llama3(c.rope_scaling)) {
    const ops::RopeScaling& s = c.rope_scaling;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", double(s.factor)},
                         {"low_freq_factor", double(s.low_freq_factor)},
                         {"high_freq_factor", double(s.high_freq_factor)},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = c.initializer_range;
  j["torch_dtype"] = c.torch_dtype;
  j["use_cache"] = true;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else {
    j["eos_token_id"] = c.eos_token_ids;
  }
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  if (llama) {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = false;
  }
  if (mistral) j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  if (qwen2) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_hidden_layers;
  }
  return j;
}

// ---- presets -------------------------------------------------------------------------------------

namespace {

ModelConfig shape(Architecture arch, int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads,
                  int64_t kv_heads, int64_t max_pos, double theta, double eps, const char* dtype) {
  ModelConfig c;
  c.architecture = arch;
  c.model_type = architecture_model_type(arch);
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = max_pos;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  c.torch_dtype = dtype;
  return c;
}

ops::RopeScaling llama3_scaling(float factor) {
  ops::RopeScaling s;
  s.kind = ops::RopeScaling::Kind::Llama3;
  s.factor = factor;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position_embeddings = 8192;
  return s;
}

// Values of the published config.json files (the base, not the instruct, models).
ModelConfig llama2(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads) {
  ModelConfig c = shape(Architecture::Llama, 32000, hidden, inter, layers, heads, kv_heads, 4096, 10000.0, 1e-5,
                        "float16");
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

ModelConfig llama3(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t max_pos) {
  ModelConfig c = shape(Architecture::Llama, 128256, hidden, inter, layers, heads, 8, max_pos, 500000.0, 1e-5,
                        "bfloat16");
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001};
  return c;
}

struct Preset {
  const char* name;
  ModelConfig (*make)();
};

const Preset kPresets[] = {
    {"tiny",
     [] {
       // Small enough for unit tests and CPU demos, but with GQA (2 query heads per kv head)
       // and an intermediate size that is not a multiple of anything convenient.
       ModelConfig c = shape(Architecture::Llama, 512, 64, 172, 2, 4, 2, 256, 10000.0, 1e-5, "float32");
       c.bos_token_id = 1;
       c.eos_token_ids = {2};
       return c;
     }},
    {"llama2-7b", [] { return llama2(4096, 11008, 32, 32, 32); }},
    {"llama2-13b", [] { return llama2(5120, 13824, 40, 40, 40); }},
    {"llama2-70b", [] { return llama2(8192, 28672, 80, 64, 8); }},
    {"llama3-8b", [] { return llama3(4096, 14336, 32, 32, 8192); }},
    {"llama3-70b", [] { return llama3(8192, 28672, 80, 64, 8192); }},
    {"llama3.1-8b",
     [] {
       ModelConfig c = llama3(4096, 14336, 32, 32, 131072);
       c.rope_scaling = llama3_scaling(8.0f);
       return c;
     }},
    {"llama3.1-70b",
     [] {
       ModelConfig c = llama3(8192, 28672, 80, 64, 131072);
       c.rope_scaling = llama3_scaling(8.0f);
       return c;
     }},
    {"llama3.2-1b",
     [] {
       ModelConfig c = llama3(2048, 8192, 16, 32, 131072);
       c.head_dim = 64;
       c.tie_word_embeddings = true;
       c.rope_scaling = llama3_scaling(32.0f);
       return c;
     }},
    {"llama3.2-3b",
     [] {
       ModelConfig c = llama3(3072, 8192, 28, 24, 131072);
       c.head_dim = 128;
       c.tie_word_embeddings = true;
       c.rope_scaling = llama3_scaling(32.0f);
       return c;
     }},
    {"mistral-7b",
     [] {
       // Mistral-7B-v0.1; later versions drop the sliding window and raise theta.
       ModelConfig c =
           shape(Architecture::Mistral, 32000, 4096, 14336, 32, 32, 8, 32768, 10000.0, 1e-5, "bfloat16");
       c.sliding_window = 4096;
       c.bos_token_id = 1;
       c.eos_token_ids = {2};
       return c;
     }},
    {"qwen2-0.5b",
     [] {
       ModelConfig c =
           shape(Architecture::Qwen2, 151936, 896, 4864, 24, 14, 2, 131072, 1000000.0, 1e-6, "bfloat16");
       c.tie_word_embeddings = true;
       c.qkv_bias = true;
       c.bos_token_id = 151643;
       c.eos_token_ids = {151643};
       return c;
     }},
};

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

ModelConfig preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p.make();
  throw Error(fmt::format("unknown model preset '{}'; available: {}", name, fmt::join(preset_names(), ", ")));
}

}  // namespace shardlm
