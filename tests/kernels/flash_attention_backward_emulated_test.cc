// The tensor-core flash attention's backward pass
// (kernels/cuda/flash_attention_backward_kernels.cuh) run by the SIMT emulator against the CPU
// backward (kernels::attention_backward<double>, on the same 16-bit Q, K, V, O, dO widened exactly
// and the same fp32 lse): causal with H == KV, grouped KV heads, sequence lengths that are not
// multiples of the tiles, head sizes 64, 80, 96, 128 and 256, bf16 and fp16, sliding windows and
// packed documents; the bits of two runs compared; and a mutated kernel (a wrong register in the A
// fragments of P and dS) that must fail.
//
// Error bound, per output element, derived here (u = the 16-bit type's unit roundoff, 2^-8 bf16,
// 2^-11 fp16; e = 2^-24, fp32's; a16 = 2^-25 for fp16, the largest error of rounding a value
// below fp16's normal range, 0 for bf16). For every visible (query t, key s) pair of a head, with
// the exact P, dP = dO_t . V_s, D_t = dO_t . O_t and dS = P (dP - D):
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

using kernels::testing::case_name;
using kernels::testing::FlashCase;
using kernels::testing::from_bits;
using kernels::testing::packed_positions;
using kernels::testing::random_qkv_row;
using kernels::testing::shape_of;
using kernels::testing::to_bits;

// One run: the kernel's gradients (bits), and the comparison with the CPU.
struct BwdResult {
  std::vector<std::uint16_t> grad;  // dq | dk | dv columns, the layout of q | k | v
  int failures[3] = {0, 0, 0};      // dq, dk, dv elements over their bound
  int padding_written = 0;
  double worst_ratio[3] = {0.0, 0.0, 0.0};  // largest error / bound
  double worst_error[3] = {0.0, 0.0, 0.0};
  double worst_bound[3] = {0.0, 0.0, 0.0};
};

