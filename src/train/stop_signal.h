// Stopping a run on a signal (save_on_signal): the first SIGTERM or SIGINT only raises a flag the
// training loop reads between steps; a second one ends the process at once. Before the first step
// (loading the model, tokenizing the data) there is nothing to save, so a signal then ends the
// process at once with one line on stderr, rather than waiting for the loading to finish. (SIGUSR1, how
// `shardlm launch` relays a stop through mpirun, arrives as SIGTERM: the command line's main()
// turns one into the other for every command.) Owner: the trainer, which installs the handlers
// for the length of a run (StopSignalGuard restores the previous ones).
#pragma once

#include <csignal>
#include <iterator>
#include <string_view>

namespace shardlm::train {

// The line a signal before the first step prints (stderr; `shardlm launch` holds it back when
// another rank printed the error that took the job down: comm/mpirun_output.h).
inline constexpr std::string_view kStoppedInSetupLine =
    "error: stopped by a signal before the first step (nothing to save)\n";

class StopSignalGuard {
 public:
  // on = false installs nothing (save_on_signal: false keeps the default handlers).
  explicit StopSignalGuard(bool on);
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

 private:
  static constexpr int kSignals[] = {SIGTERM, SIGINT};
  bool on_;
  void (*old_[std::size(kSignals)])(int) = {};
};

// Called when the setup is done and the steps begin: from then on a first signal is only a flag.
void stop_signals_now_save();

// Whether this process got a stop signal since the guard was installed. (The loop sums it over the
// ranks, so every rank stops after the same step.)
bool stop_signal_received();

}  // namespace shardlm::train
