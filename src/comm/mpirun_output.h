// What `shardlm launch` lets through of mpirun's stderr.
//
// A failing rank prints its one line ("shardlm: error: rank 0: ...") and calls MPI_Abort, and
// Open MPI's mpirun then adds a nine-line notice between dashed rules ("MPI_ABORT was invoked on
// rank 0 in communicator MPI_COMM_WORLD with errorcode 1. NOTE: invoking MPI_ABORT causes Open MPI
// to kill all MPI processes..."), which says nothing the rank's line did not. The filter drops that
// one notice and passes everything else through unchanged and at once: ranks' stderr (progress bars
// included, which are partial lines), and mpirun's other notices, such as "mpirun noticed that
// process rank 1 ... exited on signal 9", the only place a killed rank is named. Should an abort
// come with no shardlm error line before it (MPI_Abort called by a library), the notice is
// condensed to one line rather than dropped.
//
// Owner: comm. Not thread-safe; one filter per stream, fed in order.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace shardlm::comm {

class MpirunStderrFilter {
 public:
  // `write` receives the bytes that pass, in order; it must not throw.
  explicit MpirunStderrFilter(std::function<void(std::string_view)> write) : write_(std::move(write)) {}

  // The next bytes of mpirun's stderr, split anywhere.
  void feed(std::string_view bytes);
  // End of the stream: whatever is held back (an unfinished notice) is written as it was.
  void finish();

 private:
  enum class State {
    kLineStart,  // at the start of a line
    kMidLine,    // inside a line that passes through as it comes
    kMaybeRule,  // holding a line that starts with '-': a rule opening a notice, or not
    kInNotice,   // holding a notice, from its opening rule, until the closing one
  };
  void end_held_line();
  void end_notice();
  void pass(std::string_view bytes);

  std::function<void(std::string_view)> write_;
  State state_ = State::kLineStart;
  std::string line_;    // the held line (kMaybeRule) or the notice's current line (kInNotice)
  std::string notice_;  // the notice's complete lines so far (kInNotice), rules included
  std::string head_;    // the first bytes of the line passing through (kMidLine), to spot errors
  bool saw_shardlm_error_ = false;  // a "shardlm: error:" line passed: an abort notice adds nothing
};

}  // namespace shardlm::comm
