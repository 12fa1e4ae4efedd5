// Number formats the kernels convert between: fp32 <-> bf16 and fp16 (round to nearest even, NaN
// kept NaN, overflow to infinity), and whole-array casts between the element types a parameter or
// gradient buffer can hold. The scalar functions are the reference every vector path must match
// bit for bit.
#pragma once

#include <bit>
#include <cstdint>

namespace strata::kernels {

// Element types of buffers the kernels read and write.
enum class DType : std::uint8_t { kF32 = 0, kF64, kBF16, kF16, kI32 };

constexpr std::uint64_t dtype_bytes(DType type) {
  switch (type) {
    case DType::kF64:
      return 8;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
  }
  return 0;
}

// "f32", "f64", "bf16", "f16", "i32".
const char* dtype_name(DType type);

inline std::uint16_t float_to_bf16(float value) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float bf16_to_float(std::uint16_t value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value) << 16);
}

inline std::uint16_t float_to_fp16(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // infinity or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (ax < 0x38800000u) {
    // Below 2^-14 the result is subnormal: adding 0.5 lines the half's 2^-24 spacing up with the
    // float mantissa's last bit, so the FPU does the round-to-nearest-even.
    const float shifted = std::bit_cast<float>(ax) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u));
  }
  const std::uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + odd;  // rebias the exponent (127 -> 15) and round to nearest even
  return static_cast<std::uint16_t>(sign | (ax >> 13));
}

inline float fp16_to_float(std::uint16_t value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value & 0x8000u) << 16;
  const std::uint32_t exponent = (value >> 10) & 0x1fu;
  const std::uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;  // 2^-24
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// dst[i] = src[i] converted from `src_type` to `dst_type` (f32, f64, bf16, f16), for n elements.
// Float-to-16-bit rounds to nearest even; f64 sources first round to f32 when the target is 16-bit.
// Runs on oneTBB for large n. Buffers must not overlap.
void cast_array(void* dst, DType dst_type, const void* src, DType src_type, std::int64_t n);

}  // namespace strata::kernels
