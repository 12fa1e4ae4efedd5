// The AVX-512 (F, BW, VL, DQ) path of the CPU Adam kernels for fp32 state: 16 floats per
// vector, one cache line of each fp32 stream per loop iteration, and the shared scalar element
// update for the tail. Only the functions marked with the target attribute use AVX-512, so the
// library still runs on any x86-64 CPU; this path is only called when CPUID says it can run.
#include "kernels/cpu/adam_avx512_vec.h"  // first: it carries a pragma for the intrinsics header

namespace strata::kernels::detail {
namespace {

using avx512::Constants16;
using avx512::load_grad16;
using avx512::to_bf16x16;

// The tile's pointers as locals, so stores through them cannot be taken to modify them.
struct Streams {
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  const void* grad;
  std::uint16_t* copy;
};

// Elements [i, i + 16): the same operation sequence as adam_element(). Returns the new weights.
template <bool kL2, DType kGrad>
STRATA_AVX512 inline __m512 adam16(const Constants16& k, const Streams& s, std::size_t i) {
  __m512 g = _mm512_mul_ps(load_grad16<kGrad>(s.grad, i), k.grad_scale);
  __m512 p = _mm512_loadu_ps(s.master + i);
  if constexpr (kL2) g = _mm512_fmadd_ps(k.l2, p, g);
  const __m512 m =
      _mm512_fmadd_ps(k.beta1, _mm512_loadu_ps(s.exp_avg + i), _mm512_mul_ps(k.one_minus_beta1, g));
  const __m512 v = _mm512_fmadd_ps(k.beta2, _mm512_loadu_ps(s.exp_avg_sq + i),
                                   _mm512_mul_ps(_mm512_mul_ps(k.one_minus_beta2, g), g));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), k.inv_sqrt_bc2, k.eps);
  p = _mm512_mul_ps(p, k.decay);
  p = _mm512_fmadd_ps(k.neg_step_size, _mm512_div_ps(m, denom), p);
  _mm512_storeu_ps(s.master + i, p);
  _mm512_storeu_ps(s.exp_avg + i, m);
  _mm512_storeu_ps(s.exp_avg_sq + i, v);
  return p;
}

// Stores 16 new weights narrowed to the copy-out dtype at copy + i (32-byte aligned). The copy
// is not read back here: streaming stores skip the read-for-ownership of its lines.
template <CopyKind kCopy>
STRATA_AVX512 inline void store_copy16(std::uint16_t* copy, std::size_t i, __m512 p) {
  auto* out = reinterpret_cast<__m256i*>(copy + i);
  if constexpr (kCopy == CopyKind::kBF16) {
    _mm256_stream_si256(out, to_bf16x16(p));
  } else if constexpr (kCopy == CopyKind::kF16) {
    _mm256_stream_si256(out, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
  }
}

template <bool kL2, DType kGrad, CopyKind kCopy>
STRATA_AVX512 void adam_range_t(const AdamConstants& constants, const AdamTile& t,
                                std::size_t begin, std::size_t end) {
  const AdamConstants c = constants;
  const Constants16 k(c);
  const Streams s{static_cast<float*>(t.master), static_cast<float*>(t.exp_avg),
                  static_cast<float*>(t.exp_avg_sq), t.grad,
                  static_cast<std::uint16_t*>(t.copy_out)};
  auto scalar = [&](std::size_t i) {
    adam_element<kL2, kCopy>(c, load_grad(s.grad, kGrad, i), s.master + i, s.exp_avg + i,
                             s.exp_avg_sq + i, s.copy, i);
  };
  std::size_t i = begin;
  if constexpr (kCopy != CopyKind::kNone) {
    // Scalar steps until the copy-out address is 32-byte aligned (it is 2-byte aligned).
    const auto address = reinterpret_cast<std::uintptr_t>(s.copy + i);
    for (std::size_t peel = (32 - address % 32) % 32 / 2; peel > 0 && i < end; --peel, ++i)
      scalar(i);
  }
  for (; i + 16 <= end; i += 16) {
    const __m512 p = adam16<kL2, kGrad>(k, s, i);
    if constexpr (kCopy != CopyKind::kNone) store_copy16<kCopy>(s.copy, i, p);
  }
  for (; i < end; ++i)
    scalar(i);
  // Streaming stores are weakly ordered: fence them before the caller hands the copy on.
  if constexpr (kCopy != CopyKind::kNone) _mm_sfence();
}

template <bool kL2, DType kGrad>
STRATA_AVX512 void adam_range_g(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                                std::size_t end) {
  if (t.copy_out == nullptr) {
    adam_range_t<kL2, kGrad, CopyKind::kNone>(c, t, begin, end);
  } else if (t.copy_dtype == DType::kBF16) {
    adam_range_t<kL2, kGrad, CopyKind::kBF16>(c, t, begin, end);
  } else {
    adam_range_t<kL2, kGrad, CopyKind::kF16>(c, t, begin, end);
  }
}

template <bool kL2>
STRATA_AVX512 void adam_range_l2(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                                 std::size_t end) {
  switch (t.grad_dtype) {
    case DType::kF32:
      return adam_range_g<kL2, DType::kF32>(c, t, begin, end);
    case DType::kBF16:
      return adam_range_g<kL2, DType::kBF16>(c, t, begin, end);
    case DType::kF16:
      return adam_range_g<kL2, DType::kF16>(c, t, begin, end);
  }
}

STRATA_AVX512 void adam_range(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                              std::size_t end) {
  MxcsrGuard guard;
  if (c.l2 != 0.0f) {
    adam_range_l2<true>(c, t, begin, end);
  } else {
    adam_range_l2<false>(c, t, begin, end);
  }
}

template <DType kGrad>
STRATA_AVX512 GradStats stats_range_t(const void* grad, std::size_t begin, std::size_t end) {
  // acc_lo holds lanes 0-7, acc_hi lanes 8-15: element i goes to lane (i - begin) % 16.
  __m512d acc_lo = _mm512_setzero_pd();
  __m512d acc_hi = _mm512_setzero_pd();
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  GradStats stats;
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 x = load_grad16<kGrad>(grad, i);
    const __mmask16 special =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), exponent), exponent);
    stats.nonfinite_count += static_cast<std::uint64_t>(__builtin_popcount(special));
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
    acc_lo = _mm512_fmadd_pd(lo, lo, acc_lo);
    acc_hi = _mm512_fmadd_pd(hi, hi, acc_hi);
  }
  alignas(64) double lanes[kStatsLanes];
  _mm512_store_pd(lanes, acc_lo);
  _mm512_store_pd(lanes + 8, acc_hi);
  stats_tail(grad, kGrad, begin, i, end, lanes, &stats.nonfinite_count);
  stats.sum_sq = combine_lanes(lanes);
  return stats;
}

STRATA_AVX512 GradStats stats_range(const void* grad, DType dtype, std::size_t begin,
                                    std::size_t end) {
  MxcsrGuard guard;
  switch (dtype) {
    case DType::kF32:
      return stats_range_t<DType::kF32>(grad, begin, end);
    case DType::kBF16:
      return stats_range_t<DType::kBF16>(grad, begin, end);
    case DType::kF16:
      return stats_range_t<DType::kF16>(grad, begin, end);
  }
  return {};
}

STRATA_AVX512 void roofline_range(float* p, float* m, float* v, const float* g, std::size_t begin,
                                  std::size_t end) {
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), x));
    _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), x));
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), x));
  }
  for (; i < end; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

}  // namespace

AdamPath avx512_path() {
  return {adam_range, adam_state_range_avx512, stats_range, roofline_range};
}

}  // namespace strata::kernels::detail
