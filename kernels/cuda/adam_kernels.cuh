// Device Adam/AdamW for optimizer tiles kept on the GPU, with its launch function (generic over
// the launcher, see device_math.cuh). Per element it performs exactly the fp32 operations of the
// CPU kernel (kernels/cpu/adam_internal.h, adam_element), each with an explicit round-to-nearest
// intrinsic so that nvcc cannot contract or reorder them: the weights, moments and bf16/fp16
// copies are bit-identical to CPU Adam's.
#pragma once

#include "kernels/cuda/adam_constants.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {
namespace {

__global__ void adam_kernel(AdamDeviceConstants c, float* master, float* exp_avg, float* exp_avg_sq,
                            const void* grad, int grad_code, void* copy_out, int copy_code,
                            std::int64_t n, const double* skip_flag) {
  if (skip_flag != nullptr && skip_flag[1] != 0.0) return;  // a non-finite gradient: skip the tile
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    float g = __fmul_rn(load_as_float(grad, grad_code, i), c.grad_scale);
    float param = master[i];
    if (c.l2 != 0.0f) g = __fmaf_rn(c.l2, param, g);
    const float new_m = __fmaf_rn(c.beta1, exp_avg[i], __fmul_rn(c.one_minus_beta1, g));
    const float new_v =
        __fmaf_rn(c.beta2, exp_avg_sq[i], __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
    const float denom = __fmaf_rn(__fsqrt_rn(new_v), c.inv_sqrt_bc2, c.eps);
    param = __fmul_rn(param, c.decay);
    param = __fmaf_rn(-c.step_size, __fdiv_rn(new_m, denom), param);
    master[i] = param;
    exp_avg[i] = new_m;
    exp_avg_sq[i] = new_v;
    if (copy_code >= 0) store_from_float(copy_out, copy_code, i, param);
  }
}

template <typename L>
auto run_adam_step(const L& launch, const AdamDeviceConstants& c, float* master, float* exp_avg,
                   float* exp_avg_sq, const void* grad, int grad_code, void* copy_out,
                   int copy_code, std::int64_t n, const double* skip_flag) {
  return launch(adam_kernel, dim3(static_cast<unsigned>(cuda::elementwise_blocks(n))),
                dim3(cuda::kElementwiseThreads), 0, c, master, exp_avg, exp_avg_sq, grad, grad_code,
                copy_out, copy_code, n, skip_flag);
}

}  // namespace
}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
