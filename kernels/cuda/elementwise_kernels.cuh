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

// The element-wise kernels below take 4 elements per thread (16-byte loads and stores) where every
// array is 16-byte aligned (and, for SwiGLU, each row's halves too), one at a time otherwise; each
// element's arithmetic is the same either way, so are its bits.
// 4 elements moved as one aligned load or store.
template <typename T>
struct alignas(4 * sizeof(T)) Group4 {
  T v[4];
};
using Float4 = Group4<float>;

__device__ __forceinline__ bool aligned_16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// Elements i..i+3 of a companion output (Narrow), when there is one: one 8-byte store where
// aligned, else four.
__device__ __forceinline__ void store_narrow4(const Narrow& narrow, std::int64_t i,
                                              const Float4& v) {
  if (narrow.p == nullptr) return;
  Group4<std::uint16_t> h;
  for (int j = 0; j < 4; ++j)
    h.v[j] = float_to_16_bits(v.v[j], narrow.code);
  std::uint16_t* at = narrow.p + i;
  if (reinterpret_cast<std::uintptr_t>(at) % 8 == 0) {
    *reinterpret_cast<Group4<std::uint16_t>*>(at) = h;
  } else {
    for (int j = 0; j < 4; ++j)
      at[j] = h.v[j];
  }
}

// GELU's and SwiGLU's forward write `out` and its companion (where `narrow` has one), or the
// companion alone where `out` is null (an activation kept in 16 bits alone): the same bits.
__global__ void gelu_forward_kernel(float* out, const float* x, std::int64_t n, Narrow narrow) {
  const std::int64_t groups = aligned_16(out) && aligned_16(x) ? n / 4 : 0;
  const auto* x4 = reinterpret_cast<const Float4*>(x);
  auto* out4 = reinterpret_cast<Float4*>(out);
  for (std::int64_t g = global_thread(); g < groups; g += grid_threads()) {
    const Float4 v = x4[g];
    Float4 o;
    for (int j = 0; j < 4; ++j)
      o.v[j] = gelu_value(v.v[j]);
    if (out != nullptr) out4[g] = o;
    store_narrow4(narrow, 4 * g, o);
  }
  for (std::int64_t i = 4 * groups + global_thread(); i < n; i += grid_threads()) {
    const float o = gelu_value(x[i]);
    if (out != nullptr) out[i] = o;
    store_narrow(narrow, i, o);
  }
}

__global__ void gelu_backward_kernel(float* dx, const float* x, const float* dout, std::int64_t n,
                                     Narrow narrow) {
  const std::int64_t groups = aligned_16(dx) && aligned_16(x) && aligned_16(dout) ? n / 4 : 0;
  const auto* x4 = reinterpret_cast<const Float4*>(x);
  const auto* d4 = reinterpret_cast<const Float4*>(dout);
  auto* dx4 = reinterpret_cast<Float4*>(dx);
  for (std::int64_t g = global_thread(); g < groups; g += grid_threads()) {
    const Float4 v = x4[g];
    const Float4 d = d4[g];
    Float4 acc = dx4[g];
    for (int j = 0; j < 4; ++j)
      acc.v[j] += gelu_grad(v.v[j]) * d.v[j];
    dx4[g] = acc;
    store_narrow4(narrow, 4 * g, acc);
  }
  for (std::int64_t i = 4 * groups + global_thread(); i < n; i += grid_threads()) {
    const float v = dx[i] + gelu_grad(x[i]) * dout[i];
    dx[i] = v;
    store_narrow(narrow, i, v);
  }
}

// GELU's forward and backward reading its input x (the pre-activation, kept in 16 bits: `code`)
// widened: the bits of gelu_forward_kernel and gelu_backward_kernel on the widened values. The
// forward's `out` may be null with a companion (the activation kept in 16 bits alone). The backward
// assigns dx = GELU'(x) dout, as gelu_backward_kernel accumulates it onto a zeroed dx (0 + the
// product, so a -0 becomes +0 in both); its `dx` may be null with a companion: it writes the
// companion alone (a gradient kept in 16 bits alone).
__global__ void gelu_forward_16_kernel(float* out, const std::uint16_t* x, int code, std::int64_t n,
                                       Narrow narrow) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float o = gelu_value(float_from_16_bits(x[i], code));
    if (out != nullptr) out[i] = o;
    store_narrow(narrow, i, o);
  }
}

