#include "infer/server.h"

#include <dlfcn.h>
#include <httplib.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <ctime>
#include <map>
#include <random>
#include <unordered_map>

#include "infer/tcp_bytes.h"
#include "io/json_parse.h"

// ---- the sockets cpp-httplib accepts --------------------------------------------------------------
//
// cpp-httplib 0.11 (Debian 12's) serves each connection on a thread of its pool until the client
// leaves, with a timeout per read only, and hands the pool a closure that hides the socket. Cutting
// off a client that dribbles its headers, or refusing a connection past the limit, needs the
// socket: this definition of accept() takes the place of libc's for the library (the executable's
// symbols come first in the dynamic linker's lookup) and notes the socket it returns on the thread
// that runs Server::listen(), where the pool's enqueue() is called right after.
namespace {
thread_local bool t_note_accepts = false;
thread_local int t_accepted = -1;
}  // namespace

extern "C" int accept(int fd, sockaddr* __restrict addr, socklen_t* __restrict len) {
  using Accept = int (*)(int, sockaddr*, socklen_t*);
  static const Accept real = reinterpret_cast<Accept>(dlsym(RTLD_NEXT, "accept"));
  const int s = real(fd, addr, len);
  if (t_note_accepts) t_accepted = s;
  return s;
}

namespace shardlm::infer {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// ---- Ticket ---------------------------------------------------------------------------------------

void Ticket::push(Event e) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

std::optional<Event> Ticket::next(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

Event Ticket::next() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !events_.empty(); });
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

// ---- Scheduler ------------------------------------------------------------------------------------

namespace {
Event text_event(std::string piece) {
  Event e;
  e.kind = Event::Kind::Text;
  e.text = std::move(piece);
  return e;
}
Event done_event(std::string text, FinishReason finish, std::vector<int32_t> tokens) {
  Event e;
  e.kind = Event::Kind::Done;
  e.text = std::move(text);
  e.finish = finish;
  e.tokens = std::move(tokens);
  return e;
}
Event failed(int status, std::string message) {
  Event e;
  e.kind = Event::Kind::Failed;
  e.status = status;
  e.text = std::move(message);
  return e;
}
}  // namespace

Scheduler::Scheduler(Generator& gen, const data::Tokenizer& tok, std::vector<int32_t> stop_ids,
                     int64_t prefill_chunk)
    : gen_(gen), tok_(tok), stop_ids_(std::move(stop_ids)), prefill_chunk_(prefill_chunk), kv_(gen.kv_cache_stats()) {
  SHARDLM_CHECK(prefill_chunk >= 0, "the prefill chunk must be >= 0 tokens, got {}", prefill_chunk);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::KvCacheUse Scheduler::kv_cache() const {
  KvCacheUse u{kv_, preemptions_};
  u.cache.in_use = kv_in_use_;
  u.cache.made = kv_made_;
  return u;
}

std::shared_ptr<Ticket> Scheduler::submit(Job job) {
  auto ticket = std::make_shared<Ticket>();
  {
    std::lock_guard lk(mu_);
    if (stopping_) {
      ticket->push(failed(503, "the server is shutting down"));
      return ticket;
    }
    waiting_.push_back({next_id_++, std::move(job), ticket});
    ++waiting_count_;
  }
  cv_.notify_all();
  return ticket;
}

void Scheduler::shutdown() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::loop() {
  // A running request: its ticket and its text as tokens arrive (stop strings, streamed pieces).
  struct Live {
    std::shared_ptr<Ticket> ticket;
    CompletionText text;
    bool stream;
    bool prompt_logprobs_due;  // streaming with prompt logprobs: their event goes before the first token's
  };
  Batch batch(gen_, stop_ids_, prefill_chunk_);
  std::unordered_map<size_t, Live> live;
  // Every admitted request that has had no answer yet is in `live` (also one a failed step had
  // already taken out of the batch), so none is left waiting.
  auto fail_running = [&](int status, const std::string& why) {
    batch.clear();
    for (auto& [id, l] : live) l.ticket->push(failed(status, why));
    live.clear();
    running_ = 0;
  };
  // The prompt's logprobs, once its prefill has computed them (before its first token or its end).
  auto send_prompt_logprobs = [](Live& l, const std::vector<TokenLogprobs>& lps) {
    if (!l.prompt_logprobs_due) return;
    l.prompt_logprobs_due = false;
    Event e = text_event({});
    e.prompt = true;
    e.prompt_logprobs = lps;
    l.ticket->push(std::move(e));
  };
  const Generator::TokenHook on_token = [&](size_t id, int32_t tok, const TokenLogprobs* lp) {
    Live& l = live.at(id);
    if (l.prompt_logprobs_due) send_prompt_logprobs(l, batch.progress(id)->prompt_logprobs);
    const bool stop = l.text.push(tok);
    if (l.stream) {
      std::string piece = l.text.take_delta(false);
      if (!piece.empty() || lp) {  // with logprobs, an event for every token
        Event e = text_event(std::move(piece));
        if (lp) e.logprobs.push_back(*lp);
        l.ticket->push(std::move(e));
      }
    }
    return stop || l.ticket->cancelled();  // a client that is gone ends its request now
  };
  const Batch::DoneHook on_done = [&](size_t id, Completion&& c) {
    Live& l = live.at(id);
    send_prompt_logprobs(l, c.prompt_logprobs);
    if (l.stream)
      if (std::string piece = l.text.take_delta(true); !piece.empty())
        l.ticket->push(text_event(std::move(piece)));
    Event done = done_event(l.text.text(), c.finish, std::move(c.tokens));
    if (!l.stream) {
      done.logprobs = std::move(c.logprobs);
      done.prompt_logprobs = std::move(c.prompt_logprobs);
    }
    l.ticket->push(std::move(done));
    live.erase(id);
    --running_;
  };
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !waiting_.empty() || !batch.empty(); });
      if (stopping_) break;
    }
    // Between steps, waiting requests join while slots are free (prefilled in the coming steps).
    for (;;) {
      Pending p;
      {
        std::lock_guard lk(mu_);
        if (waiting_.empty()) break;
        p = std::move(waiting_.front());
        waiting_.pop_front();
        --waiting_count_;
      }
      if (p.ticket->cancelled()) continue;
      Batch::Admit a;
      try {
        a = batch.admit(p.id, p.job.req);
      } catch (const std::exception& e) {
        p.ticket->push(failed(500, e.what()));
        continue;
      }
      if (a == Batch::Admit::Full) {  // back to the head of the queue until a slot is free
        std::lock_guard lk(mu_);
        waiting_.push_front(std::move(p));
        ++waiting_count_;
        break;
      }
      if (a == Batch::Admit::NothingToDo) {
        p.ticket->push(done_event({}, FinishReason::Length, {}));
        continue;
      }
      live.emplace(p.id, Live{p.ticket, CompletionText(tok_, p.job.req.prompt, p.job.stop), p.job.stream,
                              p.job.stream && p.job.req.prompt_logprobs});
      ++running_;
    }
    try {
      batch.step(on_token, on_done);
    } catch (const std::exception& e) {  // the running batch cannot go on; new requests still can
      fail_running(500, e.what());
    }
    const Generator::KvCacheStats kv = gen_.kv_cache_stats();
    kv_in_use_ = kv.in_use;
    kv_made_ = kv.made;
    preemptions_ = batch.preemptions();
  }
  fail_running(503, "the server is shutting down");
  std::lock_guard lk(mu_);
  for (Pending& p : waiting_) p.ticket->push(failed(503, "the server is shutting down"));
  waiting_.clear();
  waiting_count_ = 0;
}

