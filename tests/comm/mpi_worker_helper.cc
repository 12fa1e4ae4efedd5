// A program the MPI tests start under `mpirun -np N`: it joins the world like `strata` does and
// runs one scenario.
//   collectives SEED   every collective, several types, in and out of place, many queued at
//                      once; each rank checks its results element by element against a plain
//                      rank-order loop over every rank's inputs (which it can generate from the
//                      seed), and rank 0 prints a digest of each result.
//   hang RANK T        RANK sleeps (up to 120 s) instead of joining an all-reduce; the others use a
//                      T-second timeout.
//   die RANK           RANK kills itself (SIGKILL) after a first barrier.
//   exit RANK          RANK exits with an error after a first barrier; the others wait in a
//                      barrier with a 600 s timeout, so only MPI_Abort can end them early.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/world.h"
#include "kernels/cpu/float16.h"

namespace {

using strata::Result;
using strata::Status;
using namespace strata::comm;

int g_rank = 0;
int g_world = 1;
int g_failures = 0;

// ---- element access for the checked types
// --------------------------------------------------------

double load(const std::byte* base, DataType type, std::size_t i) {
  switch (type) {
    case DataType::kF32:
      return reinterpret_cast<const float*>(base)[i];
    case DataType::kBF16:
      return strata::kernels::bf16_to_float(reinterpret_cast<const std::uint16_t*>(base)[i]);
    case DataType::kF16:
      return strata::kernels::fp16_to_float(reinterpret_cast<const std::uint16_t*>(base)[i]);
    case DataType::kF64:
      return reinterpret_cast<const double*>(base)[i];
    case DataType::kI32:
      return reinterpret_cast<const std::int32_t*>(base)[i];
    default:
      return 0;
  }
}

// Rank `rank`'s input for operation `op`: `count` random values of `type`, from the seed.
std::vector<std::byte> input(std::uint64_t seed, int op, int rank, DataType type,
                             std::size_t count) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<std::uint64_t>(op) * 131 +
                      static_cast<std::uint64_t>(rank));
  std::uniform_real_distribution<float> real(-1000.0f, 1000.0f);
  std::uniform_int_distribution<std::int32_t> whole(-100000, 100000);
  std::vector<std::byte> data(count * data_type_bytes(type));
  for (std::size_t i = 0; i < count; ++i) {
    switch (type) {
      case DataType::kF32:
        reinterpret_cast<float*>(data.data())[i] = real(rng);
        break;
      case DataType::kBF16:
        reinterpret_cast<std::uint16_t*>(data.data())[i] =
            strata::kernels::float_to_bf16(real(rng));
        break;
      case DataType::kF16:
        reinterpret_cast<std::uint16_t*>(data.data())[i] =
            strata::kernels::float_to_fp16(real(rng) / 16);
        break;
      case DataType::kF64:
        reinterpret_cast<double*>(data.data())[i] = static_cast<double>(real(rng)) / 3.0;
        break;
      case DataType::kI32:
        reinterpret_cast<std::int32_t*>(data.data())[i] = whole(rng);
        break;
      default:
        break;
    }
  }
  return data;
}

// The expected reduction of element i over every rank's input, written as the plain loop the
// contract describes: acc = x_0; acc = acc op x_k for k = 1.. in rank order, in fp32 for 16-bit
// floats (rounded once), fp64 for fp64, 64-bit integers for int32. Returned as bytes of `type`.
void expected_reduction(const std::vector<std::vector<std::byte>>& inputs, DataType type,
                        ReduceOp op, std::size_t i, std::byte* out) {
  if (type == DataType::kF64) {
    double acc = load(inputs[0].data(), type, i);
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      const double x = load(inputs[k].data(), type, i);
      acc = op == ReduceOp::kSum ? acc + x : std::max(acc, x);
    }
    std::memcpy(out, &acc, 8);
  } else if (type == DataType::kI32) {
    std::int64_t acc = static_cast<std::int64_t>(load(inputs[0].data(), type, i));
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      const auto x = static_cast<std::int64_t>(load(inputs[k].data(), type, i));
      acc = op == ReduceOp::kSum ? acc + x : std::max(acc, x);
    }
    const auto v = static_cast<std::int32_t>(acc);
    std::memcpy(out, &v, 4);
  } else {
    float acc = static_cast<float>(load(inputs[0].data(), type, i));
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      const auto x = static_cast<float>(load(inputs[k].data(), type, i));
      acc = op == ReduceOp::kSum ? acc + x : std::max(acc, x);
    }
    if (type == DataType::kF32) {
      std::memcpy(out, &acc, 4);
    } else {
      const std::uint16_t v = type == DataType::kBF16 ? strata::kernels::float_to_bf16(acc)
                                                      : strata::kernels::float_to_fp16(acc);
      std::memcpy(out, &v, 2);
    }
  }
}

