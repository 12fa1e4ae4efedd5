// The scalar fp32 <-> bf16/fp16 conversions: against an independent double-precision oracle, and
// (where the CPU has F16C) bit for bit against the hardware conversion the vector paths use.
#include "kernels/cpu/float16.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "sys/cpu_features.h"

namespace strata::kernels {
namespace {

// Nearest of two candidate encodings (lo, lo + 1 in magnitude) to x, ties to the even encoding:
// the definition of round-to-nearest-even, computed in double from the decoded values.
template <typename Decode>
std::uint16_t oracle_round(double x, std::uint16_t sign, std::uint16_t lo_magnitude,
                           Decode decode) {
  const double a = std::fabs(x);
  const double lo = std::fabs(static_cast<double>(decode(lo_magnitude)));
  double hi = static_cast<double>(decode(static_cast<std::uint16_t>(lo_magnitude + 1)));
  if (std::isinf(hi)) {  // lo is the largest finite value: the next one, were there more exponent
    hi = lo + (lo - static_cast<double>(decode(static_cast<std::uint16_t>(lo_magnitude - 1))));
  }
  std::uint16_t pick = lo_magnitude;
  if (a - lo > hi - a) pick = static_cast<std::uint16_t>(lo_magnitude + 1);
  if (a - lo == hi - a && (lo_magnitude & 1u) != 0)
    pick = static_cast<std::uint16_t>(lo_magnitude + 1);
  return static_cast<std::uint16_t>(sign | pick);
}

// Largest finite-or-infinite magnitude encoding whose value is <= |x| (binary search over the
// monotone positive encodings 0 .. 0x7c00 / 0x7f80).
template <typename Decode>
std::uint16_t floor_encoding(double a, std::uint16_t inf_encoding, Decode decode) {
  std::uint16_t lo = 0;
  std::uint16_t hi = inf_encoding;
  while (lo < hi) {
    const auto mid = static_cast<std::uint16_t>((lo + hi + 1) / 2);
    if (static_cast<double>(decode(mid)) <= a) {
      lo = mid;
    } else {
      hi = static_cast<std::uint16_t>(mid - 1);
    }
  }
  return lo;
}

std::uint16_t oracle_bf16(float f) {
  const double a = std::fabs(static_cast<double>(f));
  const auto sign = static_cast<std::uint16_t>(std::signbit(f) ? 0x8000 : 0);
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7f80);
  const std::uint16_t lo = floor_encoding(a, 0x7f80, bf16_to_float);
  if (lo == 0x7f80) return static_cast<std::uint16_t>(sign | lo);
  return oracle_round(f, sign, lo, bf16_to_float);
}

std::uint16_t oracle_fp16(float f) {
  const double a = std::fabs(static_cast<double>(f));
  const auto sign = static_cast<std::uint16_t>(std::signbit(f) ? 0x8000 : 0);
  if (std::isinf(f)) return static_cast<std::uint16_t>(sign | 0x7c00);
  const std::uint16_t lo = floor_encoding(a, 0x7c00, fp16_to_float);
  if (lo == 0x7c00) return static_cast<std::uint16_t>(sign | lo);
  return oracle_round(f, sign, lo, fp16_to_float);
}

// Floats that exercise every rounding case: a stride through all bit patterns plus the edges.
std::vector<float> sample_floats(std::uint32_t stride) {
  std::vector<float> out;
  for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += stride) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (!std::isnan(f)) out.push_back(f);
  }
  for (float f :
       {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 6.1035156e-05f, 5.9604645e-08f,
        2.9802322e-08f, 2.9802326e-08f, 1.0009766f, 1.0004883f, 3.3895314e38f,
        std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
        std::numeric_limits<float>::min(), std::numeric_limits<float>::infinity()}) {
    out.push_back(f);
    out.push_back(-f);
  }
  return out;
}

TEST(Float16, Bf16RoundsToNearestEvenLikeTheOracle) {
  for (float f : sample_floats(4099)) {
    ASSERT_EQ(float_to_bf16(f), oracle_bf16(f))
        << "f=" << f << " bits=" << std::hex << std::bit_cast<std::uint32_t>(f);
  }
}

TEST(Float16, Fp16RoundsToNearestEvenLikeTheOracle) {
  for (float f : sample_floats(4099)) {
    ASSERT_EQ(float_to_fp16(f), oracle_fp16(f))
        << "f=" << f << " bits=" << std::hex << std::bit_cast<std::uint32_t>(f);
  }
}

TEST(Float16, Bf16TiesGoToEven) {
  // 1 + 2^-8 lies half-way between bf16 1.0 (even) and 1 + 2^-7 (odd): rounds down to 1.0.
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3 * 2^-8 lies half-way between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);
}

TEST(Float16, EveryFp16AndBf16RoundTripsThroughFloat) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    const float f16 = fp16_to_float(x);
    const float b16 = bf16_to_float(x);
    if (std::isnan(f16)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f16)))) << std::hex << h;
    } else {
      EXPECT_EQ(float_to_fp16(f16), x) << std::hex << h;
    }
    if (std::isnan(b16)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(b16)))) << std::hex << h;
    } else {
      EXPECT_EQ(float_to_bf16(b16), x) << std::hex << h;
    }
  }
}

TEST(Float16, NanStaysNanWithItsSign) {
  for (std::uint32_t bits : {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const float f = std::bit_cast<float>(bits);
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << std::hex << bits;
    EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f)))) << std::hex << bits;
    EXPECT_EQ(float_to_bf16(f) >> 15, bits >> 31);
    EXPECT_EQ(float_to_fp16(f) >> 15, bits >> 31);
  }
}

__attribute__((target("avx2,f16c"))) std::uint16_t f16c_encode(float f) {
  const __m128i h = _mm_cvtps_ph(_mm_set1_ps(f), _MM_FROUND_TO_NEAREST_INT);
  return static_cast<std::uint16_t>(_mm_extract_epi16(h, 0));
}

__attribute__((target("avx2,f16c"))) float f16c_decode(std::uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(h))));
}

TEST(Float16, Fp16MatchesF16cBitForBitIncludingNan) {
  if (!sys::cpu_features().f16c) GTEST_SKIP() << "this CPU has no F16C to compare with";
  for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 997) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    ASSERT_EQ(float_to_fp16(f), f16c_encode(f)) << std::hex << bits;
  }
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(fp16_to_float(x)),
              std::bit_cast<std::uint32_t>(f16c_decode(x)))
        << std::hex << h;
  }
}

}  // namespace
}  // namespace strata::kernels
