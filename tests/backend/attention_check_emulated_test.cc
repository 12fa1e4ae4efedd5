// The flash-attention fast path's start-up check (backend/attention_check.h) on the CPU backend,
// with the CUDA backend's own fp32-in / fp32-out flash path (kernels/cuda/flash_attention_f32.cuh:
// the 16-bit rounding into the workspace, passes of batch rows, the flash kernels, the widening
// back) run by the SIMT emulator: the real path passes, in bf16 and fp16, also when the workspace
// holds one batch row per pass; a mutated kernel (a wrong fragment index), a path that returns an
// error, one that writes padding and one that is right forward but wrong backward all fail, each
// with a message naming what; a different correct implementation (the CPU's fp32 kernels) passes.
// The same staging with another 16-bit attention inside (the role cuDNN's fused attention plays,
// kernels/cuda/cudnn_sdpa.h: run_attention16_*_f32 with its own inner calls), here a host one:
// passes on the cases without packed documents, also over several passes; one that writes the
// log-sum-exp in base 2, or reads the wrong KV head of a group, fails. An output kept in 16 bits
// alone (a null out, its companion alone) gets the bits of the companion written beside an fp32
// output, through the flash epilogue and through another 16-bit attention alike.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/flash_attention_f32.cuh"
//
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/attention_check.h"
#include "backend/cpu/cpu_backend.h"
#include "kernels/cpu/float16.h"
#include "kernels/cpu/nn_ops.h"
#include "support/cpu_backend_support.h"
#include "support/emulated_launch.h"

