// Finite-difference checks of every model op's backward kernel, in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/nn_ops.h"
#include "tests/kernels/grad_check.h"

namespace strata::kernels {
namespace {

using testing::expect_gradient_matches;
using testing::random_vector;
using testing::weighted_sum;
using Vec = std::vector<double>;

TEST(OpGradients, LayerNorm) {
  const std::int64_t n = 6, c = 13;
  Vec x = random_vector(n * c, 1), w = random_vector(c, 2, 0.5, 1.5), b = random_vector(c, 3);
  const Vec weight = random_vector(n * c, 4);
  Vec out(n * c), mean(n), rstd(n);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c,
                      1e-5);
    return weighted_sum(out, weight);
  };
  loss();
  Vec dx(n * c, 0.0), dw(c, 0.0), db(c, 0.0);
  layernorm_backward(dx.data(), dw.data(), db.data(), weight.data(), x.data(), w.data(),
                     mean.data(), rstd.data(), n, c);
  expect_gradient_matches("dx", x, dx, loss);
  expect_gradient_matches("dw", w, dw, loss);
  expect_gradient_matches("db", b, db, loss);
}

TEST(OpGradients, RmsNorm) {
  const std::int64_t n = 5, c = 11;
  Vec x = random_vector(n * c, 5), w = random_vector(c, 6, 0.5, 1.5);
  const Vec weight = random_vector(n * c, 7);
  Vec out(n * c), rstd(n);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, c, 1e-6);
    return weighted_sum(out, weight);
  };
  loss();
  Vec dx(n * c, 0.0), dw(c, 0.0);
  rmsnorm_backward(dx.data(), dw.data(), weight.data(), x.data(), w.data(), rstd.data(), n, c);
  expect_gradient_matches("dx", x, dx, loss);
  expect_gradient_matches("dw", w, dw, loss);
}

TEST(OpGradients, GeluTanh) {
  const std::int64_t n = 64;
  Vec x = random_vector(n, 8, -4.0, 4.0);
  const Vec weight = random_vector(n, 9);
  Vec out(n);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), n);
    return weighted_sum(out, weight);
  };
  Vec dx(n, 0.0);
  gelu_backward(dx.data(), x.data(), weight.data(), n);
  expect_gradient_matches("dx", x, dx, loss);
}

TEST(OpGradients, SwiGlu) {
  const std::int64_t rows = 4, inner = 9;
  Vec gu = random_vector(rows * 2 * inner, 10, -3.0, 3.0);
  const Vec weight = random_vector(rows * inner, 11);
  Vec out(rows * inner);
  auto loss = [&] {
    swiglu_forward(out.data(), gu.data(), rows, inner);
    return weighted_sum(out, weight);
  };
  Vec dgu(rows * 2 * inner, 0.0);
  swiglu_backward(dgu.data(), gu.data(), weight.data(), rows, inner);
  expect_gradient_matches("dgate_up", gu, dgu, loss);
}

TEST(OpGradients, BiasAndResidual) {
  const std::int64_t rows = 7, c = 5;
  Vec x0 = random_vector(rows * c, 12), bias = random_vector(c, 13),
      other = random_vector(rows * c, 14);
  const Vec weight = random_vector(rows * c, 15);
  Vec out(rows * c);
  auto loss = [&] {
    out = x0;
    add_bias(out.data(), bias.data(), rows, c);
    add(out.data(), out.data(), other.data(), rows * c);
    return weighted_sum(out, weight);
  };
  Vec dbias(c, 0.0);
  bias_backward(dbias.data(), weight.data(), rows, c);
  expect_gradient_matches("dbias", bias, dbias, loss);
  expect_gradient_matches("dother", other, weight, loss);
}

