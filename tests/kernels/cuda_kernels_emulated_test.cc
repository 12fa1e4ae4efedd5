// The CUDA kernels' own source (kernels/cuda/*_kernels.cuh), run on the CPU by the SIMT emulator
// (tests/support/simt_emulator.h) and compared with the CPU kernels: indexing, masking, tiling,
// block and warp reductions, the embedding backward's ordered compaction, the attention kernels
// for every per-lane variant, the deterministic reductions and the device AdamW. This runs on
// every machine; tests/*/..._gputest.cc run the compiled kernels on a GPU.
// The kernel headers define their kernels file-locally; this file runs only some of them (and
// none under AddressSanitizer, see below).
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/adam_kernels.cuh"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/gemm_fallback_kernels.cuh"
#include "kernels/cuda/loss_kernels.cuh"
#include "kernels/cuda/norm_kernels.cuh"
//
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/adam_internal.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn_ops.h"
#include "support/gpu_support.h"

namespace strata::cuda_kernels {
namespace {

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer does not follow the emulator's fiber stacks (ucontext) reliably.
TEST(EmulatedKernels, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

using testing::expect_all_close;
using testing::expect_bitwise_equal;
using testing::random_floats;
using testing::Tolerance;

constexpr Tolerance kClose{1e-6, 1e-5};
const simt::Launcher kEmulator;

TEST(EmulatedKernels, ElementwiseOpsMatchTheCpu) {
  const std::int64_t rows = 7, c = 300;
  const std::vector<float> x = random_floats(rows * c, 1, -5.0f, 5.0f);
  const std::vector<float> dout = random_floats(rows * c, 2);
  std::vector<float> got(x.size()), want(x.size());
  ASSERT_EQ(run_gelu_forward(kEmulator, got.data(), x.data(), rows * c), 0);
  kernels::gelu_forward(want.data(), x.data(), rows * c);
  expect_all_close("gelu", got, want, kClose);

  std::vector<float> dgot = dout, dwant = dout;
  ASSERT_EQ(run_gelu_backward(kEmulator, dgot.data(), x.data(), dout.data(), rows * c), 0);
  kernels::gelu_backward(dwant.data(), x.data(), dout.data(), rows * c);
  expect_all_close("gelu backward", dgot, dwant, kClose);

  std::vector<float> s_got(rows * c / 2), s_want(rows * c / 2);
  ASSERT_EQ(run_swiglu_forward(kEmulator, s_got.data(), x.data(), rows, c / 2), 0);
  kernels::swiglu_forward(s_want.data(), x.data(), rows, c / 2);
  expect_all_close("swiglu", s_got, s_want, kClose);
  std::vector<float> sg(x.size()), sw(x.size());
  ASSERT_EQ(run_swiglu_backward(kEmulator, sg.data(), x.data(), dout.data(), rows, c / 2), 0);
  kernels::swiglu_backward(sw.data(), x.data(), dout.data(), rows, c / 2);
  expect_all_close("swiglu backward", sg, sw, kClose);

  std::vector<float> a_got = x, a_want = x;
  const std::vector<float> bias = random_floats(c, 3);
  ASSERT_EQ(run_add(kEmulator, a_got.data(), a_got.data(), dout.data(), rows * c), 0);
  ASSERT_EQ(run_add_bias(kEmulator, a_got.data(), bias.data(), rows, c), 0);
  ASSERT_EQ(run_scale(kEmulator, a_got.data(), rows * c, 0.25f), 0);
  kernels::add(a_want.data(), a_want.data(), dout.data(), rows * c);
  kernels::add_bias(a_want.data(), bias.data(), rows, c);
  kernels::scale(a_want.data(), rows * c, 0.25);
  expect_bitwise_equal("add, bias, scale", a_got, a_want);
}

TEST(EmulatedKernels, EmbeddingForwardAndBackwardAreTheCpusBits) {
  // 600 rows over 7 tokens: every token repeats, rows span several 256-row scan rounds, and the
  // 1100 columns span two column blocks of the backward.
  const std::int64_t b = 4, t = 150, c = 1100, vocab = 7;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * i + 3) % vocab);
  const std::vector<float> wte = random_floats(vocab * c, 4), wpe = random_floats(t * c, 5);
  std::vector<float> got(static_cast<std::size_t>(b * t * c)), want(got.size());
  ASSERT_EQ(run_embedding_forward(kEmulator, got.data(), tokens.data(), nullptr, wte.data(),
                                  wpe.data(), b * t, t, c),
            0);
  kernels::embedding_forward(want.data(), tokens.data(), nullptr, wte.data(), wpe.data(), b * t, t,
                             c);
  expect_bitwise_equal("embedding", got, want);

