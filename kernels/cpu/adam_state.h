// Internal to the CPU Adam kernels (adam*.cc): the codecs of compressed optimizer state (bf16
// master and moments with stochastic rounding, 8-bit moments with a per-block absmax) and the
// scalar form of one compressed-state step, which the scalar path runs and the vector paths use
// for their tails. Every vector path performs the same IEEE operations in the same
// order, so all paths give the same bits; adam_state_reference() (adam_reference.cc) is the
// readable definition they are tested against. See docs/adam.md, "Compressed optimizer state".
#pragma once

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/assert.h"
#include "kernels/cpu/adam_internal.h"

namespace strata::kernels::detail {

// 8-bit codes: the decode multiplies by these (127 * kInv127 and 255 * kInv255 are exactly 1, so
// the largest code decodes to the block's absmax exactly).
inline constexpr float kInv127 = 1.0f / 127.0f;
inline constexpr float kInv255 = 1.0f / 255.0f;
// Multiplies the tile index before hashing (2^32 / golden ratio: consecutive indices spread).
inline constexpr std::uint32_t kIndexMul = 0x9E3779B1u;

// Chris Wellons' lowbias32: a cheap 32-bit integer hash with good avalanche, vectorizable with
// 32-bit lane multiplies.
[[gnu::always_inline]] inline std::uint32_t lowbias32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// The per-array keys of a tile's rounding stream: stream s (0 master, 1 exp_avg, 2 exp_avg_sq)
// is keyed by lowbias32(rounding_key + s + 1). Element i of the tile hashes index
// rounding_offset + i; as (o + i) * kIndexMul + key = i * kIndexMul + (o * kIndexMul + key)
// modulo 2^32, the offset is folded into the keys once and every path hashes i as before.
struct RoundingKeys {
  std::uint32_t master;
  std::uint32_t exp_avg;
  std::uint32_t exp_avg_sq;
  RoundingKeys(std::uint32_t key, std::uint32_t offset)
      : master(lowbias32(key + 1) + offset * kIndexMul),
        exp_avg(lowbias32(key + 2) + offset * kIndexMul),
        exp_avg_sq(lowbias32(key + 3) + offset * kIndexMul) {}
};

// The random bits for element i (tile index) of the stream keyed by stream_key.
[[gnu::always_inline]] inline std::uint32_t rounding_bits(std::uint32_t stream_key, std::size_t i) {
  return lowbias32(static_cast<std::uint32_t>(i) * kIndexMul + stream_key);
}

// fp32 -> bf16, rounded stochastically: 16 random bits are added below the bf16 mantissa and the
// sum truncated, so x rounds away from zero with probability (its dropped bits) / 2^16 and the
// rounding is unbiased. Non-finite x rounds to nearest even as float_to_bf16() does.
[[gnu::always_inline]] inline std::uint16_t sr_bf16(float x, std::uint32_t r) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return float_to_bf16(x);
  return static_cast<std::uint16_t>((bits + (r & 0xffffu)) >> 16);
}

// x86 maxps(x, acc) and minps(x, limit): the second operand when either is NaN (the vector paths
// use the instructions with these operand orders, so NaN behaves alike everywhere).
[[gnu::always_inline]] inline float max_ps(float x, float acc) {
  return x > acc ? x : acc;
}
[[gnu::always_inline]] inline float min_ps(float x, float limit) {
  return x < limit ? x : limit;
}

// exp_avg from its code: copysign((|q| / 127)^2 * absmax, q), the product (t * t) first.
[[gnu::always_inline]] inline float q8_decode_exp_avg(std::int8_t q, float absmax) {
  const int magnitude = q < 0 ? -q : q;
  const float t = static_cast<float>(magnitude) * kInv127;
  return std::copysign((t * t) * absmax, static_cast<float>(q));
}

// (q / 255)^2 of an exp_avg_sq code: sqrt(v / absmax) in real arithmetic.
[[gnu::always_inline]] inline float q8_t2(std::uint8_t q) {
  const float t = static_cast<float>(q) * kInv255;
  return t * t;
}

