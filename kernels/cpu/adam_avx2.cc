// The AVX2 + FMA + F16C path of the CPU Adam kernels: 8 floats per vector, two vectors (one cache
// line of each fp32 stream) per loop iteration, and the shared scalar element update for the
// tail. No software prefetch: on the development machine it gained nothing over the hardware
// prefetchers for these long unit-stride streams (docs/adam.md). Only the functions marked with
// the target attribute use these extensions, so the library still runs on any x86-64 CPU; this
// path is only called when CPUID says it can run.
#include "kernels/cpu/adam_avx2_vec.h"

namespace strata::kernels::detail {
namespace {

using avx2::Constants8;
using avx2::load_grad8;
using avx2::to_bf16x8;

// The tile's pointers as locals, so stores through them cannot be taken to modify them.
struct Streams {
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  const void* grad;
  std::uint16_t* copy;
};

// Elements [i, i + 8): the same operation sequence as adam_element(). Returns the new weights.
template <bool kL2, DType kGrad>
STRATA_AVX2 inline __m256 adam8(const Constants8& k, const Streams& s, std::size_t i) {
  __m256 g = _mm256_mul_ps(load_grad8<kGrad>(s.grad, i), k.grad_scale);
  __m256 p = _mm256_loadu_ps(s.master + i);
  if constexpr (kL2) g = _mm256_fmadd_ps(k.l2, p, g);
  const __m256 m =
      _mm256_fmadd_ps(k.beta1, _mm256_loadu_ps(s.exp_avg + i), _mm256_mul_ps(k.one_minus_beta1, g));
  const __m256 v = _mm256_fmadd_ps(k.beta2, _mm256_loadu_ps(s.exp_avg_sq + i),
                                   _mm256_mul_ps(_mm256_mul_ps(k.one_minus_beta2, g), g));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), k.inv_sqrt_bc2, k.eps);
  p = _mm256_mul_ps(p, k.decay);
  p = _mm256_fmadd_ps(k.neg_step_size, _mm256_div_ps(m, denom), p);
  _mm256_storeu_ps(s.master + i, p);
  _mm256_storeu_ps(s.exp_avg + i, m);
  _mm256_storeu_ps(s.exp_avg_sq + i, v);
  return p;
}

