// Whole-array conversions between fp32, bf16, fp16 and double use the same rounding as the scalar
// conversions (kernels/cpu/float16.h, tested in float16_test.cc) and the gradient accumulation
// adds what a 16-bit gradient holds.
#include "kernels/cpu/cast.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata::kernels {
namespace {

std::vector<float> ramp(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(i % 977) * 0.37f - 100.0f;
  return v;
}

TEST(Cast, ArraysConvertEveryElementWithTheScalarRounding) {
  const std::int64_t n = 100003;  // several parallel chunks and a ragged end
  const std::vector<float> src = ramp(n);
  std::vector<std::uint16_t> bf(n), hf(n);
  std::vector<float> back(n);
  cast_array(bf.data(), DType::kBF16, src.data(), DType::kF32, n);
  cast_array(hf.data(), DType::kF16, src.data(), DType::kF32, n);
  cast_array(back.data(), DType::kF32, hf.data(), DType::kF16, n);
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bf[i], float_to_bf16(src[i]));
    ASSERT_EQ(hf[i], float_to_fp16(src[i]));
    ASSERT_EQ(back[i], fp16_to_float(hf[i]));
  }
}

TEST(Cast, DoublesRoundThroughFloat) {
  const std::vector<double> src = {1.0 + 1e-12, -3.25, 65519.0, 1e-30};
  std::vector<std::uint16_t> hf(4);
  narrow_from_f64(hf.data(), DType::kF16, src.data(), 4);
  std::vector<double> wide(4);
  widen_to_f64(wide.data(), hf.data(), DType::kF16, 4);
  EXPECT_EQ(wide[0], 1.0);
  EXPECT_EQ(wide[1], -3.25);
  EXPECT_EQ(wide[2], 65504.0);
  EXPECT_EQ(wide[3], 0.0);
}

TEST(Cast, AccumulateAssignsThenAdds) {
  const std::int64_t n = 70000;
  const std::vector<float> g = ramp(n);
  std::vector<std::uint16_t> g16(n);
  cast_array(g16.data(), DType::kBF16, g.data(), DType::kF32, n);
  std::vector<float> acc(n, 123.0f);
  accumulate_from(acc.data(), g16.data(), DType::kBF16, n, true);
  accumulate_from(acc.data(), g.data(), DType::kF32, n, false);
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_EQ(acc[i], bf16_to_float(g16[i]) + g[i]);
}

}  // namespace
}  // namespace strata::kernels
