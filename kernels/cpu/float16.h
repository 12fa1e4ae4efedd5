// Scalar conversions between fp32 and the two 16-bit float formats, bit-exact with the vector
// paths of the kernels: bf16 (8-bit exponent, 7-bit mantissa) and IEEE fp16 (5-bit exponent,
// 10-bit mantissa). Narrowing rounds to nearest, ties to even, and never depends on MXCSR (no
// flush-to-zero of subnormals); widening is exact.
//
// NaN: narrowing keeps the sign and the top mantissa bits and sets the quiet bit, as the x86
// F16C instruction vcvtps2ph does; fp16 widening also sets the quiet bit (as vcvtph2ps does);
// bf16 widening is a plain shift (as in the vector paths), so a bf16 NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace strata::kernels {

// bf16 -> fp32, exact.
inline float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

// fp32 -> bf16, round to nearest even; overflow rounds to infinity; NaN stays (quiet) NaN.
inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((x | 0x00400000u) >> 16);
  }
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
}

// fp16 -> fp32, exact (subnormals included); NaN is quieted.
inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // infinity, or NaN: keep the payload, set the quiet bit
    const std::uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: value = mantissa * 2^-24; normalise it into an fp32 normal number.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    const std::uint32_t f_exponent = static_cast<std::uint32_t>(127 - 15 + 1 - shift);
    return std::bit_cast<float>(sign | (f_exponent << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

// fp32 -> fp16, round to nearest even, subnormal results kept; |f| >= 65520 becomes infinity.
inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {  // NaN: quiet it, keep the top 10 mantissa bits
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) {  // 65520 is half-way between 65504 (max) and 2^16: ties to "even" inf
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  const std::uint32_t exponent = ax >> 23;
  if (exponent >= 113) {  // normal fp16: drop 13 mantissa bits with rounding; carries are right
    const std::uint32_t rebased = ax - (112u << 23);
    const std::uint32_t lsb = (rebased >> 13) & 1u;
    return static_cast<std::uint16_t>(sign | ((rebased + 0xfffu + lsb) >> 13));
  }
  // Subnormal fp16 (or zero): result = round(|f| / 2^-24) = round(m24 / 2^(126 - exponent)).
  const std::uint32_t shift = 126 - exponent;
  if (exponent == 0 || shift > 24) return sign;  // below a quarter of the smallest subnormal
  const std::uint32_t m24 = (ax & 0x7fffffu) | 0x800000u;
  std::uint32_t r = m24 >> shift;
  const std::uint32_t rest = m24 & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (r & 1u) != 0)) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

}  // namespace strata::kernels