// ---- connections ----------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

// Reads and drops what the client is still sending, for up to `for_how_long` or `most` bytes, so
// that closing the socket does not reset the connection before the client has read our answer.
void drain(int fd, std::chrono::milliseconds for_how_long, size_t most) {
  const Clock::time_point end = Clock::now() + for_how_long;
  char buf[16384];
  size_t got = 0;
  while (got < most) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, int(std::max<int64_t>(left, 0))) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) break;
    got += size_t(n);
  }
}

// The handler thread's connection (its id in Connections), set by the Pool around each connection.
thread_local uint64_t t_connection = 0;

// Every open connection, with the deadline of the request it is reading. A watchdog thread shuts
// the socket of one past its deadline, or past its byte budget (cpp-httplib reads a request line
// or a header of any length into memory), which ends cpp-httplib's blocked read at once. The
// budget counts the bytes the server has read, not those the kernel holds for it: a client sending
// a refused body fast filled the kernel's buffer past the budget before a slow handler thread had
// written its 413, and the cut lost the answer.
class Connections {
 public:
  explicit Connections(const ServerOptions& opt) : opt_(opt), watchdog_([this] { watch(); }) {}
  ~Connections() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    for (auto& [id, c] : open_)
      if (c.fd >= 0) ::close(c.fd);
  }

  // On the accept thread, for the socket just accepted: its id, with the deadline of its first
  // request armed; 0 when max_connections are open, after answering `busy` (503) and shutting the
  // socket.
  uint64_t admit(int fd, const std::string& busy) {
    std::lock_guard lk(mu_);
    if (open_.size() >= size_t(opt_.max_connections)) {
      ++refused_;
      if (fd >= 0) {
        drain(fd, std::chrono::milliseconds(0), 65536);  // the request, if it is here already
        (void)!send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        shutdown(fd, SHUT_RDWR);
      }
      return 0;
    }
    const uint64_t id = ++next_id_;
    // A descriptor of our own for the connection: shutting it down reaches this connection even
    // after cpp-httplib has closed its descriptor and the number went to another socket.
    Conn& c = open_[id];
    c.fd = fd >= 0 ? ::dup(fd) : -1;
    arm(c);
    return id;
  }
  void release(uint64_t id) {
    std::lock_guard lk(mu_);
    if (auto it = open_.find(id); it != open_.end()) {
      if (it->second.fd >= 0) ::close(it->second.fd);
      open_.erase(it);
    }
  }
  // The request is read; it runs (a completion may take minutes) without a deadline.
  void handling(uint64_t id) {
    std::lock_guard lk(mu_);
    if (auto it = open_.find(id); it != open_.end()) it->second.reading = false;
  }
  // Once the response is written, the connection is closed: its request was refused unread.
  void close_after_response(uint64_t id) {
    std::lock_guard lk(mu_);
    if (auto it = open_.find(id); it != open_.end()) it->second.close_after = true;
  }
  // The response is written: the connection closes if asked to, else waits for its next request,
  // whose deadline runs from now.
  void responded(uint64_t id) {
    int fd = -1;
    {
      std::lock_guard lk(mu_);
      auto it = open_.find(id);
      if (it == open_.end()) return;
      if (!it->second.close_after) {
        arm(it->second);
        return;
      }
      fd = it->second.fd;
      it->second.reading = false;  // the drain below is bounded itself; the watchdog's cut would reset it
    }
    if (fd < 0) return;
    // The answer goes out with a FIN; what the client still sends is read and dropped for a
    // moment (a lingering close, as nginx does), then cpp-httplib's next read sees the end.
    shutdown(fd, SHUT_WR);
    drain(fd, std::chrono::milliseconds(1000), size_t(8) << 20);
    shutdown(fd, SHUT_RDWR);
  }
  // Shuts every open connection (stop(): clients still sending or reading are not waited for).
  void shutdown_all() {
    std::lock_guard lk(mu_);
    for (auto& [id, c] : open_)
      if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);
  }
  struct Counts {
    int64_t open, refused, cut;
  };
  Counts counts() {
    std::lock_guard lk(mu_);
    return {int64_t(open_.size()), refused_, cut_};
  }

 private:
  struct Conn {
    int fd = -1;
    bool reading = true, close_after = false, cut = false;
    Clock::time_point deadline;
    uint64_t bytes_at_start = 0;
  };
  void arm(Conn& c) {  // under mu_
    c.reading = true;
    c.deadline = Clock::now() + opt_.request_timeout;
    c.bytes_at_start = c.fd >= 0 ? tcp_bytes_read(c.fd).value_or(0) : 0;
  }
  void watch() {
    const uint64_t budget = opt_.max_body + (uint64_t(1) << 20);  // the body, and 1 MiB of headers
    std::unique_lock lk(mu_);
    while (!stopping_) {
      cv_.wait_for(lk, std::chrono::milliseconds(50));
      const Clock::time_point now = Clock::now();
      for (auto& [id, c] : open_) {
        if (!c.reading || c.cut || c.fd < 0) continue;
        // (A count taken while bytes arrive may be a little low: saturate rather than wrap.)
        const uint64_t read = tcp_bytes_read(c.fd).value_or(0);
        if (now > c.deadline || (read > c.bytes_at_start && read - c.bytes_at_start > budget)) {
          shutdown(c.fd, SHUT_RDWR);
          c.cut = true;
          ++cut_;
        }
      }
    }
  }

  const ServerOptions& opt_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Conn> open_;  // under mu_
  uint64_t next_id_ = 0;           // under mu_
  int64_t refused_ = 0, cut_ = 0;  // under mu_
  bool stopping_ = false;          // under mu_
  std::thread watchdog_;
};

