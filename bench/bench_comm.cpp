// bench_comm: raw MPI collectives beside shardlm's Communicator, at the message sizes the engine
// sends (bench/comm.sh runs it).
//
//   mpirun -np N bench_comm [--model llama3.2-1b --layers 4 --sizes units,sweep --max-mib 256
//                            --dtype all --iters 5 --warmup 1]
//   --sizes   units: one message per distinct unit size of the model's FULL_SHARD plan on N ranks
//                    (TRANSFORMER_BASED_WRAP: a decoder layer; the embedding, tied to the head);
//             sweep: total buffers of 1 MiB, 2 MiB, ... --max-mib MiB;
//             or a comma list of total sizes in MiB ("4,64") or, with a k, KiB ("64k"); parts may be
//             combined ("units,16").
//   --dtype   f32, bf16 or all
//   --iters   timed rounds; --warmup untimed rounds before them
//
// For each size, dtype and op (all-gather, reduce-scatter, all-reduce) three variants run on the
// same buffers: raw MPI's blocking call (MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce),
// raw MPI's non-blocking call + MPI_Wait (MPI_Iallgather, ... : what MpiCommunicator issues), and
// shardlm's Communicator (*_async, then Request::wait, which polls under the collective watchdog).
// The variants are interleaved: each round runs all three, the order rotating from round to round,
// so that drift on a shared machine affects all alike. Every timed op starts after a barrier; its
// time is the slowest rank's (MPI_Allreduce MAX). Reported: median and best over rounds.
//
// Before timing, shardlm's result is checked against raw MPI's on the same inputs: all-gathers
// bit-exact, reductions within a tolerance (f32 1e-6, bf16 1e-2 relative), so that a fast but
// wrong path cannot win. MPI has no bf16 type or sum: raw MPI's bf16 reductions use an MPI_Op
// defined here that adds in f32 and rounds to bf16, the arithmetic shardlm's own op documents.
//
// Bandwidths (GB = 1e9 B) follow nccl-tests: algbw = total buffer bytes / time; busbw = algbw x
// (N-1)/N for all-gather and reduce-scatter, x 2(N-1)/N for all-reduce.
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/config.h"
#include "shard/plan.h"

#ifdef SHARDLM_HAVE_MPI
#include <mpi.h>
#endif

using namespace shardlm;

#ifndef SHARDLM_HAVE_MPI
int main() {
  fmt::print(stderr, "bench_comm: this build has no MPI (configure with MPI found, then run under mpirun)\n");
  return 2;
}
#else

namespace {

struct Args {
  std::string model = "llama3.2-1b";
  int64_t layers = 4;
  std::string sizes = "units,sweep";
  int64_t max_mib = 256;
  std::string dtype = "all";
  int64_t iters = 5, warmup = 1;
};

// `--key value` pairs, as bench/bench_args.h reads them; exits with a usage line on an unknown key.
Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      fmt::print(stderr, "option {} needs a value (see the comment at the top of bench/bench_comm.cpp)\n", k);
      std::exit(2);
    }
    const std::string v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--layers") a.layers = std::atoll(v.c_str());
    else if (k == "--sizes") a.sizes = v;
    else if (k == "--max-mib") a.max_mib = std::atoll(v.c_str());
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--iters") a.iters = std::atoll(v.c_str());
    else if (k == "--warmup") a.warmup = std::atoll(v.c_str());
    else {
      fmt::print(stderr, "unknown option {} (see the comment at the top of bench/bench_comm.cpp)\n", k);
      std::exit(2);
    }
  }
  if (a.iters < 1 || a.warmup < 0 || a.layers < 1 || a.max_mib < 1) {
    fmt::print(stderr, "bench_comm: --iters, --layers and --max-mib must be >= 1, --warmup >= 0\n");
    std::exit(2);
  }
  if (a.dtype != "f32" && a.dtype != "bf16" && a.dtype != "all") {
    fmt::print(stderr, "bench_comm: --dtype is f32, bf16 or all, not '{}'\n", a.dtype);
    std::exit(2);
  }
  return a;
}

