// Adam's kernel arguments (see adam_optimizer.h).
#include "optim/adam_optimizer.h"

namespace strata::optim {

kernels::AdamParams adam_params(const AdamSettings& settings, double lr, std::int64_t step) {
  kernels::AdamParams params;
  params.lr = static_cast<float>(lr);
  params.beta1 = static_cast<float>(settings.beta1);
  params.beta2 = static_cast<float>(settings.beta2);
  params.eps = static_cast<float>(settings.eps);
  params.weight_decay = static_cast<float>(settings.weight_decay);
  params.adamw_mode = settings.adamw;
  params.bias_correction = settings.bias_correction;
  params.step = step;
  return params;
}

kernels::AdamFusion adam_fusion(double grad_multiplier) {
  kernels::AdamFusion fusion;
  fusion.grad_scale_inv = static_cast<float>(grad_multiplier);
  fusion.clip_coef = 1.0f;
  fusion.check_finite = false;  // the trainer checked the global norm first
  return fusion;
}

}  // namespace strata::optim
