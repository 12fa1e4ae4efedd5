// The start-up checks of q, k, v and their gradient kept in 16 bits alone (qkv_alone_check.h) on
// the CPU backend, with fakes of the ops built from the verified ones and the rounding (a CPU
// backend's memory is the host's) that keep their pairs as the backend does and never touch a key's
// address range (any access to it faults). The fake's rotated attention reads q, k and v as the
// backend's staging does (from their companion where they are paired), rotates a copy of q and k
// (rope_forward), runs the verified attention on it and rotates dq and dk back (rope_backward),
// then writes the gradient into its fp32 array, its companion or both, as it is paired.
// - The gradient's check (qkv_grad_16bit_alone): the faithful fake passes in bf16 and fp16 at head
//   sizes 64 and 128; a refused pairing, a gradient the ops would not keep alone, products that
//   would not read its companion, a gradient kept alone whose dq and dk are not rotated back, one
//   whose dv is left unwritten, one rotated over the whole head where the rotary width is partial,
//   products reading it as zeros in the B position, the bias's column sums reading it as zeros
//   (without rotation, as GPT-2's), and an op that fails each fail, naming the case
//   and what went wrong.
// - q, k and v's check (qkv_16bit): the faithful fake passes likewise; q, k and v the ops would not
//   keep alone, a 16-bit product 2 units off, one leaving its bias out, a forward and a backward
//   reading them kept alone as zeros (rotated; the forward unrotated too, as GPT-2's), and an op
//   that fails each fail, naming the case and what went wrong.
// FastPaths then lists a failing path off with one warning naming it, and the check unpairs what it
// paired.
#include "backend/qkv_alone_check.h"

#include <gtest/gtest.h>

#include <algorithm>
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
  kNotRotatedBack,
  kDvUnwritten,
  kWholeHead,
  kZerosAsB,
  kBiasReadsZeros,
  kFails,
  // q, k and v's faults.
  kQkvNotKept,
  kProductTwoUnitsOff,
  kForwardReadsZeros,
  kBackwardReadsZeros,
  kBiasLeftOut,
  kUnrotatedReadsZeros,
};

using testing::FakePair;
using testing::to16;

// The fake ops' state: the pairs, shared by the path's calls.
struct Fake : testing::FakePairs {
  Ops<float>* ops = nullptr;
  Fault fault = Fault::kNone;
};

// q, k, v side by side (rows of s.q_stride from q) read as the staging reads them (as zeros where
// they are kept alone and `zeros`), q's and k's heads rotated by rope_forward over `rotary` of each
// head's dimensions.
std::vector<float> rotated(const Fake& fake, const float* q, const AttentionShape& s,
                           const kernels::QkRotation<float>& rope, std::int64_t rotary,
                           bool zeros = false) {
  const std::int64_t rows = s.batch * s.seq_len;
  Ops<float>& ops = *fake.ops;
  std::vector<float> x = fake.read(q, rows * s.q_stride, zeros);
  if (rope.cos == nullptr) return x;  // no rotation
  const RopeShape shape{rows,       s.q_stride, s.seq_len,  s.heads + s.kv_heads,
                        s.head_dim, rotary,     s.positions};
  ops.rope_forward(x.data(), shape, rope.cos, rope.sin);
  return x;
}

