// Every Ops<float> kernel of the CUDA backend against the CPU backend's on the same seeded inputs
// (ggml's test-backend-ops, in spirit): element-wise kernels and the embedding backward agree bit
// for bit, the rest within fp32 tolerances that fail on NaN. GEMMs: cuda_gemm_gputest.cc.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "kernels/cpu/float16.h"
#include "kernels/cpu/nn_ops.h"
#include "support/gpu_support.h"

namespace strata::backend {
namespace {

using testing::expect_all_close;
using testing::expect_bitwise_equal;
using testing::kFp32Elementwise;
using testing::kFp32Reduction;
using testing::random_floats;
using testing::to_device;
using testing::to_host;
using testing::Tolerance;

enum Side { kCpu = 0, kGpu = 1 };

// The same data in both backends' device memory.
struct Pair {
  Buffer buffer[2];
  std::size_t n = 0;
  float* operator()(Side side) { return buffer[side].as<float>(); }
  std::int32_t* ints(Side side) { return buffer[side].as<std::int32_t>(); }
};

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    made_ = testing::make_gpu_backend();
    if (!made_.backend) GTEST_SKIP() << "no GPU: " << made_.skip_reason;
    cpu_ = testing::make_reference_backend();
  }
  Backend& backend(Side side) { return side == kCpu ? *cpu_ : *made_.backend; }

  template <typename T>
  Pair pair(const std::vector<T>& values) {
    Pair p;
    p.buffer[kCpu] = to_device(*cpu_, values);
    p.buffer[kGpu] = to_device(*made_.backend, values);
    p.n = values.size();
    return p;
  }
  Pair random(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    return pair(random_floats(n, seed, lo, hi));
  }
  // Runs fn(ops, side) on the CPU, then on the GPU.
  template <typename Fn>
  void both(const Fn& fn) {
    fn(cpu_->ops_f32(), kCpu);
    fn(made_.backend->ops_f32(), kGpu);
  }
  std::vector<float> host(Side side, Pair& p) {
    return to_host<float>(backend(side), p(side), p.n);
  }
  void expect_close(const std::string& what, Pair& p, Tolerance tol) {
    expect_all_close(what, host(kGpu, p), host(kCpu, p), tol);
  }
  void expect_same(const std::string& what, Pair& p) {
    expect_bitwise_equal(what, host(kGpu, p), host(kCpu, p));
  }

  testing::GpuBackend made_;
  std::unique_ptr<Backend> cpu_;
};

TEST_F(CudaOpsTest, EmbeddingForwardIsExact) {
  const std::int64_t b = 3, t = 17, c = 70, vocab = 50;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 7) % vocab);
  Pair ids = pair(tokens);
  Pair wte = random(vocab * c, 1), wpe = random(t * c, 2), out = random(b * t * c, 3);
  both([&](Ops<float>& ops, Side s) {
    ops.embedding_forward(out(s), ids.ints(s), nullptr, wte(s), wpe(s), b * t, t, c);
  });
  expect_same("gpt2 embedding", out);
  both([&](Ops<float>& ops, Side s) {
    ops.embedding_forward(out(s), ids.ints(s), nullptr, wte(s), nullptr, b * t, t, c);
  });
  expect_same("llama embedding", out);
}

TEST_F(CudaOpsTest, EmbeddingBackwardAddsRepeatedTokensInRowOrder) {
  // 600 rows over 20 tokens: every token repeats, and rows span several 256-row scan rounds.
  const std::int64_t b = 4, t = 150, c = 1100, vocab = 20;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * i + 3) % vocab);
  Pair ids = pair(tokens);
  Pair dout = random(b * t * c, 4), dwte = random(vocab * c, 5), dwpe = random(t * c, 6);
  both([&](Ops<float>& ops, Side s) {
    ops.embedding_backward(dwte(s), dwpe(s), dout(s), ids.ints(s), nullptr, b * t, t, c, -1);
  });
  expect_same("dwte", dwte);
  expect_same("dwpe", dwpe);
}

