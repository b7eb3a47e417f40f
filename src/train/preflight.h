// The pre-flight check of a multi-rank run, before the model is loaded: every rank answers a
// scalar all-reduce (under the collective watchdog, so a rank that does not answer within
// collective_timeout is named: stopped or gone on this node, or silent on another), reports its
// host, and an all-reduce of 8 MiB is timed (the fastest of three; GB/s is bytes over time, nccl-tests'
// algbw). Rank 0 prints one line:
//
//   pre-flight: 4 ranks on 2 hosts (node1: 0,1; node2: 2,3); all-reduce 8 MB in 3.1 ms (2.71 GB/s)
//
// A job that cannot communicate fails here, in a second, rather than minutes later after loading.
#pragma once

#include <string>

#include "comm/communicator.h"

namespace shardlm::train {

// Collective over `world` (nothing to do on one rank). Returns rank 0's line ("" elsewhere).
std::string preflight_check(comm::Communicator& world);

}  // namespace shardlm::train
