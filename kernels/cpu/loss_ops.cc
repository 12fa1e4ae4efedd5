// Softmax + cross-entropy (plain and fused with its backward) and the fixed-order reductions
// (contracts in nn_ops.h).
#include <algorithm>
#include <array>
#include <cmath>

#include "common/assert.h"
#include "kernels/cpu/nn_ops.h"
#include "kernels/cpu/parallel.h"

namespace strata::kernels {
namespace {

// Reductions split n into at most kPartsMax chunks of at least kReduceGrain elements; the chunk
// size depends only on n, and partial sums are added in chunk order.
constexpr std::int64_t kPartsMax = 1024;
constexpr std::int64_t kReduceGrain = 1 << 15;

template <typename T, typename Term>
double fixed_order_sum(const T* x, std::int64_t n, const Term& term) {
  if (n <= 0) return 0.0;
  const std::int64_t grain = std::max<std::int64_t>(kReduceGrain, (n + kPartsMax - 1) / kPartsMax);
  std::array<double, kPartsMax> parts{};
  parallel_chunks(n, grain, [&](std::int64_t i0, std::int64_t i1) {
    double acc = 0.0;
    for (std::int64_t i = i0; i < i1; ++i)
      acc += term(static_cast<double>(x[i]));
    parts[static_cast<std::size_t>(i0 / grain)] = acc;
  });
  double total = 0.0;
  const std::int64_t chunks = (n + grain - 1) / grain;
  for (std::int64_t c = 0; c < chunks; ++c)
    total += parts[static_cast<std::size_t>(c)];
  return total;
}

template <typename T>
T row_logsumexp(const T* row, std::int64_t vocab) {
  T m = row[0];
  for (std::int64_t j = 1; j < vocab; ++j)
    m = std::max(m, row[j]);
  double sum = 0.0;
  for (std::int64_t j = 0; j < vocab; ++j)
    sum += std::exp(static_cast<double>(row[j] - m));
  return m + static_cast<T>(std::log(sum));
}

}  // namespace

template <typename T>
void cross_entropy_forward(T* losses, const T* logits, const std::int32_t* targets,
                           std::int64_t rows, std::int64_t vocab) {
  STRATA_ASSERT(vocab > 0);
  parallel_chunks(rows, rows_grain(vocab, 1 << 16), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* row = logits + r * vocab;
      losses[r] = targets[r] < 0 ? T(0) : row_logsumexp(row, vocab) - row[targets[r]];
    }
  });
}

template <typename T>
void cross_entropy_fused(T* logits, T* losses, const std::int32_t* targets, std::int64_t rows,
                         std::int64_t vocab, double grad_scale) {
  STRATA_ASSERT(vocab > 0);
  parallel_chunks(rows, rows_grain(vocab, 1 << 16), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      T* row = logits + r * vocab;
      const std::int32_t target = targets[r];
      if (target < 0) {  // ignored: no loss, no gradient
        losses[r] = T(0);
        std::fill(row, row + vocab, T(0));
        continue;
      }
      const T lse = row_logsumexp(row, vocab);
      losses[r] = lse - row[target];
      const T g = static_cast<T>(grad_scale);
      for (std::int64_t j = 0; j < vocab; ++j)
        row[j] = std::exp(row[j] - lse) * g;
      row[target] -= g;
    }
  });
}

template <typename T>
double sum_squares(const T* x, std::int64_t n) {
  return fixed_order_sum(x, n, [](double v) { return v * v; });
}

template <typename T>
double sum(const T* x, std::int64_t n) {
  return fixed_order_sum(x, n, [](double v) { return v; });
}

template <typename T>
void scale(T* x, std::int64_t n, double alpha) {
  const T a = static_cast<T>(alpha);
  parallel_chunks(n, 1 << 16, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i)
      x[i] *= a;
  });
}

#define STRATA_INSTANTIATE_LOSS(T)                                                              \
  template void cross_entropy_forward<T>(T*, const T*, const std::int32_t*, std::int64_t,       \
                                         std::int64_t);                                         \
  template void cross_entropy_fused<T>(T*, T*, const std::int32_t*, std::int64_t, std::int64_t, \
                                       double);                                                 \
  template double sum_squares<T>(const T*, std::int64_t);                                       \
  template double sum<T>(const T*, std::int64_t);                                               \
  template void scale<T>(T*, std::int64_t, double);
STRATA_INSTANTIATE_LOSS(float)
STRATA_INSTANTIATE_LOSS(double)
#undef STRATA_INSTANTIATE_LOSS

}  // namespace strata::kernels
