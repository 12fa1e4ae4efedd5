// Softmax + cross-entropy (plain, and fused with its gradient in place) and the deterministic
// reductions behind sum(), sum_squares() and the gradient statistics (contracts in launch.h).
#include <cuda_runtime.h>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"

namespace strata::cuda_kernels {
namespace {

constexpr int kLossThreads = 256;
using backend::cuda::kReduceBlocks;
using backend::cuda::kReduceThreads;

// One block per row: the row's max, then the sum of exp in double, then the loss (and, fused,
// the gradient written over the logits).
template <bool kFused>
__global__ void __launch_bounds__(kLossThreads)
    cross_entropy_kernel(float* logits, float* losses, const std::int32_t* targets,
                         std::int64_t vocab, float grad_scale) {
  __shared__ float max_shared[32];
  __shared__ double sum_shared[32];
  const std::int64_t row = blockIdx.x;
  float* x = logits + row * vocab;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    m = fmaxf(m, x[j]);
  m = block_max(m, max_shared);
  double sum = 0.0;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    sum += static_cast<double>(expf(x[j] - m));
  sum = block_sum(sum, sum_shared);
  const float lse = m + static_cast<float>(log(sum));
  const std::int32_t target = targets[row];
  if (threadIdx.x == 0) losses[row] = lse - x[target];
  if constexpr (kFused) {
    __syncthreads();  // x[target] is read before anyone overwrites it
    for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = expf(x[j] - lse) * grad_scale;
      if (j == target) g -= grad_scale;
      x[j] = g;
    }
  }
}

// Pass 1 of reduce_stats: block b adds elements b*threads + tid + k*(blocks*threads) in order,
// then the block's tree; partials[b] = sum, partials[blocks + b] = non-finite count.
__global__ void __launch_bounds__(kReduceThreads)
    reduce_partials_kernel(const void* x, int code, std::int64_t n, bool squares,
                           double* partials) {
  __shared__ double shared[32];
  double acc = 0.0;
  double nonfinite = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(kReduceBlocks) * kReduceThreads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kReduceThreads + threadIdx.x; i < n;
       i += stride) {
    const float v = load_as_float(x, code, i);
    if (!isfinite(v)) nonfinite += 1.0;
    const double d = static_cast<double>(v);
    acc += squares ? d * d : d;
  }
  acc = block_sum(acc, shared);
  nonfinite = block_sum(nonfinite, shared);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = acc;
    partials[kReduceBlocks + blockIdx.x] = nonfinite;
  }
}

// Pass 2: one block adds the partials in a fixed tree.
__global__ void __launch_bounds__(kReduceThreads)
    reduce_finish_kernel(const double* partials, double* result, bool accumulate) {
  __shared__ double shared[32];
  double acc = 0.0;
  double nonfinite = 0.0;
  for (int i = threadIdx.x; i < kReduceBlocks; i += kReduceThreads) {
    acc += partials[i];
    nonfinite += partials[kReduceBlocks + i];
  }
  acc = block_sum(acc, shared);
  nonfinite = block_sum(nonfinite, shared);
  if (threadIdx.x == 0) {
    result[0] = accumulate ? result[0] + acc : acc;
    result[1] = accumulate ? result[1] + nonfinite : nonfinite;
  }
}

}  // namespace

cudaError_t cross_entropy_forward(cudaStream_t s, float* losses, const float* logits,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t vocab) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  // The plain kernel only reads the logits.
  cross_entropy_kernel<false><<<static_cast<unsigned>(rows), kLossThreads, 0, s>>>(
      const_cast<float*>(logits), losses, targets, vocab, 0.0f);
  return cudaGetLastError();
}

cudaError_t cross_entropy_fused(cudaStream_t s, float* logits, float* losses,
                                const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                                float grad_scale) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  cross_entropy_kernel<true><<<static_cast<unsigned>(rows), kLossThreads, 0, s>>>(
      logits, losses, targets, vocab, grad_scale);
  return cudaGetLastError();
}

cudaError_t reduce_stats(cudaStream_t s, const void* x, int code, std::int64_t n, bool squares,
                         double* partials, double* result, bool accumulate) {
  if (n < 0) return cudaErrorInvalidValue;
  reduce_partials_kernel<<<kReduceBlocks, kReduceThreads, 0, s>>>(x, code, n, squares, partials);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  reduce_finish_kernel<<<1, kReduceThreads, 0, s>>>(partials, result, accumulate);
  return cudaGetLastError();
}

}  // namespace strata::cuda_kernels
