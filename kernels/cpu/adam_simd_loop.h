// The loops of the SIMD paths of the CPU Adam kernels, written once for any vector width: a traits
// type V (Avx2 in adam_avx2_vec.h, Avx512 in adam_avx512_vec.h) gives the vector types and the
// operations in its intrinsics, this header (fp32 state, statistics, roofline) and
// adam_state_simd_loop.h (compressed state) the loop structure around them, and path<V>() the
// AdamPath of the width. Each width's .cc defines STRATA_SIMD_TARGET as its target attribute
// before including this header, so the loops are compiled for that width alone and inline its
// operations.
//
// Per element, every path performs the same fp32 operations as adam_element() (the scalar tail
// calls it), so results are bit-identical whatever the width and however a range is split.
#pragma once

#ifndef STRATA_SIMD_TARGET
#error "define STRATA_SIMD_TARGET (the vector width's target attribute) before including this"
#endif

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam_internal.h"
#include "kernels/cpu/adam_state_simd_loop.h"

namespace strata::kernels::detail::simd {

// Elements per loop iteration: one cache line of each fp32 stream.
inline constexpr std::size_t kLineElems = 16;

// The tile's pointers as locals, so stores through them cannot be taken to modify them.
struct Streams {
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  const void* grad;
  std::uint16_t* copy;
};

// Elements [i, i + V::kLanes): the same operation sequence as adam_element(). Returns the new
// weights.
template <typename V, bool kL2, DType kGrad>
STRATA_SIMD_TARGET inline typename V::F adam_vector(const typename V::Constants& k,
                                                    const Streams& s, std::size_t i) {
  typename V::F g = V::mul(V::template load_grad<kGrad>(s.grad, i), k.grad_scale);
  typename V::F p = V::loadu(s.master + i);
  if constexpr (kL2) g = V::fmadd(k.l2, p, g);
  const typename V::F m = V::fmadd(k.beta1, V::loadu(s.exp_avg + i), V::mul(k.one_minus_beta1, g));
  const typename V::F v =
      V::fmadd(k.beta2, V::loadu(s.exp_avg_sq + i), V::mul(V::mul(k.one_minus_beta2, g), g));
  const typename V::F denom = V::fmadd(V::sqrt(v), k.inv_sqrt_bc2, k.eps);
  p = V::mul(p, k.decay);
  p = V::fmadd(k.neg_step_size, V::div(m, denom), p);
  V::storeu(s.master + i, p);
  V::storeu(s.exp_avg + i, m);
  V::storeu(s.exp_avg_sq + i, v);
  return p;
}

// Stores V::kLanes new weights narrowed to the copy-out dtype at copy + i (aligned to a vector
// of halves). The copy is not read back here: streaming stores skip the read-for-ownership of its
// lines (measured: 0.92 -> 0.98 of the roofline with a bf16 copy-out, docs/adam.md).
template <typename V, CopyKind kCopy>
STRATA_SIMD_TARGET inline void store_copy(std::uint16_t* copy, std::size_t i, typename V::F p) {
  if constexpr (kCopy == CopyKind::kBF16) {
    V::store_halves(copy + i, V::to_bf16(p), true);
  } else if constexpr (kCopy == CopyKind::kF16) {
    V::store_halves(copy + i, V::to_f16(p), true);
  }
}

template <typename V, bool kL2, DType kGrad, CopyKind kCopy>
STRATA_SIMD_TARGET void adam_range_t(const AdamConstants& constants, const AdamTile& t,
                                     std::size_t begin, std::size_t end) {
  constexpr std::size_t kLanes = V::kLanes;
  const AdamConstants c = constants;
  const typename V::Constants k(c);
  const Streams s{static_cast<float*>(t.master), static_cast<float*>(t.exp_avg),
                  static_cast<float*>(t.exp_avg_sq), t.grad,
                  static_cast<std::uint16_t*>(t.copy_out)};
  auto scalar = [&](std::size_t i) {
    adam_element<kL2, kCopy>(c, load_grad(s.grad, kGrad, i), s.master + i, s.exp_avg + i,
                             s.exp_avg_sq + i, s.copy, i);
  };
  std::size_t i = begin;
  if constexpr (kCopy != CopyKind::kNone) {
    // Scalar steps until the copy-out address is aligned for a vector of halves (it is 2-byte
    // aligned).
    constexpr std::size_t kAlign = 2 * kLanes;
    const auto address = reinterpret_cast<std::uintptr_t>(s.copy + i);
    for (std::size_t peel = (kAlign - address % kAlign) % kAlign / 2; peel > 0 && i < end;
         --peel, ++i)
      scalar(i);
  }
  for (; i + kLineElems <= end; i += kLineElems) {
    for (std::size_t j = i; j < i + kLineElems; j += kLanes) {
      const typename V::F p = adam_vector<V, kL2, kGrad>(k, s, j);
      store_copy<V, kCopy>(s.copy, j, p);
    }
  }
  for (; i + kLanes <= end; i += kLanes) {
    const typename V::F p = adam_vector<V, kL2, kGrad>(k, s, i);
    store_copy<V, kCopy>(s.copy, i, p);
  }
  for (; i < end; ++i)
    scalar(i);
  // Streaming stores are weakly ordered: fence them before the caller hands the copy on.
  if constexpr (kCopy != CopyKind::kNone) _mm_sfence();
}

template <typename V, bool kL2, DType kGrad>
STRATA_SIMD_TARGET void adam_range_g(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                                     std::size_t end) {
  if (t.copy_out == nullptr) {
    adam_range_t<V, kL2, kGrad, CopyKind::kNone>(c, t, begin, end);
  } else if (t.copy_dtype == DType::kBF16) {
    adam_range_t<V, kL2, kGrad, CopyKind::kBF16>(c, t, begin, end);
  } else {
    adam_range_t<V, kL2, kGrad, CopyKind::kF16>(c, t, begin, end);
  }
}

template <typename V, bool kL2>
STRATA_SIMD_TARGET void adam_range_l2(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                                      std::size_t end) {
  switch (t.grad_dtype) {
    case DType::kF32:
      return adam_range_g<V, kL2, DType::kF32>(c, t, begin, end);
    case DType::kBF16:
      return adam_range_g<V, kL2, DType::kBF16>(c, t, begin, end);
    case DType::kF16:
      return adam_range_g<V, kL2, DType::kF16>(c, t, begin, end);
  }
}

// The path's AdamRangeFn for fp32 state.
template <typename V>
STRATA_SIMD_TARGET void adam_range(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                                   std::size_t end) {
  MxcsrGuard guard;
  if (c.l2 != 0.0f) {
    adam_range_l2<V, true>(c, t, begin, end);
  } else {
    adam_range_l2<V, false>(c, t, begin, end);
  }
}

// The path's RooflineRangeFn: p += g; m += g; v += g, a cache line of each at a time.
template <typename V>
STRATA_SIMD_TARGET void roofline_range(float* p, float* m, float* v, const float* g,
                                       std::size_t begin, std::size_t end) {
  std::size_t i = begin;
  for (; i + kLineElems <= end; i += kLineElems) {
    for (std::size_t k = i; k < i + kLineElems; k += V::kLanes) {
      const typename V::F x = V::loadu(g + k);
      V::storeu(p + k, V::add(V::loadu(p + k), x));
      V::storeu(m + k, V::add(V::loadu(m + k), x));
      V::storeu(v + k, V::add(V::loadu(v + k), x));
    }
  }
  for (; i < end; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

// The path's StatsRangeFn.
template <typename V>
STRATA_SIMD_TARGET GradStats stats_range(const void* grad, DType dtype, std::size_t begin,
                                         std::size_t end) {
  MxcsrGuard guard;
  switch (dtype) {
    case DType::kF32:
      return V::template grad_stats<DType::kF32>(grad, begin, end);
    case DType::kBF16:
      return V::template grad_stats<DType::kBF16>(grad, begin, end);
    case DType::kF16:
      return V::template grad_stats<DType::kF16>(grad, begin, end);
  }
  return {};
}

// The path's compressed-state AdamRangeFn (adam_state.h dispatches on the tile's formats).
template <typename V>
void adam_state_range(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                      std::size_t end) {
  dispatch_state<StatePath<V>>(c, t, begin, end);
}

// The AdamPath of vector width V.
template <typename V>
AdamPath path() {
  return {adam_range<V>, adam_state_range<V>, stats_range<V>, roofline_range<V>};
}

}  // namespace strata::kernels::detail::simd
