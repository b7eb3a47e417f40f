#include "train/stop_signal.h"

#include <unistd.h>

#include <cstdlib>

namespace shardlm::train {

namespace {

// Written only by the handler and by the guard before it installs the handler.
volatile std::sig_atomic_t g_stop_signal = 0;
// 1 until the first step: a signal then ends the process (see the header).
volatile std::sig_atomic_t g_in_setup = 1;

void on_stop_signal(int sig) {
  if (g_in_setup) {
    (void)!::write(2, kStoppedInSetupLine.data(), kStoppedInSetupLine.size());  // async-signal-safe, unlike stdio
    std::_Exit(128 + sig);
  }
  if (g_stop_signal != 0) std::_Exit(128 + sig);
  g_stop_signal = sig;
}

}  // namespace

StopSignalGuard::StopSignalGuard(bool on) : on_(on) {
  if (!on_) return;
  g_stop_signal = 0;
  g_in_setup = 1;
  for (size_t i = 0; i < std::size(kSignals); ++i) old_[i] = std::signal(kSignals[i], on_stop_signal);
}

StopSignalGuard::~StopSignalGuard() {
  if (!on_) return;
  for (size_t i = 0; i < std::size(kSignals); ++i) std::signal(kSignals[i], old_[i]);
}

void stop_signals_now_save() { g_in_setup = 0; }

bool stop_signal_received() { return g_stop_signal != 0; }

}  // namespace shardlm::train
