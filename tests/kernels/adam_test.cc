// CPU Adam: every SIMD path x gradient dtype x copy-out dtype, over odd lengths and misaligned
// arrays, against the double-precision reference; all paths bit-identical to the scalar one.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "kernels/adam_support.h"
#include "kernels/cpu/adam.h"
#include "sys/cpu_features.h"

namespace strata::kernels {
namespace {

using testing::Offsets;
using testing::TileData;

// Skips (visibly) when this CPU cannot run `level`; returns the kernel otherwise.
#define STRATA_KERNEL_OR_SKIP(kernel, level)                                               \
  if (!sys::simd_level_supported(level)) {                                                 \
    GTEST_SKIP() << to_string(level) << " path compiled but not run: this CPU ("           \
                 << sys::cpu_features().brand                                              \
                 << ") lacks it (best here: " << to_string(sys::best_simd_level()) << ")"; \
  }                                                                                        \
  auto kernel##_result = AdamKernel::create(level);                                        \
  ASSERT_TRUE(kernel##_result.is_ok()) << kernel##_result.status().to_string();            \
  const AdamKernel kernel = *kernel##_result

const std::size_t kLengths[] = {0, 1, 7, 15, 17, 33, 1031, 4099};
const Offsets kOffsets[] = {{0, 0, 0, 0, 0}, {1, 2, 3, 1, 1}, {3, 1, 2, 5, 7}};

struct CopyChoice {
  bool with_copy;
  DType dtype;
};

using MatrixParam = std::tuple<sys::SimdLevel, DType, CopyChoice>;

class AdamMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(AdamMatrix, MatchesReferenceAndScalarPathAtOddLengthsAndMisalignments) {
  const auto [level, grad_dtype, copy] = GetParam();
  STRATA_KERNEL_OR_SKIP(kernel, level);
  auto scalar = AdamKernel::create(sys::SimdLevel::kScalar);
  ASSERT_TRUE(scalar.is_ok());

  AdamFusion fusion;
  fusion.grad_scale_inv = 1.0f / 3000.0f;  // a loss scale that is not a power of two
  fusion.clip_coef = 0.37f;
  std::uint32_t seed = 1234;
  for (const testing::NamedParams& set : testing::param_sets()) {
    for (std::size_t n : kLengths) {
      for (const Offsets& offsets : kOffsets) {
        const std::string what = set.name + " n=" + std::to_string(n) +
                                 " offsets=" + std::to_string(offsets.master) + "," +
                                 std::to_string(offsets.grad) + "," + std::to_string(offsets.copy) +
                                 " seed=" + std::to_string(seed);
        TileData data(n, grad_dtype, copy.dtype, copy.with_copy, offsets, seed, 3000.0f,
                      set.step_one);
        TileData expected(n, grad_dtype, copy.dtype, copy.with_copy, offsets, seed, 3000.0f,
                          set.step_one);
        ++seed;
        const AdamResult result = kernel.step(set.params, fusion, data.tile());
        EXPECT_FALSE(result.skipped) << what;
        testing::expect_matches_reference(set.params, fusion, data, what);
        (void)scalar->step(set.params, fusion, expected.tile());
        testing::expect_bit_identical(data, expected, what + " vs scalar path");
      }
    }
  }
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [level, grad_dtype, copy] = info.param;
  return std::string(to_string(level)) + "_grad_" + to_string(grad_dtype) + "_copy_" +
         (copy.with_copy ? to_string(copy.dtype) : "none");
}

INSTANTIATE_TEST_SUITE_P(
    AllPaths, AdamMatrix,
    ::testing::Combine(
        ::testing::Values(sys::SimdLevel::kScalar, sys::SimdLevel::kAvx2, sys::SimdLevel::kAvx512),
        ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
        ::testing::Values(CopyChoice{false, DType::kBF16}, CopyChoice{true, DType::kBF16},
                          CopyChoice{true, DType::kF16})),
    matrix_name);

class AdamPath : public ::testing::TestWithParam<sys::SimdLevel> {};

// A gradient element that is inf or NaN anywhere (first, middle, vector tail) makes the step skip
// the whole tile: nothing is written, and the count is reported.
TEST_P(AdamPath, NonFiniteGradientSkipsTheTileAndWritesNothing) {
  STRATA_KERNEL_OR_SKIP(kernel, GetParam());
  AdamParams params;
  params.weight_decay = 0.01f;
  AdamFusion fusion;
  fusion.check_finite = true;
  const std::size_t n = 1031;
  for (DType grad_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        TileData data(n, grad_dtype, DType::kBF16, true, {1, 0, 2, 1, 3}, 77);
        data.set_grad(at, bad);
        const std::vector<std::byte> before = data.snapshot();
        const AdamResult result = kernel.step(params, fusion, data.tile());
        const std::string what = std::string(to_string(grad_dtype)) + " at=" + std::to_string(at) +
                                 " value=" + std::to_string(bad);
        EXPECT_TRUE(result.skipped) << what;
        EXPECT_EQ(result.nonfinite_count, 1u) << what;
        EXPECT_TRUE(data.snapshot() == before) << what << ": the skipped step wrote something";
      }
    }
  }
}

TEST_P(AdamPath, CountsEveryNonFiniteGradient) {
  STRATA_KERNEL_OR_SKIP(kernel, GetParam());
  AdamFusion fusion;
  fusion.check_finite = true;
  TileData data(4099, DType::kF32, DType::kBF16, false, {}, 5);
  for (std::size_t i : {3, 100, 101, 2048, 4098})
    data.set_grad(i, NAN);
  const AdamResult result = kernel.step(AdamParams{}, fusion, data.tile());
  EXPECT_TRUE(result.skipped);
  EXPECT_EQ(result.nonfinite_count, 5u);
}

TEST_P(AdamPath, FiniteCheckOnFiniteGradientsChangesNothing) {
  STRATA_KERNEL_OR_SKIP(kernel, GetParam());
  AdamParams params;
  AdamFusion checked;
  checked.check_finite = true;
  TileData a(4099, DType::kBF16, DType::kF16, true, {}, 9);
  TileData b(4099, DType::kBF16, DType::kF16, true, {}, 9);
  const AdamResult result = kernel.step(params, checked, a.tile());
  (void)kernel.step(params, AdamFusion{}, b.tile());
  EXPECT_FALSE(result.skipped);
  EXPECT_EQ(result.nonfinite_count, 0u);
  testing::expect_bit_identical(a, b, "check_finite on vs off");
}

// Unscaling by 1/1024 and clipping by 0.5 must equal feeding a gradient already multiplied by
// 0.5: powers of two make both exact, so the results are bit-identical.
TEST_P(AdamPath, UnscaleAndClipAreAppliedToTheGradient) {
  STRATA_KERNEL_OR_SKIP(kernel, GetParam());
  AdamParams params;
  params.step = 4;
  AdamFusion fused;
  fused.grad_scale_inv = 1.0f / 1024.0f;
  fused.clip_coef = 0.5f;
  TileData scaled(1031, DType::kF32, DType::kBF16, true, {}, 21, 1024.0f);
  TileData plain(1031, DType::kF32, DType::kBF16, true, {}, 21, 0.5f);
  (void)kernel.step(params, fused, scaled.tile());
  (void)kernel.step(params, AdamFusion{}, plain.tile());
  testing::expect_bit_identical(scaled, plain, "unscale+clip vs pre-scaled gradient");
}

// PyTorch's first step with m = v = 0 and no weight decay moves every weight by about lr
// against the sign of its gradient (m_hat / sqrt(v_hat) = g / |g|).
TEST_P(AdamPath, FirstStepMovesEachWeightByLrAgainstItsGradient) {
  STRATA_KERNEL_OR_SKIP(kernel, GetParam());
  AdamParams params;
  params.lr = 1e-2f;
  params.eps = 1e-12f;
  TileData data(1031, DType::kF32, DType::kBF16, false, {}, 3, 1.0f, /*step_one=*/true);
  (void)kernel.step(params, AdamFusion{}, data.tile());
  const auto* g = static_cast<const float*>(data.grad());
  for (std::size_t i = 0; i < data.n(); ++i) {
    if (std::fabs(g[i]) < 1e-6f) continue;  // |g| comparable to eps: the step is smaller
    const double p0 = data.master0()[i];
    const double sign = g[i] > 0 ? 1.0 : g[i] < 0 ? -1.0 : 0.0;
    const double expected = p0 - params.lr * sign;
    const double tolerance = std::fabs(p0) * 1e-6 + params.lr * 1e-5;
    EXPECT_NEAR(data.master()[i], expected, tolerance) << "i=" << i << " g=" << g[i];
  }
}

// AdamW decays the weights even with a zero gradient; Adam (L2) turns the decay into a
// gradient instead, so it moves by about lr on the first step.
TEST_P(AdamPath, AdamwDecaysWeightsWhileAdamAddsDecayToTheGradient) {
  STRATA_KERNEL_OR_SKIP(kernel, GetParam());
  AdamParams params;
  params.lr = 1e-2f;
  params.weight_decay = 0.1f;
  TileData adamw(257, DType::kF32, DType::kBF16, false, {}, 8, 1.0f, true);
  TileData adam(257, DType::kF32, DType::kBF16, false, {}, 8, 1.0f, true);
  for (std::size_t i = 0; i < 257; ++i) {
    adamw.set_grad(i, 0.0f);
    adam.set_grad(i, 0.0f);
  }
  params.adamw_mode = true;
  (void)kernel.step(params, AdamFusion{}, adamw.tile());
  params.adamw_mode = false;
  (void)kernel.step(params, AdamFusion{}, adam.tile());
  const float decay = static_cast<float>(1.0 - double(params.lr) * params.weight_decay);
  for (std::size_t i = 0; i < 257; ++i) {
    const float p0 = adamw.master0()[i];
    EXPECT_EQ(adamw.master()[i], p0 * decay) << "i=" << i;
    EXPECT_EQ(adamw.exp_avg()[i], 0.0f);
    const double sign = p0 > 0 ? 1.0 : -1.0;
    // |update| = lr * |g| / (|g| + eps) with g = wd * p0: eps matters only for tiny weights.
    const double tolerance =
        params.lr * (1e-5 + 2.0 * params.eps / (params.weight_decay * std::fabs(double(p0)))) +
        std::fabs(p0) * 2.5e-7;  // and the rounding of p to fp32
    EXPECT_NEAR(adam.master()[i], p0 - params.lr * sign, tolerance) << "i=" << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, AdamPath,
                         ::testing::Values(sys::SimdLevel::kScalar, sys::SimdLevel::kAvx2,
                                           sys::SimdLevel::kAvx512),
                         [](const ::testing::TestParamInfo<sys::SimdLevel>& info) {
                           return std::string(to_string(info.param));
                         });

TEST(AdamKernel, UnsupportedPathIsAnErrorNamingIt) {
  if (sys::simd_level_supported(sys::SimdLevel::kAvx512)) {
    GTEST_SKIP() << "every path runs on this CPU; nothing unsupported to request";
  }
  auto kernel = AdamKernel::create(sys::SimdLevel::kAvx512);
  ASSERT_FALSE(kernel.is_ok());
  EXPECT_EQ(kernel.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(kernel.status().message().find("avx512"), std::string::npos)
      << kernel.status().message();
}

TEST(AdamKernel, DefaultPathIsTheBestSupportedWithoutOverride) {
  if (std::getenv("STRATA_SIMD") != nullptr) GTEST_SKIP() << "STRATA_SIMD is set";
  auto kernel = AdamKernel::create();
  ASSERT_TRUE(kernel.is_ok());
  EXPECT_EQ(kernel->simd(), sys::best_simd_level());
}

TEST(AdamParamsValidation, RejectsEachOutOfRangeFieldByName) {
  EXPECT_TRUE(validate(AdamParams{}).is_ok());
  struct Case {
    const char* field;
    AdamParams params;
  };
  std::vector<Case> cases;
  AdamParams p;
  p.lr = -1e-3f;
  cases.push_back({"lr", p});
  p = AdamParams{};
  p.beta1 = 1.0f;
  cases.push_back({"beta1", p});
  p = AdamParams{};
  p.beta2 = -0.1f;
  cases.push_back({"beta2", p});
  p = AdamParams{};
  p.eps = NAN;
  cases.push_back({"eps", p});
  p = AdamParams{};
  p.weight_decay = -0.5f;
  cases.push_back({"weight_decay", p});
  p = AdamParams{};
  p.step = 0;
  cases.push_back({"step", p});
  for (const Case& c : cases) {
    Status status = validate(c.params);
    ASSERT_FALSE(status.is_ok()) << c.field;
    EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(status.message().find(c.field), std::string::npos) << status.message();
  }
}

TEST(SimdLevel, ParsesTheThreeNames) {
  EXPECT_EQ(sys::parse_simd_level("scalar"), sys::SimdLevel::kScalar);
  EXPECT_EQ(sys::parse_simd_level("avx2"), sys::SimdLevel::kAvx2);
  EXPECT_EQ(sys::parse_simd_level("avx512"), sys::SimdLevel::kAvx512);
  EXPECT_FALSE(sys::parse_simd_level("sse").has_value());
  EXPECT_TRUE(sys::simd_level_supported(sys::SimdLevel::kScalar));
}

}  // namespace
}  // namespace strata::kernels
