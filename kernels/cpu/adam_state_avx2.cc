// The AVX2 + FMA + F16C path of the CPU Adam kernels for compressed state (bf16 master, bf16 or
// 8-bit moments; adam_state.h): 8 elements per vector, decoded, updated and encoded in registers
// with the same IEEE operations, in the same order, as the scalar state_element(), so the bits
// are the scalar path's. 8-bit moments run block by block in two passes, as on the AVX-512 path
// (adam_state_avx512.cc).
#include "kernels/cpu/adam_avx2_vec.h"
#include "kernels/cpu/adam_state.h"

namespace strata::kernels::detail {
namespace {

using avx2::Constants8;
using avx2::load_grad8;
using avx2::to_bf16x8;

// lowbias32() in 8 lanes.
STRATA_AVX2 inline __m256i lowbias32x8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bU)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

// rounding_bits(stream_key, i + lane) for the 8 lanes (lane_mul: lane * kIndexMul).
STRATA_AVX2 inline __m256i rounding_bits8(std::uint32_t stream_key, std::size_t i,
                                          __m256i lane_mul) {
  const std::uint32_t base = static_cast<std::uint32_t>(i) * kIndexMul + stream_key;
  return lowbias32x8(_mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)), lane_mul));
}

// sr_bf16() of 8 floats, as 8 bf16: non-finite lanes add no noise, and NaN is quieted.
STRATA_AVX2 inline __m128i sr_bf16x8(__m256 x, __m256i r) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i noise =
      _mm256_andnot_si256(special, _mm256_and_si256(r, _mm256_set1_epi32(0xffff)));
  const __m256i base = _mm256_or_si256(bits, _mm256_and_si256(nan, _mm256_set1_epi32(0x00400000)));
  const __m256i h = _mm256_srli_epi32(_mm256_add_epi32(base, noise), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

STRATA_AVX2 inline __m256 widen_bf16x8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

STRATA_AVX2 inline __m256 load_bf16x8(const void* p, std::size_t i) {
  return widen_bf16x8(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(p) + i)));
}

STRATA_AVX2 inline void store_bf16x8(void* p, std::size_t i, __m128i h) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(p) + i), h);
}

STRATA_AVX2 inline __m128i load_bytes8(const void* p) {
  return _mm_loadl_epi64(static_cast<const __m128i*>(p));
}

// q8_decode_exp_avg_bounded() of 8 codes: t from the signed code (the same magnitude as from |q|),
// t * t, times the scale, then q's sign bit (copysign).
STRATA_AVX2 inline __m256 q8_decode_m8(const std::int8_t* codes, __m256 scale, __m256 limit) {
  const __m256i q = _mm256_cvtepi8_epi32(load_bytes8(codes));
  const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(kInv127));
  // q8_decode_exp_avg_bounded(): the magnitude held to limit (minps: limit when unordered).
  const __m256 m = _mm256_min_ps(_mm256_mul_ps(_mm256_mul_ps(t, t), scale), limit);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000U));
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_andnot_si256(sign, _mm256_castps_si256(m)),
                                             _mm256_and_si256(sign, q)));
}

// q8_decode_exp_avg_sq() of 8 codes, and their q8_t2().
STRATA_AVX2 inline __m256 q8_decode_v8(const std::uint8_t* codes, __m256 scale, __m256* t2_out) {
  const __m256i q = _mm256_cvtepu8_epi32(load_bytes8(codes));
  const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(kInv255));
  const __m256 t2 = _mm256_mul_ps(t, t);
  *t2_out = t2;
  return _mm256_mul_ps(_mm256_mul_ps(t2, t2), scale);
}

// q8_round() of 8 roots s with 16 random bits j each, as int32: min(fma(s, limit, u), limit)
// truncated, which is min(floor(...), limit) for the position (> 0) and the limit for NaN.
STRATA_AVX2 inline __m256i q8_round8(__m256 s, __m256i j, float limit) {
  const __m256 u = _mm256_fmadd_ps(_mm256_cvtepi32_ps(j), _mm256_set1_ps(kCodeNoiseStep),
                                   _mm256_set1_ps(kCodeNoiseBase));
  const __m256 position = _mm256_fmadd_ps(s, _mm256_set1_ps(limit), u);
  return _mm256_cvttps_epi32(_mm256_min_ps(position, _mm256_set1_ps(limit)));
}

