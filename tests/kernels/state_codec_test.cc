// The compressed state's codec (kernels/cpu/state_codec.h): sizes, round trips that checkpoints
// rely on (a decoded state encodes back to the same bytes), the 8-bit code's accuracy, the
// stochastic rounding's independence from threads and its lack of bias. The codes themselves are
// the Adam kernel's (adam_state.h), which tests/kernels/adam_state_test.cc checks against the
// reference.
#include "kernels/cpu/state_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/adam_state.h"
#include "kernels/cpu/float16.h"

namespace strata::kernels {
namespace {

std::vector<float> random_values(std::size_t n, std::uint32_t seed, bool non_negative) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-30.0f, 2.0f);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    // Magnitudes over many decades within a block, as Adam's moments have.
    const float x = normal(rng) * std::pow(10.0f, exponent(rng) / 4.0f);
    v[i] = non_negative ? x * x : x;
  }
  return v;
}

TEST(StateCodec, SizesPerFormat) {
  EXPECT_EQ(moment_bytes(MomentFormat::kF32, 4096), 16384u);
  EXPECT_EQ(moment_bytes(MomentFormat::kBF16, 4096), 8192u);
  EXPECT_EQ(moment_bytes(MomentFormat::kQ8, 4096), 4096u);
  EXPECT_EQ(absmax_count(MomentFormat::kQ8, 4096, 64), 64u);
  EXPECT_EQ(absmax_count(MomentFormat::kQ8, 4096, 2048), 2u);
  EXPECT_EQ(absmax_count(MomentFormat::kBF16, 4096, 64), 0u);
  EXPECT_STREQ(to_string(MomentFormat::kQ8), "8bit");
}

TEST(StateCodec, EightBitDecodedStateEncodesBackToTheSameBytes) {
  for (std::size_t block : {64u, 256u, 2048u}) {
    for (Moment which : {Moment::kExpAvg, Moment::kExpAvgSq}) {
      const std::size_t n = 8192;
      std::vector<float> v =
          random_values(n, static_cast<std::uint32_t>(block), which == Moment::kExpAvgSq);
      std::fill(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(block), 0.0f);  // a zero block
      std::vector<std::uint8_t> codes(n), again(n);
      std::vector<float> absmax(n / block), absmax_again(n / block), decoded(n);
      encode_moment(MomentFormat::kQ8, which, v.data(), codes.data(), absmax.data(), block, n);
      EXPECT_EQ(absmax[0], 0.0f);
      decode_moment(MomentFormat::kQ8, which, codes.data(), absmax.data(), block, decoded.data(),
                    n);
      encode_moment(MomentFormat::kQ8, which, decoded.data(), again.data(), absmax_again.data(),
                    block, n);
      EXPECT_EQ(codes, again) << block;
      EXPECT_EQ(0, std::memcmp(absmax.data(), absmax_again.data(), absmax.size() * 4)) << block;
      // The block's largest magnitude is exact; every value is within the code's step.
      for (std::size_t b = 0; b < n / block; ++b) {
        float max = 0.0f;
        for (std::size_t i = b * block; i < (b + 1) * block; ++i)
          max = std::max(max, std::fabs(v[i]));
        EXPECT_EQ(absmax[b], max);
        for (std::size_t i = b * block; i < (b + 1) * block; ++i) {
          // The power-law code: relative step ~ 2/127 of sqrt(|x| / absmax) for exp_avg, ~ 4/255
          // of the fourth root for exp_avg_sq; the absolute error is bounded by the first step.
          const double t = which == Moment::kExpAvg ? std::sqrt(std::fabs(v[i]) / max)
                                                    : std::sqrt(std::sqrt(v[i] / max));
          const double step = which == Moment::kExpAvg ? 1.0 / 127 : 1.0 / 255;
          const double bound =
              max == 0.0f
                  ? 0.0
                  : max * (which == Moment::kExpAvg ? (2 * t + step) * step / 2 * 1.0001
                                                    : (4 * t * t * t + 6 * t * t * step +
                                                       4 * t * step * step + step * step * step) *
                                                              step / 2 * 1.0001 +
                                                          1e-45);
          EXPECT_LE(std::fabs(decoded[i] - v[i]), bound + 1e-30) << i;
        }
      }
    }
  }
}