namespace strata::backend {
namespace {

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer does not follow the emulator's fiber stacks (ucontext) reliably.
TEST(AttentionCheck, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

namespace ck = cuda_kernels;
const simt::Launcher kEmulator;

std::unique_ptr<Backend> cpu_backend() {
  return testing::small_cpu_backend(256ull << 20);
}

using testing::emulated_launched;

// The flash path on fp32 arrays as the CUDA backend runs it, under the emulator, with a workspace
// of `elements` 16-bit elements (kFault: the tests' mutated kernel).
template <typename E, ck::FlashFault kFault = ck::FlashFault::kNone>
AttentionPath emulated_flash(std::vector<std::uint16_t>* workspace) {
  AttentionPath path;
  path.forward = [workspace](float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttentionShape& s) {
    EXPECT_TRUE(ck::flash_f32_supported(s, static_cast<std::int64_t>(workspace->size())));
    return emulated_launched(
        ck::run_flash_attention_forward_f32<E, kFault>(kEmulator, workspace->data(),
                                                       static_cast<std::int64_t>(workspace->size()),
                                                       out, lse, q, k, v, s),
        "forward");
  };
  path.backward = [workspace](float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const AttentionShape& s) {
    return emulated_launched(
        ck::run_flash_attention_backward_f32<E, kFault>(
            kEmulator, workspace->data(), static_cast<std::int64_t>(workspace->size()), dq, dk, dv,
            dout, out, lse, q, k, v, s),
        "backward");
  };
  return path;
}

// The workspace that holds every batch row of the check's cases at once.
std::vector<std::uint16_t> roomy_workspace(std::int64_t head_dim) {
  std::int64_t most = 0;
  for (const auto& c : attention_check_cases(true, head_dim)) {
    const auto p =
        cuda::plan_flash_io(c.batch, c.seq_len, c.heads, c.kv_heads, c.head_dim, true, 1);
    most = std::max(most, p.per_batch_row * c.batch);
  }
  return std::vector<std::uint16_t>(static_cast<std::size_t>(most));
}

TEST(AttentionCheck, TheFlashPathPassesInBf16) {
  auto backend = cpu_backend();
  std::vector<std::uint16_t> ws = roomy_workspace(64);
  const Status s = check_attention_path(*backend, emulated_flash<ck::FlashBf16>(&ws), true, 64);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(AttentionCheck, TheFlashPathPassesInFp16WithOneBatchRowPerPass) {
  auto backend = cpu_backend();
  // Room for one batch row of the first case (2 batch rows): two passes.
  const auto c = attention_check_cases(false, 80).front();
  ASSERT_EQ(c.batch, 2);
  const auto plan =
      cuda::plan_flash_io(c.batch, c.seq_len, c.heads, c.kv_heads, c.head_dim, true, 1);
  std::vector<std::uint16_t> ws(static_cast<std::size_t>(plan.per_batch_row * 3 / 2));
  EXPECT_EQ(cuda::plan_flash_io(c.batch, c.seq_len, c.heads, c.kv_heads, c.head_dim, true,
                                static_cast<std::int64_t>(ws.size()))
                .passes,
            2);
  const Status s = check_attention_path(*backend, emulated_flash<ck::FlashFp16>(&ws), false, 80);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(AttentionCheck, AMutatedKernelFails) {
  auto backend = cpu_backend();
  std::vector<std::uint16_t> ws = roomy_workspace(64);
  const Status s = check_attention_path(
      *backend, emulated_flash<ck::FlashBf16, ck::FlashFault::kSwapPRows>(&ws), true, 64);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("case Bf16D64T70H4KV2B2Packed: out row"), std::string::npos)
      << s.to_string();
  EXPECT_NE(s.message().find("bound"), std::string::npos);
}

// The CPU's own fp32 kernels: a different implementation, right, and more precise.
AttentionPath cpu_fp32() {
  AttentionPath path;
  path.forward = [](float* out, float* lse, const float* q, const float* k, const float* v,
                    const AttentionShape& s) {
    kernels::attention_forward<float>(out, lse, q, k, v, s);
    return Status::ok();
  };
  path.backward = [](float* dq, float* dk, float* dv, const float* dout, const float* out,
                     const float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& s) {
    kernels::attention_backward<float>(dq, dk, dv, dout, out, lse, q, k, v, s);
    return Status::ok();
  };
  return path;
}

TEST(AttentionCheck, AnotherRightImplementationPasses) {
  auto backend = cpu_backend();
  for (const std::int64_t d : kFlashHeadSizes) {
    const Status s = check_attention_path(*backend, cpu_fp32(), true, d);
    EXPECT_TRUE(s.is_ok()) << d << ": " << s.to_string();
  }
}

TEST(AttentionCheck, APathThatReturnsAnErrorFailsWithIt) {
  auto backend = cpu_backend();
  AttentionPath path = cpu_fp32();
  path.forward = [](float*, float*, const float*, const float*, const float*,
                    const AttentionShape&) {
    return Status(ErrorCode::kUnavailable, "too many resources requested for launch");
  };
  const Status s = check_attention_path(*backend, path, true, 128);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("too many resources requested for launch"), std::string::npos);
  EXPECT_NE(s.to_string().find("forward"), std::string::npos);
}

TEST(AttentionCheck, APathThatWritesPaddingFails) {
  auto backend = cpu_backend();
  AttentionPath path = cpu_fp32();
  path.forward = [](float* out, float* lse, const float* q, const float* k, const float* v,
                    const AttentionShape& s) {
    kernels::attention_forward<float>(out, lse, q, k, v, s);
    out[s.heads * s.head_dim] = 1.0f;  // the first padding column of row 0
    return Status::ok();
  };
  const Status s = check_attention_path(*backend, path, true, 64);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("wrote padding column"), std::string::npos) << s.to_string();
}

TEST(AttentionCheck, APathRightForwardButWrongBackwardFailsNamingTheGradient) {
  auto backend = cpu_backend();
  AttentionPath path = cpu_fp32();
  path.backward = [](float* dq, float* dk, float* dv, const float* dout, const float* out,
                     const float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& s) {
    kernels::attention_backward<float>(dq, dk, dv, dout, out, lse, q, k, v, s);
    dv[s.kv_stride * 5 + 3] *= 1.05f;  // one dV element of row 5, 5 % off
    return Status::ok();
  };
  const Status s = check_attention_path(*backend, path, true, 96);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("0 dq, 0 dk, 1 dv elements over their bounds"), std::string::npos)
      << s.to_string();
  EXPECT_NE(s.message().find("dv at row 5"), std::string::npos) << s.to_string();
}

// The flash kernels write the fp32 results (and their companions) themselves: the same bits as the
// same kernels' 16-bit results widened by the cast kernel (FlashInner without its wide calls,
// staged as another 16-bit attention is), the companions the rounding of the results, the padding
// of the caller's rows untouched; a companion of the other 16-bit type is written by the widening
// as before. Over several passes (one batch row each), bf16 and fp16.
template <typename E>
struct WidenedAfter {  // FlashInner's two 16-bit calls only
  ck::FlashInner<E, ck::FlashFault::kNone, simt::Launcher> flash{kEmulator};
  int forward(std::uint16_t* o16, float* lse, const std::uint16_t* q16, const std::uint16_t* k16,
              const std::uint16_t* v16, const AttentionShape& p) const {
    return flash.forward(o16, lse, q16, k16, v16, p);
  }
  int backward(std::uint16_t* dq16, std::uint16_t* dk16, std::uint16_t* dv16, float* delta,
               const std::uint16_t* do16, const std::uint16_t* o16, const float* lse,
               const std::uint16_t* q16, const std::uint16_t* k16, const std::uint16_t* v16,
               const AttentionShape& p) const {
    return flash.backward(dq16, dk16, dv16, delta, do16, o16, lse, q16, k16, v16, p);
  }
};

std::vector<float> uniform(std::size_t n, std::uint32_t seed) {
  std::vector<float> x(n);
  for (float& v : x) {
    seed = seed * 1664525u + 1013904223u;
    v = static_cast<float>(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
  }
  return x;
}

template <typename E>
void expect_results_written_in_the_kernels(int companion_code) {
  SCOPED_TRACE(std::string(E::kBf16 ? "bf16" : "fp16") + " attention, companion code " +
               std::to_string(companion_code));
  AttentionShape s{};
  s.batch = 3;
  s.seq_len = 70;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.scale = 0.125;
  const std::int64_t hd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
  const std::int64_t rows = s.batch * s.seq_len, width = hd + 2 * kvd;
  s.q_stride = s.kv_stride = width;  // q, k, v side by side, as the model keeps them
  s.out_stride = hd + 8;             // out's rows padded: the padding must stay as it is
  const std::vector<float> qkv = uniform(static_cast<std::size_t>(rows * width), 11);
  const std::vector<float> dout = uniform(static_cast<std::size_t>(rows * s.out_stride), 12);
  const float* q = qkv.data();
  const float* k = q + hd;
  const float* v = k + kvd;
  const float kUntouched = -1234.5f;
  const std::int64_t one_row =
      cuda::plan_flash_io(1, s.seq_len, s.heads, s.kv_heads, s.head_dim, true, 1).per_batch_row;
  std::vector<std::uint16_t> ws(static_cast<std::size_t>(one_row));  // one batch row per pass
  const auto elements = static_cast<std::int64_t>(ws.size());
  ASSERT_TRUE(ck::flash_f32_supported(s, elements));

  struct Results {
    std::vector<float> out, lse, dqkv;
    std::vector<std::uint16_t> out16, dqkv16;
  };
  auto run = [&](auto&& forward, auto&& backward) {
    Results r;
    r.out.assign(static_cast<std::size_t>(rows * s.out_stride), kUntouched);
    r.lse.assign(static_cast<std::size_t>(rows * s.heads), kUntouched);
    r.dqkv.assign(static_cast<std::size_t>(rows * width), kUntouched);
    r.out16.assign(r.out.size(), 0x7e7e);
    r.dqkv16.assign(r.dqkv.size(), 0x7e7e);
    const ck::Narrow on{r.out16.data(), companion_code};
    const ck::QkvNarrow dn{{r.dqkv16.data(), companion_code},
                           {r.dqkv16.data() + hd, companion_code},
                           {r.dqkv16.data() + hd + kvd, companion_code}};
    EXPECT_EQ(forward(r.out.data(), r.lse.data(), on), 0);
    float* dq = r.dqkv.data();
    EXPECT_EQ(backward(dq, dq + hd, dq + hd + kvd, r.out.data(), r.lse.data(), dn), 0);
    return r;
  };
  const Results direct = run(
      [&](float* out, float* lse, ck::Narrow on) {
        return ck::run_flash_attention_forward_f32<E>(kEmulator, ws.data(), elements, out, lse, q,
                                                      k, v, s, on);
      },
      [&](float* dq, float* dk, float* dv, const float* out, const float* lse, ck::QkvNarrow dn) {
        return ck::run_flash_attention_backward_f32<E>(kEmulator, ws.data(), elements, dq, dk, dv,
                                                       dout.data(), out, lse, q, k, v, s, dn);
      });
  const WidenedAfter<E> widened;
  const Results staged = run(
      [&](float* out, float* lse, ck::Narrow on) {
        return ck::run_attention16_forward_f32<E>(kEmulator, widened, ws.data(), elements, out, lse,
                                                  q, k, v, s, on);
      },
      [&](float* dq, float* dk, float* dv, const float* out, const float* lse, ck::QkvNarrow dn) {
        return ck::run_attention16_backward_f32<E>(kEmulator, widened, ws.data(), elements, dq, dk,
                                                   dv, dout.data(), out, lse, q, k, v, s, dn);
      });
  auto same_bits = [](const auto& a, const auto& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])), 0) << what;
  };
  same_bits(direct.out, staged.out, "out");
  same_bits(direct.lse, staged.lse, "lse");
  same_bits(direct.dqkv, staged.dqkv, "dq, dk, dv");
  same_bits(direct.out16, staged.out16, "out's companion");
  same_bits(direct.dqkv16, staged.dqkv16, "the q/k/v gradient's companion");
  auto rounded = [&](float x) {
    return companion_code == ck::kCodeBF16 ? kernels::float_to_bf16(x) : kernels::float_to_fp16(x);
  };
  int mismatches = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < s.out_stride; ++c) {
      const auto i = static_cast<std::size_t>(r * s.out_stride + c);
      if (c >= hd) {  // padding: neither array written
        mismatches += direct.out[i] != kUntouched || direct.out16[i] != 0x7e7e;
      } else {
        mismatches += direct.out16[i] != rounded(direct.out[i]);
      }
    }
    for (std::int64_t c = 0; c < width; ++c) {
      const auto i = static_cast<std::size_t>(r * width + c);
      mismatches += direct.dqkv16[i] != rounded(direct.dqkv[i]) || direct.dqkv[i] == kUntouched;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(FlashAttentionF32, TheKernelsWriteTheFp32ResultsAndCompanionsWithTheBitsOfWidening) {
  expect_results_written_in_the_kernels<ck::FlashBf16>(ck::kCodeBF16);
  expect_results_written_in_the_kernels<ck::FlashFp16>(ck::kCodeF16);
}

TEST(FlashAttentionF32, ACompanionOfTheOtherTypeIsWrittenByTheWidening) {
  expect_results_written_in_the_kernels<ck::FlashBf16>(ck::kCodeF16);
}

// An output kept in 16 bits alone (attention_16bit_alone): `out` null, its companion of the
// attention's type in compact rows. Each pass's 16-bit attention writes its result straight into
// the companion: the bits the run with an fp32 output rounds into its companion, and the same
// log-sum-exp; the backward, with `out` null, reads it from the companion (out16), and with `dout`
// null reads dO's 16 bits in place (dout16, as attention_grad_16bit keeps it), and gives the bits
// of the one reading the companion kept beside the fp32 output and rounding the fp32 dO. Both for
// the flash kernels' own epilogue and for another 16-bit attention staged as cuDNN's is
// (WidenedAfter), over several passes (one batch row each), bf16 and fp16. Without its companion,
// or with one of the other type, the launchers refuse a null output.
template <typename E, typename Inner>
void expect_output_kept_alone(const Inner& inner, const char* name) {
  SCOPED_TRACE(std::string(E::kBf16 ? "bf16 " : "fp16 ") + name);
  const int code = E::kBf16 ? ck::kCodeBF16 : ck::kCodeF16;
  AttentionShape s{};
  s.batch = 3;
  s.seq_len = 70;
  s.heads = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.scale = 0.125;
  const std::int64_t hd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
  const std::int64_t rows = s.batch * s.seq_len, width = hd + 2 * kvd;
  s.q_stride = s.kv_stride = width;
  s.out_stride = hd;  // compact, as kept alone
  const std::vector<float> qkv = uniform(static_cast<std::size_t>(rows * width), 21);
  const std::vector<float> dout = uniform(static_cast<std::size_t>(rows * hd), 22);
  const float* q = qkv.data();
  const std::int64_t one_row =
      cuda::plan_flash_io(1, s.seq_len, s.heads, s.kv_heads, s.head_dim, true, 1).per_batch_row;
  std::vector<std::uint16_t> ws(static_cast<std::size_t>(one_row));
  const auto elements = static_cast<std::int64_t>(ws.size());
  struct Results {
    std::vector<float> lse, dqkv;
    std::vector<std::uint16_t> out16;
  };
  // dO in 16 bits (kept alone, as its product writes it with attention_grad_16bit).
  std::vector<std::uint16_t> dout16(dout.size());
  for (std::size_t i = 0; i < dout.size(); ++i)
    dout16[i] = E::kBf16 ? kernels::float_to_bf16(dout[i]) : kernels::float_to_fp16(dout[i]);
  auto run = [&](bool alone) {
    Results r;
    std::vector<float> out(static_cast<std::size_t>(rows * hd), -1234.5f);
    r.lse.assign(static_cast<std::size_t>(rows * s.heads), -1234.5f);
    r.dqkv.assign(static_cast<std::size_t>(rows * width), -1234.5f);
    r.out16.assign(out.size(), 0x7e7e);
    float* wide = alone ? nullptr : out.data();
    EXPECT_EQ(ck::run_attention16_forward_f32<E>(kEmulator, inner, ws.data(), elements, wide,
                                                 r.lse.data(), q, q + hd, q + hd + kvd, s,
                                                 ck::Narrow{r.out16.data(), code}),
              0);
    float* dq = r.dqkv.data();
    EXPECT_EQ(ck::run_attention16_backward_f32<E>(
                  kEmulator, inner, ws.data(), elements, dq, dq + hd, dq + hd + kvd,
                  alone ? nullptr : dout.data(), wide, r.lse.data(), q, q + hd, q + hd + kvd, s, {},
                  {}, r.out16.data(), alone ? dout16.data() : nullptr),
              0);
    return r;
  };
  const Results beside = run(false), alone = run(true);
  auto same_bits = [](const auto& a, const auto& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])), 0) << what;
  };
  same_bits(beside.out16, alone.out16, "the output's companion");
  same_bits(beside.lse, alone.lse, "lse");
  same_bits(beside.dqkv, alone.dqkv, "dq, dk, dv");
  EXPECT_EQ(std::count(alone.out16.begin(), alone.out16.end(), std::uint16_t{0x7e7e}), 0);
  EXPECT_EQ(std::count(alone.dqkv.begin(), alone.dqkv.end(), -1234.5f), 0);
}

