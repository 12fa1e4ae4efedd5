// The tensor-core flash attention's backward pass
// (kernels/cuda/flash_attention_backward_kernels.cuh) run by the SIMT emulator against the CPU
// backward (kernels::attention_backward<double>, on the same 16-bit Q, K, V, O, dO widened exactly
// and the same fp32 lse): causal with H == KV, grouped KV heads, sequence lengths that are not
// multiples of the tiles, head sizes 64, 80, 96, 128 and 256, bf16 and fp16, sliding windows and
// packed documents; the bits of two runs compared; and a mutated kernel (a wrong register in the A
// fragments of P and dS) that must fail.
//
// Error bound, per output element, derived here and computed by backward_bounds
// (flash_attention_test_support.h, shared with flash_attention_gputest.cc). u = the 16-bit type's
// unit roundoff, 2^-8 bf16, 2^-11 fp16; e = 2^-24, fp32's; a16 = 2^-25 for fp16, the largest
// error of rounding a value below fp16's normal range, 0 for bf16. For every visible (query t, key
// s) pair of a head, with the exact P, dP = dO_t . V_s, D_t = dO_t . O_t and dS = P (dP - D):
//  - the kernel's fp32 P has a relative error of at most
//      eps = 1.01 ((D + 4) e scale sum_d |q_d k_d| + 4 e |lse_t| + 4 e):
//    the dot product of D exact products (D e), the base-2 scaling and the subtraction of lse
//    (a few e of |scale q.k| and |lse|), exp2f (2 ulp); 1.01 covers exp(x) - 1 > x.
//  - P is rounded to 16 bits before the dV mma: |P16 - P| <= (eps + u + eps u) P + a16 = EP.
//  - fp32 dP and D are off by at most D e sum_d |dO V| and D e sum_d |dO O| (edP, eD); dS in fp32
//    is off by at most (eps + 2e) |dS| + (1 + eps) P (edP + eD); it is rounded to 16 bits before
//    the dK and dQ mmas: EdS = (1 + u) that + u |dS| + a16.
//  - dV_sd = sum_t P16 dO_td, dK_sd = scale sum_t dS16 Q_td, dQ_td = scale sum_s dS16 K_sd: each is
//    off by the sum of its terms' errors (EP |dO_td|, scale EdS |Q_td|, scale EdS |K_sd|), plus
//    the fp32 accumulation, 1.01 n e sum |terms| with n = group * T + 16, plus 2e |result| for the
//    scaling; then rounded to 16 bits. For every element:
//      bound = (1 + u) (sum of term errors + 1.01 n e sum |terms| + 2 e |ref|) + u |ref| + a16
//    (a16: an fp16 result below the normal range).
// So the two 16-bit roundings of P and dS enter as u times the sums of |terms| (not of the results,
// which cancel), and the output's rounding as u |result|. The largest error seen relative to its
// element's bound is printed (0.84 of it at most, when this was written).
// What this cannot tell: the GPU's own bits (the emulator's mma adds in a fixed order), speed, or
// races the emulator's barrier checks miss (see simt_emulator.h).
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/flash_attention_backward_kernels.cuh"
//
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/nn_ops.h"
#include "kernels/flash_attention_test_support.h"

