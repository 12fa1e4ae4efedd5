// Element-wise kernels: embedding lookup, GELU, SwiGLU, residual add, bias, scale, rotary
// embeddings and dtype conversions (contracts in launch.h / kernels/cpu/nn_ops.h), with their
// launch functions (generic over the launcher, see device_math.cuh). Grid-stride loops over
// 64-bit indices; precise expf/tanhf (no fast-math), so results track the CPU's to a few ulps.
#pragma once

#include "kernels/cpu/nn_ops.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {
namespace {

using cuda::elementwise_blocks;
using cuda::kElementwiseThreads;

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

__global__ void embedding_forward_kernel(float* out, const std::int32_t* tokens,
                                         const std::int32_t* positions, const float* wte,
                                         const float* wpe, std::int64_t rows, std::int64_t seq_len,
                                         std::int64_t channels) {
  const std::int64_t total = rows * channels;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t r = i / channels;
    const std::int64_t c = i - r * channels;
    float v = wte[static_cast<std::int64_t>(tokens[r]) * channels + c];
    if (wpe != nullptr) {
      const std::int64_t t = positions != nullptr ? positions[r] : r % seq_len;
      v += wpe[t * channels + c];
    }
    out[i] = v;
  }
}

__global__ void gelu_forward_kernel(float* out, const float* x, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + tanhf(kGeluK * (v + kGeluC * v * v * v)));
  }
}

__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dout, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = x[i];
    const float th = tanhf(kGeluK * (v + kGeluC * v * v * v));
    const float sech2 = 1.0f - th * th;
    const float grad =
        0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
    dx[i] += grad * dout[i];
  }
}

// gate_up(N, 2I) = [gate | up]; out(N, I).
__global__ void swiglu_forward_kernel(float* out, const float* gate_up, std::int64_t rows,
                                      std::int64_t inner) {
  const std::int64_t total = rows * inner;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t r = i / inner;
    const std::int64_t j = i - r * inner;
    const float g = gate_up[r * 2 * inner + j];
    const float u = gate_up[r * 2 * inner + inner + j];
    const float sig = 1.0f / (1.0f + expf(-g));
    out[i] = g * sig * u;
  }
}

__global__ void swiglu_backward_kernel(float* dgate_up, const float* gate_up, const float* dout,
                                       std::int64_t rows, std::int64_t inner) {
  const std::int64_t total = rows * inner;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t r = i / inner;
    const std::int64_t j = i - r * inner;
    const float g = gate_up[r * 2 * inner + j];
    const float u = gate_up[r * 2 * inner + inner + j];
    const float d = dout[i];
    const float sig = 1.0f / (1.0f + expf(-g));
    dgate_up[r * 2 * inner + j] = d * u * sig * (1.0f + g * (1.0f - sig));
    dgate_up[r * 2 * inner + inner + j] = d * (g * sig);
  }
}

__global__ void add_kernel(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = a[i] + b[i];
}

__global__ void add_bias_kernel(float* x, const float* bias, std::int64_t rows,
                                std::int64_t channels) {
  const std::int64_t total = rows * channels;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads())
    x[i] += bias[i % channels];
}

__global__ void scale_kernel(float* x, std::int64_t n, float alpha) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    x[i] *= alpha;
}

// One thread per (row, head, d < R/2) pair (d, d + R/2) of the R rotated dimensions: Hugging
// Face's rotate_half; the head's dimensions past R are left alone.
__global__ void rope_kernel(float* x, kernels::RopeShape p, std::int64_t half, const float* cos,
                            const float* sin, float direction) {
  const std::int64_t total = p.rows * p.heads * half;
  const std::int64_t stride = p.stride, heads = p.heads, head_dim = p.head_dim;
  for (std::int64_t i = global_thread(); i < total; i += grid_threads()) {
    const std::int64_t d = i % half;
    const std::int64_t h = (i / half) % heads;
    const std::int64_t r = i / (half * heads);
    const std::int64_t t = p.positions != nullptr ? p.positions[r] : r % p.seq_len;
    float* x1 = x + r * stride + h * head_dim + d;
    float* x2 = x1 + half;
    const float a = *x1;
    const float b = *x2;
    const float c = cos[t * half + d];
    const float s = direction * sin[t * half + d];
    *x1 = a * c - b * s;
    *x2 = b * c + a * s;
  }
}

__global__ void cast_kernel(void* dst, int dst_code, const void* src, int src_code,
                            std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    store_from_float(dst, dst_code, i, load_as_float(src, src_code, i));
}

// Threads over columns (x), blocks over rows (y, grid-stride).
__global__ void cast_block_kernel(std::uint16_t* dst, int dst_code, std::int64_t dst_ld,
                                  const float* src, std::int64_t src_ld, std::int64_t rows,
                                  std::int64_t cols) {
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* in = src + r * src_ld;
    std::uint16_t* out = dst + r * dst_ld;
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         c < cols; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      out[c] = dst_code == kCodeBF16 ? float_to_bf16_bits(in[c]) : float_to_fp16_bits(in[c]);
    }
  }
}