// cpp-httplib's task queue: a thread for each admitted connection (max_connections threads), so
// a connection never waits in a queue behind slow ones; past the limit, Connections::admit
// answers.
class Pool : public httplib::TaskQueue {
 public:
  Pool(Connections& conns, size_t threads, std::string busy) : conns_(conns), busy_(std::move(busy)) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  void enqueue(std::function<void()> fn) override {
    const uint64_t id = conns_.admit(std::exchange(t_accepted, -1), busy_);
    if (id == 0) {  // refused: the socket is shut, so cpp-httplib only closes it
      fn();
      return;
    }
    {
      std::lock_guard lk(mu_);
      jobs_.emplace_back(id, std::move(fn));
    }
    cv_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::pair<uint64_t, std::function<void()>> job;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      t_connection = job.first;
      job.second();
      t_connection = 0;
      conns_.release(job.first);
    }
  }
  Connections& conns_;
  std::string busy_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::function<void()>>> jobs_;  // under mu_
  bool stopping_ = false;                                        // under mu_
  std::vector<std::thread> threads_;
};

// cpp-httplib listens with a backlog of 5 connections: while its accept thread waits for a CPU, a
// burst of clients overflows it and each one past it waits a second for its SYN to be sent again,
// instead of being served or told 503 at once.
class HttpServer : public httplib::Server {
 public:
  void set_backlog(int n) { ::listen(svr_sock_, n); }  // on a listening socket: a new backlog
};

}  // namespace

// ---- requests -------------------------------------------------------------------------------------

namespace {

// A request the server refuses: HTTP 400 with OpenAI's error object; param names the field.
struct BadRequest {
  std::string message;
  std::string param;  // empty: null (the body as a whole)
};

// Compact JSON; invalid UTF-8 (a token cut mid-character) is replaced, not thrown on.
std::string dump(const ojson& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const std::string& message, const char* type, const std::string& param) {
  ojson e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  return dump(ojson{{"error", e}});
}

std::string body_limit_message(uint64_t max_body) {
  return fmt::format("the request body passes the server's limit of {} bytes (--max-body)", max_body);
}

// What a POST's headers alone show to be wrong with its body: an HTTP status and the reason, or
// {0, ""}. A chunked body's length is known only as it is read (Server::Impl::post counts it).
std::pair<int, std::string> body_refusal(const httplib::Request& req, uint64_t max_body) {
  if (req.method != "POST") return {0, ""};
  if (const std::string te = req.get_header_value("Transfer-Encoding"); !te.empty()) {
    if (strcasecmp(te.c_str(), "chunked") != 0)
      return {400, fmt::format("unsupported Transfer-Encoding '{}' (chunked is)", te.substr(0, 64))};
    return {0, ""};
  }
  if (!req.has_header("Content-Length"))
    return {411, "a POST needs a Content-Length (or Transfer-Encoding: chunked)"};
  const std::string text = req.get_header_value("Content-Length");
  uint64_t length = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), length);
  if (ec == std::errc::result_out_of_range) return {413, body_limit_message(max_body)};
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    return {400, fmt::format("malformed Content-Length '{}'", text.substr(0, 64))};
  if (length > max_body) return {413, body_limit_message(max_body)};
  return {0, ""};
}

// A request as the handler keeps it: the jobs (one per prompt) and how to answer.
struct Parsed {
  std::vector<Job> jobs;
  bool chat = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool echo = false;           // completions: the prompt's text (and logprobs) before the completion's
  int logprobs = -1;           // the most likely tokens given with each token's logprob; -1: no logprobs
};

struct Context {
  const data::Tokenizer& tok;
  const ChatPrompt& chat;
  const ServerOptions& opt;
};

