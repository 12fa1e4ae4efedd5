// The scalar path of the CPU Adam kernels: baseline x86-64, no vector extensions assumed. It
// performs the same fp32 operations as the vector paths (std::fma is correctly rounded with or
// without FMA hardware), so its results are bit-identical to theirs, only slower.
#include "kernels/cpu/adam_internal.h"

namespace strata::kernels::detail {
namespace {

template <bool kL2, CopyKind kCopy>
void adam_range_t(const AdamConstants& constants, const AdamTile& t, std::size_t begin,
                  std::size_t end) {
  // Local copies: stores through the float pointers could otherwise alias them.
  const AdamConstants c = constants;
  float* const master = t.master;
  float* const exp_avg = t.exp_avg;
  float* const exp_avg_sq = t.exp_avg_sq;
  const void* const grad = t.grad;
  const DType grad_dtype = t.grad_dtype;
  void* const copy_out = t.copy_out;
  for (std::size_t i = begin; i < end; ++i) {
    adam_element<kL2, kCopy>(c, load_grad(grad, grad_dtype, i), master + i, exp_avg + i,
                             exp_avg_sq + i, copy_out, i);
  }
}

template <bool kL2>
void adam_range_l2(const AdamConstants& c, const AdamTile& t, std::size_t begin, std::size_t end) {
  if (t.copy_out == nullptr) {
    adam_range_t<kL2, CopyKind::kNone>(c, t, begin, end);
  } else if (t.copy_dtype == DType::kBF16) {
    adam_range_t<kL2, CopyKind::kBF16>(c, t, begin, end);
  } else {
    adam_range_t<kL2, CopyKind::kF16>(c, t, begin, end);
  }
}

void adam_range(const AdamConstants& c, const AdamTile& t, std::size_t begin, std::size_t end) {
  MxcsrGuard guard;
  if (c.l2 != 0.0f) {
    adam_range_l2<true>(c, t, begin, end);
  } else {
    adam_range_l2<false>(c, t, begin, end);
  }
}

GradStats stats_range(const void* grad, DType dtype, std::size_t begin, std::size_t end) {
  MxcsrGuard guard;
  double lanes[kStatsLanes] = {};
  GradStats stats;
  stats_tail(grad, dtype, begin, begin, end, lanes, &stats.nonfinite_count);
  stats.sum_sq = combine_lanes(lanes);
  return stats;
}

void roofline_range(float* p, float* m, float* v, const float* g, std::size_t begin,
                    std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

}  // namespace

AdamPath scalar_path() {
  return {adam_range, stats_range, roofline_range};
}

}  // namespace strata::kernels::detail
