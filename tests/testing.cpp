#include "testing.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/rng.h"

namespace fs = std::filesystem;

namespace shardlm::testing {

TempDir::TempDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  path_ = fs::path(::testing::TempDir()) /
          fmt::format("shardlm_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string TempDir::operator/(const std::string& name) const { return (path_ / name).string(); }

std::vector<std::string> TempDir::list() const {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

LocalEngine::LocalEngine(const ModelConfig& cfg, const shard::ShardingConfig& sc, const model::FinetuneSpec& finetune)
    : local(comm::make_local_communicator()), mesh(shard::make_mesh(*local, sc, 1)), engine(cfg, finetune, sc, mesh) {}

shard::StepStats LocalEngine::step(model::StagedModel& m, const std::vector<data::BatchBuffers>& micro,
                                   const ops::AdamWConfig& opt, int64_t s, double max_grad_norm) {
  std::vector<model::Batch> batches;
  for (const data::BatchBuffers& b : micro) batches.push_back(b.batch());
  return engine.train_step(m, batches, opt, s, max_grad_norm);
}

std::vector<float> LocalEngine::weight(const std::string& name) { return gather_weights(engine).at(name); }

std::vector<float> LocalEngine::grad(const std::string& name) {
  for (int k = 0; k < engine.num_units(); ++k)
    for (const shard::FlatEntry& e : engine.layout(k).entries)
      if (e.info.name == name) {
        const float* g = engine.owned_grad(k).f32() + e.offset;  // one process owns everything
        return std::vector<float>(g, g + e.info.numel());
      }
  throw Error("no such parameter", {.tensor = name});
}

std::map<std::string, std::vector<float>> gather_weights(shard::ShardedModel& engine) {
  std::map<std::string, std::vector<float>> out;
  for (int k = 0; k < engine.num_units(); ++k) {
    const shard::FlatLayout& l = engine.layout(k);
    std::vector<float> unit(size_t(l.padded_numel));
    engine.gather_unit(k, Tensor::view(unit.data(), DType::F32, {l.padded_numel}));
    for (const shard::FlatEntry& e : l.entries)
      out[e.info.name].assign(unit.begin() + e.offset, unit.begin() + e.offset + e.info.numel());
  }
  return out;
}

void set_weights(shard::ShardedModel& engine, const std::map<std::string, std::vector<float>>& values) {
  std::map<std::string, int> found;
  for (int k = 0; k < engine.num_units(); ++k)
    for (const shard::FlatEntry& e : engine.layout(k).entries) {
      const auto it = values.find(e.info.name);
      if (it == values.end()) continue;
      SHARDLM_CHECK(int64_t(it->second.size()) == e.info.numel(), "set_weights: {} has {} values, the engine's tensor {}",
                    e.info.name, it->second.size(), e.info.numel());
      ++found[e.info.name];
    }
  for (const auto& kv : values)
    if (!found.count(kv.first)) throw Error("set_weights: the engine has no such parameter", {.tensor = kv.first});
  for (int k = 0; k < engine.num_units(); ++k) {
    const shard::ShardedModel::StateRange st = engine.owned_state(k);
    float* master = st.master.f32();
    shard::for_each_overlap(engine.layout(k), st.begin, st.begin + st.numel,
                            [&](const shard::FlatEntry& e, int64_t lo, int64_t hi) {
                              const auto it = values.find(e.info.name);
                              if (it == values.end()) return;
                              std::copy(it->second.begin() + (lo - e.offset), it->second.begin() + (hi - e.offset),
                                        master + (lo - st.begin));
                            });
  }
  engine.master_weights_changed();
}

std::vector<float> randn(int64_t n, uint64_t seed, const std::string& name, float std) {
  std::vector<float> v(static_cast<size_t>(n));
  fill_normal(v.data(), n, seed, name, 0, 0.0f, std);
  return v;
}

::testing::AssertionResult all_close(const float* got, const float* want, int64_t n, double atol, double rtol,
                                     const std::string& label) {
  int64_t worst = -1, bad = 0;
  double worst_excess = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    const double tol = atol + rtol * std::fabs(w);
    double excess;
    if (!std::isfinite(w)) {
      excess = (g == w || (std::isnan(g) && std::isnan(w))) ? 0.0 : INFINITY;
    } else if (!std::isfinite(g)) {
      excess = INFINITY;
    } else {
      excess = std::fabs(g - w) - tol;
    }
    if (excess > 0) {
      ++bad;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << fmt::format(
             "{}: {} of {} elements differ beyond atol={} rtol={}; worst at [{}]: got {:.8g}, want {:.8g}", label,
             bad, n, atol, rtol, worst, got[worst], want[worst]);
}

double dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}

Tensor view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor::view(v.data(), DType::F32, shape);
}

Tensor view(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return Tensor::view(v.data(), DType::I32, shape);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a shardlm::Error, but nothing was thrown";
  return "";
}

void expect_error(const std::function<void()>& fn, const std::string& needle) {
  const std::string msg = error_of(fn);
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: '" << msg << "' lacks '" << needle << "'";
}

HostArray::HostArray(DType dt, const std::vector<float>& values) : dtype(dt) {
  if (dt == DType::F32) {
    f = values;
  } else {
    h.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) h[i] = f32_to_bf16(values[i]);
  }
}

Tensor HostArray::view(std::initializer_list<int64_t> shape) {
  return Tensor::view(dtype == DType::F32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()), dtype, shape);
}

