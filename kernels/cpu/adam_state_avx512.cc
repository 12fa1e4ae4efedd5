// The AVX-512 path of the CPU Adam kernels for compressed state (bf16 master, bf16 or 8-bit
// moments; adam_state.h): 16 elements per vector, decoded, updated and encoded in registers with
// the same IEEE operations, in the same order, as the scalar state_element(), so the bits are
// the scalar path's. 8-bit moments run block by block in two passes: the first updates the
// block and keeps its new fp32 moments in two on-stack buffers (8 KiB each at most, so they stay
// in L1) while tracking their maxima; the second encodes them against the block's new absmax.
#include "kernels/cpu/adam_avx512_vec.h"  // first: it carries a pragma for the intrinsics header
#include "kernels/cpu/adam_state.h"

namespace strata::kernels::detail {
namespace {

using avx512::Constants16;
using avx512::load_grad16;
using avx512::to_bf16x16;

// lowbias32() in 16 lanes.
STRATA_AVX512 inline __m512i lowbias32x16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bU)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

// rounding_bits(stream_key, i + lane) for the 16 lanes; lane_mul holds lane * kIndexMul, so the
// products wrap modulo 2^32 exactly as the scalar i * kIndexMul does.
STRATA_AVX512 inline __m512i rounding_bits16(std::uint32_t stream_key, std::size_t i,
                                             __m512i lane_mul) {
  const std::uint32_t base = static_cast<std::uint32_t>(i) * kIndexMul + stream_key;
  return lowbias32x16(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)), lane_mul));
}

// sr_bf16() of 16 floats, as 16 bf16: non-finite lanes add no noise, and NaN is quieted, which
// is float_to_bf16() on them.
STRATA_AVX512 inline __m256i sr_bf16x16(__m512 x, __m512i r) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), exponent);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i noise =
      _mm512_maskz_and_epi32(static_cast<__mmask16>(~special), r, _mm512_set1_epi32(0xffff));
  const __m512i base = _mm512_mask_or_epi32(bits, nan, bits, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(base, noise), 16));
}

STRATA_AVX512 inline __m512 widen_bf16x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

STRATA_AVX512 inline __m512 load_bf16x16(const void* p, std::size_t i) {
  return widen_bf16x16(_mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(p) + i)));
}

STRATA_AVX512 inline void store_bf16x16(void* p, std::size_t i, __m256i h) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(p) + i), h);
}

// q8_decode_exp_avg_bounded() of 16 codes: t from the signed code (the same magnitude as from |q|),
// t * t, times the scale, then q's sign bit (copysign).
STRATA_AVX512 inline __m512 q8_decode_m16(const std::int8_t* codes, __m512 scale, __m512 limit) {
  const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(kInv127));
  // q8_decode_exp_avg_bounded(): the magnitude held to limit (minps: limit when unordered).
  const __m512 m = _mm512_min_ps(_mm512_mul_ps(_mm512_mul_ps(t, t), scale), limit);
  // Bit select: the sign bit from q, the rest from m (imm 0xB8: b ? c : a per bit).
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
      _mm512_castps_si512(m), _mm512_set1_epi32(static_cast<int>(0x80000000U)), q, 0xB8));
}

// q8_decode_exp_avg_sq() of 16 codes, and their q8_t2().
STRATA_AVX512 inline __m512 q8_decode_v16(const std::uint8_t* codes, __m512 scale, __m512* t2_out) {
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(kInv255));
  const __m512 t2 = _mm512_mul_ps(t, t);
  *t2_out = t2;
  return _mm512_mul_ps(_mm512_mul_ps(t2, t2), scale);
}

// q8_round() of 16 roots s with 16 random bits j each, as int32: min(fma(s, limit, u), limit)
// truncated, which is min(floor(...), limit) for the position (> 0: s >= 0 and u > 0) and the
// limit for NaN (minps returns its second operand), in two instructions.
STRATA_AVX512 inline __m512i q8_round16(__m512 s, __m512i j, float limit) {
  const __m512 u = _mm512_fmadd_ps(_mm512_cvtepi32_ps(j), _mm512_set1_ps(kCodeNoiseStep),
                                   _mm512_set1_ps(kCodeNoiseBase));
  const __m512 position = _mm512_fmadd_ps(s, _mm512_set1_ps(limit), u);
  return _mm512_cvttps_epi32(_mm512_min_ps(position, _mm512_set1_ps(limit)));
}

