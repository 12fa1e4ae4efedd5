// Launchers of the attention kernels (attention_kernels.cuh) on a CUDA stream.
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

cudaError_t attention_forward(cudaStream_t s, float* out, float* lse, const float* q,
                              const float* k, const float* v, const AttentionShape& shape,
                              const cuda::AttentionLaunch& launch) {
  if (shape.batch <= 0 || shape.seq_len <= 0 || shape.heads <= 0) return cudaSuccess;
  if (launch.per_lane != 1 && launch.per_lane != 2 && launch.per_lane != 4 &&
      launch.per_lane != 8) {
    return cudaErrorInvalidValue;
  }
  return run_attention_forward(CudaLauncher{s}, out, lse, q, k, v, shape, launch);
}

cudaError_t attention_backward(cudaStream_t s, float* dq, float* dk, float* dv, const float* dout,
                               const float* out, const float* lse, const float* q, const float* k,
                               const float* v, const AttentionShape& shape,
                               const cuda::AttentionLaunch& launch) {
  if (shape.batch <= 0 || shape.seq_len <= 0 || shape.heads <= 0) return cudaSuccess;
  if (launch.per_lane != 1 && launch.per_lane != 2 && launch.per_lane != 4 &&
      launch.per_lane != 8) {
    return cudaErrorInvalidValue;
  }
  return run_attention_backward(CudaLauncher{s}, dq, dk, dv, dout, out, lse, q, k, v, shape,
                                launch);
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
