// Vector helpers shared by the AVX-512 (F, BW, VL, DQ) paths of the CPU Adam kernels: fp32 state
// (adam_avx512.cc) and compressed state (adam_state_avx512.cc). Include it first: GCC 12 reports
// -Wmaybe-uninitialized and -Wuninitialized inside its own AVX-512 headers (_mm512_undefined_*,
// GCC bug 105593, fixed in GCC 13), and the pragmas must precede the intrinsics header's first
// inclusion.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam_internal.h"

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

namespace strata::kernels::detail {

// The compressed-state range of the AVX-512 path (adam_state_avx512.cc).
void adam_state_range_avx512(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                             std::size_t end);

namespace avx512 {

// 16 gradient elements from index i, widened to fp32.
template <DType kGrad>
STRATA_AVX512 inline __m512 load_grad16(const void* grad, std::size_t i) {
  if constexpr (kGrad == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(grad) + i));
    if constexpr (kGrad == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// fp32 -> bf16 round to nearest even, NaN quieted: the same bits as float_to_bf16().
STRATA_AVX512 inline __m256i to_bf16x16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_srli_epi32(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), 16);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
}

// The step's constants broadcast once per range, held in registers. (Read through the
// AdamConstants reference instead, they would be reloaded after every float store, which the
// compiler must assume could alias them.)
struct Constants16 {
  __m512 beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size, inv_sqrt_bc2, decay,
      l2, grad_scale;
  STRATA_AVX512 explicit Constants16(const AdamConstants& c)
      : beta1(_mm512_set1_ps(c.beta1)),
        one_minus_beta1(_mm512_set1_ps(c.one_minus_beta1)),
        beta2(_mm512_set1_ps(c.beta2)),
        one_minus_beta2(_mm512_set1_ps(c.one_minus_beta2)),
        eps(_mm512_set1_ps(c.eps)),
        neg_step_size(_mm512_set1_ps(-c.step_size)),
        inv_sqrt_bc2(_mm512_set1_ps(c.inv_sqrt_bc2)),
        decay(_mm512_set1_ps(c.decay)),
        l2(_mm512_set1_ps(c.l2)),
        grad_scale(_mm512_set1_ps(c.grad_scale)) {}
};

}  // namespace avx512
}  // namespace strata::kernels::detail
