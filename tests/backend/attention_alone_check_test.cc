// The start-up check of each block's attention output kept in 16 bits alone
// (attention_alone_check.h) on the CPU backend, with fakes of the ops built from the verified
// ones and the rounding (a CPU backend's memory is the host's). Like the 16-bit attention, the
// fake's backward reads a paired output from its companion. The faithful fake passes in bf16 and
// fp16 at head sizes 64 and 128 and never touches the key's address range (any access to it
// faults); a fake refusing the pairing, one that would not keep the shape alone, one whose
// products would not read the companion, one truncating the output kept alone, one leaving its
// log-sum-exp unwritten, one whose backward reads the output kept alone as zeros, one whose
// products read it as zeros in the B position, and one whose op fails each fail, naming what went
// wrong. FastPaths then lists the path off with one warning naming it. The gradient's check
// (attention_grad_16bit) likewise: the faithful fake passes, and a refusal, a gradient the ops
// would not keep alone, a 16-bit product 2 units off and a backward reading the gradient kept
// alone as zeros each fail, naming what went wrong.
#include "backend/attention_alone_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "support/cpu_backend_support.h"
#include "support/narrow_pairs_fake.h"

namespace strata::backend {
namespace {

enum class Fault {
  kNone,
  kRefused,
  kNotKept,
  kNotRead,
  kTruncated,
  kNoLse,
  kBackwardReadsZeros,
  kZerosAsB,
  kFails,
  // The gradient's faults.
  kGradNotKept,
  kProductTwoUnitsOff,
  kGradReadAsZeros,
};

using testing::FakePair;
using testing::to16;

// The fake ops' state: the pairs, shared by the path's calls.
struct Fake : testing::FakePairs {
  Ops<float>* ops = nullptr;
  Fault fault = Fault::kNone;
};

AttentionAlonePath path(Backend& backend, DType type, Fault fault) {
  auto fake = std::make_shared<Fake>();
  fake->type = type;
  fake->ops = &backend.ops_f32();
  fake->fault = fault;
  AttentionAlonePath p;
  p.type = type;
  p.pair = [fake](float* wide, void* narrow, std::int64_t n, bool alone) {
    return fake->pair(wide, narrow, n, alone, fake->fault == Fault::kRefused);
  };
  p.unpair = [fake](const float* wide) { fake->unpair(wide); };
  p.reads_companion = [fake](const float* at, std::int64_t n) {
    return fake->reads_companion(at, n, fake->fault == Fault::kNotRead);
  };
  p.keeps = [fake](const AttentionShape&) { return fake->fault != Fault::kNotKept; };
  p.keeps_grad = [fake](const AttentionShape&) { return fake->fault != Fault::kGradNotKept; };
  p.forward = [fake](float* out, float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& s) {
    const std::int64_t n = s.batch * s.seq_len * s.out_stride;
    std::vector<float> o(static_cast<std::size_t>(n));
    std::vector<float> l(static_cast<std::size_t>(s.batch * s.heads * s.seq_len));
    fake->ops->attention_forward(o.data(), l.data(), q, k, v, s);
    const FakePair* f = fake->pair_of(out, n);
    const bool alone = f != nullptr && f->alone;
    if (!(alone && fake->fault == Fault::kNoLse)) std::copy(l.begin(), l.end(), lse);
    if (!alone) std::copy(o.begin(), o.end(), out);
    if (f == nullptr) return;
    std::uint16_t* narrow = f->narrow + (out - f->wide);
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = o[static_cast<std::size_t>(i)];
      std::uint32_t bits;
      std::memcpy(&bits, &x, 4);
      narrow[i] = alone && fake->fault == Fault::kTruncated ? static_cast<std::uint16_t>(bits >> 16)
                                                            : to16(x, fake->type);
      if (alone && fake->fault == Fault::kTruncated && fake->type == DType::kF16) narrow[i] ^= 1;
    }
  };
  p.backward = [fake](float* dq, float* dk, float* dv, const float* dout, const float* out,
                      const float* lse, const float* q, const float* k, const float* v,
                      const AttentionShape& s) {
    const std::int64_t n = s.batch * s.seq_len * s.out_stride;
    const std::vector<float> o = fake->read(out, n, fake->fault == Fault::kBackwardReadsZeros);
    const std::vector<float> d_o = fake->read(dout, n, fake->fault == Fault::kGradReadAsZeros);
    fake->ops->attention_backward(dq, dk, dv, d_o.data(), o.data(), lse, q, k, v, s);
  };
  p.gemm = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
    testing::paired_product(*fake, *fake->ops, ta, tb, m, n, k, a, lda, b, ldb, c, ldc,
                            fake->fault == Fault::kZerosAsB,
                            fake->fault == Fault::kProductTwoUnitsOff ? 7 : -1);
  };
  p.finish = [fake] {
    if (fake->fault == Fault::kFails) return Status(ErrorCode::kInternal, "the kernel failed");
    return Status::ok();
  };
  return p;
}

