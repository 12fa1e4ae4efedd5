// Vector helpers shared by the AVX2 + FMA + F16C paths of the CPU Adam kernels: fp32 state
// (adam_avx2.cc) and compressed state (adam_state_avx2.cc).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam_internal.h"

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace strata::kernels::detail {

// The compressed-state range of the AVX2 path (adam_state_avx2.cc).
void adam_state_range_avx2(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                           std::size_t end);

namespace avx2 {

// 8 gradient elements from index i, widened to fp32.
template <DType kGrad>
STRATA_AVX2 inline __m256 load_grad8(const void* grad, std::size_t i) {
  if constexpr (kGrad == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(grad) + i));
    if constexpr (kGrad == DType::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

// fp32 -> bf16 round to nearest even, NaN quieted: the same bits as float_to_bf16().
STRATA_AVX2 inline __m128i to_bf16x8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_srli_epi32(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), 16);
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// The step's constants broadcast once per range, held in registers. (Read through the
// AdamConstants reference instead, they would be reloaded after every float store, which the
// compiler must assume could alias them.)
struct Constants8 {
  __m256 beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size, inv_sqrt_bc2, decay,
      l2, grad_scale;
  STRATA_AVX2 explicit Constants8(const AdamConstants& c)
      : beta1(_mm256_set1_ps(c.beta1)),
        one_minus_beta1(_mm256_set1_ps(c.one_minus_beta1)),
        beta2(_mm256_set1_ps(c.beta2)),
        one_minus_beta2(_mm256_set1_ps(c.one_minus_beta2)),
        eps(_mm256_set1_ps(c.eps)),
        neg_step_size(_mm256_set1_ps(-c.step_size)),
        inv_sqrt_bc2(_mm256_set1_ps(c.inv_sqrt_bc2)),
        decay(_mm256_set1_ps(c.decay)),
        l2(_mm256_set1_ps(c.l2)),
        grad_scale(_mm256_set1_ps(c.grad_scale)) {}
};

}  // namespace avx2
}  // namespace strata::kernels::detail
