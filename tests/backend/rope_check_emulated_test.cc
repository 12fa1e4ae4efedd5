// RoPE fused into the flash attention's 16-bit staging (kernels/cuda/flash_attention_f32.cuh with
// a QkRotation: rope_block_to_16_kernel rounding q and k rotated) run by the SIMT emulator on the
// CPU backend's memory, through the fast path's start-up check (backend/rope_check.h): it gives the
// bits of rope_kernel in place followed by the plain staging and the same flash kernels, emulated
// the same way, in bf16 and fp16, with the whole workspace in one pass and with one batch row per
// pass (the packed documents' positions then start mid-array); its q and k are left unrotated.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/flash_attention_f32.cuh"
//
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/host_copies.h"
#include "backend/rope_check.h"
#include "support/cpu_backend_support.h"
#include "support/emulated_launch.h"

namespace strata::backend {
namespace {

#if defined(__SANITIZE_ADDRESS__)
TEST(RopeInAttentionEmulated, SkippedUnderAddressSanitizer) {
  GTEST_SKIP() << "the SIMT emulator's fibers are not supported under AddressSanitizer";
}
#else

namespace ck = cuda_kernels;
const simt::Launcher kEmulator;

using testing::emulated_launched;

// A workspace for one direction of the shape: room for every batch row at once, or for one
// (`one_row`).
std::vector<std::uint16_t>& workspace_for(std::vector<std::uint16_t>* ws, const AttentionShape& s,
                                          bool one_row, bool backward) {
  const auto plan =
      cuda::plan_flash_io(s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim, backward, 1);
  ws->assign(static_cast<std::size_t>(plan.per_batch_row * (one_row ? 1 : s.batch)), 0);
  return *ws;
}

// The verified path (rope_kernel, then the flash path) and the fused one, both emulated.
template <typename E>
RopeAttentionPaths emulated(std::vector<std::uint16_t>* ws, bool one_row) {
  RopeAttentionPaths p;
  p.rotate = [](float* x, const RopeShape& shape, const float* cos, const float* sin) {
    return emulated_launched(ck::run_rope(kEmulator, x, shape, cos, sin, 1.0f), "rope");
  };
  p.rotate_back = [](float* x, const RopeShape& shape, const float* cos, const float* sin) {
    return emulated_launched(ck::run_rope(kEmulator, x, shape, cos, sin, -1.0f), "rope backward");
  };
  p.attention.forward = [ws, one_row](float* out, float* lse, const float* q, const float* k,
                                      const float* v, const AttentionShape& s) {
    std::vector<std::uint16_t>& w = workspace_for(ws, s, one_row, false);
    return emulated_launched(
        ck::run_flash_attention_forward_f32<E>(
            kEmulator, w.data(), static_cast<std::int64_t>(w.size()), out, lse, q, k, v, s),
        "forward");
  };
  p.attention.backward = [ws, one_row](float* dq, float* dk, float* dv, const float* dout,
                                       const float* out, const float* lse, const float* q,
                                       const float* k, const float* v, const AttentionShape& s) {
    std::vector<std::uint16_t>& w = workspace_for(ws, s, one_row, true);
    return emulated_launched(ck::run_flash_attention_backward_f32<E>(
                                 kEmulator, w.data(), static_cast<std::int64_t>(w.size()), dq, dk,
                                 dv, dout, out, lse, q, k, v, s),
                             "backward");
  };
  p.forward_rotated = [ws, one_row](float* out, float* lse, const float* q, const float* k,
                                    const float* v, const AttentionShape& s,
                                    const kernels::QkRotation<float>& rope) {
    std::vector<std::uint16_t>& w = workspace_for(ws, s, one_row, false);
    const std::int64_t n = static_cast<std::int64_t>(w.size());
    EXPECT_EQ(
        cuda::plan_flash_io(s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim, false, n).passes,
        one_row ? s.batch : 1);
    return emulated_launched(ck::run_flash_attention_forward_f32<E>(kEmulator, w.data(), n, out,
                                                                    lse, q, k, v, s, {}, rope),
                             "rotated forward");
  };
  p.backward_rotated = [ws, one_row](float* dq, float* dk, float* dv, const float* dout,
                                     const float* out, const float* lse, const float* q,
                                     const float* k, const float* v, const AttentionShape& s,
                                     const kernels::QkRotation<float>& rope) {
    std::vector<std::uint16_t>& w = workspace_for(ws, s, one_row, true);
    const std::int64_t n = static_cast<std::int64_t>(w.size());
    EXPECT_EQ(
        cuda::plan_flash_io(s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim, true, n).passes,
        one_row ? s.batch : 1);
    return emulated_launched(
        ck::run_flash_attention_backward_f32<E>(kEmulator, w.data(), n, dq, dk, dv, dout, out, lse,
                                                q, k, v, s, {}, rope),
        "rotated backward");
  };
  return p;
}

TEST(RopeInAttentionEmulated, TheFusedStagingGivesTheBitsOfTheRopeKernelThenTheStaging) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  std::vector<std::uint16_t> ws;
  for (const bool one_row : {false, true}) {
    const Status bf16 =
        check_rope_in_attention(*backend, emulated<ck::FlashBf16>(&ws, one_row), 64);
    EXPECT_TRUE(bf16.is_ok()) << "bf16, one batch row per pass " << one_row << ": "
                              << bf16.to_string();
  }
  const Status fp16 = check_rope_in_attention(*backend, emulated<ck::FlashFp16>(&ws, true), 80);
  EXPECT_TRUE(fp16.is_ok()) << "fp16: " << fp16.to_string();
}

// The rotation while rounding, alone, against rope_kernel then cast_block_kernel: the same bits
// for every element, with the head's dimensions past the rotary width copied, rows at a stride
// wider than the heads, and positions; and the widening rotated back (rope_block_from_16_kernel)
// against cast_block_from_16_kernel then rope_kernel's backward, with the companion.
TEST(RopeInAttentionEmulated, RotatingWhileRoundingGivesTheBitsOfTheTwoKernels) {
  const std::int64_t rows = 9, heads = 3, head_dim = 24, rotary = 16, stride = 80, seq = 9;
  std::vector<float> x(static_cast<std::size_t>(rows * stride));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 0.37f * static_cast<float>(i % 29) - 4.1f + 1e-3f * static_cast<float>(i);
  std::vector<float> cos(static_cast<std::size_t>(seq * rotary / 2)), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), seq, rotary, 500.0);
  const std::vector<std::int32_t> positions = {0, 1, 2, 0, 1, 2, 3, 4, 0};
  for (const int code : {ck::kCodeBF16, ck::kCodeF16}) {
    std::vector<float> rotated = x;
    const kernels::RopeShape shape{rows, stride, seq, heads, head_dim, rotary, positions.data()};
    ASSERT_EQ(ck::run_rope(kEmulator, rotated.data(), shape, cos.data(), sin.data(), 1.0f), 0);
    const std::int64_t cols = heads * head_dim, ld = cols + 8;
    std::vector<std::uint16_t> want(static_cast<std::size_t>(rows * ld), 0xffff);
    std::vector<std::uint16_t> got = want;
    ASSERT_EQ(ck::run_cast_block_to_16(kEmulator, want.data(), code, ld, rotated.data(), stride,
                                       rows, cols),
              0);
    ck::RopeRows r;
    r.heads = heads;
    r.head_dim = head_dim;
    r.half = rotary / 2;
    r.seq_len = seq;
    r.positions = positions.data();
    r.cos = cos.data();
    r.sin = sin.data();
    const std::vector<float> before = x;
    ASSERT_EQ(ck::run_rope_block_to_16(kEmulator, got.data(), code, ld, x.data(), stride, rows, r),
              0);
    EXPECT_EQ(got, want) << "code " << code;
    EXPECT_EQ(x, before);  // the source stays unrotated
    // Not a copy: the rotation changed what was rounded.
    std::vector<std::uint16_t> plain(want.size(), 0xffff);
    ASSERT_EQ(
        ck::run_cast_block_to_16(kEmulator, plain.data(), code, ld, x.data(), stride, rows, cols),
        0);
    EXPECT_NE(plain, want);

    // Back: the 16-bit values widened, rotated back (the rope kernel's backward) and rounded into
    // the companion, against cast_block_from_16_kernel then rope_kernel's backward in place.
    std::vector<float> wide_want(x.size(), -7.0f), wide_got(x.size(), -7.0f);
    std::vector<std::uint16_t> also_want(x.size(), 0xffff), also_got(x.size(), 0xffff);
    ASSERT_EQ(ck::run_cast_block_from_16(kEmulator, wide_want.data(), stride, want.data(), code, ld,
                                         rows, cols),
              0);
    ASSERT_EQ(ck::run_rope(kEmulator, wide_want.data(), shape, cos.data(), sin.data(), -1.0f,
                           ck::Narrow{also_want.data(), code}),
              0);
    r.direction = -1.0f;
    ASSERT_EQ(ck::run_rope_block_from_16(kEmulator, wide_got.data(), stride, want.data(), code, ld,
                                         rows, r, ck::Narrow{also_got.data(), code}),
              0);
    EXPECT_TRUE(std::memcmp(wide_got.data(), wide_want.data(), x.size() * 4) == 0)
        << "code " << code;
    // The companion: every rotated element rounded (rope_kernel rounds only the pairs it rotates,
    // so compare those, and the rest against the widened values' rounding).
    for (std::int64_t row = 0; row < rows; ++row) {
      for (std::int64_t j = 0; j < cols; ++j) {
        const std::size_t i = static_cast<std::size_t>(row * stride + j);
        if (j % head_dim < rotary) {
          EXPECT_EQ(also_got[i], also_want[i]) << "row " << row << " column " << j;
        } else {
          EXPECT_EQ(also_got[i], want[static_cast<std::size_t>(row * ld + j)])
              << "row " << row << " column " << j;
        }
      }
      for (std::int64_t j = cols; j < stride; ++j) {  // past the heads: untouched
        EXPECT_EQ(wide_got[static_cast<std::size_t>(row * stride + j)], -7.0f);
        EXPECT_EQ(also_got[static_cast<std::size_t>(row * stride + j)], 0xffff);
      }
    }
  }
}

