// The start-up check of GPT-2's MLP pre-activation in 16 bits (backend/gelu_check.h) on the CPU
// backend, with fakes of the two ops built from the verified ones and the rounding (a CPU backend's
// memory is the host's): the faithful fake passes in bf16 and fp16; a pre-activation 2 units in the
// last place off, one without its bias, a forward reading the 16-bit values as the other type, a
// backward reading the fp32 product where it should read its values rounded (no rounding of the
// pre-activation), one that accumulates onto a gradient it did not zero, and an op that fails each
// fail, naming what went wrong; an fp32 path is refused. FastPaths then lists the path off with one
// warning naming it.
//
// The check of GELU's gradient kept in 16 bits alone (gelu_grad_16bit_alone) likewise, with fakes
// that keep their pairs as the backend does and never touch the key's address range (any access
// to it faults): the faithful fake passes in bf16 and fp16; a refused pairing, a gradient the ops
// would not keep alone, products that would not read the companion, a backward writing the
// companion kept alone 1 unit off in its last element, products reading the gradient kept alone
// as zeros (as A), bias sums reading it in fp32 where it has none (zeros) and an op that fails
// each fail, naming what went wrong; a failing path is listed off and unpairs what it paired.
#include "backend/gelu_check.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/fast_path.h"
#include "kernels/cpu/cast.h"
#include "support/cpu_backend_support.h"
#include "support/narrow_pairs_fake.h"

namespace strata::backend {
namespace {

enum class Fault { kNone, kTwoUlps, kNoBias, kOtherType, kUnrounded, kAccumulates, kFails };

std::vector<float> widened(const void* x, DType type, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  kernels::cast_array(v.data(), DType::kF32, x, type, n);
  return v;
}

NarrowGeluPath path(Backend& backend, DType type, Fault fault) {
  Ops<float>* ops = &backend.ops_f32();
  NarrowGeluPath p;
  p.type = type;
  const DType read =
      fault == Fault::kOtherType ? (type == DType::kBF16 ? DType::kF16 : DType::kBF16) : type;
  // The fp32 product and bias the fake rounded last (the kUnrounded fault's backward reads them).
  auto last = std::make_shared<std::vector<float>>();
  p.forward = [ops, type, read, fault, last](bool ta, bool tb, std::int64_t m, std::int64_t n,
                                             std::int64_t k, const float* a, std::int64_t lda,
                                             const float* b, std::int64_t ldb, const float* bias,
                                             void* pre16, float* act) {
    std::vector<float> pre(static_cast<std::size_t>(m * n));
    const std::vector<float> none(static_cast<std::size_t>(n), 0.0f);
    ops->gemm_bias(ta, tb, m, n, k, a, lda, b, ldb, fault == Fault::kNoBias ? none.data() : bias,
                   pre.data());
    *last = pre;
    auto* out = static_cast<std::uint16_t*>(pre16);
    kernels::cast_array(out, type, pre.data(), DType::kF32, m * n);
    if (fault == Fault::kTwoUlps) out[m * n - 1] += 2;
    const std::vector<float> x = widened(pre16, read, m * n);
    ops->gelu_forward(act, x.data(), m * n);
  };
  p.backward = [ops, type, fault, last](bool ta, bool tb, std::int64_t m, std::int64_t n,
                                        std::int64_t k, const float* a, std::int64_t lda,
                                        const float* b, std::int64_t ldb, const void* pre16,
                                        float* scratch, float* dpre) {
    ops->gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, scratch, n);
    const std::vector<float> x = fault == Fault::kUnrounded ? *last : widened(pre16, type, m * n);
    if (fault == Fault::kAccumulates) {
      for (std::int64_t i = 0; i < m * n; ++i)
        dpre[i] = 0.25f;
    } else {
      ops->zero(dpre, m * n);
    }
    ops->gelu_backward(dpre, x.data(), scratch, m * n);
  };
  p.finish = [fault] {
    if (fault == Fault::kFails) return Status(ErrorCode::kInternal, "the kernel failed to launch");
    return Status::ok();
  };
  return p;
}

TEST(NarrowGeluCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const Status s = check_narrow_gelu(*backend, path(*backend, type, Fault::kNone));
    EXPECT_TRUE(s.is_ok()) << to_string(type) << ": " << s.to_string();
  }
}