  const std::vector<float> dout = random_floats(got.size(), 6);
  std::vector<float> dwte_got = wte, dwte_want = wte, dwpe_got = wpe, dwpe_want = wpe;
  ASSERT_EQ(run_embedding_backward(kEmulator, dwte_got.data(), dwpe_got.data(), dout.data(),
                                   tokens.data(), nullptr, b * t, t, c, -1),
            0);
  kernels::embedding_backward(dwte_want.data(), dwpe_want.data(), dout.data(), tokens.data(),
                              nullptr, b * t, t, c, -1);
  expect_bitwise_equal("dwte", dwte_got, dwte_want);
  expect_bitwise_equal("dwpe", dwpe_got, dwpe_want);
}

TEST(EmulatedKernels, NormsAndColumnReductionsMatchTheCpu) {
  const std::int64_t n = 50, c = 300;
  const std::vector<float> x = random_floats(n * c, 7, -2.0f, 3.0f), w = random_floats(c, 8);
  const std::vector<float> bias = random_floats(c, 9), dout = random_floats(n * c, 10);
  // A scratch that forces several chunks of rows.
  const cuda::ColumnReducePlan plan = cuda::plan_column_reduce(n, c, 2, 1 << 20);
  ASSERT_GT(plan.chunks, 1);
  std::vector<double> scratch(static_cast<std::size_t>(plan.chunks * 2 * c));

  std::vector<float> out(x.size()), mean(n), rstd(n), out_w(x.size()), mean_w(n), rstd_w(n);
  ASSERT_EQ(run_layernorm_forward(kEmulator, out.data(), mean.data(), rstd.data(), x.data(),
                                  w.data(), bias.data(), n, c, 1e-5),
            0);
  kernels::layernorm_forward(out_w.data(), mean_w.data(), rstd_w.data(), x.data(), w.data(),
                             bias.data(), n, c, 1e-5);
  expect_all_close("layernorm", out, out_w, kClose);
  expect_all_close("rstd", rstd, rstd_w, kClose);
  std::vector<float> dx = dout, dw = w, db = bias, dx_w = dout, dw_w = w, db_w = bias;
  ASSERT_EQ(
      run_layernorm_backward(kEmulator, dx.data(), dw.data(), db.data(), dout.data(), x.data(),
                             w.data(), mean.data(), rstd.data(), n, c, plan, scratch.data()),
      0);
  kernels::layernorm_backward(dx_w.data(), dw_w.data(), db_w.data(), dout.data(), x.data(),
                              w.data(), mean.data(), rstd.data(), n, c);
  expect_all_close("layernorm dx", dx, dx_w, Tolerance{1e-5, 1e-4});
  expect_all_close("layernorm dw", dw, dw_w, Tolerance{1e-5, 1e-4});
  expect_all_close("layernorm db", db, db_w, Tolerance{1e-5, 1e-4});

  ASSERT_EQ(run_rmsnorm_forward(kEmulator, out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-6),
            0);
  kernels::rmsnorm_forward(out_w.data(), rstd_w.data(), x.data(), w.data(), n, c, 1e-6);
  expect_all_close("rmsnorm", out, out_w, kClose);
  dx = dx_w = dout;
  dw = dw_w = w;
  ASSERT_EQ(run_rmsnorm_backward(kEmulator, dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                 rstd.data(), n, c, plan, scratch.data()),
            0);
  kernels::rmsnorm_backward(dx_w.data(), dw_w.data(), dout.data(), x.data(), w.data(), rstd.data(),
                            n, c);
  expect_all_close("rmsnorm dx", dx, dx_w, Tolerance{1e-5, 1e-4});
  expect_all_close("rmsnorm dw", dw, dw_w, Tolerance{1e-5, 1e-4});

  db = db_w = bias;
  ASSERT_EQ(run_bias_backward(kEmulator, db.data(), dout.data(), n, c, plan, scratch.data()), 0);
  kernels::bias_backward(db_w.data(), dout.data(), n, c);
  expect_all_close("bias backward", db, db_w, Tolerance{1e-6, 1e-6});
}

// The norms' backwards and the bias's reading dout in 16 bits (a gradient kept alone, Sixteen)
// give, for both 16-bit types, the bits of the fp32 kernels on dout widened: dx (added to what it
// held, with its companion beside), dw and db over several chunks of rows, in rows of 300 channels
// and 33; a dout given both ways or neither is refused.
TEST(EmulatedKernels, NormBackwardsReadingSixteenBitGradientsGiveTheBitsOfTheFp32Kernels) {
  for (const int code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    for (const std::int64_t c : {300, 33}) {
      const std::int64_t n = 50;
      const std::vector<float> x = random_floats(n * c, 71, -2.0f, 3.0f), w = random_floats(c, 72);
      const std::vector<float> bias = random_floats(c, 73), raw = random_floats(n * c, 74);
      std::vector<std::uint16_t> dout16(raw.size());
      std::vector<float> dout(raw.size());
      kernels::cast_array(dout16.data(), type, raw.data(), kernels::DType::kF32, n * c);
      kernels::cast_array(dout.data(), kernels::DType::kF32, dout16.data(), type, n * c);
      const cuda::ColumnReducePlan plan = cuda::plan_column_reduce(n, c, 2, 1 << 20);
      ASSERT_GT(plan.chunks, 1);
      std::vector<double> scratch(static_cast<std::size_t>(plan.chunks * 2 * c));
      std::vector<float> out(x.size()), mean(n), rstd(n);
      ASSERT_EQ(run_layernorm_forward(kEmulator, out.data(), mean.data(), rstd.data(), x.data(),
                                      w.data(), bias.data(), n, c, 1e-5),
                0);
      const Sixteen sixteen{dout16.data(), code};
      std::vector<float> dx = raw, dw = w, db = bias, dx_w = raw, dw_w = w, db_w = bias;
      std::vector<std::uint16_t> next(x.size()), next_w(x.size());
      ASSERT_EQ(run_layernorm_backward(kEmulator, dx_w.data(), dw_w.data(), db_w.data(),
                                       dout.data(), x.data(), w.data(), mean.data(), rstd.data(), n,
                                       c, plan, scratch.data(), Narrow{next_w.data(), code}),
                0);
      ASSERT_EQ(run_layernorm_backward(kEmulator, dx.data(), dw.data(), db.data(), nullptr,
                                       x.data(), w.data(), mean.data(), rstd.data(), n, c, plan,
                                       scratch.data(), Narrow{next.data(), code}, sixteen),
                0);
      expect_bitwise_equal("layernorm dx, dout in 16 bits", dx, dx_w);
      expect_bitwise_equal("layernorm dx's companion, dout in 16 bits", next, next_w);
      expect_bitwise_equal("layernorm dw, dout in 16 bits", dw, dw_w);
      expect_bitwise_equal("layernorm db, dout in 16 bits", db, db_w);
      dx = dx_w = raw;
      dw = dw_w = w;
      ASSERT_EQ(run_rmsnorm_backward(kEmulator, dx_w.data(), dw_w.data(), dout.data(), x.data(),
                                     w.data(), rstd.data(), n, c, plan, scratch.data()),
                0);
      ASSERT_EQ(run_rmsnorm_backward(kEmulator, dx.data(), dw.data(), nullptr, x.data(), w.data(),
                                     rstd.data(), n, c, plan, scratch.data(), Narrow{}, sixteen),
                0);
      expect_bitwise_equal("rmsnorm dx, dout in 16 bits", dx, dx_w);
      expect_bitwise_equal("rmsnorm dw, dout in 16 bits", dw, dw_w);
      // The bias's column sums (GPT-2's q/k/v gradient kept alone) likewise.
      db = db_w = bias;
      ASSERT_EQ(run_bias_backward(kEmulator, db_w.data(), dout.data(), n, c, plan, scratch.data()),
                0);
      ASSERT_EQ(
          run_bias_backward(kEmulator, db.data(), nullptr, n, c, plan, scratch.data(), sixteen), 0);
      expect_bitwise_equal("bias backward, dout in 16 bits", db, db_w);
      EXPECT_FALSE(norm_backward_dout_valid(nullptr, Sixteen{}));
      EXPECT_FALSE(norm_backward_dout_valid(dout.data(), sixteen));
      EXPECT_TRUE(norm_backward_dout_valid(nullptr, sixteen));
      EXPECT_TRUE(norm_backward_dout_valid(dout.data(), Sixteen{}));
    }
  }
}

// The second pass of the column reductions loads its partials in batches but adds them in chunk
// order, to the bit: partials of far apart magnitudes (where another order gives another sum), for
// one array (a bias) and two (LayerNorm's weight and bias), past whole batches and a rest.
TEST(EmulatedKernels, ColumnReductionsAddTheChunksInChunkOrder) {
  const std::int64_t chunks = 39, c = 300;  // 2 batches of 16 and 7; the last chunk is -2^40
  const std::vector<float> init = random_floats(c, 34);
  const std::vector<float> noise = random_floats(chunks * 2 * c, 35);
  for (int arrays : {1, 2}) {
    std::vector<double> scratch(static_cast<std::size_t>(chunks * arrays * c));
    // Per column: +2^40, a small value, -2^40, a small value, ...: a small value added beside
    // 2^40 keeps 12 bits after the point, one added after it all of them, and the sum (a few
    // units) shows the difference in float.
    for (std::size_t i = 0; i < scratch.size(); ++i) {
      const auto k = static_cast<std::int64_t>(i) / (arrays * c);  // the chunk
      const double big = std::ldexp(1.0, 40);
      scratch[i] = k % 4 == 0 ? big : (k % 4 == 2 ? -big : static_cast<double>(noise[i]));
    }
    std::vector<float> out_a = init, out_b = init;
    ASSERT_EQ(kEmulator(column_finish_kernel, dim3(2), dim3(256), 0, out_a.data(),
                        arrays == 2 ? out_b.data() : nullptr,
                        static_cast<const double*>(scratch.data()), chunks, c, arrays),
              0);
    for (int which = 0; which < arrays; ++which) {
      std::vector<float> want = init;
      for (std::int64_t col = 0; col < c; ++col) {
        double sum = 0.0;
        for (std::int64_t k = 0; k < chunks; ++k)
          sum += scratch[static_cast<std::size_t>((k * arrays + which) * c + col)];
        want[static_cast<std::size_t>(col)] += static_cast<float>(sum);
      }
      expect_bitwise_equal(which == 0 ? "first array" : "second array", which == 0 ? out_a : out_b,
                           want);
    }
  }
}

TEST(EmulatedKernels, RotaryEmbeddingOnStridedHeads) {
  const std::int64_t t = 9, rows = 2 * t, heads = 3, d = 16, stride = heads * d + 7;
  std::vector<float> cos(static_cast<std::size_t>(t * d / 2)), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), t, d, 10000.0);
  std::vector<float> got = random_floats(rows * stride, 11), want = got;
  const kernels::RopeShape shape{rows, stride, t, heads, d, d, nullptr};
  ASSERT_EQ(run_rope(kEmulator, got.data(), shape, cos.data(), sin.data(), 1.0f), 0);
  kernels::rope_forward(want.data(), shape, cos.data(), sin.data());
  expect_all_close("rope", got, want, kClose);
  ASSERT_EQ(run_rope(kEmulator, got.data(), shape, cos.data(), sin.data(), -1.0f), 0);
  kernels::rope_backward(want.data(), shape, cos.data(), sin.data());
  expect_all_close("rope backward", got, want, kClose);
}

struct AttentionCase {
  std::int64_t batch, seq_len, heads, kv_heads, head_dim;
};

void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << "B" << c.batch << " T" << c.seq_len << " H" << c.heads << " KV" << c.kv_heads << " D"
      << c.head_dim;
}

class EmulatedAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(EmulatedAttention, ForwardAndBackwardMatchTheCpu) {
  const AttentionCase& p = GetParam();
  kernels::AttentionShape a;
  a.batch = p.batch;
  a.seq_len = p.seq_len;
  a.heads = p.heads;
  a.kv_heads = p.kv_heads;
  a.head_dim = p.head_dim;
  a.q_stride = a.kv_stride = (p.heads + 2 * p.kv_heads) * p.head_dim + 3;
  a.out_stride = p.heads * p.head_dim + 1;
  a.scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  const cuda::AttentionLaunch launch = cuda::plan_attention(p.head_dim);
  ASSERT_GT(launch.per_lane, 0);
  const std::int64_t rows = p.batch * p.seq_len;
  const std::int64_t hd = p.heads * p.head_dim, kvd = p.kv_heads * p.head_dim;
  const std::vector<float> qkv = random_floats(rows * a.q_stride, 12, -2.0f, 2.0f);
  const float* q = qkv.data();
  std::vector<float> out(static_cast<std::size_t>(rows * a.out_stride), 0.0f), out_w = out;
  std::vector<float> lse(static_cast<std::size_t>(p.batch * p.heads * p.seq_len)), lse_w = lse;
  ASSERT_EQ(
      run_attention_forward(kEmulator, out.data(), lse.data(), q, q + hd, q + hd + kvd, a, launch),
      0);
  kernels::attention_forward(out_w.data(), lse_w.data(), q, q + hd, q + hd + kvd, a);
  expect_all_close("out", out, out_w, Tolerance{1e-5, 1e-4});
  expect_all_close("lse", lse, lse_w, Tolerance{1e-5, 1e-4});

  const std::vector<float> dout = random_floats(out.size(), 13);
  std::vector<float> d(qkv.size(), 0.0f), d_w(qkv.size(), 0.0f);
  ASSERT_EQ(
      run_attention_backward(kEmulator, d.data(), d.data() + hd, d.data() + hd + kvd, dout.data(),
                             out_w.data(), lse_w.data(), q, q + hd, q + hd + kvd, a, launch),
      0);
  kernels::attention_backward(d_w.data(), d_w.data() + hd, d_w.data() + hd + kvd, dout.data(),
                              out_w.data(), lse_w.data(), q, q + hd, q + hd + kvd, a);
  expect_all_close("dq|dk|dv", d, d_w, Tolerance{1e-5, 2e-4});
}

INSTANTIATE_TEST_SUITE_P(PerLane, EmulatedAttention,
                         ::testing::Values(AttentionCase{2, 70, 2, 1, 8},    // per lane 1, 2 blocks
                                           AttentionCase{1, 40, 4, 2, 40},   // per lane 2, GQA
                                           AttentionCase{1, 21, 2, 2, 72},   // per lane 4
                                           AttentionCase{1, 11, 2, 1, 130},  // per lane 8
                                           AttentionCase{1, 1, 1, 1, 32}),   // one position
                         [](const auto& info) {
                           const AttentionCase& c = info.param;
                           return "T" + std::to_string(c.seq_len) + "D" +
                                  std::to_string(c.head_dim) + "H" + std::to_string(c.heads) +
                                  "KV" + std::to_string(c.kv_heads);
                         });

TEST(EmulatedKernels, CrossEntropyMatchesTheCpu) {
  const std::int64_t rows = 3, vocab = 1000;
  std::vector<std::int32_t> targets = {5, 999, 0};
  std::vector<float> logits = random_floats(rows * vocab, 14, -6.0f, 6.0f), want = logits;
  std::vector<float> losses(rows), losses_w(rows);
  ASSERT_EQ(run_cross_entropy(kEmulator, false, logits.data(), losses.data(), targets.data(), rows,
                              vocab, 0.0f),
            0);
  kernels::cross_entropy_forward(losses_w.data(), want.data(), targets.data(), rows, vocab);
  expect_all_close("losses", losses, losses_w, kClose);
  ASSERT_EQ(run_cross_entropy(kEmulator, true, logits.data(), losses.data(), targets.data(), rows,
                              vocab, 0.5f),
            0);
  kernels::cross_entropy_fused(want.data(), losses_w.data(), targets.data(), rows, vocab, 0.5);
  expect_all_close("fused losses", losses, losses_w, kClose);
  expect_all_close("gradient", logits, want, Tolerance{1e-7, 2e-5});
}

TEST(EmulatedKernels, ReductionsAccumulateInDoubleAndCountNonFinite) {
  std::vector<float> x = random_floats(5000, 15);
  std::vector<double> partials(2 * cuda::kReduceBlocks), result(2, -1.0);
  ASSERT_EQ(run_reduce_stats(kEmulator, x.data(), kCodeF32, 5000, true, partials.data(),
                             result.data(), false),
            0);
  EXPECT_NEAR(result[0], kernels::sum_squares(x.data(), 5000), 1e-9);
  EXPECT_EQ(result[1], 0.0);
  x[17] = std::numeric_limits<float>::infinity();
  ASSERT_EQ(run_reduce_stats(kEmulator, x.data(), kCodeF32, 5000, false, partials.data(),
                             result.data(), true),
            0);
  EXPECT_TRUE(std::isinf(result[0]));
  EXPECT_EQ(result[1], 1.0);
}

TEST(EmulatedKernels, CastsAreTheCpusBits) {
  std::vector<float> values = random_floats(3000, 16, -70000.0f, 70000.0f);
  values[0] = std::numeric_limits<float>::quiet_NaN();
  values[1] = 1e-40f;
  values[2] = 65520.0f;
  for (DTypeCode code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    std::vector<std::uint16_t> got(values.size()), want(values.size());
    ASSERT_EQ(run_cast(kEmulator, got.data(), code, values.data(), kCodeF32, 3000), 0);
    kernels::cast_array(want.data(), type, values.data(), kernels::DType::kF32, 3000);
    expect_bitwise_equal("narrow", got, want);
    std::vector<float> wide(values.size()), wide_w(values.size());
    ASSERT_EQ(run_cast(kEmulator, wide.data(), kCodeF32, got.data(), code, 3000), 0);
    kernels::cast_array(wide_w.data(), kernels::DType::kF32, want.data(), type, 3000);
    expect_bitwise_equal("widen", wide, wide_w);
    // A GEMM operand block: 5 rows of 7 from a matrix with leading dimension 11, into ld 8.
    std::vector<std::uint16_t> block(5 * 8, 0);
    ASSERT_EQ(run_cast_block_to_16(kEmulator, block.data(), code, 8, values.data() + 3, 11, 5, 7),
              0);
    for (int r = 0; r < 5; ++r) {
      for (int col = 0; col < 7; ++col)
        EXPECT_EQ(block[static_cast<std::size_t>(r * 8 + col)],
                  want[static_cast<std::size_t>(3 + r * 11 + col)]);
    }
  }
}

// A gradient kept on the device in the arithmetic of one leaving it in 16 bits: add_rounded gives
// the bits of cast to 16 bits, cast back, then copy (assign) or add, in one kernel; 4 at a time
// where both arrays are 16-byte aligned, one at a time from one float off; NaN, infinities,
// values past fp16's range, subnormals and -0 among them.
TEST(EmulatedKernels, AddRoundedIsTheRoundTripsBits) {
  const std::int64_t n = 1003;  // a rest of 3 past the groups of 4
  std::vector<float> g = random_floats(n + 1, 71, -70000.0f, 70000.0f);
  g[0] = std::numeric_limits<float>::quiet_NaN();
  g[1] = -0.0f;
  g[2] = std::numeric_limits<float>::infinity();
  g[3] = 65520.0f;
  g[4] = 1e-40f;
  g[5] = -3.0e-8f;
  const std::vector<float> acc0 = random_floats(n + 1, 72, -3.0f, 3.0f);
  for (DTypeCode code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    for (const bool assign : {true, false}) {
      for (const std::int64_t off : {0, 1}) {
        SCOPED_TRACE(::testing::Message()
                     << "code " << code << (assign ? " assign" : " add") << " offset " << off);
        std::vector<std::uint16_t> narrow(static_cast<std::size_t>(n));
        std::vector<float> wide(static_cast<std::size_t>(n));
        kernels::cast_array(narrow.data(), type, g.data() + off, kernels::DType::kF32, n);
        kernels::cast_array(wide.data(), kernels::DType::kF32, narrow.data(), type, n);
        std::vector<float> want = acc0, got = acc0;
        for (std::int64_t i = 0; i < n; ++i) {
          const auto at = static_cast<std::size_t>(off + i);
          want[at] = assign ? wide[static_cast<std::size_t>(i)]
                            : want[at] + wide[static_cast<std::size_t>(i)];
        }
        ASSERT_EQ(run_add_rounded(kEmulator, got.data() + off, g.data() + off, code, n, assign), 0);
        expect_bitwise_equal("add_rounded", got, want);
      }
    }
  }
}