__global__ void gelu_backward_16_kernel(float* dx, const std::uint16_t* x, int code,
                                        const float* dout, std::int64_t n, Narrow narrow) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    float v = 0.0f;
    v += gelu_grad(float_from_16_bits(x[i], code)) * dout[i];
    if (dx != nullptr) dx[i] = v;
    store_narrow(narrow, i, v);
  }
}

__device__ __forceinline__ float silu_sigmoid(float g) {
  return 1.0f / (1.0f + expf(-g));
}

// SwiGLU's arithmetic, one element: its value, and the gradients of gate and up.
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return g * silu_sigmoid(g) * u;
}
__device__ __forceinline__ void swiglu_grads(float g, float u, float d, float* dg, float* du) {
  const float sig = silu_sigmoid(g);
  *dg = d * u * sig * (1.0f + g * (1.0f - sig));
  *du = d * (g * sig);
}

// SwiGLU one element per thread over rows x inner, with gate and up read by `load` (an index into
// the (N, 2I) array: an fp32 one, or a 16-bit one widened): the fp32 kernels' loop where their
// arrays are not 16-byte aligned, and the whole of the 16-bit kernels, so both give the same bits
// on the same values. `out` may be null with a companion (written alone).
template <typename Load>
__device__ __forceinline__ void swiglu_forward_each(float* out, const Load& load, std::int64_t rows,
                                                    std::int64_t inner, Narrow narrow) {
  for (std::int64_t i = global_thread(); i < rows * inner; i += grid_threads()) {
    const std::int64_t r = i / inner;
    const std::int64_t j = i - r * inner;
    const float o = swiglu_value(load(r * 2 * inner + j), load(r * 2 * inner + inner + j));
    if (out != nullptr) out[i] = o;
    store_narrow(narrow, i, o);
  }
}
// `load` reads gate_up's element k, `load_dout` dout's element i, each as fp32.
template <typename Load, typename LoadDout>
__device__ __forceinline__ void swiglu_backward_each(float* dgate_up, const Load& load,
                                                     const LoadDout& load_dout, std::int64_t rows,
                                                     std::int64_t inner, Narrow narrow) {
  for (std::int64_t i = global_thread(); i < rows * inner; i += grid_threads()) {
    const std::int64_t r = i / inner;
    const std::int64_t j = i - r * inner;
    float dg, du;
    swiglu_grads(load(r * 2 * inner + j), load(r * 2 * inner + inner + j), load_dout(i), &dg, &du);
    if (dgate_up != nullptr) {
      dgate_up[r * 2 * inner + j] = dg;
      dgate_up[r * 2 * inner + inner + j] = du;
    }
    store_narrow(narrow, r * 2 * inner + j, dg);
    store_narrow(narrow, r * 2 * inner + inner + j, du);
  }
}

// Whether SwiGLU's arrays go 4 columns at a time: every row of gate, up and out starts 16-byte
// aligned.
__device__ __forceinline__ bool swiglu_grouped(const void* a, const void* b, const void* c,
                                               std::int64_t inner) {
  return inner % 4 == 0 && aligned_16(a) && aligned_16(b) && aligned_16(c);
}

// gate_up(N, 2I) = [gate | up]; out(N, I).
__global__ void swiglu_forward_kernel(float* out, const float* gate_up, std::int64_t rows,
                                      std::int64_t inner, Narrow narrow) {
  const std::int64_t total = rows * inner;
  if (swiglu_grouped(out, gate_up, gate_up, inner)) {
    const std::int64_t per_row = inner / 4;
    for (std::int64_t q = global_thread(); q < total / 4; q += grid_threads()) {
      const std::int64_t r = q / per_row;
      const std::int64_t j = (q - r * per_row) * 4;
      const Float4 g = *reinterpret_cast<const Float4*>(gate_up + r * 2 * inner + j);
      const Float4 u = *reinterpret_cast<const Float4*>(gate_up + r * 2 * inner + inner + j);
      Float4 o;
      for (int e = 0; e < 4; ++e)
        o.v[e] = swiglu_value(g.v[e], u.v[e]);
      if (out != nullptr) reinterpret_cast<Float4*>(out)[q] = o;
      store_narrow4(narrow, 4 * q, o);
    }
    return;
  }
  swiglu_forward_each(
      out, [gate_up](std::int64_t k) { return gate_up[k]; }, rows, inner, narrow);
}

