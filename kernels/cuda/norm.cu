// Launchers of the normalisation, bias-gradient and embedding-backward kernels
// (norm_kernels.cuh) on a CUDA stream.
#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm_kernels.cuh"

namespace strata::cuda_kernels {

cudaError_t layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* x,
                              const float* w, const float* b, std::int64_t rows,
                              std::int64_t channels, double eps) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_layernorm_forward(CudaLauncher{s}, out, mean, rstd, x, w, b, rows, channels, eps);
}

cudaError_t layernorm_backward(cudaStream_t s, float* dx, float* dw, float* db, const float* dout,
                               const float* x, const float* w, const float* mean, const float* rstd,
                               std::int64_t rows, std::int64_t channels,
                               const cuda::ColumnReducePlan& plan, double* scratch) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_layernorm_backward(CudaLauncher{s}, dx, dw, db, dout, x, w, mean, rstd, rows, channels,
                                plan, scratch);
}

cudaError_t rmsnorm_forward(cudaStream_t s, float* out, float* rstd, const float* x, const float* w,
                            std::int64_t rows, std::int64_t channels, double eps) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_rmsnorm_forward(CudaLauncher{s}, out, rstd, x, w, rows, channels, eps);
}

cudaError_t rmsnorm_backward(cudaStream_t s, float* dx, float* dw, const float* dout,
                             const float* x, const float* w, const float* rstd, std::int64_t rows,
                             std::int64_t channels, const cuda::ColumnReducePlan& plan,
                             double* scratch) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_rmsnorm_backward(CudaLauncher{s}, dx, dw, dout, x, w, rstd, rows, channels, plan,
                              scratch);
}

cudaError_t bias_backward(cudaStream_t s, float* dbias, const float* dout, std::int64_t rows,
                          std::int64_t channels, const cuda::ColumnReducePlan& plan,
                          double* scratch) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_bias_backward(CudaLauncher{s}, dbias, dout, rows, channels, plan, scratch);
}

cudaError_t embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout,
                               const std::int32_t* tokens, std::int64_t rows, std::int64_t seq_len,
                               std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_embedding_backward(CudaLauncher{s}, dwte, dwpe, dout, tokens, rows, seq_len, channels);
}

}  // namespace strata::cuda_kernels