// The cases of the two tests of q, k, v kept alone below: bf16 or fp16, the whole workspace in one
// pass or one batch row per pass, the rotary width (0: no rotation, as GPT-2's attention).
struct QkvCase {
  bool bf16, one_row;
  std::int64_t rotary;
};
constexpr QkvCase kQkvCases[] = {
    {true, false, 64}, {true, true, 32}, {false, true, 64}, {true, false, 0}, {false, true, 0}};

// GQA 2:1 over 2 x 19 tokens of head size 64, q, k, v side by side in each row as the model keeps
// them, and the case's rotation tables.
struct QkvSetup {
  explicit QkvSetup(const QkvCase& c) : rotary(c.rotary) {
    s.batch = 2;
    s.seq_len = 19;
    s.heads = 4;
    s.kv_heads = 2;
    s.head_dim = 64;
    rows = s.batch * s.seq_len;
    hd = s.heads * s.head_dim;
    kvd = s.kv_heads * s.head_dim;
    n = rows * (hd + 2 * kvd);
    s.q_stride = s.kv_stride = hd + 2 * kvd;
    s.out_stride = hd;
    s.scale = 0.125;
    if (rotary == 0) return;
    cos.resize(static_cast<std::size_t>(s.seq_len * rotary / 2));
    sin.resize(cos.size());
    kernels::rope_tables(cos.data(), sin.data(), s.seq_len, rotary, 10000.0);
  }
  // None without rotation.
  kernels::QkRotation<float> rope() const {
    kernels::QkRotation<float> r;
    if (rotary == 0) return r;
    r.cos = cos.data();
    r.sin = sin.data();
    r.rotary_dim = rotary;
    return r;
  }
  AttentionShape s{};
  std::int64_t rotary, rows = 0, hd = 0, kvd = 0, n = 0;
  std::vector<float> cos, sin;
};