// The most likely tokens a request may ask for with each token (vLLM's default bound).
constexpr int kMaxLogprobs = 20;

int logprobs_count(const json& rec, const char* key) {
  const json& v = rec.at(key);
  const std::optional<int64_t> n = v.is_boolean() ? std::nullopt : io::json_integer(v, 0, kMaxLogprobs);
  if (!n)
    throw BadRequest{fmt::format("{} must be an integer in [0, {}] (the most likely tokens given with each token), "
                                 "got {}",
                                 key, kMaxLogprobs, v.dump()),
                     key};
  return int(*n);
}

// The prompts of a completion request: a string, a list of token ids, or a list of either (a batch).
std::vector<std::vector<int32_t>> completion_prompts(const Context& cx, const json& rec) {
  const auto it = rec.find("prompt");
  if (it == rec.end()) throw BadRequest{"missing field 'prompt'", "prompt"};
  const int64_t V = cx.opt.vocab_size > 0 ? cx.opt.vocab_size : cx.tok.vocab_size();
  auto of_text = [&](const json& v) {
    // "" is a prompt too: generation from BOS alone (unconditional sampling).
    std::vector<int32_t> ids = cx.tok.encode_with(v.get<std::string>(), true, false);
    if (ids.empty())
      throw BadRequest{"an empty prompt needs a BOS token to start from, and this model's tokenizer adds none",
                       "prompt"};
    return ids;
  };
  auto of_ids = [&](const json& v) {  // taken as they are: no BOS added
    if (v.empty()) throw BadRequest{"a prompt of token ids must not be empty", "prompt"};
    std::vector<int32_t> ids;
    for (const json& t : v) {
      const std::optional<int64_t> id = io::json_integer(t, 0, V - 1);
      if (!id)
        throw BadRequest{fmt::format("a prompt's token ids must be integers in [0, {}), got {}", V, t.dump()), "prompt"};
      ids.push_back(int32_t(*id));
    }
    return ids;
  };
  const std::string shapes = "a string, a list of token ids, or a list of strings or of lists of token ids";
  if (it->is_string()) return {of_text(*it)};
  if (!it->is_array() || it->empty())
    throw BadRequest{fmt::format("field 'prompt' must be {}, got {}", shapes, it->is_array() ? "[]" : it->type_name()),
                     "prompt"};
  if ((*it)[0].is_number()) return {of_ids(*it)};
  std::vector<std::vector<int32_t>> prompts;
  for (const json& p : *it) {
    if (p.is_string()) prompts.push_back(of_text(p));
    else if (p.is_array()) prompts.push_back(of_ids(p));
    else throw BadRequest{fmt::format("field 'prompt' must be {}; an item is {}", shapes, p.type_name()), "prompt"};
  }
  return prompts;
}

