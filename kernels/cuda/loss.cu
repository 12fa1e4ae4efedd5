// Launchers of the loss and reduction kernels (loss_kernels.cuh) on a CUDA stream.
#include "kernels/cuda/launch.h"
#include "kernels/cuda/loss_kernels.cuh"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

cudaError_t cross_entropy_forward(cudaStream_t s, float* losses, const float* logits,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t vocab) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  // The plain kernel only reads the logits.
  return run_cross_entropy(CudaLauncher{s}, false, const_cast<float*>(logits), losses, targets,
                           rows, vocab, 0.0f);
}

cudaError_t cross_entropy_fused(cudaStream_t s, float* logits, float* losses,
                                const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                                float grad_scale, Narrow narrow) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  return run_cross_entropy(CudaLauncher{s}, true, logits, losses, targets, rows, vocab, grad_scale,
                           narrow);
}

cudaError_t cross_entropy_16(cudaStream_t s, bool fused, void* logits, std::int64_t ld, int code,
                             float* losses, const std::int32_t* targets, std::int64_t rows,
                             std::int64_t vocab, float grad_scale) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  if (rows > 0x7fffffff || ld < vocab || (code != kCodeBF16 && code != kCodeF16)) {
    return cudaErrorInvalidValue;
  }
  return run_cross_entropy_16(CudaLauncher{s}, fused, logits, ld, code, losses, targets, rows,
                              vocab, grad_scale);
}

cudaError_t reduce_stats(cudaStream_t s, const void* x, int code, std::int64_t n, bool squares,
                         double* partials, double* result, bool accumulate) {
  if (n < 0) return cudaErrorInvalidValue;
  return run_reduce_stats(CudaLauncher{s}, x, code, n, squares, partials, result, accumulate);
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
