// Forming batch rows from examples: greedy packing into rows of T tokens, or one example per
// row padded to the longest row of the micro-batch. Owner: the data pipeline (docs/data.md).
//
// A packed row holds several examples back to back; each gets its own segment id and positions
// restarting at 0, so attention stays within the example (model::Batch) and the result equals
// running the examples one by one. The tail of a row is padding: pad ids, target kIgnoreIndex,
// a segment of its own. Padding never counts in the loss.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "data/dataset.h"

namespace shardlm::data {

// Packs examples greedily in the given order: each example goes into the current row if it
// fits in the T tokens left, else it starts a new row. An example longer than T takes a row of
// its own and is truncated to T (*truncated counts those). Returns the rows as lists of example
// indices; the order of examples is kept.
std::vector<std::vector<int64_t>> pack_greedy(const std::vector<int64_t>& order,
                                              const std::function<int64_t(int64_t)>& length, int64_t T,
                                              int64_t* truncated = nullptr);

// One B x T batch of packed rows (rows[r] = the examples of row r), with positions and segments.
BatchBuffers make_packed_batch(const std::vector<std::vector<Example>>& rows, int64_t T, int32_t pad_id);

// One example per row, padded to the longest row of this batch, at most max_T (longer rows are
// truncated to max_T).
BatchBuffers make_padded_batch(const std::vector<Example>& rows, int64_t max_T, int32_t pad_id);

}  // namespace shardlm::data