Parsed parse_request(const Context& cx, const std::string& body, bool chat) {
  json rec;
  std::string key;
  try {
    rec = io::parse_json_noting_key(key, body);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    if (const size_t colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    // 406: a number past a double's range (1e400), the value of `key`.
    throw BadRequest{"malformed JSON: " + what, e.id == 406 ? key : ""};
  }
  if (!rec.is_object()) throw BadRequest{fmt::format("the body must be a JSON object, got {}", rec.type_name()), ""};
  // Fields with OpenAI's neutral values are accepted; what shardlm cannot do otherwise is refused by name.
  static const char* common[] = {"model",  "stream",   "stream_options",    "max_tokens",       "temperature",
                                 "top_p",  "top_k",    "repetition_penalty", "seed",            "stop",
                                 "n",      "user",     "presence_penalty",  "frequency_penalty", "logprobs"};
  static const char* chat_only[] = {"messages", "max_completion_tokens", "top_logprobs"};
  static const char* completion_only[] = {"prompt", "echo", "best_of", "suffix"};
  for (const auto& item : rec.items()) {
    const std::string& k = item.key();
    auto in = [&](const auto& list) {
      return std::find_if(std::begin(list), std::end(list), [&](const char* n) { return k == n; }) != std::end(list);
    };
    if (!in(common) && !(chat ? in(chat_only) : in(completion_only)))
      throw BadRequest{fmt::format("unknown field '{}'", k), k};
  }
  auto given = [&](const char* k) {
    const auto it = rec.find(k);
    return it != rec.end() && !it->is_null();
  };
  Parsed p;
  p.chat = chat;
  Job job;
  try {
    if (given("model")) {
      const json& it = rec["model"];
      if (!it.is_string()) throw BadRequest{"field 'model' must be a string", "model"};
      const std::string m = it.get<std::string>();
      if (m != cx.opt.model_id && m != cx.opt.model_path)
        throw BadRequest{fmt::format("the model '{}' is not served here (this server serves '{}')", m, cx.opt.model_id),
                         "model"};
    }
    if (given("stream")) {
      if (!rec["stream"].is_boolean()) throw BadRequest{"field 'stream' must be a boolean", "stream"};
      job.stream = rec["stream"].get<bool>();
    }
    if (given("stream_options")) {
      const json& it = rec["stream_options"];
      if (!it.is_object()) throw BadRequest{"field 'stream_options' must be an object", "stream_options"};
      if (!job.stream) throw BadRequest{"field 'stream_options' is only allowed with \"stream\": true", "stream_options"};
      for (const auto& item : it.items()) {
        if (item.key() != "include_usage")
          throw BadRequest{fmt::format("unknown field 'stream_options.{}'", item.key()), "stream_options"};
        if (!item.value().is_boolean())
          throw BadRequest{"field 'stream_options.include_usage' must be a boolean", "stream_options"};
        p.include_usage = item.value().get<bool>();
      }
    }
    if (json_number<int64_t>(rec, "n", 1) != 1) throw BadRequest{"only n = 1 is supported", "n"};
    if (chat ? false : json_number<int64_t>(rec, "best_of", 1) != 1)
      throw BadRequest{"only best_of = 1 is supported", "best_of"};
    for (const char* k : {"presence_penalty", "frequency_penalty"})
      if (json_number<double>(rec, k, 0.0) != 0.0)
        throw BadRequest{fmt::format("{} is not supported (repetition_penalty is)", k), k};
    if (const auto it = rec.find("suffix"); it != rec.end() && !it->is_null() && *it != false)
      throw BadRequest{"suffix is not supported", "suffix"};
    if (given("user") && !rec["user"].is_string()) throw BadRequest{"field 'user' must be a string", "user"};

    // Logprobs: the completions API's logprobs is the number of most likely tokens (0 to 20); the chat
    // API's is a boolean, with top_logprobs that number.
    if (chat) {
      if (given("logprobs")) {
        if (!rec["logprobs"].is_boolean()) throw BadRequest{"field 'logprobs' must be a boolean", "logprobs"};
        if (rec["logprobs"].get<bool>()) p.logprobs = 0;
      }
      if (given("top_logprobs")) {
        if (p.logprobs < 0) throw BadRequest{"top_logprobs needs \"logprobs\": true", "top_logprobs"};
        p.logprobs = logprobs_count(rec, "top_logprobs");
      }
    } else {
      if (given("logprobs") && rec["logprobs"] != false) p.logprobs = logprobs_count(rec, "logprobs");
      if (given("echo")) {
        if (!rec["echo"].is_boolean()) throw BadRequest{"field 'echo' must be a boolean", "echo"};
        p.echo = rec["echo"].get<bool>();
      }
    }

    // The prompts.
    std::vector<std::vector<int32_t>> prompts;
    if (chat) {
      if (!rec.contains("messages")) throw BadRequest{"missing field 'messages'", "messages"};
      try {
        prompts.push_back(cx.chat.render(cx.tok, data::chat_messages_of(rec)).ids);
      } catch (const Error& e) {
        throw BadRequest{e.message(), "messages"};
      }
    } else {
      prompts = completion_prompts(cx, rec);
    }
    if (job.stream && prompts.size() > 1)
      throw BadRequest{"a streamed completion takes one prompt (a batch of prompts is answered unstreamed)", "prompt"};
    const char* prompt_field = chat ? "messages" : "prompt";

    // Sampling: OpenAI's defaults (temperature 1, top_p 1), top_k and repetition_penalty as vLLM
    // takes them. No seed: a fresh one, as OpenAI samples differently each time.
    thread_local std::mt19937_64 draw{std::random_device{}()};
    const SamplingOptions openai{.max_new_tokens = 0, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                                 .repetition_penalty = 1.0f, .seed = draw()};
    job.req.opt = read_sampling(rec, openai);
    job.req.logprobs = p.logprobs;
    job.req.prompt_logprobs = p.echo && p.logprobs >= 0;
    job.stop = json_stop(rec, {});
    const char* max_key = chat && rec.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    const int64_t L = cx.opt.max_len;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Job& j = p.jobs.emplace_back(job);
      const int64_t P = int64_t(prompts[i].size());
      const std::string which = prompts.size() > 1 ? fmt::format("prompt {}", i) : "the prompt";
      // With echo, max_tokens may be 0: the prompt is only scored, and may fill --max-len.
      if (P > L || (P == L && !p.echo))
        throw BadRequest{fmt::format("{} is {} tokens, but the server's --max-len {} leaves no position for a new token",
                                     which, P, L),
                         prompt_field};
      // max_tokens defaults to 16 for completions (as OpenAI's) and to the rest of --max-len for chat.
      SamplingOptions& s = j.req.opt;
      s.max_new_tokens = json_number<int64_t>(rec, max_key, chat ? L - P : std::min<int64_t>(16, L - P));
      if (s.max_new_tokens < (p.echo ? 0 : 1))
        throw BadRequest{p.echo ? fmt::format("{} must be >= 0, got {}", max_key, s.max_new_tokens)
                                : fmt::format("{} must be >= 1 (0 only with \"echo\": true, to score the prompt), got {}",
                                              max_key, s.max_new_tokens),
                         max_key};
      if (P + s.max_new_tokens > L)
        throw BadRequest{fmt::format("{} {} with {} of {} tokens passes the server's --max-len {}: at most {}", max_key,
                                     s.max_new_tokens, which, P, L, L - P),
                         max_key};
      try {
        check_sampling(s);
      } catch (const Error& e) {
        throw BadRequest{e.message(), e.context().key == "max_new_tokens" ? std::string(max_key) : e.context().key};
      }
      j.req.prompt = std::move(prompts[i]);
    }
  } catch (const Error& e) {  // json_number, json_stop: the key is the field
    throw BadRequest{e.message(), e.context().key};
  }
  return p;
}

