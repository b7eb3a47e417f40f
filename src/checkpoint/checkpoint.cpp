#include "checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_integer.h"
#include "io/json_parse.h"
#include "io/model_files.h"
#include "io/safetensors.h"
#include "model/hf_dir.h"
#include "model/peft_adapter.h"
#include "ops/ops.h"
#include "shard/engine.h"

namespace shardlm::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "shardlm-checkpoint";
constexpr Field kFields[] = {Field::Master, Field::ExpAvg, Field::ExpAvgSq};

std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }
std::string unit_tensor(int unit, Field f) { return fmt::format("unit{}.{}", unit, field_name(f)); }
// 8-bit moments: the f32 absmax per block of 256 beside the u8 codes.
std::string absmax_tensor(int unit, Field f) { return unit_tensor(unit, f) + ".absmax"; }

// CRC-32 (zlib's, the IEEE polynomial) of each kChecksumBlockBytes block of `bytes`. Blocks let a
// reader verify just the part it reads.
std::vector<uint32_t> block_crcs(const uint8_t* bytes, uint64_t n, bool parallel = true) {
  const int64_t blocks = int64_t((n + kChecksumBlockBytes - 1) / kChecksumBlockBytes);
  std::vector<uint32_t> out(size_t(blocks), 0);
#pragma omp parallel for schedule(dynamic) if (parallel)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint64_t lo = uint64_t(b) * kChecksumBlockBytes, hi = std::min(n, lo + kChecksumBlockBytes);
    out[size_t(b)] = uint32_t(crc32_z(crc32_z(0, nullptr, 0), bytes + lo, hi - lo));
  }
  return out;
}

std::string join_hex(const std::vector<uint32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:08x}", i ? "," : "", v[i]);
  return s;
}

std::vector<uint32_t> parse_hex_list(const std::string& s, const std::string& file, const std::string& tensor) {
  std::vector<uint32_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const unsigned long v = std::strtoul(item.c_str(), &end, 16);
    if (item.empty() || item.size() > 8 || *end) throw Error("malformed checksum list", {.file = file, .tensor = tensor});
    out.push_back(uint32_t(v));
    pos = comma + 1;
  }
  return out;
}

// The test hook behind the kill-during-save test: SHARDLM_TEST_KILL_DURING_SAVE=<step> makes every
// rank kill itself (SIGKILL, as kill -9) halfway through writing its file of that step's checkpoint.
bool kill_during_save(int64_t step) {
  const char* v = std::getenv("SHARDLM_TEST_KILL_DURING_SAVE");
  return v && std::atoll(v) == step;
}

// The engine buffer that holds one stored field, and with 8-bit moments their absmax (undefined
// for the master and for f32 or bf16 moments).
const Tensor& field_of(const shard::ShardedModel::StateRange& s, Field f) {
  return f == Field::Master ? s.master : f == Field::ExpAvg ? s.exp_avg : s.exp_avg_sq;
}
Tensor absmax_of(const shard::ShardedModel::StateRange& s, Field f) {
  return f == Field::Master ? Tensor{} : f == Field::ExpAvg ? s.exp_avg_absmax : s.exp_avg_sq_absmax;
}

// Atomically writes a marker or metadata file.
void write_json(const fs::path& path, const json& j) { io::write_text_atomic(path.string(), j.dump(1) + "\n"); }

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

const char* field_name(Field f) {
  switch (f) {
    case Field::Master: return "master";
    case Field::ExpAvg: return "exp_avg";
    case Field::ExpAvgSq: return "exp_avg_sq";
  }
  return "?";
}

int64_t StoredTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- saving ---------------------------------------------------------------------------------

namespace {
// The part of a unit's optimizer state this rank writes. Ranks that hold identical copies (every
// rank under NO_SHARD, the replicas of a hybrid mesh) split their copy between them, so each
// element is written exactly once and every rank writes in parallel. May be empty.
shard::ShardedModel::StateRange written_state(shard::ShardedModel& engine, int k) {
  shard::ShardedModel::StateRange s = engine.owned_state(k);
  const comm::Communicator* copies = engine.state_copies();
  if (s.numel == 0 || !copies || copies->size() == 1) return s;
  // 8-bit moments split at whole blocks (their absmax with them).
  const int64_t block = s.exp_avg_absmax.defined() ? ops::kQuant8Block : 1;
  const int64_t part = ((s.numel + copies->size() - 1) / copies->size() + block - 1) / block * block;
  const int64_t lo = std::min(s.numel, copies->rank() * part), hi = std::min(s.numel, lo + part);
  shard::ShardedModel::StateRange out{s.begin + lo, hi - lo, s.master.slice(lo, hi), s.exp_avg.slice(lo, hi),
                                      s.exp_avg_sq.slice(lo, hi)};
  if (block > 1) {
    out.exp_avg_absmax = s.exp_avg_absmax.slice(lo / block, (hi + block - 1) / block);
    out.exp_avg_sq_absmax = s.exp_avg_sq_absmax.slice(lo / block, (hi + block - 1) / block);
  }
  return out;
}
}  // namespace