TEST(StateCodec, Bf16RoundTripsExactly) {
  const std::size_t n = 4096;
  const std::vector<float> v = random_values(n, 5, false);
  std::vector<std::uint16_t> bf(n), again(n);
  std::vector<float> decoded(n);
  encode_moment(MomentFormat::kBF16, Moment::kExpAvg, v.data(), bf.data(), nullptr, 64, n);
  decode_moment(MomentFormat::kBF16, Moment::kExpAvg, bf.data(), nullptr, 64, decoded.data(), n);
  encode_values(DType::kBF16, decoded.data(), again.data(), n);
  EXPECT_EQ(bf, again);
  for (std::size_t i = 0; i < n; ++i)
    EXPECT_EQ(bf[i], float_to_bf16(v[i]));
}

TEST(StateCodec, StochasticRoundingIsUnbiasedAndKeyed) {
  // x lies 1/4 of the way from one bf16 to the next: it rounds up a quarter of the time.
  const float lo = bf16_to_float(0x3f80);  // 1.0
  const float hi = bf16_to_float(0x3f81);
  const float x = lo + (hi - lo) * 0.25f;
  int up = 0;
  const int trials = 1 << 16;
  for (int i = 0; i < trials; ++i)
    up += detail::sr_bf16(x, detail::rounding_bits(detail::lowbias32(rounding_key(7, 3, 1) + 2),
                                                   static_cast<std::size_t>(i))) == 0x3f81;
  EXPECT_NEAR(static_cast<double>(up) / trials, 0.25, 0.01);
  // Exact bf16 values never move; non-finite values stay non-finite.
  EXPECT_EQ(detail::sr_bf16(lo, 0xffffffffu), 0x3f80);
  EXPECT_EQ(detail::sr_bf16(INFINITY, 0xffffffffu), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_float(detail::sr_bf16(NAN, 0xffffffffu))));
  // Different steps, units and tiles get different streams.
  EXPECT_NE(rounding_key(7, 3, 1), rounding_key(7, 4, 1));
  EXPECT_NE(rounding_key(7, 3, 1), rounding_key(7, 3, 2));
  EXPECT_NE(rounding_key(7, 3, 1), rounding_key(8, 3, 1));
  EXPECT_NE(rounding_key(7, 3, 1), rounding_key(7 + (1ull << 32), 3, 1));
}

TEST(StateCodec, Bf16AccumulationIsDeterministicAndSumsTheStoredValues) {
  const std::size_t n = 200000;  // several chunks: the threads' split must not matter
  const std::vector<float> a = random_values(n, 1, false), b = random_values(n, 2, false);
  std::vector<std::uint16_t> acc1(n), acc2(n);
  for (std::vector<std::uint16_t>* acc : {&acc1, &acc2}) {
    accumulate_bf16(acc->data(), a.data(), DType::kF32, n, true, 0, 0, false);
    const double squares =
        accumulate_bf16(acc->data(), b.data(), DType::kF32, n, false, 99, 5, true);
    double expect = 0.0;
    for (std::size_t c = 0; c < n; c += 65536) {
      double part = 0.0;
      for (std::size_t i = c; i < std::min(n, c + 65536); ++i) {
        const double s = bf16_to_float((*acc)[i]);
        part += s * s;
      }
      expect += part;
    }
    EXPECT_EQ(squares, expect);
  }
  EXPECT_EQ(acc1, acc2);
  // Each stored sum is one of the two bf16 neighbours of the exact sum.
  for (std::size_t i = 0; i < n; i += 997) {
    const float exact = bf16_to_float(float_to_bf16(a[i])) + b[i];
    const float got = bf16_to_float(acc1[i]);
    const float down =
        bf16_to_float(static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(exact) >> 16));
    const float up =
        bf16_to_float(static_cast<std::uint16_t>((std::bit_cast<std::uint32_t>(exact) >> 16) + 1));
    EXPECT_TRUE(got == down || got == up || got == exact) << i;
  }
}

}  // namespace
}  // namespace strata::kernels
