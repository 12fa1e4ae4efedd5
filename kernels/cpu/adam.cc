// Dispatch, checks and threading of the CPU Adam kernels; the arithmetic lives in the per-path
// files (adam_scalar.cc, adam_avx2.cc, adam_avx512.cc).
#include "kernels/cpu/adam.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_invoke.h>
#include <oneapi/tbb/partitioner.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/log.h"
#include "kernels/cpu/adam_internal.h"

namespace strata::kernels {
namespace {

using detail::AdamConstants;
using detail::AdamPath;
using detail::make_constants;

const AdamPath& path_for(sys::SimdLevel level) {
  static const AdamPath scalar = detail::scalar_path();
  static const AdamPath avx2 = detail::avx2_path();
  static const AdamPath avx512 = detail::avx512_path();
  switch (level) {
    case sys::SimdLevel::kScalar:
      return scalar;
    case sys::SimdLevel::kAvx2:
      return avx2;
    case sys::SimdLevel::kAvx512:
      return avx512;
  }
  return scalar;
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

bool aligned_to(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

bool is_power_of_two(std::size_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

void check_tile(const AdamTile& t) {
  STRATA_ASSERT_MSG(t.master_dtype == DType::kF32 || t.master_dtype == DType::kBF16,
                    "master_dtype must be fp32 or bf16");
  STRATA_ASSERT_MSG(t.moments == MomentFormat::kF32 || t.moments == MomentFormat::kBF16 ||
                        t.moments == MomentFormat::kQ8,
                    "moments must be a MomentFormat");
  const bool q8 = t.moments == MomentFormat::kQ8;
  if (q8) {
    STRATA_ASSERT_MSG(is_power_of_two(t.block) && t.block >= kQ8BlockMinElems &&
                          t.block <= kQ8BlockMaxElems && t.n % t.block == 0,
                      "8-bit moments need block a power of two in [64, 2048] that divides n");
  }
  if (t.n == 0) return;
  STRATA_ASSERT(t.master != nullptr && t.exp_avg != nullptr && t.exp_avg_sq != nullptr &&
                t.grad != nullptr);
  STRATA_ASSERT_MSG(!q8 || (t.exp_avg_absmax != nullptr && t.exp_avg_sq_absmax != nullptr),
                    "8-bit moments need exp_avg_absmax and exp_avg_sq_absmax");
  const std::size_t master_size = dtype_bytes(t.master_dtype);
  const std::size_t moment_size = moment_bytes(t.moments);
  STRATA_ASSERT(aligned_to(t.master, master_size) && aligned_to(t.exp_avg, moment_size) &&
                aligned_to(t.exp_avg_sq, moment_size) &&
                aligned_to(t.grad, dtype_bytes(t.grad_dtype)));
  STRATA_ASSERT(t.copy_out == nullptr || aligned_to(t.copy_out, dtype_bytes(t.copy_dtype)));
  STRATA_ASSERT(!q8 || (aligned_to(t.exp_avg_absmax, 4) && aligned_to(t.exp_avg_sq_absmax, 4)));
  // Every array by its actual size in bytes; none may share a byte with another.
  struct Array {
    const void* data;
    std::size_t bytes;
    const char* name;
  };
  const std::size_t absmax_bytes = q8 ? t.n / t.block * 4 : 0;
  const Array arrays[7] = {
      {t.master, t.n * master_size, "master"},
      {t.exp_avg, t.n * moment_size, "exp_avg"},
      {t.exp_avg_sq, t.n * moment_size, "exp_avg_sq"},
      {t.grad, t.n * dtype_bytes(t.grad_dtype), "grad"},
      {t.copy_out, t.copy_out != nullptr ? t.n * dtype_bytes(t.copy_dtype) : 0, "copy_out"},
      {t.exp_avg_absmax, absmax_bytes, "exp_avg_absmax"},
      {t.exp_avg_sq_absmax, absmax_bytes, "exp_avg_sq_absmax"}};
  for (int a = 0; a < 7; ++a) {
    for (int b = a + 1; b < 7; ++b) {
      if (arrays[a].bytes == 0 || arrays[b].bytes == 0) continue;
      if (overlaps(arrays[a].data, arrays[a].bytes, arrays[b].data, arrays[b].bytes)) {
        const std::string message = fmt::format("the {} and {} arrays of an AdamTile overlap",
                                                arrays[a].name, arrays[b].name);
        STRATA_ASSERT_MSG(false, message.c_str());
      }
    }
  }
}

// Streams whose addresses differ by a multiple of 128 MiB (within a page) collide in the L1
// cache's way predictor on AMD Zen (and in 4 KiB store/load aliasing elsewhere): the step ran
// 2-6x slower on the development machine. Such layouts come from equal power-of-two buffers
// allocated back to back; say so once, since the caller can fix it by staggering the buffers.
void warn_once_if_aliased(const AdamTile& t) {
  static std::atomic<bool> warned{false};
  if (t.n < kAdamParallelMinElems || warned.load(std::memory_order_relaxed)) return;
  constexpr std::uintptr_t kPeriod = std::uintptr_t{1} << 27;
  constexpr std::uintptr_t kPage = 4096;
  const void* streams[5] = {t.master, t.exp_avg, t.exp_avg_sq, t.grad, t.copy_out};
  const char* names[5] = {"master", "exp_avg", "exp_avg_sq", "grad", "copy_out"};
  for (int a = 0; a < 5; ++a) {
    for (int b = a + 1; b < 5; ++b) {
      if (streams[a] == nullptr || streams[b] == nullptr) continue;
      const std::uintptr_t distance = (reinterpret_cast<std::uintptr_t>(streams[a]) -
                                       reinterpret_cast<std::uintptr_t>(streams[b])) %
                                      kPeriod;
      if ((distance < kPage || distance > kPeriod - kPage) && !warned.exchange(true)) {
        STRATA_LOG_WARN(
            "CPU Adam: the {} and {} arrays sit a multiple of 128 MiB apart; this runs several "
            "times slower on some CPUs. Stagger the buffers by a few KiB (see docs/adam.md)",
            names[a], names[b]);
        return;
      }
    }
  }
}

std::size_t block_count(std::size_t n) {
  return (n + kAdamBlockElems - 1) / kAdamBlockElems;
}

// Runs body(begin, end) over [0, n): one contiguous run of blocks per thread (static partition,
// so the hardware prefetchers see long streams), or all of it on this thread.
template <typename Body>
void for_blocks(std::size_t n, runtime::CpuExecutor* executor, const void* near,
                std::size_t near_bytes, const Body& body) {
  if (executor == nullptr || n < kAdamParallelMinElems) {
    body(std::size_t{0}, n);
    return;
  }
  executor->execute(near, near_bytes, [&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, block_count(n), 1),
        [&](const tbb::blocked_range<std::size_t>& r) {
          body(r.begin() * kAdamBlockElems, std::min(r.end() * kAdamBlockElems, n));
        },
        tbb::static_partitioner());
  });
}

GradStats combine(const GradStats& a, const GradStats& b) {
  return {a.nonfinite_count + b.nonfinite_count, a.sum_sq + b.sum_sq};
}

// Stats of blocks [lo, hi) as a fixed binary tree of block results, so the sum has the same bits
// whether the subtrees run in parallel or not.
GradStats stats_tree(const detail::StatsRangeFn stats, const void* grad, DType dtype, std::size_t n,
                     std::size_t lo, std::size_t hi, bool parallel) {
  if (hi - lo == 1) {
    return stats(grad, dtype, lo * kAdamBlockElems, std::min((lo + 1) * kAdamBlockElems, n));
  }
  const std::size_t mid = lo + (hi - lo) / 2;
  GradStats left;
  GradStats right;
  // Subtrees of 8 blocks or fewer run sequentially: enough work per task, little overhead.
  if (parallel && hi - lo > 8) {
    tbb::parallel_invoke([&] { left = stats_tree(stats, grad, dtype, n, lo, mid, true); },
                         [&] { right = stats_tree(stats, grad, dtype, n, mid, hi, true); });
  } else {
    left = stats_tree(stats, grad, dtype, n, lo, mid, false);
    right = stats_tree(stats, grad, dtype, n, mid, hi, false);
  }
  return combine(left, right);
}

}  // namespace

Status validate(const AdamParams& p) {
  auto bad = [](const char* field, double value, const char* valid) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} = {} is out of range; valid: {}", field, value, valid),
                  "adam params");
  };
  if (!std::isfinite(p.lr) || p.lr < 0) return bad("lr", p.lr, "finite and >= 0");
  if (!(p.beta1 >= 0 && p.beta1 < 1)) return bad("beta1", p.beta1, "0 <= beta1 < 1");
  if (!(p.beta2 >= 0 && p.beta2 < 1)) return bad("beta2", p.beta2, "0 <= beta2 < 1");
  if (!std::isfinite(p.eps) || p.eps < 0) return bad("eps", p.eps, "finite and >= 0");
  if (!std::isfinite(p.weight_decay) || p.weight_decay < 0) {
    return bad("weight_decay", p.weight_decay, "finite and >= 0");
  }
  if (p.step < 1) return bad("step", static_cast<double>(p.step), "an integer >= 1");
  return Status::ok();
}

