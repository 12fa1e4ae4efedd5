// CPU Adam over threads: any thread count gives the same bits (the update is element-wise, the
// gradient sum is a fixed tree), a non-finite gradient at the far end of a parallel tile still
// stops every thread, grad_stats counts and sums correctly, and the roofline kernel adds.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/adam_support.h"
#include "kernels/cpu/adam.h"
#include "runtime/cpu_executor.h"

namespace strata::kernels {
namespace {

using testing::TileData;

// Bigger than kAdamParallelMinElems and not a multiple of the block or vector size.
constexpr std::size_t kBigN = 5 * kAdamBlockElems + 12345;

std::unique_ptr<runtime::CpuExecutor> make_executor(int threads) {
  runtime::CpuExecutor::Options options;
  options.threads = threads;
  auto executor = runtime::CpuExecutor::create(options);
  EXPECT_TRUE(executor.is_ok()) << executor.status().to_string();
  return executor.is_ok() ? std::move(executor).value() : nullptr;
}

AdamKernel best_kernel() {
  auto kernel = AdamKernel::create(sys::best_simd_level());
  STRATA_ASSERT(kernel.is_ok());
  return *kernel;
}

TEST(AdamThreads, EveryThreadCountGivesTheSameBits) {
  const AdamKernel kernel = best_kernel();
  AdamParams params;
  params.weight_decay = 0.01f;
  params.step = 7;
  AdamFusion fusion;
  fusion.grad_scale_inv = 1.0f / 512.0f;
  fusion.check_finite = true;
  TileData serial(kBigN, DType::kBF16, DType::kBF16, true, {1, 2, 3, 1, 1}, 31, 512.0f);
  (void)kernel.step(params, fusion, serial.tile());
  testing::expect_matches_reference(params, fusion, serial, "serial");
  for (int threads : {1, 2, 3, 4}) {
    auto executor = make_executor(threads);
    ASSERT_NE(executor, nullptr);
    TileData parallel(kBigN, DType::kBF16, DType::kBF16, true, {1, 2, 3, 1, 1}, 31, 512.0f);
    const AdamResult result = kernel.step(params, fusion, parallel.tile(), executor.get());
    EXPECT_FALSE(result.skipped);
    testing::expect_bit_identical(parallel, serial, std::to_string(threads) + " threads");
  }
}

// An fp32 copy-out (the parameters of an fp32 model, kept apart from the master) is the new
// master, bit for bit, for every thread count and odd length, and the update itself is unchanged.
TEST(AdamThreads, Fp32CopyOutIsTheNewMasterOnEveryThreadCount) {
  const AdamKernel kernel = best_kernel();
  AdamParams params;
  params.weight_decay = 0.01f;
  params.step = 3;
  for (std::size_t n : {std::size_t{1031}, kBigN + 17}) {
    TileData plain(n, DType::kF32, DType::kBF16, false, {}, 13, 1.0f);
    (void)kernel.step(params, AdamFusion{}, plain.tile());
    for (int threads : {0, 1, 2, 3}) {
      auto executor = threads > 0 ? make_executor(threads) : nullptr;
      TileData data(n, DType::kF32, DType::kBF16, false, {}, 13, 1.0f);
      std::vector<float> out(n, -7.0f);
      AdamTile tile = data.tile();
      tile.copy_out = out.data();
      tile.copy_dtype = DType::kF32;
      (void)kernel.step(params, AdamFusion{}, tile, executor.get());
      const std::string what =
          std::to_string(n) + " elements, " + std::to_string(threads) + " threads";
      testing::expect_bit_identical(data, plain, what);
      EXPECT_EQ(std::memcmp(out.data(), data.master(), n * 4), 0) << what;
    }
  }
}

TEST(AdamThreads, NonFiniteGradientInTheLastBlockStopsEveryThread) {
  const AdamKernel kernel = best_kernel();
  auto executor = make_executor(2);
  ASSERT_NE(executor, nullptr);
  AdamFusion fusion;
  fusion.check_finite = true;
  TileData data(kBigN, DType::kF32, DType::kF16, true, {}, 4);
  data.set_grad(kBigN - 1, INFINITY);
  const std::vector<std::byte> before = data.snapshot();
  const AdamResult result = kernel.step(AdamParams{}, fusion, data.tile(), executor.get());
  EXPECT_TRUE(result.skipped);
  EXPECT_EQ(result.nonfinite_count, 1u);
  EXPECT_TRUE(data.snapshot() == before) << "a thread updated its part before the check ended";
}

// Buffers 128 MiB apart (equal power-of-two buffers back to back) are a known slow layout; the
// kernel says so once so the caller can stagger them.
TEST(AdamLayout, WarnsOnceAboutArraysAMultipleOf128MiBApart) {
  constexpr std::size_t kApart = std::size_t{128} << 20;
  constexpr std::size_t n = kAdamParallelMinElems;
  void* region = mmap(nullptr, 4 * kApart, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                      0);  // only the first n floats of each array are ever touched
  ASSERT_NE(region, MAP_FAILED);
  auto* base = static_cast<char*>(region);
  AdamTile tile;
  tile.master = reinterpret_cast<float*>(base);
  tile.exp_avg = reinterpret_cast<float*>(base + kApart);
  tile.exp_avg_sq = reinterpret_cast<float*>(base + 2 * kApart);
  tile.grad = base + 3 * kApart;
  tile.n = n;
  const AdamKernel kernel = best_kernel();
  ::testing::internal::CaptureStderr();
  (void)kernel.step(AdamParams{}, AdamFusion{}, tile);
  (void)kernel.step(AdamParams{}, AdamFusion{}, tile);
  const std::string err = ::testing::internal::GetCapturedStderr();
  munmap(region, 4 * kApart);
  const std::size_t first = err.find("128 MiB");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("128 MiB", first + 1), std::string::npos) << "warned twice:\n" << err;
}

class GradStatsPath : public ::testing::TestWithParam<sys::SimdLevel> {};

TEST_P(GradStatsPath, CountsNonFiniteAndSumsSquaresLikeDouble) {
  if (!sys::simd_level_supported(GetParam())) {
    GTEST_SKIP() << to_string(GetParam()) << " path compiled but not run: this CPU lacks it";
  }
  auto kernel = AdamKernel::create(GetParam());
  ASSERT_TRUE(kernel.is_ok());
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4099}, kBigN}) {
      TileData data(n, dtype, DType::kBF16, false, {0, 0, 0, 3, 0}, 11, 100.0f);
      const GradStats stats = kernel->grad_stats(data.grad(), dtype, n);
      double want = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double x = testing::decode_grad(data.grad(), dtype, i);
        want += x * x;
      }
      EXPECT_EQ(stats.nonfinite_count, 0u);
      EXPECT_NEAR(stats.sum_sq, want, want * 1e-12) << to_string(dtype) << " n=" << n;
      if (n > 0) {
        data.set_grad(n - 1, NAN);
        data.set_grad(0, -INFINITY);
        const GradStats bad = kernel->grad_stats(data.grad(), dtype, n);
        EXPECT_EQ(bad.nonfinite_count, n == 1 ? 1u : 2u);
        EXPECT_FALSE(std::isfinite(bad.sum_sq));
      }
    }
  }
}

