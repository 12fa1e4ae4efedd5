// The AVX-512 (F, BW, VL, DQ) vector of the CPU Adam kernels: 16 floats. Avx512 holds every
// operation the shared loops (adam_simd_loop.h for fp32 state, adam_state_simd_loop.h for
// compressed state) need, written in this width's intrinsics; adam_avx512.cc and
// adam_state_avx512.cc instantiate the loops with it. Only functions marked with the target
// attribute use AVX-512, so the library still runs on any x86-64 CPU; the path is only called when
// CPUID says it can run.
//
// Include it first: GCC 12 reports -Wmaybe-uninitialized and -Wuninitialized inside its own
// AVX-512 headers (_mm512_undefined_*, GCC bug 105593, fixed in GCC 13), and the pragmas must
// precede the intrinsics header's first inclusion.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam_internal.h"
#include "kernels/cpu/adam_state.h"

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

namespace strata::kernels::detail {

struct Avx512 {
  using F = __m512;   // 16 floats
  using I = __m512i;  // 16 int32
  using H = __m256i;  // 16 16-bit values (bf16 or fp16)
  static constexpr std::size_t kLanes = 16;

  // The step's constants broadcast once per range, held in registers. (Read through the
  // AdamConstants reference instead, they would be reloaded after every float store, which the
  // compiler must assume could alias them.)
  struct Constants {
    F beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size, inv_sqrt_bc2, decay, l2,
        grad_scale;
    STRATA_AVX512 explicit Constants(const AdamConstants& c)
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

  // ---- arithmetic --------------------------------------------------------------------------
  STRATA_AVX512 static F add(F a, F b) { return _mm512_add_ps(a, b); }
  STRATA_AVX512 static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  STRATA_AVX512 static F div(F a, F b) { return _mm512_div_ps(a, b); }
  STRATA_AVX512 static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  STRATA_AVX512 static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  // maxps(x, acc): acc where x is NaN.
  STRATA_AVX512 static F max(F x, F acc) { return _mm512_max_ps(x, acc); }
  STRATA_AVX512 static F abs(F a) { return _mm512_abs_ps(a); }
  STRATA_AVX512 static F set1(float x) { return _mm512_set1_ps(x); }
  STRATA_AVX512 static F zero() { return _mm512_setzero_ps(); }
  // max over the 16 lanes: order-free, no NaN ever enters them and -0 never replaces +0.
  STRATA_AVX512 static float reduce_max(F x) { return _mm512_reduce_max_ps(x); }

  // ---- fp32 memory -------------------------------------------------------------------------
  STRATA_AVX512 static F loadu(const float* p) { return _mm512_loadu_ps(p); }
  STRATA_AVX512 static void storeu(float* p, F x) { _mm512_storeu_ps(p, x); }
  STRATA_AVX512 static F load(const float* p) { return _mm512_load_ps(p); }
  STRATA_AVX512 static void store(float* p, F x) { _mm512_store_ps(p, x); }

