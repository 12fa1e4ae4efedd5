// The tensor-core flash attention's forward pass (kernels/cuda/flash_attention_kernels.cuh) on the
// GPU, launched directly (flash_attention_gputest.cu; the kernel is not behind the backend yet),
// against the CPU attention (kernels/cpu/attention.cc, in double, on the same 16-bit inputs
// widened exactly): bf16 and fp16, head sizes 64 and 128, causal with H == KV and grouped KV heads
// (4:1), T = 1, 77 and 1024, sliding windows and packed documents. Each case runs twice and the
// two runs must give the same bits (out and lse). The bounds are those of
// tests/kernels/flash_attention_emulated_test.cc (see its header), the fp32 slack widened for
// T = 1024 (out_bound below). The emulator test checks the fragment layouts; this one the GPU's
// own mma, ldmatrix and cp.async, and the timing test prints the forward's TFLOP/s at the
// attention shapes of GPT-2 124M and Llama 1.1B (issue 35):
//   flash_forward_tflops shape=<name> dtype=<bf16|fp16> B=.. T=.. H=.. KV=.. D=.. median_ms=..
//   tflops=..
// (one line each; printed, not asserted). The backward
// (kernels/cuda/flash_attention_backward_kernels.cuh) likewise: against kernels::attention_backward
// in double on the same 16-bit Q, K, V, dO, O and fp32 lse (the CPU forward's, rounded), within the
// bound of tests/kernels/flash_attention_backward_emulated_test.cc (backward_bounds in
// flash_attention_test_support.h), bf16 and fp16, head sizes 64 and 128, causal H == KV and 4:1
// grouped KV heads, T = 77 and 1024, a sliding window and packed documents, each run twice for the
// same bits (dq, dk, dv and the fp32 D workspace); and its speed at the same two shapes (FLOPs 2.5
// times the forward's, the usual count: five matrix products, S, dP, dV, dK and dQ, against the
// forward's two; S and dP computed a second time by the dq kernel are not counted):
//   flash_backward_tflops shape=<name> dtype=<bf16|fp16> B=.. T=.. H=.. KV=.. D=.. median_ms=..
//   tflops=..
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/nn_ops.h"
#include "kernels/flash_attention_gputest.h"
#include "kernels/flash_attention_test_support.h"
#include "support/gpu_support.h"

