// Softmax + cross-entropy (plain, and fused with its gradient in place) and the deterministic
// reductions behind sum(), sum_squares() and the gradient statistics (contracts in launch.h),
// with their launch functions (generic over the launcher, see device_math.cuh).
#pragma once

#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {
namespace {

constexpr int kLossThreads = 256;
using cuda::kReduceBlocks;
using cuda::kReduceThreads;

// One block per row: the row's max, then the sum of exp in double, then the loss (and, fused,
// the gradient written over the logits, and rounded into its companion where `narrow` has one). A
// target of -1 gives loss 0 and a zero gradient row.
template <bool kFused>
__global__ void __launch_bounds__(kLossThreads)
    cross_entropy_kernel(float* logits, float* losses, const std::int32_t* targets,
                         std::int64_t vocab, float grad_scale, Narrow narrow) {
  __shared__ float max_shared[32];
  __shared__ double sum_shared[32];
  const std::int64_t row = blockIdx.x;
  float* x = logits + row * vocab;
  const std::int32_t target = targets[row];
  if (target < 0) {  // ignored (-1): no loss and, fused, no gradient; uniform over the block
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if constexpr (kFused) {
      for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
        x[j] = 0.0f;
        store_narrow(narrow, row * vocab + j, 0.0f);
      }
    }
    return;
  }
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    m = fmaxf(m, x[j]);
  m = block_max(m, max_shared);
  double sum = 0.0;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    sum += static_cast<double>(expf(x[j] - m));
  sum = block_sum(sum, sum_shared);
  const float lse = m + static_cast<float>(log(sum));
  if (threadIdx.x == 0) losses[row] = lse - x[target];
  if constexpr (kFused) {
    __syncthreads();  // x[target] is read before anyone overwrites it
    for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = expf(x[j] - lse) * grad_scale;
      if (j == target) g -= grad_scale;
      x[j] = g;
      store_narrow(narrow, row * vocab + j, g);
    }
  }
}

// cross_entropy_16 (launch.h): one block per row of 16-bit logits (rows ld apart). Each thread
// keeps a running max m and sum s = sum exp(x - m) of its elements (s rescaled by exp(m_old -
// m_new), in double, when m grows); the block combines them as sum s_t exp(m_t - M) in double, so
// one pass gives the log-sum-exp. Fused, a second pass writes the gradient over the logits, rounded
// to the same type.
template <bool kFused>
__global__ void __launch_bounds__(kLossThreads)
    cross_entropy_16_kernel(std::uint16_t* logits, std::int64_t ld, int code, float* losses,
                            const std::int32_t* targets, std::int64_t vocab, float grad_scale) {
  __shared__ float max_shared[32];
  __shared__ double sum_shared[32];
  const std::int64_t row = blockIdx.x;
  std::uint16_t* x = logits + row * ld;
  const std::int32_t target = targets[row];
  if (target < 0) {  // ignored (-1): no loss and, fused, no gradient; uniform over the block
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if constexpr (kFused) {
      for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
        x[j] = 0;  // +0 in bf16 and fp16
    }
    return;
  }
  float m = -INFINITY;
  double s = 0.0;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = float_from_16_bits(x[j], code);
    if (v > m) {
      s = m == -INFINITY ? 0.0 : s * static_cast<double>(expf(m - v));
      m = v;
    }
    // -inf adds nothing; a NaN makes the sum NaN (the loss then says so).
    s += v == -INFINITY ? 0.0 : static_cast<double>(expf(v - m));
  }
  const float row_max = block_max(m, max_shared);
  // A thread that has seen only -inf (or nothing) adds nothing.
  double sum = m == -INFINITY && s == 0.0 ? 0.0 : s * static_cast<double>(expf(m - row_max));
  sum = block_sum(sum, sum_shared);
  const float lse = row_max + static_cast<float>(log(sum));
  const float at_target = float_from_16_bits(x[target], code);
  if (threadIdx.x == 0) losses[row] = lse - at_target;
  if constexpr (kFused) {
    __syncthreads();  // x[target] is read before anyone overwrites it
    for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = expf(float_from_16_bits(x[j], code) - lse) * grad_scale;
      if (j == target) g -= grad_scale;
      x[j] = float_to_16_bits(g, code);
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

template <typename L>
auto run_cross_entropy(const L& launch, bool fused, float* logits, float* losses,
                       const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                       float grad_scale, Narrow narrow = {}) {
  const dim3 grid(static_cast<unsigned>(rows));
  if (fused) {
    return launch(cross_entropy_kernel<true>, grid, dim3(kLossThreads), 0, logits, losses, targets,
                  vocab, grad_scale, narrow);
  }
  return launch(cross_entropy_kernel<false>, grid, dim3(kLossThreads), 0, logits, losses, targets,
                vocab, grad_scale, Narrow{});
}

template <typename L>
auto run_cross_entropy_16(const L& launch, bool fused, void* logits, std::int64_t ld, int code,
                          float* losses, const std::int32_t* targets, std::int64_t rows,
                          std::int64_t vocab, float grad_scale) {
  const dim3 grid(static_cast<unsigned>(rows));
  auto* x = static_cast<std::uint16_t*>(logits);
  if (fused) {
    return launch(cross_entropy_16_kernel<true>, grid, dim3(kLossThreads), 0, x, ld, code, losses,
                  targets, vocab, grad_scale);
  }
  return launch(cross_entropy_16_kernel<false>, grid, dim3(kLossThreads), 0, x, ld, code, losses,
                targets, vocab, 0.0f);
}

template <typename L>
auto run_reduce_stats(const L& launch, const void* x, int code, std::int64_t n, bool squares,
                      double* partials, double* result, bool accumulate) {
  auto err = launch(reduce_partials_kernel, dim3(kReduceBlocks), dim3(kReduceThreads), 0, x, code,
                    n, squares, partials);
  if (!launched(err)) return err;
  return launch(reduce_finish_kernel, dim3(1), dim3(kReduceThreads), 0,
                static_cast<const double*>(partials), result, accumulate);
}

}  // namespace
}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
