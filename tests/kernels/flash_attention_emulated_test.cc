// The tensor-core flash attention's forward pass (kernels/cuda/flash_attention_kernels.cuh) run by
// the SIMT emulator (tests/support/simt_emulator.h: mma, ldmatrix and cp.async with the PTX ISA's
// layouts) against the CPU attention (kernels/cpu/attention.cc, in double, on the same 16-bit
// inputs widened exactly): causal with H == KV, grouped KV heads, sequence lengths that are not
// multiples of the 64-row tiles, head sizes 64, 80, 96, 128 and 256, bf16 and fp16, sliding windows
// and packed documents; and a mutated kernel (a wrong P fragment register) that must fail.
//
// Error bounds (u = the 16-bit type's unit roundoff: 2^-8 for bf16, 2^-11 for fp16):
//  - out: |O - ref| <= (2u + 2 ds + 2^-16) * max|V|, c = 2 from the two 16-bit roundings:
//    * P is rounded to 16 bits before the P V mma while the row sum takes P in fp32, so
//      O = sum_j p_j (1 + e_j) v_j / sum_j p_j with |e_j| <= u: off by at most u max|V|;
//    * O (a convex combination, |O| <= max|V|) is rounded to 16 bits: at most u max|V| more.
//    ds bounds the fp32 error of one scaled score (below); a score off by ds moves each weight by
//    a factor within exp(+-2 ds), hence 2 ds. 2^-16 covers the rest of the fp32 arithmetic (sums of
//    at most 130 terms, exp2, the rescaling: a few 2^-24 each) and, for fp16, P values below the
//    normal range (absolute error <= 2^-25 each, at most T of them: 130 * 2^-25 < 2^-17).
//  - lse: no 16-bit rounding enters it. |lse - ref| <= ds + (T + 16) 2^-24 (1 + |ref|): the score
//    error, plus the fp32 sum of at most T exponentials and a few ulps of exp2, log and the
//    base-2 scaling.
//  - ds = (D + 2) 2^-24 * scale * max over (query, key) of sum_d |q_d k_d|: the fp32 dot product of
//    D exact products (each product of two 16-bit values is exact in fp32) and the scaling.
// The largest errors seen are printed with their bounds.
// What this cannot tell: the GPU's own bits (the emulator's mma adds in a fixed order), speed, or
// races the emulator's barrier checks miss (see simt_emulator.h).
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/flash_attention_kernels.cuh"
//
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/nn_ops.h"
#include "kernels/flash_attention_test_support.h"