// The casts move 4 elements at a time where the fp32 side is 16-byte and the 16-bit side 8-byte
// aligned at the same index, one at a time elsewhere: every alignment of either side, lengths
// around the group size, and leading dimensions that change the alignment row by row give the
// CPU's bits, and nothing outside the run is written.
TEST(EmulatedKernels, CastsInGroupsOfFourGiveEveryElementTheCpusBits) {
  const std::vector<float> values = random_floats(4200, 21, -300.0f, 300.0f);
  constexpr std::uint16_t kUntouched16 = 0xabcd;
  const float untouched32 = -1234.5f;
  for (DTypeCode code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    std::vector<std::uint16_t> narrow_all(values.size());
    kernels::cast_array(narrow_all.data(), type, values.data(), kernels::DType::kF32,
                        static_cast<std::int64_t>(values.size()));
    for (std::int64_t n : {1, 3, 4, 5, 8, 13, 1029}) {
      for (int wide_off = 0; wide_off < 4; ++wide_off) {
        for (int narrow_off = 0; narrow_off < 4; ++narrow_off) {
          SCOPED_TRACE(::testing::Message() << "n " << n << " fp32 offset " << wide_off
                                            << " 16-bit offset " << narrow_off);
          std::vector<std::uint16_t> got(static_cast<std::size_t>(n + 8), kUntouched16);
          ASSERT_EQ(run_cast(kEmulator, got.data() + narrow_off, code, values.data() + wide_off,
                             kCodeF32, n),
                    0);
          std::vector<float> wide(static_cast<std::size_t>(n + 8), untouched32);
          ASSERT_EQ(run_cast(kEmulator, wide.data() + wide_off, kCodeF32,
                             narrow_all.data() + narrow_off, code, n),
                    0);
          for (std::int64_t i = 0; i < n + 8; ++i) {
            const auto at = static_cast<std::size_t>(i);
            const bool inside16 = i >= narrow_off && i < narrow_off + n;
            EXPECT_EQ(got[at], inside16 ? narrow_all[at - narrow_off + wide_off] : kUntouched16)
                << "narrow " << i;
            const bool inside32 = i >= wide_off && i < wide_off + n;
            float want = untouched32;
            if (inside32) {
              kernels::cast_array(&want, kernels::DType::kF32,
                                  &narrow_all[at - wide_off + narrow_off], type, 1);
            }
            EXPECT_EQ(std::bit_cast<std::uint32_t>(wide[at]), std::bit_cast<std::uint32_t>(want))
                << "widen " << i;
          }
        }
      }
    }
    // Blocks: 6 rows of 37 from leading dimension 41 (odd: each row starts at another alignment)
    // into leading dimension 39, and back.
    const std::int64_t rows = 6, cols = 37, src_ld = 41, dst_ld = 39;
    for (int off = 0; off < 4; ++off) {
      std::vector<std::uint16_t> block(static_cast<std::size_t>(rows * dst_ld + 4), kUntouched16);
      ASSERT_EQ(run_cast_block_to_16(kEmulator, block.data() + 1, code, dst_ld, values.data() + off,
                                     src_ld, rows, cols),
                0);
      std::vector<float> back(static_cast<std::size_t>(rows * src_ld + 4), untouched32);
      ASSERT_EQ(run_cast_block_from_16(kEmulator, back.data() + off, src_ld, block.data() + 1, code,
                                       dst_ld, rows, cols),
                0);
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < dst_ld; ++c) {
          const auto at = static_cast<std::size_t>(1 + r * dst_ld + c);
          const std::uint16_t want =
              c < cols ? narrow_all[static_cast<std::size_t>(off + r * src_ld + c)] : kUntouched16;
          EXPECT_EQ(block[at], want) << "offset " << off << " row " << r << " column " << c;
        }
        for (std::int64_t c = 0; c < src_ld; ++c) {
          const auto at = static_cast<std::size_t>(off + r * src_ld + c);
          float want = untouched32;
          if (c < cols) {
            kernels::cast_array(&want, kernels::DType::kF32,
                                &block[static_cast<std::size_t>(1 + r * dst_ld + c)], type, 1);
          }
          EXPECT_EQ(std::bit_cast<std::uint32_t>(back[at]), std::bit_cast<std::uint32_t>(want))
              << "widened, offset " << off << " row " << r << " column " << c;
        }
      }
    }
  }
}

// GELU, SwiGLU and the residual add take 4 elements per thread on 16-byte aligned arrays and one
// otherwise: the same inputs one float off alignment (one at a time) give the same bits, and the
// aligned run matches the CPU kernels.
TEST(EmulatedKernels, ElementwiseInGroupsOfFourGiveTheBitsOfOneAtATime) {
  const std::int64_t rows = 7, inner = 36, n = 1029;  // n: 257 groups and a rest of 1
  const std::vector<float> x = random_floats(n + 1, 41, -6.0f, 6.0f);
  const std::vector<float> y = random_floats(n + 1, 42), d = random_floats(n + 1, 43);
  // Runs `op` on copies of the arrays starting at element `off` and returns the first output.
  auto shifted = [](std::int64_t len, int off, std::vector<std::vector<float> > arrays, auto op) {
    std::vector<float*> p;
    for (auto& a : arrays) {
      a.insert(a.begin(), static_cast<std::size_t>(off), 0.0f);
      p.push_back(a.data() + off);
    }
    EXPECT_EQ(op(p), 0);
    return std::vector<float>(arrays[0].begin() + off, arrays[0].begin() + off + len);
  };
  const std::vector<float> xs(x.begin(), x.begin() + n), ys(y.begin(), y.begin() + n);
  const std::vector<float> ds(d.begin(), d.begin() + n);
  auto gelu = [&](int off) {
    return shifted(n, off, {std::vector<float>(n), xs}, [&](const std::vector<float*>& p) {
      return run_gelu_forward(kEmulator, p[0], p[1], n);
    });
  };
  auto dgelu = [&](int off) {
    return shifted(n, off, {ys, xs, ds}, [&](const std::vector<float*>& p) {
      return run_gelu_backward(kEmulator, p[0], p[1], p[2], n);
    });
  };
  auto add = [&](int off) {
    return shifted(n, off, {ds, xs, ys}, [&](const std::vector<float*>& p) {
      return run_add(kEmulator, p[0], p[1], p[2], n);
    });
  };
  expect_bitwise_equal("gelu", gelu(0), gelu(1));
  expect_bitwise_equal("gelu backward", dgelu(0), dgelu(1));
  expect_bitwise_equal("add", add(0), add(1));
  std::vector<float> want(static_cast<std::size_t>(n));
  kernels::gelu_forward(want.data(), xs.data(), n);
  expect_all_close("gelu vs cpu", gelu(0), want, kClose);

  const std::vector<float> gate_up(x.begin(), x.begin() + rows * 2 * inner);
  const std::vector<float> dout(d.begin(), d.begin() + rows * inner);
  auto swiglu = [&](int off) {
    return shifted(rows * inner, off, {std::vector<float>(rows * inner), gate_up},
                   [&](const std::vector<float*>& p) {
                     return run_swiglu_forward(kEmulator, p[0], p[1], rows, inner);
                   });
  };
  auto dswiglu = [&](int off) {
    return shifted(rows * 2 * inner, off, {std::vector<float>(rows * 2 * inner), gate_up, dout},
                   [&](const std::vector<float*>& p) {
                     return run_swiglu_backward(kEmulator, p[0], p[1], p[2], rows, inner);
                   });
  };
  expect_bitwise_equal("swiglu", swiglu(0), swiglu(1));
  expect_bitwise_equal("swiglu backward", dswiglu(0), dswiglu(1));
  std::vector<float> want_s(static_cast<std::size_t>(rows * inner));
  kernels::swiglu_forward(want_s.data(), gate_up.data(), rows, inner);
  expect_all_close("swiglu vs cpu", swiglu(0), want_s, kClose);
}

