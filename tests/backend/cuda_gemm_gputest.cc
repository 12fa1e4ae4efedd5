// GEMMs of the CUDA backend against a double-precision reference computed from the inputs rounded
// the way each GemmPrecision rounds them (bf16/fp16: exactly; fp32: not at all), so the only
// error left is fp32 accumulation: |error| <= 2e-5 * (sum |a||b| + |beta c|). TF32 is compared
// with the unrounded inputs at TF32's 2^-11. Every transpose combination, odd sizes and strides,
// misaligned operands, products cut into blocks and k pieces by a small workspace, cuBLASLt and
// the fallback kernel. Skips without a GPU.
#include <gtest/gtest.h>

#include "kernels/cpu/float16.h"
#include "support/gpu_support.h"

namespace strata::backend {
namespace {

using cuda::GemmPrecision;

float round_input(GemmPrecision p, float x) {
  if (p == GemmPrecision::kBf16) return kernels::bf16_to_float(kernels::float_to_bf16(x));
  if (p == GemmPrecision::kFp16) return kernels::fp16_to_float(kernels::float_to_fp16(x));
  return x;
}

struct Case {
  bool ta = false, tb = false;
  std::int64_t m = 1, n = 1, k = 1;
  std::int64_t pad = 0;       // extra leading-dimension elements
  std::int64_t misalign = 0;  // operands start this many floats into their buffers
  float alpha = 1.0f, beta = 0.0f;
};

// Runs the case on `gpu` and checks it; returns the result for determinism checks.
std::vector<float> check_case(Backend& gpu, GemmPrecision precision, const Case& c,
                              std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "precision " << cuda::to_string(precision) << " ta " << c.ta << " tb " << c.tb
               << " m " << c.m << " n " << c.n << " k " << c.k << " pad " << c.pad << " misalign "
               << c.misalign << " beta " << c.beta);
  const std::int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const std::int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const std::int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
  const std::vector<float> a = testing::random_floats(c.misalign + a_rows * lda, seed);
  const std::vector<float> b = testing::random_floats(c.misalign + b_rows * ldb, seed + 1);
  const std::vector<float> c0 = testing::random_floats(c.misalign + c.m * ldc, seed + 2);
  Buffer da = testing::to_device(gpu, a), db = testing::to_device(gpu, b);
  Buffer dc = testing::to_device(gpu, c0);
  gpu.ops_f32().gemm(c.ta, c.tb, c.m, c.n, c.k, c.alpha, da.as<float>() + c.misalign, lda,
                     db.as<float>() + c.misalign, ldb, c.beta, dc.as<float>() + c.misalign, ldc);
  const std::vector<float> got = testing::to_host<float>(gpu, dc);
  EXPECT_TRUE(gpu.synchronize(StreamKind::kCompute).is_ok());

  const double rel = precision == GemmPrecision::kTf32 ? 2.0 / 2048.0 : 2e-5;
  int failures = 0;
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t p = 0; p < c.k; ++p) {
        const float av = a[c.misalign + (c.ta ? p * lda + i : i * lda + p)];
        const float bv = b[c.misalign + (c.tb ? j * ldb + p : p * ldb + j)];
        const double x = static_cast<double>(round_input(precision, av)) *
                         static_cast<double>(round_input(precision, bv));
        sum += x;
        magnitude += std::abs(x);
      }
      const double cv = c0[c.misalign + i * ldc + j];
      const double want = c.alpha * sum + (c.beta != 0.0f ? c.beta * cv : 0.0);
      const double bound = rel * (std::abs(c.alpha) * magnitude + std::abs(c.beta * cv)) + 1e-6;
      const double g = got[c.misalign + i * ldc + j];
      if ((std::isnan(g) || std::abs(g - want) > bound) && ++failures <= 3) {
        ADD_FAILURE() << "C(" << i << "," << j << ") = " << g << ", want " << want << " +- "
                      << bound;
      }
    }
    // Padding columns are not written.
    for (std::int64_t j = c.n; j < ldc; ++j) {
      EXPECT_EQ(got[c.misalign + i * ldc + j], c0[c.misalign + i * ldc + j]);
    }
  }
  EXPECT_EQ(failures, 0);
  return got;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      out.push_back({ta, tb, 7, 5, 3, 0, 0, 1.5f, 0.5f});
      out.push_back({ta, tb, 129, 257, 300, 3, 0, 1.0f, 0.0f});
      out.push_back({ta, tb, 64, 96, 768, 0, 1, 1.0f, 1.0f});  // 4-byte aligned operands
    }
  }
  return out;
}

void run_all(GemmPrecision precision, CudaBackendOptions options = {}) {
  options.gemm_precision = precision;
  auto made = testing::make_gpu_backend(options);
  if (!made.backend) GTEST_SKIP() << "no GPU: " << made.skip_reason;
  std::uint64_t seed = 1;
  for (const Case& c : cases())
    check_case(*made.backend, precision, c, seed += 10);
}

TEST(CudaGemm, Fp32) {
  run_all(GemmPrecision::kFp32);
}
TEST(CudaGemm, Tf32) {
  run_all(GemmPrecision::kTf32);
}
TEST(CudaGemm, Bf16InputsFp32Accumulation) {
  run_all(GemmPrecision::kBf16);
}
TEST(CudaGemm, Fp16InputsFp32Accumulation) {
  run_all(GemmPrecision::kFp16);
}

TEST(CudaGemm, FallbackKernelAlone) {
  CudaBackendOptions options;
  options.use_cublaslt = false;
  run_all(GemmPrecision::kFp32, options);
}

TEST(CudaGemm, FallbackKernelOnSixteenBitBlocks) {
  CudaBackendOptions options;
  options.use_cublaslt = false;
  run_all(GemmPrecision::kBf16, options);
}

TEST(CudaGemm, ProductsLargerThanTheWorkspaceAreCutIntoBlocks) {
  CudaBackendOptions options;
  options.gemm_precision = GemmPrecision::kBf16;
  options.gemm_workspace_bytes = 1;  // raised to the smallest workspace allowed (~10K elements)
  auto made = testing::make_gpu_backend(options);
  if (!made.backend) GTEST_SKIP() << "no GPU: " << made.skip_reason;
  std::uint64_t seed = 100;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Neither operand fits: 64 x 64 output blocks, and k in pieces that accumulate (beta
      // applies to the first piece only).
      check_case(*made.backend, GemmPrecision::kBf16, {ta, tb, 300, 200, 100, 1, 0, 1.0f, 0.5f},
                 seed += 10);
      check_case(*made.backend, GemmPrecision::kBf16, {ta, tb, 70, 65, 3000, 0, 0, 2.0f, 1.0f},
                 seed += 10);
    }
  }
}

TEST(CudaGemm, RepeatedCallsGiveTheSameBits) {
  CudaBackendOptions options;
  options.gemm_precision = GemmPrecision::kBf16;
  auto made = testing::make_gpu_backend(options);
  if (!made.backend) GTEST_SKIP() << "no GPU: " << made.skip_reason;
  const Case c{false, true, 512, 1024, 768, 0, 0, 1.0f, 0.0f};
  const std::vector<float> first = check_case(*made.backend, GemmPrecision::kBf16, c, 7);
  const std::vector<float> second = check_case(*made.backend, GemmPrecision::kBf16, c, 7);
  testing::expect_bitwise_equal("second run", second, first);
}

}  // namespace
}  // namespace strata::backend
