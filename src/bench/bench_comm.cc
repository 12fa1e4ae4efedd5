// `strata bench comm`: the speed of the collectives between ranks (all-gather, reduce-scatter,
// all-reduce) through Strata's Comm, against MPI's own collectives and a plain memcpy measured in
// the same run, after checking every result element for exactness. Run it under the launcher:
// `mpirun -np 2 strata bench comm`. See docs/multi-gpu.md and docs/benchmarks.md.
#include <json/json.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "bench/bench.h"
#include "comm/mpi_comm.h"
#include "comm/world.h"
#include "common/units.h"
#include "kernels/cpu/float16.h"

namespace strata::bench {
namespace {

using comm::CollectiveKind;
using comm::CollectiveOp;
using comm::DataType;
using Clock = std::chrono::steady_clock;

struct BenchCommOptions {
  std::string bytes = "64MiB";
  int repeats = 5;
  std::string type = "fp32";
  std::vector<std::string> ops = {"all_gather", "reduce_scatter", "all_reduce"};
  double timeout_s = 300.0;
  bool no_baseline = false;
  bool json = false;
};

// Page-aligned memory for one benchmark buffer.
struct AlignedBuffer {
  explicit AlignedBuffer(std::uint64_t bytes)
      : data(static_cast<std::byte*>(
            ::operator new(std::max<std::uint64_t>(bytes, 64), std::align_val_t(4096)))) {}
  ~AlignedBuffer() { ::operator delete(data, std::align_val_t(4096)); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* data;
};

// Rank k's input element j: a multiple of 1/4 below 4, so sums over up to 16 ranks are exact in
// every float type (and so independent of the summation order).
double pattern(int rank, std::uint64_t j) {
  return static_cast<double>((j * 7 + static_cast<std::uint64_t>(rank) * 13) % 16) * 0.25;
}

void store(std::byte* base, DataType type, std::uint64_t i, double v) {
  switch (type) {
    case DataType::kF32:
      reinterpret_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DataType::kF64:
      reinterpret_cast<double*>(base)[i] = v;
      return;
    case DataType::kBF16:
      reinterpret_cast<std::uint16_t*>(base)[i] = kernels::float_to_bf16(static_cast<float>(v));
      return;
    case DataType::kF16:
      reinterpret_cast<std::uint16_t*>(base)[i] = kernels::float_to_fp16(static_cast<float>(v));
      return;
    default:
      return;
  }
}

bool equal_at(const std::byte* base, DataType type, std::uint64_t i, double expected) {
  const std::uint64_t size = comm::data_type_bytes(type);
  std::byte want[8];
  store(want, type, 0, expected);
  return std::memcmp(base + i * size, want, size) == 0;
}

struct OpPlan {
  CollectiveKind kind;
  std::uint64_t count;  // the count passed to the Comm
  std::uint64_t send_elems;
  std::uint64_t recv_elems;
  double bus_factor;  // busbw = algbw * bus_factor (the nccl-tests convention)
};

OpPlan plan_op(CollectiveKind kind, std::uint64_t elems, int world) {
  const auto w = static_cast<std::uint64_t>(world);
  const double f = world > 1 ? static_cast<double>(world - 1) / world : 0.0;
  switch (kind) {
    case CollectiveKind::kAllGather:
      return {kind, elems / w, elems / w, elems / w * w, f};
    case CollectiveKind::kReduceScatter:
      return {kind, elems / w, elems / w * w, elems / w, f};
    default:
      return {kind, elems, elems, elems, 2 * f};
  }
}

// The number of result elements that differ from the expected value (first one in *first).
std::uint64_t check(const OpPlan& p, const std::byte* recv, DataType type, int rank, int world,
                    std::uint64_t* first) {
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < p.recv_elems; ++i) {
    double expected = 0;
    if (p.kind == CollectiveKind::kAllGather) {
      expected = pattern(static_cast<int>(i / p.count), i % p.count);
    } else {
      const std::uint64_t j = p.kind == CollectiveKind::kReduceScatter
                                  ? static_cast<std::uint64_t>(rank) * p.count + i
                                  : i;
      for (int k = 0; k < world; ++k)
        expected += pattern(k, j);
    }
    if (!equal_at(recv, type, i, expected)) {
      if (wrong == 0) *first = i;
      ++wrong;
    }
  }
  return wrong;
}

// Runs `body` `repeats` times between barriers; returns the median over iterations of the slowest
// rank's seconds.
template <typename Body>
Result<double> time_slowest(comm::Comm& c, int repeats, Body&& body) {
  std::vector<double> seconds(static_cast<std::size_t>(repeats));
  for (int r = 0; r < repeats; ++r) {
    STRATA_ASSIGN_OR_RETURN(comm::Handle b, c.barrier());
    STRATA_TRY(c.wait(b));
    const auto t0 = Clock::now();
    STRATA_TRY(body());
    seconds[static_cast<std::size_t>(r)] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  STRATA_ASSIGN_OR_RETURN(
      comm::Handle h, c.all_reduce(seconds.data(), seconds.data(), seconds.size(), DataType::kF64,
                                   comm::ReduceOp::kMax));
  STRATA_TRY(c.wait(h));
  return median(seconds);
}

Result<DataType> parse_type(const std::string& text) {
  if (text == "fp32") return DataType::kF32;
  if (text == "bf16") return DataType::kBF16;
  if (text == "fp16") return DataType::kF16;
  if (text == "fp64") return DataType::kF64;
  return Status(ErrorCode::kUsage,
                fmt::format("--type '{}' is not one of fp32, bf16, fp16, fp64", text));
}

Result<CollectiveKind> parse_op(const std::string& text) {
  if (text == "all_gather" || text == "all-gather") return CollectiveKind::kAllGather;
  if (text == "reduce_scatter" || text == "reduce-scatter") return CollectiveKind::kReduceScatter;
  if (text == "all_reduce" || text == "all-reduce") return CollectiveKind::kAllReduce;
  return Status(
      ErrorCode::kUsage,
      fmt::format("--ops '{}' is not one of all_gather, reduce_scatter, all_reduce", text));
}

struct OpResult {
  CollectiveKind kind;
  double seconds = 0;
  double mpi_seconds = 0;  // 0: no baseline
  double bus_factor = 0;
};

Status run(const BenchCommOptions& o, comm::World& world, Json::Value* out) {
  comm::Comm& c = *world.comm;
  const int w = c.world_size();
  const int me = c.rank();
  STRATA_ASSIGN_OR_RETURN(DataType type, parse_type(o.type));
  const std::uint64_t size = comm::data_type_bytes(type);
  std::optional<std::uint64_t> bytes = parse_bytes(o.bytes);
  if (!bytes || *bytes < size * static_cast<std::uint64_t>(w)) {
    return Status(
        ErrorCode::kUsage,
        fmt::format("--bytes '{}' is not a byte count of at least one element per rank", o.bytes));
  }
  const std::uint64_t elems =
      *bytes / size / static_cast<std::uint64_t>(w) * static_cast<std::uint64_t>(w);
  const std::uint64_t buffer_bytes = elems * size;
  // Send and receive buffers 4 KiB + 64 B apart, never a large power of two apart.
  AlignedBuffer send(buffer_bytes + 4096);
  AlignedBuffer recv(buffer_bytes + 8192 + 64);
  std::byte* recv_data = recv.data + 4096 + 64;
  const bool baseline = !o.no_baseline && std::strcmp(c.kind(), "mpi") == 0 &&
                        (type == DataType::kF32 || type == DataType::kF64);

  std::vector<OpResult> results;
  for (const std::string& name : o.ops) {
    STRATA_ASSIGN_OR_RETURN(CollectiveKind kind, parse_op(name));
    const OpPlan p = plan_op(kind, elems, w);
    for (std::uint64_t j = 0; j < p.send_elems; ++j)
      store(send.data, type, j, pattern(me, j));
    CollectiveOp op;
    op.kind = kind;
    op.send = send.data;
    op.recv = recv_data;
    op.count = p.count;
    op.type = type;
    auto issue = [&]() -> Status {
      Result<comm::Handle> h =
          kind == CollectiveKind::kAllGather ? c.all_gather(op.send, op.recv, op.count, type)
          : kind == CollectiveKind::kReduceScatter
              ? c.reduce_scatter(op.send, op.recv, op.count, type, comm::ReduceOp::kSum)
              : c.all_reduce(op.send, op.recv, op.count, type, comm::ReduceOp::kSum);
      if (!h.is_ok()) return h.status();
      return c.wait(*h);
    };
    // Check every element once (also the warm-up), then time.
    std::memset(recv_data, 0xff, p.recv_elems * size);
    STRATA_TRY(issue());
    std::uint64_t first = 0;
    std::int64_t wrong =
        w <= 16 ? static_cast<std::int64_t>(check(p, recv_data, type, me, w, &first)) : 0;
    if (wrong > 0) {
      return Status(ErrorCode::kInternal,
                    fmt::format("rank {}: {} of {} result elements are wrong, the first at element "
                                "{}",
                                me, wrong, p.recv_elems, first),
                    fmt::format("bench comm {}", comm::to_string(kind)));
    }
    std::int64_t wrong_anywhere = 0;
    STRATA_ASSIGN_OR_RETURN(comm::Handle h, c.all_reduce(&wrong, &wrong_anywhere, 1, DataType::kI64,
                                                         comm::ReduceOp::kMax));
    STRATA_TRY(c.wait(h));
    if (wrong_anywhere > 0) {
      return Status(ErrorCode::kInternal, "another rank received wrong results",
                    fmt::format("bench comm {}", comm::to_string(kind)));
    }
    OpResult r;
    r.kind = kind;
    r.bus_factor = p.bus_factor;
    STRATA_ASSIGN_OR_RETURN(r.seconds, time_slowest(c, o.repeats, issue));
    if (baseline) {
      STRATA_ASSIGN_OR_RETURN(
          r.mpi_seconds, time_slowest(c, o.repeats, [&] { return comm::run_mpi_builtin(c, op); }));
    }
    results.push_back(r);
  }
  STRATA_ASSIGN_OR_RETURN(double memcpy_seconds, time_slowest(c, o.repeats, [&] {
                            std::memcpy(recv_data, send.data, buffer_bytes);
                            return Status::ok();
                          }));
  if (me != 0) return Status::ok();

  const double gb = static_cast<double>(buffer_bytes) / 1e9;
  Json::Value& v = *out;
  v["transport"] = c.description();
  v["world_size"] = w;
  v["type"] = comm::to_string(type);
  v["bytes"] = Json::UInt64(buffer_bytes);
  v["repeats"] = o.repeats;
  v["check"] = w <= 16 ? "exact" : "skipped (more than 16 ranks)";
  v["memcpy_gbps"] = gb / memcpy_seconds;
  v["ops"] = Json::Value(Json::arrayValue);
  for (const OpResult& r : results) {
    Json::Value e;
    e["op"] = comm::to_string(r.kind);
    e["time_ms"] = r.seconds * 1e3;
    e["algbw_gbps"] = gb / r.seconds;
    e["busbw_gbps"] = gb / r.seconds * r.bus_factor;
    if (r.mpi_seconds > 0) {
      e["mpi_time_ms"] = r.mpi_seconds * 1e3;
      e["mpi_busbw_gbps"] = gb / r.mpi_seconds * r.bus_factor;
      e["speed_vs_mpi"] = r.mpi_seconds / r.seconds;
    }
    v["ops"].append(e);
  }
  return Status::ok();
}

void print_text(const Json::Value& v) {
  std::printf("%s\n", v["transport"].asString().c_str());
  std::printf("%d ranks, %s, %s per operation, median of %d (slowest rank each time)\n\n",
              v["world_size"].asInt(), v["type"].asString().c_str(),
              format_bytes(v["bytes"].asUInt64()).c_str(), v["repeats"].asInt());
  std::printf("%-15s %9s %11s %11s %9s %11s %9s\n", "op", "ms", "algbw GB/s", "busbw GB/s",
              "MPI ms", "MPI busbw", "vs MPI");
  for (const Json::Value& e : v["ops"]) {
    std::printf("%-15s %9.2f %11.2f %11.2f", e["op"].asString().c_str(), e["time_ms"].asDouble(),
                e["algbw_gbps"].asDouble(), e["busbw_gbps"].asDouble());
    if (e.isMember("mpi_time_ms")) {
      std::printf(" %9.2f %11.2f %8.2fx\n", e["mpi_time_ms"].asDouble(),
                  e["mpi_busbw_gbps"].asDouble(), e["speed_vs_mpi"].asDouble());
    } else {
      std::printf(" %9s %11s %9s\n", "-", "-", "-");
    }
  }
  std::printf("\nmemcpy of the same bytes on every rank at once: %.2f GB/s\n",
              v["memcpy_gbps"].asDouble());
  std::printf("check: %s\n", v["check"].asString().c_str());
}

int run_bench_comm(const BenchCommOptions& o) {
  comm::WorldOptions options;
  options.device = comm::Device::kCpu;
  options.comm.timeout_s = o.timeout_s;
  Result<comm::World> world = comm::join_world(options);
  if (!world.is_ok()) return cli::report_error(world.status());
  Json::Value out;
  Status s = run(o, *world, &out);
  if (s.is_ok()) s = world->comm->wait_all();
  if (!s.is_ok()) {
    const int code = cli::report_error(s);
    comm::abort_world_at_exit(code);
    return code;
  }
  if (world->launch.rank == 0) {
    if (o.json) {
      Json::StreamWriterBuilder builder;
      builder["indentation"] = "  ";
      std::printf("%s\n", Json::writeString(builder, out).c_str());
    } else {
      print_text(out);
    }
  }
  return 0;
}

}  // namespace

void register_comm(CLI::App* bench, cli::Registry& registry) {
  auto options = std::make_shared<BenchCommOptions>();
  CLI::App* app = bench->add_subcommand(
      "comm",
      "Collectives between ranks (all-gather, reduce-scatter, all-reduce): checked for exact "
      "results, timed against MPI's own collectives and memcpy. Run under mpirun -np N");
  app->add_option("--bytes", options->bytes,
                  "Bytes of the large buffer of each operation (all-gather output, "
                  "reduce-scatter input, all-reduce buffer), e.g. 256MiB")
      ->capture_default_str();
  app->add_option("--repeats", options->repeats, "Timed runs of each operation")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--type", options->type, "Element type: fp32, bf16, fp16, fp64")
      ->capture_default_str();
  app->add_option("--ops", options->ops, "Operations: all_gather, reduce_scatter, all_reduce")
      ->capture_default_str();
  app->add_option("--timeout", options->timeout_s,
                  "Seconds without progress before a collective fails naming the silent rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_flag("--no-baseline", options->no_baseline, "Skip MPI's own collectives");
  app->add_flag("--json", options->json, "Print one JSON object (rank 0) instead of text");
  registry.add(app, [options] { return run_bench_comm(*options); });
}

}  // namespace strata::bench
