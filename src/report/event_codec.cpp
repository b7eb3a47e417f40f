#include "report/event_codec.h"

#include "report/event.pb.h"

namespace shardlm::report {

std::string encode_event(const EventFields& f) {
  tensorboard::Event e;
  e.set_wall_time(f.wall_time);
  e.set_step(f.step);
  if (!f.file_version.empty()) {
    e.set_file_version(f.file_version);
  } else {
    tensorboard::Summary* s = e.mutable_summary();
    for (const auto& [tag, v] : f.scalars) {
      tensorboard::Summary::Value* sv = s->add_value();
      sv->set_tag(tag);
      sv->set_simple_value(v);
    }
  }
  return e.SerializeAsString();
}

bool decode_event(const std::string& bytes, EventFields* out) {
  tensorboard::Event e;
  if (!e.ParseFromString(bytes)) return false;
  *out = EventFields{};
  out->wall_time = e.wall_time();
  out->step = e.step();
  if (e.what_case() == tensorboard::Event::kFileVersion) out->file_version = e.file_version();
  for (const tensorboard::Summary::Value& v : e.summary().value()) {
    if (!v.has_simple_value()) return false;
    out->scalars.emplace_back(v.tag(), v.simple_value());
  }
  return true;
}

}  // namespace shardlm::report
