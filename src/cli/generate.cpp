// `shardlm generate`: continue a prompt with a trained model (KV-cached decoding).
#include <fmt/format.h>

#include <cstdio>

#include "cli/commands.h"
#include "data/tokenizer.h"
#include "infer/generator.h"
#include "io/model_files.h"
#include "model/hf_dir.h"
#include "model/peft_adapter.h"
#include "train/param_store.h"

namespace shardlm::cli {

void register_generate(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a model directory");
  struct Opts {
    std::string model, prompt, adapter;
    infer::SamplingOptions s;
    bool no_bos = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Hugging Face model directory")->required();
  cmd->add_option("--prompt", o->prompt, "Text to continue")->required();
  cmd->add_option("--adapter", o->adapter,
                  "A PEFT LoRA adapter directory for --model: merged in memory into the loaded f32 weights "
                  "(W + scale * B A; nothing is written; `shardlm merge` writes a merged copy)");
  cmd->add_option("--max-new-tokens", o->s.max_new_tokens,
                  "Stop after this many new tokens (at most max_position_embeddings minus the prompt: "
                  "generate says so when it caps the request)")
      ->capture_default_str();
  cmd->add_option("--temperature", o->s.temperature, "Sampling temperature; 0 = greedy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-k", o->s.top_k, "Sample among the k most likely tokens; 0 = all")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-p", o->s.top_p, "Nucleus sampling mass, in (0, 1]; 1 = off")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  cmd->add_option("--seed", o->s.seed, "Sampling seed")->capture_default_str();
  cmd->add_flag("--no-bos", o->no_bos, "Do not start the prompt with the BOS token");
  cmd->footer(
      "Examples:\n"
      "  shardlm generate --model runs/tiny-trained --prompt \"ROMEO:\" --max-new-tokens 100\n"
      "  shardlm generate --model runs/demo --prompt \"12+34=\" --temperature 0\n"
      "  shardlm generate --model models/llama2-7b --adapter runs/alpaca-lora/adapter --prompt \"Hi\"");
  cmd->callback([o] {
    const ModelConfig cfg = load_hf_config(o->model);
    const auto tok = data::load_tokenizer(o->model);
    train::ParamStore params(cfg, DType::F32);
    params.load(io::ModelWeights(o->model), o->model);
    if (!o->adapter.empty()) {
      const PeftAdapter adapter = read_peft_adapter(o->adapter, cfg);
      merge_adapter_into(adapter, [&](const std::string& name) { return params.master(name); });
      params.sync_compute();
      std::fprintf(stderr, "generate: LoRA adapter %s merged in memory (%zu weights, rank %lld, scale %g)\n",
                   o->adapter.c_str(), adapter.targets.size(), (long long)adapter.spec.rank, adapter.spec.scale());
    }
    const std::vector<int32_t> prompt = tok->encode_with(o->prompt, !o->no_bos, false);
    // The model has max_position_embeddings positions; the prompt takes some, the rest is all that
    // can be generated. Say so up front rather than stopping short without a word.
    const int64_t context = cfg.max_position_embeddings, P = int64_t(prompt.size());
    if (P >= context)
      throw Error(fmt::format("the prompt is {} tokens, but the model's max_position_embeddings is {}: no position is "
                              "left for a new token",
                              P, context),
                  {.file = o->model + "/config.json", .key = "max_position_embeddings"});
    const bool capped = P + o->s.max_new_tokens > context;
    if (capped)
      std::fprintf(stderr,
                   "generate: --max-new-tokens %lld with a %lld-token prompt passes the model's max_position_embeddings "
                   "%lld: at most %lld new tokens\n",
                   (long long)o->s.max_new_tokens, (long long)P, (long long)context, (long long)(context - P));
    const int64_t max_len = std::min<int64_t>(context, P + o->s.max_new_tokens);
    infer::Generator gen(cfg, params.compute_weights(), max_len);
    std::vector<int32_t> stops = {tok->eos_id()};
    for (int64_t e : cfg.eos_token_ids) stops.push_back(int32_t(e));
    std::fputs(o->prompt.c_str(), stdout);
    // Decode incrementally: print what the new tokens add to the decoded text so far. Decoding the
    // prompt together with the output keeps word boundaries right (SentencePiece drops the space
    // of a leading "▁" piece when it is decoded on its own), and multi-byte characters may need
    // several tokens.
    std::vector<int32_t> all = prompt;
    const std::string prompt_text = tok->decode(prompt);
    std::string shown;
    const std::vector<int32_t> out = gen.generate(prompt, o->s, stops, [&](int32_t id) {
      all.push_back(id);
      const std::string text = tok->decode(all);
      const std::string added = text.compare(0, prompt_text.size(), prompt_text) == 0 ? text.substr(prompt_text.size()) : text;
      if (added.size() > shown.size() && added.compare(0, shown.size(), shown) == 0) {
        std::fputs(added.substr(shown.size()).c_str(), stdout);
        std::fflush(stdout);
        shown = added;
      }
    });
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (capped && P + int64_t(out.size()) >= context)
      std::fprintf(stderr, "generate: stopped after %lld new tokens: the model's context of %lld positions is full\n",
                   (long long)out.size(), (long long)context);
  });
}

}  // namespace shardlm::cli