TEST_F(CudaOpsTest, LayerNormForwardAndBackward) {
  const std::int64_t n = 67, c = 769;
  Pair x = random(n * c, 10, -3.0f, 5.0f), w = random(c, 11), bias = random(c, 12);
  Pair out = random(n * c, 13), mean = random(n, 14), rstd = random(n, 15);
  both([&](Ops<float>& ops, Side s) {
    ops.layernorm_forward(out(s), mean(s), rstd(s), x(s), w(s), bias(s), n, c, 1e-5);
  });
  expect_close("out", out, kFp32Elementwise);
  expect_close("mean", mean, kFp32Elementwise);
  expect_close("rstd", rstd, kFp32Elementwise);
  Pair dout = random(n * c, 16), dx = random(n * c, 17), dw = random(c, 18), db = random(c, 19);
  both([&](Ops<float>& ops, Side s) {
    ops.layernorm_backward(dx(s), dw(s), db(s), dout(s), x(s), w(s), mean(s), rstd(s), n, c);
  });
  expect_close("dx", dx, kFp32Reduction);
  expect_close("dw", dw, kFp32Reduction);
  expect_close("db", db, kFp32Reduction);
}

TEST_F(CudaOpsTest, RmsNormForwardAndBackward) {
  const std::int64_t n = 300, c = 4096;
  Pair x = random(n * c, 20, -2.0f, 2.0f), w = random(c, 21), out = random(n * c, 22);
  Pair rstd = random(n, 23);
  both([&](Ops<float>& ops, Side s) {
    ops.rmsnorm_forward(out(s), rstd(s), x(s), w(s), n, c, 1e-6);
  });
  expect_close("out", out, kFp32Elementwise);
  expect_close("rstd", rstd, kFp32Elementwise);
  Pair dout = random(n * c, 24), dx = random(n * c, 25), dw = random(c, 26);
  both([&](Ops<float>& ops, Side s) {
    ops.rmsnorm_backward(dx(s), dw(s), dout(s), x(s), w(s), rstd(s), n, c);
  });
  expect_close("dx", dx, kFp32Reduction);
  expect_close("dw", dw, kFp32Reduction);
}

TEST_F(CudaOpsTest, GeluForwardAndBackward) {
  const std::int64_t n = 100003;
  Pair x = random(n, 30, -6.0f, 6.0f), out = random(n, 31), dout = random(n, 32);
  Pair dx = random(n, 33);
  both([&](Ops<float>& ops, Side s) {
    ops.gelu_forward(out(s), x(s), n);
    ops.gelu_backward(dx(s), x(s), dout(s), n);
  });
  expect_close("gelu", out, kFp32Elementwise);
  expect_close("dx", dx, kFp32Elementwise);
}

TEST_F(CudaOpsTest, SwigluForwardAndBackward) {
  const std::int64_t rows = 33, inner = 1000;
  Pair gate_up = random(rows * 2 * inner, 40, -8.0f, 8.0f), out = random(rows * inner, 41);
  Pair dout = random(rows * inner, 42), dgu = random(rows * 2 * inner, 43);
  both([&](Ops<float>& ops, Side s) {
    ops.swiglu_forward(out(s), gate_up(s), rows, inner);
    ops.swiglu_backward(dgu(s), gate_up(s), dout(s), rows, inner);
  });
  expect_close("swiglu", out, kFp32Elementwise);
  expect_close("dgate_up", dgu, kFp32Elementwise);
}

TEST_F(CudaOpsTest, ResidualAddBiasAndBiasGradient) {
  const std::int64_t rows = 129, c = 3 * 768;
  Pair a = random(rows * c, 50), b = random(rows * c, 51), bias = random(c, 52);
  both([&](Ops<float>& ops, Side s) {
    ops.add(a(s), a(s), b(s), rows * c);
    ops.add_bias(a(s), bias(s), rows, c);
  });
  expect_same("add + bias", a);
  Pair dbias = random(c, 53);
  both([&](Ops<float>& ops, Side s) { ops.bias_backward(dbias(s), b(s), rows, c); });
  expect_close("dbias", dbias, kFp32Reduction);
}

// A device-homed gradient rounded to 16 bits and added in one kernel: the CPU's bits, assigned
// then added, bf16 and fp16, aligned and one float off.
TEST_F(CudaOpsTest, AddRoundedIsTheCpusBits) {
  const std::int64_t n = 100003;
  for (const DType type : {DType::kBF16, DType::kF16}) {
    Pair acc = random(n + 1, 54), g = random(n + 1, 55, -70000.0f, 70000.0f);
    both([&](Ops<float>& ops, Side s) {
      ops.add_rounded(acc(s), g(s), type, n, true);
      ops.add_rounded(acc(s), g(s) + 1, type, n, false);
      ops.add_rounded(acc(s) + 1, g(s), type, n, false);
    });
    expect_same(type == DType::kBF16 ? "add_rounded bf16" : "add_rounded fp16", acc);
  }
}

