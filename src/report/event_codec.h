// The one place that encodes (and, for tests, decodes) TensorBoard Event messages through
// libprotobuf (event.proto). It is compiled into the shardlm_event_proto library, apart from the
// rest of src/, so that no other file includes protobuf's headers: see CMakeLists.txt for why
// protobuf's code must stay inside that library (Debian's libsentencepiece exports its own copy).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardlm::report {

// The fields of an Event that shardlm writes: wall_time, step, and either file_version or a
// summary of (tag, simple_value) pairs.
struct EventFields {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                             // set: a file-version event
  std::vector<std::pair<std::string, float>> scalars;   // otherwise: the summary's values
};

// The Event protocol buffer's bytes.
std::string encode_event(const EventFields& e);
// Parses bytes written by encode_event (or any Event holding only these fields). False when they do
// not parse, or hold a summary value other than a simple_value.
bool decode_event(const std::string& bytes, EventFields* out);

}  // namespace shardlm::report