Result<AdamKernel> AdamKernel::create(std::optional<sys::SimdLevel> simd) {
  const sys::SimdLevel level = simd.value_or(sys::default_simd_level());
  if (!sys::simd_level_supported(level)) {
    return make_error(ErrorCode::kUnavailable,
                      "the {} path of the CPU Adam kernel cannot run on this CPU ({}); "
                      "supported here: scalar{}{}",
                      to_string(level), sys::cpu_features().brand,
                      sys::simd_level_supported(sys::SimdLevel::kAvx2) ? ", avx2" : "",
                      sys::simd_level_supported(sys::SimdLevel::kAvx512) ? ", avx512" : "");
  }
  return AdamKernel(level);
}

AdamResult AdamKernel::step(const AdamParams& params, const AdamFusion& fusion,
                            const AdamTile& tile, runtime::CpuExecutor* executor) const {
  STRATA_ASSERT_MSG(validate(params).is_ok(), "AdamParams out of range; see validate()");
  check_tile(tile);
  AdamResult result;
  if (tile.n == 0) return result;
  if (fusion.check_finite) {
    const GradStats stats = grad_stats(tile.grad, tile.grad_dtype, tile.n, executor);
    if (stats.nonfinite_count > 0) {
      result.skipped = true;
      result.nonfinite_count = stats.nonfinite_count;
      return result;
    }
  }
  warn_once_if_aliased(tile);
  const AdamConstants constants = make_constants(params, fusion);
  const std::size_t master_bytes = tile.n * dtype_bytes(tile.master_dtype);
  if (tile.master_dtype != DType::kF32 || tile.moments != MomentFormat::kF32) {
    // Compressed state: every copy-out (fp32 included: it is the stored master widened) is made in
    // the pass. Threads split at multiples of kAdamBlockElems, so 8-bit blocks stay whole, and the
    // range functions see tile indices, so the stochastic rounding ignores the split.
    const detail::AdamRangeFn adam_state = path_for(simd_).adam_state;
    for_blocks(
        tile.n, executor, tile.master, master_bytes,
        [&](std::size_t begin, std::size_t end) { adam_state(constants, tile, begin, end); });
    return result;
  }
  const detail::AdamRangeFn adam = path_for(simd_).adam;
  if (tile.copy_out != nullptr && tile.copy_dtype == DType::kF32) {
    // An fp32 copy-out is the new master itself: each block is copied right after its update,
    // while it is still in cache, so the copy costs only its writes (a copy after the whole tile
    // would read the master from memory again, on one thread).
    AdamTile in_place = tile;
    in_place.copy_out = nullptr;
    auto* out = static_cast<float*>(tile.copy_out);
    for_blocks(tile.n, executor, tile.master, master_bytes,
               [&](std::size_t begin, std::size_t end) {
                 for (std::size_t b = begin; b < end; b += kAdamBlockElems) {
                   const std::size_t e = std::min(b + kAdamBlockElems, end);
                   adam(constants, in_place, b, e);
                   std::memcpy(out + b, static_cast<const float*>(tile.master) + b, (e - b) * 4);
                 }
               });
    return result;
  }
  for_blocks(tile.n, executor, tile.master, master_bytes,
             [&](std::size_t begin, std::size_t end) { adam(constants, tile, begin, end); });
  return result;
}

