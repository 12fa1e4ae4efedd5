// The start-up check of the fused residual + norm fast path (`fused_residual_norm`): one kernel
// that adds the residual and normalizes the sum (Ops::add_layernorm_forward,
// Ops::add_rmsnorm_forward) in place of the add kernel and then the norm kernel. CUDA-free: the
// CUDA backend passes its launchers, the tests fakes and the emulated kernels on the CPU backend.
//
// The fused kernel is built to give the bits of the two launches it replaces (the same fp32 sum,
// the same row statistics in the same order), so the check asks for exactly those bits: on the
// backend's memory, for LayerNorm and RMSNorm at two shapes (768 channels, and 33: a partial
// warp), the residual written back, the normalized rows and the statistics are compared bit for
// bit with `reference`, the verified path run on the same inputs.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

inline constexpr const char* kResidualNormName = "fused_residual_norm";
inline constexpr const char* kResidualNormReplaces =
    "the add kernel, then the norm kernel (two launches, the sum read twice)";

// res += x, then out = norm(res) with its statistics, on device fp32 arrays; each call returns the
// launch's result (the check synchronizes the compute stream).
struct ResidualNormPath {
  std::function<Status(float* res, const float* x, float* out, float* mean, float* rstd,
                       const float* w, const float* b, std::int64_t rows, std::int64_t channels,
                       double eps)>
      layernorm;
  std::function<Status(float* res, const float* x, float* out, float* rstd, const float* w,
                       std::int64_t rows, std::int64_t channels, double eps)>
      rmsnorm;
};

// OK, or an error naming the norm, the shape, the tensor and the first element that differs (or
// the path's own error).
Status check_residual_norm(Backend& backend, const ResidualNormPath& reference,
                           const ResidualNormPath& fused);

}  // namespace strata::backend