TEST(FlashAttentionF32, AnOutputAndGradientKeptAloneAreReadFromTheirSixteenBits) {
  expect_output_kept_alone<ck::FlashBf16>(
      ck::FlashInner<ck::FlashBf16, ck::FlashFault::kNone, simt::Launcher>{kEmulator},
      "flash epilogue");
  expect_output_kept_alone<ck::FlashFp16>(
      ck::FlashInner<ck::FlashFp16, ck::FlashFault::kNone, simt::Launcher>{kEmulator},
      "flash epilogue");
  expect_output_kept_alone<ck::FlashBf16>(WidenedAfter<ck::FlashBf16>{}, "staged");
  expect_output_kept_alone<ck::FlashFp16>(WidenedAfter<ck::FlashFp16>{}, "staged");
}

TEST(FlashAttentionF32, ANullOutputOrGradientWithoutItsSixteenBitsIsRefused) {
  AttentionShape s{};
  s.batch = 1;
  s.seq_len = 16;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 64;
  s.q_stride = s.kv_stride = 256;
  s.out_stride = 128;
  std::uint16_t companion[8] = {};
  EXPECT_TRUE(ck::flash_f32_forward_out_valid(nullptr, {companion, ck::kCodeBF16}, s, true));
  EXPECT_FALSE(ck::flash_f32_forward_out_valid(nullptr, {}, s, true));
  EXPECT_FALSE(ck::flash_f32_forward_out_valid(nullptr, {companion, ck::kCodeF16}, s, true));
  s.out_stride = 136;  // padded rows: not the companion's compact ones
  EXPECT_FALSE(ck::flash_f32_forward_out_valid(nullptr, {companion, ck::kCodeBF16}, s, true));
  float out[1];
  EXPECT_TRUE(ck::flash_f32_forward_out_valid(out, {}, s, true));
  s.out_stride = 128;
  EXPECT_FALSE(ck::flash_f32_backward_out_valid(nullptr, nullptr, out, nullptr, s));
  EXPECT_TRUE(ck::flash_f32_backward_out_valid(nullptr, companion, out, nullptr, s));
  EXPECT_TRUE(ck::flash_f32_backward_out_valid(out, nullptr, out, nullptr, s));
  // dO kept alone: its 16 bits in compact rows, or nothing to read.
  EXPECT_TRUE(ck::flash_f32_backward_out_valid(out, nullptr, nullptr, companion, s));
  EXPECT_FALSE(ck::flash_f32_backward_out_valid(out, nullptr, nullptr, nullptr, s));
  s.out_stride = 136;
  EXPECT_FALSE(ck::flash_f32_backward_out_valid(out, nullptr, nullptr, companion, s));
}