std::uint64_t digest(const std::byte* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::size_t i = 0; i < bytes; ++i) {
    h ^= static_cast<std::uint8_t>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// Compares `got` with `want` element by element; reports the first difference.
void compare(const std::string& name, const std::byte* got, const std::byte* want,
             std::size_t count, DataType type) {
  const std::size_t size = data_type_bytes(type);
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(got + i * size, want + i * size, size) != 0) {
      std::fprintf(stderr, "rank %d: %s: element %zu is %.9g, expected %.9g\n", g_rank,
                   name.c_str(), i, load(got, type, i), load(want, type, i));
      ++g_failures;
      return;
    }
  }
  if (g_rank == 0) {
    std::printf("digest %s %016llx\n", name.c_str(),
                static_cast<unsigned long long>(digest(got, count * size)));
  }
}

Status wait(Comm& c, Result<Handle> h) {
  if (!h.is_ok()) return h.status();
  return c.wait(*h);
}

// ---- the collectives scenario -------------------------------------------------------------------

Status check_type(Comm& c, std::uint64_t seed, DataType type, std::size_t count, int* op_id) {
  const int w = g_world;
  const int me = g_rank;
  const std::size_t size = data_type_bytes(type);
  const std::string t = to_string(type);
  auto all_inputs = [&](int op, std::size_t n) {
    std::vector<std::vector<std::byte>> v;
    for (int k = 0; k < w; ++k)
      v.push_back(input(seed, op, k, type, n));
    return v;
  };

  // all-gather, out of place and in place.
  for (bool in_place : {false, true}) {
    const int op = ++*op_id;
    auto inputs = all_inputs(op, count);
    std::vector<std::byte> want;
    for (auto& x : inputs)
      want.insert(want.end(), x.begin(), x.end());
    std::vector<std::byte> recv(w * count * size, std::byte{0x5a});
    const std::byte* send = inputs[static_cast<std::size_t>(me)].data();
    if (in_place) {
      std::memcpy(recv.data() + me * count * size, send, count * size);
      send = recv.data() + me * count * size;
    }
    STRATA_TRY(wait(c, c.all_gather(send, recv.data(), count, type)));
    compare("all_gather_" + t + (in_place ? "_in_place" : ""), recv.data(), want.data(), w * count,
            type);
  }

  // reduce-scatter (sum and max; in place for sum).
  for (auto [reduce, in_place] : {std::pair{ReduceOp::kSum, false}, std::pair{ReduceOp::kSum, true},
                                  std::pair{ReduceOp::kMax, false}}) {
    const int op = ++*op_id;
    auto inputs = all_inputs(op, w * count);
    std::vector<std::byte> want(count * size);
    for (std::size_t i = 0; i < count; ++i)
      expected_reduction(inputs, type, reduce, me * count + i, want.data() + i * size);
    std::vector<std::byte> send = inputs[static_cast<std::size_t>(me)];
    std::vector<std::byte> out(count * size);
    std::byte* recv = in_place ? send.data() + me * count * size : out.data();
    STRATA_TRY(wait(c, c.reduce_scatter(send.data(), recv, count, type, reduce)));
    compare(std::string("reduce_scatter_") + to_string(reduce) + "_" + t +
                (in_place ? "_in_place" : ""),
            recv, want.data(), count, type);
  }

  // all-reduce over a count that does not divide by the world size, and over one element.
  for (auto [n, reduce, in_place] : {std::tuple{w * count + 3, ReduceOp::kSum, false},
                                     std::tuple{w * count + 3, ReduceOp::kSum, true},
                                     std::tuple{w * count + 3, ReduceOp::kMax, false},
                                     std::tuple{std::size_t{1}, ReduceOp::kSum, false}}) {
    const int op = ++*op_id;
    auto inputs = all_inputs(op, n);
    std::vector<std::byte> want(n * size);
    for (std::size_t i = 0; i < n; ++i)
      expected_reduction(inputs, type, reduce, i, want.data() + i * size);
    std::vector<std::byte> send = inputs[static_cast<std::size_t>(me)];
    std::vector<std::byte> out(n * size);
    std::byte* recv = in_place ? send.data() : out.data();
    STRATA_TRY(wait(c, c.all_reduce(send.data(), recv, n, type, reduce)));
    compare(std::string("all_reduce_") + to_string(reduce) + "_" + t + "_n" + std::to_string(n) +
                (in_place ? "_in_place" : ""),
            recv, want.data(), n, type);
  }

  // broadcast from the last rank: small (direct) and large (scatter + all-gather).
  for (std::size_t n : {std::size_t{100}, w * count + 1}) {
    const int op = ++*op_id;
    const int root = w - 1;
    std::vector<std::byte> want = input(seed, op, root, type, n);
    std::vector<std::byte> buffer = me == root ? want : input(seed, op, me, type, n);
    STRATA_TRY(wait(c, c.broadcast(buffer.data(), n, type, root)));
    compare("broadcast_" + t + "_n" + std::to_string(n), buffer.data(), want.data(), n, type);
  }
  return Status::ok();
}