// SwiGLU's forward on gate_up(N, 2I) in 16 bits (`code`): each element widened, then the fp32
// kernel's arithmetic, so the bits are those of swiglu_forward_kernel on the widened values. `out`
// may be null with a companion (as swiglu_forward_kernel's).
__global__ void swiglu_forward_16_kernel(float* out, const std::uint16_t* gate_up, int code,
                                         std::int64_t rows, std::int64_t inner, Narrow narrow) {
  swiglu_forward_each(
      out, [gate_up, code](std::int64_t k) { return float_from_16_bits(gate_up[k], code); }, rows,
      inner, narrow);
}

__global__ void swiglu_backward_kernel(float* dgate_up, const float* gate_up, const float* dout,
                                       std::int64_t rows, std::int64_t inner, Narrow narrow) {
  const std::int64_t total = rows * inner;
  if (swiglu_grouped(dgate_up, gate_up, dout, inner)) {
    const std::int64_t per_row = inner / 4;
    for (std::int64_t q = global_thread(); q < total / 4; q += grid_threads()) {
      const std::int64_t r = q / per_row;
      const std::int64_t j = (q - r * per_row) * 4;
      const Float4 g = *reinterpret_cast<const Float4*>(gate_up + r * 2 * inner + j);
      const Float4 u = *reinterpret_cast<const Float4*>(gate_up + r * 2 * inner + inner + j);
      const Float4 d = reinterpret_cast<const Float4*>(dout)[q];
      Float4 dg;
      Float4 du;
      for (int e = 0; e < 4; ++e)
        swiglu_grads(g.v[e], u.v[e], d.v[e], &dg.v[e], &du.v[e]);
      *reinterpret_cast<Float4*>(dgate_up + r * 2 * inner + j) = dg;
      *reinterpret_cast<Float4*>(dgate_up + r * 2 * inner + inner + j) = du;
      store_narrow4(narrow, r * 2 * inner + j, dg);
      store_narrow4(narrow, r * 2 * inner + inner + j, du);
    }
    return;
  }
  swiglu_backward_each(
      dgate_up, [gate_up](std::int64_t k) { return gate_up[k]; },
      [dout](std::int64_t i) { return dout[i]; }, rows, inner, narrow);
}

// SwiGLU's backward on gate_up in 16 bits (`code`), as swiglu_forward_16_kernel: the bits of
// swiglu_backward_kernel on the widened values. dout is fp32 (`dout`), or in the same 16 bits
// (`dout16`, `dout` null: a gradient kept in 16 bits alone), widened likewise. A null `dgate_up`
// with a companion writes the companion alone (a gradient kept in 16 bits alone), the same bits.
__global__ void swiglu_backward_16_kernel(float* dgate_up, const std::uint16_t* gate_up, int code,
                                          const float* dout, const std::uint16_t* dout16,
                                          std::int64_t rows, std::int64_t inner, Narrow narrow) {
  const auto load = [gate_up, code](std::int64_t k) {
    return float_from_16_bits(gate_up[k], code);
  };
  if (dout16 != nullptr) {
    swiglu_backward_each(
        dgate_up, load,
        [dout16, code](std::int64_t i) { return float_from_16_bits(dout16[i], code); }, rows, inner,
        narrow);
    return;
  }
  swiglu_backward_each(
      dgate_up, load, [dout](std::int64_t i) { return dout[i]; }, rows, inner, narrow);
}

// acc = g rounded to the 16-bit `code` and widened back (assign), or acc += that: the bits of
// cast to 16 bits, cast back, then copy or add, in one pass (a gradient kept on the device in the
// arithmetic of one that leaves it in 16 bits).
__global__ void add_rounded_kernel(float* acc, const float* g, int code, std::int64_t n,
                                   bool assign) {
  const std::int64_t groups = aligned_16(acc) && aligned_16(g) ? n / 4 : 0;
  for (std::int64_t i = global_thread(); i < groups; i += grid_threads()) {
    const Float4 x = reinterpret_cast<const Float4*>(g)[i];
    Float4 o = assign ? Float4{} : reinterpret_cast<const Float4*>(acc)[i];
    for (int j = 0; j < 4; ++j)
      o.v[j] = assign ? round_through_16(x.v[j], code) : o.v[j] + round_through_16(x.v[j], code);
    reinterpret_cast<Float4*>(acc)[i] = o;
  }
  for (std::int64_t i = 4 * groups + global_thread(); i < n; i += grid_threads()) {
    const float r = round_through_16(g[i], code);
    acc[i] = assign ? r : acc[i] + r;
  }
}