namespace strata {
namespace {

using kernels::testing::backward_bounds;
using kernels::testing::backward_reference;
using kernels::testing::BackwardComparison;
using kernels::testing::BackwardInputs;
using kernels::testing::case_name;
using kernels::testing::compare_backward;
using kernels::testing::FlashCase;
using kernels::testing::forward_bounds;
using kernels::testing::ForwardBounds;
using kernels::testing::from_bits;
using kernels::testing::packed_positions;
using kernels::testing::QkvInputs;
using kernels::testing::random_backward_inputs;
using kernels::testing::random_qkv;
using kernels::testing::shape_of;
using kernels::testing::to_bits;

// The launches of flash_attention_gputest.cu, which exists only with CUDA (without it the tests
// have skipped before getting here).
std::string forward(bool bf16, std::uint16_t* out, float* lse, const std::uint16_t* q,
                    const std::uint16_t* k, const std::uint16_t* v,
                    const kernels::AttentionShape& s) {
#if defined(STRATA_HAVE_CUDA)
  return testing::flash_forward_on_gpu(bf16, out, lse, q, k, v, s);
#else
  (void)bf16, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)s;
  return "built without CUDA";
#endif
}

std::string time_forward(bool bf16, std::uint16_t* out, float* lse, const std::uint16_t* q,
                         const std::uint16_t* k, const std::uint16_t* v,
                         const kernels::AttentionShape& s, int warmup, int runs,
                         std::vector<double>& ms) {
#if defined(STRATA_HAVE_CUDA)
  return testing::time_flash_forward_on_gpu(bf16, out, lse, q, k, v, s, warmup, runs, ms);
#else
  (void)bf16, (void)out, (void)lse, (void)q, (void)k, (void)v, (void)s, (void)warmup, (void)runs,
      (void)ms;
  return "built without CUDA";
#endif
}

std::string backward(bool bf16, std::uint16_t* grad, float* delta, const std::uint16_t* dout,
                     const std::uint16_t* out, const float* lse, const std::uint16_t* q,
                     const kernels::AttentionShape& s) {
  // dq | dk | dv in the layout of q | k | v (`grad` and `q` each one buffer of those columns).
  const std::int64_t hd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
#if defined(STRATA_HAVE_CUDA)
  return testing::flash_backward_on_gpu(bf16, grad, grad + hd, grad + hd + kvd, delta, dout, out,
                                        lse, q, q + hd, q + hd + kvd, s);
#else
  (void)bf16, (void)grad, (void)delta, (void)dout, (void)out, (void)lse, (void)q, (void)s, (void)hd,
      (void)kvd;
  return "built without CUDA";
#endif
}

std::string time_backward(bool bf16, std::uint16_t* grad, float* delta, const std::uint16_t* dout,
                          const std::uint16_t* out, const float* lse, const std::uint16_t* q,
                          const kernels::AttentionShape& s, int warmup, int runs,
                          std::vector<double>& ms) {
  const std::int64_t hd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
#if defined(STRATA_HAVE_CUDA)
  return testing::time_flash_backward_on_gpu(bf16, grad, grad + hd, grad + hd + kvd, delta, dout,
                                             out, lse, q, q + hd, q + hd + kvd, s, warmup, runs,
                                             ms);
#else
  (void)bf16, (void)grad, (void)delta, (void)dout, (void)out, (void)lse, (void)q, (void)s, (void)hd,
      (void)kvd, (void)warmup, (void)runs, (void)ms;
  return "built without CUDA";
#endif
}

class CudaFlashAttention : public ::testing::TestWithParam<FlashCase> {};

TEST_P(CudaFlashAttention, ForwardMatchesTheCpuWithinTheRoundingBoundAndRepeatsItsBits) {
  STRATA_GPU_OR_SKIP(gpu, {});
  const FlashCase& c = GetParam();
  kernels::AttentionShape s = shape_of(c);
  const std::int64_t rows = c.batch * c.seq_len;
  const std::vector<std::int32_t> positions = packed_positions(c);

  // Q in [-4, 4), K and V in [-1, 1) (random_qkv_row), rounded to the 16-bit type; the CPU gets
  // the same values widened.
  const std::int64_t hd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  std::mt19937_64 rng(2000 + static_cast<std::uint64_t>(c.seq_len * 131 + c.head_dim));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const QkvInputs in = random_qkv(c, s, [&] { return unit(rng); });
  const std::vector<std::uint16_t>& qkv = in.bits;

  // Device copies (256-byte aligned); out starts zero (its padding must stay so), lse NaN.
  const std::size_t out_n = static_cast<std::size_t>(rows * s.out_stride);
  const std::size_t lse_n = static_cast<std::size_t>(c.batch * c.heads * c.seq_len);
  backend::Buffer d_qkv = testing::to_device(gpu, qkv);
  backend::Buffer d_positions = testing::to_device(gpu, positions);
  backend::Buffer d_out[2], d_lse[2];
  for (int run = 0; run < 2; ++run) {
    d_out[run] = testing::to_device(gpu, std::vector<std::uint16_t>(out_n, 0));
    d_lse[run] = testing::to_device(gpu, std::vector<float>(lse_n, std::nanf("")));
  }
  ASSERT_TRUE(gpu.synchronize(backend::StreamKind::kCompute).is_ok());
  kernels::AttentionShape ds_shape = s;  // device positions for the GPU, host ones for the CPU
  if (c.packed) {
    ds_shape.positions = d_positions.as<std::int32_t>();
    s.positions = positions.data();
  }
  const std::uint16_t* q = d_qkv.as<std::uint16_t>();
  for (int run = 0; run < 2; ++run) {
    const std::string error = forward(c.bf16, d_out[run].as<std::uint16_t>(),
                                      d_lse[run].as<float>(), q, q + hd, q + hd + kvd, ds_shape);
    ASSERT_EQ(error, "") << "run " << run;
  }
  const std::vector<std::uint16_t> out =
      testing::to_host<std::uint16_t>(gpu, d_out[0].data(), out_n);
  const std::vector<float> lse = testing::to_host<float>(gpu, d_lse[0].data(), lse_n);
  testing::expect_bitwise_equal("out, second run",
                                testing::to_host<std::uint16_t>(gpu, d_out[1].data(), out_n), out);
  testing::expect_bitwise_equal("lse, second run",
                                testing::to_host<float>(gpu, d_lse[1].data(), lse_n), lse);

  std::vector<double> want(out.size(), 0.0), want_lse(lse.size(), 0.0);
  const double* qw = in.wide.data();
  kernels::attention_forward<double>(want.data(), want_lse.data(), qw, qw + hd, qw + hd + kvd, s);

  // The bounds of flash_attention_emulated_test.cc, the fp32 slack widened for long rows
  // (forward_bounds in flash_attention_test_support.h).
  const ForwardBounds bounds = forward_bounds(c, s, qw, in.v_max);
  const double out_bound = bounds.out;

  int out_failures = 0, padding_failures = 0, lse_failures = 0;
  double out_worst = 0.0, lse_worst = 0.0, lse_worst_bound = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = hd; j < s.out_stride; ++j)
      if (out[static_cast<std::size_t>(r * s.out_stride + j)] != 0) ++padding_failures;
    for (std::int64_t j = 0; j < hd; ++j) {
      const auto at = static_cast<std::size_t>(r * s.out_stride + j);
      const double error = std::abs(from_bits(out[at], c.bf16) - want[at]);
      if (!(error <= out_bound)) {
        if (++out_failures <= 3) {
          ADD_FAILURE() << "out[row " << r << ", column " << j << "]: got "
                        << from_bits(out[at], c.bf16) << ", want " << want[at] << " (bound "
                        << out_bound << ")";
        }
      } else {
        out_worst = std::max(out_worst, error);
      }
    }
  }
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const double bound = bounds.lse(want_lse[i]);
    const double error = std::abs(static_cast<double>(lse[i]) - want_lse[i]);
    if (!(error <= bound)) {
      if (++lse_failures <= 3) {
        ADD_FAILURE() << "lse[" << i << "]: got " << lse[i] << ", want " << want_lse[i]
                      << " (bound " << bound << ")";
      }
    } else if (lse_worst_bound == 0.0 || error / bound > lse_worst / lse_worst_bound) {
      lse_worst = error;
      lse_worst_bound = bound;
    }
  }
  EXPECT_EQ(out_failures, 0) << "out elements over the bound " << out_bound;
  EXPECT_EQ(padding_failures, 0) << "out padding elements written";
  EXPECT_EQ(lse_failures, 0) << "lse values over their bound";
  std::printf(
      "[ flash    ] %s: out |err| max %.3g (bound %.3g, %.2f of it); lse |err| %.3g "
      "(bound %.3g)\n",
      case_name(c).c_str(), out_worst, out_bound, out_worst / out_bound, lse_worst,
      lse_worst_bound);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaFlashAttention,
    ::testing::Values(
        // causal, H == KV heads
        FlashCase{true, 1, 1, 2, 2, 64, 0, false}, FlashCase{false, 1, 1, 1, 1, 128, 0, false},
        FlashCase{true, 2, 77, 2, 2, 64, 0, false}, FlashCase{false, 2, 77, 2, 2, 64, 0, false},
        FlashCase{true, 1, 77, 2, 2, 128, 0, false}, FlashCase{false, 1, 77, 2, 2, 128, 0, false},
        FlashCase{true, 1, 1024, 4, 4, 64, 0, false},
        FlashCase{false, 1, 1024, 2, 2, 128, 0, false},
        // grouped KV heads, 4:1
        FlashCase{false, 1, 1, 4, 1, 64, 0, false}, FlashCase{true, 1, 77, 8, 2, 64, 0, false},
        FlashCase{false, 2, 77, 4, 1, 128, 0, false}, FlashCase{true, 1, 1024, 4, 1, 128, 0, false},
        FlashCase{false, 1, 1024, 8, 2, 64, 0, false},
        // sliding window, packed documents, both
        FlashCase{true, 1, 1024, 4, 1, 64, 100, false},
        FlashCase{false, 1, 77, 2, 2, 128, 30, false}, FlashCase{true, 1, 1024, 4, 1, 128, 0, true},
        FlashCase{false, 2, 77, 4, 1, 64, 0, true}, FlashCase{false, 1, 1024, 2, 2, 64, 40, true}),
    [](const auto& info) { return case_name(info.param); });

