// A plain shared-memory tiled GEMM (16 x 16 tiles, fp32 accumulation) for any strides, alignment
// and transposition, C in fp32 or rounded once to 16 bits (out_code), a bias (one fp32 value per
// column of C) added to each result before it is stored where given, GELU or its gradient after it
// where asked (GemmGelu, dtype_codes.h: cuBLASLt's GELU epilogues), with its launch function
// (generic over the launcher, see device_math.cuh): the fallback when cuBLASLt offers no algorithm
// for a shape, and a second implementation the GEMM tests can compare against.
#pragma once

#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/device_math.cuh"

STRATA_CUDA_NAMESPACE(cuda_kernels) {
namespace {

constexpr int kTileSide = 16;

__global__ void gemm_fallback_kernel(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                     std::int64_t k, float alpha, const void* a, std::int64_t lda,
                                     const void* b, std::int64_t ldb, float beta, void* c,
                                     std::int64_t ldc, int code, int out_code, const float* bias,
                                     void* aux, int gelu) {
  __shared__ float as[kTileSide][kTileSide + 1];
  __shared__ float bs[kTileSide][kTileSide + 1];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kTileSide + tx;
  for (std::int64_t row_base = static_cast<std::int64_t>(blockIdx.y) * kTileSide; row_base < m;
       row_base += static_cast<std::int64_t>(gridDim.y) * kTileSide) {
    const std::int64_t row = row_base + ty;
    float acc = 0.0f;
    for (std::int64_t k0 = 0; k0 < k; k0 += kTileSide) {
      const std::int64_t ka = k0 + tx;  // op(A)(row, ka)
      as[ty][tx] = (row < m && ka < k)
                       ? load_as_float(a, code, trans_a ? ka * lda + row : row * lda + ka)
                       : 0.0f;
      const std::int64_t kb = k0 + ty;  // op(B)(kb, col)
      bs[ty][tx] = (kb < k && col < n)
                       ? load_as_float(b, code, trans_b ? col * ldb + kb : kb * ldb + col)
                       : 0.0f;
      __syncthreads();
      STRATA_UNROLL
      for (int t = 0; t < kTileSide; ++t)
        acc += as[ty][t] * bs[t][tx];
      __syncthreads();
    }
    if (row < m && col < n) {
      const std::int64_t at = row * ldc + col;
      float v = beta == 0.0f ? alpha * acc : alpha * acc + beta * load_as_float(c, out_code, at);
      // The bias in fp32 after the product, as the unfused add_bias adds it to a stored product.
      if (bias != nullptr) v += bias[col];
      if (gelu == kGemmGeluAux) {
        store_from_float(aux, out_code, at, v);
        v = gelu_value(v);
      } else if (gelu == kGemmDgelu) {
        const float slope = gelu_grad(load_as_float(aux, out_code, at));
        v = 0.0f + slope * v;
      }
      store_from_float(c, out_code, at, v);
    }
  }
}

template <typename L>
auto run_gemm_fallback(const L& launch, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                       std::int64_t k, float alpha, const void* a, std::int64_t lda, const void* b,
                       std::int64_t ldb, float beta, void* c, std::int64_t ldc, int in_code,
                       int out_code = kCodeF32, const float* bias = nullptr, void* aux = nullptr,
                       int gelu = kGemmNoGelu) {
  const std::int64_t x_blocks = (n + kTileSide - 1) / kTileSide;
  const std::int64_t y_blocks = (m + kTileSide - 1) / kTileSide;
  const dim3 grid(static_cast<unsigned>(x_blocks),
                  static_cast<unsigned>(y_blocks < 65535 ? y_blocks : 65535));
  return launch(gemm_fallback_kernel, grid, dim3(kTileSide, kTileSide), 0, trans_a, trans_b, m, n,
                k, alpha, a, lda, b, ldb, beta, c, ldc, in_code, out_code, bias, aux, gelu);
}

}  // namespace
}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