// Stores 8 new weights narrowed to the copy-out dtype at copy + i (16-byte aligned). The copy
// is not read back here: streaming stores skip the read-for-ownership of its lines (measured:
// 0.92 -> 0.98 of the roofline with a bf16 copy-out, docs/adam.md).
template <CopyKind kCopy>
STRATA_AVX2 inline void store_copy8(std::uint16_t* copy, std::size_t i, __m256 p) {
  auto* out = reinterpret_cast<__m128i*>(copy + i);
  if constexpr (kCopy == CopyKind::kBF16) {
    _mm_stream_si128(out, to_bf16x8(p));
  } else if constexpr (kCopy == CopyKind::kF16) {
    _mm_stream_si128(out, _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
  }
}

template <bool kL2, DType kGrad, CopyKind kCopy>
STRATA_AVX2 void adam_range_t(const AdamConstants& constants, const AdamTile& t, std::size_t begin,
                              std::size_t end) {
  const AdamConstants c = constants;
  const Constants8 k(c);
  const Streams s{static_cast<float*>(t.master), static_cast<float*>(t.exp_avg),
                  static_cast<float*>(t.exp_avg_sq), t.grad,
                  static_cast<std::uint16_t*>(t.copy_out)};
  auto scalar = [&](std::size_t i) {
    adam_element<kL2, kCopy>(c, load_grad(s.grad, kGrad, i), s.master + i, s.exp_avg + i,
                             s.exp_avg_sq + i, s.copy, i);
  };
  std::size_t i = begin;
  if constexpr (kCopy != CopyKind::kNone) {
    // Scalar steps until the copy-out address is 16-byte aligned (it is 2-byte aligned).
    const auto address = reinterpret_cast<std::uintptr_t>(s.copy + i);
    for (std::size_t peel = (16 - address % 16) % 16 / 2; peel > 0 && i < end; --peel, ++i)
      scalar(i);
  }
  for (; i + 16 <= end; i += 16) {
    const __m256 p0 = adam8<kL2, kGrad>(k, s, i);
    const __m256 p1 = adam8<kL2, kGrad>(k, s, i + 8);
    if constexpr (kCopy != CopyKind::kNone) {
      store_copy8<kCopy>(s.copy, i, p0);
      store_copy8<kCopy>(s.copy, i + 8, p1);
    }
  }
  for (; i + 8 <= end; i += 8) {
    const __m256 p = adam8<kL2, kGrad>(k, s, i);
    if constexpr (kCopy != CopyKind::kNone) store_copy8<kCopy>(s.copy, i, p);
  }
  for (; i < end; ++i)
    scalar(i);
  // Streaming stores are weakly ordered: fence them before the caller hands the copy on.
  if constexpr (kCopy != CopyKind::kNone) _mm_sfence();
}

template <bool kL2, DType kGrad>
STRATA_AVX2 void adam_range_g(const AdamConstants& c, const AdamTile& t, std::size_t begin,
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
STRATA_AVX2 void adam_range_l2(const AdamConstants& c, const AdamTile& t, std::size_t begin,
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

STRATA_AVX2 void adam_range(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                            std::size_t end) {
  MxcsrGuard guard;
  if (c.l2 != 0.0f) {
    adam_range_l2<true>(c, t, begin, end);
  } else {
    adam_range_l2<false>(c, t, begin, end);
  }
}

// Adds 8 gradient values into lanes acc_lo (elements 0-3) and acc_hi (4-7), counting inf/NaN.
STRATA_AVX2 inline void stats8(__m256 x, __m256d* acc_lo, __m256d* acc_hi, __m256i* nonfinite) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  const __m256i special =
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exponent), exponent);
  *nonfinite = _mm256_sub_epi32(*nonfinite, special);  // special lanes are -1
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  *acc_lo = _mm256_fmadd_pd(lo, lo, *acc_lo);
  *acc_hi = _mm256_fmadd_pd(hi, hi, *acc_hi);
}

template <DType kGrad>
STRATA_AVX2 GradStats stats_range_t(const void* grad, std::size_t begin, std::size_t end) {
  // Lanes 0-3, 4-7, 8-11, 12-15: element i goes to lane (i - begin) % 16 as combine_lanes wants.
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  __m256i nonfinite = _mm256_setzero_si256();  // per-lane counts; < 2^31 per call (one block)
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    stats8(load_grad8<kGrad>(grad, i), &acc[0], &acc[1], &nonfinite);
    stats8(load_grad8<kGrad>(grad, i + 8), &acc[2], &acc[3], &nonfinite);
  }
  alignas(32) double lanes[kStatsLanes];
  for (int k = 0; k < 4; ++k)
    _mm256_store_pd(lanes + 4 * k, acc[k]);
  alignas(32) std::int32_t counts[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(counts), nonfinite);
  GradStats stats;
  for (std::int32_t count : counts)
    stats.nonfinite_count += static_cast<std::uint64_t>(count);
  stats_tail(grad, kGrad, begin, i, end, lanes, &stats.nonfinite_count);
  stats.sum_sq = combine_lanes(lanes);
  return stats;
}

STRATA_AVX2 GradStats stats_range(const void* grad, DType dtype, std::size_t begin,
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

STRATA_AVX2 void roofline_range(float* p, float* m, float* v, const float* g, std::size_t begin,
                                std::size_t end) {
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    for (std::size_t k = i; k < i + 16; k += 8) {
      const __m256 x = _mm256_loadu_ps(g + k);
      _mm256_storeu_ps(p + k, _mm256_add_ps(_mm256_loadu_ps(p + k), x));
      _mm256_storeu_ps(m + k, _mm256_add_ps(_mm256_loadu_ps(m + k), x));
      _mm256_storeu_ps(v + k, _mm256_add_ps(_mm256_loadu_ps(v + k), x));
    }
  }
  for (; i < end; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

}  // namespace

AdamPath avx2_path() {
  return {adam_range, adam_state_range_avx2, stats_range, roofline_range};
}

}  // namespace strata::kernels::detail