QkvAlonePath path(Backend& backend, DType type, Fault fault) {
  auto fake = std::make_shared<Fake>();
  fake->type = type;
  fake->ops = &backend.ops_f32();
  fake->fault = fault;
  QkvAlonePath p;
  p.type = type;
  p.pair = [fake](float* wide, void* narrow, std::int64_t n, bool alone) {
    return fake->pair(wide, narrow, n, alone, fake->fault == Fault::kRefused);
  };
  p.unpair = [fake](const float* wide) { fake->unpair(wide); };
  p.reads_companion = [fake](const float* at, std::int64_t n) {
    return fake->reads_companion(at, n, fake->fault == Fault::kNotRead);
  };
  p.keeps = [fake](const AttentionShape&) { return fake->fault != Fault::kQkvNotKept; };
  p.keeps_grad = [fake](const AttentionShape&) { return fake->fault != Fault::kNotKept; };
  p.forward_rotated = [fake](float* out, float* lse, const float* q, const float*, const float*,
                             const AttentionShape& s, const kernels::QkRotation<float>& rope) {
    const std::int64_t hd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    const std::vector<float> x =
        rotated(*fake, q, s, rope, rope.rotary_dim, fake->fault == Fault::kForwardReadsZeros);
    fake->ops->attention_forward(out, lse, x.data(), x.data() + hd, x.data() + hd + kvd, s);
  };
  // The backward (rotating dq and dk back where `rope` has tables), writing the gradient into its
  // fp32 array, its companion or both, as it is paired. Without rotation the values are the 16-bit
  // attention's, widened: its companion holds them exactly.
  const auto backward = [fake](float* dq, const float* dout, const float* out, const float* lse,
                               const float* q, const AttentionShape& s,
                               const kernels::QkRotation<float>& rope) {
    const std::int64_t rows = s.batch * s.seq_len, stride = s.q_stride;
    const std::int64_t hd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    const std::int64_t n = rows * stride;
    const FakePair* f = fake->pair_of(dq, n);
    const bool alone = f != nullptr && f->alone;
    const std::int64_t rotary =
        alone && fake->fault == Fault::kWholeHead ? s.head_dim : rope.rotary_dim;
    const std::vector<float> x =
        rotated(*fake, q, s, rope, rotary, fake->fault == Fault::kBackwardReadsZeros);
    std::vector<float> d(static_cast<std::size_t>(n), 0.0f);
    fake->ops->attention_backward(d.data(), d.data() + hd, d.data() + hd + kvd, dout, out, lse,
                                  x.data(), x.data() + hd, x.data() + hd + kvd, s);
    if (rope.cos == nullptr) {
      for (float& e : d)
        e = testing::from16(to16(e, fake->type), fake->type);
    } else if (!(alone && fake->fault == Fault::kNotRotatedBack)) {
      const RopeShape shape{rows,       stride, s.seq_len,  s.heads + s.kv_heads,
                            s.head_dim, rotary, s.positions};
      fake->ops->rope_backward(d.data(), shape, rope.cos, rope.sin);
    }
    if (!alone) std::copy(d.begin(), d.end(), dq);
    if (f == nullptr) return;
    std::uint16_t* narrow = f->narrow + (dq - f->wide);
    for (std::int64_t i = 0; i < n; ++i) {
      if (alone && fake->fault == Fault::kDvUnwritten && i % stride >= hd + kvd) continue;
      narrow[i] = to16(d[static_cast<std::size_t>(i)], fake->type);
    }
  };
  p.backward_rotated = [backward](float* dq, float*, float*, const float* dout, const float* out,
                                  const float* lse, const float* q, const float*, const float*,
                                  const AttentionShape& s, const kernels::QkRotation<float>& rope) {
    backward(dq, dout, out, lse, q, s, rope);
  };
  p.forward = [fake](float* out, float* lse, const float* q, const float*, const float*,
                     const AttentionShape& s) {
    const std::int64_t hd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    const std::vector<float> x = rotated(
        *fake, q, s, {}, 0,
        fake->fault == Fault::kForwardReadsZeros || fake->fault == Fault::kUnrotatedReadsZeros);
    fake->ops->attention_forward(out, lse, x.data(), x.data() + hd, x.data() + hd + kvd, s);
  };
  p.backward = [backward](float* dq, float*, float*, const float* dout, const float* out,
                          const float* lse, const float* q, const float*, const float*,
                          const AttentionShape& s) { backward(dq, dout, out, lse, q, s, {}); };
  p.bias_backward = [fake](float* dbias, const float* dout, std::int64_t rows,
                           std::int64_t channels) {
    const std::vector<float> d =
        fake->read(dout, rows * channels, fake->fault == Fault::kBiasReadsZeros);
    fake->ops->bias_backward(dbias, d.data(), rows, channels);
  };
  p.gemm = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
    testing::paired_product(*fake, *fake->ops, ta, tb, m, n, k, a, lda, b, ldb, c, ldc,
                            fake->fault == Fault::kZerosAsB,
                            fake->fault == Fault::kProductTwoUnitsOff ? 11 : -1);
  };
  // The product plus its bias in fp32 (the verified gemm_bias), rounded once into a companion kept
  // alone (without the bias: kBiasLeftOut).
  p.gemm_bias = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                       const float* bias, float* c) {
    const std::vector<float> a_in = fake->read(a, (ta ? k : m) * lda);
    const std::vector<float> b_in = fake->read(b, (tb ? n : k) * ldb);
    std::vector<float> product(static_cast<std::size_t>(m * n));
    const std::vector<float> none(static_cast<std::size_t>(n), 0.0f);
    const bool left_out = fake->fault == Fault::kBiasLeftOut;
    fake->ops->gemm_bias(ta, tb, m, n, k, a_in.data(), lda, b_in.data(), ldb,
                         left_out ? none.data() : bias, product.data());
    const FakePair* f = fake->pair_of(c, m * n);
    if (f == nullptr || !f->alone) {
      std::copy(product.begin(), product.end(), c);
      return;
    }
    std::uint16_t* narrow = f->narrow + (c - f->wide);
    for (std::int64_t i = 0; i < m * n; ++i)
      narrow[i] = to16(product[static_cast<std::size_t>(i)], fake->type);
  };
  p.finish = [fake] {
    if (fake->fault == Fault::kFails) return Status(ErrorCode::kInternal, "the kernel failed");
    return Status::ok();
  };
  return p;
}