// Another 16-bit attention behind the staging, as cuDNN's is: each pass's compact 16-bit q, k, v
// (out, dO) widened, the CPU kernels in fp32, the results rounded back; `fault` mutates it.
enum class HostFault { kNone, kLog2Lse, kWrongKvHead };
struct HostInner {
  bool bf16 = true;
  HostFault fault = HostFault::kNone;

  std::vector<float> widen(const std::uint16_t* x, std::int64_t n) const {
    std::vector<float> f(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      f[static_cast<std::size_t>(i)] =
          bf16 ? kernels::bf16_to_float(x[i]) : kernels::fp16_to_float(x[i]);
    return f;
  }
  void round(std::uint16_t* dst, const std::vector<float>& x) const {
    for (std::size_t i = 0; i < x.size(); ++i)
      dst[i] = bf16 ? kernels::float_to_bf16(x[i]) : kernels::float_to_fp16(x[i]);
  }
  // The pass's shape as the CPU kernels read it (the mutated one: KV heads by query head).
  AttentionShape kernel_shape(const AttentionShape& p) const {
    AttentionShape s = p;
    if (fault == HostFault::kWrongKvHead) {
      s.kv_heads = s.heads;
      s.kv_stride = s.heads * s.head_dim;
    }
    return s;
  }
  std::vector<float> kv_of(const std::uint16_t* x, const AttentionShape& p) const {
    const std::int64_t rows = p.batch * p.seq_len;
    std::vector<float> f = widen(x, rows * p.kv_heads * p.head_dim);
    if (fault != HostFault::kWrongKvHead) return f;
    // Every query head reads KV head h % KV instead of h / (H / KV).
    std::vector<float> spread(static_cast<std::size_t>(rows * p.heads * p.head_dim));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t h = 0; h < p.heads; ++h)
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          spread[static_cast<std::size_t>((r * p.heads + h) * p.head_dim + d)] =
              f[static_cast<std::size_t>((r * p.kv_heads + h % p.kv_heads) * p.head_dim + d)];
    return spread;
  }

