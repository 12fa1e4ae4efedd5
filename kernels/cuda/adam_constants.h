// The per-step constants of the device AdamW kernel: kernels/cpu/adam_internal.h's AdamConstants
// (computed on the host by make_constants, the same for CPU and GPU), as a plain struct kernels
// take by value. No CUDA here.
#pragma once

namespace strata::cuda_kernels {

struct AdamDeviceConstants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inv_sqrt_bc2, decay, l2,
      grad_scale;
};

}  // namespace strata::cuda_kernels