// The gradient of q, k and v kept in 16 bits alone (fast path qkv_grad_16bit_alone): the backward
// given null dq, dk, dv writes their companions alone, with the bits it writes into them beside the
// fp32 arrays, in bf16 and fp16, over one pass and over one batch row per pass, with the whole head
// rotated, a partial rotary width (the widening rotating back) and no rotation (the flash epilogue
// writing them); and the launchers' rule for what may be null.
TEST(RopeInAttentionEmulated, TheBackwardWritesAGradientKeptAloneIntoItsCompanionsAlone) {
  for (const QkvCase& c : kQkvCases) {
    const QkvSetup u(c);
    const AttentionShape& s = u.s;
    const std::int64_t rows = u.rows, hd = u.hd, kvd = u.kvd, n = u.n;
    const kernels::QkRotation<float> rope = u.rope();
    std::mt19937_64 rng(4100 + static_cast<std::uint64_t>(c.rotary));
    const std::vector<float> qkv = normal_values(rng, n, 1.0f, 0.0f);
    const std::vector<float> dout = normal_values(rng, rows * hd, 1.0f, 0.0f);
    std::vector<float> out(static_cast<std::size_t>(rows * hd)),
        lse(static_cast<std::size_t>(s.batch * s.heads * s.seq_len));
    std::vector<float> wide(static_cast<std::size_t>(n), -3.0f);
    const int code = c.bf16 ? ck::kCodeBF16 : ck::kCodeF16;
    std::vector<std::uint16_t> beside(static_cast<std::size_t>(n), 0xffff), alone = beside;
    const auto qkv_narrow = [&](std::vector<std::uint16_t>& to) {
      std::uint16_t* p = to.data();
      return ck::QkvNarrow{{p, code}, {p + hd, code}, {p + hd + kvd, code}};
    };
    std::vector<std::uint16_t> ws;
    const float* q = qkv.data();
    const auto run = [&](auto e) {
      using E = decltype(e);
      std::vector<std::uint16_t>& w = workspace_for(&ws, s, c.one_row, true);
      const std::int64_t elements = static_cast<std::int64_t>(w.size());
      ASSERT_EQ(
          ck::run_flash_attention_forward_f32<E>(kEmulator, w.data(), elements, out.data(),
                                                 lse.data(), q, q + hd, q + hd + kvd, s, {}, rope),
          0);
      ASSERT_EQ(ck::run_flash_attention_backward_f32<E>(
                    kEmulator, w.data(), elements, wide.data(), wide.data() + hd,
                    wide.data() + hd + kvd, dout.data(), out.data(), lse.data(), q, q + hd,
                    q + hd + kvd, s, qkv_narrow(beside), rope),
                0);
      ASSERT_EQ(ck::run_flash_attention_backward_f32<E>(
                    kEmulator, w.data(), elements, nullptr, nullptr, nullptr, dout.data(),
                    out.data(), lse.data(), q, q + hd, q + hd + kvd, s, qkv_narrow(alone), rope),
                0);
    };
    if (c.bf16) {
      run(ck::FlashBf16{});
    } else {
      run(ck::FlashFp16{});
    }
    EXPECT_EQ(alone, beside) << "bf16 " << c.bf16 << ", one row per pass " << c.one_row
                             << ", rotary width " << c.rotary;
    EXPECT_EQ(std::count(alone.begin(), alone.end(), std::uint16_t{0xffff}), 0);
    // The companions are the fp32 gradient's rounding (the arrays beside them were written).
    for (std::int64_t i = 0; i < n; i += 97)
      EXPECT_EQ(beside[static_cast<std::size_t>(i)],
                ck::float_to_16_bits(wide[static_cast<std::size_t>(i)], code))
          << i;
  }
  // Null arrays only all together, with all three companions.
  std::uint16_t c16[3] = {};
  float d[3] = {};
  const ck::QkvNarrow all{{c16, ck::kCodeBF16}, {c16 + 1, ck::kCodeBF16}, {c16 + 2, ck::kCodeBF16}};
  EXPECT_TRUE(ck::flash_f32_backward_grads_valid(d, d + 1, d + 2, {}));
  EXPECT_TRUE(ck::flash_f32_backward_grads_valid(nullptr, nullptr, nullptr, all));
  EXPECT_FALSE(ck::flash_f32_backward_grads_valid(nullptr, nullptr, nullptr, {}));
  EXPECT_FALSE(ck::flash_f32_backward_grads_valid(nullptr, d + 1, d + 2, all));
  ck::QkvNarrow no_v = all;
  no_v.v.p = nullptr;
  EXPECT_FALSE(ck::flash_f32_backward_grads_valid(nullptr, nullptr, nullptr, no_v));
}