namespace strata::cuda_kernels {
namespace {

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer does not follow the emulator's fiber stacks (ucontext) reliably.
TEST(EmulatedFlashAttention, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

const simt::Launcher kEmulator;

using kernels::testing::case_name;
using kernels::testing::FlashCase;
using kernels::testing::forward_bounds;
using kernels::testing::ForwardBounds;
using kernels::testing::from_bits;
using kernels::testing::packed_positions;
using kernels::testing::QkvInputs;
using kernels::testing::random_qkv;
using kernels::testing::shape_of;

// The result of one comparison: elements over their bound, and the largest error relative to its
// bound (with the error itself).
struct Comparison {
  int out_failures = 0;
  int lse_failures = 0;
  double out_worst = 0.0, out_worst_bound = 0.0;
  double lse_worst = 0.0, lse_worst_bound = 0.0;
};

// Runs the kernel (with `kFault`) on seeded inputs for case `c` and compares it with the CPU.
template <FlashFault kFault = FlashFault::kNone>
Comparison run_case(const FlashCase& c) {
  kernels::AttentionShape s = shape_of(c);
  const std::int64_t rows = c.batch * c.seq_len;
  const std::vector<std::int32_t> positions = packed_positions(c);
  if (c.packed) s.positions = positions.data();
  EXPECT_TRUE(flash_attention_supported(s));

  // Q in [-4, 4), K and V in [-1, 1) (random_qkv_row), rounded to the 16-bit type; the CPU gets
  // the same values widened.
  const std::int64_t hd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(c.seq_len * 131 + c.head_dim));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const QkvInputs in = random_qkv(c, s, [&] { return unit(rng); });
  const std::uint16_t* q = in.bits.data();
  std::vector<std::uint16_t> out(static_cast<std::size_t>(rows * s.out_stride), 0);
  std::vector<float> lse(static_cast<std::size_t>(c.batch * c.heads * c.seq_len), std::nanf(""));
  const int rc = c.bf16 ? run_flash_attention_forward<FlashBf16, kFault>(
                              kEmulator, out.data(), lse.data(), q, q + hd, q + hd + kvd, s)
                        : run_flash_attention_forward<FlashFp16, kFault>(
                              kEmulator, out.data(), lse.data(), q, q + hd, q + hd + kvd, s);
  EXPECT_EQ(rc, 0);

  std::vector<double> want(out.size(), 0.0), want_lse(lse.size(), 0.0);
  const double* qw = in.wide.data();
  kernels::attention_forward<double>(want.data(), want_lse.data(), qw, qw + hd, qw + hd + kvd, s);

  // The bounds over every key up to the query's (masked ones too: a looser ds).
  const ForwardBounds bounds = forward_bounds(c, s, qw, in.v_max, /*all_earlier_keys=*/true);
  const double out_bound = bounds.out;

  Comparison cmp;
  for (std::int64_t r = 0; r < rows; ++r) {
    // The row's padding stays unwritten.
    for (std::int64_t j = hd; j < s.out_stride; ++j)
      if (out[static_cast<std::size_t>(r * s.out_stride + j)] != 0) ++cmp.out_failures;
    for (std::int64_t j = 0; j < hd; ++j) {
      const auto at = static_cast<std::size_t>(r * s.out_stride + j);
      const double got = from_bits(out[at], c.bf16);
      const double error = std::abs(got - want[at]);
      if (!(error <= out_bound)) {
        ++cmp.out_failures;
      } else if (error > cmp.out_worst) {
        cmp.out_worst = error;
      }
    }
  }
  cmp.out_worst_bound = out_bound;
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const double bound = bounds.lse(want_lse[i]);
    const double error = std::abs(static_cast<double>(lse[i]) - want_lse[i]);
    if (!(error <= bound)) {
      ++cmp.lse_failures;
    } else if (cmp.lse_worst_bound == 0.0 || error / bound > cmp.lse_worst / cmp.lse_worst_bound) {
      cmp.lse_worst = error;
      cmp.lse_worst_bound = bound;
    }
  }
  return cmp;
}

class EmulatedFlashAttention : public ::testing::TestWithParam<FlashCase> {};

TEST_P(EmulatedFlashAttention, ForwardMatchesTheCpuWithinTheRoundingBound) {
  const FlashCase& c = GetParam();
  const Comparison cmp = run_case(c);
  EXPECT_EQ(cmp.out_failures, 0) << "out elements over the bound " << cmp.out_worst_bound;
  EXPECT_EQ(cmp.lse_failures, 0) << "lse values over their bound";
  std::printf(
      "[ flash    ] %s: out |err| max %.3g (bound %.3g, %.2f of it); lse |err| %.3g "
      "(bound %.3g)\n",
      case_name(c).c_str(), cmp.out_worst, cmp.out_worst_bound, cmp.out_worst / cmp.out_worst_bound,
      cmp.lse_worst, cmp.lse_worst_bound);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmulatedFlashAttention,
    ::testing::Values(
        // causal, H == KV heads
        FlashCase{true, 1, 1, 1, 1, 64, 0, false}, FlashCase{true, 2, 33, 2, 2, 64, 0, false},
        FlashCase{false, 1, 130, 2, 2, 64, 0, false}, FlashCase{true, 1, 33, 2, 2, 128, 0, false},
        FlashCase{false, 1, 1, 1, 1, 128, 0, false},
        // grouped KV heads
        FlashCase{true, 1, 77, 4, 2, 64, 0, false}, FlashCase{true, 1, 130, 4, 1, 64, 0, false},
        FlashCase{false, 1, 77, 4, 2, 64, 0, false}, FlashCase{true, 1, 130, 2, 1, 128, 0, false},
        FlashCase{false, 1, 77, 4, 1, 128, 0, false},
        // the other head sizes
        FlashCase{true, 1, 77, 2, 1, 80, 0, false}, FlashCase{false, 1, 77, 2, 1, 96, 0, false},
        FlashCase{true, 1, 77, 2, 1, 256, 0, false}, FlashCase{false, 1, 33, 2, 2, 256, 0, false},
        // sliding window, packed documents, both
        FlashCase{true, 1, 130, 2, 1, 64, 40, false},
        FlashCase{false, 1, 130, 2, 2, 128, 70, false}, FlashCase{true, 2, 130, 2, 2, 64, 0, true},
        FlashCase{false, 1, 130, 4, 2, 64, 30, true}),
    [](const auto& info) { return case_name(info.param); });

// A wrong fragment index (P's A registers 1 and 2 exchanged: rows groupID + 8 and columns + 8 of
// each 16 x 16 tile of P trade places) must fail the same comparison.
TEST(EmulatedFlashAttention, MutatedFragmentFailsTheComparison) {
  for (const bool bf16 : {true, false}) {
    const FlashCase c{bf16, 1, 77, 2, 1, 64, 0, false};
    const Comparison cmp = run_case<FlashFault::kSwapPRows>(c);
    EXPECT_GT(cmp.out_failures, 0) << case_name(c) << ": the mutated kernel passed";
    std::printf("[ flash    ] mutated %s: %d out elements over the bound\n", case_name(c).c_str(),
                cmp.out_failures);
  }
}

TEST(EmulatedFlashAttention, SupportedShapes) {
  kernels::AttentionShape s;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.q_stride = s.kv_stride = 8 * 64;
  EXPECT_TRUE(flash_attention_supported(s));
  s.head_dim = 256;
  EXPECT_TRUE(flash_attention_supported(s));
  s.head_dim = 72;
  EXPECT_FALSE(flash_attention_supported(s));
  s.head_dim = 128;
  s.q_stride = 8 * 128 + 3;
  EXPECT_FALSE(flash_attention_supported(s));
}

#endif  // __SANITIZE_ADDRESS__

}  // namespace
}  // namespace strata::cuda_kernels
