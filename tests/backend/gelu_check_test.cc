// The start-up check of GPT-2's MLP pre-activation in 16 bits (backend/gelu_check.h) on the CPU
// backend, with fakes of the two ops built from the verified ones and the rounding (a CPU backend's
// memory is the host's): the faithful fake passes in bf16 and fp16; a pre-activation 2 units in the
// last place off, one without its bias, a forward reading the 16-bit values as the other type, a
// backward reading the fp32 product where it should read its values rounded (no rounding of the
// pre-activation), one that accumulates onto a gradient it did not zero, and an op that fails each
// fail, naming what went wrong; an fp32 path is refused. FastPaths then lists the path off with one
// warning naming it.
#include "backend/gelu_check.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/fast_path.h"
#include "kernels/cpu/cast.h"
#include "support/cpu_backend_support.h"

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

}  // namespace
}  // namespace strata::backend
