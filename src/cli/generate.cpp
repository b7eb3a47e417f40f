// `shardlm generate`: continue a prompt, or a file of prompts in batches, with a trained model
// (KV-cached decoding; infer/generator.h). docs/generation.md describes the flags and the output.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/generation_flags.h"
#include "cli/model_split.h"
#include "infer/load_weights.h"
#include "comm/communicator.h"
#include "core/alloc.h"
#include "data/instruct.h"
#include "data/tokenizer.h"
#include "infer/generator.h"
#include "infer/placement.h"
#include "infer/tensor_parallel.h"
#include "infer/requests.h"
#include "io/json_parse.h"
#include "io/read_file.h"
#include "io/model_files.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"

namespace shardlm::cli {

namespace {

using nlohmann::json;

struct Opts {
  std::string model, prompt, prompts, output, adapter, chat_format = "auto";
  ModelSplitFlags split;                         // none: the whole model in each process
  std::string dtype = "f32";                     // --dtype: the weights' and the KV cache's
  std::string device = "cpu";                    // --device: where they are and the forward runs
  std::vector<std::string> stop;
  std::string stop_token_ids;  // --stop-token-ids, when given (stop_token_ids_given)
  bool stop_token_ids_given = false;
  infer::SamplingOptions s;
  int64_t batch_size = 8, prefill_chunk = infer::kDefaultPrefillChunk;
  KvCacheFlags kv_cache;
  bool no_bos = false, chat = false, load_in_4bit = false, quiet = false;
};

// One request as read from --prompt or --prompts: its text or messages, options and stop strings.
struct PromptRow {
  int64_t line = 0;  // in --prompts (1-based); 0 for --prompt
  std::string prompt;
  std::vector<data::ChatMessage> messages;  // non-empty: a conversation
  infer::SamplingOptions s;
  std::vector<std::string> stop;
  json id = nullptr;  // a JSONL row's "id", echoed in its result
};

// --prompts FILE: .jsonl = one JSON object per non-empty line, else one prompt per non-empty line.
std::vector<PromptRow> read_prompts(const Opts& o) {
  std::istringstream f([&] {
    try {
      return io::read_file(o.prompts, "prompts file");
    } catch (Error& e) {
      e.set_key("--prompts");
      throw;
    }
  }());
  const bool jsonl = o.prompts.ends_with(".jsonl");
  std::vector<PromptRow> rows;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    PromptRow r{.line = n, .prompt = line, .messages = {}, .s = o.s, .stop = o.stop, .id = nullptr};
    if (!jsonl) {
      rows.push_back(std::move(r));
      continue;
    }
    try {
      json rec;
      try {
        rec = io::parse_json(line);
      } catch (const json::parse_error& e) {
        std::string what = e.what();
        if (const size_t colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
        throw Error("malformed JSON: " + what);
      }
      if (!rec.is_object()) throw Error(fmt::format("expected a JSON object, got {}", rec.type_name()));
      const bool has_prompt = rec.contains("prompt"), has_messages = rec.contains("messages");
      if (has_prompt == has_messages)
        throw Error("a row needs exactly one of 'prompt' (text) and 'messages' (a conversation)", {.key = "prompt"});
      if (has_prompt) {
        // "" is a prompt too: generation from BOS alone (unconditional sampling, how small story
        // models are used), as --prompt "" is.
        if (!rec["prompt"].is_string())
          throw Error(fmt::format("field 'prompt' must be a string, got {}", rec["prompt"].type_name()),
                      {.key = "prompt"});
        r.prompt = rec["prompt"].get<std::string>();
      } else {
        try {
          r.messages = data::chat_messages_of(rec);
        } catch (Error& e) {
          e.set_key("messages");
          throw;
        }
        r.prompt.clear();
      }
      r.s = infer::read_sampling(rec, o.s);
      r.s.max_new_tokens = infer::json_number<int64_t>(rec, "max_new_tokens", o.s.max_new_tokens);
      r.stop = infer::json_stop(rec, o.stop);
      if (const auto it = rec.find("id"); it != rec.end()) r.id = *it;
      infer::check_sampling(r.s);
      static const char* known[] = {"prompt",  "messages", "max_new_tokens",     "temperature", "top_k",
                                    "top_p",   "seed",     "repetition_penalty", "stop",        "id"};
      for (const auto& item : rec.items()) {
        const std::string& key = item.key();
        if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) ==
            std::end(known))
          throw Error(fmt::format("unknown field '{}' (known: prompt, messages, max_new_tokens, temperature, top_k, "
                                  "top_p, repetition_penalty, seed, stop, id)",
                                  key),
                      {.key = key});
      }
    } catch (Error& e) {
      e.set_file(o.prompts);
      e.set_line(n);
      throw;
    }
    rows.push_back(std::move(r));
  }
  if (rows.empty()) throw Error("the prompts file holds no prompts", {.file = o.prompts, .key = "--prompts"});
  return rows;
}