// One message size: `elems` elements in the full (all-gathered / reduce-scattered) buffer, a
// multiple of the rank count, or -1 with `kib` for a size given in bytes (elements follow the dtype).
struct Size {
  std::string label;
  int64_t elems = -1;
  int64_t kib = 0;
  int64_t full_elems(DType d, int ranks) const {
    if (elems >= 0) return elems;
    const int64_t e = kib * 1024 / int64_t(dtype_size(d));
    return e / ranks * ranks;  // every rank's shard the same size, as the plan pads units
  }
};

std::vector<Size> message_sizes(const Args& a, int rank, int ranks) {
  std::vector<Size> out;
  size_t pos = 0;
  while (pos <= a.sizes.size()) {
    const size_t comma = std::min(a.sizes.find(',', pos), a.sizes.size());
    const std::string part = a.sizes.substr(pos, comma - pos);
    pos = comma + 1;
    if (part == "units") {
      // The engine's messages: each unit's flat buffer, padded to a multiple of the shard group.
      ModelConfig cfg = preset(a.model);
      cfg.num_hidden_layers = a.layers;
      const shard::UnitPlan plan = shard::make_plan(cfg, {}, shard::ShardingConfig{}, rank, ranks);
      for (const shard::PlannedUnit& u : plan.units) {
        const int64_t n = u.layout.padded_numel;
        const bool seen = std::any_of(out.begin(), out.end(), [&](const Size& s) { return s.elems == n; });
        if (seen) continue;
        const int64_t same = std::count_if(plan.units.begin(), plan.units.end(),
                                           [&](const shard::PlannedUnit& v) { return v.layout.padded_numel == n; });
        out.push_back({fmt::format("{}{}", u.name, same > 1 ? fmt::format(" (x{})", same) : ""), n});
      }
    } else if (part == "sweep") {
      for (int64_t m = 1; m <= a.max_mib; m *= 2) out.push_back({"sweep", -1, m * 1024});
    } else if (const size_t digits = std::strspn(part.c_str(), "0123456789");
               digits > 0 && (digits == part.size() || (digits + 1 == part.size() && part.back() == 'k'))) {
      const int64_t n = std::atoll(part.c_str());
      out.push_back({"size", -1, digits == part.size() ? n * 1024 : n});
    } else {
      fmt::print(stderr, "bench_comm: --sizes takes units, sweep or sizes (MiB; KiB with a k), not '{}'\n", part);
      std::exit(2);
    }
  }
  return out;
}

// Raw MPI's bf16 sum (MPI has none): each pair added in f32, the result rounded to bf16.
void raw_bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = f32_to_bf16(bf16_to_f32(bf16_t{a[i]}) + bf16_to_f32(bf16_t{b[i]})).bits;
}

// A value in [-1, 1) that differs by rank and element, so that a gather or reduction that mixes
// up ranks or offsets shows up in the check.
float input_value(int rank, int64_t i) {
  const uint64_t h = (uint64_t(i) * 2654435761u + uint64_t(rank) * 40503u) % 2048u;
  return float(int64_t(h) - 1024) / 1024.0f;
}

void fill(const Tensor& t, int rank) {
  const int64_t n = t.numel();
  if (t.dtype == DType::F32) {
    float* p = t.f32();
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) p[i] = input_value(rank, i);
  } else {
    uint16_t* p = static_cast<uint16_t*>(t.data);
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(input_value(rank, i)).bits;
  }
}

float element(const Tensor& t, int64_t i) {
  return t.dtype == DType::F32 ? static_cast<const float*>(t.data)[i]
                               : bf16_to_f32(bf16_t{static_cast<const uint16_t*>(t.data)[i]});
}

// Elements of `got` that differ from `want`: bytes for a gather, a relative tolerance for a sum.
int64_t mismatches(const Tensor& got, const Tensor& want, bool exact) {
  if (exact) return std::memcmp(got.data, want.data, got.nbytes()) == 0 ? 0 : 1;
  const double tol = got.dtype == DType::F32 ? 1e-6 : 1e-2;
  int64_t bad = 0;
  const int64_t n = got.numel();
#pragma omp parallel for reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) {
    const double g = element(got, i), w = element(want, i);
    if (!(std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w)))) ++bad;
  }
  return bad;
}

// Seconds of one collective: from a barrier to this rank's completion, the slowest rank's.
double time_op(const std::function<void()>& op) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  op();
  const double mine = MPI_Wtime() - t0;
  double slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

enum class Op { AllGather, ReduceScatter, AllReduce };
const char* op_name(Op o) {
  return o == Op::AllGather ? "all-gather" : o == Op::ReduceScatter ? "reduce-scatter" : "all-reduce";
}

