#include "io/model_files.h"

#include <cctype>
#include <csignal>
#include <cstdlib>
#include <string_view>
#include <chrono>
#include <random>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_parse.h"
#include "io/read_file.h"

namespace shardlm::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string shard_name(size_t i, size_t n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", i, n); }

// The metadata key, in every shard and in the index, that ties a sharded save together.
constexpr const char* kSaveIdKey = "shardlm_save";

// The test hook behind the interrupted-publish test: SHARDLM_TEST_KILL_PUBLISHING=1 kills the
// process (SIGKILL, as kill -9) just after the first shard of a save is renamed into place.
bool killed_while_publishing() {
  const char* v = std::getenv("SHARDLM_TEST_KILL_PUBLISHING");
  return v && std::string_view(v) == "1";
}

// 64 random bits in hex: unique enough to tell two saves of one directory apart.
std::string new_save_id() {
  std::random_device rd;
  const uint64_t id = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  return fmt::format("{:016x}", id);
}

// A file name that a save of ours (or of transformers) could have produced.
bool is_model_file_name(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSafetensorsSingleName || name == kSafetensorsIndexName || std::regex_match(name, shard);
}


}  // namespace

// ---- reading ---------------------------------------------------------------------------------

ModelWeights::ModelWeights(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) throw Error("model directory does not exist or is not a directory").set_file(dir_);
  const std::string single = (fs::path(dir_) / kSafetensorsSingleName).string();
  const std::string index = (fs::path(dir_) / kSafetensorsIndexName).string();

  // transformers prefers the single file when both exist; so do we.
  if (fs::exists(single, ec)) {
    files_.emplace_back(single);
    for (const TensorInfo& ti : files_[0].tensors()) where_.emplace(ti.name, 0);
    return;
  }
  if (!fs::exists(index, ec))
    throw Error(fmt::format("holds neither {} nor {}", kSafetensorsSingleName, kSafetensorsIndexName)).set_file(dir_);
  sharded_ = true;

  json j;
  try {
    j = parse_json(read_file(index, "index file"));
  } catch (const json::exception& e) {
    throw Error(fmt::format("not valid JSON: {}", e.what())).set_file(index);
  }
  if (!j.is_object()) throw Error("must be a JSON object").set_file(index);
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object())
    throw Error("missing or not an object").set_file(index).set_key("weight_map");

  // Group the listed tensors by shard file, keeping each shard's first listed tensor for errors.
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string() || file.get<std::string>().empty())
      throw Error(fmt::format("weight_map value is {}, not a file name", file.dump())).set_file(index).set_tensor(name);
    by_shard[file.get<std::string>()].push_back(name);
  }

  files_.reserve(by_shard.size());
  std::unordered_map<std::string, size_t> holder;  // every tensor of every shard -> file index
  for (const auto& [shard, listed] : by_shard) {
    const std::string path = (fs::path(dir_) / shard).string();
    if (!fs::is_regular_file(path, ec))
      throw Error(fmt::format("the index places it in shard file '{}', which does not exist", shard))
          .set_file(index).set_tensor(listed.front());
    files_.emplace_back(path);  // a corrupt shard is reported by its own path
    const size_t fi = files_.size() - 1;
    for (const TensorInfo& ti : files_[fi].tensors()) {
      auto [it, fresh] = holder.emplace(ti.name, fi);
      if (!fresh)
        throw Error(fmt::format("stored in two shard files, '{}' and '{}'", files_[it->second].path(), path))
            .set_file(index).set_tensor(ti.name);
    }
    for (const std::string& name : listed) {
      if (!files_[fi].has(name))
        throw Error(fmt::format("the index places it in shard file '{}', which does not hold it", shard))
            .set_file(index).set_tensor(name);
      where_.emplace(name, fi);
    }
  }
  // A save of ours ties its shards to its index (see the writer): shards of another save mean an
  // interrupted save that left two models mixed.
  const json* meta = j.contains("metadata") && j["metadata"].is_object() ? &j["metadata"] : nullptr;
  if (meta && meta->contains(kSaveIdKey) && (*meta)[kSaveIdKey].is_string()) {
    const std::string save = (*meta)[kSaveIdKey].get<std::string>();
    for (const SafetensorsFile& f : files_) {
      auto it = f.metadata().find(kSaveIdKey);
      if (it == f.metadata().end() || it->second != save)
        throw Error(fmt::format("belongs to another save than {} (a save interrupted while publishing its shards "
                                "left two models mixed in this directory); save the model again",
                                kSafetensorsIndexName))
            .set_file(f.path());
    }
  }
}