// exp_avg_sq from its code: ((q / 255)^2)^2 * absmax.
[[gnu::always_inline]] inline float q8_decode_exp_avg_sq(std::uint8_t q, float absmax) {
  const float t2 = q8_t2(q);
  return (t2 * t2) * absmax;
}

// The block's bound on a decoded |exp_avg| per unit of q8_t2() of its exp_avg_sq code:
// m_bound * sqrt(absmax of exp_avg_sq), at most FLT_MAX (so that t2 * limit is never 0 * inf),
// and 0 for an all-zero block (v = 0 means every gradient so far was 0, so m = 0).
[[gnu::always_inline]] inline float q8_m_limit(float m_bound, float scale_v) {
  return scale_v > 0.0f ? min_ps(m_bound * std::sqrt(scale_v), FLT_MAX) : 0.0f;
}

// exp_avg from its code as the update reads it: magnitude min((t * t) * absmax, limit) (min_ps)
// with limit = q8_t2(v's code) * q8_m_limit(), then q's sign. Adam's own moments always satisfy
// |m| <= m_bound * sqrt(v); independently rounded codes need not (a v code rounded to 0 under a
// non-zero m code would make m / (sqrt(v) + eps) enormous), so the decoded m is held to it.
[[gnu::always_inline]] inline float q8_decode_exp_avg_bounded(std::int8_t q, float absmax,
                                                              float limit) {
  const int magnitude = q < 0 ? -q : q;
  const float t = static_cast<float>(magnitude) * kInv127;
  return std::copysign(min_ps((t * t) * absmax, limit), static_cast<float>(q));
}

// The absmax a block is stored with: its max, or 0 (all codes 0) when the max is below FLT_MIN,
// where 1 / absmax would overflow and 0 * inf make NaN codes. Values that small are far below
// any eps that matters.
[[gnu::always_inline]] inline float q8_block_scale(float max) {
  return max >= FLT_MIN ? max : 0.0f;
}

// 8-bit codes round stochastically: a code position f (a real number of code steps) becomes
// floor(f + u) (one fma), u in [2^-11, 1 - 2^-11] from 16 of the element's rounding bits, so f
// rounds up with probability (frac(f) - 2^-11) / (1 - 2^-10). Rounding to nearest let the slow
// moving average v (beta2 = 0.999 changes it by 0.1 % a step, under half a code step) stall at its
// old codes: on a noisy quadratic the loss after 2000 steps was twice the fp32 run's; rounded
// stochastically it stays within 0.6 % (docs/adam.md). A position within 2^-11 of an integer
// always takes that integer, so a stored code re-encodes to itself, the block's largest element
// to the top code, and zero to 0, exactly. Both codes of element i draw on r(i, 1): exp_avg the
// low 16 bits, exp_avg_sq the high 16 (one hash per element).
inline constexpr float kCodeNoiseBase = 1.0f / 2048.0f;
inline constexpr float kCodeNoiseStep = static_cast<float>((1.0 - 1.0 / 1024.0) / 65535.0);

// The code at position limit * s with 16 random bits j: floor(fma(s, limit, u)), at most limit
// (NaN -> limit, as minps does). One fma, not a multiply and an add: GCC contracts a * b + c into
// an fma by default (also with -std=c++20) wherever the target has FMA, which would make the
// vector paths and the scalar path (no FMA target) round differently.
[[gnu::always_inline]] inline float q8_round(float s, std::uint32_t j, float limit) {
  const float u = std::fma(static_cast<float>(j), kCodeNoiseStep, kCodeNoiseBase);
  return min_ps(std::floor(std::fma(s, limit, u)), limit);
}

// The code of m in a block with inv = 1 / absmax: position 127 * sqrt(|m| * inv), negative when
// m < 0 (NaN codes as +127).
[[gnu::always_inline]] inline std::int8_t q8_encode_exp_avg(float m, float inv, std::uint32_t r) {
  const float s = std::sqrt(std::fabs(m) * inv);
  const int q = static_cast<int>(q8_round(s, r & 0xffffu, 127.0f));
  return static_cast<std::int8_t>(m < 0.0f ? -q : q);
}

