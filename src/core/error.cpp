#include "core/error.h"

namespace shardlm {

Error::Error(std::string message, ErrorContext context)
    : message_(std::move(message)), context_(std::move(context)) {
  render();
}

void Error::render() {
  text_.clear();
  if (context_.rank >= 0) text_ += fmt::format("rank {}: ", context_.rank);
  if (!context_.file.empty()) {
    text_ += context_.file;
    if (context_.line >= 0) text_ += fmt::format(":{}", context_.line);
    text_ += ": ";
  }
  if (!context_.key.empty()) text_ += fmt::format("key '{}': ", context_.key);
  if (!context_.tensor.empty()) text_ += fmt::format("tensor '{}': ", context_.tensor);
  // One line, always: fold any newline a lower layer put into the message.
  for (char c : message_) text_ += (c == '\n' || c == '\r') ? ' ' : c;
}

Error& Error::set_file(std::string file) {
  if (context_.file.empty()) context_.file = std::move(file);
  render();
  return *this;
}
Error& Error::set_line(int64_t line) {
  if (context_.line < 0) context_.line = line;
  render();
  return *this;
}
Error& Error::set_key(std::string key) {
  if (context_.key.empty()) context_.key = std::move(key);
  render();
  return *this;
}
Error& Error::set_tensor(std::string tensor) {
  if (context_.tensor.empty()) context_.tensor = std::move(tensor);
  render();
  return *this;
}
Error& Error::set_scope(ErrorScope scope) {
  context_.scope = scope;
  return *this;
}
Error& Error::set_rank(int rank) {
  if (context_.rank < 0) context_.rank = rank;
  render();
  return *this;
}

}  // namespace shardlm