// q, k and v kept in 16 bits alone (fast path qkv_16bit): the rotated forward and backward given
// their 16 bits (qkv16, null fp32 pointers, the caller's strides) give the bits they give on fp32
// arrays holding those values widened (out, lse; dq, dk, dv and their companions), in bf16 and
// fp16, over one pass and over one batch row per pass, with the whole head rotated, a partial
// rotary width and no rotation; and the launchers' rule for what may be given.
TEST(RopeInAttentionEmulated, TheStagingReadsQkvKeptAloneWithTheBitsOfTheirValuesWidened) {
  for (const QkvCase& c : kQkvCases) {
    const QkvSetup u(c);
    const AttentionShape& s = u.s;
    const std::int64_t rows = u.rows, hd = u.hd, kvd = u.kvd, n = u.n;
    const kernels::QkRotation<float> rope = u.rope();
    const int code = c.bf16 ? ck::kCodeBF16 : ck::kCodeF16;
    std::mt19937_64 rng(4300 + static_cast<std::uint64_t>(c.rotary));
    const std::vector<float> raw = normal_values(rng, n, 1.0f, 0.0f);
    std::vector<std::uint16_t> qkv16(static_cast<std::size_t>(n));
    std::vector<float> qkv(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < qkv.size(); ++i) {
      qkv16[i] = ck::float_to_16_bits(raw[i], code);
      qkv[i] = ck::float_from_16_bits(qkv16[i], code);
    }
    const std::vector<float> dout = normal_values(rng, rows * hd, 1.0f, 0.0f);
    struct Side {
      std::vector<float> out, lse, d;
      std::vector<std::uint16_t> d16;
    } sides[2];
    for (Side& side : sides) {
      side.out.assign(static_cast<std::size_t>(rows * hd), -3.0f);
      side.lse.assign(static_cast<std::size_t>(s.batch * s.heads * s.seq_len), -3.0f);
      side.d.assign(static_cast<std::size_t>(n), -3.0f);
      side.d16.assign(static_cast<std::size_t>(n), 0xffff);
    }
    const ck::QkvSixteen sixteen{
        {qkv16.data(), code}, {qkv16.data() + hd, code}, {qkv16.data() + hd + kvd, code}};
    std::vector<std::uint16_t> ws;
    const auto run = [&](auto e) {
      using E = decltype(e);
      for (int alone = 0; alone < 2; ++alone) {
        Side& side = sides[alone];
        const float* q = alone ? nullptr : qkv.data();
        const float* k = alone ? nullptr : qkv.data() + hd;
        const float* v = alone ? nullptr : qkv.data() + hd + kvd;
        const ck::QkvSixteen in16 = alone ? sixteen : ck::QkvSixteen{};
        std::uint16_t* d16 = side.d16.data();
        const ck::QkvNarrow dn{{d16, code}, {d16 + hd, code}, {d16 + hd + kvd, code}};
        std::vector<std::uint16_t>& w = workspace_for(&ws, s, c.one_row, true);
        const std::int64_t elements = static_cast<std::int64_t>(w.size());
        ASSERT_EQ(
            ck::run_flash_attention_forward_f32<E>(kEmulator, w.data(), elements, side.out.data(),
                                                   side.lse.data(), q, k, v, s, {}, rope, in16),
            0);
        float* d = side.d.data();
        ASSERT_EQ(ck::run_flash_attention_backward_f32<E>(kEmulator, w.data(), elements, d, d + hd,
                                                          d + hd + kvd, dout.data(),
                                                          side.out.data(), side.lse.data(), q, k, v,
                                                          s, dn, rope, nullptr, nullptr, in16),
                  0);
      }
    };
    if (c.bf16) {
      run(ck::FlashBf16{});
    } else {
      run(ck::FlashFp16{});
    }
    const std::string what = "bf16 " + std::to_string(c.bf16) + ", one row per pass " +
                             std::to_string(c.one_row) + ", rotary width " +
                             std::to_string(c.rotary);
    EXPECT_TRUE(std::memcmp(sides[0].out.data(), sides[1].out.data(), sides[0].out.size() * 4) == 0)
        << what;
    EXPECT_TRUE(std::memcmp(sides[0].lse.data(), sides[1].lse.data(), sides[0].lse.size() * 4) == 0)
        << what;
    EXPECT_TRUE(std::memcmp(sides[0].d.data(), sides[1].d.data(), sides[0].d.size() * 4) == 0)
        << what;
    EXPECT_EQ(sides[0].d16, sides[1].d16) << what;
    EXPECT_EQ(std::count(sides[1].out.begin(), sides[1].out.end(), -3.0f), 0) << what;
  }
  // Each of q, k and v once, in fp32 or 16 bits.
  std::uint16_t h[3] = {};
  float f[3] = {};
  const ck::QkvSixteen all{{h, ck::kCodeBF16}, {h + 1, ck::kCodeBF16}, {h + 2, ck::kCodeF16}};
  EXPECT_TRUE(ck::flash_f32_inputs_valid(f, f + 1, f + 2, {}));
  EXPECT_TRUE(ck::flash_f32_inputs_valid(nullptr, nullptr, nullptr, all));
  EXPECT_FALSE(ck::flash_f32_inputs_valid(f, nullptr, nullptr, all));
  EXPECT_FALSE(ck::flash_f32_inputs_valid(nullptr, f + 1, f + 2, {}));
  ck::QkvSixteen fp32_code = all;
  fp32_code.v.code = ck::kCodeF32;
  EXPECT_FALSE(ck::flash_f32_inputs_valid(nullptr, nullptr, nullptr, fp32_code));
}

#endif

}  // namespace
}  // namespace strata::backend
