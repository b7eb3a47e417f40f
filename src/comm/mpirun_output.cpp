#include "comm/mpirun_output.h"

#include <algorithm>

namespace shardlm::comm {

namespace {
constexpr std::string_view kErrorPrefix = "shardlm: error:";
constexpr std::string_view kAbortNotice = "MPI_ABORT was invoked";
constexpr size_t kMinRule = 20;              // Open MPI's rules are 74 dashes
constexpr size_t kMaxNotice = size_t(64) << 10;  // a "notice" this long is not one: let it through

// A line (its '\n' included) of dashes only, long enough to be one of Open MPI's rules.
bool is_rule(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  return line.size() >= kMinRule && std::all_of(line.begin(), line.end(), [](char c) { return c == '-'; });
}

// The notice's first paragraph on one line: "MPI_ABORT was invoked on rank 0 in communicator
// MPI_COMM_WORLD with errorcode 1."
std::string first_paragraph(std::string_view notice) {
  std::string out;
  size_t pos = notice.find('\n') + 1;  // past the opening rule
  while (pos < notice.size()) {
    const size_t nl = notice.find('\n', pos);
    std::string_view line = notice.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    if (line.empty() || is_rule(line)) break;
    if (!out.empty()) out += ' ';
    out += line;
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  return out;
}
}  // namespace

void MpirunStderrFilter::pass(std::string_view bytes) {
  if (!bytes.empty()) write_(bytes);
}

void MpirunStderrFilter::feed(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t nl = bytes.find('\n', i);
    switch (state_) {
      case State::kLineStart:
        head_.clear();
        state_ = bytes[i] == '-' ? State::kMaybeRule : State::kMidLine;
        break;
      case State::kMidLine: {
        // Through at once, up to the end of the line: a progress bar redraws a line with '\r'.
        const size_t end = nl == std::string_view::npos ? bytes.size() : nl + 1;
        const std::string_view part = bytes.substr(i, end - i);
        if (head_.size() < kErrorPrefix.size()) {
          head_ += part.substr(0, kErrorPrefix.size() - head_.size());
          if (head_ == kErrorPrefix) saw_shardlm_error_ = true;
        }
        pass(part);
        i = end;
        if (nl != std::string_view::npos) state_ = State::kLineStart;
        break;
      }
      case State::kMaybeRule: {
        // Dashes are held until the line shows whether it is a rule; anything else lets it go.
        while (i < bytes.size() && bytes[i] == '-') line_ += bytes[i++];
        if (i == bytes.size()) break;
        if (bytes[i] == '\n' && is_rule(line_)) {
          notice_ = line_ + '\n';
          line_.clear();
          ++i;
          state_ = State::kInNotice;
        } else {
          pass(line_);
          head_ = line_.substr(0, kErrorPrefix.size());
          line_.clear();
          state_ = State::kMidLine;
        }
        break;
      }
      case State::kInNotice: {
        const size_t end = nl == std::string_view::npos ? bytes.size() : nl + 1;
        line_.append(bytes.substr(i, end - i));
        i = end;
        if (nl != std::string_view::npos) {
          notice_ += line_;
          const bool closing = is_rule(line_);
          line_.clear();
          if (closing) end_notice();
        }
        if (state_ == State::kInNotice && notice_.size() + line_.size() > kMaxNotice) {
          pass(notice_);
          pass(line_);
          // Mid-line if the held line was unfinished (it began inside the notice: not an error line).
          state_ = line_.empty() ? State::kLineStart : State::kMidLine;
          head_.assign(kErrorPrefix.size(), '-');
          notice_.clear();
          line_.clear();
        }
        break;
      }
    }
  }
}

void MpirunStderrFilter::end_notice() {
  const size_t body = notice_.find('\n') + 1;
  const bool abort_notice = notice_.compare(body, kAbortNotice.size(), kAbortNotice) == 0;
  if (!abort_notice) {
    pass(notice_);
  } else if (!saw_shardlm_error_) {
    pass("shardlm launch: " + first_paragraph(notice_) + " (no error message came before it)\n");
  }
  notice_.clear();
  state_ = State::kLineStart;
}

void MpirunStderrFilter::finish() {
  if (state_ == State::kMaybeRule) pass(line_);
  if (state_ == State::kInNotice) {
    pass(notice_);
    pass(line_);
  }
  notice_.clear();
  line_.clear();
  state_ = State::kLineStart;
}

}  // namespace shardlm::comm