class CudaFlashAttentionBackward : public ::testing::TestWithParam<FlashCase> {};

TEST_P(CudaFlashAttentionBackward, MatchesTheCpuWithinTheRoundingBoundAndRepeatsItsBits) {
  STRATA_GPU_OR_SKIP(gpu, {});
  const FlashCase& c = GetParam();
  kernels::AttentionShape s = shape_of(c);
  const std::vector<std::int32_t> positions = packed_positions(c);
  if (c.packed) s.positions = positions.data();  // host positions for the CPU

  // The inputs of flash_attention_backward_emulated_test.cc (its seeds too): Q in [-4, 4), K, V,
  // dO in [-1, 1), the CPU forward's O and lse, all rounded as the kernel takes them.
  std::mt19937_64 rng(7000 + static_cast<std::uint64_t>(c.seq_len * 131 + c.head_dim + c.heads));
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const BackwardInputs in = random_backward_inputs(c, s, [&] { return unit(rng); });

  // Device copies (256-byte aligned); the gradients start zero (their padding must stay so), the
  // D workspace NaN.
  const std::size_t grad_n = in.qkv_bits.size(), delta_n = in.lse.size();
  backend::Buffer d_qkv = testing::to_device(gpu, in.qkv_bits);
  backend::Buffer d_dout = testing::to_device(gpu, in.dout_bits);
  backend::Buffer d_out = testing::to_device(gpu, in.out_bits);
  backend::Buffer d_lse = testing::to_device(gpu, in.lse);
  backend::Buffer d_positions = testing::to_device(gpu, positions);
  backend::Buffer d_grad[2], d_delta[2];
  for (int run = 0; run < 2; ++run) {
    d_grad[run] = testing::to_device(gpu, std::vector<std::uint16_t>(grad_n, 0));
    d_delta[run] = testing::to_device(gpu, std::vector<float>(delta_n, std::nanf("")));
  }
  ASSERT_TRUE(gpu.synchronize(backend::StreamKind::kCompute).is_ok());
  kernels::AttentionShape ds_shape = s;  // device positions for the GPU
  if (c.packed) ds_shape.positions = d_positions.as<std::int32_t>();
  for (int run = 0; run < 2; ++run) {
    const std::string error =
        backward(c.bf16, d_grad[run].as<std::uint16_t>(), d_delta[run].as<float>(),
                 d_dout.as<std::uint16_t>(), d_out.as<std::uint16_t>(), d_lse.as<float>(),
                 d_qkv.as<std::uint16_t>(), ds_shape);
    ASSERT_EQ(error, "") << "run " << run;
  }
  const std::vector<std::uint16_t> grad =
      testing::to_host<std::uint16_t>(gpu, d_grad[0].data(), grad_n);
  testing::expect_bitwise_equal("dq | dk | dv, second run",
                                testing::to_host<std::uint16_t>(gpu, d_grad[1].data(), grad_n),
                                grad);
  testing::expect_bitwise_equal("D workspace, second run",
                                testing::to_host<float>(gpu, d_delta[1].data(), delta_n),
                                testing::to_host<float>(gpu, d_delta[0].data(), delta_n));

  const std::vector<double> want = backward_reference(c, s, in);
  const BackwardComparison res =
      compare_backward(c, s, grad, want, backward_bounds(c, s, in, want));
  for (const std::string& failure : res.first_failures)
    ADD_FAILURE() << failure;
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
    Shapes, CudaFlashAttentionBackward,
    ::testing::Values(
        // causal, H == KV heads
        FlashCase{true, 2, 77, 2, 2, 64, 0, false}, FlashCase{false, 1, 77, 2, 2, 128, 0, false},
        FlashCase{false, 1, 1024, 2, 2, 64, 0, false},
        FlashCase{true, 1, 1024, 2, 2, 128, 0, false},
        // grouped KV heads, 4:1
        FlashCase{false, 1, 77, 4, 1, 64, 0, false}, FlashCase{true, 2, 77, 4, 1, 128, 0, false},
        FlashCase{true, 1, 1024, 4, 1, 64, 0, false},
        FlashCase{false, 1, 1024, 4, 1, 128, 0, false},
        // sliding window, packed documents, both
        FlashCase{true, 1, 1024, 4, 1, 64, 100, false},
        FlashCase{false, 1, 77, 2, 2, 128, 30, false}, FlashCase{true, 1, 1024, 4, 1, 128, 0, true},
        FlashCase{false, 2, 77, 4, 1, 64, 0, true}, FlashCase{false, 1, 1024, 2, 2, 64, 40, true}),
    [](const auto& info) { return case_name(info.param); });