struct Variant {
  const char* name;
  std::function<void()> run;
  std::vector<double> seconds;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);  // before MPI starts: a bad option exits without it
  const std::unique_ptr<comm::Communicator> world = comm::make_world_communicator();
  const int rank = world->rank(), W = world->size();
  if (W < 2) {
    if (rank == 0)
      fmt::print(stderr, "bench_comm: needs 2 or more MPI ranks, got {} (run: mpirun -np 2 bench_comm, or bench/comm.sh 2)\n", W);
    return 2;
  }
  const std::vector<Size> sizes = message_sizes(args, rank, W);
  std::vector<DType> dtypes;
  if (args.dtype != "bf16") dtypes.push_back(DType::F32);
  if (args.dtype != "f32") dtypes.push_back(DType::BF16);
  MPI_Op bf16_sum = MPI_OP_NULL;
  MPI_Op_create(&raw_bf16_sum, 1, &bf16_sum);
  bool any_mismatch = false;  // exit status 1: shardlm's result differed from raw MPI's somewhere

  if (rank == 0) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string mpi_version(lib, size_t(len));
    mpi_version = mpi_version.substr(0, mpi_version.find_first_of(",\n"));
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
    fmt::print("bench_comm: {} ranks on {}; {} OpenMP thread(s) per rank; {}; {}; units of {} with {} layers; "
               "median and best of {} rounds after {} warm-up\n",
               W, host, omp_get_max_threads(), mpi_version, date, args.model, args.layers, args.iters, args.warmup);
    fmt::print("  ms: median / best over rounds (slowest rank); GB/s: algbw / busbw of the median "
               "(nccl-tests); /blk, /I*: shardlm's median / raw MPI's (blocking, I*+Wait); < 1 = shardlm faster\n");
    fmt::print("{:<14} {:<4} {:<26} {:>10} {:>10} | {:>17} {:>13} | {:>17} {:>13} | {:>17} {:>13} | {:>6} {:>6} | {}\n",
               "op", "type", "message", "total", "per rank", "MPI blocking ms", "GB/s", "MPI I*+Wait ms", "GB/s",
               "shardlm ms", "GB/s", "/blk", "/I*", "check");
  }

  for (const Size& size : sizes) {
    for (DType dt : dtypes) {
      const int64_t full_n = size.full_elems(dt, W), part_n = full_n / W;
      if (part_n == 0 || full_n > int64_t(INT32_MAX)) continue;  // MPI counts are ints
      const MPI_Datatype mt = dt == DType::F32 ? MPI_FLOAT : MPI_UINT16_T;
      const MPI_Op sum = dt == DType::F32 ? MPI_SUM : bf16_sum;
      const int pn = int(part_n), fn = int(full_n);
      for (Op op : {Op::AllGather, Op::ReduceScatter, Op::AllReduce}) {
        // full [W * part_n]: all-gather's output, reduce-scatter's input, all-reduce's buffer (in place).
        // part [part_n]: all-gather's input (this rank's shard), reduce-scatter's output.
        OwnedTensor full(dt, {full_n}, MemCategory::Communication, false);
        OwnedTensor part(dt, {part_n}, MemCategory::Communication, false);
        int64_t bad = 0;
        {
          // The check: raw MPI's result into ref_*, shardlm's into full/part, from the same inputs.
          OwnedTensor ref_full(dt, {full_n}, MemCategory::Communication, false);
          OwnedTensor ref_part(dt, {part_n}, MemCategory::Communication, false);
          if (op == Op::AllGather) {
            fill(part, rank);
            MPI_Allgather(part.t.data, pn, mt, ref_full.t.data, pn, mt, MPI_COMM_WORLD);
            world->all_gather(full, part);
            bad = mismatches(full, ref_full, true);
          } else if (op == Op::ReduceScatter) {
            fill(full, rank);
            MPI_Reduce_scatter_block(full.t.data, ref_part.t.data, pn, mt, sum, MPI_COMM_WORLD);
            world->reduce_scatter(part, full, comm::ReduceOp::Sum);
            bad = mismatches(part, ref_part, false);
          } else {
            fill(full, rank);
            std::memcpy(ref_full.t.data, full.t.data, full.t.nbytes());
            MPI_Allreduce(MPI_IN_PLACE, ref_full.t.data, fn, mt, sum, MPI_COMM_WORLD);
            world->all_reduce(full, comm::ReduceOp::Sum);
            bad = mismatches(full, ref_full, false);
          }
          int64_t all_bad = 0;
          MPI_Allreduce(&bad, &all_bad, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
          bad = all_bad;
          any_mismatch = any_mismatch || bad != 0;
        }
        // The three variants, on the same buffers. All-reduce works in place, as MpiCommunicator's
        // does: its values grow round by round (by at most W^rounds, far from f32/bf16 overflow).
        void* fd = full.t.data;
        void* pd = part.t.data;
        std::vector<Variant> variants;
        if (op == Op::AllGather) {
          variants.push_back({"raw", [&] { MPI_Allgather(pd, pn, mt, fd, pn, mt, MPI_COMM_WORLD); }, {}});
          variants.push_back({"raw-i", [&] {
                                MPI_Request r;
                                MPI_Iallgather(pd, pn, mt, fd, pn, mt, MPI_COMM_WORLD, &r);
                                MPI_Wait(&r, MPI_STATUS_IGNORE);
                              }, {}});
          variants.push_back({"shardlm", [&] { world->all_gather_async(full, part)->wait(); }, {}});
        } else if (op == Op::ReduceScatter) {
          variants.push_back({"raw", [&] { MPI_Reduce_scatter_block(fd, pd, pn, mt, sum, MPI_COMM_WORLD); }, {}});
          variants.push_back({"raw-i", [&] {
                                MPI_Request r;
                                MPI_Ireduce_scatter_block(fd, pd, pn, mt, sum, MPI_COMM_WORLD, &r);
                                MPI_Wait(&r, MPI_STATUS_IGNORE);
                              }, {}});
          variants.push_back({"shardlm", [&] { world->reduce_scatter_async(part, full, comm::ReduceOp::Sum)->wait(); }, {}});
        } else {
          variants.push_back({"raw", [&] { MPI_Allreduce(MPI_IN_PLACE, fd, fn, mt, sum, MPI_COMM_WORLD); }, {}});
          variants.push_back({"raw-i", [&] {
                                MPI_Request r;
                                MPI_Iallreduce(MPI_IN_PLACE, fd, fn, mt, sum, MPI_COMM_WORLD, &r);
                                MPI_Wait(&r, MPI_STATUS_IGNORE);
                              }, {}});
          variants.push_back({"shardlm", [&] { world->all_reduce_async(full, comm::ReduceOp::Sum)->wait(); }, {}});
        }
        for (int64_t round = 0; round < args.warmup + args.iters; ++round) {
          for (size_t k = 0; k < variants.size(); ++k) {
            Variant& v = variants[(k + size_t(round)) % variants.size()];  // rotate who goes first
            const double s = time_op(v.run);
            if (round >= args.warmup) v.seconds.push_back(s);
          }
        }
        if (rank != 0) continue;
        const double total = double(full.t.nbytes());
        const double bus = op == Op::AllReduce ? 2.0 * (W - 1) / W : double(W - 1) / W;
        auto cell = [&](const Variant& v) {
          const double med = median(v.seconds), best = *std::min_element(v.seconds.begin(), v.seconds.end());
          return fmt::format("{:8.2f} /{:7.2f} {:6.2f} /{:6.2f}", med * 1e3, best * 1e3, total / med / 1e9,
                             total / med / 1e9 * bus);
        };
        const double raw = median(variants[0].seconds), raw_i = median(variants[1].seconds),
                     sl = median(variants[2].seconds);
        fmt::print("{:<14} {:<4} {:<26} {:>10} {:>10} | {} | {} | {} | {:6.2f} {:6.2f} | {}\n", op_name(op),
                   dtype_name(dt), size.label, format_bytes(int64_t(total)), format_bytes(int64_t(part.t.nbytes())),
                   cell(variants[0]), cell(variants[1]), cell(variants[2]), sl / raw, sl / raw_i,
                   bad == 0 ? "ok" : fmt::format("MISMATCH ({} elements)", bad));
        std::fflush(stdout);
      }
    }
  }
  MPI_Op_free(&bf16_sum);
  return any_mismatch ? 1 : 0;
}

#endif  // SHARDLM_HAVE_MPI