// q8_encode_exp_avg() of 16 moments, as int32: position 127 * sqrt(|m| * inv), negated where
// m < 0.
STRATA_AVX512 inline __m512i q8_code_m16(__m512 m, __m512 inv, __m512i r) {
  const __m512 s = _mm512_sqrt_ps(_mm512_mul_ps(_mm512_abs_ps(m), inv));
  const __m512i q = q8_round16(s, _mm512_and_si512(r, _mm512_set1_epi32(0xffff)), 127.0f);
  const __mmask16 negative = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_sub_epi32(q, negative, _mm512_setzero_si512(), q);
}

// q8_encode_exp_avg_sq() of 16 moments from their square roots, as int32: position
// 255 * sqrt(sqrt_v * inv_sqrt).
STRATA_AVX512 inline __m512i q8_code_v16(__m512 sqrt_v, __m512 inv_sqrt, __m512i r) {
  const __m512 s = _mm512_sqrt_ps(_mm512_mul_ps(sqrt_v, inv_sqrt));
  return q8_round16(s, _mm512_srli_epi32(r, 16), 255.0f);
}

// Four vectors of int32 codes as 64 bytes in element order: two saturating packs work within
// 128-bit lanes (lane L then holds elements 4L..4L+3 of each vector), one dword permutation
// restores the order. Four instructions where four vpmovdb would take eight micro-ops.
template <bool kSigned>
STRATA_AVX512 inline __m512i pack_codes64(const __m512i q[4]) {
  const __m512i words01 = _mm512_packs_epi32(q[0], q[1]);
  const __m512i words23 = _mm512_packs_epi32(q[2], q[3]);
  const __m512i bytes =
      kSigned ? _mm512_packs_epi16(words01, words23) : _mm512_packus_epi16(words01, words23);
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_epi32(order, bytes);
}

// The copy-out of 16 new weights (`stored`: the master as stored, widened). Streaming stores when
// the caller found the copy aligned: it is not read back here, so they skip the read-for-ownership
// of its lines (docs/adam.md).
STRATA_AVX512 inline void store_copy16(void* copy, CopyKind kind, bool stream, std::size_t i,
                                       __m512 stored) {
  if (kind == CopyKind::kNone) return;
  if (kind == CopyKind::kF32) {
    float* out = static_cast<float*>(copy) + i;
    stream ? _mm512_stream_ps(out, stored) : _mm512_storeu_ps(out, stored);
    return;
  }
  const __m256i h = kind == CopyKind::kBF16 ? to_bf16x16(stored)
                                            : _mm512_cvtps_ph(stored, _MM_FROUND_TO_NEAREST_INT);
  auto* out = reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(copy) + i);
  stream ? _mm256_stream_si256(out, h) : _mm256_storeu_si256(out, h);
}

// What one range keeps in registers.
struct Range16 {
  Constants16 k;
  __m512i lane_mul;
  RoundingKeys keys;
  CopyKind copy;
  bool stream;  // the copy-out is aligned for streaming stores
};

// One 8-bit block's first pass in registers: the stored scales, the new moments' maxima.
struct Q8Pass16 {
  __m512 scale_m, scale_v;
  __m512 max_m, max_v;
  __m512 limit;  // q8_m_limit() of the block
};

