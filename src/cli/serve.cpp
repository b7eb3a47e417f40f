// `shardlm serve`: an OpenAI-compatible HTTP server for a model directory, with continuous batching
// of decode steps (infer/server.h). docs/serving.md describes the endpoints and the flags.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/generation_flags.h"
#include "cli/model_split.h"
#include "comm/communicator.h"
#include "infer/load_weights.h"
#include "data/tokenizer.h"
#include "infer/generator.h"
#include "infer/requests.h"
#include "infer/server.h"
#include "io/model_files.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"

namespace shardlm::cli {

namespace {

// Bounds of the flags that size threads and buffers: --max-batch 1000000 tried to start ~2M
// threads and hung (issue 30).
constexpr int64_t kMaxBatch = 1024;
constexpr int kMaxConnections = 4096;
constexpr uint64_t kMaxBody = uint64_t(1) << 30;

struct Opts {
  std::string model, adapter, host = "127.0.0.1", name, chat_format = "auto", max_body = "4MiB";
  std::string dtype = "f32";  // --dtype: what the weights and the KV caches are held in
  std::string device = "cpu"; // --device: where they are and the forward runs
  int port = 8000, max_connections = 128;
  int64_t max_batch = 8, max_len = 0, prefill_chunk = infer::kDefaultPrefillChunk;
  ModelSplitFlags split;        // none: the whole model in this process
  double request_timeout = 10;
  bool load_in_4bit = false;
  KvCacheFlags kv_cache;
  std::string stop_token_ids;  // --stop-token-ids, when given (stop_token_ids_given)
  bool stop_token_ids_given = false;
};

// The stop signals' pipe (run_serve): the handler writes the signal's number, one byte.
int g_stop_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  const char c = char(sig);
  const ssize_t n = write(g_stop_pipe[1], &c, 1);  // async-signal-safe
  (void)n;
}

void run_serve(const Opts& o) {
  const GenerationDtype held = generation_dtype(o.dtype);
  const DType dtype = held.dtype;
  const Device device = generation_device(o.device, held, o.split.given());
  uint64_t max_body = 0;
  try {
    max_body = io::parse_size(o.max_body);
  } catch (const Error& e) {
    throw Error(e.message(), {.key = "--max-body"});
  }
  if (max_body < 1024 || max_body > kMaxBody)
    throw Error(fmt::format("--max-body {}: must be between 1KiB and 1GiB", o.max_body), {.key = "--max-body"});
  // Each connection takes two descriptors (cpp-httplib's and the server's own, infer/server.cpp);
  // past the process's limit accept() would fail in a loop. The soft limit is raised as far as the
  // hard one allows.
  const rlim_t needed = rlim_t(2 * o.max_connections + 256);
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < needed) {
    files.rlim_cur = std::min(needed, files.rlim_max);
    setrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur < needed)
      throw Error(fmt::format("--max-connections {} needs {} file descriptors, but the limit is {} (ulimit -n)",
                              o.max_connections, needed, files.rlim_cur),
                  {.key = "--max-connections"});
  }

  // SIGINT and SIGTERM end the server; so does SIGUSR1, as which `shardlm launch` relays a SIGINT or
  // SIGTERM to every rank. A handler writes the signal's number to a pipe that one thread (below)
  // reads to shut the server down: a handler, not sigwait with the signals blocked, because under
  // MPI threads started before this one (MPI's own) would take them with the default action. With
  // --tensor-parallel or --device-map only rank 0 reads the pipe; it releases the other ranks as it stops.
  if (pipe(g_stop_pipe) != 0) throw Error(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  struct sigaction stop {};
  stop.sa_handler = on_stop_signal;
  stop.sa_flags = SA_RESTART;
  sigemptyset(&stop.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaction(sig, &stop, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not the end of the server

  const ModelConfig cfg = load_hf_config(o.model);
  const int64_t context = cfg.max_position_embeddings;
  const int64_t max_len = o.max_len > 0 ? o.max_len : std::min<int64_t>(context, 4096);
  if (max_len > context)
    throw Error(fmt::format("--max-len {} passes the model's max_position_embeddings {}", max_len, context),
                {.key = "--max-len"});
  const auto tok = data::load_model_tokenizer(o.model, cfg.vocab_size, true);
  const infer::ChatPrompt chat = infer::ChatPrompt::of_model(o.model, *tok, o.chat_format, "--chat-format");
  // --device-map or --tensor-parallel: every rank holds its part of the model (a run of layers, or
  // a slice of every layer); rank 0 serves HTTP and schedules, and the other ranks follow its
  // forwards (Generator::follow).
  comm::Communicator& w = world();
  const ModelSplit split = split_model(o.split, cfg, held, "serve", w.rank() == 0);
  const std::string& command = split.command;
  infer::ParamStore params(cfg, DType::F32, split.keep, split.split);
  infer::load_inference_weights({.model = o.model, .adapter = o.adapter, .load_in_4bit = o.load_in_4bit,
                                .load_in_4bit_role = "--load-in-4bit", .dtype = dtype, .q8_0 = held.q8_0,
                                .device = device},
                                cfg, params,
                                [&](const std::string& line) { std::fprintf(stderr, "%s: %s\n", command.c_str(), line.c_str()); });
  infer::Generator gen(cfg, params.compute_weights(), max_len, o.max_batch, split.pipeline, split.tp,
                       kv_cache_options(o.kv_cache, dtype));
  const bool over_ranks = split.active() && w.size() > 1;
  if (over_ranks && w.rank() != 0) {
    gen.follow();  // until rank 0 shuts down
    return;
  }
  if (over_ranks) {
    gen.lead();
    std::fprintf(stderr, "serve: %s over %d ranks (this one serves HTTP)\n",
                 split.split.active() ? "tensor parallel" : "device map", w.size());
  }
  infer::Scheduler scheduler(gen, *tok,
                             o.stop_token_ids_given ? infer::parse_stop_token_ids(o.stop_token_ids, cfg.vocab_size)
                                                    : infer::stop_token_ids(cfg, *tok, &chat, o.model),
                             o.prefill_chunk);

  infer::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.model_path = o.model;
  so.model_id = o.name;
  if (so.model_id.empty()) {
    std::filesystem::path p(o.model);
    so.model_id = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
  }
  so.max_len = max_len;
  so.vocab_size = cfg.vocab_size;
  so.max_connections = o.max_connections;
  so.request_timeout = std::chrono::milliseconds(int64_t(o.request_timeout * 1000));
  so.max_body = max_body;
  infer::Server server(scheduler, *tok, chat, so);
  const int port = [&] {
    try {
      return server.bind();
    } catch (Error& e) {
      e.set_key(o.port == 0 ? "--host" : "--port");
      throw;
    }
  }();
  const infer::Generator::KvCacheStats kv = gen.kv_cache_stats();
  std::fprintf(stderr,
               "serve: model '%s' (chat format %s, %s), up to %lld requests at a time of up to %lld tokens (KV "
               "cache: blocks of %lld positions, %s each, up to %lld = %s%s)\nserve: listening on http://%s:%d\n",
               so.model_id.c_str(), data::chat_format_name(chat.format), held.name(), (long long)o.max_batch,
               (long long)max_len, (long long)kv.block_size, format_bytes(kv.bytes_per_block).c_str(),
               (long long)kv.capacity, format_bytes(kv.capacity * kv.bytes_per_block).c_str(),
               over_ranks ? " per rank" : "", o.host.c_str(), port);

  std::atomic<bool> listen_ended{false};
  std::thread on_signal([&] {
    char sig = 0;
    while (read(g_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (listen_ended) return;  // woken by main below: the server has stopped already
    std::fprintf(stderr, "serve: %s: shutting down\n",
                 sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGUSR1 (shardlm launch's stop)");
    scheduler.shutdown();  // waiting and running requests end (503), so handler threads return
    server.stop();
  });
  server.listen();
  listen_ended = true;
  on_stop_signal(0);  // wakes the thread if no signal has (it then returns)
  on_signal.join();
  scheduler.shutdown();
  gen.stop_followers();  // the scheduler's thread has ended: no forward runs any more
  std::fprintf(stderr, "serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve a model over HTTP with OpenAI's completions and chat completions API (continuous batching)");
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Hugging Face model directory (dense, or bitsandbytes NF4)")->required();
  cmd->add_option("--adapter", o->adapter,
                  "A PEFT LoRA adapter directory for --model: merged in memory into the loaded f32 weights "
                  "(before any --dtype bf16 rounding)");
  cmd->add_option("--dtype", o->dtype, kGenerationDtypeHelp)->capture_default_str();
  cmd->add_option("--device", o->device, kGenerationDeviceHelp)->capture_default_str();
  CLI::Option* stop_ids = cmd->add_option(
      "--stop-token-ids", o->stop_token_ids,
      "Token ids that end every completion, separated by commas, replacing the default set (the tokenizer's EOS, "
      "config.json's and generation_config.json's eos_token_id, the chat format's end-of-turn tokens); none: no "
      "stop token");
  cmd->add_flag("--load-in-4bit", o->load_in_4bit,
                "Quantize the base's decoder Linear weights to NF4 (as QLoRA training does) and serve their "
                "dequantized values");
  cmd->add_option("--host", o->host, "Address to listen on (0.0.0.0: every interface)")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on; 0 = any free port (printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--max-batch", o->max_batch,
                  "Requests decoded together; more wait for a free slot")
      ->check(CLI::Range(int64_t(1), kMaxBatch))
      ->capture_default_str();
  add_kv_cache_flags(cmd, o->kv_cache);
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "Prompt tokens prefilled per step at most, beside the running requests' next tokens: a long "
                  "prompt delays the others' next token by one chunk's compute; 0 = whole prompts at once")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30))
      ->capture_default_str();
  cmd->add_option("--max-connections", o->max_connections,
                  "Connections open at once (each holds a handler thread, and a waiting or running request "
                  "holds its connection); more are answered 503")
      ->check(CLI::Range(1, kMaxConnections))
      ->capture_default_str();
  cmd->add_option("--request-timeout", o->request_timeout,
                  "Seconds a client has to send a whole request (line, headers and body); slower ones are cut off")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--max-body", o->max_body,
                  "Largest request body (e.g. 4MiB, 1MB, 65536); a larger one is refused (413) unread")
      ->capture_default_str();
  cmd->add_option("--max-len", o->max_len,
                  "Positions per request, prompt + max_tokens (default: max_position_embeddings, at most 4096)")
      ->check(CLI::PositiveNumber);
  add_model_split_flags(cmd, o->split, "serve");
  cmd->add_option("--name", o->name, "The model id clients name (default: the --model directory's name)");
  cmd->add_option("--chat-format", o->chat_format,
                  "For /v1/chat/completions: auto (from tokenizer_config.json's chat_template, else the "
                  "tokenizer's special tokens), llama3, llama2, chatml or mistral")
      ->capture_default_str();
  cmd->footer(
      "Endpoints: POST /v1/completions, POST /v1/chat/completions (\"stream\": true for server-sent events),\n"
      "GET /v1/models, GET /health. Completions take \"logprobs\" (0-20) and \"echo\" (\"max_tokens\": 0 scores the\n"
      "prompt: lm-eval-harness's local-completions loglikelihood tasks), chat \"logprobs\" and \"top_logprobs\".\n"
      "SIGINT or SIGTERM shuts down (requests in flight fail with 503).\n"
      "Examples:\n"
      "  shardlm serve --model runs/demo/trained --port 8000\n"
      "  shardlm serve --model models/llama3-8b-instruct --max-batch 16 --max-len 2048 --dtype bf16\n"
      "  shardlm serve --model models/llama2-7b --load-in-4bit --adapter runs/qlora/adapter\n"
      "  shardlm launch --nproc-per-node 2 -- serve --model models/llama3-8b --tensor-parallel 2\n"
      "  shardlm launch --nproc-per-node 2 -- serve --model models/llama2-13b --device-map balanced\n"
      "  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 32}'\n"
      "docs/serving.md: the request fields, the responses, and what continuous batching does.");
  cmd->callback([o, stop_ids] {
    o->stop_token_ids_given = stop_ids->count() > 0;
    check_model_split_flags(o->split);
    run_serve(*o);
  });
}

}  // namespace shardlm::cli