GradStats AdamKernel::grad_stats(const void* grad, DType grad_dtype, std::size_t n,
                                 runtime::CpuExecutor* executor) const {
  if (n == 0) return {};
  STRATA_ASSERT(grad != nullptr && aligned_to(grad, dtype_bytes(grad_dtype)));
  const detail::StatsRangeFn stats = path_for(simd_).stats;
  const std::size_t blocks = block_count(n);
  if (executor == nullptr || n < kAdamParallelMinElems) {
    return stats_tree(stats, grad, grad_dtype, n, 0, blocks, false);
  }
  GradStats result;
  executor->execute(grad, n * dtype_bytes(grad_dtype),
                    [&] { result = stats_tree(stats, grad, grad_dtype, n, 0, blocks, true); });
  return result;
}

void AdamKernel::roofline_step(float* p, float* m, float* v, const float* g, std::size_t n,
                               runtime::CpuExecutor* executor) const {
  if (n == 0) return;
  STRATA_ASSERT(p != nullptr && m != nullptr && v != nullptr && g != nullptr);
  const detail::RooflineRangeFn roofline = path_for(simd_).roofline;
  for_blocks(n, executor, p, n * 4,
             [&](std::size_t begin, std::size_t end) { roofline(p, m, v, g, begin, end); });
}

}  // namespace strata::kernels
