#include "train/deepspeed_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <optional>

#include "shard/sharding.h"

namespace shardlm::train {

namespace {

constexpr double kDefaultLr = 3e-4;  // TrainConfig's optimizer.lr default, for ratios under "auto"

std::optional<double> as_number(const std::string& s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Two spellings of one value: numbers by value (1 and 1.0), strategies by what they name
// (3 and FULL_SHARD), anything else by its text.
bool same_value(const std::string& key, const std::string& a, const std::string& b) {
  if (key == "sharding_strategy") {
    try {
      return shard::parse_strategy(a) == shard::parse_strategy(b);
    } catch (const Error&) {
      return a == b;
    }
  }
  const std::optional<double> x = as_number(a), y = as_number(b);
  if (x && y) return *x == *y;
  if ((a == "true" || a == "True") && (b == "true" || b == "True")) return true;
  if ((a == "false" || a == "False") && (b == "false" || b == "False")) return true;
  return a == b;
}

std::string number_text(double v) { return fmt::format("{}", v); }

// One DeepSpeed source: a JSON file (prefix "") or accelerate's section of the run's YAML
// (prefix "deepspeed_config.").
class Translator {
 public:
  Translator(ConfigTree& run, ConfigTree ds, std::string prefix, DeepSpeedSettings& out)
      : run_(run), ds_(std::move(ds)), prefix_(std::move(prefix)), out_(out) {}

  std::string k(const std::string& key) const { return prefix_ + key; }
  bool has(const std::string& key) const { return ds_.has(k(key)); }
  // The value's text, or nullopt when absent, null or "auto".
  std::optional<std::string> value(const std::string& key) const {
    const std::optional<std::string> v = ds_.get_optional<std::string>(k(key));
    if (!v || *v == "auto") return std::nullopt;
    return v;
  }
  // "auto" is the same as absent for values, but not for DeepSpeed's defaults: "auto" keeps
  // shardlm's value, absent takes DeepSpeed's default.
  bool is_auto(const std::string& key) const {
    try {
      return ds_.get_optional<std::string>(k(key)) == "auto";
    } catch (const Error&) {  // a list or a map: not "auto"
      return false;
    }
  }
  std::optional<double> number(const std::string& key) const {
    const std::optional<std::string> v = value(key);
    if (!v) return std::nullopt;
    if (std::optional<double> x = as_number(*v)) return x;
    throw error(key, fmt::format("expected a number or \"auto\", got '{}'", *v));
  }
  std::optional<bool> boolean(const std::string& key) const {
    const std::optional<std::string> v = value(key);
    if (!v) return std::nullopt;
    if (*v == "true" || *v == "True") return true;
    if (*v == "false" || *v == "False") return false;
    throw error(key, fmt::format("expected true, false or \"auto\", got '{}'", *v));
  }
  Error error(const std::string& key, std::string message) const { return ds_.error_at(k(key), std::move(message)); }

  // Refused: a section that changes what is computed, unless it says enabled: false.
  void refuse_section(const std::string& key, const std::string& why) {
    if (!has(key)) return;
    try {
      if (ds_.get_optional<bool>(k(key + ".enabled")) == false) {
        ds_.mark_read(k(key));
        return;
      }
    } catch (const Error&) {  // not a map: refused below
    }
    throw error(key, why + "; shardlm does not implement it (remove it, or set \"enabled\": false)");
  }

  // The shardlm key `to` takes `text` as if written at DeepSpeed's `from`. The YAML's own value
  // (or one an earlier DeepSpeed key set) must agree; the command line wins over both files.
  void set(const std::string& to, const std::string& text, const std::string& from, const std::string& shown) {
    if (run_.has(to)) {
      if (run_.source_of(to) == "command line") return;
      std::string existing;
      try {
        existing = *run_.get_optional<std::string>(to);
      } catch (const Error&) {  // a list (betas): compare the numbers
        const std::vector<double> v = *run_.get_optional<std::vector<double>>(to);
        if (v == ConfigTree::parse("v: " + text).get<std::vector<double>>("v", {})) return;
        existing = fmt::format("[{}]", fmt::join(v, ", "));
      }
      if (same_value(to, existing, text)) return;
      throw error(from, fmt::format("{} ({}: {}) disagrees with {}: {} at {}; set one of them", shown, to, text, to,
                                    existing, run_.source_of(to)));
    }
    run_.set_from(to, text, ds_, k(from));
  }
  // A DeepSpeed default: set unless the YAML (or an earlier DeepSpeed key) sets `to`.
  void set_default(const std::string& to, const std::string& text, const std::string& from) {
    if (!run_.has(to)) run_.set_from(to, text, ds_, k(from));
  }
  // The value of the shardlm key, as set so far (YAML, command line or DeepSpeed), or `otherwise`.
  double run_number(const std::string& key, double otherwise) const { return run_.get<double>(key, otherwise); }
  ConfigTree& run() { return run_; }
  ConfigTree& ds() { return ds_; }

  // The DeepSpeed keys nobody read: listed in one warning, and then counted as read.
  void warn_unread(const std::string& section, const std::string& what) {
    ConfigTree s = prefix_.empty() ? ds_ : ds_.section(section);
    const std::vector<std::string> unread = s.unread_keys();
    if (unread.empty()) return;
    for (const std::string& key : unread) ds_.mark_read(key);
    out_.warnings.push_back(fmt::format("{}: {} with no effect in shardlm, ignored: {}", what,
                                        unread.size() == 1 ? "a DeepSpeed key" : "DeepSpeed keys",
                                        fmt::join(unread, ", ")));
  }

 private:
  ConfigTree& run_;
  ConfigTree ds_;
  std::string prefix_;
  DeepSpeedSettings& out_;
};

// ---- the pieces of a DeepSpeed JSON ------------------------------------------------------------

void zero_stage(Translator& x, const std::string& key) {
  const std::optional<std::string> s = x.value(key);
  if (!s) return;
  static const char* const names[] = {"NO_SHARD", "ZERO1", "SHARD_GRAD_OP", "FULL_SHARD"};
  const std::optional<double> n = as_number(*s);
  if (!n || *n != std::floor(*n) || *n < 0 || *n > 3)
    throw x.error(key, fmt::format("expected 0, 1, 2, 3 or \"auto\", got '{}'", *s));
  x.set("sharding_strategy", names[int(*n)], key, fmt::format("stage {}", *s));
}

// offload_optimizer / offload_param: shardlm's offload keeps the f32 master shard, the gradient
// shard and AdamW's state in host memory together, so either device "cpu" turns it on.
void offload(Translator& x, const std::string& key) {
  const std::optional<std::string> d = x.value(key);
  if (!d) return;
  if (*d == "cpu") x.set("offload_params", "true", key, "device cpu");
  else if (*d == "nvme") throw x.error(key, "NVMe offload (ZeRO-Infinity) is not supported; use \"cpu\" or \"none\"");
  else if (*d != "none") throw x.error(key, fmt::format("expected cpu, none or nvme, got '{}'", *d));
}

// bf16 / communication_data_type against the YAML's compute_dtype and mixed_precision.
void precision(Translator& x) {
  std::optional<bool> bf16;
  std::string bf16_key;
  for (const char* key : {"bf16.enabled", "bfloat16.enabled"})  // bfloat16: DeepSpeed's older name
    if (std::optional<bool> v = x.boolean(key)) {
      bf16 = v;
      bf16_key = key;
    }
  if (x.boolean("fp16.enabled") == true)
    throw x.error("fp16.enabled", "fp16 training (f16 compute with loss scaling) is not supported; use \"bf16\": "
                                  "{\"enabled\": true}");
  if (x.boolean("amp.enabled") == true) throw x.error("amp.enabled", "NVIDIA Apex AMP is not supported; use bf16");
  std::optional<std::string> comm;
  if (std::optional<std::string> v = x.value("communication_data_type")) {
    if (*v == "fp32" || *v == "float32") comm = "f32";
    else if (*v == "bf16" || *v == "bfloat16") comm = "bf16";
    else if (*v == "fp16" || *v == "float16")
      throw x.error("communication_data_type", "f16 gradient communication is not supported; use fp32 or bf16");
    else throw x.error("communication_data_type", fmt::format("expected fp32 or bf16, got '{}'", *v));
  }
  if (!bf16 && !comm) return;
  const std::optional<std::string> param = bf16 ? std::optional<std::string>(*bf16 ? "bf16" : "f32") : std::nullopt;
  // DeepSpeed communicates gradients in the model's dtype unless communication_data_type says.
  const std::optional<std::string> reduce = comm ? comm : param;

  ConfigTree& t = x.run();
  const auto dtype_of = [](std::string s) { return s == "no" || s == "fp32" ? std::string("f32") : s; };
  // The YAML's explicit choices: compute_dtype, accelerate's mixed_precision string, or the map.
  std::optional<std::pair<std::string, std::string>> yaml_param, yaml_reduce;  // (dtype, key)
  bool map_form = false;
  if (t.has("mixed_precision")) {
    std::vector<std::string> sub;
    try {
      sub = t.keys("mixed_precision");
    } catch (const Error&) {
    }
    map_form = !sub.empty();
    if (!map_form) {
      const std::string mp = dtype_of(*t.get_optional<std::string>("mixed_precision"));
      yaml_param = yaml_reduce = std::pair(mp, std::string("mixed_precision"));
    } else {
      if (t.has("mixed_precision.param_dtype"))
        yaml_param = std::pair(*t.get_optional<std::string>("mixed_precision.param_dtype"), "mixed_precision.param_dtype");
      if (t.has("mixed_precision.reduce_dtype"))
        yaml_reduce =
            std::pair(*t.get_optional<std::string>("mixed_precision.reduce_dtype"), "mixed_precision.reduce_dtype");
    }
  }
  if (!yaml_param && t.has("compute_dtype"))
    yaml_param = std::pair(*t.get_optional<std::string>("compute_dtype"), std::string("compute_dtype"));
  const auto check = [&](const std::optional<std::string>& ds, const std::string& ds_key,
                         const std::optional<std::pair<std::string, std::string>>& yaml) {
    if (!ds || !yaml || dtype_of(yaml->first) == *ds || t.source_of(yaml->second) == "command line") return;
    throw x.error(ds_key, fmt::format("asks for {} but {} is {} at {}; set one of them", *ds, yaml->second,
                                      yaml->first, t.source_of(yaml->second)));
  };
  check(param, bf16_key, yaml_param);
  // bf16 implies bf16 communication only where the YAML does not choose it.
  if (comm) check(comm, "communication_data_type", yaml_reduce);
  // The command line overrides both files.
  const bool yaml_param_wins = yaml_param && t.source_of(yaml_param->second) == "command line";
  if (t.has("mixed_precision") && !map_form) return;  // accelerate's string says both, and agrees
  // Both halves of the map, so that the map never falls back to f32 beside a bf16 compute_dtype.
  const std::string from = bf16 ? bf16_key : "communication_data_type";
  if (!yaml_param || yaml_param->second != "mixed_precision.param_dtype")
    x.run().set_from("mixed_precision.param_dtype",
                     param && !yaml_param_wins ? *param : yaml_param ? yaml_param->first : "f32", x.ds(), x.k(from));
  if (!yaml_reduce && reduce)
    x.run().set_from("mixed_precision.reduce_dtype", *reduce, x.ds(), x.k(comm ? "communication_data_type" : from));
}

void optimizer(Translator& x) {
  if (!x.has("optimizer")) return;
  const std::optional<std::string> type = x.value("optimizer.type");
  if (!type) throw x.error("optimizer.type", "missing: shardlm's optimizer is AdamW (\"type\": \"AdamW\")");
  std::string lower = *type;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (lower != "adamw" && lower != "adam")
    throw x.error("optimizer.type", fmt::format("'{}' is not supported: shardlm's optimizer is AdamW (\"AdamW\", or "
                                                "\"Adam\" in DeepSpeed's default adam_w_mode)",
                                                *type));
  // DeepSpeed's "Adam" decouples weight decay (AdamW) unless adam_w_mode is false.
  if (lower == "adam" && x.boolean("optimizer.params.adam_w_mode") == false)
    throw x.error("optimizer.params.adam_w_mode", "false (Adam with L2 regularization) is not supported; shardlm's "
                                                  "AdamW decouples weight decay");
  if (x.boolean("optimizer.params.amsgrad") == true)
    throw x.error("optimizer.params.amsgrad", "AMSGrad is not supported");
  if (x.boolean("optimizer.params.bias_correction") == false)
    throw x.error("optimizer.params.bias_correction", "AdamW without bias correction is not supported");
  (void)x.ds().get_optional<std::string>(x.k("optimizer.params.torch_adam"));  // an implementation choice
  for (const char* p : {"lr", "eps", "weight_decay"})
    if (std::optional<double> v = x.number(fmt::format("optimizer.params.{}", p)))
      x.set(fmt::format("optimizer.{}", p), number_text(*v), fmt::format("optimizer.params.{}", p), number_text(*v));
  if (x.has("optimizer.params.betas") && !x.is_auto("optimizer.params.betas")) {
    const std::vector<double> b = *x.ds().get_optional<std::vector<double>>(x.k("optimizer.params.betas"));
    const std::string text = fmt::format("[{}]", fmt::join(b, ", "));
    x.set("optimizer.betas", text, "optimizer.params.betas", text);
  }
}

// WarmupLR, WarmupDecayLR and WarmupCosineLR (deepspeed/runtime/lr_schedules.py), as LrSchedule.
void scheduler(Translator& x) {
  if (!x.has("scheduler")) return;
  const std::optional<std::string> type = x.value("scheduler.type");
  if (!type) throw x.error("scheduler.type", "missing: expected WarmupLR, WarmupDecayLR or WarmupCosineLR");
  const bool warmup_lr = *type == "WarmupLR", decay = *type == "WarmupDecayLR", cosine = *type == "WarmupCosineLR";
  if (!warmup_lr && !decay && !cosine)
    throw x.error("scheduler.type", fmt::format("'{}' is not supported (shardlm runs WarmupLR, WarmupDecayLR and "
                                                "WarmupCosineLR)",
                                                *type));
  const std::string p = "scheduler.params.";
  const std::string type_key = "scheduler.type";
  x.set("lr_scheduler.type", warmup_lr ? "constant" : decay ? "linear" : "deepspeed_cosine", type_key, *type);

  // warmup_num_steps (default 1000); DeepSpeed raises it to at least 2 (its log ramp divides by
  // ln of it).
  if (std::optional<double> n = x.number(p + "warmup_num_steps")) {
    const std::string steps = number_text(std::max(2.0, *n));
    x.set("lr_scheduler.warmup_steps", steps, p + "warmup_num_steps", steps);
  } else if (!x.is_auto(p + "warmup_num_steps")) {
    x.set_default("lr_scheduler.warmup_steps", "1000", type_key);
  }
  if (std::optional<std::string> w = x.value(p + "warmup_type")) {
    if (*w != "log" && *w != "linear")
      throw x.error(p + "warmup_type", fmt::format("expected log or linear, got '{}'", *w));
    x.set("lr_scheduler.warmup_type", *w, p + "warmup_type", *w);
  } else if (!x.is_auto(p + "warmup_type")) {
    x.set_default("lr_scheduler.warmup_type", "log", type_key);
  }
  if (decay || cosine) {
    if (std::optional<double> n = x.number(p + "total_num_steps"))
      x.set("lr_scheduler.total_steps", number_text(*n), p + "total_num_steps", number_text(*n));
    else if (!x.is_auto(p + "total_num_steps"))
      throw x.error(p + "total_num_steps", fmt::format("{} needs total_num_steps (or \"auto\": max_steps)", *type));
  }
  if (cosine) {
    // Ratios of the optimizer's lr.
    if (std::optional<double> r = x.number(p + "warmup_min_ratio"))
      x.set("lr_scheduler.warmup_min_ratio", number_text(*r), p + "warmup_min_ratio", number_text(*r));
    if (std::optional<double> r = x.number(p + "cos_min_ratio"))
      x.set("lr_scheduler.min_lr_ratio", number_text(*r), p + "cos_min_ratio", number_text(*r));
    else if (!x.is_auto(p + "cos_min_ratio"))
      x.set_default("lr_scheduler.min_lr_ratio", "0.0001", type_key);
    return;
  }
  // WarmupLR / WarmupDecayLR: absolute rates. warmup_max_lr is the peak (it replaces the
  // optimizer's lr in DeepSpeed); warmup_min_lr is where the ramp starts and the decay ends.
  if (std::optional<double> v = x.number(p + "warmup_max_lr")) {
    if (*v <= 0) throw x.error(p + "warmup_max_lr", "must be positive");
    x.set("optimizer.lr", number_text(*v), p + "warmup_max_lr", number_text(*v));
  } else if (!x.is_auto(p + "warmup_max_lr")) {
    x.set_default("optimizer.lr", "0.001", type_key);
  }
  if (std::optional<double> v = x.number(p + "warmup_min_lr")) {
    const double peak = x.run_number("optimizer.lr", kDefaultLr);
    const std::string ratio = number_text(*v / peak);
    x.set("lr_scheduler.warmup_min_ratio", ratio, p + "warmup_min_lr", number_text(*v));
    if (decay) x.set("lr_scheduler.min_lr_ratio", ratio, p + "warmup_min_lr", number_text(*v));
  }
  // WarmupDecayLR without warmup_min_lr decays to 0 (DeepSpeed's default), whatever the default
  // floor of shardlm's linear schedule is: it is 0 too.
}

// What changes results and shardlm lacks: refused by name.
void refusals(Translator& x) {
  x.refuse_section("sparse_attention", "DeepSpeed's sparse attention changes what the model computes");
  x.refuse_section("pipeline", "pipeline parallelism is not supported (shardlm shards data-parallel ranks)");
  x.refuse_section("moe", "mixture of experts is not supported (shardlm trains dense Llama-family models)");
  x.refuse_section("compression_training", "compression training changes the model");
  x.refuse_section("quantize_training", "quantization-aware training changes the model");
  x.refuse_section("curriculum_learning", "curriculum learning changes the data order and lengths");
  x.refuse_section("data_efficiency", "data efficiency (curriculum, random LTD) changes the data and the model");
  x.refuse_section("progressive_layer_drop", "progressive layer drop changes what the model computes");
  x.refuse_section("eigenvalue", "eigenvalue-based adaptive training changes the updates");
  x.refuse_section("elasticity", "elastic batch sizes change the global batch");
  for (const char* q : {"zero_optimization.zero_quantized_weights", "zero_optimization.zero_quantized_gradients",
                        "zero_optimization.zero_quantized_nontrainable_weights"})
    if (x.boolean(q) == true) throw x.error(q, "ZeRO++ quantized communication changes the numbers; not supported");
  if (std::optional<std::string> d = x.value("data_types.grad_accum_dtype"); d && *d != "fp32" && *d != "float32")
    throw x.error("data_types.grad_accum_dtype", "shardlm accumulates gradients in f32; only \"fp32\" is accepted");
  if (std::optional<double> sp = x.number("sequence_parallel_size"); sp && *sp > 1)
    throw x.error("sequence_parallel_size", "sequence parallelism is not supported");
}

// A DeepSpeed JSON's keys, read from `x`'s tree.
void translate_json(Translator& x, DeepSpeedSettings& out) {
  refusals(x);
  zero_stage(x, "zero_optimization.stage");
  offload(x, "zero_optimization.offload_optimizer.device");
  offload(x, "zero_optimization.offload_param.device");
  if (x.boolean("zero_optimization.cpu_offload") == true)  // DeepSpeed's older switch
    x.set("offload_params", "true", "zero_optimization.cpu_offload", "true");
  precision(x);
  if (std::optional<double> v = x.number("train_micro_batch_size_per_gpu"))
    x.set("micro_batch_size", number_text(*v), "train_micro_batch_size_per_gpu", number_text(*v));
  if (std::optional<double> v = x.number("gradient_accumulation_steps"))
    x.set("gradient_accumulation_steps", number_text(*v), "gradient_accumulation_steps", number_text(*v));
  if (std::optional<double> v = x.number("gradient_clipping"))
    x.set("max_grad_norm", number_text(*v), "gradient_clipping", number_text(*v));
  else if (!x.is_auto("gradient_clipping"))
    // DeepSpeed does not clip unless told to (its default is 0), and clipping changes the results:
    // a JSON without the key runs unclipped unless the YAML sets max_grad_norm. (An absent
    // zero_optimization.stage, DeepSpeed's 0, keeps shardlm's strategy instead: every strategy
    // trains the same losses, so only memory would differ.)
    x.set_default("max_grad_norm", "0", "");
  if (std::optional<double> v = x.number("train_batch_size")) {
    // Bounded before the conversion: a double beyond int64_t's range has no integer value to take.
    if (*v < 1 || *v != std::floor(*v) || *v > 1e15)
      throw x.error("train_batch_size", "must be a positive integer (at most 1e15)");
    out.train_batch_size = int64_t(*v);
    out.train_batch_size_at = x.error("train_batch_size", "").context();
  }
  optimizer(x);
  scheduler(x);
}

void translate_section(ConfigTree& t, DeepSpeedSettings& out);

ConfigTree load_json(const ConfigTree& t, const std::string& key, const std::string& path) {
  try {
    return ConfigTree::load(path);
  } catch (const Error& e) {
    if (e.context().file == path && e.context().line < 0)  // cannot open: say which key named it
      throw t.error_at(key, fmt::format("cannot read the DeepSpeed config '{}'", path));
    throw;
  }
}

}  // namespace

DeepSpeedSettings apply_deepspeed_config(ConfigTree& t) {
  DeepSpeedSettings out;
  if (!t.has("deepspeed_config")) return out;
  out.present = true;
  std::vector<std::string> section;
  try {
    section = t.keys("deepspeed_config");
  } catch (const Error&) {  // a scalar: the JSON file's path
  }
  if (section.empty()) {
    const std::string path = t.require<std::string>("deepspeed_config");
    Translator x(t, load_json(t, "deepspeed_config", path), "", out);
    translate_json(x, out);
    x.warn_unread("", path);
  } else {
    translate_section(t, out);
  }
  out.micro_batch_set = t.has("micro_batch_size");
  out.accumulation_set = t.has("gradient_accumulation_steps");
  return out;
}

namespace {

// accelerate's section: its own names, or a JSON file beside launch settings.
void translate_section(ConfigTree& t, DeepSpeedSettings& out) {
  Translator x(t, t, "deepspeed_config.", out);
  for (const char* launch : {"deepspeed_multinode_launcher", "deepspeed_hostfile", "deepspeed_exclusion_filter",
                             "deepspeed_inclusion_filter", "zero3_init_flag", "zero3_save_16bit_model"})
    (void)t.get_optional<std::string>(x.k(launch));  // launch and save settings: accepted and ignored
  if (t.has("deepspeed_config.deepspeed_moe_layer_cls_names"))
    throw t.error_at("deepspeed_config.deepspeed_moe_layer_cls_names",
                     "mixture of experts is not supported (shardlm trains dense Llama-family models)");
  if (std::optional<std::string> file = t.get_optional<std::string>("deepspeed_config.deepspeed_config_file")) {
    // As accelerate does: with a JSON file, the section's own training keys must not be set too.
    for (const char* own : {"zero_stage", "offload_optimizer_device", "offload_param_device",
                            "gradient_accumulation_steps", "gradient_clipping"})
      if (t.has(x.k(own)))
        throw t.error_at(x.k(own), fmt::format("set in deepspeed_config_file ({}) instead: accelerate ignores this "
                                               "key beside the file",
                                               *file));
    Translator j(t, load_json(t, "deepspeed_config.deepspeed_config_file", *file), "", out);
    translate_json(j, out);
    j.warn_unread("", *file);
  } else {
    zero_stage(x, "zero_stage");
    offload(x, "offload_optimizer_device");
    offload(x, "offload_param_device");
    if (std::optional<double> v = x.number("gradient_accumulation_steps"))
      x.set("gradient_accumulation_steps", number_text(*v), "gradient_accumulation_steps", number_text(*v));
    if (std::optional<double> v = x.number("gradient_clipping"))
      x.set("max_grad_norm", number_text(*v), "gradient_clipping", number_text(*v));
  }
  x.warn_unread("deepspeed_config", t.file() + ": deepspeed_config");
}

}  // namespace

}  // namespace shardlm::train
