// The CUDA kernels' new model features, run on the CPU by the SIMT emulator and compared with the
// CPU kernels (see cuda_kernels_emulated_test.cc): sliding-window and packed-document attention,
// partial rotary at packed positions, the per-head RMSNorm, ignored (-1) targets in the loss, and
// GPT-2's position-embedding gradient at packed positions.
// The kernel headers define their kernels file-locally; this file runs only some of them (and
// none under AddressSanitizer, see below).
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/loss_kernels.cuh"
#include "kernels/cuda/norm_kernels.cuh"
//
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cast.h"
#include "kernels/cpu/nn_ops.h"
#include "support/gpu_support.h"

namespace strata::cuda_kernels {
namespace {

#if defined(__SANITIZE_ADDRESS__)
TEST(EmulatedModelKernels, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

using testing::expect_all_close;
using testing::expect_bitwise_equal;
using testing::random_floats;
using testing::Tolerance;

const simt::Launcher kEmulator;

// Positions of documents of the given lengths packed one after another.
std::vector<std::int32_t> packed(std::initializer_list<int> lengths) {
  std::vector<std::int32_t> p;
  for (int n : lengths)
    for (int i = 0; i < n; ++i)
      p.push_back(i);
  return p;
}

struct MaskCase {
  const char* name;
  std::int64_t batch, seq_len, heads, kv_heads, head_dim, window;
  std::vector<std::int32_t> positions;  // empty: none
};

class EmulatedMaskedAttention : public ::testing::TestWithParam<MaskCase> {};

TEST_P(EmulatedMaskedAttention, ForwardAndBackwardMatchTheCpu) {
  const MaskCase& p = GetParam();
  kernels::AttentionShape a;
  a.batch = p.batch;
  a.seq_len = p.seq_len;
  a.heads = p.heads;
  a.kv_heads = p.kv_heads;
  a.head_dim = p.head_dim;
  a.q_stride = a.kv_stride = (p.heads + 2 * p.kv_heads) * p.head_dim;
  a.out_stride = p.heads * p.head_dim;
  a.scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  a.window = p.window;
  a.positions = p.positions.empty() ? nullptr : p.positions.data();
  const cuda::AttentionLaunch launch = cuda::plan_attention(p.head_dim);
  const std::int64_t rows = p.batch * p.seq_len;
  const std::int64_t hd = p.heads * p.head_dim, kvd = p.kv_heads * p.head_dim;
  const std::vector<float> qkv = random_floats(rows * a.q_stride, 31, -2.0f, 2.0f);
  const float* q = qkv.data();
  std::vector<float> out(static_cast<std::size_t>(rows * a.out_stride)), out_w = out;
  std::vector<float> lse(static_cast<std::size_t>(p.batch * p.heads * p.seq_len)), lse_w = lse;
  ASSERT_EQ(
      run_attention_forward(kEmulator, out.data(), lse.data(), q, q + hd, q + hd + kvd, a, launch),
      0);
  kernels::attention_forward(out_w.data(), lse_w.data(), q, q + hd, q + hd + kvd, a);
  expect_all_close("out", out, out_w, Tolerance{1e-5, 1e-4});
  expect_all_close("lse", lse, lse_w, Tolerance{1e-5, 1e-4});

  const std::vector<float> dout = random_floats(out.size(), 32);
  std::vector<float> d(qkv.size(), 0.0f), d_w(qkv.size(), 0.0f);
  ASSERT_EQ(
      run_attention_backward(kEmulator, d.data(), d.data() + hd, d.data() + hd + kvd, dout.data(),
                             out_w.data(), lse_w.data(), q, q + hd, q + hd + kvd, a, launch),
      0);
  kernels::attention_backward(d_w.data(), d_w.data() + hd, d_w.data() + hd + kvd, dout.data(),
                              out_w.data(), lse_w.data(), q, q + hd, q + hd + kvd, a);
  expect_all_close("dq|dk|dv", d, d_w, Tolerance{1e-5, 2e-4});
}

INSTANTIATE_TEST_SUITE_P(
    Masks, EmulatedMaskedAttention,
    ::testing::Values(
        // A window shorter than a key tile, across query blocks (16 rows each at D 8).
        MaskCase{"Window5", 1, 70, 2, 1, 8, 5, {}},
        // Packed documents, one of them longer than a key tile, GQA, per lane 2.
        MaskCase{"Packed", 2, 45, 4, 2, 40, 0, packed({3, 35, 7, 20, 1, 24})},
        // Both: the window inside the long document.
        MaskCase{"PackedWindow", 1, 80, 2, 2, 16, 9, packed({50, 30})}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(EmulatedModelKernels, PartialRotaryAtPackedPositions) {
  const std::int64_t t = 7, rows = 2 * t, heads = 3, d = 12, rotary = 8, stride = heads * d + 5;
  const std::vector<float> inv_freq = {0.9f, 0.3f, 0.1f, 0.01f};
  std::vector<float> cos(static_cast<std::size_t>(t * rotary / 2)), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), t, rotary / 2, inv_freq.data(), 1.25);
  const std::vector<std::int32_t> positions = packed({4, 5, 5});
  const kernels::RopeShape shape{rows, stride, t, heads, d, rotary, positions.data()};
  std::vector<float> got = random_floats(rows * stride, 33), want = got;
  ASSERT_EQ(run_rope(kEmulator, got.data(), shape, cos.data(), sin.data(), 1.0f), 0);
  kernels::rope_forward(want.data(), shape, cos.data(), sin.data());
  expect_all_close("rope", got, want, Tolerance{1e-6, 1e-5});
  ASSERT_EQ(run_rope(kEmulator, got.data(), shape, cos.data(), sin.data(), -1.0f), 0);
  kernels::rope_backward(want.data(), shape, cos.data(), sin.data());
  expect_all_close("rope backward", got, want, Tolerance{1e-6, 1e-5});
}

TEST(EmulatedModelKernels, PerHeadRmsNormMatchesTheCpu) {
  const std::int64_t rows = 37, heads = 5, d = 40, stride = heads * d + 9;
  const std::vector<float> x = random_floats(rows * stride, 34, -2.0f, 2.0f);
  const std::vector<float> w = random_floats(d, 35, 0.5f, 1.5f);
  std::vector<float> out(x.size(), 0.0f), out_w = out, rstd(rows * heads), rstd_w = rstd;
  ASSERT_EQ(run_rmsnorm_heads_forward(kEmulator, out.data(), rstd.data(), x.data(), w.data(), rows,
                                      heads, d, stride, stride, 1e-6),
            0);
  kernels::rmsnorm_heads_forward(out_w.data(), rstd_w.data(), x.data(), w.data(), rows, heads, d,
                                 stride, stride, 1e-6);
  expect_all_close("out", out, out_w, Tolerance{1e-6, 1e-5});
  expect_all_close("rstd", rstd, rstd_w, Tolerance{1e-6, 1e-5});
  // Several chunks of vectors in the weight gradient's reduction.
  const cuda::ColumnReducePlan plan = cuda::plan_column_reduce(rows * heads, d, 1, 1 << 20);
  ASSERT_GT(plan.chunks, 1);
  std::vector<double> scratch(static_cast<std::size_t>(plan.chunks * d));
  std::vector<float> g = random_floats(x.size(), 36), g_w = g;
  std::vector<float> dw = random_floats(d, 37), dw_w = dw;
  ASSERT_EQ(
      run_rmsnorm_heads_backward(kEmulator, g.data(), dw.data(), x.data(), w.data(), rstd.data(),
                                 rows, heads, d, stride, stride, plan, scratch.data()),
      0);
  kernels::rmsnorm_heads_backward(g_w.data(), dw_w.data(), x.data(), w.data(), rstd.data(), rows,
                                  heads, d, stride, stride);
  expect_all_close("dx", g, g_w, Tolerance{1e-5, 1e-4});
  expect_all_close("dw", dw, dw_w, Tolerance{1e-5, 1e-4});
}

TEST(EmulatedModelKernels, IgnoredTargetsCountForNothing) {
  const std::int64_t rows = 4, vocab = 300;
  const std::vector<std::int32_t> targets = {5, -1, 299, -1};
  std::vector<float> logits = random_floats(rows * vocab, 38, -6.0f, 6.0f), want = logits;
  std::vector<float> losses(rows, 7.0f), losses_w(rows);
  ASSERT_EQ(run_cross_entropy(kEmulator, true, logits.data(), losses.data(), targets.data(), rows,
                              vocab, 0.5f),
            0);
  kernels::cross_entropy_fused(want.data(), losses_w.data(), targets.data(), rows, vocab, 0.5);
  expect_all_close("losses", losses, losses_w, Tolerance{1e-6, 1e-5});
  expect_all_close("gradient", logits, want, Tolerance{1e-7, 2e-5});
  EXPECT_EQ(losses[1], 0.0f);
  EXPECT_EQ(losses[3], 0.0f);
  for (std::int64_t j = 0; j < vocab; ++j)
    ASSERT_EQ(logits[vocab + j], 0.0f) << j;
}

// The loss of logits held in 16 bits alone: one pass for the statistics (a running max and sum),
// one for the gradient written over the logits in the same type. Against the CPU's fused
// cross-entropy of the same values widened: losses within 1e-5 (relative), the gradient within one
// unit in the last place of the CPU's rounded, ignored rows 0; a row of -inf but the target and a
// vocabulary longer than the block's threads (every thread's running max rescaled) included.
TEST(EmulatedModelKernels, CrossEntropyOf16BitLogitsMatchesTheCpusOfTheSameValues) {
  const std::int64_t rows = 5, vocab = 700, ld = 704;  // rows padded to 8 elements, as the head's
  const std::uint16_t pad = 0xffff;  // a NaN in both types: the padding is neither read nor written
  const std::vector<std::int32_t> targets = {5, -1, 699, 0, 350};
  for (const int code : {kCodeBF16, kCodeF16}) {
    const auto type = static_cast<kernels::DType>(code);
    std::vector<float> x = random_floats(rows * vocab, 44, -8.0f, 8.0f);
    for (std::int64_t j = 0; j < vocab; ++j) {  // row 3: the target alone is finite
      if (j != 0) x[static_cast<std::size_t>(3 * vocab + j)] = -INFINITY;
      // row 4: rising, so each thread's max grows at every element it reads
      x[static_cast<std::size_t>(4 * vocab + j)] = -4.0f + 8.0f * static_cast<float>(j) / vocab;
    }
    std::vector<std::uint16_t> packed16(x.size());
    kernels::cast_array(packed16.data(), type, x.data(), kernels::DType::kF32,
                        static_cast<std::int64_t>(x.size()));
    std::vector<float> wide(x.size());
    kernels::cast_array(wide.data(), kernels::DType::kF32, packed16.data(), type,
                        static_cast<std::int64_t>(x.size()));
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows * ld), pad);
    for (std::int64_t r = 0; r < rows; ++r)
      std::copy_n(packed16.begin() + r * vocab, vocab, bits.begin() + r * ld);
    std::vector<float> losses(rows, 7.0f), plain(rows, 7.0f), want_losses(rows);
    std::vector<std::uint16_t> untouched = bits;
    ASSERT_EQ(run_cross_entropy_16(kEmulator, false, untouched.data(), ld, code, plain.data(),
                                   targets.data(), rows, vocab, 0.0f),
              0);
    EXPECT_EQ(untouched, bits) << "the loss alone wrote the logits";
    ASSERT_EQ(run_cross_entropy_16(kEmulator, true, bits.data(), ld, code, losses.data(),
                                   targets.data(), rows, vocab, 0.5f),
              0);
    kernels::cross_entropy_fused(wide.data(), want_losses.data(), targets.data(), rows, vocab, 0.5);
    expect_all_close("losses", losses, want_losses, Tolerance{1e-6, 1e-5});
    expect_all_close("losses without the gradient", plain, want_losses, Tolerance{1e-6, 1e-5});
    EXPECT_EQ(losses[1], 0.0f);
    EXPECT_EQ(losses[3], 0.0f);  // -inf elsewhere: the target's probability is 1
    std::vector<std::uint16_t> want16(x.size());
    kernels::cast_array(want16.data(), type, wide.data(), kernels::DType::kF32,
                        static_cast<std::int64_t>(x.size()));
    const double ulp = code == kCodeBF16 ? 0x1p-7 : 0x1p-10;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < ld; ++j) {
        const std::uint16_t h = bits[static_cast<std::size_t>(r * ld + j)];
        if (j >= vocab) {
          ASSERT_EQ(h, pad) << "code " << code << " row " << r << " padding " << j;
          continue;
        }
        if (r == 1) {
          ASSERT_EQ(h, 0) << "ignored row, column " << j;
          continue;
        }
        float got = 0.0f, want = 0.0f;
        const std::uint16_t w = want16[static_cast<std::size_t>(r * vocab + j)];
        kernels::cast_array(&got, kernels::DType::kF32, &h, type, 1);
        kernels::cast_array(&want, kernels::DType::kF32, &w, type, 1);
        ASSERT_LE(std::fabs(got - want), ulp * std::fabs(want) + 1e-7)
            << "code " << code << " row " << r << " column " << j;
      }
    }
  }
}