// The attention shapes of issue 35's rows, timed causal with D = 64 over T = 1024 tokens.
struct Timed {
  const char* name;
  std::int64_t batch, heads, kv_heads;
};
constexpr std::int64_t kTimedT = 1024, kTimedD = 64;
constexpr Timed kTimedShapes[] = {{"gpt2-124m", 8, 12, 12}, {"llama-1.1b", 4, 32, 8}};

// The layout of a timed shape: fused q|k|v rows without padding, as the model lays them out.
kernels::AttentionShape timed_shape(const Timed& t, bool bf16) {
  kernels::AttentionShape s =
      shape_of(FlashCase{bf16, t.batch, kTimedT, t.heads, t.kv_heads, kTimedD, 0, false});
  s.q_stride = s.kv_stride = (t.heads + 2 * t.kv_heads) * kTimedD;
  s.out_stride = t.heads * kTimedD;
  return s;
}

// n 16-bit values uniform in [-1, 1), drawn from rng.
std::vector<std::uint16_t> random_bits(std::size_t n, bool bf16, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<std::uint16_t> v(n);
  for (std::uint16_t& x : v)
    x = to_bits(unit(rng), bf16);
  return v;
}

// One `<prefix> shape=... tflops=...` line from 10 timed runs of `flops` each (their median).
void print_tflops(const char* prefix, const Timed& t, bool bf16, std::vector<double> ms,
                  double flops) {
  ASSERT_EQ(ms.size(), 10u);
  std::sort(ms.begin(), ms.end());
  const double median_ms = (ms[4] + ms[5]) / 2.0;
  std::printf(
      "%s shape=%s dtype=%s B=%lld T=%lld H=%lld KV=%lld D=%lld median_ms=%.4f tflops=%.2f\n",
      prefix, t.name, bf16 ? "bf16" : "fp16", static_cast<long long>(t.batch),
      static_cast<long long>(kTimedT), static_cast<long long>(t.heads),
      static_cast<long long>(t.kv_heads), static_cast<long long>(kTimedD), median_ms,
      flops / (median_ms * 1e-3) / 1e12);
}

