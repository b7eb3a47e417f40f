// `shardlm serve`: an OpenAI-compatible HTTP server over one Generator, with continuous batching.
//
// Threads. HTTP handler threads (cpp-httplib's pool) parse and check a request, tokenize it and
// submit it to the Scheduler, then wait on its Ticket (or stream from it as server-sent events).
// One scheduler thread owns the Generator: between steps it admits waiting requests into free
// slots, then runs one step of every running request together (a Batch, infer/generator.h: the
// scheduling `shardlm generate` runs): the next token of those decoding, and prefill chunks of
// those just admitted (at most --prefill-chunk prompt tokens per step, so a long prompt does not
// stall the streams already running), and hands each request its tokens. A request's tokens
// depend only on its prompt and options, never on the requests it shares the batch with (nor on
// preemptions when the KV cache runs out): at temperature 0 the server gives what `generate` gives.
//
// Endpoints (docs/serving.md): POST /v1/completions, POST /v1/chat/completions (both with
// "stream": true, and "logprobs"; completions also "echo", token-id prompts and batches of prompts:
// each prompt of a batch is a request of its own to the Scheduler), GET /v1/models, GET /health.
// Logprobs are computed by the scheduler (Batch: raw log_softmax, infer/generator.h) and named by
// the handler thread (the text each token adds, data/stream_decoder.h). A bad request is HTTP 400 with OpenAI's error
// object naming the field: {"error": {"message", "type": "invalid_request_error", "param"}}.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/tokenizer.h"
#include "infer/generator.h"
#include "infer/requests.h"

namespace shardlm::infer {

// What the scheduler needs of one request.
struct Job {
  Request req;                    // prompt tokens, sampling options (max_new_tokens included), logprobs
  std::vector<std::string> stop;  // stop strings (not part of the text)
  bool stream = false;            // hand out text pieces as they settle
};

// What a request's waiter receives, in order: with streaming and prompt logprobs first a Text event
// carrying them (`prompt`), then Text pieces (streaming only), then Done or Failed.
struct Event {
  enum class Kind { Text, Done, Failed } kind = Kind::Done;
  std::string text;                      // Text: a piece; Done: the whole completion
  FinishReason finish = FinishReason::Length;  // Done
  std::vector<int32_t> tokens;           // Done: the new tokens (usage)
  int status = 500;                      // Failed: the HTTP status (503 while shutting down)
  // With Request::logprobs >= 0: Text (streaming), the tokens that came since the last event (one
  // event per token, its piece of text possibly empty); Done (not streaming), every new token's.
  std::vector<TokenLogprobs> logprobs;
  bool prompt = false;                   // Text: the prompt's logprobs (prompt_logprobs), no text
  std::vector<TokenLogprobs> prompt_logprobs;  // this Text event's, or Done's when not streaming
};

// One submitted request's queue of events, shared by its waiter and the scheduler.
class Ticket {
 public:
  // The next event, waiting for it; nullopt after `timeout` without one.
  std::optional<Event> next(std::chrono::milliseconds timeout);
  Event next();
  // The client is gone: the scheduler ends the request at its next token.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  void push(Event e);  // the scheduler's side

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

class Scheduler {
 public:
  // gen and tok must outlive the Scheduler, and nothing else may use gen while it runs: its thread
  // starts here. stop_ids: the tokens that end a completion (stop_token_ids); prefill_chunk: the
  // prompt tokens one step prefills at most (Batch).
  Scheduler(Generator& gen, const data::Tokenizer& tok, std::vector<int32_t> stop_ids,
            int64_t prefill_chunk = kDefaultPrefillChunk);
  ~Scheduler() { shutdown(); }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (thread-safe). Its prompt must fit the Generator's max_len (the server checks
  // that first); after shutdown() the ticket fails at once (503).
  std::shared_ptr<Ticket> submit(Job job);
  // Ends the scheduler thread: requests waiting or running fail (503, "the server is shutting
  // down"). Idempotent.
  void shutdown();

  int64_t running() const { return running_; }
  int64_t waiting() const { return waiting_count_; }
  // The KV cache as the last step left it, and the preemptions since start-up (thread-safe).
  struct KvCacheUse {
    Generator::KvCacheStats cache;
    int64_t preemptions = 0;
  };
  KvCacheUse kv_cache() const;

 private:
  struct Pending {
    size_t id;
    Job job;
    std::shared_ptr<Ticket> ticket;
  };
  void loop();

  Generator& gen_;
  const data::Tokenizer& tok_;
  std::vector<int32_t> stop_ids_;
  int64_t prefill_chunk_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> waiting_;  // under mu_
  bool stopping_ = false;        // under mu_
  size_t next_id_ = 0;           // under mu_
  std::atomic<int64_t> running_{0}, waiting_count_{0};
  const Generator::KvCacheStats kv_;  // its fixed sizes
  std::atomic<int64_t> kv_in_use_{0}, kv_made_{0}, preemptions_{0};
  std::thread thread_;
};

// Limits that keep one client (or a few thousand) from stalling the server (issue 30): each open
// connection holds a handler thread, so connections are counted and, past max_connections,
// answered 503 at once; a request must arrive whole within request_timeout (a client dribbling
// its headers is cut off, not waited on); a body past max_body is refused with 413 as soon as it
// is seen to be (Content-Length, or the chunks so far), without reading the rest.
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;         // 0: any free port (bind() says which)
  std::string model_id;    // what /v1/models lists and requests may name
  std::string model_path;  // --model as given: requests may name it too
  int64_t max_len = 0;     // the Generator's: prompt + max_tokens must fit
  int64_t vocab_size = 0;  // the model's: a prompt of token ids must lie in [0, vocab_size) (0: the tokenizer's)
  int max_connections = 128;                      // open at once; handler threads
  std::chrono::milliseconds request_timeout{10000};  // to send a request line, headers and body
  uint64_t max_body = uint64_t(4) << 20;          // bytes of a request body
  // On stop(): how long requests in flight have to be answered (503) before every connection
  // still open is shut.
  std::chrono::milliseconds shutdown_grace{2000};
};

// The HTTP side. Holds the scheduler, tokenizer and chat prompt by reference (they must outlive it).
class Server {
 public:
  Server(Scheduler& scheduler, const data::Tokenizer& tok, const ChatPrompt& chat, ServerOptions opt);
  ~Server();
  // Binds host:port and returns the port; an Error (with no key: the caller names its option)
  // when it cannot.
  int bind();
  // Serves until stop().
  void listen();
  // Stops listening and returns once listen() has ended or was never entered (thread-safe):
  // after shutdown_grace, connections still open (a client that reads or sends slowly) are shut.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;  // cpp-httplib stays out of this header
};

}  // namespace shardlm::infer
