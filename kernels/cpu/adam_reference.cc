#include "kernels/cpu/adam_reference.h"

#include <cmath>
#include <cstdint>

#include "kernels/cpu/float16.h"

namespace strata::kernels {
namespace {

double grad_at(const void* grad, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(grad)[i];
    case DType::kBF16:
      return bf16_to_float(static_cast<const std::uint16_t*>(grad)[i]);
    case DType::kF16:
      return fp16_to_float(static_cast<const std::uint16_t*>(grad)[i]);
  }
  return 0.0;
}

}  // namespace

AdamResult adam_reference(const AdamParams& params, const AdamFusion& fusion,
                          const AdamReferenceInput& in, double* out_master, double* out_exp_avg,
                          double* out_exp_avg_sq) {
  AdamResult result;
  if (fusion.check_finite) {
    for (std::size_t i = 0; i < in.n; ++i) {
      if (!std::isfinite(grad_at(in.grad, in.grad_dtype, i))) ++result.nonfinite_count;
    }
    result.skipped = result.nonfinite_count > 0;
  }

  const double lr = params.lr;
  const double beta1 = params.beta1;
  const double beta2 = params.beta2;
  const double eps = params.eps;
  const double weight_decay = params.weight_decay;
  const double t = static_cast<double>(params.step);
  const double bias_correction1 = params.bias_correction ? 1.0 - std::pow(beta1, t) : 1.0;
  const double bias_correction2 = params.bias_correction ? 1.0 - std::pow(beta2, t) : 1.0;
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);

  for (std::size_t i = 0; i < in.n; ++i) {
    double p = in.master[i];
    double m = in.exp_avg[i];
    double v = in.exp_avg_sq[i];
    if (!result.skipped) {
      double g = grad_at(in.grad, in.grad_dtype, i);
      g = g * static_cast<double>(fusion.grad_scale_inv) * static_cast<double>(fusion.clip_coef);
      if (!params.adamw_mode) g = g + weight_decay * p;  // Adam: L2 penalty in the gradient
      m = beta1 * m + (1.0 - beta1) * g;
      v = beta2 * v + (1.0 - beta2) * g * g;
      if (params.adamw_mode) p = p * (1.0 - lr * weight_decay);  // AdamW: decoupled decay
      const double denom = std::sqrt(v) / bias_correction2_sqrt + eps;
      p = p - step_size * m / denom;
    }
    out_master[i] = p;
    out_exp_avg[i] = m;
    out_exp_avg_sq[i] = v;
  }
  return result;
}

}  // namespace strata::kernels