// GELU on its pre-activation in 16 bits gives, for both 16-bit types, the bits of the fp32 kernels
// on the values widened (the backward's onto a zeroed dx, which the fp32 path zeroes first), with
// its fp32 output and companion, or the companion alone; over 4 x 1 + 3 values (the fp32 kernels 4
// at a time, then one) and at an offset of one (one at a time); a call with neither output is
// refused. Against the CPU's GELU within fp32 rounding.
TEST(EmulatedKernels, SixteenBitGeluGivesTheBitsOfTheFp32KernelsOnTheValuesWidened) {
  for (const int code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    for (const std::int64_t off : {0, 1}) {
      const std::int64_t n = 4 * 37 + 3;
      // The n values from `off` on (what the calls wrote).
      const auto written = [off](const auto& v) {
        return std::vector<typename std::decay_t<decltype(v)>::value_type>(v.begin() + off,
                                                                           v.end());
      };
      const std::vector<float> raw = random_floats(n + off, 71, -5.0f, 5.0f);
      std::vector<std::uint16_t> x16(raw.size());
      std::vector<float> widened(raw.size());
      kernels::cast_array(x16.data(), type, raw.data(), kernels::DType::kF32, n + off);
      kernels::cast_array(widened.data(), kernels::DType::kF32, x16.data(), type, n + off);
      const std::vector<float> dout = random_floats(n + off, 72);
      std::vector<float> want(n + off), got(n + off, -1.0f);
      std::vector<std::uint16_t> want16(n + off), got16(n + off, 0xdead);
      ASSERT_EQ(run_gelu_forward(kEmulator, want.data() + off, widened.data() + off, n,
                                 Narrow{want16.data() + off, code}),
                0);
      ASSERT_EQ(run_gelu_forward_16(kEmulator, got.data() + off, x16.data() + off, code, n,
                                    Narrow{got16.data() + off, code}),
                0);
      expect_bitwise_equal("gelu 16-bit", written(got), written(want));
      expect_bitwise_equal("gelu 16-bit (companion)", written(got16), written(want16));
      std::fill(got16.begin(), got16.end(), 0xdead);
      ASSERT_EQ(run_gelu_forward_16(kEmulator, nullptr, x16.data() + off, code, n,
                                    Narrow{got16.data() + off, code}),
                0);
      expect_bitwise_equal("gelu 16-bit, companion alone", written(got16), written(want16));
      std::vector<float> cpu(static_cast<std::size_t>(n));
      kernels::gelu_forward(cpu.data(), widened.data() + off, n);
      expect_all_close("gelu 16-bit vs cpu", written(got), cpu, Tolerance{1e-5, 1e-5});
      // The backward: the fp32 kernel accumulates onto a zeroed dx.
      std::vector<float> dwant(n + off, 0.0f), dgot(n + off, -1.0f);
      std::vector<std::uint16_t> dwant16(n + off), dgot16(n + off, 0xdead);
      ASSERT_EQ(run_gelu_backward(kEmulator, dwant.data() + off, widened.data() + off,
                                  dout.data() + off, n, Narrow{dwant16.data() + off, code}),
                0);
      ASSERT_EQ(run_gelu_backward_16(kEmulator, dgot.data() + off, x16.data() + off, code,
                                     dout.data() + off, n, Narrow{dgot16.data() + off, code}),
                0);
      expect_bitwise_equal("gelu backward 16-bit", written(dgot), written(dwant));
      expect_bitwise_equal("gelu backward 16-bit (companion)", written(dgot16), written(dwant16));
      std::fill(dgot16.begin(), dgot16.end(), 0xdead);
      ASSERT_EQ(run_gelu_backward_16(kEmulator, nullptr, x16.data() + off, code, dout.data() + off,
                                     n, Narrow{dgot16.data() + off, code}),
                0);
      expect_bitwise_equal("gelu backward 16-bit, companion alone", written(dgot16),
                           written(dwant16));
      EXPECT_FALSE(gelu_16_valid(nullptr, Narrow{}));
      EXPECT_TRUE(gelu_16_valid(nullptr, Narrow{dgot16.data(), code}));
      EXPECT_TRUE(gelu_16_valid(dgot.data(), Narrow{}));
    }
  }
}

// SwiGLU on gate and up in 16 bits gives, for both 16-bit types, the bits of the fp32 kernels on
// the values widened, forward and backward (the backward's dout fp32, or 16-bit and widened too),
// in rows of 36 columns (the fp32 kernels 4 at a time) and 33 (one at a time); and given a null
// output with a companion, the 16-bit forward, the fp32 one, GELU's and the norms' (with and
// without the residual add) write the companion alone with the bits the companion gets beside an
// fp32 output.
TEST(EmulatedKernels, SixteenBitSwigluAndCompanionsAloneGiveTheBitsOfTheFp32Kernels) {
  for (const int code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    for (const std::int64_t inner : {36, 33}) {
      const std::int64_t rows = 5, n = rows * inner;
      const std::vector<float> raw = random_floats(2 * n, 61, -5.0f, 5.0f);
      std::vector<std::uint16_t> gate_up16(raw.size());
      std::vector<float> widened(raw.size());
      kernels::cast_array(gate_up16.data(), type, raw.data(), kernels::DType::kF32, 2 * n);
      kernels::cast_array(widened.data(), kernels::DType::kF32, gate_up16.data(), type, 2 * n);
      const std::vector<float> dout = random_floats(n, 62);
      std::vector<float> want(n), got(n), dwant(2 * n), dgot(2 * n);
      std::vector<std::uint16_t> beside(n), alone(n, 0xdead);
      ASSERT_EQ(run_swiglu_forward(kEmulator, want.data(), widened.data(), rows, inner,
                                   Narrow{beside.data(), code}),
                0);
      ASSERT_EQ(run_swiglu_forward_16(kEmulator, got.data(), gate_up16.data(), code, rows, inner,
                                      Narrow{}),
                0);
      expect_bitwise_equal("swiglu 16-bit", got, want);
      ASSERT_EQ(run_swiglu_backward(kEmulator, dwant.data(), widened.data(), dout.data(), rows,
                                    inner, Narrow{}),
                0);
      ASSERT_EQ(run_swiglu_backward_16(kEmulator, dgot.data(), gate_up16.data(), code, dout.data(),
                                       nullptr, rows, inner, Narrow{}),
                0);
      expect_bitwise_equal("swiglu backward 16-bit", dgot, dwant);
      // dout in 16 bits too (a gradient kept alone): the bits of the fp32 kernel on every input
      // widened, and of the 16-bit kernel on that dout widened; a companion for dgate_up beside.
      std::vector<std::uint16_t> dout16(n);
      std::vector<float> dout_widened(n);
      kernels::cast_array(dout16.data(), type, dout.data(), kernels::DType::kF32, n);
      kernels::cast_array(dout_widened.data(), kernels::DType::kF32, dout16.data(), type, n);
      std::vector<std::uint16_t> dwant16(2 * n), dgot16(2 * n, 0xdead);
      ASSERT_EQ(run_swiglu_backward(kEmulator, dwant.data(), widened.data(), dout_widened.data(),
                                    rows, inner, Narrow{dwant16.data(), code}),
                0);
      std::fill(dgot.begin(), dgot.end(), -1.0f);
      ASSERT_EQ(run_swiglu_backward_16(kEmulator, dgot.data(), gate_up16.data(), code, nullptr,
                                       dout16.data(), rows, inner, Narrow{dgot16.data(), code}),
                0);
      expect_bitwise_equal("swiglu backward 16-bit, dout in 16 bits", dgot, dwant);
      expect_bitwise_equal("swiglu backward 16-bit, dout in 16 bits (companion)", dgot16, dwant16);
      // dgate_up null: the companion alone, the same bits.
      std::fill(dgot16.begin(), dgot16.end(), 0xdead);
      ASSERT_EQ(run_swiglu_backward_16(kEmulator, nullptr, gate_up16.data(), code, nullptr,
                                       dout16.data(), rows, inner, Narrow{dgot16.data(), code}),
                0);
      expect_bitwise_equal("swiglu backward 16-bit, companion alone", dgot16, dwant16);
      const Narrow companion{dgot16.data(), code};
      EXPECT_FALSE(swiglu_backward_16_valid(dgot.data(), {}, nullptr, nullptr));
      EXPECT_FALSE(swiglu_backward_16_valid(dgot.data(), {}, dout.data(), dout16.data()));
      EXPECT_FALSE(swiglu_backward_16_valid(nullptr, {}, dout.data(), nullptr));
      EXPECT_TRUE(swiglu_backward_16_valid(dgot.data(), {}, nullptr, dout16.data()));
      EXPECT_TRUE(swiglu_backward_16_valid(dgot.data(), {}, dout.data(), nullptr));
      EXPECT_TRUE(swiglu_backward_16_valid(nullptr, companion, dout.data(), nullptr));
      ASSERT_EQ(run_swiglu_forward_16(kEmulator, nullptr, gate_up16.data(), code, rows, inner,
                                      Narrow{alone.data(), code}),
                0);
      expect_bitwise_equal("swiglu 16-bit, companion alone", alone, beside);
      std::fill(alone.begin(), alone.end(), 0xdead);
      ASSERT_EQ(run_swiglu_forward(kEmulator, nullptr, widened.data(), rows, inner,
                                   Narrow{alone.data(), code}),
                0);
      expect_bitwise_equal("swiglu, companion alone", alone, beside);
      // GELU and the norms, beside an fp32 output and alone.
      const std::vector<float> w = random_floats(inner, 63), b = random_floats(inner, 64);
      const auto both = [&](const char* what, const std::function<int(float*, Narrow)>& run) {
        std::vector<float> out(n);
        std::vector<std::uint16_t> next(n), only(n, 0xdead);
        ASSERT_EQ(run(out.data(), Narrow{next.data(), code}), 0) << what;
        ASSERT_EQ(run(nullptr, Narrow{only.data(), code}), 0) << what;
        expect_bitwise_equal(what, only, next);
      };
      both("gelu, companion alone", [&](float* out, Narrow narrow) {
        return run_gelu_forward(kEmulator, out, raw.data(), n, narrow);
      });
      std::vector<float> stats(2 * rows);
      both("layernorm, companion alone", [&](float* out, Narrow narrow) {
        return run_layernorm_forward(kEmulator, out, stats.data(), stats.data() + rows, raw.data(),
                                     w.data(), b.data(), rows, inner, 1e-5, narrow);
      });
      both("rmsnorm, companion alone", [&](float* out, Narrow narrow) {
        return run_rmsnorm_forward(kEmulator, out, stats.data(), raw.data(), w.data(), rows, inner,
                                   1e-5, narrow);
      });
      both("layernorm after the residual add, companion alone", [&](float* out, Narrow narrow) {
        std::vector<float> res(raw.begin(), raw.begin() + n);
        return run_add_layernorm_forward(kEmulator, res.data(), raw.data() + n, out, stats.data(),
                                         stats.data() + rows, w.data(), b.data(), rows, inner, 1e-5,
                                         narrow);
      });
      both("rmsnorm after the residual add, companion alone", [&](float* out, Narrow narrow) {
        std::vector<float> res(raw.begin(), raw.begin() + n);
        return run_add_rmsnorm_forward(kEmulator, res.data(), raw.data() + n, out, stats.data(),
                                       w.data(), rows, inner, 1e-5, narrow);
      });
    }
  }
}