TEST(OpGradients, EmbeddingWithRepeatedTokens) {
  const std::int64_t vocab = 6, seq = 4, rows = 12, c = 5;
  const std::vector<std::int32_t> tokens = {1, 3, 3, 0, 5, 1, 1, 2, 3, 4, 0, 1};
  // Packed documents: positions restart inside rows (and the default, r % T).
  const std::vector<std::int32_t> packed = {0, 1, 0, 1, 0, 1, 2, 3, 0, 0, 1, 2};
  for (const std::int32_t* positions : {static_cast<const std::int32_t*>(nullptr), packed.data()}) {
    Vec wte = random_vector(vocab * c, 16), wpe = random_vector(seq * c, 17);
    const Vec weight = random_vector(rows * c, 18);
    Vec out(rows * c);
    auto loss = [&] {
      embedding_forward(out.data(), tokens.data(), positions, wte.data(), wpe.data(), rows, seq, c);
      return weighted_sum(out, weight);
    };
    Vec dwte(vocab * c, 0.0), dwpe(seq * c, 0.0);
    embedding_backward(dwte.data(), dwpe.data(), weight.data(), tokens.data(), positions, rows, seq,
                       c, -1);
    expect_gradient_matches("dwte", wte, dwte, loss);
    expect_gradient_matches("dwpe", wpe, dwpe, loss);
  }
}

TEST(OpGradients, PerHeadRmsNormInPlaceOnStridedRows) {
  const std::int64_t rows = 5, heads = 3, d = 6, stride = heads * d + 4;
  Vec x = random_vector(rows * stride, 40), w = random_vector(d, 41, 0.5, 1.5);
  const Vec weight = random_vector(rows * stride, 42);
  Vec out(rows * stride, 0.0), rstd(rows * heads);
  auto loss = [&] {
    rmsnorm_heads_forward(out.data(), rstd.data(), x.data(), w.data(), rows, heads, d, stride,
                          stride, 1e-6);
    double total = 0.0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < heads * d; ++j)
        total += out[r * stride + j] * weight[r * stride + j];
    return total;
  };
  loss();
  Vec d_inout = weight, dw(d, 0.0);
  rmsnorm_heads_backward(d_inout.data(), dw.data(), x.data(), w.data(), rstd.data(), rows, heads, d,
                         stride, stride);
  // Columns past the heads are neither read nor written: their "gradient" stays the weight, which
  // the finite differences see as 0, so compare the head columns only.
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = heads * d; j < stride; ++j)
      d_inout[r * stride + j] = 0.0;
  expect_gradient_matches("dx", x, d_inout, loss);
  expect_gradient_matches("dw", w, dw, loss);
}

TEST(OpGradients, RotaryEmbeddingOnStridedHeads) {
  const std::int64_t rows = 6, seq = 3, heads = 2, d = 8, stride = heads * d + 5;
  Vec cos(seq * d / 2), sin(seq * d / 2);
  rope_tables(cos.data(), sin.data(), seq, d, 10000.0);
  Vec x = random_vector(rows * stride, 19);
  const Vec weight = random_vector(rows * stride, 20);
  RopeShape shape{rows, stride, seq, heads, d, d, nullptr};
  auto loss = [&] {
    Vec y = x;
    rope_forward(y.data(), shape, cos.data(), sin.data());
    return weighted_sum(y, weight);
  };
  Vec dx = weight;
  rope_backward(dx.data(), shape, cos.data(), sin.data());
  // Columns past the heads pass through unchanged, so their gradient is the weight itself.
  expect_gradient_matches("dx", x, dx, loss);
}

// Phi-3's partial rotary (the first 4 of 8 dimensions turn), packed positions, and tables scaled
// by an attention factor (YaRN / LongRoPE): the backward is still the exact transpose.
TEST(OpGradients, PartialScaledRotaryAtPackedPositions) {
  const std::int64_t rows = 6, seq = 3, heads = 2, d = 8, rotary = 4, stride = heads * d + 1;
  const Vec inv_freq = {0.7, 0.05};
  Vec cos(seq * rotary / 2), sin(seq * rotary / 2);
  rope_tables(cos.data(), sin.data(), seq, rotary / 2, inv_freq.data(), 1.3);
  const std::vector<std::int32_t> positions = {0, 1, 2, 0, 0, 1};
  Vec x = random_vector(rows * stride, 43);
  const Vec weight = random_vector(rows * stride, 44);
  RopeShape shape{rows, stride, seq, heads, d, rotary, positions.data()};
  auto loss = [&] {
    Vec y = x;
    rope_forward(y.data(), shape, cos.data(), sin.data());
    return weighted_sum(y, weight);
  };
  Vec dx = weight;
  rope_backward(dx.data(), shape, cos.data(), sin.data());
  expect_gradient_matches("dx", x, dx, loss);
}