  int forward(std::uint16_t* o16, float* lse, const std::uint16_t* q16, const std::uint16_t* k16,
              const std::uint16_t* v16, const AttentionShape& p) const {
    const std::int64_t rows = p.batch * p.seq_len;
    const std::vector<float> q = widen(q16, rows * p.heads * p.head_dim);
    const std::vector<float> k = kv_of(k16, p), v = kv_of(v16, p);
    std::vector<float> o(q.size());
    kernels::attention_forward<float>(o.data(), lse, q.data(), k.data(), v.data(), kernel_shape(p));
    if (fault == HostFault::kLog2Lse) {
      for (std::int64_t i = 0; i < p.batch * p.heads * p.seq_len; ++i)
        lse[i] /= std::log(2.0f);
    }
    round(o16, o);
    return 0;
  }
  int backward(std::uint16_t* dq16, std::uint16_t* dk16, std::uint16_t* dv16, float* /*delta*/,
               const std::uint16_t* do16, const std::uint16_t* o16, const float* lse,
               const std::uint16_t* q16, const std::uint16_t* k16, const std::uint16_t* v16,
               const AttentionShape& p) const {
    const std::int64_t rows = p.batch * p.seq_len;
    const std::int64_t hd = rows * p.heads * p.head_dim, kvd = rows * p.kv_heads * p.head_dim;
    const std::vector<float> q = widen(q16, hd), o = widen(o16, hd), d_o = widen(do16, hd);
    const std::vector<float> k = kv_of(k16, p), v = kv_of(v16, p);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    kernels::attention_backward<float>(dq.data(), dk.data(), dv.data(), d_o.data(), o.data(), lse,
                                       q.data(), k.data(), v.data(), kernel_shape(p));
    dk.resize(static_cast<std::size_t>(kvd));  // (the mutated one's extra heads dropped)
    dv.resize(static_cast<std::size_t>(kvd));
    round(dq16, dq);
    round(dk16, dk);
    round(dv16, dv);
    return 0;
  }
};