TEST(AttentionAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    for (std::int64_t head_dim : {64, 128}) {
      const Status s =
          check_attention_alone(*backend, path(*backend, type, Fault::kNone), head_dim);
      EXPECT_TRUE(s.is_ok()) << to_string(type) << " " << head_dim << ": " << s.to_string();
    }
  }
}

TEST(AttentionAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {
      {Fault::kRefused,
       "head size 64, 2 x 24 tokens, 2 heads over 1: the ops refused to keep an activation alone"},
      {Fault::kNotKept, "head size 64, 2 x 24 tokens, 2 heads over 1: the ops would not keep"},
      {Fault::kNotRead, "a product reading the attention output kept alone would not read"},
      {Fault::kTruncated, "the forward: the companion kept alone holds"},
      {Fault::kNoLse, "the forward's log-sum-exp["},
      {Fault::kBackwardReadsZeros, "the backward's dq, dk, dv (side by side)["},
      {Fault::kZerosAsB,
       "after the attention: the Llama family's weight gradient (activation as B)["},
      {Fault::kFails, "the kernel failed"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_attention_alone(*backend, path(*backend, type, c.fault), 64);
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  AttentionAlonePath fp32 = path(*backend, DType::kBF16, Fault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_attention_alone(*backend, fp32, 64).code(), ErrorCode::kInvalidArgument);
}

TEST(AttentionGradAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    for (std::int64_t head_dim : {64, 128}) {
      const Status s =
          check_attention_grad_alone(*backend, path(*backend, type, Fault::kNone), head_dim);
      EXPECT_TRUE(s.is_ok()) << to_string(type) << " " << head_dim << ": " << s.to_string();
    }
  }
}

TEST(AttentionGradAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {
      {Fault::kRefused, "head size 64, 2 x 24 tokens, 2 heads over 1: the ops refused"},
      {Fault::kGradNotKept, "the ops would not keep its attention gradient alone"},
      {Fault::kProductTwoUnitsOff,
       "GPT-2's product (B transposed): the 16-bit gradient's element 7 is"},
      {Fault::kGradReadAsZeros,
       "GPT-2's product (B transposed): the backward's dq, dk, dv (side by side)["},
      {Fault::kFails, "the kernel failed"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_attention_grad_alone(*backend, path(*backend, type, c.fault), 64);
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  AttentionAlonePath fp32 = path(*backend, DType::kBF16, Fault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_attention_grad_alone(*backend, fp32, 64).code(), ErrorCode::kInvalidArgument);
}

TEST(AttentionAloneCheck, AFailingPathIsListedOffWithOneWarningAndUnpairsWhatItPaired) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  testing::expect_listed_off_unpairing<AttentionAlonePath>(
      path(*backend, DType::kBF16, Fault::kTruncated), kAttentionAloneName, kAttentionAloneReplaces,
      [&](const AttentionAlonePath& p) { return check_attention_alone(*backend, p, 64); });
}

}  // namespace
}  // namespace strata::backend