std::vector<float> HostArray::values() const {
  if (dtype == DType::F32) return f;
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}

::testing::AssertionResult check_gradient(const std::function<double()>& loss, float* x, int64_t n,
                                          const float* analytic, const GradCheckOptions& opt,
                                          const std::string& label) {
  const int64_t checks = std::min(n, opt.max_checks);
  int64_t bad = 0, worst = -1;
  double worst_excess = 0, worst_fd = 0;
  for (int64_t c = 0; c < checks; ++c) {
    const int64_t i = checks == n ? c : c * n / checks;
    const float saved = x[i];
    x[i] = float(saved + opt.eps);
    const double up = loss();
    x[i] = float(saved - opt.eps);
    const double down = loss();
    x[i] = saved;
    const double fd = (up - down) / (2.0 * opt.eps);
    const double excess = std::fabs(double(analytic[i]) - fd) - (opt.atol + opt.rtol * std::fabs(fd));
    if (!std::isfinite(analytic[i]) || excess > 0) {
      ++bad;
      if (worst < 0 || excess > worst_excess || !std::isfinite(analytic[i])) {
        worst = i;
        worst_excess = excess;
        worst_fd = fd;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << fmt::format(
             "{}: {} of {} checked gradients disagree with finite differences (eps={}); worst at [{}]: "
             "analytic {:.8g}, numeric {:.8g}",
             label, bad, checks, opt.eps, worst, analytic[worst], worst_fd);
}

// ---- npy ---------------------------------------------------------------------------------------

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<float> NpyArray::f32() const {
  const int64_t n = numel();
  std::vector<float> out(static_cast<size_t>(n));
  if (descr == "<f4") {
    std::memcpy(out.data(), bytes.data(), size_t(n) * 4);
  } else if (descr == "<f8") {
    const double* p = reinterpret_cast<const double*>(bytes.data());
    for (int64_t i = 0; i < n; ++i) out[i] = float(p[i]);
  } else if (descr == "<u2") {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(bytes.data());
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(bf16_t{p[i]});
  } else {
    throw Error(fmt::format("npy dtype {} is not a float array", descr));
  }
  return out;
}

std::vector<int32_t> NpyArray::i32() const {
  const int64_t n = numel();
  std::vector<int32_t> out(static_cast<size_t>(n));
  if (descr == "<i4") {
    std::memcpy(out.data(), bytes.data(), size_t(n) * 4);
  } else if (descr == "<i8") {
    const int64_t* p = reinterpret_cast<const int64_t*>(bytes.data());
    for (int64_t i = 0; i < n; ++i) out[i] = int32_t(p[i]);
  } else {
    throw Error(fmt::format("npy dtype {} is not an integer array", descr));
  }
  return out;
}

std::vector<uint16_t> NpyArray::u16() const {
  SHARDLM_CHECK(descr == "<u2", "npy dtype {} is not <u2", descr);
  std::vector<uint16_t> out(static_cast<size_t>(numel()));
  std::memcpy(out.data(), bytes.data(), out.size() * 2);
  return out;
}

data::BatchBuffers load_reference_batch(const std::string& ref_dir, int s) {
  const std::string p = ref_dir + "/batch" + std::to_string(s) + "_";
  data::BatchBuffers b;
  NpyArray ids = load_npy(p + "ids.npy");
  b.B = ids.shape[0];
  b.T = ids.shape[1];
  b.ids = ids.i32();
  b.targets = load_npy(p + "targets.npy").i32();
  if (std::filesystem::exists(p + "positions.npy")) b.positions = load_npy(p + "positions.npy").i32();
  if (std::filesystem::exists(p + "segments.npy")) b.segments = load_npy(p + "segments.npy").i32();
  return b;
}

NpyArray load_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  SHARDLM_CHECK(f.good(), "{}: cannot open", path);
  char magic[8];
  f.read(magic, 8);
  SHARDLM_CHECK(f.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, "{}: not an .npy file", path);
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t h;
    f.read(reinterpret_cast<char*>(&h), 2);
    header_len = h;
  } else {
    f.read(reinterpret_cast<char*>(&header_len), 4);
  }
  std::string header(header_len, '\0');
  f.read(header.data(), header_len);
  NpyArray a;
  auto field = [&](const std::string& key) {
    const size_t p = header.find("'" + key + "':");
    SHARDLM_CHECK(p != std::string::npos, "{}: npy header lacks '{}'", path, key);
    return p + key.size() + 3;
  };
  size_t p = header.find('\'', field("descr"));
  a.descr = header.substr(p + 1, header.find('\'', p + 1) - p - 1);
  SHARDLM_CHECK(header.find("'fortran_order': False") != std::string::npos, "{}: Fortran order", path);
  p = header.find('(', field("shape"));
  const size_t end = header.find(')', p);
  std::string dims = header.substr(p + 1, end - p - 1);
  for (size_t i = 0; i < dims.size();) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    size_t j = i;
    while (j < dims.size() && std::isdigit(static_cast<unsigned char>(dims[j]))) ++j;
    a.shape.push_back(std::stoll(dims.substr(i, j - i)));
    i = j;
  }
  const size_t elem = a.descr == "<f8" || a.descr == "<i8" ? 8 : a.descr == "<u2" ? 2 : 4;
  a.bytes.resize(size_t(a.numel()) * elem);
  f.read(a.bytes.data(), std::streamsize(a.bytes.size()));
  SHARDLM_CHECK(f.gcount() == std::streamsize(a.bytes.size()), "{}: truncated", path);
  return a;
}