// Names the tokens of a logprobs answer as the client sees them: each by the text it adds to the
// text of the tokens before it (data::StreamDecoder::peek; a token that starts a character is named
// by its bytes), its alternatives likewise, with each token's offset in the choice's text
// (characters).
class LogprobNames {
 public:
  LogprobNames(const data::Tokenizer& tok, const std::vector<int32_t>& context) : tok_(tok), d_(tok, context) {}
  // The next token, with its logprobs (null: the first token of an echoed prompt, which has none).
  void add(int32_t token, const TokenLogprobs* lp) {
    const std::string raw = d_.peek(token), name = name_of(token, raw);
    tokens_.push_back(name);
    offsets_.push_back(chars_ + data::utf8_chars(d_.pending()));
    if (!lp) {
      logprobs_.push_back(nullptr);
      top_.push_back(nullptr);
      content_.push_back({{"token", name}, {"logprob", nullptr}, {"bytes", bytes(raw)}, {"top_logprobs", ojson::array()}});
    } else {
      // The legacy map: the most likely first (a name already there keeps the likelier), and the
      // token itself, as vLLM gives it; the chat list: the most likely only.
      ojson top = ojson::object(), top_list = ojson::array();
      for (const auto& [id, v] : lp->top) {
        const std::string r = id == token ? raw : d_.peek(id), n = name_of(id, r);
        if (!top.contains(n)) top[n] = v;
        top_list.push_back({{"token", n}, {"logprob", v}, {"bytes", bytes(r)}});
      }
      if (!top.contains(name)) top[name] = lp->logprob;
      logprobs_.push_back(lp->logprob);
      top_.push_back(std::move(top));
      content_.push_back({{"token", name}, {"logprob", lp->logprob}, {"bytes", bytes(raw)}, {"top_logprobs", top_list}});
    }
    chars_ += data::utf8_chars(d_.push(token));
  }
  // The tokens added since the last take, as the completions API gives them (legacy) or the chat API.
  ojson take(bool chat) {
    ojson out = chat ? ojson{{"content", std::move(content_)}}
                     : ojson{{"tokens", std::move(tokens_)}, {"token_logprobs", std::move(logprobs_)},
                             {"top_logprobs", std::move(top_)}, {"text_offset", std::move(offsets_)}};
    content_ = tokens_ = logprobs_ = top_ = offsets_ = ojson::array();
    return out;
  }

 private:
  // A token's text; for text that is not whole UTF-8 characters (a byte that starts or ends one)
  // its bytes as "bytes:\xe6\x97" (OpenAI's convention), so that such tokens keep distinct names
  // in JSON, where invalid UTF-8 would all become U+FFFD; for a token that decodes to nothing (a
  // special token), its vocabulary piece ("</s>").
  std::string name_of(int32_t id, const std::string& text) const {
    if (text.empty()) return id >= 0 && id < tok_.vocab_size() ? tok_.piece(id) : std::string("<unk>");
    if (valid_utf8(text)) return text;
    std::string out = "bytes:";
    for (unsigned char c : text) out += fmt::format("\\x{:02x}", c);
    return out;
  }
  static bool valid_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      const size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
      if (len == 0 || (len > 1 && c < 0xC2) || i + len > s.size()) return false;
      for (size_t k = 1; k < len; ++k)
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
      i += len;
    }
    return true;
  }
  static ojson bytes(const std::string& s) {
    ojson b = ojson::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
  }
  const data::Tokenizer& tok_;
  data::StreamDecoder d_;
  size_t chars_ = 0;  // of the text settled so far
  ojson tokens_ = ojson::array(), logprobs_ = ojson::array(), top_ = ojson::array(), offsets_ = ojson::array(),
        content_ = ojson::array();
};

}  // namespace

// ---- Server ---------------------------------------------------------------------------------------

struct Server::Impl {
  Scheduler& sched;
  Context cx;
  ServerOptions opt;
  Connections conns{opt};  // before http, which serves through them
  HttpServer http;
  std::time_t started = std::time(nullptr);
  std::atomic<uint64_t> counter{0};
  std::mutex mu;
  std::condition_variable cv;
  bool listening = false, ended = false;  // under mu

  Impl(Scheduler& s, const data::Tokenizer& tok, const ChatPrompt& chat, ServerOptions o)
      : sched(s), cx{tok, chat, opt}, opt(std::move(o)) {}

  void routes();
  // The body, read up to max_body, then complete(); a longer body is refused unread (413).
  void post(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read, bool chat);
  void complete(const std::string& body, httplib::Response& res, bool chat);
  // Answers `status` with OpenAI's error object and closes the connection once it is written:
  // for a request whose body is left unread.
  void refuse(httplib::Response& res, int status, const std::string& message);
};

