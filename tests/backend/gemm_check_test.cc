// The bias-epilogue fast path's start-up check (backend/gemm_check.h) on the CPU backend, with
// fakes: a right fused GEMM (the bias first, then the product added with beta 1: another order)
// passes; one that did not fuse, one that adds the bias by row instead of by column, one that adds
// it twice, and one that returns an error all fail, each naming what. The bias-and-GELU check
// passes the model's tanh GELU and fails the erf GELU, a tanh off by 2^-12 and a call that did
// not run. The GELU-gradient check passes the tanh form's derivative (and the CPU's own
// gelu_backward over the product) and fails the erf form's, the product without a derivative and
// a call that did not run. Their 16-bit forms (outputs rounded once to bf16 or fp16) pass GELU of
// the sum or of its rounding and the derivative at the 16-bit pre-activation, and fail a value two
// units in the last place off, the other 16-bit type, the erf form and a call that did not run; a
// failing one is listed off with one warning. The residual check passes a product plus its
// residual (with and without a bias) and fails one that leaves it out, adds it twice, reads it
// transposed or did not run.
#include "backend/gemm_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/fast_path.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_ops.h"
#include "support/cpu_backend_support.h"

namespace strata::backend {
namespace {

std::unique_ptr<Backend> cpu_backend() {
  return testing::small_cpu_backend(64ull << 20);
}

enum class Fault { kNone, kNotFused, kByRow, kTwice, kError };

GemmBiasFn fake(Fault fault) {
  return [fault](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                 std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
                 float* c) -> Result<bool> {
    if (fault == Fault::kError) {
      return Status(ErrorCode::kInternal, "CUBLAS_STATUS_EXECUTION_FAILED in cublasLtMatmul");
    }
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float add = fault == Fault::kByRow ? bias[i % n] : bias[j];
        if (fault == Fault::kTwice) add *= 2.0f;
        c[i * n + j] = fault == Fault::kNotFused ? 0.0f : add;
      }
    kernels::gemm<float>(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, n);
    return fault != Fault::kNotFused;
  };
}

TEST(GemmBiasCheck, ARightFusedGemmPassesInBothInputTypes) {
  auto backend = cpu_backend();
  for (const bool fp16 : {false, true}) {
    const Status s = check_gemm_bias(*backend, fake(Fault::kNone), fp16);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
}

TEST(GemmBiasCheck, AProductWithoutTheFusedBiasFails) {
  auto backend = cpu_backend();
  const Status s = check_gemm_bias(*backend, fake(Fault::kNotFused), false);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("m=70 n=96 k=64: the epilogue did not run"), std::string::npos)
      << s.to_string();
}

TEST(GemmBiasCheck, ABiasAddedByRowOrTwiceFailsNamingTheElement) {
  auto backend = cpu_backend();
  for (const Fault f : {Fault::kByRow, Fault::kTwice}) {
    const Status s = check_gemm_bias(*backend, fake(f), false);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("m=70 n=96 k=64: C["), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("bound"), std::string::npos) << s.to_string();
  }
}

TEST(GemmBiasCheck, AnErrorFailsWithItsMessageAndTheShape) {
  auto backend = cpu_backend();
  const Status s = check_gemm_bias(*backend, fake(Fault::kError), false);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("CUBLAS_STATUS_EXECUTION_FAILED"), std::string::npos);
  EXPECT_NE(s.to_string().find("m=70 n=96 k=64"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace strata::backend

namespace strata::backend {
namespace {

enum class GeluFault { kNone, kNotRun, kErfGelu, kApproximateTanh };

// pre = product + bias by the CPU, act by a GELU that is right (the tanh form), the erf form
// (another GELU: up to 4.7e-4 away), or the tanh form with tanh off by 2^-12 relative (what a fast
// approximation might give).
GemmBiasGeluFn gelu_fake(GeluFault fault) {
  return [fault](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                 std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, float* pre,
                 float* act) -> Result<bool> {
    if (fault == GeluFault::kNotRun) return false;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        pre[i * n + j] = bias[j];
    kernels::gemm<float>(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, pre, n);
    for (std::int64_t i = 0; i < m * n; ++i) {
      const double x = pre[i];
      double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
      if (fault == GeluFault::kApproximateTanh) t *= 1.0 + std::ldexp(1.0, -12);
      act[i] = static_cast<float>(fault == GeluFault::kErfGelu
                                      ? 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)))
                                      : 0.5 * x * (1.0 + t));
    }
    return true;
  };
}

TEST(GemmBiasGeluCheck, TheModelsTanhGeluPasses) {
  auto backend = cpu_backend();
  for (const bool fp16 : {false, true}) {
    const Status s = check_gemm_bias_gelu(*backend, gelu_fake(GeluFault::kNone), fp16);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
}

TEST(GemmBiasGeluCheck, AnotherGeluAnApproximateTanhOrNoRunFails) {
  auto backend = cpu_backend();
  for (const GeluFault f : {GeluFault::kErfGelu, GeluFault::kApproximateTanh}) {
    const Status s = check_gemm_bias_gelu(*backend, gelu_fake(f), false);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find(": act["), std::string::npos) << s.to_string();
  }
  const Status none = check_gemm_bias_gelu(*backend, gelu_fake(GeluFault::kNotRun), false);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.message().find("the epilogue did not run"), std::string::npos) << none.to_string();
}

}  // namespace
}  // namespace strata::backend

