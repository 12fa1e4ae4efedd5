// `strata bench adam`: the CPU Adam kernel's speed, against the bandwidth ceiling of its access
// pattern measured in the same run (an in-place kernel that reads 4 fp32 arrays and writes 3),
// with the same threads, SIMD path and blocking; optionally over compressed state (bf16 master,
// bf16 or 8-bit moments), alone or alternating with the fp32 step (--compare) so that both see
// the same machine. See docs/benchmarks.md ("CPU Adam") and docs/adam.md.
#include <json/json.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "common/units.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/float16.h"
#include "runtime/cpu_executor.h"

namespace strata::bench {
namespace {

using kernels::AdamKernel;
using kernels::DType;
using runtime::CpuExecutor;

struct BenchAdamOptions {
  std::string params = "64M";  // 2^26
  int threads = 0;
  std::string grad = "fp32";
  std::string copy = "none";
  std::string simd = "auto";
  int repeats = 10;
  bool check_finite = false;
  std::string layout = "staggered";
  std::string moments = "fp32";
  std::string master = "fp32";
  std::size_t block = 2048;
  bool compare = false;
  bool json = false;
};

std::optional<kernels::MomentFormat> parse_moments(const std::string& text) {
  if (text == "fp32") return kernels::MomentFormat::kF32;
  if (text == "bf16") return kernels::MomentFormat::kBF16;
  if (text == "8bit") return kernels::MomentFormat::kQ8;
  return std::nullopt;
}

// Bytes per parameter as JSON: an integer when it is one (every fp32-state figure), else a real.
Json::Value json_bytes(double bytes) {
  return bytes == std::floor(bytes) ? Json::Value(Json::UInt64(bytes)) : Json::Value(bytes);
}

// What one step over one state format moves, per parameter.
struct StepBytes {
  double read = 0;
  double write = 0;
  double total() const { return read + write; }
};

StepBytes step_bytes(DType master, kernels::MomentFormat moments, std::size_t block,
                     std::size_t grad_bytes, std::size_t copy_bytes, bool check_finite) {
  const double state =
      static_cast<double>(kernels::dtype_bytes(master) + 2 * kernels::moment_bytes(moments)) +
      (moments == kernels::MomentFormat::kQ8 ? 8.0 / block : 0.0);
  const double grad = static_cast<double>(grad_bytes * (check_finite ? 2 : 1));
  return {state + grad, state + static_cast<double>(copy_bytes)};
}

// All benchmark arrays live in one anonymous mapping (huge pages when the kernel allows them:
// fewer TLB misses for Adam and the roofline alike). Layout "staggered" (the default) rounds each
// array up to 2 MiB and moves array k by k * (4 KiB + 64 B); "back-to-back" packs them with no
// gap, so equal arrays of 2^25+ floats sit a multiple of 128 MiB apart, which runs several times
// slower on some CPUs, Adam and roofline alike (docs/adam.md).
constexpr std::size_t kSkewBytes = 4096 + 64;
constexpr std::size_t kRoundBytes = std::size_t{2} << 20;

class ArrayArena {
 public:
  ArrayArena() = default;
  ArrayArena(const ArrayArena&) = delete;
  ArrayArena& operator=(const ArrayArena&) = delete;
  ~ArrayArena() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  // Maps room for arrays of the given sizes; array(k) is then the k-th.
  Status map(const std::vector<std::size_t>& sizes, bool staggered) {
    std::size_t offset = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      if (staggered) offset += k * kSkewBytes;
      offsets_.push_back(offset);
      offset +=
          staggered ? align_up(sizes[k] + k * kSkewBytes, kRoundBytes) - k * kSkewBytes : sizes[k];
    }
    bytes_ = std::max<std::size_t>(offset, 1);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return make_error(ErrorCode::kOutOfMemory, "cannot map {} for the benchmark arrays: {}",
                        format_bytes(bytes_), std::strerror(errno));
    }
    (void)madvise(p, bytes_, MADV_HUGEPAGE);  // advice only; fine when refused
    data_ = p;
    return Status::ok();
  }
  template <typename T>
  T* array(std::size_t k) const {
    return reinterpret_cast<T*>(static_cast<char*>(data_) + offsets_[k]);
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::vector<std::size_t> offsets_;
};

struct Timing {
  double median = 0;
  double min = 0;
  double max = 0;
};

Timing summarize(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  const std::size_t n = seconds.size();
  const double median = n % 2 == 1 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  return {median, seconds.front(), seconds.back()};
}

template <typename F>
double time_seconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One timed configuration: its tile, its times, what it moves.
struct Measured {
  kernels::AdamTile tile;
  StepBytes bytes;
  std::vector<double> seconds;
  Timing timing;
  double gbps = 0;
  double ns_per_param = 0;
};

void finish(Measured& m, std::size_t n) {
  m.timing = summarize(m.seconds);
  m.gbps = static_cast<double>(n) * m.bytes.total() / m.timing.median / 1e9;
  m.ns_per_param = m.timing.median * 1e9 / static_cast<double>(n);
}

int run_bench_adam(const BenchAdamOptions& o) {
  auto usage = [](const std::string& message) {
    return cli::report_error(Status(ErrorCode::kUsage, message, "strata bench adam"));
  };
  const std::optional<std::uint64_t> params_parsed = parse_bytes(o.params);
  if (!params_parsed || *params_parsed == 0) {
    return usage("--params '" + o.params +
                 "' is not a positive count (e.g. 67108864, 64M = 2^26, 1e8)");
  }
  std::size_t n = *params_parsed;
  const std::optional<DType> grad_dtype = kernels::parse_dtype(o.grad);
  if (!grad_dtype) return usage("--grad '" + o.grad + "' is not one of fp32, bf16, fp16");
  std::optional<DType> copy_dtype;
  if (o.copy != "none") {
    copy_dtype = kernels::parse_dtype(o.copy);
    if (!copy_dtype || *copy_dtype == DType::kF32) {
      return usage("--copy '" + o.copy + "' is not one of none, bf16, fp16");
    }
  }
  if (o.layout != "staggered" && o.layout != "back-to-back") {
    return usage("--layout '" + o.layout + "' is not one of staggered, back-to-back");
  }
  std::optional<sys::SimdLevel> simd;
  if (o.simd != "auto") {
    simd = sys::parse_simd_level(o.simd);
    if (!simd) return usage("--simd '" + o.simd + "' is not one of auto, avx512, avx2, scalar");
  }
  const std::optional<kernels::MomentFormat> moments = parse_moments(o.moments);
  if (!moments) return usage("--moments '" + o.moments + "' is not one of fp32, bf16, 8bit");
  const std::optional<DType> master = kernels::parse_dtype(o.master);
  if (!master || *master == DType::kF16) {
    return usage("--master '" + o.master + "' is not one of fp32, bf16");
  }
  const bool q8 = *moments == kernels::MomentFormat::kQ8;
  if (q8 && (o.block < kernels::kQ8BlockMinElems || o.block > kernels::kQ8BlockMaxElems ||
             (o.block & (o.block - 1)) != 0 || n < o.block)) {
    return usage(fmt::format(
        "--block {} with 8bit moments must be a power of two in [64, 2048], at most --params ({})",
        o.block, n));
  }
  if (q8) n -= n % o.block;  // whole blocks; the output reports the count used
  const bool compressed = *master != DType::kF32 || *moments != kernels::MomentFormat::kF32;
  if (o.compare && !compressed) {
    return usage("--compare runs fp32 state against --moments bf16|8bit or --master bf16");
  }

  auto kernel = AdamKernel::create(simd);
  if (!kernel.is_ok()) return cli::report_error(kernel.status());
  runtime::CpuExecutor::Options exec_options;
  exec_options.threads = o.threads;
  auto executor_result = runtime::CpuExecutor::create(exec_options);
  if (!executor_result.is_ok()) return cli::report_error(executor_result.status());
  runtime::CpuExecutor* executor = executor_result->get();

  // Arrays: master, exp_avg, exp_avg_sq, fp32 gradient (the fp32 step's and the roofline's), the
  // 16-bit gradient and the copy-out when asked for, then the compressed state and its absmax.
  const bool grad16_used = *grad_dtype != DType::kF32;
  const std::size_t blocks_q8 = q8 ? n / o.block : 0;
  std::vector<std::size_t> sizes = {n * 4,
                                    n * 4,
                                    n * 4,
                                    n * 4,
                                    grad16_used ? n * 2 : 0,
                                    copy_dtype ? n * 2 : 0,
                                    compressed ? n * kernels::dtype_bytes(*master) : 0,
                                    compressed ? n * kernels::moment_bytes(*moments) : 0,
                                    compressed ? n * kernels::moment_bytes(*moments) : 0,
                                    blocks_q8 * 4,
                                    blocks_q8 * 4};
  ArrayArena arena;
  if (Status mapped = arena.map(sizes, o.layout == "staggered"); !mapped.is_ok()) {
    return cli::report_error(mapped);
  }
  float* p = arena.array<float>(0);
  float* m = arena.array<float>(1);
  float* v = arena.array<float>(2);
  float* g = arena.array<float>(3);
  std::uint16_t* g16 = grad16_used ? arena.array<std::uint16_t>(4) : nullptr;
  std::uint16_t* out16 = copy_dtype ? arena.array<std::uint16_t>(5) : nullptr;
  const std::size_t moment_size = kernels::moment_bytes(*moments);
  auto* c_master = compressed ? arena.array<char>(6) : nullptr;
  auto* c_exp_avg = compressed ? arena.array<char>(7) : nullptr;
  auto* c_exp_avg_sq = compressed ? arena.array<char>(8) : nullptr;
  // First touch from the threads that will use each part (same static blocking as the kernel),
  // so on a NUMA machine pages land next to the threads that stream them.
  const std::size_t blocks = (n + kernels::kAdamBlockElems - 1) / kernels::kAdamBlockElems;
  executor->execute(p, n * 4, [&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, blocks, 1),
        [&](const tbb::blocked_range<std::size_t>& r) {
          std::mt19937 rng(static_cast<std::uint32_t>(r.begin()));  // seeded by position
          std::uniform_real_distribution<float> weight(-1.0f, 1.0f);
          std::uniform_real_distribution<float> gradient(1e-4f, 1e-3f);  // > 0: v stays >= 0
          const std::size_t begin = r.begin() * kernels::kAdamBlockElems;
          const std::size_t end = std::min(r.end() * kernels::kAdamBlockElems, n);
          for (std::size_t i = begin; i < end; ++i) {
            p[i] = weight(rng);
            m[i] = 0.0f;
            v[i] = 0.0f;
            g[i] = gradient(rng);
            if (g16 != nullptr) {
              g16[i] = *grad_dtype == DType::kBF16 ? kernels::float_to_bf16(g[i])
                                                   : kernels::float_to_fp16(g[i]);
            }
            if (out16 != nullptr) out16[i] = 0;
            if (compressed && *master == DType::kF32) reinterpret_cast<float*>(c_master)[i] = p[i];
            if (compressed && *master == DType::kBF16) {
              reinterpret_cast<std::uint16_t*>(c_master)[i] = kernels::float_to_bf16(p[i]);
            }
          }
          if (compressed) {  // zero moments (and absmax) are valid in every format
            std::memset(c_exp_avg + begin * moment_size, 0, (end - begin) * moment_size);
            std::memset(c_exp_avg_sq + begin * moment_size, 0, (end - begin) * moment_size);
          }
          for (std::size_t b = begin / o.block; q8 && b < end / o.block; ++b) {
            arena.array<float>(9)[b] = 0.0f;
            arena.array<float>(10)[b] = 0.0f;
          }
        },
        tbb::static_partitioner());
  });

  kernels::AdamParams params;
  params.weight_decay = 0.01f;
  kernels::AdamFusion fusion;
  fusion.grad_scale_inv = 1.0f / 1024.0f;
  fusion.check_finite = o.check_finite;
  const std::size_t grad_bytes = kernels::dtype_bytes(*grad_dtype);
  const std::size_t copy_bytes = copy_dtype ? 2 : 0;
  Measured fp32;
  fp32.tile.master = p;
  fp32.tile.exp_avg = m;
  fp32.tile.exp_avg_sq = v;
  fp32.tile.grad = *grad_dtype == DType::kF32 ? static_cast<const void*>(g) : g16;
  fp32.tile.grad_dtype = *grad_dtype;
  fp32.tile.copy_out = out16;
  fp32.tile.copy_dtype = copy_dtype.value_or(DType::kBF16);
  fp32.tile.n = n;
  fp32.bytes = step_bytes(DType::kF32, kernels::MomentFormat::kF32, o.block, grad_bytes, copy_bytes,
                          o.check_finite);
  Measured state = fp32;
  if (compressed) {
    state.tile.master = c_master;
    state.tile.master_dtype = *master;
    state.tile.exp_avg = c_exp_avg;
    state.tile.exp_avg_sq = c_exp_avg_sq;
    state.tile.moments = *moments;
    state.tile.exp_avg_absmax = q8 ? arena.array<float>(9) : nullptr;
    state.tile.exp_avg_sq_absmax = q8 ? arena.array<float>(10) : nullptr;
    state.tile.block = o.block;
    state.bytes = step_bytes(*master, *moments, o.block, grad_bytes, copy_bytes, o.check_finite);
  }
  // The timed configurations: the one asked for, and with --compare the fp32 step before it.
  std::vector<Measured*> timed = {&state};
  if (o.compare) timed.insert(timed.begin(), &fp32);

  // One untimed round of each, then alternate them so that noise from other processes hits all.
  std::uint64_t skipped = 0;
  auto adam_step = [&](Measured& c) {
    c.tile.rounding_key = static_cast<std::uint32_t>(params.step) * 0x9E3779B9u;
    if (kernel->step(params, fusion, c.tile, executor).skipped) ++skipped;
  };
  auto roofline_step = [&] { kernel->roofline_step(p, m, v, g, n, executor); };
  for (Measured* c : timed)
    adam_step(*c);
  roofline_step();
  ++params.step;
  std::vector<double> roofline_s, pair_ratio, pair_speedup;
  for (int r = 0; r < o.repeats; ++r, ++params.step) {
    for (Measured* c : timed)
      c->seconds.push_back(time_seconds([&] { adam_step(*c); }));
    roofline_s.push_back(time_seconds(roofline_step));
    pair_ratio.push_back(roofline_s.back() / state.seconds.back());
    if (o.compare) pair_speedup.push_back(fp32.seconds.back() / state.seconds.back());
  }
  if (skipped > 0) {
    return cli::report_error(make_error(
        ErrorCode::kInternal, "{} Adam steps were skipped on finite benchmark data", skipped));
  }

  const std::size_t roofline_bytes = 28;
  for (Measured* c : timed)
    finish(*c, n);
  const Timing roofline_t = summarize(roofline_s);
  const double roofline_gbps =
      static_cast<double>(n) * static_cast<double>(roofline_bytes) / roofline_t.median / 1e9;
  const double ratio = state.gbps / roofline_gbps;
  // The same ratio from each interleaved pair: less sensitive to slow drifts in background load.
  const double pair_ratio_median =
      summarize(pair_ratio).median * state.bytes.total() / static_cast<double>(roofline_bytes);
  const double params_per_s = static_cast<double>(n) / state.timing.median;
  const int threads = n < kernels::kAdamParallelMinElems
                          ? 1  // small tiles run on the calling thread
                          : executor->threads_for_node(executor->node_for(p, n * 4));
  const double speedup = o.compare ? fp32.timing.median / state.timing.median : 0.0;
  const double speedup_pairs = o.compare ? summarize(pair_speedup).median : 0.0;

  if (o.json) {
    Json::Value out;
    out["benchmark"] = "adam";
    out["params"] = Json::UInt64(n);
    out["threads"] = threads;
    out["simd"] = sys::to_string(kernel->simd());
    out["grad"] = kernels::to_string(*grad_dtype);
    out["copy"] = copy_dtype ? kernels::to_string(*copy_dtype) : "none";
    out["master"] = kernels::to_string(*master);
    out["moments"] = kernels::to_string(*moments);
    if (q8) out["block"] = Json::UInt64(o.block);
    out["check_finite"] = o.check_finite;
    out["layout"] = o.layout;
    out["repeats"] = o.repeats;
    out["bytes_per_param"] = json_bytes(state.bytes.total());
    out["bytes_read_per_param"] = json_bytes(state.bytes.read);
    out["bytes_written_per_param"] = json_bytes(state.bytes.write);
    out["roofline_bytes_per_param"] = Json::UInt64(roofline_bytes);
    out["ms_per_step"] = state.timing.median * 1e3;
    out["ms_per_step_min"] = state.timing.min * 1e3;
    out["ms_per_step_max"] = state.timing.max * 1e3;
    out["ns_per_param"] = state.ns_per_param;
    out["roofline_ms"] = roofline_t.median * 1e3;
    out["roofline_ms_min"] = roofline_t.min * 1e3;
    out["roofline_ms_max"] = roofline_t.max * 1e3;
    out["params_per_s"] = params_per_s;
    out["gbps"] = state.gbps;
    out["roofline_gbps"] = roofline_gbps;
    out["ratio"] = ratio;
    out["ratio_pairs_median"] = pair_ratio_median;
    if (o.compare) {
      Json::Value base;
      base["bytes_per_param"] = json_bytes(fp32.bytes.total());
      base["ms_per_step"] = fp32.timing.median * 1e3;
      base["ms_per_step_min"] = fp32.timing.min * 1e3;
      base["ms_per_step_max"] = fp32.timing.max * 1e3;
      base["ns_per_param"] = fp32.ns_per_param;
      base["gbps"] = fp32.gbps;
      base["ratio"] = fp32.gbps / roofline_gbps;
      out["fp32"] = base;
      out["speedup_vs_fp32"] = speedup;
      out["speedup_vs_fp32_pairs_median"] = speedup_pairs;
    }
    Json::StreamWriterBuilder writer;
    writer["indentation"] = "  ";
    std::printf("%s\n", Json::writeString(writer, out).c_str());
    return 0;
  }
  const std::string state_name =
      compressed
          ? fmt::format("master {}, moments {}{}", kernels::to_string(*master),
                        kernels::to_string(*moments), q8 ? fmt::format(" (block {})", o.block) : "")
          : "fp32 state";
  std::printf(
      "strata bench adam: %zu params, %d threads, %s path, %s, grad %s, copy %s, "
      "check_finite %s, %s arrays, median of %d\n",
      n, threads, sys::to_string(kernel->simd()), state_name.c_str(),
      kernels::to_string(*grad_dtype), copy_dtype ? kernels::to_string(*copy_dtype) : "none",
      o.check_finite ? "on" : "off", o.layout.c_str(), o.repeats);
  auto line = [&](const char* name, const Measured& c) {
    std::printf(
        "  %-9s %8.2f ms/step (min %.2f, max %.2f)  %.3g params/s  %6.3f ns/param  %6.2f GB/s  "
        "(%.4g B/param: read %.4g, write %.4g)\n",
        name, c.timing.median * 1e3, c.timing.min * 1e3, c.timing.max * 1e3,
        static_cast<double>(n) / c.timing.median, c.ns_per_param, c.gbps, c.bytes.total(),
        c.bytes.read, c.bytes.write);
  };
  if (o.compare) line("adam fp32", fp32);
  line("adam", state);
  std::printf(
      "  roofline  %8.2f ms/pass (min %.2f, max %.2f)  %29.2f GB/s  "
      "(28 B/param: p+=g, m+=g, v+=g in place)\n",
      roofline_t.median * 1e3, roofline_t.min * 1e3, roofline_t.max * 1e3, roofline_gbps);
  std::printf("  ratio     %.3f of the in-place roofline (interleaved pairs: %.3f)\n", ratio,
              pair_ratio_median);
  if (o.compare) {
    std::printf("  speedup   %.3f x the fp32 step (interleaved pairs: %.3f)\n", speedup,
                speedup_pairs);
  }
  return 0;
}

}  // namespace