template <FlashFault kFault = FlashFault::kNone>
BwdResult run_case(const FlashCase& c) {
  kernels::AttentionShape s = shape_of(c);
  const std::int64_t rows = c.batch * c.seq_len;
  const std::int64_t T = c.seq_len, D = c.head_dim, group = c.heads / c.kv_heads;
  const std::vector<std::int32_t> positions = packed_positions(c);
  if (c.packed) s.positions = positions.data();
  EXPECT_TRUE(flash_attention_backward_supported(s));

  // Q in [-4, 4) (peaked rows), K, V, dO in [-1, 1), rounded to the 16-bit type.
  const std::int64_t hd = c.heads * D, kvd = c.kv_heads * D;
  std::mt19937_64 rng(7000 + static_cast<std::uint64_t>(T * 131 + D + c.heads));
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::vector<std::uint16_t> qkv(static_cast<std::size_t>(rows * s.q_stride), 0);
  std::vector<double> qkv_w(qkv.size(), 0.0);
  std::vector<std::uint16_t> dout(static_cast<std::size_t>(rows * s.out_stride), 0);
  std::vector<double> dout_w(dout.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>(r * s.q_stride);
    random_qkv_row(c, &qkv[row], &qkv_w[row], [&] { return unit(rng); });
    for (std::int64_t j = 0; j < hd; ++j) {
      const auto at = static_cast<std::size_t>(r * s.out_stride + j);
      dout[at] = to_bits(unit(rng), c.bf16);
      dout_w[at] = from_bits(dout[at], c.bf16);
    }
  }
  // The forward's O (rounded to 16 bits) and lse (fp32), from the CPU in double: both the kernel
  // and the CPU backward take exactly these.
  const double* qw = qkv_w.data();
  std::vector<double> out_w(dout.size(), 0.0), lse_w(static_cast<std::size_t>(c.heads * rows));
  kernels::attention_forward<double>(out_w.data(), lse_w.data(), qw, qw + hd, qw + hd + kvd, s);
  std::vector<std::uint16_t> out(dout.size(), 0);
  std::vector<float> lse(lse_w.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = to_bits(out_w[i], c.bf16);
    out_w[i] = from_bits(out[i], c.bf16);
  }
  for (std::size_t i = 0; i < lse.size(); ++i) {
    lse[i] = static_cast<float>(lse_w[i]);
    lse_w[i] = lse[i];
  }

  BwdResult res;
  res.grad.assign(qkv.size(), 0);
  std::vector<float> delta(lse.size(), std::nanf(""));
  std::uint16_t* g16 = res.grad.data();
  const std::uint16_t* q = qkv.data();
  const int rc = c.bf16 ? run_flash_attention_backward<FlashBf16, kFault>(
                              kEmulator, g16, g16 + hd, g16 + hd + kvd, delta.data(), dout.data(),
                              out.data(), lse.data(), q, q + hd, q + hd + kvd, s)
                        : run_flash_attention_backward<FlashFp16, kFault>(
                              kEmulator, g16, g16 + hd, g16 + hd + kvd, delta.data(), dout.data(),
                              out.data(), lse.data(), q, q + hd, q + hd + kvd, s);
  EXPECT_EQ(rc, 0);

  std::vector<double> want(qkv.size(), 0.0);
  double* ww = want.data();
  kernels::attention_backward<double>(ww, ww + hd, ww + hd + kvd, dout_w.data(), out_w.data(),
                                      lse_w.data(), qw, qw + hd, qw + hd + kvd, s);

  // The bound's sums: err[] = sum of |term errors|, mag[] = sum of |terms|, per element.
  const double u = std::ldexp(1.0, c.bf16 ? -8 : -11);
  const double e = std::ldexp(1.0, -24);
  const double a16 = c.bf16 ? 0.0 : std::ldexp(1.0, -25);
  std::vector<double> err(qkv.size(), 0.0), mag(qkv.size(), 0.0);
  const auto qat = [&](std::int64_t b, std::int64_t t, std::int64_t h) {
    return (b * T + t) * s.q_stride + h * D;
  };
  const auto kat = [&](std::int64_t b, std::int64_t t, std::int64_t g) {
    return (b * T + t) * s.kv_stride + hd + g * D;
  };
  const auto oat = [&](std::int64_t b, std::int64_t t, std::int64_t h) {
    return (b * T + t) * s.out_stride + h * D;
  };
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t t = 0; t < T; ++t) {
        const double* qr = qw + qat(b, t, h);
        const double* dor = dout_w.data() + oat(b, t, h);
        const double* orow = out_w.data() + oat(b, t, h);
        const double lse_t = lse_w[static_cast<std::size_t>((b * c.heads + h) * T + t)];
        double dlt = 0.0, dlt_abs = 0.0;
        for (std::int64_t d = 0; d < D; ++d) {
          dlt += dor[d] * orow[d];
          dlt_abs += std::abs(dor[d] * orow[d]);
        }
        for (std::int64_t key = kernels::attention_first_key(s, b, t); key <= t; ++key) {
          const double* kr = qw + kat(b, key, g);
          const double* vr = kr + kvd;
          double qk = 0.0, qk_abs = 0.0, dp = 0.0, dp_abs = 0.0;
          for (std::int64_t d = 0; d < D; ++d) {
            qk += qr[d] * kr[d];
            qk_abs += std::abs(qr[d] * kr[d]);
            dp += dor[d] * vr[d];
            dp_abs += std::abs(dor[d] * vr[d]);
          }
          const double p = std::exp(s.scale * qk - lse_t);
          const double dsv = p * (dp - dlt);
          const double eps = 1.01 * (static_cast<double>(D + 4) * e * s.scale * qk_abs +
                                     4 * e * std::abs(lse_t) + 4 * e);
          const double ep = (eps + u + eps * u) * p + a16;
          const double eds32 = (eps + 2 * e) * std::abs(dsv) +
                               (1 + eps) * p * static_cast<double>(D) * e * (dp_abs + dlt_abs);
          const double eds = (1 + u) * eds32 + u * std::abs(dsv) + a16;
          for (std::int64_t d = 0; d < D; ++d) {
            const auto iq = static_cast<std::size_t>(qat(b, t, h) + d);
            const auto ik = static_cast<std::size_t>(kat(b, key, g) + d);
            const auto iv = ik + static_cast<std::size_t>(kvd);
            err[iq] += s.scale * eds * std::abs(kr[d]);
            mag[iq] += s.scale * std::abs(dsv * kr[d]);
            err[ik] += s.scale * eds * std::abs(qr[d]);
            mag[ik] += s.scale * std::abs(dsv * qr[d]);
            err[iv] += ep * std::abs(dor[d]);
            mag[iv] += p * std::abs(dor[d]);
          }
        }
      }
    }
  const double n = static_cast<double>(group * T + 16);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < s.q_stride; ++j) {
      const auto at = static_cast<std::size_t>(r * s.q_stride + j);
      if (j >= hd + 2 * kvd) {
        if (res.grad[at] != 0) ++res.padding_written;
        continue;
      }
      const int which = j < hd ? 0 : (j < hd + kvd ? 1 : 2);
      const double bound =
          (1 + u) * (err[at] + 1.01 * n * e * mag[at] + 2 * e * std::abs(want[at])) +
          u * std::abs(want[at]) + a16;
      const double error = std::abs(from_bits(res.grad[at], c.bf16) - want[at]);
      if (!(error <= bound)) {
        ++res.failures[which];
      } else if (bound > 0.0 && error / bound > res.worst_ratio[which]) {
        res.worst_ratio[which] = error / bound;
        res.worst_error[which] = error;
        res.worst_bound[which] = bound;
      }
    }
  }
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
