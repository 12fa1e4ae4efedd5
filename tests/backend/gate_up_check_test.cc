// The start-up check of the gate and up projections in 16 bits alone (backend/gate_up_check.h) on
// the CPU backend, with fakes of the three ops built from the verified ones and the rounding (a CPU
// backend's memory is the host's): the faithful fake passes in bf16 and fp16; a product 2 units in
// the last place off, a forward swapping gate and up, a backward doubling up's gradient, a forward
// reading the 16-bit values as the other type, and an op that fails each fail, naming what went
// wrong. FastPaths then lists the path off with one warning naming it.
#include "backend/gate_up_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/fast_path.h"
#include "kernels/cpu/cast.h"
#include "support/cpu_backend_support.h"

namespace strata::backend {
namespace {

enum class Fault { kNone, kTwoUlps, kSwapped, kDoubledUp, kOtherType, kFails };

// gate_up (rows x 2 inner) in `type`, widened.
std::vector<float> widened(const void* gate_up, DType type, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  kernels::cast_array(v.data(), DType::kF32, gate_up, type, n);
  return v;
}

NarrowGateUpPath path(Backend& backend, DType type, Fault fault) {
  Ops<float>* ops = &backend.ops_f32();
  NarrowGateUpPath p;
  p.type = type;
  const DType read =
      fault == Fault::kOtherType ? (type == DType::kBF16 ? DType::kF16 : DType::kBF16) : type;
  p.to_narrow = [ops, type, fault](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                                   const float* a, std::int64_t lda, const float* b,
                                   std::int64_t ldb, void* c, std::int64_t ldc) {
    std::vector<float> product(static_cast<std::size_t>(m * n));
    ops->gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, product.data(), n);
    auto* out = static_cast<std::uint16_t*>(c);
    for (std::int64_t i = 0; i < m; ++i) {
      kernels::cast_array(out + i * ldc, type, product.data() + i * n, DType::kF32, n);
      if (fault == Fault::kTwoUlps && i == m - 1) out[i * ldc + n - 1] += 2;
    }
  };
  p.forward = [ops, read, fault](float* out, const void* gate_up, std::int64_t rows,
                                 std::int64_t inner) {
    std::vector<float> g = widened(gate_up, read, rows * 2 * inner);
    if (fault == Fault::kSwapped) {
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < inner; ++j)
          std::swap(g[static_cast<std::size_t>(r * 2 * inner + j)],
                    g[static_cast<std::size_t>(r * 2 * inner + inner + j)]);
    }
    ops->swiglu_forward(out, g.data(), rows, inner);
  };
  p.backward = [ops, type, fault](float* d, const void* gate_up, const float* dout,
                                  std::int64_t rows, std::int64_t inner) {
    const std::vector<float> g = widened(gate_up, type, rows * 2 * inner);
    ops->swiglu_backward(d, g.data(), dout, rows, inner);
    if (fault == Fault::kDoubledUp) {
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < inner; ++j)
          d[r * 2 * inner + inner + j] *= 2.0f;
    }
  };
  p.finish = [fault] {
    if (fault == Fault::kFails) return Status(ErrorCode::kInternal, "the kernel failed to launch");
    return Status::ok();
  };
  return p;
}

TEST(NarrowGateUpCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const Status s = check_narrow_gate_up(*backend, path(*backend, type, Fault::kNone));
    EXPECT_TRUE(s.is_ok()) << to_string(type) << ": " << s.to_string();
  }
}

TEST(NarrowGateUpCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    Fault fault;
    const char* expect;
  } cases[] = {
      {Fault::kTwoUlps, "6 rows of 40 inner columns: the 16-bit product's element 479"},
      {Fault::kSwapped, "6 rows of 40 inner columns: SwiGLU's forward["},
      {Fault::kDoubledUp, "6 rows of 40 inner columns: SwiGLU's backward[40]"},
      {Fault::kOtherType, "6 rows of 40 inner columns: SwiGLU's forward["},
      {Fault::kFails, "the kernel failed to launch"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_narrow_gate_up(*backend, path(*backend, type, c.fault));
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  NarrowGateUpPath fp32 = path(*backend, DType::kBF16, Fault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_narrow_gate_up(*backend, fp32).code(), ErrorCode::kInvalidArgument);
}

TEST(NarrowGateUpCheck, AFailingPathIsListedOffWithOneWarning) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  std::vector<std::string> warnings;
  FastPaths paths([&](const std::string& m) { warnings.push_back(m); });
  const bool on = paths.adopt(kGateUp16Name, kGateUp16Replaces, "gate and up in 16 bits", [&] {
    return check_narrow_gate_up(*backend, path(*backend, DType::kBF16, Fault::kSwapped));
  });
  EXPECT_FALSE(on);
  EXPECT_FALSE(paths.active(kGateUp16Name));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("fast path gate_up_16bit is off"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(kGateUp16Replaces), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace strata::backend
