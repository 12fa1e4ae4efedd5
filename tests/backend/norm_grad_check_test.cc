// The start-up check of the norms' output gradient kept in 16 bits alone (norm_grad_check.h) on the
// CPU backend, with fakes of the ops built from the verified ones and the rounding (a CPU backend's
// memory is the host's) that keep their pairs as the backend does and never touch the key's
// address range (any access to it faults): the faithful fake passes in bf16 and fp16; a refused
// pairing, a gradient the ops would not keep alone, a 16-bit product 2 units off (in either
// layout), LayerNorm's backward reading the gradient kept alone as zeros, RMSNorm's leaving dw
// unadded, and an op that fails each fail, naming what went wrong. FastPaths then lists the path
// off with one warning naming it, and the check unpairs what it paired.
#include "backend/norm_grad_check.h"

#include <gtest/gtest.h>

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
  kTwoUnitsOff,
  kTwoUnitsOffUntransposed,
  kLayerNormReadsZeros,
  kRmsNormSkipsDw,
  kFails
};

// The fake ops' state: the pairs, shared by the path's calls.
struct Fake : testing::FakePairs {
  Ops<float>* ops = nullptr;
  Fault fault = Fault::kNone;
};

NormGradAlonePath path(Backend& backend, DType type, Fault fault) {
  auto fake = std::make_shared<Fake>();
  fake->type = type;
  fake->ops = &backend.ops_f32();
  fake->fault = fault;
  NormGradAlonePath p;
  p.type = type;
  p.pair = [fake](float* wide, void* narrow, std::int64_t n, bool alone) {
    return fake->pair(wide, narrow, n, alone, fake->fault == Fault::kRefused);
  };
  p.unpair = [fake](const float* wide) { fake->unpair(wide); };
  p.keeps = [fake] { return fake->fault != Fault::kNotKept; };
  p.gemm = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
    const bool off = fake->fault == (tb ? Fault::kTwoUnitsOff : Fault::kTwoUnitsOffUntransposed);
    fake->product_alone(*fake->ops, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, off ? 9 : -1);
  };
  p.layernorm_backward = [fake](float* dx, float* dw, float* db, const float* dout, const float* x,
                                const float* w, const float* mean, const float* rstd,
                                std::int64_t rows, std::int64_t channels) {
    const std::vector<float> d =
        fake->read(dout, rows * channels, fake->fault == Fault::kLayerNormReadsZeros);
    fake->ops->layernorm_backward(dx, dw, db, d.data(), x, w, mean, rstd, rows, channels);
  };
  p.rmsnorm_backward = [fake](float* dx, float* dw, const float* dout, const float* x,
                              const float* w, const float* rstd, std::int64_t rows,
                              std::int64_t channels) {
    const std::vector<float> d = fake->read(dout, rows * channels);
    std::vector<float> unused(static_cast<std::size_t>(channels));
    fake->ops->rmsnorm_backward(dx, fake->fault == Fault::kRmsNormSkipsDw ? unused.data() : dw,
                                d.data(), x, w, rstd, rows, channels);
  };
  p.finish = [fake] {
    if (fake->fault == Fault::kFails) return Status(ErrorCode::kInternal, "the kernel failed");
    return Status::ok();
  };
  return p;
}

TEST(NormGradAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const Status s = check_norm_grad_alone(*backend, path(*backend, type, Fault::kNone));
    EXPECT_TRUE(s.is_ok()) << to_string(type) << ": " << s.to_string();
  }
}

TEST(NormGradAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {
      {Fault::kRefused, "6 rows of 40 channels: the ops refused"},
      {Fault::kNotKept, "the ops would not keep the norms' output gradient in 16 bits alone"},
      {Fault::kTwoUnitsOff,
       "6 rows of 40 channels, GPT-2's product (B transposed): the 16-bit gradient's element 9 is"},
      {Fault::kTwoUnitsOffUntransposed,
       "6 rows of 40 channels, the Llama family's product: the 16-bit gradient's element 9 is"},
      {Fault::kLayerNormReadsZeros,
       "6 rows of 40 channels, GPT-2's product (B transposed), LayerNorm's backward on the "
       "gradient kept alone: dx, dw, db[0]"},
      {Fault::kRmsNormSkipsDw,
       "6 rows of 40 channels, GPT-2's product (B transposed), RMSNorm's backward on the gradient "
       "kept alone: dx, dw[240]"},
      {Fault::kFails, "the kernel failed"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_norm_grad_alone(*backend, path(*backend, type, c.fault));
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  NormGradAlonePath fp32 = path(*backend, DType::kBF16, Fault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_norm_grad_alone(*backend, fp32).code(), ErrorCode::kInvalidArgument);
}

TEST(NormGradAloneCheck, AFailingPathIsListedOffWithOneWarningAndUnpairsWhatItPaired) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  testing::expect_listed_off_unpairing<NormGradAlonePath>(
      path(*backend, DType::kBF16, Fault::kLayerNormReadsZeros), kNormGradAloneName,
      kNormGradAloneReplaces,
      [&](const NormGradAlonePath& p) { return check_norm_grad_alone(*backend, p); });
}

}  // namespace
}  // namespace strata::backend
