// The start-up check of the activations only GEMMs read kept in 16 bits alone (alone_check.h) on
// the CPU backend, with fakes of the ops built from the verified ones and the rounding (a CPU
// backend's memory is the host's): the faithful fake passes in bf16 and fp16 and never touches the
// key's address range (any access to it faults); a fake refusing the pairing, one whose products
// would not read the companion, one whose RMSNorm with the residual add loses the sum where its
// output is kept alone, one truncating GELU's output kept alone, one leaving SwiGLU's stale, one
// whose fused GEMM adds the bias twice, one whose products read the activation kept alone as zeros
// in the B position, and one whose op fails each fail, naming what went wrong. FastPaths then lists
// the path off with one warning naming it.
#include "backend/alone_check.h"

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
  kNotRead,
  kNoResidual,
  kTruncated,
  kStale,
  kBiasTwice,
  kZerosAsB,
  kFails
};

using testing::FakePair;
using testing::to16;

// The fake ops' state: the pairs, shared by the path's calls.
struct Fake : testing::FakePairs {
  Ops<float>* ops = nullptr;
  Fault fault = Fault::kNone;

  // n values computed for `out`: into it and its companion, or into the companion alone.
  void write(float* out, const std::vector<float>& values, const char* op) {
    const auto n = static_cast<std::int64_t>(values.size());
    const FakePair* f = pair_of(out, n);
    if (f == nullptr || !f->alone) std::copy(values.begin(), values.end(), out);
    if (f == nullptr) return;
    if (f->alone && fault == Fault::kStale && std::string(op) == "swiglu") return;
    std::uint16_t* narrow = f->narrow + (out - f->wide);
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = values[static_cast<std::size_t>(i)];
      if (f->alone && fault == Fault::kTruncated && std::string(op) == "gelu") {
        std::uint32_t bits;
        std::memcpy(&bits, &v, 4);
        narrow[i] = type == DType::kBF16 ? static_cast<std::uint16_t>(bits >> 16) : to16(v, type);
        if (type == DType::kF16) narrow[i] ^= 1;
      } else {
        narrow[i] = to16(v, type);
      }
    }
  }
  // An operand of `extent` floats at p as a product reads it (zeros as B kept alone, the fault).
  std::vector<float> operand(const float* p, std::int64_t extent, bool as_b) const {
    return read(p, extent, as_b && fault == Fault::kZerosAsB);
  }
};

