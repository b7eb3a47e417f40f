// The gtest main of the MPI test programs: makes the world (MPI under mpirun, else one rank),
// lets rank 0 alone print results, and fails the process when a test failed on any rank.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "comm/communicator.h"

namespace shardlm::testing {

// Optional steps of a test program around its tests: `before` runs once the world exists (it may
// make more communicators or register tests), `after` once the tests ran, while the world still
// exists (so what `before` made over the world can be destroyed before it).
struct MpiTestHooks {
  std::function<void(comm::Communicator&)> before, after;
};

inline int run_mpi_tests(int argc, char** argv, comm::Communicator*& world_out, const MpiTestHooks& hooks = {}) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<comm::Communicator> world = comm::make_world_communicator();
  world_out = world.get();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  if (hooks.before) hooks.before(*world);
  const int rc = RUN_ALL_TESTS();
  if (hooks.after) hooks.after(*world);
  const double failed = world->all_reduce_sum(rc != 0 ? 1.0 : 0.0);
  if (world->rank() == 0 && failed > 0) std::fprintf(stderr, "%g rank(s) failed\n", failed);
  return failed > 0 ? 1 : 0;
}

}  // namespace shardlm::testing