// A kernel given a companion (Narrow) writes every value it writes to its fp32 output, rounded
// to 16 bits as the CPU rounds, at the same index of the companion, and nothing else there; its
// fp32 output keeps the bits it has without one. For both 16-bit types, the fp32 arrays aligned
// (4 at a time) and one off (one at a time), the companion 8-byte aligned and one element off.
// `run(out, narrow)` fills `len` values at out (accumulating kernels start from the same values).
void expect_companion(const char* what, std::int64_t len,
                      const std::function<int(float*, Narrow)>& run) {
  constexpr std::uint16_t kUntouched = 0xdead;
  for (const int code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    for (const int off : {0, 1}) {
      for (const int narrow_off : {0, 1}) {
        std::vector<float> plain(static_cast<std::size_t>(len + 1));
        std::vector<float> with(plain.size());
        ASSERT_EQ(run(plain.data() + off, Narrow{}), 0) << what;
        std::vector<std::uint16_t> narrow(static_cast<std::size_t>(len + 2), kUntouched);
        ASSERT_EQ(run(with.data() + off, Narrow{narrow.data() + narrow_off, code}), 0) << what;
        for (std::int64_t i = 0; i < len; ++i) {
          const float v = with[static_cast<std::size_t>(off + i)];
          ASSERT_EQ(std::bit_cast<std::uint32_t>(v),
                    std::bit_cast<std::uint32_t>(plain[static_cast<std::size_t>(off + i)]))
              << what << ": element " << i << " changed with a companion";
          std::uint16_t want = 0;
          kernels::cast_array(&want, type, &v, kernels::DType::kF32, 1);
          ASSERT_EQ(narrow[static_cast<std::size_t>(narrow_off + i)], want)
              << what << " code " << code << " offsets " << off << " " << narrow_off << ": element "
              << i;
        }
        EXPECT_EQ(narrow[0] == kUntouched, narrow_off == 1 || len == 0) << what;
        EXPECT_EQ(narrow[static_cast<std::size_t>(narrow_off + len)], kUntouched) << what;
        if (narrow_off == 0) {
          EXPECT_EQ(narrow.back(), kUntouched) << what;
        }
      }
    }
  }
}

