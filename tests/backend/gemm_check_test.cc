// The bias-epilogue fast path's start-up check (backend/gemm_check.h) on the CPU backend, with
// fakes: a right fused GEMM (the bias first, then the product added with beta 1: another order)
// passes; one that did not fuse, one that adds the bias by row instead of by column, one that adds
// it twice, and one that returns an error all fail, each naming what. The bias-and-GELU check
// passes the model's tanh GELU and fails the erf GELU, a tanh off by 2^-12 and a call that did
// not run.
#include "backend/gemm_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"
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