namespace {

ojson usage_of(size_t prompt, size_t completion) {
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

// One streamed chunk: a choice carrying `text` (completions) or a delta (chat).
ojson chunk(const std::string& id, std::time_t created, const std::string& model, bool chat, const ojson& delta,
            const json& finish) {
  ojson choice = {{"index", 0}};
  if (chat) {
    choice["delta"] = delta;
    choice["logprobs"] = nullptr;
  } else {
    choice["text"] = delta.is_null() ? std::string() : delta.get<std::string>();
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish;
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", ojson::array({choice})}};
}

}  // namespace

void Server::Impl::refuse(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_header("Connection", "close");
  res.set_content(error_body(message, "invalid_request_error", ""), "application/json");
  conns.close_after_response(t_connection);
}

void Server::Impl::post(const httplib::Request&, httplib::Response& res, const httplib::ContentReader& read,
                        bool chat) {
  std::string body;
  bool too_large = false;
  const bool ok = read([&](const char* data, size_t n) {
    if (body.size() + n > opt.max_body) {
      too_large = true;
      return false;  // cpp-httplib stops reading
    }
    body.append(data, n);
    return true;
  });
  if (too_large) return refuse(res, 413, body_limit_message(opt.max_body));
  if (!ok) return refuse(res, 400, "the request body could not be read (malformed chunked encoding, or the client "
                                   "stopped sending)");
  conns.handling(t_connection);
  complete(body, res, chat);
}

void Server::Impl::complete(const std::string& body, httplib::Response& res, bool chat) {
  Parsed p;
  try {
    p = parse_request(cx, body, chat);
  } catch (const BadRequest& e) {
    res.status = 400;
    res.set_content(error_body(e.message, "invalid_request_error", e.param), "application/json");
    return;
  }
  const std::string id = fmt::format("{}-{:x}{:06x}", chat ? "chatcmpl" : "cmpl", uint64_t(started),
                                     counter.fetch_add(1));
  const std::time_t created = std::time(nullptr);
  const bool stream = p.jobs[0].stream, echo = p.echo;
  const int want_logprobs = p.logprobs;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<Ticket>> tickets;
  for (Job& j : p.jobs) {
    prompts.push_back(j.req.prompt);
    tickets.push_back(sched.submit(std::move(j)));
  }

  if (!stream) {
    ojson choices = ojson::array();
    size_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < tickets.size(); ++i) {
      Event e = tickets[i]->next();
      while (e.kind == Event::Kind::Text) e = tickets[i]->next();
      if (e.kind == Event::Kind::Failed) {
        for (size_t k = i + 1; k < tickets.size(); ++k) tickets[k]->cancel();
        res.status = e.status;
        res.set_content(error_body(e.text, "server_error", ""), "application/json");
        return;
      }
      const std::vector<int32_t>& prompt = prompts[i];
      ojson choice = {{"index", i}};
      const std::string text = echo ? cx.tok.decode(prompt) + e.text : e.text;
      if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
      else choice["text"] = text;
      choice["logprobs"] = nullptr;
      if (want_logprobs >= 0) {
        LogprobNames names(cx.tok, echo ? std::vector<int32_t>{} : prompt);
        if (echo)
          for (size_t t = 0; t < prompt.size(); ++t)
            names.add(prompt[t], t == 0 || e.prompt_logprobs.empty() ? nullptr : &e.prompt_logprobs[t - 1]);
        for (const TokenLogprobs& lp : e.logprobs) names.add(lp.token, &lp);
        choice["logprobs"] = names.take(chat);
      }
      choice["finish_reason"] = finish_reason_name(e.finish);
      choices.push_back(std::move(choice));
      prompt_tokens += prompt.size();
      completion_tokens += e.tokens.size();
    }
    const ojson body = {{"id", id},
                        {"object", chat ? "chat.completion" : "text_completion"},
                        {"created", created},
                        {"model", opt.model_id},
                        {"choices", std::move(choices)},
                        {"usage", usage_of(prompt_tokens, completion_tokens)}};
    res.set_content(dump(body), "application/json");
    return;
  }

  // Server-sent events: one "data: {chunk}" per piece of text (with logprobs, per token), the last
  // chunk with the finish_reason, then "data: [DONE]". The provider runs on this handler thread
  // after return.
  res.set_header("Cache-Control", "no-cache");
  auto first = std::make_shared<bool>(true);
  const std::string model = opt.model_id;
  const bool include_usage = p.include_usage;
  const std::shared_ptr<Ticket> ticket = tickets[0];
  const std::vector<int32_t> prompt = prompts[0];
  const size_t prompt_tokens = prompt.size();
  const data::Tokenizer& tok = cx.tok;
  // Names the streamed tokens (echo: the prompt's first), as the unstreamed answer does.
  std::shared_ptr<LogprobNames> names;
  if (want_logprobs >= 0) names = std::make_shared<LogprobNames>(tok, echo ? std::vector<int32_t>{} : prompt);
  auto echoed = std::make_shared<bool>(!echo);
  res.set_chunked_content_provider(
      "text/event-stream",
      [ticket, first, id, created, model, chat, prompt, prompt_tokens, include_usage, names, echoed,
       &tok](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& data) {
          const std::string event = "data: " + data + "\n\n";
          return sink.write(event.data(), event.size());
        };
        auto with_logprobs = [&](ojson c) {
          if (names) c["choices"][0]["logprobs"] = names->take(chat);
          return c;
        };
        if (*first && chat) {  // OpenAI's first chat chunk names the role
          *first = false;
          return send(dump(chunk(id, created, model, true, {{"role", "assistant"}, {"content", ""}}, nullptr)));
        }
        *first = false;
        std::optional<Event> e;
        while (!(e = ticket->next(std::chrono::milliseconds(500))))
          if (!sink.is_writable()) {  // the client left while its request waited or ran
            ticket->cancel();
            return false;
          }
        // echo: the prompt's text (and logprobs) first, in a chunk of its own.
        if (!*echoed && e->kind != Event::Kind::Failed) {
          *echoed = true;
          if (names)
            for (size_t t = 0; t < prompt.size(); ++t)
              names->add(prompt[t], t == 0 || e->prompt_logprobs.empty() ? nullptr : &e->prompt_logprobs[t - 1]);
          if (!send(dump(with_logprobs(chunk(id, created, model, chat, ojson(tok.decode(prompt)), nullptr))))) return false;
          if (e->prompt) return true;  // the prompt's event, answered
        }
        bool ok = true;
        switch (e->kind) {
          case Event::Kind::Text:
            if (names)
              for (const TokenLogprobs& lp : e->logprobs) names->add(lp.token, &lp);
            return send(dump(with_logprobs(
                chunk(id, created, model, chat, chat ? ojson{{"content", e->text}} : ojson(e->text), nullptr))));
          case Event::Kind::Done:
            ok = send(dump(chunk(id, created, model, chat, chat ? ojson::object() : ojson(""),
                                 finish_reason_name(e->finish))));
            if (ok && include_usage) {
              ojson u = {{"id", id},
                         {"object", chat ? "chat.completion.chunk" : "text_completion"},
                         {"created", created},
                         {"model", model},
                         {"choices", ojson::array()},
                         {"usage", usage_of(prompt_tokens, e->tokens.size())}};
              ok = send(dump(u));
            }
            break;
          case Event::Kind::Failed:
            ok = send(error_body(e->text, "server_error", ""));
            break;
        }
        if (ok) ok = send("[DONE]");
        if (ok) sink.done();
        return ok;
      },
      [ticket](bool success) {
        if (!success) ticket->cancel();
      });
}