// The forward's FLOPs at a timed shape: 4 B H T^2 D / 2 (the two matrix products, half of them
// masked).
double forward_flops(const Timed& t) {
  return 4.0 * static_cast<double>(t.batch * t.heads) * static_cast<double>(kTimedT) *
         static_cast<double>(kTimedT) * static_cast<double>(kTimedD) / 2.0;
}

// The forward's speed at the attention shapes of issue 35's rows: the median of 10 timed runs
// after 3 warm-up ones. Printed, not asserted.
TEST(CudaFlashAttentionTiming, PrintsForwardTflopsAtTheGpt2AndLlamaShapes) {
  STRATA_GPU_OR_SKIP(gpu, {});
  for (const Timed& t : kTimedShapes) {
    for (const bool bf16 : {true, false}) {
      const kernels::AttentionShape s = timed_shape(t, bf16);
      const std::int64_t rows = t.batch * kTimedT;
      std::mt19937_64 rng(7);
      backend::Buffer d_qkv = testing::to_device(
          gpu, random_bits(static_cast<std::size_t>(rows * s.q_stride), bf16, rng));
      backend::Buffer d_out = testing::to_device(
          gpu, std::vector<std::uint16_t>(static_cast<std::size_t>(rows * s.out_stride), 0));
      backend::Buffer d_lse = testing::to_device(
          gpu, std::vector<float>(static_cast<std::size_t>(t.batch * t.heads * kTimedT), 0.0f));
      ASSERT_TRUE(gpu.synchronize(backend::StreamKind::kCompute).is_ok());
      const std::uint16_t* q = d_qkv.as<std::uint16_t>();
      const std::int64_t hd = t.heads * kTimedD, kvd = t.kv_heads * kTimedD;
      std::vector<double> ms;
      const std::string error = time_forward(bf16, d_out.as<std::uint16_t>(), d_lse.as<float>(), q,
                                             q + hd, q + hd + kvd, s, 3, 10, ms);
      ASSERT_EQ(error, "") << t.name;
      print_tflops("flash_forward_tflops", t, bf16, ms, forward_flops(t));
    }
  }
}

