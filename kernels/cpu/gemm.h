// Matrix products for the CPU kernels, through OpenBLAS (Debian's libopenblas, pthreads build).
// Strata runs OpenBLAS single-threaded and parallelises on oneTBB itself: a product is cut into
// row or column tiles whose boundaries depend only on the problem's shape, and each tile is one
// BLAS call. So OpenBLAS's own threads never spin against oneTBB's workers, and every element of
// the result is computed by the same call whatever the thread count: bit-identical results with
// 1 or N threads.
#pragma once

#include <cstdint>
#include <string>

namespace strata::kernels {

// Row-major C(m,n) = alpha * op(A) * op(B) + beta * C, where op(A) is (m,k): A is stored (m,k)
// with row stride lda, or (k,m) when trans_a. Likewise op(B) is (k,n): B is (k,n), or (n,k)
// when trans_b. Tiled over oneTBB (see above). Instantiated for float and double.
template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc);

// The same as one BLAS call in the calling thread (for small products inside parallel kernels).
template <typename T>
void gemm_serial(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                 std::int64_t ldc);

// One sgemm call with OpenBLAS's own `threads` threads (row-major, no transposes), then back to
// single-threaded mode: only for benchmarks that compare the two ways of threading.
void gemm_openblas_threads(int threads, std::int64_t m, std::int64_t n, std::int64_t k,
                           const float* a, const float* b, float* c);

// Puts OpenBLAS in single-threaded mode (once; every gemm call does it too).
void blas_setup();

// "OpenBLAS 0.3.21 (pthreads build, core Haswell), 1 BLAS thread per oneTBB task".
std::string blas_description();

}  // namespace strata::kernels