namespace {
// /health's view of the KV cache: blocks and bytes in use and held (made), the limit, preemptions.
ojson kv_cache_json(const Scheduler::KvCacheUse& u) {
  const Generator::KvCacheStats& k = u.cache;
  return {{"block_size", k.block_size},        {"blocks_in_use", k.in_use},
          {"blocks_made", k.made},             {"blocks_capacity", k.capacity},
          {"bytes_in_use", k.in_use * k.bytes_per_block}, {"bytes_made", k.made * k.bytes_per_block},
          {"bytes_capacity", k.capacity * k.bytes_per_block}, {"preemptions", u.preemptions}};
}
}  // namespace

void Server::Impl::routes() {
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    conns.handling(t_connection);
    const Connections::Counts c = conns.counts();
    const ojson body = {{"status", "ok"},
                        {"model", opt.model_id},
                        {"running", sched.running()},
                        {"waiting", sched.waiting()},
                        {"connections", c.open},
                        {"connections_refused", c.refused},
                        {"connections_cut", c.cut},
                        {"kv_cache", kv_cache_json(sched.kv_cache())}};
    res.set_content(dump(body), "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    conns.handling(t_connection);
    const ojson model = {{"id", opt.model_id}, {"object", "model"}, {"created", started}, {"owned_by", "shardlm"},
                         {"max_model_len", opt.max_len}};
    res.set_content(dump(ojson{{"object", "list"}, {"data", ojson::array({model})}}), "application/json");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& read) { post(req, res, read, false); });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& read) { post(req, res, read, true); });
  // Before any body is read: cpp-httplib would read a POST without Content-Length until the client
  // closes (an HTTP/1.0 client waits for the answer instead: neither moves), and skips a body past
  // the limit by reading it whole.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const auto [status, why] = body_refusal(req, opt.max_body);
    if (status == 0) return httplib::Server::HandlerResponse::Unhandled;
    refuse(res, status, why);
    return httplib::Server::HandlerResponse::Handled;
  });
  // curl asks before it sends a body of over 1 MB (Expect: 100-continue): a refusal then comes
  // before the body.
  http.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    const auto [status, why] = body_refusal(req, opt.max_body);
    if (status == 0) return 100;
    refuse(res, status, why);
    return status;
  });
  http.set_logger([this](const httplib::Request&, const httplib::Response&) { conns.responded(t_connection); });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string what = res.status == 404 ? fmt::format("no endpoint {} {}", req.method, req.path)
                                               : fmt::format("HTTP {}", res.status);
    res.set_content(error_body(what, "invalid_request_error", ""), "application/json");
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(error_body(what, "server_error", ""), "application/json");
  });
}

Server::Server(Scheduler& scheduler, const data::Tokenizer& tok, const ChatPrompt& chat, ServerOptions opt)
    : impl_(std::make_unique<Impl>(scheduler, tok, chat, std::move(opt))) {
  Impl& im = *impl_;
  const std::string busy = error_body(
      fmt::format("the server has {} connections open, its limit (--max-connections); try again", im.opt.max_connections),
      "server_error", "");
  const std::string busy_response = fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: "
      "1\r\nConnection: close\r\n\r\n{}",
      busy.size(), busy);
  im.http.new_task_queue = [&im, busy_response] {
    return new Pool(im.conns, size_t(im.opt.max_connections), busy_response);
  };
  im.http.set_payload_max_length(im.opt.max_body);
  // cpp-httplib's default sets SO_REUSEPORT, with which a second server on the same port starts
  // and silently takes half the connections; SO_REUSEADDR alone still allows a quick restart.
  impl_->http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  impl_->routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  const ServerOptions& o = impl_->opt;
  int port = o.port;
  if (o.port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) throw Error(fmt::format("cannot bind to {} on any port", o.host));
  } else if (!impl_->http.bind_to_port(o.host, o.port)) {
    throw Error(fmt::format("cannot bind to {}:{} (in use, or not an address of this machine)", o.host, o.port));
  }
  impl_->http.set_backlog(std::max(impl_->opt.max_connections, 128));
  return port;
}

void Server::listen() {
  {
    std::lock_guard lk(impl_->mu);
    if (impl_->ended) return;  // stop() came first
    impl_->listening = true;
  }
  t_note_accepts = true;  // cpp-httplib accepts on this thread
  impl_->http.listen_after_bind();
  t_note_accepts = false;
  std::lock_guard lk(impl_->mu);
  impl_->listening = false;
  impl_->ended = true;
  impl_->cv.notify_all();
}

void Server::stop() {
  std::unique_lock lk(impl_->mu);
  if (!impl_->listening) {  // not yet listening, or done: listen() will return at once
    impl_->ended = true;
    return;
  }
  // listen() may not have set the socket running yet: ask until it has ended. It ends once every
  // connection's thread has: after the grace, the connections still open are shut.
  const auto cut_at = Clock::now() + impl_->opt.shutdown_grace;
  while (!impl_->ended) {
    impl_->http.stop();
    if (Clock::now() >= cut_at) impl_->conns.shutdown_all();
    impl_->cv.wait_for(lk, std::chrono::milliseconds(50));
  }
}

}  // namespace shardlm::infer
