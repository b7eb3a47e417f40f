// The one exception type of shardlm.
//
// Every failure a user can cause (bad config key, corrupt file, wrong shape, bad dataset line,
// a dead rank) is reported as an Error whose what() is a single line naming the thing at fault:
//   "model/model.safetensors: tensor 'lm_head.weight': byte range [10, 20) outside file of 16 bytes"
// Context is added where it is known, often while the exception travels up:
//   try { parse(...); } catch (Error& e) { e.set_file(path); throw; }
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardlm {

// Whether an error follows from what every rank shares (the configuration, the plan made from it,
// the ranks' placement), so that every rank of a job meets it at once, or is this rank's own (its
// files, its memory, a peer that stopped answering). A job prints an every-rank error once, from
// rank 0 (Communicator::abort).
enum class ErrorScope { this_rank, every_rank };

struct ErrorContext {
  std::string file{};    // a path
  int64_t line = -1;   // 1-based line in `file`
  std::string key{};     // a config key, JSON field or command-line option
  std::string tensor{};  // a tensor name (Hugging Face naming)
  int rank = -1;       // the rank that failed
  ErrorScope scope = ErrorScope::this_rank;
};

class Error : public std::exception {
 public:
  explicit Error(std::string message, ErrorContext context = {});

  const char* what() const noexcept override { return text_.c_str(); }
  const std::string& message() const { return message_; }
  const ErrorContext& context() const { return context_; }

  // Setters keep context that is already present: the innermost frame knows best.
  Error& set_file(std::string file);
  Error& set_line(int64_t line);
  Error& set_key(std::string key);
  Error& set_tensor(std::string tensor);
  Error& set_rank(int rank);
  Error& set_scope(ErrorScope scope);

 private:
  void render();
  std::string message_;
  ErrorContext context_;
  std::string text_;
};

// f(), with an Error it throws marked as one every rank meets: for the steps that read or decide
// only what every rank shares (loading the configuration, planning from it).
template <class F>
auto on_every_rank(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (Error& e) {
    e.set_scope(ErrorScope::every_rank);
    throw;
  }
}

}  // namespace shardlm

// SHARDLM_CHECK(cond, "fmt {}", args...): throw Error with the formatted message when cond is false.
#define SHARDLM_CHECK(cond, ...)                                  \
  do {                                                            \
    if (!(cond)) throw ::shardlm::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)