// Elements [i, i + 16): decode, update, and encode all but 8-bit moments, which go to the block
// buffers of `pass` (block-relative index i - pass.base).
template <DType kMaster, MomentFormat kMoments, DType kGrad, bool kL2>
STRATA_AVX512 inline void state16(const Range16& r, const StatePointers& s, std::size_t i,
                                  Q8Pass* pass, Q8Pass16* q8) {
  const Constants16& k = r.k;
  __m512 g = _mm512_mul_ps(load_grad16<kGrad>(s.grad, i), k.grad_scale);
  __m512 w;
  if constexpr (kMaster == DType::kF32) {
    w = _mm512_loadu_ps(static_cast<const float*>(s.master) + i);
  } else {
    w = load_bf16x16(s.master, i);
  }
  __m512 m;
  __m512 v;
  if constexpr (kMoments == MomentFormat::kF32) {
    m = _mm512_loadu_ps(static_cast<const float*>(s.exp_avg) + i);
    v = _mm512_loadu_ps(static_cast<const float*>(s.exp_avg_sq) + i);
  } else if constexpr (kMoments == MomentFormat::kBF16) {
    m = load_bf16x16(s.exp_avg, i);
    v = load_bf16x16(s.exp_avg_sq, i);
  } else {
    __m512 t2;
    v = q8_decode_v16(static_cast<const std::uint8_t*>(s.exp_avg_sq) + i, q8->scale_v, &t2);
    m = q8_decode_m16(static_cast<const std::int8_t*>(s.exp_avg) + i, q8->scale_m,
                      _mm512_mul_ps(t2, q8->limit));
  }
  // adam_update(), operation for operation.
  if constexpr (kL2) g = _mm512_fmadd_ps(k.l2, w, g);
  m = _mm512_fmadd_ps(k.beta1, m, _mm512_mul_ps(k.one_minus_beta1, g));
  v = _mm512_fmadd_ps(k.beta2, v, _mm512_mul_ps(_mm512_mul_ps(k.one_minus_beta2, g), g));
  const __m512 sqrt_v = _mm512_sqrt_ps(v);
  const __m512 denom = _mm512_fmadd_ps(sqrt_v, k.inv_sqrt_bc2, k.eps);
  w = _mm512_mul_ps(w, k.decay);
  w = _mm512_fmadd_ps(k.neg_step_size, _mm512_div_ps(m, denom), w);

  if constexpr (kMaster == DType::kF32) {
    _mm512_storeu_ps(static_cast<float*>(s.master) + i, w);
  } else {
    const __m256i h = sr_bf16x16(w, rounding_bits16(r.keys.master, i, r.lane_mul));
    store_bf16x16(s.master, i, h);
    w = widen_bf16x16(h);
  }
  store_copy16(s.copy, r.copy, r.stream, i, w);
  if constexpr (kMoments == MomentFormat::kF32) {
    _mm512_storeu_ps(static_cast<float*>(s.exp_avg) + i, m);
    _mm512_storeu_ps(static_cast<float*>(s.exp_avg_sq) + i, v);
  } else if constexpr (kMoments == MomentFormat::kBF16) {
    store_bf16x16(s.exp_avg, i, sr_bf16x16(m, rounding_bits16(r.keys.exp_avg, i, r.lane_mul)));
    store_bf16x16(s.exp_avg_sq, i,
                  sr_bf16x16(v, rounding_bits16(r.keys.exp_avg_sq, i, r.lane_mul)));
  } else {
    _mm512_store_ps(pass->new_m + (i - pass->base), m);
    _mm512_store_ps(pass->new_sqrt_v + (i - pass->base), sqrt_v);
    // maxps(x, acc): acc where x is NaN, as max_ps() in the scalar pass.
    q8->max_m = _mm512_max_ps(_mm512_abs_ps(m), q8->max_m);
    q8->max_v = _mm512_max_ps(v, q8->max_v);
  }
}

// A block's second pass: its buffers, where its codes go, the scales they are encoded with, and
// the hash input of the next 16 elements (tile index times kIndexMul plus the key, per lane).
struct Q8Encode16 {
  const float* new_m;
  const float* new_sqrt_v;
  std::int8_t* codes_m;
  std::uint8_t* codes_v;
  __m512 inv_m, inv_sqrt_v;
  __m512i hash_in;
  bool zero_m, zero_v;  // stored as zeros
  STRATA_AVX512 Q8Encode16(const Range16& r, const Q8Pass& pass, const Q8Scales& scales,
                           const StatePointers& s)
      : new_m(pass.new_m),
        new_sqrt_v(pass.new_sqrt_v),
        codes_m(static_cast<std::int8_t*>(s.exp_avg) + pass.base),
        codes_v(static_cast<std::uint8_t*>(s.exp_avg_sq) + pass.base),
        inv_m(_mm512_set1_ps(scales.inv_m)),
        inv_sqrt_v(_mm512_set1_ps(scales.inv_sqrt_v)),
        hash_in(_mm512_add_epi32(
            _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(pass.base) * kIndexMul +
                                               r.keys.exp_avg)),
            r.lane_mul)),
        zero_m(scales.scale_m == 0.0f),
        zero_v(scales.scale_v == 0.0f) {}
};