template <typename E>
AttentionPath staged(std::vector<std::uint16_t>* workspace, HostInner inner) {
  inner.bf16 = E::kBf16;
  AttentionPath path;
  path.forward = [workspace, inner](float* out, float* lse, const float* q, const float* k,
                                    const float* v, const AttentionShape& s) {
    return emulated_launched(
        ck::run_attention16_forward_f32<E>(kEmulator, inner, workspace->data(),
                                           static_cast<std::int64_t>(workspace->size()), out, lse,
                                           q, k, v, s),
        "forward");
  };
  path.backward = [workspace, inner](float* dq, float* dk, float* dv, const float* dout,
                                     const float* out, const float* lse, const float* q,
                                     const float* k, const float* v, const AttentionShape& s) {
    return emulated_launched(
        ck::run_attention16_backward_f32<E>(kEmulator, inner, workspace->data(),
                                            static_cast<std::int64_t>(workspace->size()), dq, dk,
                                            dv, dout, out, lse, q, k, v, s),
        "backward");
  };
  return path;
}

TEST(StagedAttention, AnotherSixteenBitAttentionBehindTheStagingPasses) {
  auto backend = cpu_backend();
  std::vector<std::uint16_t> ws = roomy_workspace(64);
  const Status s = check_attention_path(*backend, staged<ck::FlashBf16>(&ws, {}), true, 64,
                                        /*documents=*/false);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(StagedAttention, ItPassesInFp16WithOneBatchRowPerPass) {
  auto backend = cpu_backend();
  std::int64_t one_row = 0;
  for (const auto& c : attention_check_cases(false, 128, false)) {
    one_row = std::max(
        one_row, cuda::plan_flash_io(c.batch, c.seq_len, c.heads, c.kv_heads, c.head_dim, true, 1)
                     .per_batch_row);
  }
  std::vector<std::uint16_t> ws(static_cast<std::size_t>(one_row));
  const Status s = check_attention_path(*backend, staged<ck::FlashFp16>(&ws, {}), false, 128,
                                        /*documents=*/false);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

// The check of the staging with a mutated inner attention at `head_dim`, in bf16.
Status check_mutated(HostFault fault, std::int64_t head_dim) {
  auto backend = cpu_backend();
  std::vector<std::uint16_t> ws = roomy_workspace(head_dim);
  HostInner inner;
  inner.fault = fault;
  return check_attention_path(*backend, staged<ck::FlashBf16>(&ws, inner), true, head_dim,
                              /*documents=*/false);
}

TEST(StagedAttention, ALog2LseFailsNamingTheLse) {
  const Status s = check_mutated(HostFault::kLog2Lse, 64);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("lse "), std::string::npos) << s.to_string();
}

TEST(StagedAttention, ReadingTheWrongKvHeadFails) {
  const Status s = check_mutated(HostFault::kWrongKvHead, 80);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("out row"), std::string::npos) << s.to_string();
}

#endif

}  // namespace
}  // namespace strata::backend
