// The fused residual + norm fast path's start-up check (backend/norm_check.h) on the CPU backend,
// with the CPU kernels as the verified path and fakes as the fused one: a right fused path (the
// add and the norm of kernels/cpu in one call, row by row) passes; one that does not write the
// sum back, one that normalizes x instead of the sum, one whose rstd is one ulp off, and one that
// returns an error all fail, each naming the tensor (or the error). FastPaths then lists the path
// off with one warning naming it.
#include "backend/norm_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/fast_path.h"
#include "kernels/cpu/nn_ops.h"
#include "support/cpu_backend_support.h"
#include "support/residual_norm_support.h"

namespace strata::backend {
namespace {

std::unique_ptr<Backend> cpu_backend() {
  return testing::small_cpu_backend(64ull << 20);
}

// The backend's own ops, add then norm: the verified path.
ResidualNormPath two_ops(Backend& backend) {
  return testing::ops_residual_norm(backend, false);
}

enum class Fault { kNone, kSumNotWritten, kNormOfX, kRstdUlp, kError };

// One call doing both, row by row, on the CPU kernels (`fault` mutates it).
ResidualNormPath fused(Fault fault) {
  ResidualNormPath p;
  const auto sum_rows = [fault](float* res, const float* x, std::int64_t rows,
                                std::int64_t channels, std::vector<float>* sum) {
    sum->resize(static_cast<std::size_t>(rows * channels));
    for (std::int64_t i = 0; i < rows * channels; ++i) {
      (*sum)[static_cast<std::size_t>(i)] = res[i] + x[i];
      if (fault != Fault::kSumNotWritten) res[i] = res[i] + x[i];
    }
    return fault == Fault::kNormOfX ? x : sum->data();
  };
  p.layernorm = [fault, sum_rows](float* res, const float* x, float* out, float* mean, float* rstd,
                                  const float* w, const float* b, std::int64_t rows,
                                  std::int64_t channels, double eps) -> Status {
    if (fault == Fault::kError) return Status(ErrorCode::kInternal, "an illegal memory access");
    std::vector<float> sum;
    const float* in = sum_rows(res, x, rows, channels, &sum);
    kernels::layernorm_forward<float>(out, mean, rstd, in, w, b, rows, channels, eps);
    if (fault == Fault::kRstdUlp) rstd[rows - 1] = std::nextafter(rstd[rows - 1], 0.0f);
    return Status::ok();
  };
  p.rmsnorm = [fault, sum_rows](float* res, const float* x, float* out, float* rstd, const float* w,
                                std::int64_t rows, std::int64_t channels, double eps) -> Status {
    if (fault == Fault::kError) return Status(ErrorCode::kInternal, "an illegal memory access");
    std::vector<float> sum;
    const float* in = sum_rows(res, x, rows, channels, &sum);
    kernels::rmsnorm_forward<float>(out, rstd, in, w, rows, channels, eps);
    if (fault == Fault::kRstdUlp) rstd[rows - 1] = std::nextafter(rstd[rows - 1], 0.0f);
    return Status::ok();
  };
  return p;
}

TEST(ResidualNormCheck, OneCallWithTheSameArithmeticPasses) {
  auto backend = cpu_backend();
  const Status s = check_residual_norm(*backend, two_ops(*backend), fused(Fault::kNone));
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(ResidualNormCheck, EachMutationFailsNamingWhatDiffers) {
  auto backend = cpu_backend();
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {{Fault::kSumNotWritten, "LayerNorm over 3 rows of 768 channels: res[0]"},
               {Fault::kNormOfX, ": out["},
               {Fault::kRstdUlp, ": rstd[2]"},
               {Fault::kError, "an illegal memory access"}};
  for (const auto& c : cases) {
    const Status s = check_residual_norm(*backend, two_ops(*backend), fused(c.fault));
    ASSERT_FALSE(s.is_ok()) << c.expect;
    EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
  }
}

TEST(ResidualNormCheck, AFailingFusedPathIsListedOffWithOneWarning) {
  auto backend = cpu_backend();
  std::vector<std::string> warnings;
  FastPaths paths([&](const std::string& m) { warnings.push_back(m); });
  const bool on = paths.adopt(kResidualNormName, kResidualNormReplaces, "one kernel", [&] {
    return check_residual_norm(*backend, two_ops(*backend), fused(Fault::kNormOfX));
  });
  EXPECT_FALSE(on);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("fast path fused_residual_norm is off"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find(kResidualNormReplaces), std::string::npos);
}

}  // namespace
}  // namespace strata::backend
