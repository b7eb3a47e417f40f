// `shardlm init`: a randomly initialized model directory in Hugging Face layout.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <vector>

#include <set>

#include "cli/commands.h"
#include "io/json_parse.h"
#include "io/staged_dir.h"
#include "io/yaml_config.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"

namespace shardlm::cli {

void register_init(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("init", "Write a randomly initialized model as a Hugging Face directory");
  struct Opts {
    std::string preset, config, out, dtype = "f32";
    uint64_t seed = 0;
    bool force = false;
    std::vector<std::string> sets;
  };
  auto o = std::make_shared<Opts>();
  auto* src = cmd->add_option("--preset", o->preset, "Named architecture: " + fmt::format("{}", fmt::join(preset_names(), ", ")));
  cmd->add_option("--config", o->config, "A Hugging Face config.json (or a directory holding one)")->excludes(src);
  cmd->add_option("--out", o->out, "Directory to write (created; it must not exist or be empty)")->required();
  cmd->add_flag("--force", o->force, "Replace --out even when it holds something (a trained model, say): the old "
                "directory is swapped out whole and deleted");
  cmd->add_option("--seed", o->seed, "Initialization seed (same seed, same weights, on any number of ranks)");
  cmd->add_option("--dtype", o->dtype, "Stored dtype: f32, bf16 or f16")->capture_default_str();
  cmd->add_option("--set", o->sets, "Override a config.json field, e.g. --set num_hidden_layers=4 (repeatable); overriding "
                  "hidden_size or num_attention_heads without head_dim sets head_dim = hidden_size / "
                  "num_attention_heads");
  cmd->footer(
      "Examples:\n"
      "  shardlm init --preset tiny --out runs/tiny\n"
      "  shardlm init --preset llama3.2-1b --out runs/l1b --dtype bf16\n"
      "  shardlm init --config my/config.json --out runs/mine --seed 7 --set num_hidden_layers=2");
  cmd->callback([o] {
    if (o->preset.empty() && o->config.empty()) throw Error("give --preset NAME or --config config.json");
    // Before any work: a random model must not silently replace a trained one.
    const io::Publish publish = o->force ? io::Publish::ReplaceAnything : io::Publish::New;
    try {
      io::check_publishable(o->out, publish, "--out");
    } catch (Error& e) {
      throw Error(e.message() + " (--force replaces it)", e.context());
    }
    ModelConfig cfg = o->preset.empty() ? load_model_config(o->config) : preset(o->preset);
    if (!o->sets.empty()) {
      nlohmann::json j = to_hf_json(cfg);
      std::set<std::string> keys;
      for (const std::string& s : o->sets) {
        const size_t eq = s.find('=');
        if (eq == std::string::npos || eq == 0) throw Error(fmt::format("--set expects key=value, got '{}'", s));
        const std::string key = s.substr(0, eq), value = s.substr(eq + 1);
        keys.insert(key);
        try {
          j[key] = io::parse_json(value);
        } catch (const nlohmann::json::exception&) {
          j[key] = value;  // a bare string
        }
      }
      // The preset's (or file's) head_dim belongs to its hidden_size and heads: when either is
      // overridden and head_dim is not, derive it as transformers does when the key is absent
      // (hidden_size / num_attention_heads; an error naming both keys when it does not divide).
      const bool derive_head_dim =
          (keys.count("hidden_size") || keys.count("num_attention_heads")) && !keys.count("head_dim");
      if (derive_head_dim) j.erase("head_dim");
      cfg = model_config_from_json(j);
      // config.json holds many keys shardlm does not read; a --set of one of those (a typo, most
      // likely) would change nothing, so it is refused rather than silently dropped.
      const nlohmann::json used = to_hf_json(cfg);
      for (const std::string& key : keys) {
        if (used.contains(key)) continue;
        std::vector<std::string> known;
        for (const auto& kv : used.items()) known.push_back(kv.key());
        throw Error(fmt::format("--set {}: not a config.json key shardlm reads (it reads: {})", key, fmt::join(known, ", ")));
      }
      if (derive_head_dim)
        fmt::print("head_dim {} = hidden_size {} / num_attention_heads {} (--set head_dim=N to choose another)\n",
                   cfg.head_dim, cfg.hidden_size, cfg.num_attention_heads);
    }
    const DType dtype = dtype_flag("--dtype", o->dtype, {DType::F32, DType::BF16, DType::F16});
    infer::ParamStore params(cfg, DType::F32);
    params.init_random(o->seed);
    params.save(o->out, dtype, ~uint64_t(0), "", publish, "--out");
    fmt::print("wrote {} ({} layers, hidden {}, vocab {}, {:.2f}M parameters, {}, seed {})\n", o->out,
               cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, double(parameter_count(cfg)) / 1e6,
               dtype_name(dtype), o->seed);
  });
}

}  // namespace shardlm::cli
