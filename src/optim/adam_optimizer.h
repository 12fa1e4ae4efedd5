// Adam's hyperparameters as plain values, and the kernel arguments one step makes of them. Both
// Adams take these arguments, CPU Adam (offload/cpu_adam.h) and the device's OptimizerOps, so both
// perform the same fp32 operations; the conversion from the settings' doubles to the kernel's
// floats is made here and nowhere else. No configuration here: train/run_settings.cc fills the
// settings from the optimizer section, a binding fills them itself.
#pragma once

#include <cstdint>

#include "kernels/cpu/adam.h"

namespace strata::optim {

// Adam's hyperparameters (the offload engine takes these, not the config).
struct AdamSettings {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adamw = true;  // decoupled weight decay (AdamW, or DeepSpeed's adam_w_mode)
  bool bias_correction = true;
};

// The Adam kernel's parameters for one step: `lr` and Adam's `step` t.
kernels::AdamParams adam_params(const AdamSettings& settings, double lr, std::int64_t step);
// The work fused into the pass: the gradient multiplier (1 / combined loss scale and clip); the
// finite check off (the trainer checked the global norm first).
kernels::AdamFusion adam_fusion(double grad_multiplier);

}  // namespace strata::optim
