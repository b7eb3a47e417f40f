// The gtest main of the MPI test programs: makes the world (MPI under mpirun, else one rank),
// lets rank 0 alone print results, and fails the process when a test failed on any rank.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "comm/communicator.h"

namespace shardlm::testing {

inline int run_mpi_tests(int argc, char** argv, comm::Communicator*& world_out) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<comm::Communicator> world = comm::make_world_communicator();
  world_out = world.get();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  const double failed = world->all_reduce_sum(rc != 0 ? 1.0 : 0.0);
  if (world->rank() == 0 && failed > 0) std::fprintf(stderr, "%g rank(s) failed\n", failed);
  return failed > 0 ? 1 : 0;
}

}  // namespace shardlm::testing