// The code of v from sqrt_v = sqrt(v) (which the update computes anyway) with
// inv_sqrt = 1 / sqrt(absmax): position 255 * sqrt(sqrt_v * inv_sqrt), the fourth root of
// v / absmax with one more square root.
[[gnu::always_inline]] inline std::uint8_t q8_encode_exp_avg_sq(float sqrt_v, float inv_sqrt,
                                                                std::uint32_t r) {
  const float s = std::sqrt(sqrt_v * inv_sqrt);
  return static_cast<std::uint8_t>(static_cast<int>(q8_round(s, r >> 16, 255.0f)));
}

// One 8-bit block's first pass: the codes' scales going in, the new fp32 moments (block-relative
// buffers) and their running maxima coming out.
struct Q8Pass {
  float scale_m = 0;  // the exp_avg absmax the codes were stored with
  float scale_v = 0;
  float limit = 0;              // q8_m_limit() of the block
  float* new_m = nullptr;       // [block] the new exp_avg
  float* new_sqrt_v = nullptr;  // [block] sqrt of the new exp_avg_sq
  std::size_t base = 0;         // the tile index of the block's first element
  float max_m = 0;              // max |new m| so far (NaN ignored)
  float max_v = 0;              // max new v so far (NaN ignored)
};

// The tile's arrays as locals (stores through them cannot be taken to modify the pointers).
struct StatePointers {
  void* master;
  void* exp_avg;
  void* exp_avg_sq;
  const void* grad;
  void* copy;
  float* absmax_m;
  float* absmax_v;
};

inline StatePointers state_pointers(const AdamTile& t) {
  return {t.master,   t.exp_avg,        t.exp_avg_sq,       t.grad,
          t.copy_out, t.exp_avg_absmax, t.exp_avg_sq_absmax};
}

// Whether the copy-out from element `begin` on is aligned for streaming stores of `lanes`
// elements. Ranges start at 0 or a multiple of kAdamBlockElems, and 8-bit blocks at multiples of
// 64 elements, so the answer holds for every vector of a range (the vector paths use plain stores
// otherwise: no scalar peel, which would split short 8-bit blocks).
inline bool copy_aligned(const AdamTile& t, std::size_t begin, std::size_t lanes) {
  if (t.copy_out == nullptr) return false;
  const std::size_t bytes = dtype_bytes(t.copy_dtype);
  return (reinterpret_cast<std::uintptr_t>(t.copy_out) + begin * bytes) % (lanes * bytes) == 0;
}

// Element i of the copy-out: `stored` is the master as stored, widened to fp32.
[[gnu::always_inline]] inline void store_copy(void* copy, CopyKind kind, std::size_t i,
                                              float stored) {
  switch (kind) {
    case CopyKind::kNone:
      return;
    case CopyKind::kBF16:
      static_cast<std::uint16_t*>(copy)[i] = float_to_bf16(stored);
      return;
    case CopyKind::kF16:
      static_cast<std::uint16_t*>(copy)[i] = float_to_fp16(stored);
      return;
    case CopyKind::kF32:
      static_cast<float*>(copy)[i] = stored;
      return;
  }
}