// q8_encode_exp_avg() of 8 moments, as int32.
STRATA_AVX2 inline __m256i q8_code_m8(__m256 m, __m256 inv, __m256i r) {
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), m);
  const __m256 s = _mm256_sqrt_ps(_mm256_mul_ps(magnitude, inv));
  const __m256i q = q8_round8(s, _mm256_and_si256(r, _mm256_set1_epi32(0xffff)), 127.0f);
  // Negate where m < 0: (q ^ -1) - (-1) = -q.
  const __m256i negative = _mm256_castps_si256(_mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_LT_OQ));
  return _mm256_sub_epi32(_mm256_xor_si256(q, negative), negative);
}

// q8_encode_exp_avg_sq() of 8 moments from their square roots, as int32.
STRATA_AVX2 inline __m256i q8_code_v8(__m256 sqrt_v, __m256 inv_sqrt, __m256i r) {
  const __m256 s = _mm256_sqrt_ps(_mm256_mul_ps(sqrt_v, inv_sqrt));
  return q8_round8(s, _mm256_srli_epi32(r, 16), 255.0f);
}

// Four vectors of int32 codes as 32 bytes in element order: two saturating packs work within
// 128-bit lanes, one dword permutation restores the order (4 instructions instead of 12).
template <bool kSigned>
STRATA_AVX2 inline __m256i pack_codes32(const __m256i q[4]) {
  const __m256i words01 = _mm256_packs_epi32(q[0], q[1]);
  const __m256i words23 = _mm256_packs_epi32(q[2], q[3]);
  const __m256i bytes =
      kSigned ? _mm256_packs_epi16(words01, words23) : _mm256_packus_epi16(words01, words23);
  return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The copy-out of 8 new weights (`stored`: the master as stored, widened); streaming stores when
// the copy is aligned for them (it is not read back here).
STRATA_AVX2 inline void store_copy8(void* copy, CopyKind kind, bool stream, std::size_t i,
                                    __m256 stored) {
  if (kind == CopyKind::kNone) return;
  if (kind == CopyKind::kF32) {
    float* out = static_cast<float*>(copy) + i;
    stream ? _mm256_stream_ps(out, stored) : _mm256_storeu_ps(out, stored);
    return;
  }
  const __m128i h = kind == CopyKind::kBF16 ? to_bf16x8(stored)
                                            : _mm256_cvtps_ph(stored, _MM_FROUND_TO_NEAREST_INT);
  auto* out = reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(copy) + i);
  stream ? _mm_stream_si128(out, h) : _mm_storeu_si128(out, h);
}

// max over the 8 lanes (no NaN in them: the order does not matter).
STRATA_AVX2 inline float reduce_max8(__m256 x) {
  __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  y = _mm_max_ps(y, _mm_movehl_ps(y, y));
  y = _mm_max_ss(y, _mm_shuffle_ps(y, y, 1));
  return _mm_cvtss_f32(y);
}

// What one range keeps in registers.
struct Range8 {
  Constants8 k;
  __m256i lane_mul;
  RoundingKeys keys;
  CopyKind copy;
  bool stream;  // the copy-out is aligned for streaming stores
};

// One 8-bit block's first pass in registers: the stored scales, the new moments' maxima.
struct Q8Pass8 {
  __m256 scale_m, scale_v;
  __m256 max_m, max_v;
  __m256 limit;  // q8_m_limit() of the block
};

