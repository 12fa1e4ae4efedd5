// The AVX2 + FMA + F16C vector of the CPU Adam kernels: 8 floats. Avx2 holds every operation the
// shared loops (adam_simd_loop.h for fp32 state, adam_state_simd_loop.h for compressed state)
// need, written in this width's intrinsics; adam_avx2.cc and adam_state_avx2.cc instantiate the
// loops with it. Only functions marked with the target attribute use these extensions, so the
// library still runs on any x86-64 CPU; the path is only called when CPUID says it can run.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam_internal.h"
#include "kernels/cpu/adam_state.h"

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace strata::kernels::detail {

struct Avx2 {
  using F = __m256;   // 8 floats
  using I = __m256i;  // 8 int32
  using H = __m128i;  // 8 16-bit values (bf16 or fp16)
  static constexpr std::size_t kLanes = 8;

  // The step's constants broadcast once per range, held in registers. (Read through the
  // AdamConstants reference instead, they would be reloaded after every float store, which the
  // compiler must assume could alias them.)
  struct Constants {
    F beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size, inv_sqrt_bc2, decay, l2,
        grad_scale;
    STRATA_AVX2 explicit Constants(const AdamConstants& c)
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

  // ---- arithmetic --------------------------------------------------------------------------
  STRATA_AVX2 static F add(F a, F b) { return _mm256_add_ps(a, b); }
  STRATA_AVX2 static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  STRATA_AVX2 static F div(F a, F b) { return _mm256_div_ps(a, b); }
  STRATA_AVX2 static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  STRATA_AVX2 static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  // maxps(x, acc): acc where x is NaN.
  STRATA_AVX2 static F max(F x, F acc) { return _mm256_max_ps(x, acc); }
  STRATA_AVX2 static F abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  STRATA_AVX2 static F set1(float x) { return _mm256_set1_ps(x); }
  STRATA_AVX2 static F zero() { return _mm256_setzero_ps(); }
  // max over the 8 lanes (no NaN in them: the order does not matter).
  STRATA_AVX2 static float reduce_max(F x) {
    __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    y = _mm_max_ps(y, _mm_movehl_ps(y, y));
    y = _mm_max_ss(y, _mm_shuffle_ps(y, y, 1));
    return _mm_cvtss_f32(y);
  }

  // ---- fp32 memory -------------------------------------------------------------------------
  STRATA_AVX2 static F loadu(const float* p) { return _mm256_loadu_ps(p); }
  STRATA_AVX2 static void storeu(float* p, F x) { _mm256_storeu_ps(p, x); }
  STRATA_AVX2 static F load(const float* p) { return _mm256_load_ps(p); }
  STRATA_AVX2 static void store(float* p, F x) { _mm256_store_ps(p, x); }

  // 8 gradient elements from index i, widened to fp32.
  template <DType kGrad>
  STRATA_AVX2 static F load_grad(const void* grad, std::size_t i) {
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

  // ---- gradient statistics ---------------------------------------------------------------
  // Adds 8 gradient values into lanes acc_lo (elements 0-3) and acc_hi (4-7), counting inf/NaN.
  STRATA_AVX2 static void stats8(__m256 x, __m256d* acc_lo, __m256d* acc_hi, __m256i* nonfinite) {
    const __m256i exponent = _mm256_set1_epi32(0x7f800000);
    const __m256i special =
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exponent), exponent);
    *nonfinite = _mm256_sub_epi32(*nonfinite, special);  // special lanes are -1
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    *acc_lo = _mm256_fmadd_pd(lo, lo, *acc_lo);
    *acc_hi = _mm256_fmadd_pd(hi, hi, *acc_hi);
  }

  // The gradient statistics of grad[begin, end) (StatsRangeFn), 16 elements per iteration.
  template <DType kGrad>
  STRATA_AVX2 static GradStats grad_stats(const void* grad, std::size_t begin, std::size_t end) {
    // Lanes 0-3, 4-7, 8-11, 12-15: element i goes to lane (i - begin) % 16 as combine_lanes wants.
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                      _mm256_setzero_pd()};
    __m256i nonfinite = _mm256_setzero_si256();  // per-lane counts; < 2^31 per call (one block)
    std::size_t i = begin;
    for (; i + 16 <= end; i += 16) {
      stats8(load_grad<kGrad>(grad, i), &acc[0], &acc[1], &nonfinite);
      stats8(load_grad<kGrad>(grad, i + 8), &acc[2], &acc[3], &nonfinite);
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

  // ---- 16-bit values -----------------------------------------------------------------------
  // fp32 -> bf16 round to nearest even, NaN quieted: the same bits as float_to_bf16().
  STRATA_AVX2 static H to_bf16(F x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet = _mm256_srli_epi32(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), 16);
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  STRATA_AVX2 static H to_f16(F x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT); }
  // sr_bf16() of 8 floats with 8 random words r: non-finite lanes add no noise, NaN is quieted.
  STRATA_AVX2 static H sr_bf16(F x, I r) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i exponent = _mm256_set1_epi32(0x7f800000);
    const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i noise =
        _mm256_andnot_si256(special, _mm256_and_si256(r, _mm256_set1_epi32(0xffff)));
    const __m256i base =
        _mm256_or_si256(bits, _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000)));
    const __m256i h = _mm256_srli_epi32(_mm256_add_epi32(base, noise), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  }
  STRATA_AVX2 static F widen_bf16(H h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  STRATA_AVX2 static F load_bf16(const void* p, std::size_t i) {
    return widen_bf16(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(p) + i)));
  }
  STRATA_AVX2 static void store_bf16(void* p, std::size_t i, H h) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(p) + i), h);
  }
  // 8 16-bit values at p (16-byte aligned), stored streaming (not read back, no
  // read-for-ownership of their lines) or plain.
  STRATA_AVX2 static void store_halves(std::uint16_t* p, H h, bool stream) {
    auto* out = reinterpret_cast<__m128i*>(p);
    stream ? _mm_stream_si128(out, h) : _mm_storeu_si128(out, h);
  }
  STRATA_AVX2 static void store_floats(float* p, F x, bool stream) {
    stream ? _mm256_stream_ps(p, x) : _mm256_storeu_ps(p, x);
  }

  // ---- stochastic rounding -----------------------------------------------------------------
  // lowbias32() in 8 lanes.
  STRATA_AVX2 static I lowbias32(I x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bU)));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  }
  // lane * kIndexMul per lane (the products wrap modulo 2^32 as the scalar ones do).
  STRATA_AVX2 static I lane_mul() {
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                              _mm256_set1_epi32(static_cast<int>(kIndexMul)));
  }
  // base + lane_mul: the hash input of 8 consecutive elements.
  STRATA_AVX2 static I hash_input(std::uint32_t base, I lane_mul) {
    return _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)), lane_mul);
  }
  STRATA_AVX2 static I add(I a, std::uint32_t b) {
    return _mm256_add_epi32(a, _mm256_set1_epi32(static_cast<int>(b)));
  }

  // ---- 8-bit moments -----------------------------------------------------------------------
  STRATA_AVX2 static __m128i load_bytes8(const void* p) {
    return _mm_loadl_epi64(static_cast<const __m128i*>(p));
  }
  // q8_decode_exp_avg_bounded() of 8 codes: t from the signed code (the same magnitude as from
  // |q|), t * t, times the scale, held to limit (minps: limit when unordered), then q's sign bit.
  STRATA_AVX2 static F q8_decode_m(const std::int8_t* codes, F scale, F limit) {
    const __m256i q = _mm256_cvtepi8_epi32(load_bytes8(codes));
    const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(kInv127));
    const __m256 m = _mm256_min_ps(_mm256_mul_ps(_mm256_mul_ps(t, t), scale), limit);
    const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000U));
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_andnot_si256(sign, _mm256_castps_si256(m)),
                                               _mm256_and_si256(sign, q)));
  }
  // q8_decode_exp_avg_sq() of 8 codes, and their q8_t2().
  STRATA_AVX2 static F q8_decode_v(const std::uint8_t* codes, F scale, F* t2_out) {
    const __m256i q = _mm256_cvtepu8_epi32(load_bytes8(codes));
    const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(kInv255));
    const __m256 t2 = _mm256_mul_ps(t, t);
    *t2_out = t2;
    return _mm256_mul_ps(_mm256_mul_ps(t2, t2), scale);
  }
  // q8_round() of 8 roots s with 16 random bits j each, as int32: min(fma(s, limit, u), limit)
  // truncated, which is min(floor(...), limit) for the position (> 0) and the limit for NaN.
  STRATA_AVX2 static I q8_round(F s, I j, float limit) {
    const __m256 u = _mm256_fmadd_ps(_mm256_cvtepi32_ps(j), _mm256_set1_ps(kCodeNoiseStep),
                                     _mm256_set1_ps(kCodeNoiseBase));
    const __m256 position = _mm256_fmadd_ps(s, _mm256_set1_ps(limit), u);
    return _mm256_cvttps_epi32(_mm256_min_ps(position, _mm256_set1_ps(limit)));
  }
  // q8_encode_exp_avg() of 8 moments, as int32.
  STRATA_AVX2 static I q8_code_m(F m, F inv, I r) {
    const __m256 s = _mm256_sqrt_ps(_mm256_mul_ps(abs(m), inv));
    const __m256i q = q8_round(s, _mm256_and_si256(r, _mm256_set1_epi32(0xffff)), 127.0f);
    // Negate where m < 0: (q ^ -1) - (-1) = -q.
    const __m256i negative = _mm256_castps_si256(_mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_LT_OQ));
    return _mm256_sub_epi32(_mm256_xor_si256(q, negative), negative);
  }
  // q8_encode_exp_avg_sq() of 8 moments from their square roots, as int32.
  STRATA_AVX2 static I q8_code_v(F sqrt_v, F inv_sqrt, I r) {
    const __m256 s = _mm256_sqrt_ps(_mm256_mul_ps(sqrt_v, inv_sqrt));
    return q8_round(s, _mm256_srli_epi32(r, 16), 255.0f);
  }
  // Four vectors of int32 codes stored as 32 bytes in element order (zeros when `zero`): two
  // saturating packs work within 128-bit lanes, one dword permutation restores the order (4
  // instructions instead of 12).
  template <bool kSigned>
  STRATA_AVX2 static void store_codes(void* dst, const I q[4], bool zero) {
    if (zero) {
      _mm256_storeu_si256(static_cast<__m256i*>(dst), _mm256_setzero_si256());
      return;
    }
    const __m256i words01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i words23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i bytes =
        kSigned ? _mm256_packs_epi16(words01, words23) : _mm256_packus_epi16(words01, words23);
    _mm256_storeu_si256(
        static_cast<__m256i*>(dst),
        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
};

}  // namespace strata::kernels::detail
