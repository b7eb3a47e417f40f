// Where a communicator's ranks run: which ranks share a host. Hybrid meshes cut their shard groups
// along hosts (shard/sharding.cpp), whatever order the launcher numbered the ranks in.
//
// Owner: comm. A header of its own, beside communicator.h, so that the interface every collective
// user includes does not change for a question only the mesh asks.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shardlm::comm {

// hosts[h] is a host's name, host_of[r] rank r's host; hosts are numbered in the order of their
// lowest rank.
struct HostLayout {
  std::vector<std::string> hosts;
  std::vector<int> host_of;
  int ranks_on(int host) const { return int(std::count(host_of.begin(), host_of.end(), host)); }
};

// Collective over `c`. MPI: ranks that MPI_Comm_split_type(SHARED) puts together are one host,
// named by its hostname. Any other communicator: every rank on this process's host.
HostLayout hosts(Communicator& c);
// The layout of `size` ranks all on this process's host.
HostLayout single_host(int size);
// Whether `c`'s collectives go through a shared-memory window (all of its ranks on one host;
// shm_collectives.h), for logs and tests.
bool uses_shared_memory(const Communicator& c);
// Whether `c`'s larger collectives go around the ring of ring_collectives.h (its ranks span hosts,
// or SHARDLM_RING=1), for logs and tests.
bool uses_ring(const Communicator& c);

}  // namespace shardlm::comm