TEST_F(CudaOpsTest, RotaryEmbeddingOnStridedHeads) {
  const std::int64_t t = 37, rows = 2 * t, heads = 3, d = 64, stride = heads * d + 2 * 2 * d + 5;
  std::vector<float> cos(static_cast<std::size_t>(t * d / 2)), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), t, d, 10000.0);
  Pair pc = pair(cos), ps = pair(sin), x = random(rows * stride, 60);
  both([&](Ops<float>& ops, Side s) {
    ops.rope_forward(x(s), kernels::RopeShape{rows, stride, t, heads, d, d, nullptr}, pc(s), ps(s));
  });
  expect_close("rope", x, kFp32Elementwise);
  both([&](Ops<float>& ops, Side s) {
    ops.rope_backward(x(s) + heads * d, kernels::RopeShape{rows, stride, t, 2, d, d, nullptr},
                      pc(s), ps(s));
  });
  expect_close("rope backward", x, kFp32Elementwise);
}

TEST_F(CudaOpsTest, CrossEntropyPlainAndFused) {
  for (std::int64_t vocab : {std::int64_t{7}, std::int64_t{50257}}) {
    const std::int64_t rows = 37;
    std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
    for (std::size_t i = 0; i < targets.size(); ++i)
      targets[i] = static_cast<std::int32_t>((i * 131) % static_cast<std::size_t>(vocab));
    Pair ids = pair(targets), logits = random(rows * vocab, 70, -8.0f, 8.0f);
    Pair losses = random(rows, 71);
    both([&](Ops<float>& ops, Side s) {
      ops.cross_entropy_forward(losses(s), logits(s), ids.ints(s), rows, vocab);
    });
    expect_close("losses", losses, kFp32Elementwise);
    both([&](Ops<float>& ops, Side s) {
      ops.cross_entropy_fused(logits(s), losses(s), ids.ints(s), rows, vocab, 1.0 / 37.0);
    });
    expect_close("fused losses", losses, kFp32Elementwise);
    // lse may differ by an ulp (double sums in another order), which moves every probability by
    // ~2e-6 relative; the target's (p - 1) * g then differs by ~2e-6 * g absolute.
    expect_close("gradient", logits, Tolerance{1e-7, 2e-5});
  }
}

TEST_F(CudaOpsTest, IgnoredTargetsGiveZeroLossAndGradient) {
  const std::int64_t rows = 9, vocab = 1000;
  std::vector<std::int32_t> targets = {3, -1, 999, -1, -1, 0, 7, -1, 500};
  Pair ids = pair(targets), logits = random(rows * vocab, 72, -8.0f, 8.0f);
  Pair losses = random(rows, 73);
  both([&](Ops<float>& ops, Side s) {
    ops.cross_entropy_fused(logits(s), losses(s), ids.ints(s), rows, vocab, 0.25);
  });
  expect_close("losses", losses, kFp32Elementwise);
  expect_close("gradient", logits, Tolerance{1e-7, 2e-5});
  const std::vector<float> grad = host(kGpu, logits);
  for (std::int64_t j = 0; j < vocab; ++j)
    ASSERT_EQ(grad[static_cast<std::size_t>(vocab + j)], 0.0f) << j;
}