// Many small all-reduces queued before any wait: more than the in-flight maximum, so issuing
// waits for room; each must still be right.
Status check_queued(Comm& c, std::uint64_t seed, int* op_id) {
  constexpr int kOps = 40;
  constexpr std::size_t kCount = 7;
  std::vector<std::vector<std::byte>> sends;
  std::vector<std::vector<std::byte>> recvs(kOps, std::vector<std::byte>(kCount * 4));
  std::vector<Handle> handles;
  const int first = *op_id + 1;
  for (int i = 0; i < kOps; ++i) {
    sends.push_back(input(seed, ++*op_id, g_rank, DataType::kF32, kCount));
    Result<Handle> h = c.all_reduce(sends.back().data(), recvs[static_cast<std::size_t>(i)].data(),
                                    kCount, DataType::kF32, ReduceOp::kSum);
    if (!h.is_ok()) return h.status();
    handles.push_back(*h);
  }
  STRATA_TRY(c.wait(handles.back()));
  for (int i = 0; i < kOps; ++i) {
    Result<bool> done = c.test(handles[static_cast<std::size_t>(i)]);
    if (!done.is_ok()) return done.status();
    if (!*done) {
      std::fprintf(stderr, "rank %d: queued op %d not complete after the last one\n", g_rank, i);
      ++g_failures;
    }
    std::vector<std::vector<std::byte>> inputs;
    for (int k = 0; k < g_world; ++k)
      inputs.push_back(input(seed, first + i, k, DataType::kF32, kCount));
    std::vector<std::byte> want(kCount * 4);
    for (std::size_t e = 0; e < kCount; ++e)
      expected_reduction(inputs, DataType::kF32, ReduceOp::kSum, e, want.data() + e * 4);
    compare("queued_" + std::to_string(i), recvs[static_cast<std::size_t>(i)].data(), want.data(),
            kCount, DataType::kF32);
  }
  return Status::ok();
}

Status collectives(Comm& c, std::uint64_t seed) {
  int op_id = 0;
  // fp32 blocks of 2.5 segments (10 MiB), so segments, the window and partial segments all run.
  STRATA_TRY(check_type(c, seed, DataType::kF32, (std::size_t{10} << 20) / 4 + 5, &op_id));
  for (DataType type : {DataType::kBF16, DataType::kF16, DataType::kF64, DataType::kI32}) {
    STRATA_TRY(check_type(c, seed, type, 10007, &op_id));
  }
  STRATA_TRY(check_queued(c, seed, &op_id));
  STRATA_TRY(wait(c, c.barrier()));
  std::int32_t failures = g_failures;
  std::int32_t total = 0;
  STRATA_TRY(wait(c, c.all_reduce(&failures, &total, 1, DataType::kI32, ReduceOp::kSum)));
  if (total != 0) {
    return Status(strata::ErrorCode::kInternal, std::to_string(total) + " wrong results");
  }
  if (g_rank == 0) std::printf("collectives ok (%d ranks)\n", g_world);
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s collectives SEED | hang RANK T | die RANK | exit RANK\n",
                 argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  const long arg = std::strtol(argv[2], nullptr, 10);
  WorldOptions options;
  options.device = strata::comm::Device::kCpu;
  options.comm.timeout_s = scenario == "hang" && argc > 3 ? std::strtod(argv[3], nullptr) : 600.0;
  Result<World> world = join_world(options);
  if (!world.is_ok()) {
    std::fprintf(stderr, "join_world: %s\n", world.status().to_string().c_str());
    abort_world_at_exit(1);
    return 1;
  }
  Comm& c = *world->comm;
  g_rank = c.rank();
  g_world = c.world_size();
  Status s = Status::ok();
  if (scenario == "collectives") {
    s = collectives(c, static_cast<std::uint64_t>(arg));
  } else if (scenario == "hang") {
    if (g_rank == arg) {
      std::this_thread::sleep_for(std::chrono::seconds(120));
    }
    double x = 1.0;
    s = wait(c, c.all_reduce(&x, &x, 1, DataType::kF64, ReduceOp::kSum));
  } else if (scenario == "die" || scenario == "exit") {
    s = wait(c, c.barrier());
    if (s.is_ok() && g_rank == arg) {
      if (scenario == "die") raise(SIGKILL);
      std::fprintf(stderr, "rank %d: failing on purpose\n", g_rank);
      abort_world_at_exit(3);
      return 3;
    }
    for (int i = 0; s.is_ok() && i < 100; ++i) {
      s = wait(c, c.barrier());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } else {
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  if (s.is_ok()) s = c.wait_all();
  if (!s.is_ok()) {
    std::fprintf(stderr, "strata: rank %d: %s\n", g_rank, s.to_string().c_str());
    std::fflush(stderr);
    abort_world_at_exit(1);
    return 1;
  }
  return 0;
}
