// GEMM through OpenBLAS, tiled over oneTBB: every transpose combination against a plain triple
// loop, the tiled path, and bit-identical results whatever the thread count.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cstring>
#include <vector>

#include "tests/kernels/grad_check.h"

namespace strata::kernels {
namespace {

template <typename T>
std::vector<T> random_of(std::size_t n, std::uint64_t seed) {
  std::vector<double> d = testing::random_vector(n, seed);
  return std::vector<T>(d.begin(), d.end());
}

template <typename T>
void check_against_loops(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                         double tolerance) {
  const std::int64_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
  const auto a = random_of<T>(static_cast<std::size_t>((ta ? k : m) * lda), 1);
  const auto b = random_of<T>(static_cast<std::size_t>((tb ? n : k) * ldb), 2);
  auto c = random_of<T>(static_cast<std::size_t>(m * ldc), 3);
  std::vector<T> expected = c;
  const T alpha = T(0.75), beta = T(0.5);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      expected[i * ldc + j] =
          static_cast<T>(alpha * acc + beta * static_cast<double>(c[i * ldc + j]));
    }
  }
  gemm<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const double want = expected[i * ldc + j], got = c[i * ldc + j];
      ASSERT_NEAR(got, want, tolerance * (1 + std::abs(want)))
          << "ta=" << ta << " tb=" << tb << " at (" << i << "," << j << ")";
    }
  }
}

TEST(Gemm, EveryTransposeMatchesLoopsSmallAndTiled) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check_against_loops<double>(ta, tb, 7, 5, 3, 1e-12);
      check_against_loops<double>(ta, tb, 600, 90, 70, 1e-12);   // row tiles
      check_against_loops<double>(ta, tb, 40, 700, 150, 1e-12);  // column tiles
      check_against_loops<float>(ta, tb, 300, 260, 64, 1e-5);
    }
  }
}

TEST(Gemm, ZeroInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  gemm<float>(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 2.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{2, 4, 6, 8}));
}

TEST(Gemm, BitIdenticalWithOneOrTwoThreads) {
  const std::int64_t m = 700, n = 300, k = 257;
  const auto a = random_of<float>(m * k, 4), b = random_of<float>(k * n, 5);
  std::vector<float> one(m * n, 0.0f), two(m * n, 0.0f);
  tbb::task_arena(1).execute([&] {
    gemm<float>(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, one.data(), n);
  });
  tbb::task_arena(2).execute([&] {
    gemm<float>(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, two.data(), n);
  });
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0);
}

TEST(Gemm, DescribesTheBlasInUse) {
  EXPECT_NE(blas_description().find("OpenBLAS"), std::string::npos);
}

}  // namespace
}  // namespace strata::kernels
