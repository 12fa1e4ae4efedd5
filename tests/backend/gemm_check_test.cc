// The bias-epilogue fast path's start-up check (backend/gemm_check.h) on the CPU backend, with
// fakes: a right fused GEMM (the bias first, then the product added with beta 1: another order)
// passes; one that did not fuse, one that adds the bias by row instead of by column, one that adds
// it twice, and one that returns an error all fail, each naming what.
#include "backend/gemm_check.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "kernels/cpu/gemm.h"

namespace strata::backend {
namespace {

std::unique_ptr<Backend> cpu_backend() {
  CpuBackendOptions options;
  options.device_bytes_max = 64ull << 20;
  options.threads = 1;
  auto backend = make_cpu_backend(options);
  EXPECT_TRUE(backend.is_ok()) << backend.status().to_string();
  return std::move(backend).value();
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
  EXPECT_NE(s.message().find("m=70 n=96 k=64: the bias was not fused"), std::string::npos)
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
