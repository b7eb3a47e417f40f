#include "train/train_config.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "io/model_files.h"
#include "model/lora.h"
#include "train/sharding_config.h"

namespace shardlm::train {

namespace {

// Upper bounds of the counts that size a step, far past any real run's: 16M tokens per row, 1M
// rows per micro-batch or micro-batches per step, 2^40 steps; and at most 2^31 - 1 tokens in one
// micro-batch (its activations alone would pass any device's memory).
constexpr int64_t kMaxSeqLen = int64_t(1) << 24;
constexpr int64_t kMaxBatchCount = int64_t(1) << 20;
constexpr int64_t kMaxSteps = int64_t(1) << 40;
constexpr int64_t kMaxMicroBatchTokens = (int64_t(1) << 31) - 1;

// Dtypes a config may name for weights and compute.
DType float_dtype(const std::string& s) {
  const auto bad = [&] { return Error(fmt::format("expected f32, bf16 or f16, got '{}'", s)); };
  DType d;
  try {
    d = parse_dtype(s);
  } catch (const Error&) {
    throw bad();
  }
  if (d != DType::F32 && d != DType::BF16 && d != DType::F16) throw bad();
  return d;
}

// A size such as 5GB, checked as it is read and kept as written (the writer parses it again).
std::string size_text(const std::string& s) {
  (void)io::parse_size(s);
  return s;
}

// ---- the data: section ------------------------------------------------------------------------

std::vector<ConfigField<data::AlpacaColumns>> column_fields() {
  using F = ConfigFields<data::AlpacaColumns>;
  const auto names_a_field = [](const std::string& v) { return v.empty() ? std::string("must name a field") : ""; };
  return {
      F::field("instruction", &data::AlpacaColumns::instruction, "alpaca: the instruction's field", names_a_field),
      F::field("input", &data::AlpacaColumns::input, "alpaca: the (optional) input's field", names_a_field),
      F::field("output", &data::AlpacaColumns::output, "alpaca: the answer's field", names_a_field),
  };
}

std::vector<ConfigField<DataConfig>> data_fields() {
  using F = ConfigFields<DataConfig>;
  std::vector<ConfigField<DataConfig>> table = {
      // `data.format` was this key's name before instruction data existed.
      F::field("type", &DataConfig::type, "auto, text, tokens, alpaca, chat or builtin:addition").alias("format"),
      F::custom(
          "train",
          [](const ConfigTree& t, const std::string& k, DataConfig& d) {
            // Required, except for the built-in task, which needs no file.
            d.train = d.type == DataType::BuiltinAddition ? t.get(k, "builtin:addition") : t.require<std::string>(k);
          },
          "the training file (required unless type is builtin:addition)"),
      F::field("token_bytes", &DataConfig::token_bytes, "tokens: bytes per id",
               [](int v) { return v == 2 || v == 4 ? std::string() : "must be 2 or 4"; }),
      F::field("eval", &DataConfig::eval, "a separate held-out file"),
      F::field("eval_fraction", &DataConfig::eval_fraction, "else the fraction of data.train held out",
               [](double v) { return v >= 0 && v < 1 ? std::string() : "must be in [0, 1)"; }),
  };
  for (ConfigField<DataConfig>& f : nested("columns", &DataConfig::columns, column_fields()))
    table.push_back(std::move(f));
  for (ConfigField<DataConfig> f : {
           F::field("train_on_input", &DataConfig::train_on_input, "alpaca/chat: keep the prompt in the loss"),
           F::field("chat_format", &DataConfig::chat_format, "chat: auto, llama3, llama2, chatml or mistral"),
           F::field("packing", &DataConfig::packing, "pack several examples per row"),
           F::field("on_bad_row", &DataConfig::on_bad_row, "alpaca/chat: fail or skip on a bad record"),
           F::field("digits", &DataConfig::digits, "builtin:addition: operand digits"),
           F::field("train_examples", &DataConfig::train_examples, "builtin:addition: training problems", positive),
           F::field("eval_examples", &DataConfig::eval_examples, "builtin:addition: held-out problems", positive),
       })
    table.push_back(std::move(f));
  return table;
}

// Whether `data:` is written as a list: a mixture of sources (docs/data.md "Mixtures").
bool data_is_list(const ConfigTree& t) {
  if (!t.has("data")) return false;
  try {
    (void)t.keys("data");  // a map: one source
    return false;
  } catch (const Error&) {
  }
  try {
    (void)t.get_optional<std::string>("data");  // a scalar: an error for the map's readers to report
    return false;
  } catch (const Error&) {
    return true;
  }
}

// A mixture's source: a data section of its own, with its share of an epoch.
std::vector<ConfigField<data::DataSource>> source_fields() {
  using F = ConfigFields<data::DataSource>;
  std::vector<ConfigField<data::DataSource>> table = nested("", &data::DataSource::data, data_fields());
  table.push_back(F::field("weight", &data::DataSource::weight, "the source's share of an epoch (relative)", positive));
  table.push_back(F::field("epochs", &data::DataSource::epochs, "passes over the source per epoch", positive));
  return table;
}

// `data:` as a map (one source, read by the nested fields) or a list (a mixture, read here).
std::vector<ConfigField<TrainConfig>> data_section_fields() {
  std::vector<ConfigField<TrainConfig>> table = {ConfigFields<TrainConfig>::custom(
      "data",
      [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
        if (!data_is_list(t)) return;
        const std::vector<ConfigTree> items = t.sections(k);
        if (items.empty()) throw t.error_at(k, "an empty list of data sources");
        bool weighted = false;
        for (size_t i = 0; i < items.size(); ++i) {
          ConfigTree item = items[i];
          data::DataSource src;
          read_fields(source_fields(), item, src);
          if (src.weight > 0 && src.epochs > 0)
            throw item.error_at("epochs", "set weight or epochs, not both");
          if (i > 0 && (src.weight > 0) != weighted)
            throw item.error_at(src.weight > 0 ? "weight" : "train",
                                "either every source has a weight or none does (the others: epochs, default 1)");
          weighted = src.weight > 0;
          c.data.mixture.push_back(std::move(src));
        }
      },
      "one source (a map of the keys below) or a mixture: a list of them, each with weight or epochs")};
  // The one-source keys, skipped when `data` is a list (its items have them instead; an alias
  // into a list is no alias, ConfigTree::alias).
  for (ConfigField<TrainConfig> f : nested("data", &TrainConfig::data, data_fields())) {
    f.read = [read = f.read](const ConfigTree& t, const std::string& k, TrainConfig& c) {
      if (!data_is_list(t)) read(t, k, c);
    };
    table.push_back(std::move(f));
  }
  return table;
}

// ---- optimizer: and lr_scheduler: -------------------------------------------------------------

std::vector<ConfigField<ops::AdamWConfig>> optimizer_fields() {
  using F = ConfigFields<ops::AdamWConfig>;
  using AdamW = ops::AdamWConfig;
  return {
      F::field("lr", &AdamW::lr, "peak learning rate", positive),
      F::setter<std::vector<double>>(
          "betas",
          [](AdamW& o, const std::vector<double>& b) {
            o.beta1 = b[0];
            o.beta2 = b[1];
          },
          "AdamW's beta1, beta2",
          [](const std::vector<double>& b) {
            return b.size() == 2 && b[0] >= 0 && b[0] < 1 && b[1] >= 0 && b[1] < 1
                       ? std::string()
                       : "expected two values in [0, 1), e.g. [0.9, 0.95]";
          }),
      F::field("eps", &AdamW::eps, "AdamW's epsilon", positive),
      F::field("weight_decay", &AdamW::weight_decay, "decoupled weight decay (not on norms and biases)",
               non_negative("must be >= 0")),
  };
}

std::vector<ConfigField<LrSchedule>> schedule_fields() {
  using F = ConfigFields<LrSchedule>;
  return {
      F::parsed("type", &LrSchedule::kind, parse_schedule_kind, "constant, linear, cosine or deepspeed_cosine"),
      F::field("warmup_steps", &LrSchedule::warmup_steps, "warmup steps", non_negative("must be >= 0")),
      F::field("warmup_type", &LrSchedule::warmup, "the warmup ramp: linear or log (DeepSpeed's)"),
      F::field("warmup_min_ratio", &LrSchedule::warmup_min_ratio, "the warmup starts at this fraction of lr",
               [](double v) { return v >= 0 && v <= 1 ? std::string() : "must be in [0, 1]"; }),
      F::field("total_steps", &LrSchedule::total_steps, "where the decay ends (default: max_steps)", positive),
      F::field("min_lr_ratio", &LrSchedule::min_lr_ratio, "the floor, as a fraction of lr",
               [](double v) { return v >= 0 && v <= 1 ? std::string() : "must be in [0, 1]"; }),
  };
}

// ---- the dpo: section --------------------------------------------------------------------------

std::vector<ConfigField<TrainConfig>> dpo_fields() {
  using F = ConfigFields<DpoConfig>;
  std::vector<ConfigField<TrainConfig>> table = {ConfigFields<TrainConfig>::custom(
      "dpo",
      [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
        (void)t.section(k);  // `dpo: true` is an error: expected a map
        try {  // as lora: below, `dpo:` and `dpo: {}` are marked known by reading the section as a value
          (void)t.get_optional<std::string>(k);
        } catch (const Error&) {
        }
        c.preference = t.has(k);
      },
      "the section: present (even `dpo: {}`) makes the run DPO on preference data")};
  for (ConfigField<TrainConfig>& f :
       nested("dpo", &TrainConfig::dpo,
              std::vector<ConfigField<DpoConfig>>{
                  F::field("beta", &DpoConfig::beta, "the KL penalty's weight (TRL's beta)", positive),
                  F::field("loss_type", &DpoConfig::loss_type, "sigmoid (DPO), ipo or hinge"),
                  F::field("label_smoothing", &DpoConfig::label_smoothing,
                           "sigmoid: the assumed probability that a pair's labels are flipped (cDPO)",
                           [](double v) { return v >= 0 && v < 0.5 ? std::string() : "must be in [0, 0.5)"; }),
                  F::field("reference_model", &DpoConfig::reference_model,
                           "full fine-tunes: the frozen reference's directory (default: model)"),
              }))
    table.push_back(std::move(f));
  return table;
}

// ---- the lora: section -------------------------------------------------------------------------
//
// PEFT's LoraConfig names (r, lora_alpha, lora_dropout, target_modules, use_rslora) and torchtune's
// LoRA model arguments (lora_rank, lora_attn_modules, apply_lora_to_mlp, quantize_base, ...) are
// both accepted inside `lora:`. The spec is created with its defaults by the first lora key read.

const std::vector<std::string> kDefaultLoraTargets = {"q_proj", "v_proj"};  // PEFT's default for Llama
const char* const kMlpModules[] = {"gate_proj", "up_proj", "down_proj"};   // torchtune's w1, w3, w2

model::LoraSpec& lora_spec(TrainConfig& c) {
  if (!c.lora) {
    c.lora.emplace();
    c.lora->target_modules = kDefaultLoraTargets;
  }
  return *c.lora;
}

// A module name or a list of them.
std::optional<std::vector<std::string>> module_list(const ConfigTree& t, const std::string& k) {
  detail::check_parent_section(t, k);
  if (!t.has(k)) return std::nullopt;
  try {
    return t.get_optional<std::vector<std::string>>(k);
  } catch (const Error&) {
  }
  try {
    return std::vector<std::string>{*t.get_optional<std::string>(k)};
  } catch (const Error&) {
    throw t.error_at(k, "expected a module name or a list of them, e.g. [q_proj, v_proj]");
  }
}

// PEFT's target_modules and torchtune's lora_attn_modules/apply_lora_to_mlp say the same thing.
void refuse_both_target_forms(const ConfigTree& t, const std::string& k) {
  if (t.has("lora.target_modules"))
    throw t.error_at(k, fmt::format("lora.target_modules is also set ({}); name the adapted modules one way: "
                                    "target_modules (PEFT's) or lora_attn_modules/apply_lora_to_mlp (torchtune's)",
                                    t.source_of("lora.target_modules")));
}

std::vector<ConfigField<TrainConfig>> lora_fields() {
  using F = ConfigFields<TrainConfig>;
  return {
      F::custom(
          "lora",
          [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
            (void)t.section(k);  // `lora: true` is an error: expected a map
            // `lora:` (null: no LoRA) and `lora: {}` (every default) hold no key that reading would
            // mark as known: reading the section itself as a value marks it (a map then fails, as
            // it is no string).
            try {
              (void)t.get_optional<std::string>(k);
            } catch (const Error&) {
            }
            if (t.has(k)) lora_spec(c);
          },
          "the section: present (even `lora: {}`) turns LoRA on"),
      F::setter<int64_t>(
           "lora.rank", [](TrainConfig& c, int64_t v) { lora_spec(c).rank = v; }, "the adapters' rank (PEFT's r)")
          .alias("lora.r")
          .alias("lora.lora_rank"),
      F::setter<double>(
           "lora.alpha", [](TrainConfig& c, double v) { lora_spec(c).alpha = v; }, "scale = alpha / rank")
          .alias("lora.lora_alpha"),
      F::setter<double>(
           "lora.dropout", [](TrainConfig& c, double v) { lora_spec(c).dropout = v; },
           "dropout on the adapters' input, training only")
          .alias("lora.lora_dropout"),
      F::custom(
          "lora.target_modules",
          [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
            std::optional<std::vector<std::string>> v = module_list(t, k);
            if (!v) return;
            try {
              lora_spec(c).target_modules = model::expand_lora_targets(*v);
            } catch (const Error& e) {
              throw t.error_at(k, e.message());
            }
          },
          "PEFT's: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or all-linear"),
      F::custom(
          "lora.lora_attn_modules",
          [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
            std::optional<std::vector<std::string>> v = module_list(t, k);
            if (!v) return;
            refuse_both_target_forms(t, k);
            std::vector<std::string> modules;
            for (const std::string& m : *v) {
              if (m == "q_proj" || m == "k_proj" || m == "v_proj") modules.push_back(m);
              else if (m == "output_proj") modules.emplace_back("o_proj");
              else
                throw t.error_at(k, fmt::format("unknown attention module '{}' (torchtune's are q_proj k_proj v_proj "
                                                "output_proj; the MLP's: apply_lora_to_mlp: true)",
                                                m));
            }
            lora_spec(c).target_modules = std::move(modules);
          },
          "torchtune's: attention modules among q_proj k_proj v_proj output_proj"),
      F::custom(
          "lora.apply_lora_to_mlp",
          [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
            detail::check_parent_section(t, k);
            const std::optional<bool> v = t.get_optional<bool>(k);
            if (!v) return;
            refuse_both_target_forms(t, k);
            model::LoraSpec& s = lora_spec(c);
            if (*v) s.target_modules.insert(s.target_modules.end(), std::begin(kMlpModules), std::end(kMlpModules));
          },
          "torchtune's: true adapts gate_proj up_proj down_proj too"),
      F::custom(
          "lora.apply_lora_to_output",
          [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
            detail::check_parent_section(t, k);
            const std::optional<bool> v = t.get_optional<bool>(k);
            if (!v) return;
            if (*v) throw t.error_at(k, "adapting the output projection (lm_head) is not supported; set it to false");
            lora_spec(c);
          },
          "torchtune's: must be false (lm_head is not adapted)"),
      F::setter<bool>(
          "lora.use_rslora", [](TrainConfig& c, bool v) { lora_spec(c).use_rslora = v; },
          "rank-stabilized: scale = alpha / sqrt(rank)"),
      F::setter<bool>(
          "lora.use_dora", [](TrainConfig& c, bool v) { lora_spec(c).use_dora = v; },
          "DoRA (PEFT's use_dora): a trained magnitude per output feature of each adapted weight"),
      F::custom(
          "lora.init",
          [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
            detail::check_parent_section(t, k);
            const std::optional<std::string> v = t.get_optional<std::string>(k);
            if (!v) return;
            if (*v == "kaiming") lora_spec(c).init = model::LoraInit::Kaiming;
            else if (*v == "gaussian") lora_spec(c).init = model::LoraInit::Gaussian;
            else throw t.error_at(k, fmt::format("expected kaiming or gaussian, got '{}'", *v));
          },
          "A's initialization: kaiming or gaussian (B starts at zero)"),
      // nf4, or torchtune's boolean.
      F::custom(
           "lora.quantize_base",
           [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
             detail::check_parent_section(t, k);
             const std::optional<std::string> v = t.get_optional<std::string>(k);
             if (!v) return;
             const auto is = [&](std::initializer_list<const char*> names) {
               return std::find(names.begin(), names.end(), *v) != names.end();
             };
             if (is({"nf4", "NF4", "true", "True", "TRUE"})) c.lora_quantize_base = true;
             else if (is({"none", "None", "false", "False", "FALSE"})) c.lora_quantize_base = false;
             else
               throw t.error_at(
                   k, fmt::format("only nf4 is supported (or false/none for a base in compute_dtype), got '{}'", *v));
           },
           "nf4 (QLoRA: the frozen base in 4-bit NormalFloat) or none")
          .alias("lora.qlora"),
      F::field("lora.double_quant", &TrainConfig::lora_double_quant,
               "quantize_base: nf4: double quantization of the absmax values"),
      F::field("lora.merge_on_save", &TrainConfig::merge_on_save,
               "also write the merged model (W + scale B A) at the end"),
      F::custom(
          "merge_on_save",
          [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
            const std::optional<bool> v = t.get_optional<bool>(k);
            if (!v) return;
            if (t.has("lora.merge_on_save"))
              throw t.error_at(k, fmt::format("lora.merge_on_save is also set ({}); set only one",
                                              t.source_of("lora.merge_on_save")));
            c.merge_on_save = *v;
          },
          "the same as lora.merge_on_save"),
  };
}

// The lora rules once every key is read: the spec by model::validate_lora_spec, its errors placed
// at the key the file wrote.
void check_lora(const ConfigTree& t, TrainConfig& c) {
  if (!c.lora) {
    if (c.merge_on_save)
      throw t.error_at(t.has("merge_on_save") ? "merge_on_save" : "lora.merge_on_save",
                       "needs LoRA (a lora: section); a full fine-tune always writes the whole model");
    return;
  }
  model::LoraSpec& s = *c.lora;
  const bool torchtune_targets = t.has("lora.lora_attn_modules") || t.has("lora.apply_lora_to_mlp");
  if (torchtune_targets && s.target_modules.empty())
    throw t.error_at(t.has("lora.lora_attn_modules") ? "lora.lora_attn_modules" : "lora.apply_lora_to_mlp",
                     "no modules to adapt (lora_attn_modules is empty and apply_lora_to_mlp is not true)");
  try {
    model::validate_lora_spec(s);
  } catch (const Error& e) {
    const std::string& peft = e.context().key;
    const char* key = peft == "r"              ? "lora.rank"
                      : peft == "lora_alpha"   ? "lora.alpha"
                      : peft == "lora_dropout" ? "lora.dropout"
                      : torchtune_targets      ? "lora.lora_attn_modules"
                                               : "lora.target_modules";
    throw t.error_at(key, e.message());
  }
  s.target_modules = model::expand_lora_targets(s.target_modules);
  s.base_model_name_or_path = c.model;
}

// ---- the whole file -----------------------------------------------------------------------------

// device: cuda is checked as it is read, before any data or model is, so that a run asking for a
// GPU it cannot have stops at once with the key's line rather than after loading.
std::string usable_device(Device d) {
  if (d != Device::CUDA) return {};
  std::string why;
  if (!device::cuda_available(&why))
    return why == "built without CUDA" ? std::string("cuda asked for, but this shardlm was built without CUDA")
                                       : "cuda asked for, but " + why;
  if (!comm::nccl_built()) return "cuda asked for, but this shardlm was built without NCCL (GPU runs move tensors over NCCL)";
  return {};
}

// report_to: one name or a list of names (Hugging Face's report_to and accelerate's log_with take
// both). tensorboard is the one integration there is, so "all" means it; "none" alone turns it off.
// Any other name (wandb, mlflow, ...) is refused rather than silently not reported to.
void read_report_to(const ConfigTree& t, const std::string& k, TrainConfig& c) {
  if (!t.has(k)) return;
  std::vector<std::string> names;
  try {
    names.push_back(t.require<std::string>(k));
  } catch (const Error&) {
    try {
      names = t.require<std::vector<std::string>>(k);  // not a scalar: a list
    } catch (const Error&) {
      throw t.error_at(k, "expected tensorboard, none or all, or a list of them");
    }
  }
  bool tensorboard = false;
  for (const std::string& n : names) {
    if (n == "tensorboard" || n == "all") tensorboard = true;
    else if (n != "none")
      throw t.error_at(k, fmt::format("expected tensorboard, none or all (or a list of them), got '{}'{}", n,
                                      n == "wandb" || n == "mlflow" || n == "comet_ml" || n == "aim" || n == "clearml"
                                          ? " (shardlm writes TensorBoard event files and metrics.jsonl only)"
                                          : ""));
  }
  if (tensorboard && std::find(names.begin(), names.end(), "none") != names.end())
    throw t.error_at(k, "'none' cannot be listed with other reporters");
  c.report_tensorboard = tensorboard;
}

std::vector<ConfigField<TrainConfig>> make_table() {
  using F = ConfigFields<TrainConfig>;
  std::vector<ConfigField<TrainConfig>> table;
  const auto add = [&](std::vector<ConfigField<TrainConfig>> fields) {
    for (ConfigField<TrainConfig>& f : fields) table.push_back(std::move(f));
  };
  // The order is the reading order: the first bad value is the one reported, and an unknown key's
  // suggestion is the first of equally near known keys.
  add({
      F::required("model", &TrainConfig::model, "Hugging Face model directory to start from"),
      F::required("output_dir", &TrainConfig::output_dir, "where the trained model and metrics go"),
      // Read (translated into the keys below) by apply_deepspeed_config before this table.
      F::custom(
          "deepspeed_config", [](const ConfigTree&, const std::string&, TrainConfig&) {},
          "a DeepSpeed JSON file, or accelerate's deepspeed_config section (docs/deepspeed.md)"),
      F::field("seed", &TrainConfig::seed, "data order (and built-in task problems)"),
  });
  add(data_section_fields());
  add({
      F::field("seq_len", &TrainConfig::seq_len, "tokens per row", positive_at_most(kMaxSeqLen)),
      F::field("micro_batch_size", &TrainConfig::micro_batch_size, "rows per forward/backward",
               positive_at_most(kMaxBatchCount)),
      F::field("gradient_accumulation_steps", &TrainConfig::gradient_accumulation_steps,
               "micro-batches per optimizer step", positive_at_most(kMaxBatchCount)),
      F::field("max_steps", &TrainConfig::max_steps, "optimizer steps", positive_at_most(kMaxSteps)),
  });
  add(nested("optimizer", &TrainConfig::optimizer, optimizer_fields()));
  add(nested("lr_scheduler", &TrainConfig::schedule, schedule_fields()));
  add({
      F::field("max_grad_norm", &TrainConfig::max_grad_norm, "clip by the global L2 norm",
               non_negative("must be >= 0 (0 disables clipping)")),
      // Hugging Face TrainingArguments' name is accepted too.
      F::field("collective_timeout", &TrainConfig::collective_timeout,
               "seconds a collective may wait before the job ends naming it",
               [](double v) { return v >= 0 ? std::string() : "must be >= 0 (0: wait forever)"; })
          .alias("ddp_timeout"),
      F::field("save_on_signal", &TrainConfig::save_on_signal,
               "SIGTERM/SIGINT/SIGUSR1: finish the step, checkpoint (if configured), exit 0"),
      F::field("on_nonfinite", &TrainConfig::on_nonfinite, "a NaN/Inf loss or gradient norm: stop or skip the step"),
      F::field("max_skipped_steps", &TrainConfig::max_skipped_steps, "on_nonfinite: skip: non-finite steps in a row allowed",
               positive),
      F::field("eval_every", &TrainConfig::eval_every, "steps between evaluations", non_negative("must be >= 0")),
      F::field("eval_batches", &TrainConfig::eval_batches, "batches per evaluation", positive_at_most(kMaxBatchCount)),
      F::field("accuracy_examples", &TrainConfig::accuracy_examples, "built-in tasks: problems decoded at eval"),
      F::field("log_every", &TrainConfig::log_every, "steps between progress lines", positive),
      F::field("progress", &TrainConfig::progress, "auto, bar, lines or none"),
      F::field("metrics_file", &TrainConfig::metrics_file, "JSON lines of metrics, in output_dir"),
      F::field("peak_flops", &TrainConfig::peak_flops,
               "FLOP/s of one rank's device at the compute dtype; step records then carry mfu",
               non_negative("must be >= 0 (0: no mfu)")),
      F::field("profile_steps", &TrainConfig::profile_steps,
               "[first, last]: those steps' timeline per rank, output_dir/trace/rank<R>.json (Chrome trace)",
               [](const std::vector<int64_t>& v) {
                 return v.empty() || (v.size() == 2 && v[0] >= 1 && v[0] <= v[1])
                            ? std::string()
                            : std::string("expected [first, last], two steps with 1 <= first <= last");
               }),
      // Hugging Face TrainingArguments' report_to and accelerate's log_with: one name or a list.
      F::custom("report_to", read_report_to, "tensorboard, none or all (one name or a list): where metrics also go")
          .alias("log_with"),
      F::field("logging_dir", &TrainConfig::logging_dir, "TensorBoard event files' directory (default output_dir/runs)"),
      F::parsed("save_dtype", &TrainConfig::save_dtype, float_dtype, "dtype of the trained weights written"),
      F::parsed("max_shard_size", &TrainConfig::max_shard_size, size_text, "largest safetensors file written"),
      // Hugging Face Trainer's names are accepted too.
      F::field("save_every", &TrainConfig::save_every, "steps between checkpoints",
               non_negative("must be >= 0 (0: no checkpoints by step count)"))
          .alias("save_steps"),
      F::field("save_every_minutes", &TrainConfig::save_every_minutes, "minutes between checkpoints",
               non_negative("must be >= 0 (0: no checkpoints by time)")),
      F::field("keep_last_n", &TrainConfig::keep_last_n, "complete checkpoints kept",
               non_negative("must be >= 0 (0 keeps every checkpoint)"))
          .alias("save_total_limit"),
      F::field("checkpoint_dir", &TrainConfig::checkpoint_dir, "where checkpoints go"),
      F::field("async_checkpoint", &TrainConfig::async_checkpoint,
               "write checkpoints in the background from a staged copy of the state"),
      F::parsed(
           "resume_from", &TrainConfig::resume_from,
           [](const std::string& s) -> std::string {
             if (s == "false" || s == "False") return "";
             if (s == "true" || s == "True") return "auto";  // HF Trainer's boolean form
             return s;
           },
           "auto (the newest complete checkpoint) or a checkpoint directory")
          .alias("resume_from_checkpoint"),
      F::field("device", &TrainConfig::device, "cpu or cuda", usable_device),
  });
  add(nested("", &TrainConfig::sharding, sharding_config_fields()));
  // After mixed_precision, which sets the same dtype: the two must agree when both are given.
  add({F::parsed_set(
      "compute_dtype", float_dtype,
      [](const ConfigTree& t, const std::string& k, TrainConfig& c, DType d) {
        if (t.has("mixed_precision") && d != c.sharding.param_dtype)
          throw t.error_at(k, "disagrees with mixed_precision's parameter dtype; set one of them");
        c.sharding.param_dtype = d;
      },
      "f32 or bf16 (mixed_precision.param_dtype)",
      [](DType d) { return d == DType::F16 ? std::string("f16 compute is not supported (use bf16)") : ""; })});
  add({F::parsed_set(
      "optimizer_state_dtype", float_dtype,
      [](const ConfigTree&, const std::string&, TrainConfig& c, DType d) { c.sharding.state_dtype = d; },
      "AdamW's moments at rest: f32, or bf16 (half the bytes, stored with stochastic rounding)",
      [](DType d) { return d == DType::F16 ? std::string("f16 moments are not supported (use bf16)") : ""; })});
  // Hugging Face TrainingArguments' optim, after optimizer_state_dtype, which it must agree with.
  add({F::parsed_set(
      "optim",
      [](const std::string& s) -> DType {
        if (s == "adamw_torch" || s == "adamw_torch_fused" || s == "adamw") return DType::F32;
        if (s == "adamw_bnb_8bit" || s == "adamw_8bit" || s == "adamw8bit") return DType::U8;
        if (s.starts_with("paged_"))
          throw Error(fmt::format("'{}': paged optimizers (unified-memory paging) are not supported; adamw_8bit keeps "
                                  "8-bit state without paging",
                                  s));
        throw Error(fmt::format("expected adamw_torch or adamw_8bit (adamw_bnb_8bit), got '{}'", s));
      },
      [](const ConfigTree& t, const std::string& k, TrainConfig& c, DType d) {
        if (d == DType::F32) return;  // AdamW with the moments optimizer_state_dtype says
        if (t.has("optimizer_state_dtype"))
          throw t.error_at(k, "adamw_8bit keeps its moments in 8 bits; optimizer_state_dtype cannot also be set");
        c.sharding.state_dtype = d;
      },
      "adamw_torch (AdamW, moments as optimizer_state_dtype says) or adamw_8bit (alias adamw_bnb_8bit): bitsandbytes' "
      "blockwise 8-bit moments, a quarter of f32's bytes")});
  add({
      F::parsed(
          "max_memory_per_rank", &TrainConfig::max_memory_per_rank,
          [](const std::string& s) { return int64_t(io::parse_size(s)); },
          "the budget sharding_strategy: auto fits, e.g. 24GB",
          [](int64_t v) { return v > 0 ? std::string() : "must be positive, e.g. 24GB"; }),
      // true (every layer), false, or k (every k-th layer).
      F::custom(
          "activation_checkpointing",
          [](const ConfigTree& t, const std::string& k, TrainConfig& c) {
            if (!t.has(k)) return;
            const std::string v = t.get(k, "false");
            if (v == "true" || v == "True") c.activation_checkpointing = 1;
            else if (v == "false" || v == "False") c.activation_checkpointing = 0;
            else {
              const int every = t.get<int>(k, 0);
              if (every < 0) throw t.error_at(k, "expected true, false or a layer interval >= 1");
              c.activation_checkpointing = every;
            }
          },
          "true, false, or k: every k-th decoder layer recomputes its activations"),
      // accelerate's switch, not an alias: it may be set beside activation_checkpointing and then
      // wins with every layer.
      F::setter<bool>(
          "fsdp_config.fsdp_activation_checkpointing",
          [](TrainConfig& c, bool on) {
            if (on) c.activation_checkpointing = 1;
          },
          "accelerate's: true checkpoints every decoder layer"),
      F::field("offload_activations", &TrainConfig::offload_activations,
               "the checkpointed layers' saved inputs in host memory from their forward to their backward (needs "
               "activation_checkpointing)")
          .alias("enable_activation_offloading"),
  });
  add(lora_fields());
  add(dpo_fields());
  return table;
}

// The rules between keys, once every key is read.
void check_relations(const ConfigTree& t, TrainConfig& c) {
  check_sharding_config(t, c.sharding, c.device);
  // Sharded checkpoints read and write the optimizer state as host memory; GPU-resident state is
  // not wired into them yet.
  if (c.device == Device::CUDA && c.saves_checkpoints())
    throw t.error_at(c.save_every > 0 ? "save_every" : "save_every_minutes",
                     "checkpoints are not implemented yet for device: cuda");
  if (c.device == Device::CUDA && !c.resume_from.empty())
    throw t.error_at("resume_from", "resuming is not implemented yet for device: cuda");
  if (c.sharding.auto_strategy && c.max_memory_per_rank == 0)
    throw t.error_at("sharding_strategy", "auto needs max_memory_per_rank (the memory budget of one rank, e.g. 24GB)");
  if (c.offload_activations && c.activation_checkpointing == 0)
    throw t.error_at("offload_activations", "offloads the checkpointed layers' saved inputs: set "
                                            "activation_checkpointing (true, or a layer interval)");
  if (c.micro_batch_size * c.seq_len > kMaxMicroBatchTokens)
    throw t.error_at("micro_batch_size", fmt::format("micro_batch_size {} x seq_len {} is more than {} tokens per "
                                                     "micro-batch",
                                                     c.micro_batch_size, c.seq_len, kMaxMicroBatchTokens));
  check_lora(t, c);
  if (c.preference && c.lora && !c.dpo.reference_model.empty())
    throw t.error_at("dpo.reference_model", "under LoRA the reference is the base model with the adapters off; a "
                                            "reference_model is for full fine-tunes");
  if (c.preference && c.dpo.label_smoothing > 0 && c.dpo.loss_type != DpoLossType::Sigmoid)
    throw t.error_at("dpo.label_smoothing", "applies to loss_type: sigmoid only");
  // The schedule's peak and length are the optimizer's and the run's.
  c.schedule.lr = c.optimizer.lr;
  if (!t.has("lr_scheduler.total_steps")) c.schedule.total_steps = c.max_steps;
}

}  // namespace

const std::vector<ConfigField<TrainConfig>>& train_config_fields() {
  static const std::vector<ConfigField<TrainConfig>> table = make_table();
  return table;
}

TrainConfig read_train_config(ConfigTree& t) {
  TrainConfig c;
  c.source = t.file();
  // DeepSpeed's keys become the table's keys first, placed where the DeepSpeed file wrote them.
  c.deepspeed = apply_deepspeed_config(t);
  read_fields(train_config_fields(), t, c);
  // The budget is checked against estimates only once the model is known (training, validate).
  c.max_memory_per_rank_at = t.error_at("max_memory_per_rank", "").context();
  check_relations(t, c);
  t.reject_unknown_keys();
  return c;
}

TrainConfig with_batch_size(const TrainConfig& config, int world_size) {
  TrainConfig c = config;
  const DeepSpeedSettings& ds = c.deepspeed;
  const int64_t tbs = ds.train_batch_size;
  if (tbs == 0) return c;
  // DeepSpeed's rule: the setting not given is what makes the product come out; with neither,
  // one micro-batch per step.
  if (!ds.micro_batch_set || !ds.accumulation_set) {
    if (!ds.accumulation_set) c.gradient_accumulation_steps = 1;
    const int64_t other = ds.micro_batch_set ? c.micro_batch_size : c.gradient_accumulation_steps;
    const int64_t derived = tbs / std::max<int64_t>(1, other * world_size);
    if (derived > kMaxBatchCount)
      throw Error(fmt::format("{} makes {} {}, more than {}", tbs,
                              ds.micro_batch_set ? "gradient_accumulation_steps" : "micro_batch_size", derived,
                              kMaxBatchCount),
                  ds.train_batch_size_at);
    if (derived >= 1 && derived * other * world_size == tbs) {
      (ds.micro_batch_set ? c.gradient_accumulation_steps : c.micro_batch_size) = derived;
      return c;
    }
  }
  const int64_t got = c.micro_batch_size * c.gradient_accumulation_steps * world_size;
  if (tbs == got) return c;
  throw Error(fmt::format("{} is not micro_batch_size {} x gradient_accumulation_steps {} x {} rank{} = {}", tbs,
                          c.micro_batch_size, c.gradient_accumulation_steps, world_size, world_size == 1 ? "" : "s",
                          got),
              ds.train_batch_size_at);
}

std::string TrainConfig::tensorboard_dir() const {
  return logging_dir.empty() ? output_dir + "/runs" : logging_dir;
}

std::string TrainConfig::checkpoint_root() const {
  return checkpoint_dir.empty() ? output_dir + "/checkpoints" : checkpoint_dir;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  // Every rank reads the same file and overrides: their errors are printed once.
  return on_every_rank([&] {
    ConfigTree tree = ConfigTree::load(path);
    tree.apply_overrides(overrides);
    return read_train_config(tree);
  });
}

}  // namespace shardlm::train
