// Device helpers shared by the kernels of kernels/cuda: 16-bit float conversions bit-exact with
// the CPU's (kernels/cpu/float16.h: round to nearest even, no flush to zero, the same NaN
// payloads), warp and block reductions, grid-stride loops, and the launcher.
//
// The kernels live in *_kernels.cuh, each with a launch function generic over a "launcher" that
// computes nothing itself: on the GPU it is CudaLauncher below (kernel<<<...>>> on a stream);
// the tests run the very same kernel source on the CPU through a SIMT emulator
// (tests/support/simt_emulator.h, which defines STRATA_SIMT_EMULATION and CUDA's built-ins).
#pragma once

#if !defined(STRATA_SIMT_EMULATION)
#include <cuda_runtime.h>
// The block's dynamic shared memory as an array of `type`.
#define STRATA_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
// Unroll the next loop completely (register arrays indexed by its variable stay in registers).
#define STRATA_UNROLL _Pragma("unroll")
#else
#define STRATA_UNROLL
#endif

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/dtype_codes.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

#if !defined(STRATA_SIMT_EMULATION)
// Launches a kernel on a stream; raises the kernel's dynamic shared-memory limit first when it
// asks for more than the default 48 KiB. Returns the launch's error.
struct CudaLauncher {
  cudaStream_t stream;
  template <typename Kernel, typename... Args>
  cudaError_t operator()(Kernel kernel, dim3 grid, dim3 block, std::size_t smem,
                         Args... args) const {
    if (smem > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
    }
    kernel<<<grid, block, smem, stream>>>(args...);
    return cudaGetLastError();
  }
};
#endif

// Whether a launcher's result means success (cudaSuccess and the emulator's 0 are both zero).
template <typename E>
bool launched(E result) {
  return result == E{};
}

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}

__device__ __forceinline__ std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((x | 0x00400000u) >> 16);
  }
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
}

__device__ __forceinline__ float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {
    const std::uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return __uint_as_float(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return __uint_as_float(sign);
    // Subnormal: shift the leading one up to bit 10 (bit position from the count of leading
    // zeros of the 32-bit word: the mantissa's top bit is at 31 - clz).
    const int shift = 10 - (31 - __clz(static_cast<int>(mantissa)));
    mantissa <<= shift;
    const std::uint32_t f_exponent = static_cast<std::uint32_t>(127 - 15 + 1 - shift);
    return __uint_as_float(sign | (f_exponent << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return __uint_as_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

__device__ __forceinline__ std::uint16_t float_to_fp16_bits(float f) {
  const std::uint32_t x = __float_as_uint(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  const std::uint32_t exponent = ax >> 23;
  if (exponent >= 113) {
    const std::uint32_t rebased = ax - (112u << 23);
    const std::uint32_t lsb = (rebased >> 13) & 1u;
    return static_cast<std::uint16_t>(sign | ((rebased + 0xfffu + lsb) >> 13));
  }
  const std::uint32_t shift = 126 - exponent;
  if (exponent == 0 || shift > 24) return sign;
  const std::uint32_t m24 = (ax & 0x7fffffu) | 0x800000u;
  std::uint32_t r = m24 >> shift;
  const std::uint32_t rest = m24 & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (r & 1u) != 0)) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

// f rounded to nearest even to the 16-bit `code` (kCodeBF16, else fp16).
__device__ __forceinline__ std::uint16_t float_to_16_bits(float f, int code) {
  return code == kCodeBF16 ? float_to_bf16_bits(f) : float_to_fp16_bits(f);
}

// The 16-bit `code` value h (kCodeBF16, else fp16) widened to float (exact).
__device__ __forceinline__ float float_from_16_bits(std::uint16_t h, int code) {
  return code == kCodeBF16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
}

// f rounded to nearest even to the 16-bit `code` and widened back to float (exact).
__device__ __forceinline__ float round_through_16(float f, int code) {
  return float_from_16_bits(float_to_16_bits(f, code), code);
}

// Element i of an array of `code`, widened to float (exact).
__device__ __forceinline__ float load_as_float(const void* p, int code, std::int64_t i) {
  if (code == kCodeF32) return static_cast<const float*>(p)[i];
  return float_from_16_bits(static_cast<const std::uint16_t*>(p)[i], code);
}

// GELU (the tanh form) and its derivative, in fp32: the elementwise kernels' and the fallback
// GEMM's epilogue's.
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float gelu_value(float v) {
  return 0.5f * v * (1.0f + tanhf(kGeluK * (v + kGeluC * v * v * v)));
}

__device__ __forceinline__ float gelu_grad(float v) {
  const float th = tanhf(kGeluK * (v + kGeluC * v * v * v));
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
}

// Stores v into element i of an array of `code`, rounding to nearest even.
__device__ __forceinline__ void store_from_float(void* p, int code, std::int64_t i, float v) {
  if (code == kCodeF32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<std::uint16_t*>(p)[i] = float_to_16_bits(v, code);
  }
}

// Element i of a kernel's companion output (Narrow), when it has one: v rounded to nearest even.
__device__ __forceinline__ void store_narrow(const Narrow& narrow, std::int64_t i, float v) {
  if (narrow.p == nullptr) return;
  narrow.p[i] = float_to_16_bits(v, narrow.code);
}

constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over the block in a fixed tree (warp sums, then warp 0 adds the warp totals in order); every
// thread gets the total. `shared` holds at least 32 values; blockDim.x is a multiple of 32.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T total = lane < warps ? shared[lane] : T(0);
    total = warp_sum(total);
    if (lane == 0) shared[0] = total;
  }
  __syncthreads();
  return shared[0];
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float m = lane < warps ? shared[lane] : -INFINITY;
    m = warp_max(m);
    if (lane == 0) shared[0] = m;
  }
  __syncthreads();
  return shared[0];
}

__device__ __forceinline__ std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ std::int64_t grid_threads() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