// Decode, update and (except 8-bit moments, which go to q8's buffers) encode element i.
template <DType kMaster, MomentFormat kMoments, bool kL2>
[[gnu::always_inline]] inline void state_element(const AdamConstants& c, const StatePointers& s,
                                                 const RoundingKeys& keys, float grad,
                                                 CopyKind copy, std::size_t i, Q8Pass* q8) {
  float w = 0;
  if constexpr (kMaster == DType::kF32) {
    w = static_cast<const float*>(s.master)[i];
  } else {
    w = bf16_to_float(static_cast<const std::uint16_t*>(s.master)[i]);
  }
  float m = 0;
  float v = 0;
  if constexpr (kMoments == MomentFormat::kF32) {
    m = static_cast<const float*>(s.exp_avg)[i];
    v = static_cast<const float*>(s.exp_avg_sq)[i];
  } else if constexpr (kMoments == MomentFormat::kBF16) {
    m = bf16_to_float(static_cast<const std::uint16_t*>(s.exp_avg)[i]);
    v = bf16_to_float(static_cast<const std::uint16_t*>(s.exp_avg_sq)[i]);
  } else {
    const std::uint8_t code_v = static_cast<const std::uint8_t*>(s.exp_avg_sq)[i];
    const float t2 = q8_t2(code_v);
    v = (t2 * t2) * q8->scale_v;
    m = q8_decode_exp_avg_bounded(static_cast<const std::int8_t*>(s.exp_avg)[i], q8->scale_m,
                                  t2 * q8->limit);
  }
  adam_update<kL2>(c, grad, w, m, v);
  if constexpr (kMaster == DType::kF32) {
    static_cast<float*>(s.master)[i] = w;
  } else {
    const std::uint16_t bits = sr_bf16(w, rounding_bits(keys.master, i));
    static_cast<std::uint16_t*>(s.master)[i] = bits;
    w = bf16_to_float(bits);
  }
  store_copy(s.copy, copy, i, w);
  if constexpr (kMoments == MomentFormat::kF32) {
    static_cast<float*>(s.exp_avg)[i] = m;
    static_cast<float*>(s.exp_avg_sq)[i] = v;
  } else if constexpr (kMoments == MomentFormat::kBF16) {
    static_cast<std::uint16_t*>(s.exp_avg)[i] = sr_bf16(m, rounding_bits(keys.exp_avg, i));
    static_cast<std::uint16_t*>(s.exp_avg_sq)[i] = sr_bf16(v, rounding_bits(keys.exp_avg_sq, i));
  } else {
    q8->new_m[i - q8->base] = m;
    q8->new_sqrt_v[i - q8->base] = std::sqrt(v);  // the same bits as the update's sqrt(v)
    q8->max_m = max_ps(std::fabs(m), q8->max_m);
    q8->max_v = max_ps(v, q8->max_v);
  }
}

// The scales a block's second pass encodes with; the absmax arrays get `scale`.
struct Q8Scales {
  float scale_m;
  float scale_v;
  float inv_m;       // 1 / scale_m, or 0 for a zero block
  float inv_sqrt_v;  // 1 / sqrt(scale_v), or 0 for a zero block
  explicit Q8Scales(const Q8Pass& pass)
      : scale_m(q8_block_scale(pass.max_m)),
        scale_v(q8_block_scale(pass.max_v)),
        inv_m(scale_m != 0.0f ? 1.0f / scale_m : 0.0f),
        inv_sqrt_v(scale_v != 0.0f ? 1.0f / std::sqrt(scale_v) : 0.0f) {}
};

// The two buffer pairs (new exp_avg, sqrt of the new exp_avg_sq) of the vector paths' pipelined
// 8-bit passes. The first pass of one block stores at the same block offsets the second pass of
// the previous block loads from, in the other pair; buffers a multiple of 4 KiB apart would let
// those loads be taken for dependent on the stores (4K aliasing). Each buffer therefore starts
// 1088 bytes further from a 4 KiB boundary. (No difference was measurable on the development
// machine, where the step is bound by the divider and the vector ports; it costs nothing.)
struct Q8Buffers {
  static constexpr std::size_t kSkewFloats = 272;
  static constexpr std::size_t kStride = kQ8BlockMaxElems + kSkewFloats;
  alignas(64) float data[4 * kStride];
  float* get(int pair, int which) { return data + (2 * pair + which) * kStride; }
};

// The first pass over the block starting at tile index base, with the block's stored scales.
inline Q8Pass q8_begin_block(const AdamConstants& c, const StatePointers& s, std::size_t block,
                             std::size_t base, float* new_m, float* new_sqrt_v) {
  Q8Pass pass;
  pass.scale_m = s.absmax_m[base / block];
  pass.scale_v = s.absmax_v[base / block];
  pass.limit = q8_m_limit(c.m_bound, pass.scale_v);
  pass.new_m = new_m;
  pass.new_sqrt_v = new_sqrt_v;
  pass.base = base;
  return pass;
}

