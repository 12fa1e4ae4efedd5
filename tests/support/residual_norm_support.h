// A backend's own ops as a ResidualNormPath (backend/norm_check.h), for the tests of the fused
// residual + norm: `fused` its add_layernorm_forward / add_rmsnorm_forward calls, else add and then
// the norm (the verified path). Each call only enqueues; the check synchronizes.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/norm_check.h"

namespace strata::testing {

inline backend::ResidualNormPath ops_residual_norm(backend::Backend& backend, bool fused) {
  backend::ResidualNormPath p;
  p.layernorm = [&backend, fused](float* res, const float* x, float* out, float* mean, float* rstd,
                                  const float* w, const float* b, std::int64_t rows,
                                  std::int64_t channels, double eps) {
    backend::Ops<float>& ops = backend.ops_f32();
    if (fused) {
      ops.add_layernorm_forward(res, x, out, mean, rstd, w, b, rows, channels, eps);
    } else {
      ops.add(res, res, x, rows * channels);
      ops.layernorm_forward(out, mean, rstd, res, w, b, rows, channels, eps);
    }
    return Status::ok();
  };
  p.rmsnorm = [&backend, fused](float* res, const float* x, float* out, float* rstd, const float* w,
                                std::int64_t rows, std::int64_t channels, double eps) {
    backend::Ops<float>& ops = backend.ops_f32();
    if (fused) {
      ops.add_rmsnorm_forward(res, x, out, rstd, w, rows, channels, eps);
    } else {
      ops.add(res, res, x, rows * channels);
      ops.rmsnorm_forward(out, rstd, res, w, rows, channels, eps);
    }
    return Status::ok();
  };
  return p;
}

}  // namespace strata::testing