NarrowAlonePath path(Backend& backend, DType type, Fault fault) {
  auto fake = std::make_shared<Fake>();
  fake->type = type;
  fake->ops = &backend.ops_f32();
  fake->fault = fault;
  NarrowAlonePath p;
  p.type = type;
  p.pair = [fake](float* wide, void* narrow, std::int64_t n, bool alone) {
    return fake->pair(wide, narrow, n, alone, fake->fault == Fault::kRefused);
  };
  p.unpair = [fake](const float* wide) { fake->unpair(wide); };
  p.reads_companion = [fake](const float* at, std::int64_t n) {
    return fake->reads_companion(at, n, fake->fault == Fault::kNotRead);
  };
  p.layernorm = [fake](float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, std::int64_t rows, std::int64_t channels, double eps) {
    std::vector<float> v(static_cast<std::size_t>(rows * channels));
    fake->ops->layernorm_forward(v.data(), mean, rstd, x, w, b, rows, channels, eps);
    fake->write(out, v, "layernorm");
  };
  p.add_layernorm = [fake](float* res, const float* x, float* out, float* mean, float* rstd,
                           const float* w, const float* b, std::int64_t rows, std::int64_t channels,
                           double eps) {
    std::vector<float> v(static_cast<std::size_t>(rows * channels));
    fake->ops->add_layernorm_forward(res, x, v.data(), mean, rstd, w, b, rows, channels, eps);
    fake->write(out, v, "add_layernorm");
  };
  p.rmsnorm = [fake](float* out, float* rstd, const float* x, const float* w, std::int64_t rows,
                     std::int64_t channels, double eps) {
    std::vector<float> v(static_cast<std::size_t>(rows * channels));
    fake->ops->rmsnorm_forward(v.data(), rstd, x, w, rows, channels, eps);
    fake->write(out, v, "rmsnorm");
  };
  p.add_rmsnorm = [fake](float* res, const float* x, float* out, float* rstd, const float* w,
                         std::int64_t rows, std::int64_t channels, double eps) {
    std::vector<float> v(static_cast<std::size_t>(rows * channels));
    // The fault: the sum is not written back where the output is kept alone.
    std::vector<float> sum(res, res + rows * channels);
    const FakePair* f = fake->pair_of(out, rows * channels);
    const bool lose = fake->fault == Fault::kNoResidual && f != nullptr && f->alone;
    fake->ops->add_rmsnorm_forward(lose ? sum.data() : res, x, v.data(), rstd, w, rows, channels,
                                   eps);
    fake->write(out, v, "add_rmsnorm");
  };
  p.gelu = [fake](float* out, const float* x, std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    fake->ops->gelu_forward(v.data(), x, n);
    fake->write(out, v, "gelu");
  };
  p.swiglu = [fake](float* out, const float* gate_up, std::int64_t rows, std::int64_t inner) {
    std::vector<float> v(static_cast<std::size_t>(rows * inner));
    fake->ops->swiglu_forward(v.data(), gate_up, rows, inner);
    fake->write(out, v, "swiglu");
  };
  p.gemm_bias = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                       const float* bias, float* c) {
    fake->ops->gemm_bias(ta, tb, m, n, k, a, lda, b, ldb, bias, c);
  };
  p.gemm_bias_gelu = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                            const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                            const float* bias, float* pre, float* act) {
    fake->ops->gemm_bias(ta, tb, m, n, k, a, lda, b, ldb, bias, pre);
    if (fake->fault == Fault::kBiasTwice) fake->ops->add_bias(pre, bias, m, n);
    std::vector<float> v(static_cast<std::size_t>(m * n));
    fake->ops->gelu_forward(v.data(), pre, m * n);
    fake->write(act, v, "gelu_fused");
  };
  p.gemm = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
    const std::vector<float> a_in = fake->operand(a, (ta ? k : m) * lda, false);
    const std::vector<float> b_in = fake->operand(b, (tb ? n : k) * ldb, true);
    fake->ops->gemm(ta, tb, m, n, k, 1.0f, a_in.data(), lda, b_in.data(), ldb, 0.0f, c, ldc);
  };
  p.finish = [fake] {
    if (fake->fault == Fault::kFails) return Status(ErrorCode::kInternal, "the kernel failed");
    return Status::ok();
  };
  return p;
}

TEST(NarrowAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const Status s = check_narrow_alone(*backend, path(*backend, type, Fault::kNone));
    EXPECT_TRUE(s.is_ok()) << to_string(type) << ": " << s.to_string();
  }
}

TEST(NarrowAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {
      {Fault::kRefused, "6 rows of 40: the ops refused to keep an activation alone"},
      {Fault::kNotRead, "6 rows of 40: a product reading the activation kept alone would not"},
      {Fault::kNoResidual, "6 rows of 40, RMSNorm after the residual add: its residual sum["},
      {Fault::kTruncated, "6 rows of 40, GELU: the companion kept alone holds"},
      {Fault::kStale, "6 rows of 40, SwiGLU: the companion kept alone holds"},
      {Fault::kBiasTwice, "the GEMM with bias and GELU: its pre-activation["},
      {Fault::kZerosAsB,
       "6 rows of 40, after LayerNorm: the Llama family's weight gradient (activation as B)["},
      {Fault::kFails, "the kernel failed"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_narrow_alone(*backend, path(*backend, type, c.fault));
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  NarrowAlonePath fp32 = path(*backend, DType::kBF16, Fault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_narrow_alone(*backend, fp32).code(), ErrorCode::kInvalidArgument);
}

TEST(NarrowAloneCheck, AFailingPathIsListedOffWithOneWarningAndUnpairsWhatItPaired) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  testing::expect_listed_off_unpairing<NarrowAlonePath>(
      path(*backend, DType::kBF16, Fault::kStale), kActivations16AloneName,
      kActivations16AloneReplaces,
      [&](const NarrowAlonePath& p) { return check_narrow_alone(*backend, p); });
}

}  // namespace
}  // namespace strata::backend
