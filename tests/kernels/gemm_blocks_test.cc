// The walk GemmEngine makes over a GEMM cut into blocks for the 16-bit workspace
// (kernels/cuda/gemm_blocks.h), run on the CPU with the same offsets the GPU uses: blocks of A and
// B converted to bf16 into workspace regions, multiplied into C, k pieces accumulating. The result
// must equal the product of the rounded operands, for every transposition and blocking shape.
#include "kernels/cuda/gemm_blocks.h"

#include <gtest/gtest.h>

#include "kernels/cpu/float16.h"
#include "kernels/cpu/gemm.h"
#include "support/gpu_support.h"

namespace strata::cuda {
namespace {

float round_bf16(float x) {
  return kernels::bf16_to_float(kernels::float_to_bf16(x));
}

struct Result {
  std::vector<float> c;
  int conversions = 0;
  int products = 0;
};

Result run_walk(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                std::int64_t capacity, const std::vector<float>& a, std::int64_t lda,
                const std::vector<float>& b, std::int64_t ldb, std::vector<float> c,
                std::int64_t ldc, float alpha, float beta) {
  const cuda::GemmBlocking plan =
      cuda::plan_gemm_blocking(ta, tb, m, n, k, capacity);
  std::vector<std::uint16_t> a_ws(static_cast<std::size_t>(plan.a_elements), 0xffff);
  std::vector<std::uint16_t> b_ws(static_cast<std::size_t>(plan.b_elements), 0xffff);
  Result result;
  auto convert_to = [&](std::vector<std::uint16_t>& ws) {
    return [&](const BlockCopy& copy) {
      EXPECT_LE(copy.rows * copy.dst_ld, static_cast<std::int64_t>(ws.size()));
      EXPECT_GE(copy.dst_ld, copy.cols);
      for (std::int64_t r = 0; r < copy.rows; ++r) {
        for (std::int64_t col = 0; col < copy.cols; ++col) {
          ws[static_cast<std::size_t>(r * copy.dst_ld + col)] =
              kernels::float_to_bf16(copy.src[r * copy.src_ld + col]);
        }
      }
      ++result.conversions;
      return Status::ok();
    };
  };
  const Status walked =
      walk_gemm_blocks(plan, ta, tb, a.data(), lda, b.data(), ldb, beta, c.data(), ldc,
                       convert_to(a_ws), convert_to(b_ws), [&](const BlockProduct& p) {
                         // Widen the workspace blocks and multiply on the CPU, as cuBLASLt would on
                         // the GPU.
                         std::vector<float> aw(a_ws.size()), bw(b_ws.size());
                         for (std::size_t i = 0; i < aw.size(); ++i)
                           aw[i] = kernels::bf16_to_float(a_ws[i]);
                         for (std::size_t i = 0; i < bw.size(); ++i)
                           bw[i] = kernels::bf16_to_float(b_ws[i]);
                         kernels::gemm<float>(ta, tb, p.m, p.n, p.k, alpha, aw.data(), p.a_ld,
                                              bw.data(), p.b_ld, p.beta, p.c, ldc);
                         ++result.products;
                         return Status::ok();
                       });
  EXPECT_TRUE(walked.is_ok()) << walked.to_string();
  EXPECT_EQ(result.products, plan.blocks());
  result.c = std::move(c);
  return result;
}

TEST(GemmBlocks, EveryBlockingGivesTheProductOfTheRoundedOperands) {
  const std::int64_t capacities[] = {cuda::kGemmWorkspaceMinElements, 20'000, 1 << 20};
  std::uint64_t seed = 1;
  for (std::int64_t capacity : capacities) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const std::int64_t m = 150, n = 97, k = 300;
        SCOPED_TRACE(::testing::Message()
                     << "capacity " << capacity << " ta " << ta << " tb " << tb);
        const std::int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
        const std::vector<float> a = testing::random_floats((ta ? k : m) * lda, seed += 3);
        const std::vector<float> b = testing::random_floats((tb ? n : k) * ldb, seed += 3);
        const std::vector<float> c0 = testing::random_floats(m * ldc, seed += 3);
        const Result got = run_walk(ta, tb, m, n, k, capacity, a, lda, b, ldb, c0, ldc, 1.5f, 0.5f);
        std::vector<float> want(c0.size());
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < ldc; ++j) {
            if (j >= n) {
              want[i * ldc + j] = c0[i * ldc + j];  // padding untouched
              continue;
            }
            double sum = 0.0;
            for (std::int64_t p = 0; p < k; ++p) {
              sum += static_cast<double>(round_bf16(a[ta ? p * lda + i : i * lda + p])) *
                     round_bf16(b[tb ? j * ldb + p : p * ldb + j]);
            }
            want[i * ldc + j] = static_cast<float>(1.5 * sum + 0.5 * c0[i * ldc + j]);
          }
        }
        testing::expect_all_close("C", got.c, want, testing::Tolerance{1e-4, 1e-4});
      }
    }
  }
}

TEST(GemmBlocks, AnOperandThatFitsIsConvertedOnce) {
  // The head's shape in miniature: a few rows (A) against a long B that must be cut in columns.
  const std::int64_t m = 8, n = 2000, k = 64;
  const std::int64_t capacity = 40'000;  // A (8 x 64) whole, B in column blocks
  const std::vector<float> a = testing::random_floats(m * k, 1);
  const std::vector<float> b = testing::random_floats(n * k, 2);
  const Result r = run_walk(false, true, m, n, k, capacity, a, k, b, k, std::vector<float>(m * n),
                            n, 1.0f, 0.0f);
  const cuda::GemmBlocking plan =
      cuda::plan_gemm_blocking(false, true, m, n, k, capacity);
  ASSERT_GT(plan.blocks(), 1);
  EXPECT_EQ(r.conversions, 1 + plan.blocks());  // A once, each B block once
}

}  // namespace
}  // namespace strata::cuda