  // 16 gradient elements from index i, widened to fp32.
  template <DType kGrad>
  STRATA_AVX512 static F load_grad(const void* grad, std::size_t i) {
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

  // ---- gradient statistics ---------------------------------------------------------------
  // The gradient statistics of grad[begin, end) (StatsRangeFn), 16 elements per iteration.
  template <DType kGrad>
  STRATA_AVX512 static GradStats grad_stats(const void* grad, std::size_t begin, std::size_t end) {
    // acc_lo holds lanes 0-7, acc_hi lanes 8-15: element i goes to lane (i - begin) % 16.
    __m512d acc_lo = _mm512_setzero_pd();
    __m512d acc_hi = _mm512_setzero_pd();
    const __m512i exponent = _mm512_set1_epi32(0x7f800000);
    GradStats stats;
    std::size_t i = begin;
    for (; i + 16 <= end; i += 16) {
      const __m512 x = load_grad<kGrad>(grad, i);
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

  // ---- 16-bit values -----------------------------------------------------------------------
  // fp32 -> bf16 round to nearest even, NaN quieted: the same bits as float_to_bf16().
  STRATA_AVX512 static H to_bf16(F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_srli_epi32(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
  }
  STRATA_AVX512 static H to_f16(F x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT); }
  // sr_bf16() of 16 floats with 16 random words r: non-finite lanes add no noise, and NaN is
  // quieted, which is float_to_bf16() on them.
  STRATA_AVX512 static H sr_bf16(F x, I r) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i exponent = _mm512_set1_epi32(0x7f800000);
    const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), exponent);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i noise =
        _mm512_maskz_and_epi32(static_cast<__mmask16>(~special), r, _mm512_set1_epi32(0xffff));
    const __m512i base = _mm512_mask_or_epi32(bits, nan, bits, _mm512_set1_epi32(0x00400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(base, noise), 16));
  }
  STRATA_AVX512 static F widen_bf16(H h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  STRATA_AVX512 static F load_bf16(const void* p, std::size_t i) {
    return widen_bf16(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(p) + i)));
  }
  STRATA_AVX512 static void store_bf16(void* p, std::size_t i, H h) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(p) + i), h);
  }
  // 16 16-bit values at p (32-byte aligned), stored streaming (not read back, no
  // read-for-ownership of their lines) or plain.
  STRATA_AVX512 static void store_halves(std::uint16_t* p, H h, bool stream) {
    auto* out = reinterpret_cast<__m256i*>(p);
    stream ? _mm256_stream_si256(out, h) : _mm256_storeu_si256(out, h);
  }
  STRATA_AVX512 static void store_floats(float* p, F x, bool stream) {
    stream ? _mm512_stream_ps(p, x) : _mm512_storeu_ps(p, x);
  }

  // ---- stochastic rounding -----------------------------------------------------------------
  // lowbias32() in 16 lanes.
  STRATA_AVX512 static I lowbias32(I x) {
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bU)));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  }
  // lane * kIndexMul per lane (the products wrap modulo 2^32 as the scalar ones do).
  STRATA_AVX512 static I lane_mul() {
    return _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(static_cast<int>(kIndexMul)));
  }
  // base + lane_mul: the hash input of 16 consecutive elements.
  STRATA_AVX512 static I hash_input(std::uint32_t base, I lane_mul) {
    return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)), lane_mul);
  }
  STRATA_AVX512 static I add(I a, std::uint32_t b) {
    return _mm512_add_epi32(a, _mm512_set1_epi32(static_cast<int>(b)));
  }

  // ---- 8-bit moments -----------------------------------------------------------------------
  // q8_decode_exp_avg_bounded() of 16 codes: t from the signed code (the same magnitude as from
  // |q|), t * t, times the scale, held to limit (minps: limit when unordered), then q's sign bit.
  STRATA_AVX512 static F q8_decode_m(const std::int8_t* codes, F scale, F limit) {
    const __m512i q =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
    const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(kInv127));
    const __m512 m = _mm512_min_ps(_mm512_mul_ps(_mm512_mul_ps(t, t), scale), limit);
    // Bit select: the sign bit from q, the rest from m (imm 0xB8: b ? c : a per bit).
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(m), _mm512_set1_epi32(static_cast<int>(0x80000000U)), q, 0xB8));
  }
  // q8_decode_exp_avg_sq() of 16 codes, and their q8_t2().
  STRATA_AVX512 static F q8_decode_v(const std::uint8_t* codes, F scale, F* t2_out) {
    const __m512i q =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
    const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(kInv255));
    const __m512 t2 = _mm512_mul_ps(t, t);
    *t2_out = t2;
    return _mm512_mul_ps(_mm512_mul_ps(t2, t2), scale);
  }
  // q8_round() of 16 roots s with 16 random bits j each, as int32: min(fma(s, limit, u), limit)
  // truncated, which is min(floor(...), limit) for the position (> 0: s >= 0 and u > 0) and the
  // limit for NaN (minps returns its second operand), in two instructions.
  STRATA_AVX512 static I q8_round(F s, I j, float limit) {
    const __m512 u = _mm512_fmadd_ps(_mm512_cvtepi32_ps(j), _mm512_set1_ps(kCodeNoiseStep),
                                     _mm512_set1_ps(kCodeNoiseBase));
    const __m512 position = _mm512_fmadd_ps(s, _mm512_set1_ps(limit), u);
    return _mm512_cvttps_epi32(_mm512_min_ps(position, _mm512_set1_ps(limit)));
  }
  // q8_encode_exp_avg() of 16 moments, as int32: position 127 * sqrt(|m| * inv), negated where
  // m < 0.
  STRATA_AVX512 static I q8_code_m(F m, F inv, I r) {
    const __m512 s = _mm512_sqrt_ps(_mm512_mul_ps(_mm512_abs_ps(m), inv));
    const __m512i q = q8_round(s, _mm512_and_si512(r, _mm512_set1_epi32(0xffff)), 127.0f);
    const __mmask16 negative = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_sub_epi32(q, negative, _mm512_setzero_si512(), q);
  }
  // q8_encode_exp_avg_sq() of 16 moments from their square roots, as int32: position
  // 255 * sqrt(sqrt_v * inv_sqrt).
  STRATA_AVX512 static I q8_code_v(F sqrt_v, F inv_sqrt, I r) {
    const __m512 s = _mm512_sqrt_ps(_mm512_mul_ps(sqrt_v, inv_sqrt));
    return q8_round(s, _mm512_srli_epi32(r, 16), 255.0f);
  }
  // Four vectors of int32 codes stored as 64 bytes in element order (zeros when `zero`): two
  // saturating packs work within 128-bit lanes (lane L then holds elements 4L..4L+3 of each
  // vector), one dword permutation restores the order. Four instructions where four vpmovdb
  // would take eight micro-ops.
  template <bool kSigned>
  STRATA_AVX512 static void store_codes(void* dst, const I q[4], bool zero) {
    if (zero) {
      _mm512_storeu_si512(dst, _mm512_setzero_si512());
      return;
    }
    const __m512i words01 = _mm512_packs_epi32(q[0], q[1]);
    const __m512i words23 = _mm512_packs_epi32(q[2], q[3]);
    const __m512i bytes =
        kSigned ? _mm512_packs_epi16(words01, words23) : _mm512_packus_epi16(words01, words23);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(order, bytes));
  }
};

}  // namespace strata::kernels::detail
