// The start-up check of RoPE fused into the attention's staging (backend/rope_check.h) on the CPU
// backend, with fakes built from the verified ops (a CPU backend's memory is the host's): the
// faithful fake (q and k copied, rotated by rope_forward, then the verified attention, then dq and
// dk rotated back by rope_backward) passes with the bits of the verified path; a fake leaving q and
// k rotated in place, one ignoring the packed documents' positions, one rotating the whole head,
// one rotating the wrong way, one whose backward reads q and k unrotated, one that does not rotate
// dq and dk back and one whose op fails each fail, naming the case and the tensor.
// FastPaths then lists the path off with one warning naming it.
#include "backend/rope_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/fast_path.h"
#include "support/cpu_backend_support.h"

namespace strata::backend {
namespace {

enum class Fault {
  kNone,
  kRotatesInPlace,
  kIgnoresPositions,
  kWholeHead,
  kWrongWay,
  kBackwardUnrotated,
  kNotRotatedBack,
  kFails
};

// The rows' `heads` heads of q (or k) rotated into a copy with the same stride, as rope_forward
// rotates them, with the fault's mistake.
std::vector<float> rotated(Ops<float>& ops, const float* x, std::int64_t stride, std::int64_t heads,
                           const AttentionShape& s, const kernels::QkRotation<float>& rope,
                           Fault fault) {
  const std::int64_t rows = s.batch * s.seq_len, width = heads * s.head_dim;
  std::vector<float> out(static_cast<std::size_t>(rows * stride), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(x + r * stride, x + r * stride + width, out.begin() + r * stride);
  RopeShape shape{rows,
                  stride,
                  s.seq_len,
                  heads,
                  s.head_dim,
                  fault == Fault::kWholeHead ? s.head_dim : rope.rotary_dim,
                  fault == Fault::kIgnoresPositions ? nullptr : s.positions};
  if (fault == Fault::kWrongWay) {
    ops.rope_backward(out.data(), shape, rope.cos, rope.sin);
  } else {
    ops.rope_forward(out.data(), shape, rope.cos, rope.sin);
  }
  return out;
}

RopeAttentionPaths paths(Backend& backend, Fault fault) {
  Ops<float>* ops = &backend.ops_f32();
  RopeAttentionPaths p;
  p.rotate = [ops](float* x, const RopeShape& shape, const float* cos, const float* sin) {
    ops->rope_forward(x, shape, cos, sin);
    return Status::ok();
  };
  p.rotate_back = [ops](float* x, const RopeShape& shape, const float* cos, const float* sin) {
    ops->rope_backward(x, shape, cos, sin);
    return Status::ok();
  };
  p.attention.forward = [ops](float* out, float* lse, const float* q, const float* k,
                              const float* v, const AttentionShape& shape) {
    ops->attention_forward(out, lse, q, k, v, shape);
    return Status::ok();
  };
  p.attention.backward = [ops](float* dq, float* dk, float* dv, const float* dout, const float* out,
                               const float* lse, const float* q, const float* k, const float* v,
                               const AttentionShape& shape) {
    ops->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, shape);
    return Status::ok();
  };
  p.forward_rotated = [ops, fault](float* out, float* lse, const float* q, const float* k,
                                   const float* v, const AttentionShape& s,
                                   const kernels::QkRotation<float>& rope) {
    if (fault == Fault::kFails) return Status(ErrorCode::kInternal, "the staging failed to launch");
    const std::vector<float> qr = rotated(*ops, q, s.q_stride, s.heads, s, rope, fault);
    const std::vector<float> kr = rotated(*ops, k, s.kv_stride, s.kv_heads, s, rope, fault);
    if (fault == Fault::kRotatesInPlace) {
      // Rotated where they lie (the backward below then reads them as they are).
      const std::int64_t rows = s.batch * s.seq_len;
      for (std::int64_t r = 0; r < rows; ++r) {
        std::copy_n(qr.begin() + r * s.q_stride, s.heads * s.head_dim,
                    const_cast<float*>(q) + r * s.q_stride);
        std::copy_n(kr.begin() + r * s.kv_stride, s.kv_heads * s.head_dim,
                    const_cast<float*>(k) + r * s.kv_stride);
      }
    }
    ops->attention_forward(out, lse, qr.data(), kr.data(), v, s);
    return Status::ok();
  };
  p.backward_rotated = [ops, fault](float* dq, float* dk, float* dv, const float* dout,
                                    const float* out, const float* lse, const float* q,
                                    const float* k, const float* v, const AttentionShape& s,
                                    const kernels::QkRotation<float>& rope) {
    if (fault == Fault::kBackwardUnrotated || fault == Fault::kRotatesInPlace) {
      ops->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s);
    } else {
      const std::vector<float> qr = rotated(*ops, q, s.q_stride, s.heads, s, rope, fault);
      const std::vector<float> kr = rotated(*ops, k, s.kv_stride, s.kv_heads, s, rope, fault);
      ops->attention_backward(dq, dk, dv, dout, out, lse, qr.data(), kr.data(), v, s);
    }
    if (fault == Fault::kNotRotatedBack) return Status::ok();
    // dq and dk rotated back in place, each at its own stride.
    const std::int64_t rows = s.batch * s.seq_len;
    const std::int64_t rotary = fault == Fault::kWholeHead ? s.head_dim : rope.rotary_dim;
    const std::int32_t* positions = fault == Fault::kIgnoresPositions ? nullptr : s.positions;
    ops->rope_backward(
        dq, RopeShape{rows, s.q_stride, s.seq_len, s.heads, s.head_dim, rotary, positions},
        rope.cos, rope.sin);
    ops->rope_backward(
        dk, RopeShape{rows, s.kv_stride, s.seq_len, s.kv_heads, s.head_dim, rotary, positions},
        rope.cos, rope.sin);
    return Status::ok();
  };
  return p;
}

TEST(RopeAttentionCheck, TheFaithfulPathPassesAtEachHeadSize) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (const std::int64_t head_dim : {64, 80, 128}) {
    const Status s = check_rope_in_attention(*backend, paths(*backend, Fault::kNone), head_dim);
    EXPECT_TRUE(s.is_ok()) << head_dim << ": " << s.to_string();
  }
}