// One save between start and finish: what this rank's file holds, and the writer that writes it.
struct CheckpointSaver::Pending {
  SaveOptions opt;
  shard::ShardedModel* engine = nullptr;
  const ModelConfig* cfg = nullptr;
  std::chrono::steady_clock::time_point t0;
  double blocked = 0;  // seconds start held its caller
  std::string path;
  std::vector<io::PlannedTensor> plan;
  std::vector<std::pair<std::string, Tensor>> data;  // staged copies (async) or the engine's buffers
  std::map<std::string, std::string> header;
  uint64_t bytes = 0;
  double write_seconds = 0;
  std::exception_ptr error;  // the background writer's, rethrown by finish
  std::thread writer;

  ~Pending() {
    if (writer.joinable()) writer.join();
  }
  // Checksums (before the header is written: the data is already in memory, so the header can
  // carry them), the file, fsync, rename. File I/O only: this runs on the background thread of an
  // async save, where no MPI call may be made. `parallel`: checksums over OpenMP's threads (not on
  // the background thread, whose OpenMP team would compete with training's).
  void write(bool parallel) {
    const auto t = std::chrono::steady_clock::now();
    for (const auto& [name, tensor] : data)
      header["crc32:" + name] = join_hex(block_crcs(static_cast<const uint8_t*>(tensor.data), tensor.nbytes(), parallel));
    io::SafetensorsWriter w(path, plan, header);
    for (size_t i = 0; i < data.size(); ++i) {
      if (i == data.size() / 2 && kill_during_save(opt.step)) std::raise(SIGKILL);
      w.write(data[i].first, data[i].second.data, data[i].second.nbytes());
    }
    w.finish();  // fsync + rename
    write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
};

CheckpointSaver::CheckpointSaver(bool async) : async_(async) {}
CheckpointSaver::~CheckpointSaver() = default;  // Pending's destructor waits for its writer

void CheckpointSaver::start(const SaveOptions& opt, shard::ShardedModel& engine, const ModelConfig& cfg,
                            comm::Communicator& world) {
  using clock = std::chrono::steady_clock;
  SHARDLM_CHECK(!pending_, "CheckpointSaver::start: the save of step {} is still in flight", pending_->opt.step);
  auto p = std::make_unique<Pending>();
  p->t0 = clock::now();
  p->opt = opt;
  p->engine = &engine;
  p->cfg = &cfg;
  const fs::path dir(opt.dir);
  if (world.rank() == 0) {
    // A directory of this step left by an interrupted save (or an earlier run) is replaced whole.
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) throw Error(fmt::format("cannot remove the old checkpoint: {}", ec.message()), {.file = dir.string()});
    fs::create_directories(dir, ec);
    if (ec) throw Error(fmt::format("cannot create the checkpoint directory: {}", ec.message()), {.file = dir.string()});
  }
  world.barrier();

  // This rank's file: three tensors per unit it writes: the f32 master and the moments in the
  // engine's state dtype (f32 or bf16; the reader converts either to what the resuming engine keeps).
  p->path = (dir / rank_file_name(world.rank())).string();
  p->header = {{"format", "shardlm-checkpoint-shard"}, {"rank", std::to_string(world.rank())}};
  std::vector<std::pair<int, shard::ShardedModel::StateRange>> written;
  int64_t staged_bytes = 0;
  for (int k = 0; k < engine.num_units(); ++k) {
    shard::ShardedModel::StateRange s = written_state(engine, k);
    if (s.numel == 0) continue;
    for (Field f : kFields) staged_bytes += field_of(s, f).nbytes() + absmax_of(s, f).nbytes();
    written.emplace_back(k, std::move(s));
  }
  // Async: the staging buffer holds a copy, since the engine's buffers change with the next step.
  // Its size is the same at every save of a run, so it is allocated once.
  if (async_ && staged_bytes > 0 && staging_.t.numel() != staged_bytes)
    staging_ = OwnedTensor(DType::U8, {staged_bytes}, MemCategory::Other, false);
  int64_t at = 0;  // bytes of staging_ used
  for (const auto& [k, s] : written) {
    p->header[fmt::format("unit{}.begin", k)] = std::to_string(s.begin);
    // One stored tensor: the engine's buffer itself (sync) or its staged copy (async).
    auto add = [&](const std::string& name, Tensor t) {
      if (async_) {
        const int64_t n = int64_t(t.nbytes());
        const uint8_t* from = static_cast<const uint8_t*>(t.data);
        uint8_t* to = static_cast<uint8_t*>(staging_.t.data) + at;
        at += n;
        constexpr int64_t kPiece = int64_t(4) << 20;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i += kPiece) std::memcpy(to + i, from + i, size_t(std::min(kPiece, n - i)));
        t = Tensor::view(to, t.dtype, {t.numel()});
      }
      p->plan.emplace_back(name, t.dtype, std::vector<int64_t>{t.numel()});
      p->data.emplace_back(name, t);
      p->bytes += t.nbytes();
    };
    for (Field f : kFields) {
      add(unit_tensor(k, f), field_of(s, f));
      if (const Tensor a = absmax_of(s, f); a.defined()) add(absmax_tensor(k, f), a);
    }
  }
  if (async_) {
    Pending* q = p.get();
    p->writer = std::thread([q] {
      try {
        q->write(false);
      } catch (...) {
        q->error = std::current_exception();
      }
    });
  } else {
    p->write(true);
  }
  p->blocked = std::chrono::duration<double>(clock::now() - p->t0).count();
  pending_ = std::move(p);
}