TEST(NarrowGeluCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {
      {Fault::kTwoUlps, "6 rows of 40 inner columns: the 16-bit pre-activation's element 239"},
      {Fault::kNoBias, "6 rows of 40 inner columns: the 16-bit pre-activation's element"},
      {Fault::kOtherType, "6 rows of 40 inner columns, GELU's forward["},
      {Fault::kUnrounded, "6 rows of 40 inner columns, GELU's backward["},
      {Fault::kAccumulates, "6 rows of 40 inner columns, GELU's backward[0]"},
      {Fault::kFails, "the kernel failed to launch"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_narrow_gelu(*backend, path(*backend, type, c.fault));
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  NarrowGeluPath fp32 = path(*backend, DType::kBF16, Fault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_narrow_gelu(*backend, fp32).code(), ErrorCode::kInvalidArgument);
}

TEST(NarrowGeluCheck, AFailingPathIsListedOffWithOneWarning) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  std::vector<std::string> warnings;
  FastPaths paths([&](const std::string& m) { warnings.push_back(m); });
  const bool on = paths.adopt(kGelu16Name, kGelu16Replaces, "GELU's input in 16 bits", [&] {
    return check_narrow_gelu(*backend, path(*backend, DType::kBF16, Fault::kUnrounded));
  });
  EXPECT_FALSE(on);
  EXPECT_FALSE(paths.active(kGelu16Name));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("fast path gelu_16bit is off"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(kGelu16Replaces), std::string::npos) << warnings[0];
}

enum class AloneFault {
  kNone,
  kRefused,
  kNotKept,
  kNotRead,
  kTruncated,
  kZerosAsA,
  kBiasReadsZeros,
  kFails
};

struct AloneFake : testing::FakePairs {
  Ops<float>* ops = nullptr;
  AloneFault fault = AloneFault::kNone;
};

GeluGradAlonePath alone_path(Backend& backend, DType type, AloneFault fault) {
  auto fake = std::make_shared<AloneFake>();
  fake->type = type;
  fake->ops = &backend.ops_f32();
  fake->fault = fault;
  GeluGradAlonePath p;
  p.type = type;
  p.pair = [fake](float* wide, void* narrow, std::int64_t n, bool alone) {
    return fake->pair(wide, narrow, n, alone, fake->fault == AloneFault::kRefused);
  };
  p.unpair = [fake](const float* wide) { fake->unpair(wide); };
  p.reads_companion = [fake](const float* at, std::int64_t n) {
    return fake->reads_companion(at, n, fake->fault == AloneFault::kNotRead);
  };
  p.keeps = [fake] { return fake->fault != AloneFault::kNotKept; };
  p.backward = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                      const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                      const void* pre16, float* scratch, float* d) {
    const std::int64_t count = m * n;
    fake->ops->gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, scratch, n);
    const std::vector<float> x = widened(pre16, fake->type, count);
    std::vector<float> out(static_cast<std::size_t>(count), 0.0f);
    fake->ops->gelu_backward(out.data(), x.data(), scratch, count);
    const testing::FakePair* f = fake->pair_of(d, count);
    const bool alone = f != nullptr && f->alone;
    if (!alone) std::copy(out.begin(), out.end(), d);
    if (f == nullptr) return;
    std::uint16_t* narrow = f->narrow + (d - f->wide);
    for (std::int64_t i = 0; i < count; ++i) {
      narrow[i] = testing::to16(out[static_cast<std::size_t>(i)], fake->type);
      if (alone && fake->fault == AloneFault::kTruncated && i == count - 1) narrow[i] ^= 1;
    }
  };
  p.bias_backward = [fake](float* dbias, const float* dout, std::int64_t rows,
                           std::int64_t channels) {
    const std::vector<float> d =
        fake->read(dout, rows * channels, fake->fault == AloneFault::kBiasReadsZeros);
    fake->ops->bias_backward(dbias, d.data(), rows, channels);
  };
  p.gemm = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
    const std::vector<float> a_in =
        fake->read(a, (ta ? k : m) * lda, fake->fault == AloneFault::kZerosAsA);
    const std::vector<float> b_in = fake->read(b, (tb ? n : k) * ldb);
    fake->ops->gemm(ta, tb, m, n, k, 1.0f, a_in.data(), lda, b_in.data(), ldb, 0.0f, c, ldc);
  };
  p.finish = [fake] {
    if (fake->fault == AloneFault::kFails) return Status(ErrorCode::kInternal, "the kernel failed");
    return Status::ok();
  };
  return p;
}

TEST(GeluGradAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const Status s = check_gelu_grad_alone(*backend, alone_path(*backend, type, AloneFault::kNone));
    EXPECT_TRUE(s.is_ok()) << to_string(type) << ": " << s.to_string();
  }
}

TEST(GeluGradAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    AloneFault fault;
    const char* expect;
  } cases[] = {
      {AloneFault::kRefused, "6 rows of 40 inner columns: the ops refused"},
      {AloneFault::kNotKept, "the ops would not keep GELU's gradient in 16 bits alone"},
      {AloneFault::kNotRead,
       "6 rows of 40 inner columns: a product reading GELU's gradient kept alone would not read "
       "its companion"},
      {AloneFault::kTruncated, "6 rows of 40 inner columns, GELU's backward"},
      {AloneFault::kZerosAsA,
       "6 rows of 40 inner columns, after GELU's backward: the next projection (activation as A)"},
      {AloneFault::kBiasReadsZeros,
       "6 rows of 40 inner columns, the bias's gradient (its column sums) of the gradient kept "
       "alone["},
      {AloneFault::kFails, "the kernel failed"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_gelu_grad_alone(*backend, alone_path(*backend, type, c.fault));
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  GeluGradAlonePath fp32 = alone_path(*backend, DType::kBF16, AloneFault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_gelu_grad_alone(*backend, fp32).code(), ErrorCode::kInvalidArgument);
}

TEST(GeluGradAloneCheck, AFailingPathIsListedOffWithOneWarningAndUnpairsWhatItPaired) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  testing::expect_listed_off_unpairing<GeluGradAlonePath>(
      alone_path(*backend, DType::kBF16, AloneFault::kTruncated), kGeluGradAloneName,
      kGeluGradAloneReplaces,
      [&](const GeluGradAlonePath& p) { return check_gelu_grad_alone(*backend, p); });
}

}  // namespace
}  // namespace strata::backend
