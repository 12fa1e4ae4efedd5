// bf16 and fp16 conversions: round to nearest even, overflow to infinity, NaN stays NaN,
// subnormals; every fp16 value survives a round trip through float.
#include "kernels/cpu/cast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace strata::kernels {
namespace {

TEST(Cast, EveryFp16ValueRoundTripsThroughFloat) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = fp16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_EQ((h & 0x7c00u), 0x7c00u);
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(float_to_fp16(f), h) << "bits " << bits;
  }
}

TEST(Cast, Fp16RoundsToNearestEvenAndOverflows) {
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f)), 1.0f);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), float_to_fp16(1.0f));
  // 1 + 3*2^-11 is halfway between 1+2^-10 and 1+2^-9: ties go to 1 + 2^-9 (even).
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(fp16_to_float(float_to_fp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(65520.0f))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(65519.0f)), 65504.0f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(float_to_fp16(std::ldexp(1.0f, -26))), 0.0f);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(-2.5f)), -2.5f);
}

TEST(Cast, Bf16RoundsToNearestEvenKeepsNaN) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: rounds to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max()))));
}

TEST(Cast, ArraysConvertEveryElement) {
  const std::int64_t n = 100003;
  std::vector<float> src(n);
  for (std::int64_t i = 0; i < n; ++i)
    src[i] = static_cast<float>(i % 977) * 0.37f - 100.0f;
  std::vector<std::uint16_t> half(n);
  std::vector<double> back(n);
  cast_array(half.data(), DType::kBF16, src.data(), DType::kF32, n);
  cast_array(back.data(), DType::kF64, half.data(), DType::kBF16, n);
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(half[i], float_to_bf16(src[i]));
    ASSERT_EQ(back[i], static_cast<double>(bf16_to_float(half[i])));
  }
}

}  // namespace
}  // namespace strata::kernels