namespace strata::backend {
namespace {

enum class DgeluFault { kNone, kNotRun, kErfSlope, kNoSlope, kModelKernel };

// dpre = product (by the CPU GEMM) times a derivative: the model's tanh GELU's (right), the erf
// GELU's (another GELU: up to 1.3e-3 away), none (the product alone), or the CPU's own
// gelu_backward kernel over the product (the unfused path's arithmetic, in fp32: it passes).
GemmDgeluFn dgelu_fake(DgeluFault fault) {
  return [fault](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                 std::int64_t lda, const float* b, std::int64_t ldb, const float* pre,
                 float* dpre) -> Result<bool> {
    if (fault == DgeluFault::kNotRun) return false;
    std::vector<float> product(static_cast<std::size_t>(m * n));
    kernels::gemm<float>(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, product.data(), n);
    if (fault == DgeluFault::kModelKernel) {
      std::fill(dpre, dpre + m * n, 0.0f);
      kernels::gelu_backward<float>(dpre, pre, product.data(), m * n);
      return true;
    }
    for (std::int64_t i = 0; i < m * n; ++i) {
      const double x = pre[i];
      const double c = 0.7978845608028654;
      const double t = std::tanh(c * (x + 0.044715 * x * x * x));
      double slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
      if (fault == DgeluFault::kErfSlope) {
        slope = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
                x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * 3.141592653589793);
      }
      if (fault == DgeluFault::kNoSlope) slope = 1.0;
      dpre[i] = static_cast<float>(product[static_cast<std::size_t>(i)] * slope);
    }
    return true;
  };
}

TEST(GemmDgeluCheck, TheModelsTanhDerivativeAndItsOwnKernelPass) {
  auto backend = cpu_backend();
  for (const bool fp16 : {false, true}) {
    for (const DgeluFault f : {DgeluFault::kNone, DgeluFault::kModelKernel}) {
      const Status s = check_gemm_dgelu(*backend, dgelu_fake(f), fp16);
      EXPECT_TRUE(s.is_ok()) << s.to_string();
    }
  }
}

TEST(GemmDgeluCheck, AnotherDerivativeNoDerivativeOrNoRunFails) {
  auto backend = cpu_backend();
  for (const DgeluFault f : {DgeluFault::kErfSlope, DgeluFault::kNoSlope}) {
    const Status s = check_gemm_dgelu(*backend, dgelu_fake(f), false);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find(": dpre["), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("GELU'("), std::string::npos) << s.to_string();
  }
  const Status none = check_gemm_dgelu(*backend, dgelu_fake(DgeluFault::kNotRun), false);
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.message().find("the epilogue did not run"), std::string::npos) << none.to_string();
}

}  // namespace
}  // namespace strata::backend

