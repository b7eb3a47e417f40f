#include "train/stop_signal.h"

#include <cstdlib>

namespace shardlm::train {

namespace {

// Written only by the handler and by the guard before it installs the handler.
volatile std::sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int sig) {
  if (g_stop_signal != 0) std::_Exit(128 + sig);
  g_stop_signal = sig;
}

}  // namespace

StopSignalGuard::StopSignalGuard(bool on) : on_(on) {
  if (!on_) return;
  g_stop_signal = 0;
  for (size_t i = 0; i < std::size(kSignals); ++i) old_[i] = std::signal(kSignals[i], on_stop_signal);
}

StopSignalGuard::~StopSignalGuard() {
  if (!on_) return;
  for (size_t i = 0; i < std::size(kSignals); ++i) std::signal(kSignals[i], old_[i]);
}

bool stop_signal_received() { return g_stop_signal != 0; }

}  // namespace shardlm::train