TEST(EmulatedKernels, CompanionsHoldTheRoundingOfEveryValueWritten) {
  const std::int64_t rows = 6, inner = 36, c = 100, n = rows * 2 * inner + 1;  // n: a rest of 1
  // The inputs hold what the largest call below reads (the rotation's 864 values): a read past
  // their end would take whatever the heap holds there, which may differ between the two runs
  // each comparison makes (so it did, in a whole program's run).
  constexpr std::int64_t kInputs = 1024;
  const std::vector<float> x = random_floats(kInputs, 61, -6.0f, 6.0f);
  const std::vector<float> y = random_floats(kInputs, 62), d = random_floats(kInputs, 63);
  const std::vector<float> w = random_floats(c, 64), bias = random_floats(c, 65);
  auto into = [](float* out, const std::vector<float>& from, std::int64_t len) {
    ASSERT_LE(len, static_cast<std::int64_t>(from.size()));
    std::copy(from.begin(), from.begin() + len, out);
  };
  expect_companion("gelu", n, [&](float* out, Narrow nw) {
    return run_gelu_forward(kEmulator, out, x.data(), n, nw);
  });
  expect_companion("gelu backward", n, [&](float* out, Narrow nw) {
    into(out, y, n);
    return run_gelu_backward(kEmulator, out, x.data(), d.data(), n, nw);
  });
  expect_companion("swiglu", rows * inner, [&](float* out, Narrow nw) {
    return run_swiglu_forward(kEmulator, out, x.data(), rows, inner, nw);
  });
  expect_companion("swiglu backward", rows * 2 * inner, [&](float* out, Narrow nw) {
    return run_swiglu_backward(kEmulator, out, x.data(), d.data(), rows, inner, nw);
  });
  const std::int64_t r = 5;  // rows of c channels for the norms
  std::vector<float> mean(r), rstd(r), res(r * c);
  expect_companion("layernorm", r * c, [&](float* out, Narrow nw) {
    return run_layernorm_forward(kEmulator, out, mean.data(), rstd.data(), x.data(), w.data(),
                                 bias.data(), r, c, 1e-5, nw);
  });
  expect_companion("add + layernorm", r * c, [&](float* out, Narrow nw) {
    into(res.data(), x, r * c);
    return run_add_layernorm_forward(kEmulator, res.data(), y.data(), out, mean.data(), rstd.data(),
                                     w.data(), bias.data(), r, c, 1e-5, nw);
  });
  expect_companion("rmsnorm", r * c, [&](float* out, Narrow nw) {
    return run_rmsnorm_forward(kEmulator, out, rstd.data(), x.data(), w.data(), r, c, 1e-6, nw);
  });
  expect_companion("add + rmsnorm", r * c, [&](float* out, Narrow nw) {
    into(res.data(), x, r * c);
    return run_add_rmsnorm_forward(kEmulator, res.data(), y.data(), out, rstd.data(), w.data(), r,
                                   c, 1e-6, nw);
  });
  const cuda::ColumnReducePlan plan = cuda::plan_column_reduce(r, c, 2, 1 << 20);
  std::vector<double> scratch(static_cast<std::size_t>(plan.chunks * 2 * c));
  std::vector<float> dw(c), db(c);
  ASSERT_EQ(run_layernorm_forward(kEmulator, res.data(), mean.data(), rstd.data(), x.data(),
                                  w.data(), bias.data(), r, c, 1e-5),
            0);
  expect_companion("layernorm dx", r * c, [&](float* out, Narrow nw) {
    into(out, y, r * c);
    return run_layernorm_backward(kEmulator, out, dw.data(), db.data(), d.data(), x.data(),
                                  w.data(), mean.data(), rstd.data(), r, c, plan, scratch.data(),
                                  nw);
  });
  expect_companion("rmsnorm dx", r * c, [&](float* out, Narrow nw) {
    into(out, y, r * c);
    return run_rmsnorm_backward(kEmulator, out, dw.data(), d.data(), x.data(), w.data(),
                                rstd.data(), r, c, plan, scratch.data(), nw);
  });
  // The rotation of whole heads side by side (every value rewritten), in place, both directions.
  const std::int64_t t = 9, heads = 3, hd = 16;
  std::vector<float> cos(static_cast<std::size_t>(t * hd / 2)), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), t, hd, 10000.0);
  const kernels::RopeShape rope{2 * t, heads * hd, t, heads, hd, hd, nullptr};
  for (const float direction : {1.0f, -1.0f}) {
    expect_companion("rope", 2 * t * heads * hd, [&](float* out, Narrow nw) {
      into(out, y, 2 * t * heads * hd);
      return run_rope(kEmulator, out, rope, cos.data(), sin.data(), direction, nw);
    });
  }
  // Cross-entropy's gradient over the logits, in place (row 2 ignored: a zero row).
  const std::vector<std::int32_t> targets = {3, 0, -1, 40};
  const std::int64_t vocab = 41;
  std::vector<float> losses(targets.size());
  expect_companion("cross-entropy gradient", 4 * vocab, [&](float* out, Narrow nw) {
    into(out, x, 4 * vocab);
    return run_cross_entropy(kEmulator, true, out, losses.data(), targets.data(), 4, vocab, 0.5f,
                             nw);
  });
  // Qwen3's per-head RMSNorm gradient, in place, every head of every row.
  const std::int64_t head_rows = 6, head_count = 3, head_dim = 16;
  const std::int64_t head_width = head_count * head_dim;
  const cuda::ColumnReducePlan head_plan =
      cuda::plan_column_reduce(head_rows * head_count, head_dim, 1, 1 << 20);
  std::vector<double> head_scratch(static_cast<std::size_t>(head_plan.chunks * head_dim));
  const std::vector<float> head_rstd = random_floats(head_rows * head_count, 66, 0.5f, 1.5f);
  std::vector<float> head_dw(static_cast<std::size_t>(head_dim));
  expect_companion("rmsnorm heads dx", head_rows * head_width, [&](float* out, Narrow nw) {
    into(out, y, head_rows * head_width);
    return run_rmsnorm_heads_backward(kEmulator, out, head_dw.data(), x.data(), w.data(),
                                      head_rstd.data(), head_rows, head_count, head_dim, head_width,
                                      head_width, head_plan, head_scratch.data(), nw);
  });
  // The 16-bit attention's results widened into fp32 (rows of `cols` of a wider source).
  const std::int64_t cols = 45, src_ld = 52, src_rows = 7;
  std::vector<std::uint16_t> src16(static_cast<std::size_t>(src_rows * src_ld));
  kernels::cast_array(src16.data(), kernels::DType::kBF16, x.data(), kernels::DType::kF32,
                      src_rows * src_ld);
  expect_companion("widen", src_rows * cols, [&](float* out, Narrow nw) {
    return run_cast_block_from_16(kEmulator, out, cols, src16.data(), kCodeBF16, src_ld, src_rows,
                                  cols, nw);
  });
}

TEST(EmulatedKernels, FallbackGemmMatchesTheCpu) {
  const std::int64_t m = 37, n = 29, k = 45;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::int64_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
      const std::vector<float> a = random_floats((ta ? k : m) * lda, 17);
      const std::vector<float> b = random_floats((tb ? n : k) * ldb, 18);
      std::vector<float> c = random_floats(m * ldc, 19), want = c;
      ASSERT_EQ(run_gemm_fallback(kEmulator, ta, tb, m, n, k, 1.5f, a.data(), lda, b.data(), ldb,
                                  0.5f, c.data(), ldc, kCodeF32),
                0);
      kernels::gemm<float>(ta, tb, m, n, k, 1.5f, a.data(), lda, b.data(), ldb, 0.5f, want.data(),
                           ldc);
      expect_all_close("gemm", c, want, Tolerance{1e-5, 1e-5});
    }
  }
}

// C written in 16 bits (the head's logits): each element the fp32 result of the same kernel rounded
// once to nearest even, bit for bit; with beta, C is read widened.
TEST(EmulatedKernels, FallbackGemmWritesItsResultRoundedTo16Bits) {
  const std::int64_t m = 21, n = 37, k = 45, ldc = n + 3;
  const std::vector<float> a = random_floats(m * k, 24), b = random_floats(n * k, 25);
  for (const int code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    for (const float beta : {0.0f, 0.5f}) {
      std::vector<float> c0 = random_floats(m * ldc, 26);
      std::vector<std::uint16_t> c16(c0.size());
      kernels::cast_array(c16.data(), type, c0.data(), kernels::DType::kF32,
                          static_cast<std::int64_t>(c0.size()));
      std::vector<float> wide(c0.size());
      kernels::cast_array(wide.data(), kernels::DType::kF32, c16.data(), type,
                          static_cast<std::int64_t>(c0.size()));
      ASSERT_EQ(run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k,
                                  beta, c16.data(), ldc, kCodeF32, code),
                0);
      ASSERT_EQ(run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k,
                                  beta, wide.data(), ldc, kCodeF32),
                0);
      std::vector<std::uint16_t> want(c0.size());
      kernels::cast_array(want.data(), type, wide.data(), kernels::DType::kF32,
                          static_cast<std::int64_t>(c0.size()));
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(c16[i], want[i]) << "code " << code << " beta " << beta << " element " << i;
    }
  }
}

// A bias (GPT-2's qkv projection written in 16 bits): each element the kernel's fp32 product plus
// its column's bias in fp32 (what add_bias adds to a stored product), rounded once to nearest even,
// bit for bit; in fp32 the same sums; the padding past n in each row untouched.
TEST(EmulatedKernels, FallbackGemmAddsItsBiasBeforeTheRounding) {
  const std::int64_t m = 19, n = 41, k = 36, ldc = n + 5;
  const std::vector<float> a = random_floats(m * k, 27), b = random_floats(n * k, 28);
  const std::vector<float> bias = random_floats(n, 29, -2.0f, 2.0f);
  std::vector<float> product(static_cast<std::size_t>(m * ldc), 0.0f);
  ASSERT_EQ(run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                              product.data(), ldc, kCodeF32),
            0);
  std::vector<float> sums = product;
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t j = 0; j < n; ++j)
      sums[static_cast<std::size_t>(r * ldc + j)] += bias[static_cast<std::size_t>(j)];
  }
  std::vector<float> wide(product.size(), 7.0f);
  ASSERT_EQ(run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                              wide.data(), ldc, kCodeF32, kCodeF32, bias.data()),
            0);
  for (std::int64_t r = 0; r < m; ++r) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const auto i = static_cast<std::size_t>(r * ldc + j);
      ASSERT_EQ(wide[i], j < n ? sums[i] : 7.0f) << "fp32 element " << i;
    }
  }
  for (const int code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    std::vector<std::uint16_t> c16(product.size(), 0x7777);
    ASSERT_EQ(run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k,
                                0.0f, c16.data(), ldc, kCodeF32, code, bias.data()),
              0);
    std::vector<std::uint16_t> want(product.size());
    kernels::cast_array(want.data(), type, sums.data(), kernels::DType::kF32,
                        static_cast<std::int64_t>(sums.size()));
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t j = 0; j < ldc; ++j) {
        const auto i = static_cast<std::size_t>(r * ldc + j);
        ASSERT_EQ(c16[i], j < n ? want[i] : 0x7777) << "code " << code << " element " << i;
      }
    }
  }
}