void check_attention_gradients(const AttentionShape& s) {
  const std::int64_t rows = s.batch * s.seq_len;
  Vec q = random_vector(rows * s.q_stride, 21, -2, 2),
      k = random_vector(rows * s.kv_stride, 22, -2, 2), v = random_vector(rows * s.kv_stride, 23);
  const Vec weight = random_vector(rows * s.out_stride, 24);
  Vec out(rows * s.out_stride, 0.0), lse(s.batch * s.heads * s.seq_len);
  auto loss = [&] {
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
    double total = 0.0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < s.heads * s.head_dim; ++j)
        total += out[r * s.out_stride + j] * weight[r * s.out_stride + j];
    return total;
  };
  loss();
  Vec dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  attention_backward(dq.data(), dk.data(), dv.data(), weight.data(), out.data(), lse.data(),
                     q.data(), k.data(), v.data(), s);
  expect_gradient_matches("dq", q, dq, loss, 1e-7, 300);
  expect_gradient_matches("dk", k, dk, loss, 1e-7, 300);
  expect_gradient_matches("dv", v, dv, loss, 1e-7, 300);
}

// A sliding window of 9 over 70 positions, and packed documents (row 0: 30 + 40 tokens, row 1:
// 66 + 4 tokens, crossing the 64-row block boundary), each query only seeing its own keys.
TEST(OpGradients, WindowedAttentionOverPackedDocuments) {
  AttentionShape s;
  s.batch = 2;
  s.seq_len = 70;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 4;
  s.q_stride = s.heads * s.head_dim;
  s.kv_stride = s.kv_heads * s.head_dim;
  s.out_stride = s.heads * s.head_dim;
  s.scale = 0.5;
  s.window = 9;
  check_attention_gradients(s);
  std::vector<std::int32_t> positions;
  for (int doc : {30, 40, 66, 4})
    for (int p = 0; p < doc; ++p)
      positions.push_back(p);
  s.window = 0;
  s.positions = positions.data();
  check_attention_gradients(s);
  s.window = 20;
  check_attention_gradients(s);
}

TEST(OpGradients, CausalAttentionWithGroupedKvHeadsAcrossBlocks) {
  AttentionShape s;
  s.batch = 2;
  s.seq_len = 70;  // crosses the 64-row block boundary
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 8;
  s.q_stride = s.heads * s.head_dim + 3;
  s.kv_stride = s.kv_heads * s.head_dim + 1;
  s.out_stride = s.heads * s.head_dim + 2;
  s.scale = 1.0 / std::sqrt(8.0);
  check_attention_gradients(s);
}

TEST(OpGradients, FusedSoftmaxCrossEntropy) {
  const std::int64_t rows = 5, vocab = 17;
  const std::vector<std::int32_t> targets = {0, 16, -1, 3, 9};  // -1: ignored
  const double grad_scale = 0.37;
  Vec logits = random_vector(rows * vocab, 25, -3, 3);
  Vec losses(rows);
  auto loss = [&] {
    cross_entropy_forward(losses.data(), logits.data(), targets.data(), rows, vocab);
    double total = 0.0;
    for (double l : losses)
      total += l * grad_scale;
    return total;
  };
  const double before = loss();
  Vec grad = logits;
  Vec fused_losses(rows);
  cross_entropy_fused(grad.data(), fused_losses.data(), targets.data(), rows, vocab, grad_scale);
  double fused_total = 0.0;
  for (double l : fused_losses)
    fused_total += l * grad_scale;
  EXPECT_NEAR(fused_total, before, 1e-12);
  EXPECT_EQ(fused_losses[2], 0.0);
  for (std::int64_t j = 0; j < vocab; ++j)
    EXPECT_EQ(grad[2 * vocab + j], 0.0) << j;
  expect_gradient_matches("dlogits", logits, grad, loss);
}

}  // namespace
}  // namespace strata::kernels