void run_generate(const Opts& o) {
  const GenerationDtype held = generation_dtype(o.dtype);
  const DType dtype = held.dtype;
  const Device device = generation_device(o.device, held, o.split.given());
  // Every rank of a split model (--device-map) runs all of this and samples the same tokens; only
  // rank 0 writes results and notes.
  const bool writer = !o.split.given() || world().rank() == 0;
  const ModelConfig cfg = load_hf_config(o.model);
  const auto tok = data::load_model_tokenizer(o.model, cfg.vocab_size, true);
  std::vector<PromptRow> rows;
  if (!o.prompts.empty()) rows = read_prompts(o);
  else rows.push_back({.line = 0, .prompt = o.prompt, .messages = {}, .s = o.s, .stop = o.stop, .id = nullptr});
  const bool any_chat =
      o.chat || std::any_of(rows.begin(), rows.end(), [](const PromptRow& r) { return !r.messages.empty(); });
  std::optional<infer::ChatPrompt> chat;
  if (any_chat) chat = infer::ChatPrompt::of_model(o.model, *tok, o.chat_format, "--chat-format");

  // Tokenize every request.
  const int64_t context = cfg.max_position_embeddings;
  std::vector<infer::Request> requests;
  const std::vector<int32_t> stops = o.stop_token_ids_given
                                         ? infer::parse_stop_token_ids(o.stop_token_ids, cfg.vocab_size)
                                         : infer::stop_token_ids(cfg, *tok, chat ? &*chat : nullptr, o.model);
  int64_t max_len = 1;
  for (PromptRow& r : rows) {
    std::vector<int32_t> ids;
    try {
      if (!r.messages.empty() || o.chat) {
        if (r.messages.empty()) r.messages = {{"user", r.prompt}};
        try {
          infer::ChatPrompt::Rendered rendered = chat->render(*tok, r.messages);
          ids = std::move(rendered.ids);
          r.prompt = std::move(rendered.text);
        } catch (Error& e) {
          e.set_key(r.line ? "messages" : "--chat-format");
          throw;
        }
      } else {
        ids = tok->encode_with(r.prompt, !o.no_bos, false);
      }
      if (ids.empty())
        throw Error(o.no_bos ? "an empty prompt without BOS (--no-bos) leaves nothing to continue"
                             : "an empty prompt needs a BOS token to start from, and this tokenizer adds none",
                    {.key = "prompt"});
      const int64_t P = int64_t(ids.size());
      // The model has max_position_embeddings positions; the prompt takes some, the rest is all that
      // can be generated. Say so up front rather than stopping short without a word.
      if (P >= context)
        throw Error(fmt::format("the prompt is {} tokens, but the model's max_position_embeddings is {}: no position "
                                "is left for a new token",
                                P, context),
                    {.file = o.model + "/config.json", .key = "max_position_embeddings"});
      if (P + r.s.max_new_tokens > context && writer)
        std::fprintf(stderr,
                     "generate: %s--max-new-tokens %lld with a %lld-token prompt passes the model's "
                     "max_position_embeddings %lld: at most %lld new tokens\n",
                     r.line ? fmt::format("{}:{}: ", o.prompts, r.line).c_str() : "", (long long)r.s.max_new_tokens,
                     (long long)P, (long long)context, (long long)(context - P));
      max_len = std::max(max_len, std::min(context, P + r.s.max_new_tokens));
    } catch (Error& e) {
      if (r.line) {
        e.set_file(o.prompts);
        e.set_line(r.line);
      }
      throw;
    }
    requests.push_back({std::move(ids), r.s});
  }

  if (chat && writer)
    std::fprintf(stderr, "generate: chat format %s%s\n", data::chat_format_name(chat->format),
                 chat->default_system ? " (with the template's default system message)" : "");
  // --device-map (this rank holds, loads and runs only its share of the layers) or
  // --tensor-parallel (a slice of every layer): every rank runs the same requests in lockstep and
  // rank 0 writes the results.
  const ModelSplit split = split_model(o.split, cfg, held, "generate", writer);
  const std::string& command = split.command;
  infer::ParamStore params(cfg, DType::F32, split.keep, split.split);
  infer::load_inference_weights({.model = o.model, .adapter = o.adapter, .load_in_4bit = o.load_in_4bit,
                                .load_in_4bit_role = "--load-in-4bit", .dtype = dtype, .q8_0 = held.q8_0,
                                .device = device},
                                cfg, params,
                                [&](const std::string& line) { fmt::print(stderr, "{}: {}\n", command, line); });
  const int64_t batch = std::min<int64_t>(o.batch_size, int64_t(requests.size()));
  infer::Generator gen(cfg, params.compute_weights(), max_len, batch, split.pipeline, split.tp,
                       kv_cache_options(o.kv_cache, dtype));

  // Stop strings are matched on each request's decoded completion as tokens arrive; with one
  // --prompt and no --prompts, the completion is also streamed to stdout.
  const bool stream = o.prompts.empty();
  std::vector<infer::CompletionText> texts;  // each request's, decoded incrementally as its tokens arrive
  for (size_t i = 0; i < requests.size(); ++i) texts.emplace_back(*tok, requests[i].prompt, rows[i].stop);
  auto show = [&](bool last) {
    const std::string delta = texts[0].take_delta(last);
    if (!writer) return;
    std::fputs(delta.c_str(), stdout);
    std::fflush(stdout);
  };
  if (stream && writer) std::fputs(rows[0].messages.empty() ? o.prompt.c_str() : "", stdout);
  const std::vector<infer::Completion> done = gen.run(requests, stops, [&](size_t i, int32_t id, const infer::TokenLogprobs*) {
    const bool stopped = texts[i].push(id);
    if (stream) show(false);
    return stopped;
  }, o.prefill_chunk);
  if (!writer) return;
  if (stream) {
    show(true);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    const infer::Completion& c = done[0];
    if (c.finish == infer::FinishReason::Length && int64_t(requests[0].prompt.size() + c.tokens.size()) >= context)
      std::fprintf(stderr, "generate: stopped after %lld new tokens: the model's context of %lld positions is full\n",
                   (long long)c.tokens.size(), (long long)context);
    // The timing line, as llama.cpp and transformers' streamers print one.
    if (!o.quiet) {
      const double P = double(requests[0].prompt.size()), N = double(c.tokens.size());
      std::fprintf(stderr,
                   "generate: %.0f prompt tokens in %.3f s (%.1f tok/s prefill), %.0f new tokens in %.3f s (%.1f tok/s "
                   "decode)\n",
                   P, c.prefill_seconds, P / std::max(c.prefill_seconds, 1e-9), N, c.decode_seconds,
                   N / std::max(c.decode_seconds, 1e-9));
    }
    return;
  }

  // One JSON line per request, in input order.
  std::FILE* out = stdout;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(nullptr, &std::fclose);
  if (!o.output.empty()) {
    file.reset(std::fopen(o.output.c_str(), "w"));
    if (!file) throw Error("cannot open the output file for writing", {.file = o.output, .key = "--output"});
    out = file.get();
  }
  for (size_t i = 0; i < done.size(); ++i) {
    const infer::Completion& c = done[i];
    const std::string text = texts[i].text();
    nlohmann::ordered_json line = {{"index", i},
                 {"prompt", rows[i].prompt},
                 {"text", text},
                 {"prompt_tokens", requests[i].prompt.size()},
                 {"completion_tokens", c.tokens.size()},
                 {"finish_reason", infer::finish_reason_name(c.finish)},
                 {"prefill_seconds", c.prefill_seconds},
                 {"decode_seconds", c.decode_seconds},
                 {"preemptions", c.preemptions}};
    if (!rows[i].id.is_null()) line["id"] = rows[i].id;
    const std::string s = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    if (std::fputs(s.c_str(), out) < 0) throw Error("cannot write the output", {.file = o.output});
  }
  if (std::fflush(out) != 0) throw Error("cannot write the output", {.file = o.output.empty() ? "stdout" : o.output});
}

}  // namespace