// Writes a block's new scales, after its codes (the first pass read the old ones).
inline void q8_store_scales(const Q8Pass& pass, const Q8Scales& scales, const StatePointers& s,
                            std::size_t block) {
  s.absmax_m[pass.base / block] = scales.scale_m;
  s.absmax_v[pass.base / block] = scales.scale_v;
}

// Codes of block-relative elements [from, to) of a block (scalar; a zero block's are all 0).
inline void q8_encode_range(const Q8Pass& pass, const Q8Scales& scales, const StatePointers& s,
                            const RoundingKeys& keys, std::size_t from, std::size_t to) {
  auto* codes_m = static_cast<std::int8_t*>(s.exp_avg) + pass.base;
  auto* codes_v = static_cast<std::uint8_t*>(s.exp_avg_sq) + pass.base;
  for (std::size_t k = from; k < to; ++k) {
    const std::uint32_t r = rounding_bits(keys.exp_avg, pass.base + k);
    codes_m[k] = scales.scale_m != 0.0f ? q8_encode_exp_avg(pass.new_m[k], scales.inv_m, r) : 0;
    codes_v[k] =
        scales.scale_v != 0.0f ? q8_encode_exp_avg_sq(pass.new_sqrt_v[k], scales.inv_sqrt_v, r) : 0;
  }
}

// Calls Path::range<kMaster, kMoments, kGrad, kL2>(c, t, begin, end) for the tile's formats
// (every combination but all-fp32, which AdamPath::adam runs). Path::range carries the target
// attribute of its SIMD path; these dispatchers do not, and are not inlined into it.
template <typename Path, DType kMaster, MomentFormat kMoments, bool kL2>
void dispatch_state_grad(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                         std::size_t end) {
  switch (t.grad_dtype) {
    case DType::kF32:
      return Path::template range<kMaster, kMoments, DType::kF32, kL2>(c, t, begin, end);
    case DType::kBF16:
      return Path::template range<kMaster, kMoments, DType::kBF16, kL2>(c, t, begin, end);
    case DType::kF16:
      return Path::template range<kMaster, kMoments, DType::kF16, kL2>(c, t, begin, end);
  }
}

template <typename Path, DType kMaster, MomentFormat kMoments>
void dispatch_state_l2(const AdamConstants& c, const AdamTile& t, std::size_t begin,
                       std::size_t end) {
  if (c.l2 != 0.0f) {
    dispatch_state_grad<Path, kMaster, kMoments, true>(c, t, begin, end);
  } else {
    dispatch_state_grad<Path, kMaster, kMoments, false>(c, t, begin, end);
  }
}

template <typename Path>
void dispatch_state(const AdamConstants& c, const AdamTile& t, std::size_t begin, std::size_t end) {
  MxcsrGuard guard;
  if (t.master_dtype == DType::kF32) {
    switch (t.moments) {
      case MomentFormat::kF32:
        STRATA_ASSERT_MSG(false, "all-fp32 tiles run AdamPath::adam");
        return;
      case MomentFormat::kBF16:
        return dispatch_state_l2<Path, DType::kF32, MomentFormat::kBF16>(c, t, begin, end);
      case MomentFormat::kQ8:
        return dispatch_state_l2<Path, DType::kF32, MomentFormat::kQ8>(c, t, begin, end);
    }
  } else {
    switch (t.moments) {
      case MomentFormat::kF32:
        return dispatch_state_l2<Path, DType::kBF16, MomentFormat::kF32>(c, t, begin, end);
      case MomentFormat::kBF16:
        return dispatch_state_l2<Path, DType::kBF16, MomentFormat::kBF16>(c, t, begin, end);
      case MomentFormat::kQ8:
        return dispatch_state_l2<Path, DType::kBF16, MomentFormat::kQ8>(c, t, begin, end);
    }
  }
}

}  // namespace strata::kernels::detail