__global__ void add_kernel(float* out, const float* a, const float* b, std::int64_t n) {
  const std::int64_t groups = aligned_16(out) && aligned_16(a) && aligned_16(b) ? n / 4 : 0;
  for (std::int64_t g = global_thread(); g < groups; g += grid_threads()) {
    const Float4 x = reinterpret_cast<const Float4*>(a)[g];
    const Float4 y = reinterpret_cast<const Float4*>(b)[g];
    Float4 o;
    for (int j = 0; j < 4; ++j)
      o.v[j] = x.v[j] + y.v[j];
    reinterpret_cast<Float4*>(out)[g] = o;
  }
  for (std::int64_t i = 4 * groups + global_thread(); i < n; i += grid_threads())
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

// RoPE's rotation of the pair (a, b) = (x[d], x[d + R/2]) by (c, s): a c - b s (first) and
// b c + a s (second), each computed the one way every kernel that rotates computes it (a rounded
// product, then a fused multiply-add), so no compiler contraction can make the in-place rotation
// and the rotation while rounding to 16 bits (rope_block_to_16_kernel) differ by a bit.
__device__ __forceinline__ float rope_first(float a, float b, float c, float s) {
  return __fmaf_rn(a, c, -__fmul_rn(b, s));
}
__device__ __forceinline__ float rope_second(float a, float b, float c, float s) {
  return __fmaf_rn(b, c, __fmul_rn(a, s));
}

// One thread per (row, head, d < R/2) pair (d, d + R/2) of the R rotated dimensions: Hugging
// Face's rotate_half; the head's dimensions past R are left alone.
__global__ void rope_kernel(float* x, kernels::RopeShape p, std::int64_t half, const float* cos,
                            const float* sin, float direction, Narrow narrow) {
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
    *x1 = rope_first(a, b, c, s);
    *x2 = rope_second(a, b, c, s);
    store_narrow(narrow, x1 - x, *x1);
    store_narrow(narrow, x2 - x, *x2);
  }
}

// What rope_block_to_16_kernel rotates: heads of head_dim values side by side in each row, the
// first 2 half of each rotated by the row's position (positions[r], else r % seq_len) in the
// tables cos, sin (half values per position).
struct RopeRows {
  std::int64_t heads = 0, head_dim = 0, half = 0, seq_len = 0;
  const std::int32_t* positions = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  float direction = 1.0f;  // rope_kernel's: 1 the rotation, -1 its transpose (the backward's)
};

// The element j of a row (heads of head_dim values side by side; load(i) gives its element i as a
// float) rotated as rope_kernel rotates it in place, by the row's position t: the first 2 half of
// each head in pairs (d, d + half).
template <typename Load>
__device__ __forceinline__ float rope_element(const Load& load, std::int64_t j, std::int64_t t,
                                              const RopeRows& p) {
  // A row's columns fit 32 bits (its heads), where the remainder is one cheap instruction.
  const std::int64_t d = static_cast<std::int32_t>(j) % static_cast<std::int32_t>(p.head_dim);
  const std::int64_t half = p.half;
  if (d >= 2 * half) return load(j);
  const std::int64_t e = d < half ? d : d - half;
  const float c = p.cos[t * half + e], s = p.direction * p.sin[t * half + e];
  return d < half ? rope_first(load(j), load(j + half), c, s)
                  : rope_second(load(j - half), load(j), c, s);
}