TEST(EmulatedModelKernels, PositionEmbeddingGradientAtPackedPositionsIsTheCpusBits) {
  const std::int64_t b = 3, t = 40, c = 300, vocab = 11;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 7 + 1) % vocab);
  const std::vector<std::int32_t> positions = packed({12, 28, 40, 5, 5, 30});
  const std::vector<float> wte = random_floats(vocab * c, 39), wpe = random_floats(t * c, 40);
  std::vector<float> got(static_cast<std::size_t>(b * t * c)), want(got.size());
  ASSERT_EQ(run_embedding_forward(kEmulator, got.data(), tokens.data(), positions.data(),
                                  wte.data(), wpe.data(), b * t, t, c),
            0);
  kernels::embedding_forward(want.data(), tokens.data(), positions.data(), wte.data(), wpe.data(),
                             b * t, t, c);
  expect_bitwise_equal("embedding", got, want);
  const std::vector<float> dout = random_floats(got.size(), 41);
  std::vector<float> dwte = wte, dwte_w = wte, dwpe = wpe, dwpe_w = wpe;
  ASSERT_EQ(run_embedding_backward(kEmulator, dwte.data(), dwpe.data(), dout.data(), tokens.data(),
                                   positions.data(), b * t, t, c, 3),
            0);
  kernels::embedding_backward(dwte_w.data(), dwpe_w.data(), dout.data(), tokens.data(),
                              positions.data(), b * t, t, c, 3);
  expect_bitwise_equal("dwte", dwte, dwte_w);
  expect_bitwise_equal("dwpe", dwpe, dwpe_w);
}

#endif

}  // namespace
}  // namespace strata::cuda_kernels