// Elements [i, i + 8): decode, update, and encode all but 8-bit moments, which go to the block
// buffers of `pass`.
template <DType kMaster, MomentFormat kMoments, DType kGrad, bool kL2>
STRATA_AVX2 inline void state8(const Range8& r, const StatePointers& s, std::size_t i, Q8Pass* pass,
                               Q8Pass8* q8) {
  const Constants8& k = r.k;
  __m256 g = _mm256_mul_ps(load_grad8<kGrad>(s.grad, i), k.grad_scale);
  __m256 w;
  if constexpr (kMaster == DType::kF32) {
    w = _mm256_loadu_ps(static_cast<const float*>(s.master) + i);
  } else {
    w = load_bf16x8(s.master, i);
  }
  __m256 m;
  __m256 v;
  if constexpr (kMoments == MomentFormat::kF32) {
    m = _mm256_loadu_ps(static_cast<const float*>(s.exp_avg) + i);
    v = _mm256_loadu_ps(static_cast<const float*>(s.exp_avg_sq) + i);
  } else if constexpr (kMoments == MomentFormat::kBF16) {
    m = load_bf16x8(s.exp_avg, i);
    v = load_bf16x8(s.exp_avg_sq, i);
  } else {
    __m256 t2;
    v = q8_decode_v8(static_cast<const std::uint8_t*>(s.exp_avg_sq) + i, q8->scale_v, &t2);
    m = q8_decode_m8(static_cast<const std::int8_t*>(s.exp_avg) + i, q8->scale_m,
                     _mm256_mul_ps(t2, q8->limit));
  }
  // adam_update(), operation for operation.
  if constexpr (kL2) g = _mm256_fmadd_ps(k.l2, w, g);
  m = _mm256_fmadd_ps(k.beta1, m, _mm256_mul_ps(k.one_minus_beta1, g));
  v = _mm256_fmadd_ps(k.beta2, v, _mm256_mul_ps(_mm256_mul_ps(k.one_minus_beta2, g), g));
  const __m256 sqrt_v = _mm256_sqrt_ps(v);
  const __m256 denom = _mm256_fmadd_ps(sqrt_v, k.inv_sqrt_bc2, k.eps);
  w = _mm256_mul_ps(w, k.decay);
  w = _mm256_fmadd_ps(k.neg_step_size, _mm256_div_ps(m, denom), w);

  if constexpr (kMaster == DType::kF32) {
    _mm256_storeu_ps(static_cast<float*>(s.master) + i, w);
  } else {
    const __m128i h = sr_bf16x8(w, rounding_bits8(r.keys.master, i, r.lane_mul));
    store_bf16x8(s.master, i, h);
    w = widen_bf16x8(h);
  }
  store_copy8(s.copy, r.copy, r.stream, i, w);
  if constexpr (kMoments == MomentFormat::kF32) {
    _mm256_storeu_ps(static_cast<float*>(s.exp_avg) + i, m);
    _mm256_storeu_ps(static_cast<float*>(s.exp_avg_sq) + i, v);
  } else if constexpr (kMoments == MomentFormat::kBF16) {
    store_bf16x8(s.exp_avg, i, sr_bf16x8(m, rounding_bits8(r.keys.exp_avg, i, r.lane_mul)));
    store_bf16x8(s.exp_avg_sq, i, sr_bf16x8(v, rounding_bits8(r.keys.exp_avg_sq, i, r.lane_mul)));
  } else {
    _mm256_store_ps(pass->new_m + (i - pass->base), m);
    _mm256_store_ps(pass->new_sqrt_v + (i - pass->base), sqrt_v);
    // maxps(x, acc): acc where x is NaN, as max_ps() in the scalar pass.
    q8->max_m = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), m), q8->max_m);
    q8->max_v = _mm256_max_ps(v, q8->max_v);
  }
}

// A block's second pass: its buffers, where its codes go, the scales they are encoded with, and
// the hash input of the next 8 elements (tile index times kIndexMul plus the key, per lane).
struct Q8Encode8 {
  const float* new_m;
  const float* new_sqrt_v;
  std::int8_t* codes_m;
  std::uint8_t* codes_v;
  __m256 inv_m, inv_sqrt_v;
  __m256i hash_in;
  bool zero_m, zero_v;  // stored as zeros
  STRATA_AVX2 Q8Encode8(const Range8& r, const Q8Pass& pass, const Q8Scales& scales,
                        const StatePointers& s)
      : new_m(pass.new_m),
        new_sqrt_v(pass.new_sqrt_v),
        codes_m(static_cast<std::int8_t*>(s.exp_avg) + pass.base),
        codes_v(static_cast<std::uint8_t*>(s.exp_avg_sq) + pass.base),
        inv_m(_mm256_set1_ps(scales.inv_m)),
        inv_sqrt_v(_mm256_set1_ps(scales.inv_sqrt_v)),
        hash_in(_mm256_add_epi32(
            _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(pass.base) * kIndexMul +
                                               r.keys.exp_avg)),
            r.lane_mul)),
        zero_m(scales.scale_m == 0.0f),
        zero_v(scales.scale_v == 0.0f) {}
};

