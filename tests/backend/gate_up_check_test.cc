// The start-up check of the gate and up projections in 16 bits alone (backend/gate_up_check.h) on
// the CPU backend, with fakes of the three ops built from the verified ones and the rounding (a CPU
// backend's memory is the host's): the faithful fake passes in bf16 and fp16; a product 2 units in
// the last place off, a forward swapping gate and up, a backward doubling up's gradient, a forward
// reading the 16-bit values as the other type, and an op that fails each fail, naming what went
// wrong. FastPaths then lists the path off with one warning naming it.
//
// The check of SwiGLU's output gradient kept in 16 bits alone (swiglu_grad_16bit) likewise, with
// fakes that keep their pairs as the backend does and never touch the key's address range (any
// access to it faults): the faithful fake passes in bf16 and fp16; a refused pairing, a gradient
// the ops would not keep alone, a 16-bit product 2 units off, a backward reading the gradient kept
// alone as zeros, one reading it in fp32 rounded to the other 16-bit type and an op that fails
// each fail, naming what went wrong; a failing path is listed off and unpairs what it paired.
//
// The check of the gradient of gate and up kept in 16 bits alone (gate_up_grad_16bit_alone)
// likewise: the faithful fake passes; a refused pairing, a gradient the ops would not keep alone,
// products that would not read the companion, a backward writing the companion kept alone 1 unit
// off in its last element, products reading the gradient kept alone as zeros (as A) and an op that
// fails each fail, naming what went wrong; a failing path is listed off and unpairs what it paired.
#include "backend/gate_up_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend/fast_path.h"
#include "kernels/cpu/cast.h"
#include "support/cpu_backend_support.h"
#include "support/narrow_pairs_fake.h"

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

enum class GradFault { kNone, kRefused, kNotKept, kTwoUnitsOff, kReadAsZeros, kOtherType, kFails };

// The fake ops' state: the pairs, shared by the path's calls.
struct GradFake : testing::FakePairs {
  Ops<float>* ops = nullptr;
  GradFault fault = GradFault::kNone;
};

SwigluGradAlonePath grad_path(Backend& backend, DType type, GradFault fault) {
  auto fake = std::make_shared<GradFake>();
  fake->type = type;
  fake->ops = &backend.ops_f32();
  fake->fault = fault;
  SwigluGradAlonePath p;
  p.type = type;
  p.pair = [fake](float* wide, void* narrow, std::int64_t n, bool alone) {
    return fake->pair(wide, narrow, n, alone, fake->fault == GradFault::kRefused);
  };
  p.unpair = [fake](const float* wide) { fake->unpair(wide); };
  p.keeps = [fake] { return fake->fault != GradFault::kNotKept; };
  p.gemm = [fake](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
    fake->product_alone(*fake->ops, ta, tb, m, n, k, a, lda, b, ldb, c, ldc,
                        fake->fault == GradFault::kTwoUnitsOff ? 7 : -1);
  };
  p.backward = [fake](float* d, const void* gate_up, const float* dout, std::int64_t rows,
                      std::int64_t inner) {
    const std::vector<float> g = widened(gate_up, fake->type, rows * 2 * inner);
    std::vector<float> dy = fake->read(dout, rows * inner, fake->fault == GradFault::kReadAsZeros);
    if (fake->fault == GradFault::kOtherType) {
      const DType other = fake->type == DType::kBF16 ? DType::kF16 : DType::kBF16;
      for (float& x : dy)
        x = testing::from16(testing::to16(x * 1.001f, other), other);
    }
    fake->ops->swiglu_backward(d, g.data(), dy.data(), rows, inner);
  };
  p.finish = [fake] {
    if (fake->fault == GradFault::kFails) return Status(ErrorCode::kInternal, "the kernel failed");
    return Status::ok();
  };
  return p;
}

TEST(SwigluGradAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const Status s = check_swiglu_grad_alone(*backend, grad_path(*backend, type, GradFault::kNone));
    EXPECT_TRUE(s.is_ok()) << to_string(type) << ": " << s.to_string();
  }
}

TEST(SwigluGradAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    GradFault fault;
    const char* expect;
  } cases[] = {
      {GradFault::kRefused, "6 rows of 40 inner columns: the ops refused"},
      {GradFault::kNotKept, "the ops would not keep SwiGLU's output gradient in 16 bits alone"},
      {GradFault::kTwoUnitsOff, "6 rows of 40 inner columns: the 16-bit gradient's element 7 is"},
      {GradFault::kReadAsZeros,
       "6 rows of 40 inner columns, SwiGLU's backward on the gradient kept alone[0]"},
      {GradFault::kOtherType, "6 rows of 40 inner columns, SwiGLU's backward on the gradient"},
      {GradFault::kFails, "the kernel failed"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_swiglu_grad_alone(*backend, grad_path(*backend, type, c.fault));
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  SwigluGradAlonePath fp32 = grad_path(*backend, DType::kBF16, GradFault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_swiglu_grad_alone(*backend, fp32).code(), ErrorCode::kInvalidArgument);
}

TEST(SwigluGradAloneCheck, AFailingPathIsListedOffWithOneWarningAndUnpairsWhatItPaired) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  testing::expect_listed_off_unpairing<SwigluGradAlonePath>(
      grad_path(*backend, DType::kBF16, GradFault::kReadAsZeros), kSwigluGradAloneName,
      kSwigluGradAloneReplaces,
      [&](const SwigluGradAlonePath& p) { return check_swiglu_grad_alone(*backend, p); });
}