void save_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t s : shape) {
    dims += std::to_string(s) + ",";
    n *= s;
  }
  if (shape.size() > 1) dims.pop_back();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  SHARDLM_CHECK(f.good(), "{}: cannot write", path);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = uint16_t(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
  SHARDLM_CHECK(f.good(), "{}: write failed", path);
}

bool RefCase::has(const std::string& name_) const { return fs::exists(fs::path(dir) / (name_ + ".npy")); }

NpyArray RefCase::array(const std::string& name_) const {
  return load_npy((fs::path(dir) / (name_ + ".npy")).string());
}

std::vector<RefCase> load_ref_cases(const std::string& op) {
  const char* root = std::getenv("SHARDLM_TORCH_REFS");
  SHARDLM_CHECK(root && *root, "SHARDLM_TORCH_REFS is not set (run the tests through ctest)");
  const fs::path dir = fs::path(root) / op;
  SHARDLM_CHECK(fs::is_directory(dir), "{}: no PyTorch reference cases for op '{}'", dir.string(), op);
  std::vector<RefCase> cases;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_directory()) continue;
    RefCase c;
    c.op = op;
    c.name = entry.path().filename().string();
    c.dir = entry.path().string();
    std::ifstream pf(entry.path() / "params.json");
    c.params = pf.good() ? nlohmann::json::parse(pf) : nlohmann::json::object();
    cases.push_back(std::move(c));
  }
  std::sort(cases.begin(), cases.end(), [](const RefCase& a, const RefCase& b) { return a.name < b.name; });
  SHARDLM_CHECK(!cases.empty(), "{}: no PyTorch reference cases for op '{}'", dir.string(), op);
  return cases;
}

}  // namespace shardlm::testing
