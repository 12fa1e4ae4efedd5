// Launcher of the device AdamW kernel (adam_kernels.cuh) on a CUDA stream.
#include "kernels/cuda/adam_kernels.cuh"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

cudaError_t adam_step(cudaStream_t s, const AdamDeviceConstants& c, float* master, float* exp_avg,
                      float* exp_avg_sq, const void* grad, int grad_code, void* copy_out,
                      int copy_code, std::int64_t n, const double* skip_flag) {
  if (n <= 0) return cudaSuccess;
  return run_adam_step(CudaLauncher{s}, c, master, exp_avg, exp_avg_sq, grad, grad_code, copy_out,
                       copy_code, n, skip_flag);
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
