// The scalar path of the CPU Adam kernels: baseline x86-64, no vector extensions assumed. It
// performs the same fp32 operations as the vector paths (std::fma is correctly rounded with or
// without FMA hardware), so its results are bit-identical to theirs, only slower.
#include "kernels/cpu/adam_internal.h"
#include "kernels/cpu/adam_state.h"

namespace strata::kernels::detail {
namespace {

template <bool kL2, CopyKind kCopy>
void adam_range_t(const AdamConstants& constants, const AdamTile& t, std::size_t begin,
                  std::size_t end) {
  // Local copies: stores through the float pointers could otherwise alias them.
  const AdamConstants c = constants;
  float* const master = static_cast<float*>(t.master);
  float* const exp_avg = static_cast<float*>(t.exp_avg);
  float* const exp_avg_sq = static_cast<float*>(t.exp_avg_sq);
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

// Compressed state, element by element; 8-bit moments block by block in two passes (the block's
// new absmax must be known before its codes).
struct ScalarState {
  template <DType kMaster, MomentFormat kMoments, DType kGrad, bool kL2>
  static void range(const AdamConstants& constants, const AdamTile& t, std::size_t begin,
                    std::size_t end) {
    const AdamConstants c = constants;
    const StatePointers s = state_pointers(t);
    const RoundingKeys keys(t.rounding_key, t.rounding_offset);
    const CopyKind copy = copy_kind(t);
    if constexpr (kMoments != MomentFormat::kQ8) {
      for (std::size_t i = begin; i < end; ++i) {
        state_element<kMaster, kMoments, kL2>(c, s, keys, load_grad(s.grad, kGrad, i), copy, i,
                                              nullptr);
      }
    } else {
      const std::size_t block = t.block;
      alignas(64) float new_m[kQ8BlockMaxElems];
      alignas(64) float new_sqrt_v[kQ8BlockMaxElems];
      for (std::size_t b = begin; b < end; b += block) {
        Q8Pass pass = q8_begin_block(c, s, block, b, new_m, new_sqrt_v);
        for (std::size_t i = b; i < b + block; ++i) {
          state_element<kMaster, kMoments, kL2>(c, s, keys, load_grad(s.grad, kGrad, i), copy, i,
                                                &pass);
        }
        const Q8Scales scales(pass);
        q8_encode_range(pass, scales, s, keys, 0, block);
        q8_store_scales(pass, scales, s, block);
      }
    }
  }
};

void adam_state_range(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                      std::size_t end) {
  dispatch_state<ScalarState>(c, t, begin, end);
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
  return {adam_range, adam_state_range, stats_range, roofline_range};
}

}  // namespace strata::kernels::detail