// GELU in the epilogue (GPT-2's MLP with its activation and gradient in 16 bits, the fallback for
// cuBLASLt's GELU_AUX_BIAS and DGELU): the forward stores the fp32 product plus bias rounded into
// aux and GELU of the unrounded sum rounded into C: the bits of the fp32 kernel with its bias, then
// the fp32 GELU kernel writing its companion; the backward, the product times GELU' of aux widened:
// the bits of the fp32 product, then GELU's 16-bit backward writing its companion alone. Both
// 16-bit types; the padding past n of each row of C and aux untouched; and both within the 16-bit
// rounding of the CPU's GELU and GELU gradient.
TEST(EmulatedKernels, FallbackGemmGeluEpiloguesGiveTheBitsOfTheUnfusedKernels) {
  const std::int64_t m = 19, n = 41, k = 36, ldc = n + 5;
  const std::vector<float> a = random_floats(m * k, 31), b = random_floats(n * k, 32);
  const std::vector<float> bias = random_floats(n, 33, -2.0f, 2.0f);
  // The unfused forward in fp32 (padding zeros): the product with its bias, GELU on the sums.
  std::vector<float> sums(static_cast<std::size_t>(m * ldc), 0.0f);
  ASSERT_EQ(run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f,
                              sums.data(), ldc, kCodeF32, kCodeF32, bias.data()),
            0);
  const auto total = static_cast<std::int64_t>(sums.size());
  for (const int code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    std::vector<float> act(sums.size());
    std::vector<std::uint16_t> act_want(sums.size()), pre_want(sums.size());
    ASSERT_EQ(
        run_gelu_forward(kEmulator, act.data(), sums.data(), total, Narrow{act_want.data(), code}),
        0);
    kernels::cast_array(pre_want.data(), type, sums.data(), kernels::DType::kF32, total);
    std::vector<std::uint16_t> act16(sums.size(), 0x7777), pre16(sums.size(), 0x7777);
    ASSERT_EQ(run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, a.data(), k, b.data(), k,
                                0.0f, act16.data(), ldc, kCodeF32, code, bias.data(), pre16.data(),
                                kGemmGeluAux),
              0);
    // The backward: dy (m x k) times a weight (n x k) transposed, times GELU' of pre16.
    const std::vector<float> dy = random_floats(m * k, 34), w = random_floats(n * k, 35);
    std::vector<float> product(sums.size(), 0.0f);
    ASSERT_EQ(run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, dy.data(), k, w.data(), k,
                                0.0f, product.data(), ldc, kCodeF32),
              0);
    std::vector<std::uint16_t> d_want(sums.size());
    ASSERT_EQ(run_gelu_backward_16(kEmulator, nullptr, pre16.data(), code, product.data(), total,
                                   Narrow{d_want.data(), code}),
              0);
    std::vector<std::uint16_t> d16(sums.size(), 0x7777);
    ASSERT_EQ(
        run_gemm_fallback(kEmulator, false, true, m, n, k, 1.0f, dy.data(), k, w.data(), k, 0.0f,
                          d16.data(), ldc, kCodeF32, code, nullptr, pre16.data(), kGemmDgelu),
        0);
    // Against the CPU's reference: GELU of the sums, and its gradient at the 16-bit pre-activation
    // onto a zeroed array, each within the 16-bit type's rounding.
    std::vector<float> act_cpu(sums.size()), d_cpu(sums.size(), 0.0f), pre_wide(sums.size());
    kernels::gelu_forward(act_cpu.data(), sums.data(), total);
    kernels::cast_array(pre_wide.data(), kernels::DType::kF32, pre16.data(), type, total);
    kernels::gelu_backward(d_cpu.data(), pre_wide.data(), product.data(), total);
    std::vector<float> act_got(sums.size()), d_got(sums.size());
    kernels::cast_array(act_got.data(), kernels::DType::kF32, act16.data(), type, total);
    kernels::cast_array(d_got.data(), kernels::DType::kF32, d16.data(), type, total);
    const double unit = code == kCodeBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t j = 0; j < n; ++j) {
        const auto i = static_cast<std::size_t>(r * ldc + j);
        EXPECT_NEAR(act_got[i], act_cpu[i], unit * std::abs(act_cpu[i]) + 1e-6) << "act at " << i;
        EXPECT_NEAR(d_got[i], d_cpu[i], unit * std::abs(d_cpu[i]) + 1e-6) << "dpre at " << i;
      }
    }
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t j = 0; j < ldc; ++j) {
        const auto i = static_cast<std::size_t>(r * ldc + j);
        const bool inside = j < n;
        ASSERT_EQ(pre16[i], inside ? pre_want[i] : 0x7777) << "pre, code " << code << " at " << i;
        ASSERT_EQ(act16[i], inside ? act_want[i] : 0x7777) << "act, code " << code << " at " << i;
        ASSERT_EQ(d16[i], inside ? d_want[i] : 0x7777) << "dpre, code " << code << " at " << i;
      }
    }
  }
}

TEST(EmulatedKernels, AdamIsTheCpusBitsAndSkipsNonFiniteTiles) {
  const std::size_t n = 3000;
  std::vector<float> p = random_floats(n, 20), m = random_floats(n, 21, -0.01f, 0.01f);
  std::vector<float> v = random_floats(n, 22, 0.0f, 1e-4f);
  std::vector<std::uint16_t> g(n), copy(n), copy_w(n);
  for (std::size_t i = 0; i < n; ++i)
    g[i] = kernels::float_to_fp16(random_floats(1, 23 + i)[0]);
  std::vector<float> pw = p, mw = m, vw = v;
  kernels::AdamParams params;
  params.lr = 1e-3f;
  params.weight_decay = 0.05f;
  params.step = 4;
  kernels::AdamFusion fusion;
  fusion.grad_scale_inv = 0.125f;
  const kernels::detail::AdamConstants k = kernels::detail::make_constants(params, fusion);
  const AdamDeviceConstants c{k.beta1, k.one_minus_beta1, k.beta2,        k.one_minus_beta2,
                              k.eps,   k.step_size,       k.inv_sqrt_bc2, k.decay,
                              k.l2,    k.grad_scale};
  ASSERT_EQ(run_adam_step(kEmulator, c, p.data(), m.data(), v.data(), g.data(), kCodeF16,
                          copy.data(), kCodeBF16, static_cast<std::int64_t>(n), nullptr),
            0);
  auto kernel = kernels::AdamKernel::create();
  ASSERT_TRUE(kernel.is_ok());
  kernels::AdamTile tile;
  tile.master = pw.data();
  tile.exp_avg = mw.data();
  tile.exp_avg_sq = vw.data();
  tile.grad = g.data();
  tile.grad_dtype = kernels::DType::kF16;
  tile.copy_out = copy_w.data();
  tile.copy_dtype = kernels::DType::kBF16;
  tile.n = n;
  kernel->step(params, fusion, tile);
  expect_bitwise_equal("master", p, pw);
  expect_bitwise_equal("exp_avg", m, mw);
  expect_bitwise_equal("exp_avg_sq", v, vw);
  expect_bitwise_equal("copy", copy, copy_w);

  const std::vector<double> skip = {0.0, 1.0};  // one non-finite element
  const std::vector<float> before = p;
  ASSERT_EQ(run_adam_step(kEmulator, c, p.data(), m.data(), v.data(), g.data(), kCodeF16,
                          copy.data(), kCodeBF16, static_cast<std::int64_t>(n), skip.data()),
            0);
  expect_bitwise_equal("skipped", p, before);
}

#endif  // __SANITIZE_ADDRESS__

}  // namespace
}  // namespace strata::cuda_kernels
