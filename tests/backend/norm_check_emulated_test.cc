// The fused residual + norm kernels (kernels/cuda/norm_kernels.cuh: layernorm_forward_kernel and
// rmsnorm_forward_kernel with the residual add in front) run by the SIMT emulator on the CPU
// backend's memory, through the fast path's start-up check (backend/norm_check.h): they give the
// bits of the add kernel followed by the plain norm kernel, emulated the same way, for LayerNorm
// and RMSNorm at both of the check's shapes (a full and a partial warp of channels).
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/norm_kernels.cuh"
//
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "backend/norm_check.h"
#include "support/cpu_backend_support.h"
#include "support/emulated_launch.h"

namespace strata::backend {
namespace {

#if defined(__SANITIZE_ADDRESS__)
TEST(ResidualNormEmulated, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

namespace ck = cuda_kernels;
const simt::Launcher kEmulator;

using testing::emulated_launched;

TEST(ResidualNormEmulated, TheFusedKernelsGiveTheBitsOfTheAddAndTheNormKernels) {
  std::unique_ptr<Backend> made = testing::small_cpu_backend(64ull << 20);
  ASSERT_NE(made, nullptr);
  Backend& backend = *made;

  ResidualNormPath two_kernels, one_kernel;
  two_kernels.layernorm = [](float* res, const float* x, float* out, float* mean, float* rstd,
                             const float* w, const float* b, std::int64_t rows,
                             std::int64_t channels, double eps) {
    STRATA_TRY(emulated_launched(ck::run_add(kEmulator, res, res, x, rows * channels), "add"));
    return emulated_launched(
        ck::run_layernorm_forward(kEmulator, out, mean, rstd, res, w, b, rows, channels, eps),
        "layernorm_forward");
  };
  two_kernels.rmsnorm = [](float* res, const float* x, float* out, float* rstd, const float* w,
                           std::int64_t rows, std::int64_t channels, double eps) {
    STRATA_TRY(emulated_launched(ck::run_add(kEmulator, res, res, x, rows * channels), "add"));
    return emulated_launched(
        ck::run_rmsnorm_forward(kEmulator, out, rstd, res, w, rows, channels, eps),
        "rmsnorm_forward");
  };
  one_kernel.layernorm = [](float* res, const float* x, float* out, float* mean, float* rstd,
                            const float* w, const float* b, std::int64_t rows,
                            std::int64_t channels, double eps) {
    return emulated_launched(ck::run_add_layernorm_forward(kEmulator, res, x, out, mean, rstd, w, b,
                                                           rows, channels, eps),
                             "add_layernorm_forward");
  };
  one_kernel.rmsnorm = [](float* res, const float* x, float* out, float* rstd, const float* w,
                          std::int64_t rows, std::int64_t channels, double eps) {
    return emulated_launched(
        ck::run_add_rmsnorm_forward(kEmulator, res, x, out, rstd, w, rows, channels, eps),
        "add_rmsnorm_forward");
  };
  const Status s = check_residual_norm(backend, two_kernels, one_kernel);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

#endif

}  // namespace
}  // namespace strata::backend