// dst (rows x heads * head_dim, 16-bit dst_code, leading dimension dst_ld) = src (fp32, leading
// dimension src_ld) rotated as rope_kernel rotates it in place (p.direction), then rounded to
// nearest even: the bits of rope_kernel followed by cast_block_kernel, in one pass that leaves src
// unrotated. Threads over a row's columns (x), blocks over rows (y, grid-stride); each thread
// reads its element's partner too. With `src16` set (src null: q and k kept in 16 bits alone), the
// source is those 16-bit values widened, exactly: the bits of the same on an fp32 src holding them.
__global__ void rope_block_to_16_kernel(std::uint16_t* dst, int dst_code, std::int64_t dst_ld,
                                        const float* src, Sixteen src16, std::int64_t src_ld,
                                        std::int64_t rows, RopeRows p) {
  const std::int64_t cols = p.heads * p.head_dim;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::int64_t t = p.positions != nullptr ? p.positions[r] : r % p.seq_len;
    if (src16.p != nullptr) {
      const std::uint16_t* x = src16.p + r * src_ld;
      const int code = src16.code;
      const auto load = [x, code](std::int64_t i) { return float_from_16_bits(x[i], code); };
      for (std::int64_t j = first; j < cols; j += stride)
        dst[r * dst_ld + j] = float_to_16_bits(rope_element(load, j, t, p), dst_code);
      continue;
    }
    const float* x = src + r * src_ld;
    const auto load = [x](std::int64_t i) { return x[i]; };
    for (std::int64_t j = first; j < cols; j += stride)
      dst[r * dst_ld + j] = float_to_16_bits(rope_element(load, j, t, p), dst_code);
  }
}

// dst (rows x cols, 16-bit dst_code, leading dimension dst_ld) = src (16-bit src.code, leading
// dimension src_ld): copied where the types agree, else widened (exactly) and rounded to nearest
// even; the bits of cast_block_kernel on an fp32 src holding src's values widened. Threads over
// columns (x), blocks over rows (y, grid-stride).
__global__ void cast_block_16_kernel(std::uint16_t* dst, int dst_code, std::int64_t dst_ld,
                                     Sixteen src, std::int64_t src_ld, std::int64_t rows,
                                     std::int64_t cols) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::uint16_t* x = src.p + r * src_ld;
    std::uint16_t* y = dst + r * dst_ld;
    if (src.code == dst_code) {
      for (std::int64_t c = first; c < cols; c += stride)
        y[c] = x[c];
    } else {
      for (std::int64_t c = first; c < cols; c += stride)
        y[c] = float_to_16_bits(float_from_16_bits(x[c], src.code), dst_code);
    }
  }
}

// The converse, for the gradients: dst (rows x heads * head_dim fp32, leading dimension dst_ld) =
// src (16-bit src_code, leading dimension src_ld) widened, then rotated as rope_kernel rotates it
// in place (p.direction -1: its backward), and rounded into dst's companion `also` where it has
// one: the bits of cast_block_from_16_kernel followed by rope_kernel. Each thread widens its
// element's partner itself (a second 16-bit read), so dst is written once. A null dst with a
// companion writes the companion alone (a gradient kept in 16 bits alone), the same bits.
__global__ void rope_block_from_16_kernel(float* dst, std::int64_t dst_ld, const std::uint16_t* src,
                                          int src_code, std::int64_t src_ld, std::int64_t rows,
                                          RopeRows p, Narrow also) {
  const std::int64_t cols = p.heads * p.head_dim;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::uint16_t* x = src + r * src_ld;
    const std::int64_t t = p.positions != nullptr ? p.positions[r] : r % p.seq_len;
    const Narrow row{also.p != nullptr ? also.p + r * dst_ld : nullptr, also.code};
    // The elements widened (exactly): the values of the fp32 array rope_kernel would read.
    const auto load = [x, src_code](std::int64_t i) { return float_from_16_bits(x[i], src_code); };
    for (std::int64_t j = first; j < cols; j += stride) {
      const float v = rope_element(load, j, t, p);
      if (dst != nullptr) dst[r * dst_ld + j] = v;
      store_narrow(row, j, v);
    }
  }
}

// The dtype conversions move 4 elements per thread where they can: a 16-byte fp32 load or store
// beside an 8-byte 16-bit one (one element at a time, they ran at a third of the memory's speed).
// Each element's bits are those of store_from_float(load_as_float(...)), whichever way it goes.
__device__ __forceinline__ std::uint16_t convert_element(float f, int code, std::uint16_t*) {
  return float_to_16_bits(f, code);
}
__device__ __forceinline__ float convert_element(std::uint16_t h, int code, float*) {
  return float_from_16_bits(h, code);
}

// The index of a run at `p` (elements of `bytes` each) from which groups of 4 are aligned to
// 4 x `bytes`, or -1 when no index is (p not aligned to one element).
__device__ __forceinline__ std::int64_t group_start(const void* p, std::uintptr_t bytes) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  if (at % bytes != 0) return -1;
  return static_cast<std::int64_t>((4 - (at / bytes) % 4) % 4);
}

