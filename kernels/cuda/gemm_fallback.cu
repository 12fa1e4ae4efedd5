// Launcher of the fallback GEMM kernel (gemm_fallback_kernels.cuh) on a CUDA stream.
#include "kernels/cuda/gemm_fallback_kernels.cuh"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

cudaError_t gemm_fallback(cudaStream_t s, bool trans_a, bool trans_b, std::int64_t m,
                          std::int64_t n, std::int64_t k, float alpha, const void* a,
                          std::int64_t lda, const void* b, std::int64_t ldb, float beta, void* c,
                          std::int64_t ldc, int in_code, int out_code, const float* bias, void* aux,
                          int gelu) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  if ((n + 15) / 16 > 0x7fffffff) return cudaErrorInvalidValue;
  return run_gemm_fallback(CudaLauncher{s}, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                           c, ldc, in_code, out_code, bias, aux, gelu);
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