std::vector<std::string> ModelWeights::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

const SafetensorsFile& ModelWeights::lookup(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error("no such tensor in this model").set_file(dir_).set_tensor(name);
  return files_[it->second];
}

const TensorInfo& ModelWeights::info(const std::string& name) const { return lookup(name).info(name); }
Tensor ModelWeights::tensor(const std::string& name) const { return lookup(name).tensor(name); }
void ModelWeights::read_range(const std::string& name, uint64_t elem_begin, uint64_t elem_count, void* dst) const {
  lookup(name).read_range(name, elem_begin, elem_count, dst);
}
const std::string& ModelWeights::file_of(const std::string& name) const { return lookup(name).path(); }
const SafetensorsFile& ModelWeights::file_holding(const std::string& name) const { return lookup(name); }

const TensorInfo& ModelWeights::float_info(const std::string& name, const std::vector<int64_t>& shape) const {
  if (!has(name)) throw Error("missing from the model weights", {.file = dir_, .tensor = name});
  const TensorInfo& t = info(name);
  if (t.shape != shape) {
    const Tensor want = Tensor::view(nullptr, DType::F32, shape.data(), int(shape.size()));
    throw Error(fmt::format("shape {} in the file, but config.json implies {}", t.shape_str(), want.shape_str()),
                {.file = file_of(name), .tensor = name});
  }
  if (!t.dtype || !is_float(*t.dtype))
    throw Error(fmt::format("dtype {} is not a float type (F32, BF16 or F16)", t.dtype_name),
                {.file = file_of(name), .tensor = name});
  return t;
}

// ---- writing ---------------------------------------------------------------------------------

void write_model_weights(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         uint64_t max_shard_bytes) {
  // Check every tensor before writing anything, so a bad input cannot leave a half-written save.
  std::vector<PlannedTensor> plan;
  std::unordered_map<std::string, Tensor> by_name;
  for (const auto& [name, t] : tensors) {
    // (name captured by copy: clang before 16 cannot capture a structured binding)
    auto bad = [&, tensor = name](std::string msg) { return Error(std::move(msg)).set_file(dir).set_tensor(tensor); };
    if (t.device != Device::CPU) throw bad(fmt::format("cannot save {}: only CPU tensors", t.describe()));
    if (!t.is_contiguous()) throw bad(fmt::format("cannot save non-contiguous {}", t.describe()));
    if (t.numel() > 0 && !t.defined()) throw bad("tensor has no data");
    plan.emplace_back(name, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim));
    by_name.emplace(name, t);
  }
  write_model_weights_streaming(dir, plan, max_shard_bytes, [&](const std::string& name, const TensorSink& sink) {
    const Tensor& t = by_name.at(name);
    sink(t.data, t.nbytes());
  });
}