namespace strata::backend {
namespace {

// The 16-bit forms (GemmEngine::gemm_bias_gelu_to_16, gemm_dgelu_to_16) on the CPU: the product by
// the CPU, each output rounded to the 16-bit type.
DType sixteen(bool fp16) {
  return fp16 ? DType::kF16 : DType::kBF16;
}
DType other(bool fp16) {
  return fp16 ? DType::kBF16 : DType::kF16;
}
double tanh_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double tanh_gelu_slope(double x) {
  const double c = 0.7978845608028654;
  const double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}
std::vector<float> rounded(const std::vector<float>& v, DType type) {
  std::vector<std::uint16_t> h(v.size());
  std::vector<float> out(v.size());
  const auto n = static_cast<std::int64_t>(v.size());
  kernels::cast_array(h.data(), type, v.data(), DType::kF32, n);
  kernels::cast_array(out.data(), DType::kF32, h.data(), type, n);
  return out;
}

enum class Gelu16Fault { kNone, kOfRounded, kTwoUlps, kOtherType, kErfGelu, kNotRun };

// pre16 = product + bias rounded; act16 = the tanh GELU of the unrounded sum (right: cuBLASLt's
// epilogue and the fallback kernel), of its rounding (right too: the unfused 16-bit path), two
// units off in the pre-activation of largest magnitude, written in the other 16-bit type, the erf
// GELU, or not run.
GemmBiasGelu16Fn gelu16_fake(Gelu16Fault fault, bool fp16) {
  return [fault, fp16](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                       const float* bias, void* pre16, void* act16) -> Result<bool> {
    if (fault == Gelu16Fault::kNotRun) return false;
    std::vector<float> pre(static_cast<std::size_t>(m * n));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        pre[static_cast<std::size_t>(i * n + j)] = bias[j];
    kernels::gemm<float>(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, pre.data(), n);
    const DType type = fault == Gelu16Fault::kOtherType ? other(fp16) : sixteen(fp16);
    const std::vector<float> x = fault == Gelu16Fault::kOfRounded ? rounded(pre, type) : pre;
    std::vector<float> act(pre.size());
    for (std::size_t i = 0; i < act.size(); ++i) {
      act[i] = static_cast<float>(fault == Gelu16Fault::kErfGelu
                                      ? 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)))
                                      : tanh_gelu(x[i]));
    }
    auto* p16 = static_cast<std::uint16_t*>(pre16);
    kernels::cast_array(p16, type, pre.data(), DType::kF32, m * n);
    kernels::cast_array(act16, type, act.data(), DType::kF32, m * n);
    if (fault == Gelu16Fault::kTwoUlps) {
      const auto largest = std::max_element(
          pre.begin(), pre.end(), [](float l, float r) { return std::abs(l) < std::abs(r); });
      p16[largest - pre.begin()] += 2;
    }
    return true;
  };
}

TEST(GemmBiasGelu16Check, GeluOfTheSumOrOfItsRoundingPassesInBothTypes) {
  auto backend = cpu_backend();
  for (const bool fp16 : {false, true}) {
    for (const Gelu16Fault f : {Gelu16Fault::kNone, Gelu16Fault::kOfRounded}) {
      const Status s = check_gemm_bias_gelu_16(*backend, gelu16_fake(f, fp16), fp16);
      EXPECT_TRUE(s.is_ok()) << s.to_string();
    }
  }
}

TEST(GemmBiasGelu16Check, TwoUnitsOffTheOtherTypeAnotherGeluOrNoRunFails) {
  auto backend = cpu_backend();
  for (const bool fp16 : {false, true}) {
    for (const auto& [f, expect] :
         {std::pair{Gelu16Fault::kTwoUlps, ": pre["}, std::pair{Gelu16Fault::kOtherType, ": pre["},
          std::pair{Gelu16Fault::kErfGelu, ": act["},
          std::pair{Gelu16Fault::kNotRun, "the epilogue did not run"}}) {
      const Status s = check_gemm_bias_gelu_16(*backend, gelu16_fake(f, fp16), fp16);
      ASSERT_FALSE(s.is_ok()) << static_cast<int>(f) << " fp16 " << fp16;
      EXPECT_NE(s.message().find(expect), std::string::npos) << s.to_string();
    }
  }
}

enum class Dgelu16Fault { kNone, kOtherType, kErfSlope, kNotRun };

// dpre16 = product times the tanh GELU's derivative at pre16 widened, rounded (right); pre16 read
// as the other 16-bit type; the erf GELU's derivative; not run.
GemmDgelu16Fn dgelu16_fake(Dgelu16Fault fault, bool fp16) {
  return [fault, fp16](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                       const void* pre16, void* dpre16) -> Result<bool> {
    if (fault == Dgelu16Fault::kNotRun) return false;
    std::vector<float> product(static_cast<std::size_t>(m * n));
    kernels::gemm<float>(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, product.data(), n);
    std::vector<float> pre(product.size());
    kernels::cast_array(pre.data(), DType::kF32, pre16,
                        fault == Dgelu16Fault::kOtherType ? other(fp16) : sixteen(fp16), m * n);
    for (std::size_t i = 0; i < pre.size(); ++i) {
      const double x = pre[i];
      const double slope = fault == Dgelu16Fault::kErfSlope
                               ? 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
                                     x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * 3.141592653589793)
                               : tanh_gelu_slope(x);
      product[i] = static_cast<float>(product[i] * slope);
    }
    kernels::cast_array(dpre16, sixteen(fp16), product.data(), DType::kF32, m * n);
    return true;
  };
}