// The codes of block elements [k, k + 64) (blocks are multiples of 64).
STRATA_AVX512 inline void encode64(Q8Encode16& e, std::size_t k) {
  const __m512i step = _mm512_set1_epi32(static_cast<int>(16 * kIndexMul));
  __m512i qm[4];
  __m512i qv[4];
  for (int j = 0; j < 4; ++j) {
    const __m512i bits = lowbias32x16(e.hash_in);
    e.hash_in = _mm512_add_epi32(e.hash_in, step);
    qm[j] = q8_code_m16(_mm512_load_ps(e.new_m + k + 16 * j), e.inv_m, bits);
    qv[j] = q8_code_v16(_mm512_load_ps(e.new_sqrt_v + k + 16 * j), e.inv_sqrt_v, bits);
  }
  const __m512i zero = _mm512_setzero_si512();
  _mm512_storeu_si512(e.codes_m + k, e.zero_m ? zero : pack_codes64<true>(qm));
  _mm512_storeu_si512(e.codes_v + k, e.zero_v ? zero : pack_codes64<false>(qv));
}

struct Avx512State {
  template <DType kMaster, MomentFormat kMoments, DType kGrad, bool kL2>
  STRATA_AVX512 static void range(const AdamConstants& constants, const AdamTile& t,
                                  std::size_t begin, std::size_t end) {
    const AdamConstants c = constants;
    const StatePointers s = state_pointers(t);
    const Range16 r{
        Constants16(c),
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(static_cast<int>(kIndexMul))),
        RoundingKeys(t.rounding_key, t.rounding_offset), copy_kind(t), copy_aligned(t, begin, 16)};
    if constexpr (kMoments != MomentFormat::kQ8) {
      std::size_t i = begin;
      for (; i + 16 <= end; i += 16)
        state16<kMaster, kMoments, kGrad, kL2>(r, s, i, nullptr, nullptr);
      for (; i < end; ++i) {
        state_element<kMaster, kMoments, kL2>(c, s, r.keys, load_grad(s.grad, kGrad, i), r.copy, i,
                                              nullptr);
      }
    } else {
      // Software-pipelined over blocks: the first pass of block b + 1 runs vector by vector
      // beside the second pass of block b, so the divider-bound update and the port-bound encode
      // overlap and the memory streams never pause for an encode-only phase. Two buffer pairs.
      const std::size_t block = t.block;
      Q8Buffers buffers;
      Q8Pass done;  // the block whose first pass finished and whose codes are pending
      bool pending = false;
      int parity = 0;
      for (std::size_t b = begin; b < end; b += block, parity ^= 1) {
        Q8Pass pass =
            q8_begin_block(c, s, block, b, buffers.get(parity, 0), buffers.get(parity, 1));
        Q8Pass16 q8{_mm512_set1_ps(pass.scale_m), _mm512_set1_ps(pass.scale_v), _mm512_setzero_ps(),
                    _mm512_setzero_ps(), _mm512_set1_ps(pass.limit)};
        if (pending) {
          const Q8Scales scales(done);
          Q8Encode16 e(r, done, scales, s);
          for (std::size_t k = 0; k < block; k += 64) {
            for (std::size_t j = k; j < k + 64; j += 16)
              state16<kMaster, kMoments, kGrad, kL2>(r, s, b + j, &pass, &q8);
            encode64(e, k);
          }
          q8_store_scales(done, scales, s, block);
        } else {
          for (std::size_t k = 0; k < block; k += 16)
            state16<kMaster, kMoments, kGrad, kL2>(r, s, b + k, &pass, &q8);
        }
        // The maxima are order-free: no NaN ever enters them, and -0 never replaces +0.
        pass.max_m = _mm512_reduce_max_ps(q8.max_m);
        pass.max_v = _mm512_reduce_max_ps(q8.max_v);
        done = pass;
        pending = true;
      }
      if (pending) {
        const Q8Scales scales(done);
        Q8Encode16 e(r, done, scales, s);
        for (std::size_t k = 0; k < block; k += 64)
          encode64(e, k);
        q8_store_scales(done, scales, s, block);
      }
    }
    if (r.copy != CopyKind::kNone && r.stream) _mm_sfence();
  }
};

}  // namespace

void adam_state_range_avx512(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                             std::size_t end) {
  dispatch_state<Avx512State>(c, t, begin, end);
}

}  // namespace strata::kernels::detail