namespace strata::cuda_kernels {
namespace {

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer does not follow the emulator's fiber stacks (ucontext) reliably.
TEST(EmulatedFlashAttentionBackward, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

const simt::Launcher kEmulator;

using kernels::testing::backward_bounds;
using kernels::testing::backward_reference;
using kernels::testing::BackwardComparison;
using kernels::testing::BackwardInputs;
using kernels::testing::case_name;
using kernels::testing::compare_backward;
using kernels::testing::FlashCase;
using kernels::testing::packed_positions;
using kernels::testing::random_backward_inputs;
using kernels::testing::shape_of;

// One run: the kernel's gradients (bits), and the comparison with the CPU (the inputs, reference,
// bounds and comparison of flash_attention_test_support.h).
struct BwdResult : BackwardComparison {
  std::vector<std::uint16_t> grad;  // dq | dk | dv columns, the layout of q | k | v
};

template <FlashFault kFault = FlashFault::kNone>
BwdResult run_case(const FlashCase& c) {
  kernels::AttentionShape s = shape_of(c);
  const std::int64_t T = c.seq_len, D = c.head_dim;
  const std::vector<std::int32_t> positions = packed_positions(c);
  if (c.packed) s.positions = positions.data();
  EXPECT_TRUE(flash_attention_backward_supported(s));

  // Q in [-4, 4) (peaked rows), K, V, dO in [-1, 1), rounded to the 16-bit type; the forward's O
  // (rounded to 16 bits) and lse (fp32), from the CPU in double: both the kernel and the CPU
  // backward take exactly these.
  const std::int64_t hd = c.heads * D, kvd = c.kv_heads * D;
  std::mt19937_64 rng(7000 + static_cast<std::uint64_t>(T * 131 + D + c.heads));
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const BackwardInputs in = random_backward_inputs(c, s, [&] { return unit(rng); });

  std::vector<std::uint16_t> grad(in.qkv_bits.size(), 0);
  std::vector<float> delta(in.lse.size(), std::nanf(""));
  std::uint16_t* g16 = grad.data();
  const std::uint16_t* q = in.qkv_bits.data();
  const int rc =
      c.bf16 ? run_flash_attention_backward<FlashBf16, kFault>(
                   kEmulator, g16, g16 + hd, g16 + hd + kvd, delta.data(), in.dout_bits.data(),
                   in.out_bits.data(), in.lse.data(), q, q + hd, q + hd + kvd, s)
             : run_flash_attention_backward<FlashFp16, kFault>(
                   kEmulator, g16, g16 + hd, g16 + hd + kvd, delta.data(), in.dout_bits.data(),
                   in.out_bits.data(), in.lse.data(), q, q + hd, q + hd + kvd, s);
  EXPECT_EQ(rc, 0);

  const std::vector<double> want = backward_reference(c, s, in);
  BwdResult res;
  static_cast<BackwardComparison&>(res) =
      compare_backward(c, s, grad, want, backward_bounds(c, s, in, want));
  res.grad = std::move(grad);
  return res;
}

class EmulatedFlashAttentionBackward : public ::testing::TestWithParam<FlashCase> {};

TEST_P(EmulatedFlashAttentionBackward, MatchesTheCpuWithinTheRoundingBound) {
  const FlashCase& c = GetParam();
  const BwdResult res = run_case(c);
  const char* names[] = {"dq", "dk", "dv"};
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(res.failures[w], 0) << names[w] << " elements over their bound";
    std::printf("[ flash bwd] %s %s: worst |err| %.3g against its bound %.3g (%.2f of it)\n",
                case_name(c).c_str(), names[w], res.worst_error[w], res.worst_bound[w],
                res.worst_ratio[w]);
  }
  EXPECT_EQ(res.padding_written, 0) << "the rows' padding was written";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmulatedFlashAttentionBackward,
    ::testing::Values(
        // causal, H == KV heads
        FlashCase{true, 1, 1, 1, 1, 64, 0, false}, FlashCase{true, 2, 33, 2, 2, 64, 0, false},
        FlashCase{false, 1, 130, 1, 1, 64, 0, false}, FlashCase{true, 1, 77, 1, 1, 128, 0, false},
        FlashCase{false, 1, 1, 1, 1, 128, 0, false},
        // grouped KV heads (4:2, 4:1)
        FlashCase{true, 1, 77, 4, 2, 64, 0, false}, FlashCase{false, 1, 77, 4, 1, 64, 0, false},
        FlashCase{true, 1, 33, 4, 1, 128, 0, false}, FlashCase{false, 1, 33, 4, 2, 128, 0, false},
        // the other head sizes
        FlashCase{true, 1, 77, 2, 1, 80, 0, false}, FlashCase{false, 1, 77, 2, 1, 96, 0, false},
        FlashCase{true, 1, 77, 1, 1, 256, 0, false}, FlashCase{false, 1, 33, 1, 1, 256, 0, false},
        // sliding window, packed documents, both
        FlashCase{true, 1, 130, 2, 1, 64, 40, false},
        FlashCase{false, 1, 130, 1, 1, 128, 70, false}, FlashCase{true, 1, 130, 2, 2, 64, 0, true},
        FlashCase{false, 1, 130, 2, 1, 64, 30, true}),
    [](const auto& info) { return case_name(info.param); });

// Two runs give the same bits: every output element is reduced by one thread in a fixed order,
// whatever order the emulator runs its fibers in (it alternates the order between barriers).
TEST(EmulatedFlashAttentionBackward, BitsDoNotDependOnTiming) {
  const FlashCase c{false, 1, 77, 2, 1, 64, 30, true};
  const BwdResult first = run_case(c);
  const BwdResult second = run_case(c);
  EXPECT_TRUE(first.grad == second.grad) << case_name(c) << ": the two runs differ";
}

// A wrong fragment index (P's and dS's A registers 1 and 2 exchanged: rows groupID + 8 and
// columns + 8 of each 16 x 16 tile trade places) must fail the comparison, for dq, dk and dv.
TEST(EmulatedFlashAttentionBackward, MutatedFragmentFailsTheComparison) {
  for (const bool bf16 : {true, false}) {
    const FlashCase c{bf16, 1, 77, 2, 1, 64, 0, false};
    const BwdResult res = run_case<FlashFault::kSwapPRows>(c);
    EXPECT_GT(res.failures[0], 0) << case_name(c) << ": the mutated kernel's dq passed";
    EXPECT_GT(res.failures[1], 0) << case_name(c) << ": the mutated kernel's dk passed";
    EXPECT_GT(res.failures[2], 0) << case_name(c) << ": the mutated kernel's dv passed";
    std::printf("[ flash bwd] mutated %s: dq %d, dk %d, dv %d elements over their bounds\n",
                case_name(c).c_str(), res.failures[0], res.failures[1], res.failures[2]);
  }
}

TEST(EmulatedFlashAttentionBackward, SupportedShapes) {
  kernels::AttentionShape s;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.q_stride = s.kv_stride = s.out_stride = 8 * 64;
  EXPECT_TRUE(flash_attention_backward_supported(s));
  s.head_dim = 128;
  EXPECT_TRUE(flash_attention_backward_supported(s));
  s.head_dim = 256;
  EXPECT_TRUE(flash_attention_backward_supported(s));
  s.head_dim = 72;
  EXPECT_FALSE(flash_attention_backward_supported(s));
  s.head_dim = 64;
  s.out_stride = 8 * 64 + 4;
  EXPECT_FALSE(flash_attention_backward_supported(s));
}

#endif  // __SANITIZE_ADDRESS__

}  // namespace
}  // namespace strata::cuda_kernels