void register_generate(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a model directory");
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Hugging Face model directory (dense, or bitsandbytes NF4)")->required();
  auto* prompt = cmd->add_option("--prompt", o->prompt, "Text to continue (streamed to stdout)");
  auto* prompts = cmd->add_option("--prompts", o->prompts,
                                  "A file of requests, generated in batches: .txt = one prompt per non-empty line; "
                                  ".jsonl = one {\"prompt\": ...} or {\"messages\": [...]} per line, with optional "
                                  "max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop. "
                                  "Writes one JSON line per request (docs/generation.md)");
  prompt->excludes(prompts);
  prompts->excludes(prompt);
  cmd->add_option("--output", o->output, "With --prompts: write the JSON lines here instead of stdout");
  cmd->add_option("--batch-size", o->batch_size, "With --prompts: sequences decoded together")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "Prompt tokens prefilled per step at most, beside the batch's decoding (chunked prefill); 0 = whole "
                  "prompts at once")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30))
      ->capture_default_str();
  add_kv_cache_flags(cmd, o->kv_cache);
  cmd->add_flag("--chat", o->chat,
                "Render each prompt as a user message in the model's chat format, ready for the assistant's "
                "answer (JSONL rows with \"messages\" always are)");
  cmd->add_option("--chat-format", o->chat_format,
                  "auto (from tokenizer_config.json's chat_template, else the tokenizer's special tokens), "
                  "llama3, llama2, chatml or mistral")
      ->capture_default_str();
  cmd->add_option("--adapter", o->adapter,
                  "A PEFT LoRA adapter directory for --model: merged in memory into the loaded f32 weights "
                  "(W + scale * B A, before any --dtype bf16 rounding; nothing is written; `shardlm merge` "
                  "writes a merged copy)");
  cmd->add_option("--dtype", o->dtype, kGenerationDtypeHelp)->capture_default_str();
  cmd->add_option("--device", o->device, kGenerationDeviceHelp)->capture_default_str();
  cmd->add_flag("--load-in-4bit", o->load_in_4bit,
                "Quantize the base's decoder Linear weights to NF4 (as QLoRA training does) and generate "
                "from their dequantized values");
  cmd->add_option("--max-new-tokens", o->s.max_new_tokens,
                  "Stop after this many new tokens (at most max_position_embeddings minus the prompt: "
                  "generate says so when it caps the request)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--stop", o->stop,
                  "Stop a completion where this text appears (repeatable; not included; taken as given: "
                  "in a shell, $'\\n' is a line break)")
      ->check([](const std::string& s) { return s.empty() ? std::string("--stop must not be empty") : std::string(); });
  CLI::Option* stop_ids = cmd->add_option("--stop-token-ids", o->stop_token_ids,
                  "Token ids that end a completion, separated by commas, replacing the default set (the "
                  "tokenizer's EOS, config.json's and generation_config.json's eos_token_id, and with --chat the "
                  "format's end-of-turn tokens); none: no stop token, every completion runs to its length");
  cmd->add_option("--temperature", o->s.temperature, "Sampling temperature; 0 = greedy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-k", o->s.top_k, "Sample among the k most likely tokens; 0 = all")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-p", o->s.top_p, "Nucleus sampling mass, in (0, 1]; 1 = off")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", o->s.repetition_penalty,
                  "Divide positive (multiply negative) logits of tokens already in the prompt or output by this; "
                  "1 = off")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--seed", o->s.seed, "Sampling seed (a request's tokens depend only on it and the request)")
      ->capture_default_str();
  cmd->add_flag("--no-bos", o->no_bos, "Do not start the prompt with the BOS token");
  cmd->add_flag("--quiet", o->quiet, "With --prompt: no timing line on stderr after the completion");
  add_model_split_flags(cmd, o->split, "generate");
  cmd->footer(
      "Examples:\n"
      "  shardlm generate --model runs/tiny-trained --prompt \"ROMEO:\" --max-new-tokens 100\n"
      "  shardlm generate --model runs/demo --prompt \"12+34=\" --temperature 0\n"
      "  shardlm generate --model runs/demo --prompts prompts.jsonl --batch-size 16 --output out.jsonl\n"
      "  shardlm generate --model models/llama3.2-1b --dtype bf16 --prompt \"Hi\"\n"
      "  shardlm generate --model models/llama3-8b-instruct --chat --prompt \"Hi\" --stop $'\\n\\n'\n"
      "  shardlm generate --model models/llama2-7b --adapter runs/alpaca-lora/adapter --prompt \"Hi\"\n"
      "  shardlm generate --model models/llama2-7b --load-in-4bit --adapter runs/qlora/adapter --prompt \"Hi\"\n"
      "  shardlm launch --nproc-per-node 2 -- generate --model models/llama2-13b --device-map balanced --prompt \"Hi\"\n"
      "  shardlm launch --nproc-per-node 4 -- generate --model M --device-map sequential --max-memory-per-rank 20GB "
      "--prompt \"Hi\"\n"
      "  shardlm launch --nproc-per-node 2 -- generate --model models/llama3-8b --tensor-parallel 2 --prompt \"Hi\"");
  cmd->callback([o, prompt, prompts, stop_ids] {
    o->stop_token_ids_given = stop_ids->count() > 0;
    if (prompt->count() == 0 && prompts->count() == 0)
      throw Error("give --prompt TEXT or --prompts FILE", {.key = "--prompt"});
    infer::check_sampling(o->s);
    // Flag errors before anything is read.
    check_model_split_flags(o->split);
    generation_dtype(o->dtype);
    kv_cache_options(o->kv_cache, DType::F32);
    run_generate(*o);
  });
}

}  // namespace shardlm::cli