SaveReport CheckpointSaver::finish(comm::Communicator& world) {
  using clock = std::chrono::steady_clock;
  SHARDLM_CHECK(pending_, "CheckpointSaver::finish: no save in flight");
  const auto t = clock::now();
  const std::unique_ptr<Pending> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  if (p->error) std::rethrow_exception(p->error);  // this rank's write failed: the job ends, incomplete
  const fs::path dir(p->opt.dir);
  const bool lead = world.rank() == 0;
  SaveReport report;
  report.dir = p->opt.dir;
  report.step = p->opt.step;
  report.rank_bytes = p->bytes;
  report.rank_seconds = p->write_seconds;
  world.barrier();  // every rank's file is in place

  if (lead) {
    // Metadata is built from the files as they are on disk: their sizes, ranges and checksums.
    json files = json::array();
    for (int r = 0; r < world.size(); ++r) {
      const std::string name = rank_file_name(r);
      const io::SafetensorsFile f((dir / name).string());
      json ranges = json::array(), crcs = json::object();
      for (int k = 0; k < p->engine->num_units(); ++k) {
        auto it = f.metadata().find(fmt::format("unit{}.begin", k));
        if (it == f.metadata().end()) continue;
        ranges.push_back({{"unit", k}, {"begin", std::stoll(it->second)}, {"numel", f.info(unit_tensor(k, Field::Master)).numel()}});
        for (Field fl : kFields)
          for (const std::string& t : {unit_tensor(k, fl), absmax_tensor(k, fl)})
            if (f.has(t)) crcs[t] = f.metadata().at("crc32:" + t);
      }
      files.push_back({{"file", name}, {"rank", r}, {"bytes", f.file_size()}, {"ranges", ranges}, {"crc32", crcs}});
      report.total_bytes += f.file_size();
    }
    json units = json::array();
    for (int k = 0; k < p->engine->num_units(); ++k) {
      const shard::FlatLayout& l = p->engine->layout(k);
      json tensors = json::array();
      for (const shard::FlatEntry& e : l.entries)
        tensors.push_back({{"name", e.info.name}, {"shape", e.info.shape}, {"offset", e.offset}});
      units.push_back({{"unit", k}, {"name", l.unit_name}, {"padded_numel", l.padded_numel}, {"tensors", tensors}});
    }
    json meta = {{"format", kFormat},
                       // Version 2 only where it matters: moments in bf16 or 8 bits, which version-1
                       // readers refuse.
                       {"format_version", p->engine->plan().sharding.state_dtype == DType::F32 ? 1 : kFormatVersion},
                       {"step", p->opt.step},
                       {"model", to_hf_json(*p->cfg)},
                       {"checksum", {{"algorithm", "crc32"}, {"block_bytes", kChecksumBlockBytes}}},
                       {"units", units},
                       {"files", files},
                       {"training", p->opt.training},
                       {"run", p->opt.run}};
    // A LoRA run's checkpoint holds only the adapters' state; the frozen base is identified by
    // its config (above) and where it came from, and is read from there again on resume.
    if (const auto& lora = p->engine->finetune().lora) meta["lora"] = peft_config_json(*lora);
    write_json(dir / kMetadataName, meta);
    write_hf_side_files(dir.string(), *p->cfg, DType::F32, p->opt.tokenizer_source);
    // Last: the marker that makes this a checkpoint.
    write_json(dir / kCompleteName, {{"step", p->opt.step}, {"files", world.size()}, {"bytes", report.total_bytes}});
  }
  world.barrier();  // when finish returns on any rank, the checkpoint is complete
  report.seconds = std::chrono::duration<double>(clock::now() - p->t0).count();
  report.blocked_seconds = p->blocked + std::chrono::duration<double>(clock::now() - t).count();
  return report;
}

SaveReport save_checkpoint(const SaveOptions& opt, shard::ShardedModel& engine, const ModelConfig& cfg,
                           comm::Communicator& world) {
  CheckpointSaver saver(false);
  saver.start(opt, engine, cfg, world);
  return saver.finish(world);
}

// ---- finding and pruning --------------------------------------------------------------------------

std::vector<Found> list_checkpoints(const std::string& root) {
  std::vector<Found> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !name.starts_with("step_") || name.size() <= 5) continue;
    const std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    out.push_back({e.path().string(), std::stoll(digits), fs::exists(e.path() / kCompleteName)});
  }
  std::sort(out.begin(), out.end(), [](const Found& a, const Found& b) { return a.step > b.step; });
  return out;
}