enum class AloneFault { kNone, kRefused, kNotKept, kNotRead, kTruncated, kZerosAsA, kFails };

struct AloneFake : testing::FakePairs {
  Ops<float>* ops = nullptr;
  AloneFault fault = AloneFault::kNone;
};

GateUpGradAlonePath alone_path(Backend& backend, DType type, AloneFault fault) {
  auto fake = std::make_shared<AloneFake>();
  fake->type = type;
  fake->ops = &backend.ops_f32();
  fake->fault = fault;
  GateUpGradAlonePath p;
  p.type = type;
  p.pair = [fake](float* wide, void* narrow, std::int64_t n, bool alone) {
    return fake->pair(wide, narrow, n, alone, fake->fault == AloneFault::kRefused);
  };
  p.unpair = [fake](const float* wide) { fake->unpair(wide); };
  p.reads_companion = [fake](const float* at, std::int64_t n) {
    return fake->reads_companion(at, n, fake->fault == AloneFault::kNotRead);
  };
  p.keeps = [fake] { return fake->fault != AloneFault::kNotKept; };
  p.backward = [fake](float* d, const void* gate_up, const float* dout, std::int64_t rows,
                      std::int64_t inner) {
    const std::int64_t n = 2 * rows * inner;
    const std::vector<float> g = widened(gate_up, fake->type, n);
    std::vector<float> out(static_cast<std::size_t>(n));
    fake->ops->swiglu_backward(out.data(), g.data(), dout, rows, inner);
    const testing::FakePair* f = fake->pair_of(d, n);
    const bool alone = f != nullptr && f->alone;
    if (!alone) std::copy(out.begin(), out.end(), d);
    if (f == nullptr) return;
    std::uint16_t* narrow = f->narrow + (d - f->wide);
    for (std::int64_t i = 0; i < n; ++i) {
      narrow[i] = testing::to16(out[static_cast<std::size_t>(i)], fake->type);
      if (alone && fake->fault == AloneFault::kTruncated && i == n - 1) narrow[i] ^= 1;
    }
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

TEST(GateUpGradAloneCheck, TheFaithfulPathPassesInBf16AndFp16) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  for (DType type : {DType::kBF16, DType::kF16}) {
    const Status s =
        check_gate_up_grad_alone(*backend, alone_path(*backend, type, AloneFault::kNone));
    EXPECT_TRUE(s.is_ok()) << to_string(type) << ": " << s.to_string();
  }
}

TEST(GateUpGradAloneCheck, EachFaultFailsNamingWhatWentWrong) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  const struct {
    AloneFault fault;
    const char* expect;
  } cases[] = {
      {AloneFault::kRefused, "6 rows of 40 inner columns: the ops refused"},
      {AloneFault::kNotKept, "the ops would not keep the gradient of gate and up in 16 bits alone"},
      {AloneFault::kNotRead,
       "6 rows of 40 inner columns: a product reading the gradient of gate and up kept alone would "
       "not read its companion"},
      {AloneFault::kTruncated, "6 rows of 40 inner columns"},
      {AloneFault::kZerosAsA,
       "6 rows of 40 inner columns, after SwiGLU's backward: the next projection (activation as "
       "A)"},
      {AloneFault::kFails, "the kernel failed"},
  };
  for (const auto& c : cases) {
    for (DType type : {DType::kBF16, DType::kF16}) {
      const Status s = check_gate_up_grad_alone(*backend, alone_path(*backend, type, c.fault));
      ASSERT_FALSE(s.is_ok()) << c.expect;
      EXPECT_NE(s.to_string().find(c.expect), std::string::npos) << s.to_string();
    }
  }
  const Status truncated = check_gate_up_grad_alone(
      *backend, alone_path(*backend, DType::kBF16, AloneFault::kTruncated));
  EXPECT_NE(truncated.to_string().find("SwiGLU's backward"), std::string::npos)
      << truncated.to_string();
  EXPECT_NE(truncated.to_string().find("[479]"), std::string::npos) << truncated.to_string();
  GateUpGradAlonePath fp32 = alone_path(*backend, DType::kBF16, AloneFault::kNone);
  fp32.type = DType::kF32;
  EXPECT_EQ(check_gate_up_grad_alone(*backend, fp32).code(), ErrorCode::kInvalidArgument);
}

TEST(GateUpGradAloneCheck, AFailingPathIsListedOffWithOneWarningAndUnpairsWhatItPaired) {
  auto backend = testing::small_cpu_backend(64ull << 20);
  testing::expect_listed_off_unpairing<GateUpGradAlonePath>(
      alone_path(*backend, DType::kBF16, AloneFault::kTruncated), kGateUpGradAloneName,
      kGateUpGradAloneReplaces,
      [&](const GateUpGradAlonePath& p) { return check_gate_up_grad_alone(*backend, p); });
}

}  // namespace
}  // namespace strata::backend
