// What `shardlm launch` lets through of mpirun's stderr.
//
// A failing rank prints its one line ("shardlm: error: rank 0: ...") and calls MPI_Abort, and
// Open MPI's mpirun then adds a nine-line notice between dashed rules ("MPI_ABORT was invoked on
// rank 0 in communicator MPI_COMM_WORLD with errorcode 1. NOTE: invoking MPI_ABORT causes Open MPI
// to kill all MPI processes..."), which says nothing the rank's line did not. The filter drops that
// one notice and passes everything else through unchanged, at once (a line that starts with '-'
// or '[', as mpirun's own do, when it ends or shows it is not one of them): ranks' stderr (progress
// bars included, which are partial lines), and mpirun's other notices, such as "mpirun noticed that
// process rank 1 ... exited on signal 9", the only place a killed rank is named. mpirun's log line
// for a notice that arrived cut short (the abort notice of a rank being taken down) goes too.
// Should no rank's error line pass by the end of the stream (MPI_Abort called by a library), the
// abort notice is written then, condensed to one line, and the log line as it was: the end, since
// the notice may arrive before the rank's line, the two travelling apart.
// The other ranks, taken down by the abort, may print a line of their own: given as `echoes`
// (the trainer's "error: stopped by a signal before the first step (nothing to save)", printed by
// a rank signalled while it loads), such a line is held to the end too, and written once there if
// no rank printed an error (every rank stopped by a user's Ctrl-C prints it: one line, not one per
// rank). An echo line starts with neither '-' nor '['.
//
// Owner: comm. Not thread-safe; one filter per stream, fed in order.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlm::comm {

class MpirunStderrFilter {
 public:
  // `write` receives the bytes that pass, in order; it must not throw.
  explicit MpirunStderrFilter(std::function<void(std::string_view)> write, std::vector<std::string> echoes = {});

  // The next bytes of mpirun's stderr, split anywhere.
  void feed(std::string_view bytes);
  // End of the stream: whatever is held back (an unfinished notice) is written as it was, and what
  // was kept for the end (see the top).
  void finish();

 private:
  enum class State {
    kLineStart,  // at the start of a line
    kMidLine,    // inside a line that passes through as it comes
    kHeldLine,   // holding a line that starts with '-' (a rule opening a notice?) or '[' (mpirun's log)
    kInNotice,   // holding a notice, from its opening rule, until the closing one
    kHeldEcho,   // holding a line while it may be one of echoes_
  };
  // Whether `line` (no '\n') begins one of echoes_, or (whole) is one: its index, else -1.
  bool begins_echo(std::string_view line) const;
  int echo_index(std::string_view line) const;
  void end_held_line();
  void end_notice();
  void pass(std::string_view bytes);
  // The next bytes of the line passing through (kMidLine), its first ones noted in head_.
  void pass_line_part(std::string_view part);

  std::function<void(std::string_view)> write_;
  std::vector<std::string> echoes_;  // lines (no '\n') held to the end, see the top
  std::vector<bool> echo_deferred_;  // [echoes_] already in deferred_: written once
  State state_ = State::kLineStart;
  std::string line_;    // the held line (kHeldLine) or the notice's current line (kInNotice)
  std::string notice_;  // the notice's complete lines so far (kInNotice), rules included
  std::string head_;    // the first bytes of the line passing through (kMidLine), to spot errors
  std::string deferred_;  // what finish() writes if no error line passed (see the top)
  bool saw_shardlm_error_ = false;  // a "shardlm: error:" line passed: an abort notice adds nothing
};

}  // namespace shardlm::comm