std::optional<std::string> latest_complete(const std::string& root,
                                           const std::function<void(const std::string&)>& warn) {
  for (const Found& f : list_checkpoints(root)) {
    if (f.complete) return f.dir;
    if (warn) warn(fmt::format("skipping {}: no {} marker (an interrupted save)", f.dir, kCompleteName));
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& root, int keep) {
  int complete_seen = 0;
  for (const Found& f : list_checkpoints(root)) {
    // Newest first: nothing is removed until a complete checkpoint newer than it exists.
    const bool remove = complete_seen > 0 && (!f.complete || (keep > 0 && complete_seen >= keep));
    if (f.complete) ++complete_seen;
    if (!remove) continue;
    std::error_code ec;
    // The marker goes first, so a removal cut short leaves an incomplete directory, never a
    // "complete" one with files missing.
    fs::remove(fs::path(f.dir) / kCompleteName, ec);
    fs::remove_all(f.dir, ec);
    if (ec) throw Error(fmt::format("cannot remove an old checkpoint: {}", ec.message()), {.file = f.dir});
  }
}

// ---- reading ----------------------------------------------------------------------------------

// Flat elements [begin, begin + numel) of a saved unit, in one file.
struct CheckpointReader::Range {
  int unit;
  int64_t begin, numel;
};

struct CheckpointReader::File {
  std::string name, path;
  uint64_t bytes = 0;
  std::vector<Range> ranges;
  std::map<std::string, std::vector<uint32_t>> crc;       // tensor -> block checksums
  std::map<std::string, std::vector<uint8_t>> verified;   // tensor -> blocks already checked
  std::unique_ptr<io::SafetensorsFile> st;
};

CheckpointReader::~CheckpointReader() = default;

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const fs::path d(dir_);
  const std::string meta_path = (d / kMetadataName).string();
  if (!fs::is_directory(d)) throw Error("no such checkpoint directory", {.file = dir_});
  if (!fs::exists(meta_path)) throw Error("not a shardlm checkpoint (no metadata.json)", {.file = dir_});
  if (!fs::exists(d / kCompleteName))
    throw Error(fmt::format("incomplete checkpoint: no {} marker (the save was interrupted)", kCompleteName),
                {.file = dir_});
  try {
    std::ifstream in(meta_path);
    meta_ = io::parse_json(in);  // nesting bounded (io/json_parse.h)
  } catch (const json::exception& e) {
    throw Error(fmt::format("malformed metadata: {}", e.what()), {.file = meta_path});
  }
  auto bad = [&](const std::string& msg) { return Error(msg, {.file = meta_path}); };
  // An integer field within [lo, hi] (io::json_integer: a float or out-of-range value is refused,
  // never cast).
  auto integer = [&](const json& obj, const char* key, int64_t lo = 0,
                     int64_t hi = std::numeric_limits<int64_t>::max()) -> int64_t {
    const std::optional<int64_t> v = io::json_integer(obj.at(key), lo, hi);
    if (!v) throw bad(fmt::format("malformed metadata: '{}' must be an integer in [{}, {}], got {}", key, lo, hi,
                                  obj.at(key).dump()));
    return *v;
  };
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  // A tensor's shape: sizes whose product fits int64 (StoredTensor::numel multiplies them).
  auto shape_field = [&](const json& t) {
    const json& js = t.at("shape");
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (size_t i = 0; js.is_array() && i < js.size(); ++i) {
      const std::optional<int64_t> v = io::json_integer(js[i], 0);
      if (!v || __builtin_mul_overflow(numel, *v, &numel)) break;
      shape.push_back(*v);
    }
    if (!js.is_array() || shape.size() != js.size())
      throw bad(fmt::format("malformed metadata: shape {} is not a list of sizes", js.dump()));
    return shape;
  };
  try {
    if (meta_.value("format", "") != kFormat) throw bad("not a shardlm checkpoint (format is not shardlm-checkpoint)");
    const int version = int(integer(meta_, "format_version", std::numeric_limits<int>::min(), kMaxInt));
    if (version > kFormatVersion)
      throw bad(fmt::format("written by a newer shardlm (format version {}; this build reads up to {})", version,
                            kFormatVersion));
    if (version < 1) throw bad(fmt::format("unknown format version {}", version));
    if (uint64_t(integer(meta_.at("checksum"), "block_bytes")) != kChecksumBlockBytes)
      throw bad("unsupported checksum block size");
    step_ = integer(meta_, "step");
    model_ = model_config_from_json(meta_.at("model"));
    if (meta_.contains("lora")) lora_ = lora_spec_from_peft_json(meta_.at("lora"), meta_path);
    for (const json& u : meta_.at("units")) {
      const int unit = int(integer(u, "unit", 0, kMaxInt));
      for (const json& t : u.at("tensors")) {
        StoredTensor st{t.at("name").get<std::string>(), shape_field(t), unit, integer(t, "offset")};
        int64_t end = 0;  // read() adds offsets and counts: they must not overflow
        if (__builtin_add_overflow(st.offset, st.numel(), &end))
          throw Error("malformed metadata: offset + size overflows", {.file = meta_path, .tensor = st.name});
        if (!tensor_index_.emplace(st.name, tensors_.size()).second)
          throw Error("listed twice in the metadata", {.file = meta_path, .tensor = st.name});
        tensors_.push_back(std::move(st));
      }
    }
    for (const json& f : meta_.at("files")) {
      auto file = std::make_unique<File>();
      file->name = f.at("file").get<std::string>();
      if (file->name.find('/') != std::string::npos) throw bad(fmt::format("file name '{}' has a '/'", file->name));
      file->path = (d / file->name).string();
      file->bytes = uint64_t(integer(f, "bytes"));
      for (const json& r : f.at("ranges")) {
        Range range{int(integer(r, "unit", 0, kMaxInt)), integer(r, "begin"), integer(r, "numel")};
        int64_t end = 0;
        if (__builtin_add_overflow(range.begin, range.numel, &end))
          throw bad(fmt::format("malformed metadata: range {} + {} overflows", range.begin, range.numel));
        file->ranges.push_back(range);
      }
      for (const auto& [tensor, list] : f.at("crc32").items())
        file->crc[tensor] = parse_hex_list(list.get<std::string>(), meta_path, tensor);
      files_.push_back(std::move(file));
    }
  } catch (const json::exception& e) {
    throw bad(fmt::format("malformed metadata: {}", e.what()));
  }
  // Every shard file present with its recorded size: a missing or truncated file is named now,
  // before any rank has read anything.
  for (const auto& f : files_) {
    struct stat sb {};
    if (::stat(f->path.c_str(), &sb) != 0) throw Error("missing checkpoint shard file", {.file = f->path});
    if (uint64_t(sb.st_size) != f->bytes)
      throw Error(fmt::format("checkpoint shard file is {} bytes but the metadata records {} (truncated or replaced)",
                              uint64_t(sb.st_size), f->bytes),
                  {.file = f->path});
  }
}