// The backward's speed at the same shapes: O and lse from the GPU forward, dO random in [-1, 1);
// FLOPs = 2.5 times the forward's, the median of 10 timed runs (all three kernels of the pass)
// after 3 warm-up ones. Printed, not asserted.
TEST(CudaFlashAttentionTiming, PrintsBackwardTflopsAtTheGpt2AndLlamaShapes) {
  STRATA_GPU_OR_SKIP(gpu, {});
  for (const Timed& t : kTimedShapes) {
    for (const bool bf16 : {true, false}) {
      const kernels::AttentionShape s = timed_shape(t, bf16);
      const std::int64_t rows = t.batch * kTimedT;
      std::mt19937_64 rng(7);
      const std::vector<std::uint16_t> qkv =
          random_bits(static_cast<std::size_t>(rows * s.q_stride), bf16, rng);
      const std::vector<std::uint16_t> dout =
          random_bits(static_cast<std::size_t>(rows * s.out_stride), bf16, rng);
      const auto lse_n = static_cast<std::size_t>(t.batch * t.heads * kTimedT);
      backend::Buffer d_qkv = testing::to_device(gpu, qkv);
      backend::Buffer d_dout = testing::to_device(gpu, dout);
      backend::Buffer d_out = testing::to_device(gpu, std::vector<std::uint16_t>(dout.size(), 0));
      backend::Buffer d_lse = testing::to_device(gpu, std::vector<float>(lse_n, 0.0f));
      backend::Buffer d_grad = testing::to_device(gpu, std::vector<std::uint16_t>(qkv.size(), 0));
      backend::Buffer d_delta = testing::to_device(gpu, std::vector<float>(lse_n, 0.0f));
      ASSERT_TRUE(gpu.synchronize(backend::StreamKind::kCompute).is_ok());
      const std::uint16_t* q = d_qkv.as<std::uint16_t>();
      const std::int64_t hd = t.heads * kTimedD, kvd = t.kv_heads * kTimedD;
      std::string error =
          forward(bf16, d_out.as<std::uint16_t>(), d_lse.as<float>(), q, q + hd, q + hd + kvd, s);
      ASSERT_EQ(error, "") << t.name << " forward";
      std::vector<double> ms;
      error = time_backward(bf16, d_grad.as<std::uint16_t>(), d_delta.as<float>(),
                            d_dout.as<std::uint16_t>(), d_out.as<std::uint16_t>(),
                            d_lse.as<float>(), q, s, 3, 10, ms);
      ASSERT_EQ(error, "") << t.name;
      print_tflops("flash_backward_tflops", t, bf16, ms, 2.5 * forward_flops(t));
    }
  }
}

}  // namespace
}  // namespace strata
