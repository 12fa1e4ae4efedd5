// The 16-bit logits fast path's start-up check (backend/logits_check.h) on the CPU backend, with
// fakes of the three ops built from the verified ones and the rounding (a CPU backend's memory is
// the host's): the faithful fake passes in bf16 and fp16; a fake writing the other 16-bit type,
// one giving each row the next row's loss, one leaving the gradient unscaled, one writing the
// gradient over the rows' padding, one doubling the
// input gradient and one whose op fails each fail, naming what went wrong. FastPaths then lists
// the path off with one warning naming it.
#include "backend/logits_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/fast_path.h"
#include "kernels/cpu/float16.h"
#include "support/cpu_backend_support.h"

namespace strata::backend {
namespace {

enum class Fault {
  kNone,
  kOtherType,
  kNextRowsLoss,
  kUnscaled,
  kPastTheRow,
  kDoubledInput,
  kFails
};

std::uint16_t to16(float f, DType type) {
  return type == DType::kBF16 ? kernels::float_to_bf16(f) : kernels::float_to_fp16(f);
}
float from16(std::uint16_t h, DType type) {
  return type == DType::kBF16 ? kernels::bf16_to_float(h) : kernels::fp16_to_float(h);
}

NarrowLogitsPath path(Backend& backend, DType type, Fault fault) {
  Ops<float>* ops = &backend.ops_f32();
  NarrowLogitsPath p;
  p.type = type;
  const DType written =
      fault == Fault::kOtherType ? (type == DType::kBF16 ? DType::kF16 : DType::kBF16) : type;
  p.to_narrow = [ops, written](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                               const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                               void* c, std::int64_t ldc) {
    std::vector<float> product(static_cast<std::size_t>(m * n));
    ops->gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, product.data(), n);
    auto* out = static_cast<std::uint16_t*>(c);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        out[i * ldc + j] = to16(product[static_cast<std::size_t>(i * n + j)], written);
    return Status::ok();
  };
  p.cross_entropy = [ops, type, fault](bool gradient, void* logits, std::int64_t ld, float* losses,
                                       const std::int32_t* targets, std::int64_t rows,
                                       std::int64_t vocab, double grad_scale) {
    if (fault == Fault::kFails) return Status(ErrorCode::kInternal, "the kernel failed to launch");
    auto* x = static_cast<std::uint16_t*>(logits);
    std::vector<float> wide(static_cast<std::size_t>(rows * vocab));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < vocab; ++j)
        wide[static_cast<std::size_t>(r * vocab + j)] = from16(x[r * ld + j], type);
    const double scale = fault == Fault::kUnscaled ? 1.0 : grad_scale;
    ops->cross_entropy_fused(wide.data(), losses, targets, rows, vocab, scale);
    if (fault == Fault::kNextRowsLoss) {
      for (std::int64_t r = 0; r + 1 < rows; ++r)
        losses[r] = losses[r + 1];
    }
    if (gradient) {
      const std::int64_t end = fault == Fault::kPastTheRow ? ld : vocab;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < end; ++j)
          x[r * ld + j] =
              to16(j < vocab ? wide[static_cast<std::size_t>(r * vocab + j)] : 0.0f, type);
    }
    return Status::ok();
  };
  p.from_narrow = [ops, type, fault](bool ta, bool tb, std::int64_t m, std::int64_t n,
                                     std::int64_t k, float alpha, const void* a, std::int64_t lda,
                                     const float* b, std::int64_t ldb, float beta, float* c,
                                     std::int64_t ldc) {
    const auto* x = static_cast<const std::uint16_t*>(a);
    const std::int64_t stored_rows = ta ? k : m;
    std::vector<float> wide(static_cast<std::size_t>(stored_rows * lda));
    for (std::size_t i = 0; i < wide.size(); ++i)
      wide[i] = from16(x[i], type);
    const float factor = fault == Fault::kDoubledInput && !ta ? 2.0f : 1.0f;
    ops->gemm(ta, tb, m, n, k, alpha * factor, wide.data(), lda, b, ldb, beta, c, ldc);
    return Status::ok();
  };
  return p;
}

TEST(NarrowLogitsCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const Status s = check_narrow_logits(*backend, path(*backend, type, Fault::kNone));
    EXPECT_TRUE(s.is_ok()) << to_string(type) << ": " << s.to_string();
  }
}

TEST(NarrowLogitsCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {
      {Fault::kOtherType, "the 16-bit logits over 6 rows of a 150-word vocabulary (hidden 40)"},
      {Fault::kNextRowsLoss, "the losses over 6 rows"},
      {Fault::kUnscaled, "the 16-bit gradient"},
      {Fault::kPastTheRow, "row 0 of the 16-bit logits was written past its 150 words"},
      {Fault::kDoubledInput, "the input gradient"},
      {Fault::kFails, "the kernel failed to launch"},
  };
  for (const auto& c : cases) {
    const Status s = check_narrow_logits(*backend, path(*backend, DType::kBF16, c.fault));
    ASSERT_FALSE(s.is_ok()) << c.expect;
    EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
  }
  NarrowLogitsPath fp32 = path(*backend, DType::kBF16, Fault::kNone);
  fp32.type = DType::kF32;
  const Status s = check_narrow_logits(*backend, fp32);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.to_string();
}

TEST(NarrowLogitsCheck, AFailingPathIsListedOffWithOneWarning) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  std::vector<std::string> warnings;
  FastPaths paths([&](const std::string& m) { warnings.push_back(m); });
  const bool on = paths.adopt(kLogits16Name, kLogits16Replaces, "16-bit logits", [&] {
    return check_narrow_logits(*backend, path(*backend, DType::kBF16, Fault::kUnscaled));
  });
  EXPECT_FALSE(on);
  EXPECT_FALSE(paths.active(kLogits16Name));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("fast path logits_16bit is off"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(kLogits16Replaces), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace strata::backend