void write_model_weights_streaming(const std::string& dir, const std::vector<PlannedTensor>& plan,
                                   uint64_t max_shard_bytes, const TensorFiller& fill) {
  if (max_shard_bytes == 0) throw Error("maximum shard size must be positive").set_file(dir);
  std::unordered_set<std::string> seen;
  std::vector<uint64_t> nbytes;
  for (const PlannedTensor& p : plan) {
    if (p.name.empty()) throw Error("cannot save a tensor with an empty name").set_file(dir);
    if (!seen.insert(p.name).second) throw Error("appears twice in the tensors to save").set_file(dir).set_tensor(p.name);
    uint64_t n = safetensors_dtype_size(p.dtype);
    for (int64_t d : p.shape) n *= uint64_t(d);
    nbytes.push_back(n);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create directory: {}", ec.message())).set_file(dir);

  // Greedy split in the given order, as transformers does: start a new shard when the next tensor
  // would push a non-empty one over the limit.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!shards.back().empty() && shard_bytes + nbytes[i] > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += nbytes[i];
    total += nbytes[i];
  }

  // A sharded save is published in two steps, because no filesystem renames several files at
  // once: every shard is written and synced under its temporary name first, then all are renamed
  // into place and the index last. Shard names repeat across saves (model-00001-of-00004 ...), so a
  // death among those renames could leave some new shards beside old ones under an old index; every
  // shard and the index therefore carry one save id, and ModelWeights refuses a directory whose
  // shards disagree with its index instead of loading a mix of two models.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  const bool sharded = shards.size() > 1;
  const std::string save = new_save_id();
  if (sharded) metadata[kSaveIdKey] = save;
  std::set<std::string> keep;
  json weight_map = json::object();
  std::vector<SafetensorsWriter> written;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = sharded ? shard_name(s + 1, shards.size()) : kSafetensorsSingleName;
    std::vector<PlannedTensor> part;
    for (size_t i : shards[s]) {
      part.push_back(plan[i]);
      weight_map[plan[i].name] = name;
    }
    // One tensor at a time: the filler streams its bytes, so only what it stages is in memory.
    SafetensorsWriter w((fs::path(dir) / name).string(), part, metadata);
    for (const PlannedTensor& p : part)
      fill(p.name, [&](const void* bytes, size_t n) { w.write(p.name, bytes, n); });
    w.seal();
    written.push_back(std::move(w));
    keep.insert(name);
  }
  for (size_t s = 0; s < written.size(); ++s) {
    written[s].finish();
    if (s == 0 && killed_while_publishing()) std::raise(SIGKILL);
  }
  if (sharded) {
    // transformers: json.dumps(index, indent=2, sort_keys=True) + "\n"; nlohmann sorts keys too.
    // It reads only total_size of the metadata; the save id is ours.
    const json index = {{"metadata", {{"total_size", total}, {kSaveIdKey, save}}}, {"weight_map", weight_map}};
    write_text_atomic((fs::path(dir) / kSafetensorsIndexName).string(), index.dump(2) + "\n");
    keep.insert(kSafetensorsIndexName);
  }

  // Only now drop what an earlier save left and this one does not use; loaders would otherwise
  // pick up a stale model.safetensors (which transformers prefers over an index) or stale shards.
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_model_file_name(name) && !keep.count(name)) {
      fs::remove(e.path(), ec);
      if (ec) throw Error(fmt::format("cannot remove stale model file: {}", ec.message())).set_file(e.path().string());
    }
  }
  if (ec) throw Error(fmt::format("cannot list directory: {}", ec.message())).set_file(dir);
}

// ---- sizes -------------------------------------------------------------------------------------

uint64_t parse_size(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Error(fmt::format("invalid size '{}': {} (expected e.g. 5GB, 500MB, 2GiB or a byte count)", text, why));
  };
  size_t i = 0, n = text.size();
  while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  while (n > i && std::isspace(static_cast<unsigned char>(text[n - 1]))) --n;

  // Decimal number: digits, optionally '.' and more digits, kept as an integer mantissa / 10^k.
  uint64_t mantissa = 0;
  int frac_digits = 0, digits = 0;
  bool in_fraction = false;
  for (; i < n; ++i) {
    const char c = text[i];
    if (c == '.' && !in_fraction) {
      in_fraction = true;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    if (__builtin_mul_overflow(mantissa, uint64_t(10), &mantissa) ||
        __builtin_add_overflow(mantissa, uint64_t(c - '0'), &mantissa))
      throw bad("too large");
    ++digits;
    if (in_fraction) ++frac_digits;
  }
  if (digits == 0) throw bad("no number");
  while (i < n && text[i] == ' ') ++i;

  std::string unit;
  for (; i < n; ++i) unit += char(std::toupper(static_cast<unsigned char>(text[i])));
  static const std::map<std::string, uint64_t> units = {
      {"", 1},       {"B", 1},
      {"KB", 1000},  {"MB", 1000'000},  {"GB", 1000'000'000},  {"TB", 1000'000'000'000},
      {"KIB", 1ull << 10}, {"MIB", 1ull << 20}, {"GIB", 1ull << 30}, {"TIB", 1ull << 40},
  };
  auto u = units.find(unit);
  if (u == units.end()) throw bad(fmt::format("unknown unit '{}'", text.substr(n - unit.size(), unit.size())));

  uint64_t scaled;
  if (__builtin_mul_overflow(mantissa, u->second, &scaled)) throw bad("too large");
  uint64_t div = 1;
  for (int k = 0; k < frac_digits; ++k)
    if (__builtin_mul_overflow(div, uint64_t(10), &div)) throw bad("too many decimals");
  if (scaled % div != 0) throw bad("not a whole number of bytes");
  return scaled / div;
}

}  // namespace shardlm::io
