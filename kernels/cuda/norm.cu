// Launchers of the normalisation, bias-gradient and embedding-backward kernels
// (norm_kernels.cuh) on a CUDA stream.
#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm_kernels.cuh"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

cudaError_t layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* x,
                              const float* w, const float* b, std::int64_t rows,
                              std::int64_t channels, double eps, Narrow narrow) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_layernorm_forward(CudaLauncher{s}, out, mean, rstd, x, w, b, rows, channels, eps,
                               narrow);
}

cudaError_t add_layernorm_forward(cudaStream_t s, float* res, const float* x, float* out,
                                  float* mean, float* rstd, const float* w, const float* b,
                                  std::int64_t rows, std::int64_t channels, double eps,
                                  Narrow narrow) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_add_layernorm_forward(CudaLauncher{s}, res, x, out, mean, rstd, w, b, rows, channels,
                                   eps, narrow);
}

cudaError_t layernorm_backward(cudaStream_t s, float* dx, float* dw, float* db, const float* dout,
                               const float* x, const float* w, const float* mean, const float* rstd,
                               std::int64_t rows, std::int64_t channels,
                               const cuda::ColumnReducePlan& plan, double* scratch, Narrow narrow,
                               Sixteen dout16) {
  if (!norm_backward_dout_valid(dout, dout16)) return cudaErrorInvalidValue;
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_layernorm_backward(CudaLauncher{s}, dx, dw, db, dout, x, w, mean, rstd, rows, channels,
                                plan, scratch, narrow, dout16);
}

cudaError_t rmsnorm_forward(cudaStream_t s, float* out, float* rstd, const float* x, const float* w,
                            std::int64_t rows, std::int64_t channels, double eps, Narrow narrow) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_rmsnorm_forward(CudaLauncher{s}, out, rstd, x, w, rows, channels, eps, narrow);
}

cudaError_t add_rmsnorm_forward(cudaStream_t s, float* res, const float* x, float* out, float* rstd,
                                const float* w, std::int64_t rows, std::int64_t channels,
                                double eps, Narrow narrow) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_add_rmsnorm_forward(CudaLauncher{s}, res, x, out, rstd, w, rows, channels, eps,
                                 narrow);
}

cudaError_t rmsnorm_backward(cudaStream_t s, float* dx, float* dw, const float* dout,
                             const float* x, const float* w, const float* rstd, std::int64_t rows,
                             std::int64_t channels, const cuda::ColumnReducePlan& plan,
                             double* scratch, Narrow narrow, Sixteen dout16) {
  if (!norm_backward_dout_valid(dout, dout16)) return cudaErrorInvalidValue;
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_rmsnorm_backward(CudaLauncher{s}, dx, dw, dout, x, w, rstd, rows, channels, plan,
                              scratch, narrow, dout16);
}

cudaError_t rmsnorm_heads_forward(cudaStream_t s, float* out, float* rstd, const float* x,
                                  const float* w, std::int64_t rows, std::int64_t heads,
                                  std::int64_t head_dim, std::int64_t x_stride,
                                  std::int64_t out_stride, double eps) {
  if (rows <= 0 || heads <= 0 || head_dim <= 0) return cudaSuccess;
  return run_rmsnorm_heads_forward(CudaLauncher{s}, out, rstd, x, w, rows, heads, head_dim,
                                   x_stride, out_stride, eps);
}

cudaError_t rmsnorm_heads_backward(cudaStream_t s, float* d, float* dw, const float* x,
                                   const float* w, const float* rstd, std::int64_t rows,
                                   std::int64_t heads, std::int64_t head_dim, std::int64_t d_stride,
                                   std::int64_t x_stride, const cuda::ColumnReducePlan& plan,
                                   double* scratch, Narrow narrow) {
  if (rows <= 0 || heads <= 0 || head_dim <= 0) return cudaSuccess;
  return run_rmsnorm_heads_backward(CudaLauncher{s}, d, dw, x, w, rstd, rows, heads, head_dim,
                                    d_stride, x_stride, plan, scratch, narrow);
}

cudaError_t bias_backward(cudaStream_t s, float* dbias, const float* dout, std::int64_t rows,
                          std::int64_t channels, const cuda::ColumnReducePlan& plan,
                          double* scratch, Sixteen dout16) {
  if (!norm_backward_dout_valid(dout, dout16)) return cudaErrorInvalidValue;
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_bias_backward(CudaLauncher{s}, dbias, dout, rows, channels, plan, scratch, dout16);
}

cudaError_t embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout,
                               const std::int32_t* tokens, const std::int32_t* positions,
                               std::int64_t rows, std::int64_t seq_len, std::int64_t channels,
                               std::int32_t padding_idx) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  return run_embedding_backward(CudaLauncher{s}, dwte, dwpe, dout, tokens, positions, rows, seq_len,
                                channels, padding_idx);
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