using Check = Status (*)(Backend&, const QkvAlonePath&, std::int64_t);

// The faithful fake passes `check` in bf16 and fp16 at head sizes 64 and 128.
void expect_faithful_passes(Check check) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    for (std::int64_t head_dim : {64, 128}) {
      const Status s = check(*backend, path(*backend, type, Fault::kNone), head_dim);
      EXPECT_TRUE(s.is_ok()) << to_string(type) << " " << head_dim << ": " << s.to_string();
    }
  }
}

struct FaultCase {
  Fault fault;
  std::string expect;  // in the error
};
// Each fault fails `check` in bf16 and fp16, naming what went wrong; an fp32 path is refused.
void expect_each_fault_fails(Check check, const std::vector<FaultCase>& cases) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (const FaultCase& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check(*backend, path(*backend, type, c.fault), 64);
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  QkvAlonePath fp32 = path(*backend, DType::kBF16, Fault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check(*backend, fp32, 64).code(), ErrorCode::kInvalidArgument);
}

const std::string kWhole = "GQA, whole head rotated (head size 64, rotary width 64, 2 x 24 tokens)";

TEST(QkvGradAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  expect_faithful_passes(check_qkv_grad_alone);
}

TEST(QkvGradAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  const std::string backward = kWhole + ", the rotated backward (dq, dk, dv side by side): ";
  expect_each_fault_fails(
      check_qkv_grad_alone,
      {
          {Fault::kRefused, kWhole + ": the ops refused to keep an activation alone"},
          {Fault::kNotKept, kWhole + ": the ops would not keep its q/k/v gradient alone"},
          {Fault::kNotRead, "a product reading the q/k/v gradient kept alone would not read"},
          {Fault::kNotRotatedBack, backward + "the companion kept alone holds"},
          {Fault::kDvUnwritten, backward + "the companion kept alone holds 0x0000 at [192]"},
          {Fault::kWholeHead,
           "partial rotary width (head size 64, rotary width 32, 2 x 23 tokens), the rotated "
           "backward"},
          {Fault::kZerosAsB,
           "after the rotated backward: the Llama family's weight gradient (activation as B)["},
          {Fault::kBiasReadsZeros,
           "no rotation (head size 64, rotary width 0, 2 x 24 tokens), the bias's gradient (its "
           "column sums)["},
          {Fault::kFails, "the kernel failed"},
      });
}

TEST(QkvAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  expect_faithful_passes(check_qkv_alone);
}

TEST(QkvAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  expect_each_fault_fails(
      check_qkv_alone,
      {
          {Fault::kRefused, kWhole + ": the ops refused to keep an activation alone"},
          {Fault::kQkvNotKept, kWhole + ": the ops would not keep its q, k and v alone"},
          {Fault::kProductTwoUnitsOff, kWhole + ": the 16-bit q, k, v's element 11 is"},
          {Fault::kForwardReadsZeros, kWhole + ", the rotated forward's out["},
          {Fault::kBackwardReadsZeros,
           kWhole + ", the rotated backward's dq, dk, dv (side by side)["},
          {Fault::kBiasLeftOut,
           "partial rotary width (head size 64, rotary width 32, 2 x 23 tokens): the 16-bit q, k, "
           "v (with their bias)'s element"},
          {Fault::kUnrotatedReadsZeros,
           "no rotation (head size 64, rotary width 0, 2 x 24 tokens), the forward's out["},
          {Fault::kFails, "the kernel failed"},
      });
}

TEST(QkvAloneCheck, AFailingPathIsListedOffWithOneWarningAndUnpairsWhatItPaired) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  testing::expect_listed_off_unpairing<QkvAlonePath>(
      path(*backend, DType::kBF16, Fault::kBackwardReadsZeros), kQkvAloneName, kQkvAloneReplaces,
      [&](const QkvAlonePath& p) { return check_qkv_alone(*backend, p, 64); });
}

TEST(QkvGradAloneCheck, AFailingPathIsListedOffWithOneWarningAndUnpairsWhatItPaired) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  testing::expect_listed_off_unpairing<QkvAlonePath>(
      path(*backend, DType::kBF16, Fault::kNotRotatedBack), kQkvGradAloneName,
      kQkvGradAloneReplaces,
      [&](const QkvAlonePath& p) { return check_qkv_grad_alone(*backend, p, 64); });
}

}  // namespace
}  // namespace strata::backend