void register_adam(CLI::App* bench, cli::Registry& registry) {
  auto options = std::make_shared<BenchAdamOptions>();
  CLI::App* adam = bench->add_subcommand(
      "adam",
      "CPU Adam/AdamW speed (ms/step, params/s, GB/s) against the in-place roofline "
      "(read 4 fp32 arrays, write 3) measured in the same run");
  adam->add_option("--params", options->params,
                   "Parameters per step: an integer, or with a binary suffix (64M = 2^26)")
      ->capture_default_str();
  adam->add_option("--threads", options->threads, "Threads (0: every CPU this process may use)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  adam->add_option("--grad", options->grad, "Gradient dtype: fp32, bf16, fp16")
      ->capture_default_str();
  adam->add_option("--copy", options->copy, "Copy-out of the new weights: none, bf16, fp16")
      ->capture_default_str();
  adam->add_option("--simd", options->simd, "SIMD path: auto, avx512, avx2, scalar")
      ->capture_default_str();
  adam->add_option("--repeats", options->repeats, "Timed steps (each paired with a roofline pass)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  adam->add_flag("--check-finite", options->check_finite,
                 "Scan the gradient for inf/NaN before each step (one more read of it)");
  adam->add_option("--layout", options->layout,
                   "Array placement: staggered (by 4 KiB + 64 B), or back-to-back (equal arrays "
                   "at power-of-two distances, a known slow layout)")
      ->capture_default_str();
  adam->add_option("--moments", options->moments,
                   "How the moments are stored: fp32, bf16 (stochastically rounded), 8bit "
                   "(power-law codes with an fp32 absmax per --block elements)")
      ->capture_default_str();
  adam->add_option("--master", options->master,
                   "How the master weights are stored: fp32, bf16 (stochastically rounded)")
      ->capture_default_str();
  adam->add_option("--block", options->block,
                   "Elements per absmax block of 8bit moments: a power of two in [64, 2048] "
                   "(--params is rounded down to whole blocks)")
      ->capture_default_str();
  adam->add_flag("--compare", options->compare,
                 "Also time the fp32 step, alternating with the compressed one, and print both "
                 "with the speedup");
  adam->add_flag("--json", options->json, "Print one JSON object instead of text");
  registry.add(adam, [options] { return run_bench_adam(*options); });
}

}  // namespace strata::bench