// GPT-2's position embedding and RoPE at packed positions; Qwen3's per-head norm.
TEST_F(CudaOpsTest, PackedPositionsAndPerHeadNorm) {
  const std::int64_t b = 2, t = 50, c = 70, vocab = 30;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b * t)), positions;
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 11) % vocab);
  for (int length : {20, 30, 7, 43})
    for (int p = 0; p < length; ++p)
      positions.push_back(p);
  Pair ids = pair(tokens), pos = pair(positions);
  Pair wte = random(vocab * c, 90), wpe = random(t * c, 91), out = random(b * t * c, 92);
  both([&](Ops<float>& ops, Side s) {
    ops.embedding_forward(out(s), ids.ints(s), pos.ints(s), wte(s), wpe(s), b * t, t, c);
  });
  expect_same("embedding", out);
  Pair dout = random(b * t * c, 93);
  both([&](Ops<float>& ops, Side s) {
    ops.embedding_backward(wte(s), wpe(s), dout(s), ids.ints(s), pos.ints(s), b * t, t, c, 7);
  });
  expect_same("dwte", wte);
  expect_same("dwpe", wpe);

  const std::int64_t heads = 4, d = 128, rotary = 96, stride = heads * d + 3;
  std::vector<float> inv_freq(static_cast<std::size_t>(rotary / 2));
  for (std::size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / rotary);
  std::vector<float> cos(static_cast<std::size_t>(t * rotary / 2)), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), t, rotary / 2, inv_freq.data(), 1.1);
  Pair pc = pair(cos), ps = pair(sin), x = random(b * t * stride, 94);
  both([&](Ops<float>& ops, Side s) {
    const kernels::RopeShape shape{b * t, stride, t, heads, d, rotary, pos.ints(s)};
    ops.rope_forward(x(s), shape, pc(s), ps(s));
    ops.rope_backward(x(s) + d, kernels::RopeShape{b * t, stride, t, 1, d, rotary, pos.ints(s)},
                      pc(s), ps(s));
  });
  expect_close("rope", x, kFp32Elementwise);

  Pair w = random(d, 95), normed = random(b * t * stride, 96), rstd = random(b * t * heads, 97);
  both([&](Ops<float>& ops, Side s) {
    ops.rmsnorm_heads_forward(normed(s), rstd(s), x(s), w(s), b * t, heads, d, stride, stride,
                              1e-6);
  });
  expect_close("per-head norm", normed, kFp32Elementwise);
  expect_close("per-head rstd", rstd, kFp32Elementwise);
  Pair g = random(b * t * stride, 98), dw = random(d, 99);
  both([&](Ops<float>& ops, Side s) {
    ops.rmsnorm_heads_backward(g(s), dw(s), x(s), w(s), rstd(s), b * t, heads, d, stride, stride);
  });
  expect_close("per-head norm dx", g, kFp32Reduction);
  expect_close("per-head norm dw", dw, kFp32Reduction);
}

TEST_F(CudaOpsTest, SumsAreDoublePrecision) {
  const std::int64_t n = 1'000'007;
  Pair x = random(n, 80);
  double sum[2], squares[2];
  both([&](Ops<float>& ops, Side s) {
    sum[s] = ops.sum(x(s), n);
    squares[s] = ops.sum_squares(x(s), n);
  });
  EXPECT_NEAR(sum[kGpu], sum[kCpu], 1e-9 * n);
  EXPECT_NEAR(squares[kGpu], squares[kCpu], 1e-12 * squares[kCpu]);
  EXPECT_EQ(made_.backend->ops_f32().sum(x(kGpu), 0), 0.0);
}

TEST_F(CudaOpsTest, ScaleZeroAndCopy) {
  const std::int64_t n = 70001;
  Pair x = random(n, 90), y = random(n, 91);
  both([&](Ops<float>& ops, Side s) {
    ops.scale(x(s), n, 0.37);
    ops.copy(y(s), x(s), n - 1);
    ops.zero(x(s) + 5, 1000);
  });
  expect_same("scaled, zeroed", x);
  expect_same("copied", y);
}

TEST_F(CudaOpsTest, CastsAreBitExactIncludingSpecialValues) {
  std::vector<float> values = random_floats(10000, 100, -70000.0f, 70000.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            1e-40f,
                            -3e-42f,
                            5.96e-8f,
                            2.98e-8f,
                            65504.0f,
                            65520.0f,
                            65519.99f,
                            3.0e38f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7f812345u),
                            std::bit_cast<float>(0xffc00001u)};
  values.insert(values.begin(), std::begin(specials), std::end(specials));
  const auto n = static_cast<std::int64_t>(values.size());
  Pair src = pair(values);
  for (DType type : {DType::kBF16, DType::kF16}) {
    Pair narrow = pair(std::vector<std::uint16_t>(values.size() + 1, 0));
    Pair wide = random(values.size(), 101);
    both([&](Ops<float>& ops, Side s) {
      ops.cast_to(narrow.buffer[s].data(), type, src(s), n);
      ops.cast_from(wide(s), narrow.buffer[s].data(), type, n);
    });
    expect_bitwise_equal(std::string("to ") + kernels::to_string(type),
                         to_host<std::uint16_t>(*made_.backend, narrow.buffer[kGpu].data(), n),
                         to_host<std::uint16_t>(*cpu_, narrow.buffer[kCpu].data(), n));
    expect_same(std::string("from ") + kernels::to_string(type), wide);
  }
  // Every fp16 bit pattern widens exactly (subnormals, NaN payloads).
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<std::uint16_t>(i);
  Pair halves = pair(all);
  Pair widened = random(all.size(), 102);
  both([&](Ops<float>& ops, Side s) {
    ops.cast_from(widened(s), halves.buffer[s].data(), DType::kF16, 65536);
  });
  expect_same("every fp16", widened);
}

}  // namespace
}  // namespace strata::backend