TEST_P(GradStatsPath, SumHasTheSameBitsForEveryThreadCountAndPath) {
  if (!sys::simd_level_supported(GetParam())) {
    GTEST_SKIP() << to_string(GetParam()) << " path compiled but not run: this CPU lacks it";
  }
  auto kernel = AdamKernel::create(GetParam());
  auto scalar = AdamKernel::create(sys::SimdLevel::kScalar);
  ASSERT_TRUE(kernel.is_ok() && scalar.is_ok());
  TileData data(kBigN, DType::kF32, DType::kBF16, false, {}, 12, 1000.0f);
  const GradStats serial = scalar->grad_stats(data.grad(), DType::kF32, kBigN);
  for (int threads : {1, 2, 3}) {
    auto executor = make_executor(threads);
    ASSERT_NE(executor, nullptr);
    const GradStats parallel = kernel->grad_stats(data.grad(), DType::kF32, kBigN, executor.get());
    EXPECT_EQ(parallel.sum_sq, serial.sum_sq) << threads << " threads";
  }
}

TEST_P(GradStatsPath, RooflineKernelAddsTheGradientToAllThree) {
  if (!sys::simd_level_supported(GetParam())) {
    GTEST_SKIP() << to_string(GetParam()) << " path compiled but not run: this CPU lacks it";
  }
  auto kernel = AdamKernel::create(GetParam());
  ASSERT_TRUE(kernel.is_ok());
  auto executor = make_executor(2);
  for (std::size_t n : {std::size_t{13}, kBigN}) {
    TileData data(n, DType::kF32, DType::kBF16, false, {1, 2, 3, 0, 0}, 13);
    const auto* g = static_cast<const float*>(data.grad());
    kernel->roofline_step(data.master(), data.exp_avg(), data.exp_avg_sq(), g, n, executor.get());
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(data.master()[i], data.master0()[i] + g[i]) << i;
      ASSERT_EQ(data.exp_avg()[i], data.exp_avg0()[i] + g[i]) << i;
      ASSERT_EQ(data.exp_avg_sq()[i], data.exp_avg_sq0()[i] + g[i]) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, GradStatsPath,
                         ::testing::Values(sys::SimdLevel::kScalar, sys::SimdLevel::kAvx2,
                                           sys::SimdLevel::kAvx512),
                         [](const ::testing::TestParamInfo<sys::SimdLevel>& info) {
                           return std::string(to_string(info.param));
                         });

}  // namespace
}  // namespace strata::kernels
