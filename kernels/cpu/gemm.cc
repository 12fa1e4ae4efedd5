// GEMM through OpenBLAS, tiled over oneTBB (see gemm.h for why).
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <fmt/format.h>

#include <mutex>

#include "common/assert.h"
#include "kernels/cpu/parallel.h"

namespace strata::kernels {
namespace {

// Rows (or columns) per tile; a tile also needs enough work to be worth a task.
constexpr std::int64_t kTileSpan = 256;
constexpr double kSerialFlopsMax = 4.0e6;

CBLAS_TRANSPOSE to_cblas(bool trans) {
  return trans ? CblasTrans : CblasNoTrans;
}

void blas_call(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
               float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda),
              b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void blas_call(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
               const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
               double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda),
              b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

template <typename T>
void check_shape(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t lda,
                 std::int64_t ldb, std::int64_t ldc) {
  STRATA_ASSERT(m >= 0 && n >= 0 && k >= 0);
  STRATA_ASSERT(lda >= std::max<std::int64_t>(1, ta ? m : k));
  STRATA_ASSERT(ldb >= std::max<std::int64_t>(1, tb ? k : n));
  STRATA_ASSERT(ldc >= std::max<std::int64_t>(1, n));
  STRATA_ASSERT(m < (std::int64_t{1} << 31) && n < (std::int64_t{1} << 31) &&
                k < (std::int64_t{1} << 31));
}

}  // namespace

void blas_setup() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void gemm_openblas_threads(int threads, std::int64_t m, std::int64_t n, std::int64_t k,
                           const float* a, const float* b, float* c) {
  blas_setup();
  openblas_set_num_threads(threads);
  blas_call(false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  openblas_set_num_threads(1);
}

std::string blas_description() {
  blas_setup();
  const int parallel = openblas_get_parallel();
  const char* model = parallel == 0 ? "sequential" : parallel == 1 ? "pthreads" : "OpenMP";
  return fmt::format("OpenBLAS ({} build, core {}), one BLAS thread per oneTBB task", model,
                     openblas_get_corename());
}

template <typename T>
void gemm_serial(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                 std::int64_t ldc) {
  check_shape<T>(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  blas_setup();
  blas_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  check_shape<T>(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  blas_setup();
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                       static_cast<double>(std::max<std::int64_t>(k, 1));
  if (flops <= kSerialFlopsMax || (m <= kTileSpan && n <= kTileSpan)) {
    blas_call(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (m >= n) {
    // Row tiles: op(A) rows [i0, i1) against all of op(B).
    parallel_chunks(m, kTileSpan, [&](std::int64_t i0, std::int64_t i1) {
      const T* a_tile = trans_a ? a + i0 : a + i0 * lda;
      blas_call(trans_a, trans_b, i1 - i0, n, k, alpha, a_tile, lda, b, ldb, beta, c + i0 * ldc,
                ldc);
    });
  } else {
    // Column tiles: all of op(A) against op(B) columns [j0, j1).
    parallel_chunks(n, kTileSpan, [&](std::int64_t j0, std::int64_t j1) {
      const T* b_tile = trans_b ? b + j0 * ldb : b + j0;
      blas_call(trans_a, trans_b, m, j1 - j0, k, alpha, a, lda, b_tile, ldb, beta, c + j0, ldc);
    });
  }
}

template void gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double,
                           const double*, std::int64_t, const double*, std::int64_t, double,
                           double*, std::int64_t);
template void gemm_serial<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float,
                                 const float*, std::int64_t, const float*, std::int64_t, float,
                                 float*, std::int64_t);
template void gemm_serial<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double,
                                  const double*, std::int64_t, const double*, std::int64_t, double,
                                  double*, std::int64_t);

}  // namespace strata::kernels
