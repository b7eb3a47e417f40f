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

struct ErrorContext {
  std::string file{};    // a path
  int64_t line = -1;   // 1-based line in `file`
  std::string key{};     // a config key, JSON field or command-line option
  std::string tensor{};  // a tensor name (Hugging Face naming)
  int rank = -1;       // the rank that failed
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

 private:
  void render();
  std::string message_;
  ErrorContext context_;
  std::string text_;
};

}  // namespace shardlm

// SHARDLM_CHECK(cond, "fmt {}", args...): throw Error with the formatted message when cond is false.
#define SHARDLM_CHECK(cond, ...)                                  \
  do {                                                            \
    if (!(cond)) throw ::shardlm::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)
