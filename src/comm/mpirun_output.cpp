#include "comm/mpirun_output.h"

#include <algorithm>

namespace shardlm::comm {

namespace {
constexpr std::string_view kErrorPrefix = "shardlm: error:";
constexpr std::string_view kAbortNotice = "MPI_ABORT was invoked";
constexpr size_t kMinRule = 20;              // Open MPI's rules are 74 dashes
constexpr size_t kMaxNotice = size_t(64) << 10;  // a "notice" this long is not one: let it through
constexpr size_t kMaxHeldLine = 1024;

// mpirun's log line for a notice it could not unpack, as one sent by a rank that MPI_Abort is
// taking down: "[vm:27351] [[1577,0],0] ORTE_ERROR_LOG: Data unpack would read past end of buffer
// in file ../../../orte/util/show_help.c at line 501" ("Data unpack had inadequate space" and "Out
// of resource" the same way; one of these in about one 2- or 3-rank abort in ten here).
bool is_lost_notice(std::string_view line) {
  return line.starts_with('[') && line.find("ORTE_ERROR_LOG: ") != line.npos &&
         line.find("/orte/util/show_help.c at line ") != line.npos;
}

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

MpirunStderrFilter::MpirunStderrFilter(std::function<void(std::string_view)> write, std::vector<std::string> echoes)
    : write_(std::move(write)), echoes_(std::move(echoes)), echo_deferred_(echoes_.size(), false) {}

bool MpirunStderrFilter::begins_echo(std::string_view line) const {
  return std::any_of(echoes_.begin(), echoes_.end(), [&](const std::string& e) { return e.starts_with(line); });
}

int MpirunStderrFilter::echo_index(std::string_view line) const {
  for (size_t k = 0; k < echoes_.size(); ++k)
    if (echoes_[k] == line) return int(k);
  return -1;
}

void MpirunStderrFilter::pass(std::string_view bytes) {
  if (!bytes.empty()) write_(bytes);
}

void MpirunStderrFilter::pass_line_part(std::string_view part) {
  if (head_.size() < kErrorPrefix.size()) {
    head_ += part.substr(0, kErrorPrefix.size() - head_.size());
    if (head_ == kErrorPrefix) saw_shardlm_error_ = true;
  }
  pass(part);
}

void MpirunStderrFilter::feed(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    switch (state_) {
      case State::kLineStart:
        head_.clear();
        state_ = bytes[i] == '-' || bytes[i] == '['       ? State::kHeldLine
                 : begins_echo(std::string_view(&bytes[i], 1)) ? State::kHeldEcho
                                                                : State::kMidLine;
        break;
      case State::kHeldEcho: {
        // Held while it can still be an echo line; the rest of it passes at once once it cannot.
        while (i < bytes.size() && bytes[i] != '\n' && bytes[i] != '\r') {
          line_ += bytes[i++];
          if (!begins_echo(line_)) break;
        }
        if (i == bytes.size() && begins_echo(line_)) break;
        const int k = i < bytes.size() && bytes[i] == '\n' ? echo_index(line_) : -1;
        if (k >= 0) {
          ++i;
          if (!echo_deferred_[size_t(k)]) deferred_ += line_ + '\n';
          echo_deferred_[size_t(k)] = true;
          state_ = State::kLineStart;
        } else {
          pass_line_part(line_);
          state_ = State::kMidLine;
        }
        line_.clear();
        break;
      }
      case State::kMidLine: {
        // Through at once, up to the end of the line: a progress bar redraws a line with '\r'.
        const size_t nl = bytes.find('\n', i);
        const size_t end = nl == std::string_view::npos ? bytes.size() : nl + 1;
        pass_line_part(bytes.substr(i, end - i));
        i = end;
        if (nl != std::string_view::npos) state_ = State::kLineStart;
        break;
      }
      case State::kHeldLine: {
        // Held until the line shows what it is; a rule's dashes give way at the first other byte,
        // anything at a '\r' (a progress bar) or past a length no Open MPI line reaches.
        const bool dashes = (line_.empty() ? bytes[i] : line_[0]) == '-';
        while (i < bytes.size() && bytes[i] != '\n' && bytes[i] != '\r' && line_.size() < kMaxHeldLine &&
               (!dashes || bytes[i] == '-'))
          line_ += bytes[i++];
        if (i == bytes.size()) break;
        if (bytes[i] == '\n') {
          ++i;
          end_held_line();
        } else {
          pass_line_part(line_);
          line_.clear();
          state_ = State::kMidLine;
        }
        break;
      }
      case State::kInNotice: {
        const size_t nl = bytes.find('\n', i);
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

void MpirunStderrFilter::end_held_line() {
  if (is_rule(line_)) {
    notice_ = line_ + '\n';
    state_ = State::kInNotice;
  } else {
    if (is_lost_notice(line_)) {
      deferred_ += line_ + '\n';
    } else {
      pass(line_ + '\n');
    }
    state_ = State::kLineStart;
  }
  line_.clear();
}

void MpirunStderrFilter::end_notice() {
  const size_t body = notice_.find('\n') + 1;
  const bool abort_notice = notice_.compare(body, kAbortNotice.size(), kAbortNotice) == 0;
  if (!abort_notice) {
    pass(notice_);
  } else {
    deferred_ += "shardlm launch: " + first_paragraph(notice_) + " (no rank printed an error)\n";
  }
  notice_.clear();
  state_ = State::kLineStart;
}

void MpirunStderrFilter::finish() {
  if (state_ == State::kHeldLine || state_ == State::kHeldEcho) pass(line_);
  if (state_ == State::kInNotice) {
    pass(notice_);
    pass(line_);
  }
  if (!saw_shardlm_error_) pass(deferred_);
  deferred_.clear();
  notice_.clear();
  line_.clear();
  state_ = State::kLineStart;
}

}  // namespace shardlm::comm