// n elements from `in` (fp32 or 16-bit `code`) to `out` (the other), by the threads `first`,
// `first + stride`, ...: one at a time before the first index where both sides' groups of 4 are
// aligned (all n when there is none), then in groups of 4, then the rest one at a time.
template <typename Out, typename In>
__device__ __forceinline__ void convert_run(Out* out, const In* in, int code, std::int64_t n,
                                            std::int64_t first, std::int64_t stride) {
  const std::int64_t start = group_start(in, sizeof(In));
  std::int64_t head = start >= 0 && start == group_start(out, sizeof(Out)) ? start : n;
  if (head > n) head = n;
  const std::int64_t groups = (n - head) / 4;
  const std::int64_t tail = head + 4 * groups;
  for (std::int64_t c = first; c < head; c += stride)
    out[c] = convert_element(in[c], code, out);
  const auto* in4 = reinterpret_cast<const Group4<In>*>(in + head);
  auto* out4 = reinterpret_cast<Group4<Out>*>(out + head);
  for (std::int64_t g = first; g < groups; g += stride) {
    const Group4<In> x = in4[g];
    Group4<Out> y;
    for (int j = 0; j < 4; ++j)
      y.v[j] = convert_element(x.v[j], code, out);
    out4[g] = y;
  }
  for (std::int64_t c = tail + first; c < n; c += stride)
    out[c] = convert_element(in[c], code, out);
}

__global__ void cast_kernel(void* dst, int dst_code, const void* src, int src_code,
                            std::int64_t n) {
  if (src_code == kCodeF32 && dst_code != kCodeF32) {
    convert_run(static_cast<std::uint16_t*>(dst), static_cast<const float*>(src), dst_code, n,
                global_thread(), grid_threads());
  } else if (dst_code == kCodeF32 && src_code != kCodeF32) {
    convert_run(static_cast<float*>(dst), static_cast<const std::uint16_t*>(src), src_code, n,
                global_thread(), grid_threads());
  } else {
    for (std::int64_t i = global_thread(); i < n; i += grid_threads())
      store_from_float(dst, dst_code, i, load_as_float(src, src_code, i));
  }
}

// Threads over columns (x), blocks over rows (y, grid-stride).
__global__ void cast_block_kernel(std::uint16_t* dst, int dst_code, std::int64_t dst_ld,
                                  const float* src, std::int64_t src_ld, std::int64_t rows,
                                  std::int64_t cols) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    convert_run(dst + r * dst_ld, src + r * src_ld, dst_code, cols, first, stride);
}

// Element ranges of one array, for cast_ranges_from_16_kernel (by value: at most kMax a launch):
// src's [begin, begin + n) to dst's [at, at + n).
struct CastRanges {
  static constexpr int kMax = 16;
  int count = 0;
  std::int64_t begin[kMax] = {};
  std::int64_t n[kMax] = {};
  std::int64_t at[kMax] = {};
};

// dst[a, a + n) = src[b, b + n) (16-bit `code`) widened, exactly, for each range (b, n, a) of `r`:
// range blockIdx.y, threads over its elements (4 at a time where aligned, as cast_kernel).
__global__ void cast_ranges_from_16_kernel(float* dst, const std::uint16_t* src, int code,
                                           CastRanges r) {
  const int i = static_cast<int>(blockIdx.y);
  if (i >= r.count) return;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  convert_run(dst + r.at[i], src + r.begin[i], code, r.n[i], first, stride);
}

// The converse: dst (rows x cols of fp32, leading dimension dst_ld) = src (16-bit `src_code`,
// leading dimension src_ld), exactly; with a companion (`also`, leading dimension dst_ld) the
// values rounded to its type too. A null dst with a companion writes the companion alone.
__global__ void cast_block_from_16_kernel(float* dst, std::int64_t dst_ld, const std::uint16_t* src,
                                          int src_code, std::int64_t src_ld, std::int64_t rows,
                                          std::int64_t cols, Narrow also) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    if (dst != nullptr)
      convert_run(dst + r * dst_ld, src + r * src_ld, src_code, cols, first, stride);
    if (also.p == nullptr) continue;
    const Narrow row{also.p + r * dst_ld, also.code};
    for (std::int64_t c = first; c < cols; c += stride)
      store_narrow(row, c,
                   convert_element(src[r * src_ld + c], src_code, static_cast<float*>(nullptr)));
  }
}

