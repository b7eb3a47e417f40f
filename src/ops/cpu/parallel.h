// Entering an OpenMP parallel region costs a futex system call (libgomp wakes its team at the
// region's end) even when the region runs on one thread or its `if` clause is false: a few
// microseconds, which was most of a decode step of a small model (about 66 regions per token;
// bench/RESULTS.md, 2026-11-26). So small work runs on the calling thread without entering one.
// The kernels whose shapes can be small (the forwards, the elementwise, dropout, NF4 and
// optimizer ops) decide through parallel_region rather than an `if` clause, which still enters
// the region. The backwards, which only training calls on large shapes, keep plain regions; the
// cross-entropy keeps its `if` for its reduction.
#pragma once

#include <cstdint>

namespace shardlm::ops::cpu {

// Below this many elementary operations (multiply-adds, element reads) a parallel region costs
// more than it saves.
constexpr int64_t kMinParallelWork = int64_t(1) << 15;

// Runs `region` on the OpenMP team when `worth_threads`, else once on this thread. A
// `#pragma omp for` inside `region` splits its loop over the team when there is one and runs it
// whole when there is none (an orphaned worksharing loop: no region is entered).
template <class Region>
void parallel_region(bool worth_threads, Region&& region) {
  if (!worth_threads) {
    region();
    return;
  }
#pragma omp parallel
  region();
}

}  // namespace shardlm::ops::cpu