// The codes of block elements [k, k + 32) (blocks are multiples of 64).
STRATA_AVX2 inline void encode32(Q8Encode8& e, std::size_t k) {
  const __m256i step = _mm256_set1_epi32(static_cast<int>(8 * kIndexMul));
  __m256i qm[4];
  __m256i qv[4];
  for (int j = 0; j < 4; ++j) {
    const __m256i bits = lowbias32x8(e.hash_in);
    e.hash_in = _mm256_add_epi32(e.hash_in, step);
    qm[j] = q8_code_m8(_mm256_load_ps(e.new_m + k + 8 * j), e.inv_m, bits);
    qv[j] = q8_code_v8(_mm256_load_ps(e.new_sqrt_v + k + 8 * j), e.inv_sqrt_v, bits);
  }
  const __m256i zero = _mm256_setzero_si256();
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(e.codes_m + k),
                      e.zero_m ? zero : pack_codes32<true>(qm));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(e.codes_v + k),
                      e.zero_v ? zero : pack_codes32<false>(qv));
}

struct Avx2State {
  template <DType kMaster, MomentFormat kMoments, DType kGrad, bool kL2>
  STRATA_AVX2 static void range(const AdamConstants& constants, const AdamTile& t,
                                std::size_t begin, std::size_t end) {
    const AdamConstants c = constants;
    const StatePointers s = state_pointers(t);
    const Range8 r{Constants8(c),
                   _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                      _mm256_set1_epi32(static_cast<int>(kIndexMul))),
                   RoundingKeys(t.rounding_key, t.rounding_offset), copy_kind(t),
                   copy_aligned(t, begin, 8)};
    if constexpr (kMoments != MomentFormat::kQ8) {
      std::size_t i = begin;
      for (; i + 8 <= end; i += 8)
        state8<kMaster, kMoments, kGrad, kL2>(r, s, i, nullptr, nullptr);
      for (; i < end; ++i) {
        state_element<kMaster, kMoments, kL2>(c, s, r.keys, load_grad(s.grad, kGrad, i), r.copy, i,
                                              nullptr);
      }
    } else {
      // Software-pipelined over blocks as on the AVX-512 path: the first pass of block b + 1
      // beside the second pass of block b, vector by vector.
      const std::size_t block = t.block;
      Q8Buffers buffers;
      Q8Pass done;
      bool pending = false;
      int parity = 0;
      for (std::size_t b = begin; b < end; b += block, parity ^= 1) {
        Q8Pass pass =
            q8_begin_block(c, s, block, b, buffers.get(parity, 0), buffers.get(parity, 1));
        Q8Pass8 q8{_mm256_set1_ps(pass.scale_m), _mm256_set1_ps(pass.scale_v), _mm256_setzero_ps(),
                   _mm256_setzero_ps(), _mm256_set1_ps(pass.limit)};
        if (pending) {
          const Q8Scales scales(done);
          Q8Encode8 e(r, done, scales, s);
          for (std::size_t k = 0; k < block; k += 32) {
            for (std::size_t j = k; j < k + 32; j += 8)
              state8<kMaster, kMoments, kGrad, kL2>(r, s, b + j, &pass, &q8);
            encode32(e, k);
          }
          q8_store_scales(done, scales, s, block);
        } else {
          for (std::size_t k = 0; k < block; k += 8)
            state8<kMaster, kMoments, kGrad, kL2>(r, s, b + k, &pass, &q8);
        }
        pass.max_m = reduce_max8(q8.max_m);
        pass.max_v = reduce_max8(q8.max_v);
        done = pass;
        pending = true;
      }
      if (pending) {
        const Q8Scales scales(done);
        Q8Encode8 e(r, done, scales, s);
        for (std::size_t k = 0; k < block; k += 32)
          encode32(e, k);
        q8_store_scales(done, scales, s, block);
      }
    }
    if (r.copy != CopyKind::kNone && r.stream) _mm_sfence();
  }
};

}  // namespace

void adam_state_range_avx2(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                           std::size_t end) {
  dispatch_state<Avx2State>(c, t, begin, end);
}

}  // namespace strata::kernels::detail