// The converse: dst (rows x cols of fp32, leading dimension dst_ld) = src (16-bit `src_code`,
// leading dimension src_ld), exactly.
__global__ void cast_block_from_16_kernel(float* dst, std::int64_t dst_ld, const std::uint16_t* src,
                                          int src_code, std::int64_t src_ld, std::int64_t rows,
                                          std::int64_t cols) {
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::uint16_t* in = src + r * src_ld;
    float* out = dst + r * dst_ld;
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         c < cols; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      out[c] = src_code == kCodeBF16 ? bf16_bits_to_float(in[c]) : fp16_bits_to_float(in[c]);
    }
  }
}

// The grid of the block casts: threads over columns, at most 64 blocks of them, blocks over rows.
dim3 cast_block_grid(std::int64_t rows, std::int64_t cols) {
  const std::int64_t x_blocks = (cols + kElementwiseThreads - 1) / kElementwiseThreads;
  return dim3(static_cast<unsigned>(x_blocks < 64 ? x_blocks : 64),
              static_cast<unsigned>(rows < 65535 ? rows : 65535));
}

dim3 elementwise_grid(std::int64_t n) {
  return dim3(static_cast<unsigned>(cuda::elementwise_blocks(n)));
}

template <typename L>
auto run_embedding_forward(const L& launch, float* out, const std::int32_t* tokens,
                           const std::int32_t* positions, const float* wte, const float* wpe,
                           std::int64_t rows, std::int64_t seq_len, std::int64_t channels) {
  return launch(embedding_forward_kernel, elementwise_grid(rows * channels),
                dim3(kElementwiseThreads), 0, out, tokens, positions, wte, wpe, rows, seq_len,
                channels);
}

template <typename L>
auto run_gelu_forward(const L& launch, float* out, const float* x, std::int64_t n) {
  return launch(gelu_forward_kernel, elementwise_grid(n), dim3(kElementwiseThreads), 0, out, x, n);
}

template <typename L>
auto run_gelu_backward(const L& launch, float* dx, const float* x, const float* dout,
                       std::int64_t n) {
  return launch(gelu_backward_kernel, elementwise_grid(n), dim3(kElementwiseThreads), 0, dx, x,
                dout, n);
}

template <typename L>
auto run_swiglu_forward(const L& launch, float* out, const float* gate_up, std::int64_t rows,
                        std::int64_t inner) {
  return launch(swiglu_forward_kernel, elementwise_grid(rows * inner), dim3(kElementwiseThreads), 0,
                out, gate_up, rows, inner);
}

template <typename L>
auto run_swiglu_backward(const L& launch, float* dgate_up, const float* gate_up, const float* dout,
                         std::int64_t rows, std::int64_t inner) {
  return launch(swiglu_backward_kernel, elementwise_grid(rows * inner), dim3(kElementwiseThreads),
                0, dgate_up, gate_up, dout, rows, inner);
}

template <typename L>
auto run_add(const L& launch, float* out, const float* a, const float* b, std::int64_t n) {
  return launch(add_kernel, elementwise_grid(n), dim3(kElementwiseThreads), 0, out, a, b, n);
}

template <typename L>
auto run_add_bias(const L& launch, float* x, const float* bias, std::int64_t rows,
                  std::int64_t channels) {
  return launch(add_bias_kernel, elementwise_grid(rows * channels), dim3(kElementwiseThreads), 0, x,
                bias, rows, channels);
}

template <typename L>
auto run_scale(const L& launch, float* x, std::int64_t n, float alpha) {
  return launch(scale_kernel, elementwise_grid(n), dim3(kElementwiseThreads), 0, x, n, alpha);
}

template <typename L>
auto run_rope(const L& launch, float* x, const kernels::RopeShape& shape, const float* cos,
              const float* sin, float direction) {
  const std::int64_t half = (shape.rotary_dim > 0 ? shape.rotary_dim : shape.head_dim) / 2;
  return launch(rope_kernel, elementwise_grid(shape.rows * shape.heads * half),
                dim3(kElementwiseThreads), 0, x, shape, half, cos, sin, direction);
}

template <typename L>
auto run_cast(const L& launch, void* dst, int dst_code, const void* src, int src_code,
              std::int64_t n) {
  return launch(cast_kernel, elementwise_grid(n), dim3(kElementwiseThreads), 0, dst, dst_code, src,
                src_code, n);
}

template <typename L>
auto run_cast_block_to_16(const L& launch, void* dst, int dst_code, std::int64_t dst_ld,
                          const float* src, std::int64_t src_ld, std::int64_t rows,
                          std::int64_t cols) {
  return launch(cast_block_kernel, cast_block_grid(rows, cols), dim3(kElementwiseThreads), 0,
                static_cast<std::uint16_t*>(dst), dst_code, dst_ld, src, src_ld, rows, cols);
}

template <typename L>
auto run_cast_block_from_16(const L& launch, float* dst, std::int64_t dst_ld, const void* src,
                            int src_code, std::int64_t src_ld, std::int64_t rows,
                            std::int64_t cols) {
  return launch(cast_block_from_16_kernel, cast_block_grid(rows, cols), dim3(kElementwiseThreads),
                0, dst, dst_ld, static_cast<const std::uint16_t*>(src), src_code, src_ld, rows,
                cols);
}

}  // namespace
}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