TEST(GemmDgelu16Check, TheDerivativeAtThe16BitPreActivationPassesInBothTypes) {
  auto backend = cpu_backend();
  for (const bool fp16 : {false, true}) {
    const Status s = check_gemm_dgelu_16(*backend, dgelu16_fake(Dgelu16Fault::kNone, fp16), fp16);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
}

TEST(GemmDgelu16Check, TheOtherTypeAnotherDerivativeOrNoRunFails) {
  auto backend = cpu_backend();
  for (const bool fp16 : {false, true}) {
    for (const auto& [f, expect] : {std::pair{Dgelu16Fault::kOtherType, "GELU'("},
                                    std::pair{Dgelu16Fault::kErfSlope, "GELU'("},
                                    std::pair{Dgelu16Fault::kNotRun, "the epilogue did not run"}}) {
      const Status s = check_gemm_dgelu_16(*backend, dgelu16_fake(f, fp16), fp16);
      ASSERT_FALSE(s.is_ok()) << static_cast<int>(f) << " fp16 " << fp16;
      EXPECT_NE(s.message().find(expect), std::string::npos) << s.to_string();
    }
  }
}

TEST(GemmBiasGelu16Check, AFailingEpilogueIsListedOffWithOneWarning) {
  auto backend = cpu_backend();
  std::vector<std::string> warnings;
  FastPaths paths([&](const std::string& m) { warnings.push_back(m); });
  const bool on = paths.adopt(kGemmDgelu16Name, kGemmDgelu16Replaces, "DGELU in 16 bits", [&] {
    return check_gemm_dgelu_16(*backend, dgelu16_fake(Dgelu16Fault::kErfSlope, false), false);
  });
  EXPECT_FALSE(on);
  EXPECT_FALSE(paths.active(kGemmDgelu16Name));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("fast path gemm_dgelu_epilogue_16bit is off"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find(kGemmDgelu16Replaces), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace strata::backend

namespace strata::backend {
namespace {

enum class ResidualFault { kNone, kLeftOut, kTwice, kTransposed, kNotRun };

// C = product (+ bias) + R by the CPU: right; without R; R added twice; R read transposed (as an
// (n, m) array); not run.
GemmResidualFn residual_fake(ResidualFault fault) {
  return [fault](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                 std::int64_t lda, const float* b, std::int64_t ldb, const float* bias,
                 const float* residual, float* c) -> Result<bool> {
    if (fault == ResidualFault::kNotRun) return false;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        const float r = fault == ResidualFault::kTransposed ? residual[(j * m + i) % (m * n)]
                                                            : residual[i * n + j];
        const float times = fault == ResidualFault::kLeftOut ? 0.0f
                            : fault == ResidualFault::kTwice ? 2.0f
                                                             : 1.0f;
        c[i * n + j] = times * r + (bias != nullptr ? bias[j] : 0.0f);
      }
    }
    kernels::gemm<float>(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, n);
    return true;
  };
}

TEST(GemmResidualCheck, ARightFusedResidualPassesWithAndWithoutABias) {
  auto backend = cpu_backend();
  for (const bool fp16 : {false, true}) {
    const Status s = check_gemm_residual(*backend, residual_fake(ResidualFault::kNone), fp16);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
}

TEST(GemmResidualCheck, AResidualLeftOutTwiceTransposedOrNotRunFails) {
  auto backend = cpu_backend();
  for (const auto& [f, expect] :
       {std::pair{ResidualFault::kLeftOut, ": C["}, std::pair{ResidualFault::kTwice, ": C["},
        std::pair{ResidualFault::kTransposed, ": C["},
        std::pair{ResidualFault::kNotRun, "the epilogue did not run"}}) {
    const Status s = check_gemm_residual(*backend, residual_fake(f), false);
    ASSERT_FALSE(s.is_ok()) << static_cast<int>(f);
    EXPECT_NE(s.message().find(expect), std::string::npos) << s.to_string();
  }
}

}  // namespace
}  // namespace strata::backend