// The grid of the block casts: threads over columns, 4 to a thread, at most 64 blocks of them;
// blocks over rows.
dim3 cast_block_grid(std::int64_t rows, std::int64_t cols) {
  const std::int64_t per_block = 4 * kElementwiseThreads;
  const std::int64_t x_blocks = (cols + per_block - 1) / per_block;
  return dim3(static_cast<unsigned>(x_blocks < 64 ? (x_blocks > 0 ? x_blocks : 1) : 64),
              static_cast<unsigned>(rows < 65535 ? (rows > 0 ? rows : 1) : 65535));
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
auto run_gelu_forward(const L& launch, float* out, const float* x, std::int64_t n,
                      Narrow narrow = {}) {
  return launch(gelu_forward_kernel, elementwise_grid((n + 3) / 4), dim3(kElementwiseThreads), 0,
                out, x, n, narrow);
}

template <typename L>
auto run_gelu_backward(const L& launch, float* dx, const float* x, const float* dout,
                       std::int64_t n, Narrow narrow = {}) {
  return launch(gelu_backward_kernel, elementwise_grid((n + 3) / 4), dim3(kElementwiseThreads), 0,
                dx, x, dout, n, narrow);
}

// Whether a 16-bit GELU call's result has somewhere to go (its fp32 array, its companion or both).
inline bool gelu_16_valid(const float* out, Narrow narrow) {
  return out != nullptr || narrow.p != nullptr;
}

template <typename L>
auto run_gelu_forward_16(const L& launch, float* out, const std::uint16_t* x, int code,
                         std::int64_t n, Narrow narrow = {}) {
  return launch(gelu_forward_16_kernel, elementwise_grid(n), dim3(kElementwiseThreads), 0, out, x,
                code, n, narrow);
}

template <typename L>
auto run_gelu_backward_16(const L& launch, float* dx, const std::uint16_t* x, int code,
                          const float* dout, std::int64_t n, Narrow narrow = {}) {
  return launch(gelu_backward_16_kernel, elementwise_grid(n), dim3(kElementwiseThreads), 0, dx, x,
                code, dout, n, narrow);
}

template <typename L>
auto run_swiglu_forward(const L& launch, float* out, const float* gate_up, std::int64_t rows,
                        std::int64_t inner, Narrow narrow = {}) {
  return launch(swiglu_forward_kernel, elementwise_grid((rows * inner + 3) / 4),
                dim3(kElementwiseThreads), 0, out, gate_up, rows, inner, narrow);
}

template <typename L>
auto run_swiglu_backward(const L& launch, float* dgate_up, const float* gate_up, const float* dout,
                         std::int64_t rows, std::int64_t inner, Narrow narrow = {}) {
  return launch(swiglu_backward_kernel, elementwise_grid((rows * inner + 3) / 4),
                dim3(kElementwiseThreads), 0, dgate_up, gate_up, dout, rows, inner, narrow);
}

template <typename L>
auto run_swiglu_forward_16(const L& launch, float* out, const std::uint16_t* gate_up, int code,
                           std::int64_t rows, std::int64_t inner, Narrow narrow) {
  return launch(swiglu_forward_16_kernel, elementwise_grid(rows * inner), dim3(kElementwiseThreads),
                0, out, gate_up, code, rows, inner, narrow);
}

// Whether swiglu_backward_16's dout is given once (fp32 or 16 bits, not both, not neither) and its
// result has somewhere to go (dgate_up, its companion, or both).
inline bool swiglu_backward_16_valid(const float* dgate_up, Narrow narrow, const float* dout,
                                     const std::uint16_t* dout16) {
  return (dout == nullptr) != (dout16 == nullptr) && (dgate_up != nullptr || narrow.p != nullptr);
}

template <typename L>
auto run_swiglu_backward_16(const L& launch, float* dgate_up, const std::uint16_t* gate_up,
                            int code, const float* dout, const std::uint16_t* dout16,
                            std::int64_t rows, std::int64_t inner, Narrow narrow) {
  return launch(swiglu_backward_16_kernel, elementwise_grid(rows * inner),
                dim3(kElementwiseThreads), 0, dgate_up, gate_up, code, dout, dout16, rows, inner,
                narrow);
}

template <typename L>
auto run_add(const L& launch, float* out, const float* a, const float* b, std::int64_t n) {
  return launch(add_kernel, elementwise_grid((n + 3) / 4), dim3(kElementwiseThreads), 0, out, a, b,
                n);
}

template <typename L>
auto run_cast_ranges_from_16(const L& launch, float* dst, const void* src, int code,
                             const CastRanges& r) {
  std::int64_t most = 1;
  for (int i = 0; i < r.count; ++i)
    most = r.n[i] > most ? r.n[i] : most;
  const dim3 grid(elementwise_grid((most + 3) / 4).x, static_cast<unsigned>(r.count));
  return launch(cast_ranges_from_16_kernel, grid, dim3(kElementwiseThreads), 0, dst,
                static_cast<const std::uint16_t*>(src), code, r);
}

template <typename L>
auto run_add_rounded(const L& launch, float* acc, const float* g, int code, std::int64_t n,
                     bool assign) {
  return launch(add_rounded_kernel, elementwise_grid((n + 3) / 4), dim3(kElementwiseThreads), 0,
                acc, g, code, n, assign);
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
              const float* sin, float direction, Narrow narrow = {}) {
  const std::int64_t half = (shape.rotary_dim > 0 ? shape.rotary_dim : shape.head_dim) / 2;
  return launch(rope_kernel, elementwise_grid(shape.rows * shape.heads * half),
                dim3(kElementwiseThreads), 0, x, shape, half, cos, sin, direction, narrow);
}

// `rows` rows of fp32 `src` (or of 16-bit `src16`, widened, where set) rotated (RopeRows) and
// rounded into 16-bit `dst`.
template <typename L>
auto run_rope_block_to_16(const L& launch, void* dst, int dst_code, std::int64_t dst_ld,
                          const float* src, std::int64_t src_ld, std::int64_t rows,
                          const RopeRows& rope, Sixteen src16 = {}) {
  return launch(rope_block_to_16_kernel, cast_block_grid(rows, rope.heads * rope.head_dim),
                dim3(kElementwiseThreads), 0, static_cast<std::uint16_t*>(dst), dst_code, dst_ld,
                src, src16, src_ld, rows, rope);
}

// `rows` rows of 16-bit `src` copied (or converted) into 16-bit `dst` (cast_block_16_kernel).
template <typename L>
auto run_cast_block_16(const L& launch, void* dst, int dst_code, std::int64_t dst_ld, Sixteen src,
                       std::int64_t src_ld, std::int64_t rows, std::int64_t cols) {
  return launch(cast_block_16_kernel, cast_block_grid(rows, cols), dim3(kElementwiseThreads), 0,
                static_cast<std::uint16_t*>(dst), dst_code, dst_ld, src, src_ld, rows, cols);
}

// `rows` rows of 16-bit `src` widened, rotated (RopeRows, its direction) into fp32 `dst`, and
// rounded into dst's companion where `also` has one.
template <typename L>
auto run_rope_block_from_16(const L& launch, float* dst, std::int64_t dst_ld, const void* src,
                            int src_code, std::int64_t src_ld, std::int64_t rows,
                            const RopeRows& rope, Narrow also = {}) {
  return launch(rope_block_from_16_kernel, cast_block_grid(rows, rope.heads * rope.head_dim),
                dim3(kElementwiseThreads), 0, dst, dst_ld, static_cast<const std::uint16_t*>(src),
                src_code, src_ld, rows, rope, also);
}

template <typename L>
auto run_cast(const L& launch, void* dst, int dst_code, const void* src, int src_code,
              std::int64_t n) {
  // 4 elements to a thread where both sides are 16-bit and fp32 (cast_kernel).
  const bool grouped = (src_code == kCodeF32) != (dst_code == kCodeF32);
  return launch(cast_kernel, elementwise_grid(grouped ? (n + 3) / 4 : n), dim3(kElementwiseThreads),
                0, dst, dst_code, src, src_code, n);
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
                            int src_code, std::int64_t src_ld, std::int64_t rows, std::int64_t cols,
                            Narrow also = {}) {
  return launch(cast_block_from_16_kernel, cast_block_grid(rows, cols), dim3(kElementwiseThreads),
                0, dst, dst_ld, static_cast<const std::uint16_t*>(src), src_code, src_ld, rows,
                cols, also);
}

}  // namespace
}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