const StoredTensor& CheckpointReader::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) throw Error("the checkpoint has no such tensor", {.file = dir_, .tensor = name});
  return tensors_[it->second];
}

CheckpointReader::File& CheckpointReader::open_file(size_t i) {
  File& f = *files_[i];
  if (!f.st) {
    // Opened into a local and kept only once every check passed: a file that failed them once
    // must fail them again on the next read, not be taken as checked.
    auto st = std::make_unique<io::SafetensorsFile>(f.path);
    std::map<std::string, std::vector<uint8_t>> verified;
    // The header must agree with the metadata: the same tensors, sizes and checksum lists.
    for (const Range& r : f.ranges) {
      auto begin = st->metadata().find(fmt::format("unit{}.begin", r.unit));
      if (begin == st->metadata().end() || begin->second != std::to_string(r.begin))
        throw Error(fmt::format("the file's header does not place unit {} at element {} as the metadata does", r.unit,
                                r.begin),
                    {.file = f.path});
      for (Field fl : kFields) {
        const std::string name = unit_tensor(r.unit, fl);
        // The master is f32; the moments f32, bf16, or u8 codes with an f32 absmax per 256 (the
        // saving run's optimizer state).
        const std::optional<DType> dt = st->has(name) ? st->info(name).dtype : std::nullopt;
        const bool dtype_ok = dt == DType::F32 || (fl != Field::Master && (dt == DType::BF16 || dt == DType::U8));
        if (!dtype_ok || st->info(name).numel() != r.numel)
          throw Error(fmt::format("does not hold the {}[{}] tensor the metadata lists",
                                  fl == Field::Master ? "f32 " : "f32, bf16 or u8 ", r.numel),
                      {.file = f.path, .tensor = name});
        std::vector<std::pair<std::string, int64_t>> stored = {{name, r.numel}};
        if (dt == DType::U8) {
          const std::string am = absmax_tensor(r.unit, fl);
          const int64_t blocks = (r.numel + ops::kQuant8Block - 1) / ops::kQuant8Block;
          if (!st->has(am) || st->info(am).dtype != DType::F32 || st->info(am).numel() != blocks)
            throw Error(fmt::format("8-bit moments without their f32 [{}] absmax", blocks), {.file = f.path, .tensor = am});
          stored.emplace_back(am, blocks);
        }
        for (const auto& [t, numel] : stored) {
          auto crc = f.crc.find(t);
          const uint64_t esize = st->info(t).element_size();
          const uint64_t blocks = (uint64_t(numel) * esize + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
          if (crc == f.crc.end() || crc->second.size() != blocks)
            throw Error("the metadata has no checksums for this tensor", {.file = f.path, .tensor = t});
          verified[t].assign(size_t(blocks), 0);
        }
      }
    }
    f.verified = std::move(verified);
    f.st = std::move(st);
  }
  return f;
}

const uint8_t* CheckpointReader::verified_bytes(File& f, const std::string& t, uint64_t lo, uint64_t hi) {
  const std::span<const uint8_t> bytes = f.st->bytes(t);
  std::vector<uint8_t>& done = f.verified.at(t);
  const std::vector<uint32_t>& want = f.crc.at(t);
  for (uint64_t blk = lo / kChecksumBlockBytes; hi > lo && blk <= (hi - 1) / kChecksumBlockBytes; ++blk) {
    if (done[blk]) continue;
    const uint64_t s = blk * kChecksumBlockBytes, e = std::min<uint64_t>(bytes.size(), s + kChecksumBlockBytes);
    const uint32_t got = uint32_t(crc32_z(crc32_z(0, nullptr, 0), bytes.data() + s, e - s));
    if (got != want[blk])
      throw Error(fmt::format("checksum mismatch in block {} (bytes {}..{} of the tensor): the file is corrupt", blk, s,
                              e),
                  {.file = f.path, .tensor = t});
    done[blk] = 1;
  }
  return bytes.data();
}

void CheckpointReader::for_each_piece(const std::string& name, int64_t begin, int64_t count, const Piece& piece) {
  const StoredTensor& t = tensor(name);
  if (begin < 0 || count < 0 || begin + count > t.numel())
    throw Error(fmt::format("elements [{}, {}) are outside the tensor's {}", begin, begin + count, t.numel()),
                {.file = dir_, .tensor = name});
  const int64_t lo = t.offset + begin, hi = lo + count;  // in the saved unit's flat buffer
  int64_t covered = 0;
  for (size_t i = 0; i < files_.size(); ++i) {
    for (const Range& r : files_[i]->ranges) {
      if (r.unit != t.unit) continue;
      const int64_t a = std::max(lo, r.begin), b = std::min(hi, r.begin + r.numel);
      if (a >= b) continue;
      piece(open_file(i), r, a - r.begin, b - a, a - lo);
      covered += b - a;
    }
  }
  if (covered != count)
    throw Error(fmt::format("the shard files cover {} of elements [{}, {}) (overlapping or missing ranges)", covered,
                            begin, begin + count),
                {.file = dir_, .tensor = name});
}

void CheckpointReader::read(const std::string& name, Field field, int64_t begin, int64_t count, float* dst) {
  for_each_piece(name, begin, count, [&](File& f, const Range& r, int64_t first, int64_t n, int64_t at) {
    const std::string stored = unit_tensor(r.unit, field);
    const DType dtype = *f.st->info(stored).dtype;  // F32, BF16 or U8, as open_file checked
    float* out = dst + at;
    if (dtype != DType::U8) {  // f32 copied, bf16 widened exactly
      const uint64_t esize = dtype_size(dtype);
      const uint8_t* from = verified_bytes(f, stored, first * esize, (first + n) * esize) + first * esize;
      ops::cast(Tensor::view(out, DType::F32, {n}), Tensor::view(const_cast<uint8_t*>(from), dtype, {n}));
      return;
    }
    // 8-bit: the whole blocks the piece lies in, dequantized (map[code] * absmax), then its part.
    constexpr int64_t B = ops::kQuant8Block;
    const int64_t b0 = first / B, b1 = (first + n - 1) / B + 1, skip = first - b0 * B;
    const int64_t stored_n = f.st->info(stored).numel(), whole = std::min(b1 * B, stored_n) - b0 * B;
    const uint8_t* codes = verified_bytes(f, stored, uint64_t(b0 * B), uint64_t(b0 * B + whole)) + b0 * B;
    const uint8_t* amax = verified_bytes(f, absmax_tensor(r.unit, field), uint64_t(b0) * 4, uint64_t(b1) * 4) + b0 * 4;
    std::vector<float> blocks(static_cast<size_t>(whole));
    ops::dequantize_blockwise8(Tensor::view(blocks.data(), DType::F32, {whole}),
                               Tensor::view(const_cast<uint8_t*>(codes), DType::U8, {whole}),
                               Tensor::view(const_cast<uint8_t*>(amax), DType::F32, {b1 - b0}), field == Field::ExpAvg);
    std::memcpy(out, blocks.data() + skip, size_t(n) * 4);
  });
}

bool CheckpointReader::read_blockwise8(const std::string& name, Field field, int64_t begin, int64_t count,
                                       uint8_t* codes, float* absmax) {
  constexpr int64_t B = ops::kQuant8Block;
  if (field == Field::Master || begin % B != 0) return false;
  bool raw = true;
  for_each_piece(name, begin, count, [&](File& f, const Range& r, int64_t first, int64_t, int64_t) {
    raw = raw && f.st->info(unit_tensor(r.unit, field)).dtype == DType::U8 && first % B == 0;
  });
  if (!raw) return false;
  for_each_piece(name, begin, count, [&](File& f, const Range& r, int64_t first, int64_t n, int64_t at) {
    const std::string stored = unit_tensor(r.unit, field), am = absmax_tensor(r.unit, field);
    std::memcpy(codes + at, verified_bytes(f, stored, uint64_t(first), uint64_t(first + n)) + first, size_t(n));
    const int64_t b0 = first / B, blocks = (n + B - 1) / B;
    std::memcpy(absmax + at / B, verified_bytes(f, am, uint64_t(b0) * 4, uint64_t(b0 + blocks) * 4) + b0 * 4,
                size_t(blocks) * 4);
  });
  return true;
}

void CheckpointReader::drop_resident_pages() {
  for (const auto& f : files_)
    if (f->st) f->st->drop_resident_pages();
}

// ---- resuming -----------------------------------------------------------------------------------

uint64_t load_checkpoint(CheckpointReader& reader, shard::ShardedModel& engine) {
  // Same model: the same tensor names with the same shapes, nothing more, nothing less.
  size_t engine_tensors = 0;
  for (int k = 0; k < engine.num_units(); ++k)
    for (const shard::FlatEntry& e : engine.layout(k).entries) {
      ++engine_tensors;
      const StoredTensor& t = reader.tensor(e.info.name);
      if (t.shape != e.info.shape)
        throw Error(fmt::format("checkpoint of another model: shape [{}] in the checkpoint, [{}] in this model",
                                fmt::join(t.shape, ", "), fmt::join(e.info.shape, ", ")),
                    {.file = reader.dir(), .tensor = e.info.name});
    }
  if (reader.tensors().size() != engine_tensors)
    for (const StoredTensor& t : reader.tensors()) {
      bool found = false;
      for (int k = 0; k < engine.num_units() && !found; ++k)
        for (const shard::FlatEntry& e : engine.layout(k).entries) found = found || e.info.name == t.name;
      if (!found) throw Error("checkpoint of another model: this model has no such tensor", {.file = reader.dir(), .tensor = t.name});
    }

  // Each rank reads exactly the elements it owns, tensor piece by tensor piece.
  uint64_t bytes = 0;
  for (int k = 0; k < engine.num_units(); ++k) {
    const shard::ShardedModel::StateRange s = engine.owned_state(k);
    shard::for_each_overlap(engine.layout(k), s.begin, s.begin + s.numel,
                            [&](const shard::FlatEntry& e, int64_t lo, int64_t hi) {
                              for (Field f : kFields) {
                                const Tensor t = field_of(s, f).slice(lo - s.begin, hi - s.begin);
                                if (t.dtype == DType::F32) {
                                  reader.read(e.info.name, f, lo - e.offset, hi - lo, t.f32());
                                } else if (t.dtype == DType::BF16) {  // read as f32, rounded to nearest once
                                  std::vector<float> f32(size_t(hi - lo));
                                  reader.read(e.info.name, f, lo - e.offset, hi - lo, f32.data());
                                  ops::cast(t, Tensor::view(f32.data(), DType::F32, {hi - lo}, Device::CPU));
                                } else {
                                  // 8-bit: the tensor's whole blocks. Its blocks start with it (the
                                  // plan aligns tensors and shards), and what follows it up to its
                                  // last block's end is padding. Codes and absmax of an 8-bit
                                  // checkpoint are copied as stored (exact); f32 or bf16 moments
                                  // are quantized, the padding zero.
                                  constexpr int64_t B = ops::kQuant8Block;
                                  const int64_t at = lo - s.begin, n = (hi - lo + B - 1) / B * B;
                                  const Tensor codes = field_of(s, f).slice(at, at + n);
                                  const Tensor amax = absmax_of(s, f).slice(at / B, (at + n) / B);
                                  if (!reader.read_blockwise8(e.info.name, f, lo - e.offset, hi - lo,
                                                              static_cast<uint8_t*>(codes.data), amax.f32())) {
                                    std::vector<float> f32(size_t(n), 0.0f);
                                    reader.read(e.info.name, f, lo - e.offset, hi - lo, f32.data());
                                    ops::quantize_blockwise8(codes, amax,
                                                             Tensor::view(f32.data(), DType::F32, {n}, Device::CPU),
                                                             f == Field::ExpAvg);
                                  }
                                }
                                bytes += t.nbytes();
                              }
                            });
  }
  engine.master_weights_changed();
  return bytes;
}

// ---- converting -----------------------------------------------------------------------------------

namespace {
// A LoRA run's adapters, all of them in host memory (they are small), as a PEFT adapter directory.
void write_adapter(const ModelConfig& cfg, const model::LoraSpec& lora, const ConvertOptions& opt,
                   const std::function<void(const std::string& name, float* out)>& read) {
  std::map<std::string, OwnedTensor> owned;
  std::map<std::string, Tensor> views;
  for (const model::LoraTensorInfo& t : model::lora_adapter_tensors(cfg, lora)) {
    OwnedTensor x(DType::F32, t.shape.data(), int(t.shape.size()), MemCategory::Workspace, false);
    read(t.name, x.t.f32());
    views[t.name] = x.t;
    owned[t.name] = std::move(x);
  }
  io::publish_dir(opt.out, opt.publish, opt.role,
                  [&](const std::string& out) { write_peft_adapter(out, lora, cfg, views, opt.dtype); });
}
}  // namespace

void convert_checkpoint(CheckpointReader& reader, const ConvertOptions& opt) {
  if (reader.lora()) {
    write_adapter(reader.model(), *reader.lora(), opt, [&](const std::string& name, float* out) {
      reader.read(name, Field::Master, 0, reader.tensor(name).numel(), out);
    });
    return;
  }
  std::vector<io::PlannedTensor> plan;
  for (const StoredTensor& t : reader.tensors()) plan.emplace_back(t.name, opt.dtype, t.shape);
  // Staging: one f32 chunk and its converted copy. 4 Mi elements keep peak memory near 24 MiB
  // (f32 + bf16) above the program itself, for any model size.
  constexpr int64_t kChunk = int64_t(4) << 20;
  const OwnedTensor f32(DType::F32, {kChunk}, MemCategory::Workspace, false);
  OwnedTensor low;
  if (opt.dtype != DType::F32) low = OwnedTensor(opt.dtype, {kChunk}, MemCategory::Workspace, false);
  io::publish_dir(opt.out, opt.publish, opt.role, [&](const std::string& out) {
  io::write_model_weights_streaming(out, plan, opt.max_shard_bytes, [&](const std::string& name, const io::TensorSink& sink) {
    const int64_t n = reader.tensor(name).numel();
    for (int64_t pos = 0; pos < n; pos += kChunk) {
      const int64_t m = std::min(kChunk, n - pos);
      reader.read(name, Field::Master, pos, m, f32.t.f32());
      reader.drop_resident_pages();
      if (opt.dtype == DType::F32) {
        sink(f32.t.data, size_t(m) * 4);
      } else {
        ops::cast(low.t.slice(0, m), f32.t.slice(0, m));
        sink(low.t.data, size_t(m) * dtype_size(opt.dtype));
      }
    }
  });
  write_hf_side_files(out, reader.model(), opt.dtype, reader.dir());
  });
}

void export_model(shard::ShardedModel& engine, const ModelConfig& cfg, const ConvertOptions& opt,
                  const std::string& tokenizer_source, comm::Communicator& world) {
  // The unit being written, gathered once (the writer asks for tensors in plan order, unit by unit).
  OwnedTensor unit;
  int current = -1;
  auto gather = [&](int k) {
    unit = OwnedTensor();  // free the previous unit first
    current = k;
    if (engine.layout(k).padded_numel == 0) return;  // nothing trained in it (LoRA's frozen units)
    unit = OwnedTensor(DType::F32, {engine.layout(k).padded_numel}, MemCategory::Communication, false);
    engine.gather_unit(k, unit.t);
  };
  if (world.rank() != 0) {
    for (int k = 0; k < engine.num_units(); ++k) gather(k);
    world.barrier();
    return;
  }
  if (const auto& lora = engine.finetune().lora) {  // the adapters, gathered unit by unit, as a PEFT adapter directory
    std::map<std::string, std::vector<float>> values;
    for (int k = 0; k < engine.num_units(); ++k) {
      gather(k);
      for (const shard::FlatEntry& e : engine.layout(k).entries) {
        const float* p = unit.t.f32() + e.offset;
        values[e.info.name].assign(p, p + e.info.numel());
      }
    }
    unit = OwnedTensor();
    write_adapter(cfg, *lora, opt, [&](const std::string& name, float* out) {
      const std::vector<float>& v = values.at(name);
      std::copy(v.begin(), v.end(), out);
    });
    world.barrier();
    return;
  }
  std::vector<io::PlannedTensor> plan;
  std::map<std::string, std::pair<int, const shard::FlatEntry*>> where;
  for (int k = 0; k < engine.num_units(); ++k)
    for (const shard::FlatEntry& e : engine.layout(k).entries) {
      plan.emplace_back(e.info.name, opt.dtype, e.info.shape);
      where[e.info.name] = {k, &e};
    }
  // Elements converted at a time: 4 Mi, or the largest tensor when smaller.
  int64_t chunk = 0;
  for (const io::PlannedTensor& t : plan) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    chunk = std::max(chunk, std::min(n, int64_t(4) << 20));
  }
  OwnedTensor low;
  if (opt.dtype != DType::F32) low = OwnedTensor(opt.dtype, {chunk}, MemCategory::Workspace, false);
  io::publish_dir(opt.out, opt.publish, opt.role, [&](const std::string& out) {
  io::write_model_weights_streaming(out, plan, opt.max_shard_bytes, [&](const std::string& name, const io::TensorSink& sink) {
    const auto [k, e] = where.at(name);
    if (k != current) gather(k);
    const Tensor t = unit.t.slice(e->offset, e->offset + e->info.numel());
    if (opt.dtype == DType::F32) {
      sink(t.data, t.nbytes());
      return;
    }
    for (int64_t pos = 0; pos < t.numel(); pos += chunk) {
      const int64_t m = std::min(chunk, t.numel() - pos);
      ops::cast(low.t.slice(0, m), t.slice(pos, pos + m));
      sink(low.t.data, size_t(m) * dtype_size(opt.dtype));
    }
  });
  // A unit the writer never asked for would leave the other ranks waiting in its gather.
  SHARDLM_CHECK(current == engine.num_units() - 1, "export_model: wrote {} of {} units", current + 1, engine.num_units());
  unit = OwnedTensor();
  write_hf_side_files(out, cfg, opt.dtype, tokenizer_source);
  });
  world.barrier();
}

}  // namespace shardlm::ckpt