TEST(RopeAttentionCheck, EachFaultFailsNamingTheCaseAndTheTensor) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {
      {Fault::kRotatesInPlace,
       "GQA, whole head rotated (head size 64, rotary width 64): qkv (to be left unrotated)["},
      {Fault::kIgnoresPositions,
       "partial rotary width, packed documents, window 6 (head size 64, rotary width 32): out["},
      {Fault::kWholeHead,
       "partial rotary width, packed documents, window 6 (head size 64, rotary "
       "width 32): out["},
      {Fault::kWrongWay, "GQA, whole head rotated (head size 64, rotary width 64): out["},
      {Fault::kBackwardUnrotated, "GQA, whole head rotated (head size 64, rotary width 64): dqkv["},
      {Fault::kNotRotatedBack, "GQA, whole head rotated (head size 64, rotary width 64): dqkv["},
      {Fault::kFails, "the staging failed to launch"},
  };
  for (const auto& c : cases) {
    const Status s = check_rope_in_attention(*backend, paths(*backend, c.fault), 64);
    ASSERT_FALSE(s.is_ok()) << c.expect;
    EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    if (c.fault != Fault::kFails) {
      EXPECT_NE(s.to_string().find("the bits must match"), std::string::npos) << s.to_string();
    }
  }
}

TEST(RopeAttentionCheck, AFailingPathIsListedOffWithOneWarning) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  std::vector<std::string> warnings;
  FastPaths fast([&](const std::string& m) { warnings.push_back(m); });
  const bool on = fast.adopt(
      kRopeAttentionName, kRopeAttentionReplaces, "rope in the staging",
      [&] { return check_rope_in_attention(*backend, paths(*backend, Fault::kWrongWay), 64); });
  EXPECT_FALSE(on);
  EXPECT_FALSE(fast.active(kRopeAttentionName));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("fast path rope_in_attention is off"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find(kRopeAttentionReplaces), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace strata::backend
