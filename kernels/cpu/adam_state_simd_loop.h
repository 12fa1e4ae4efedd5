// The loops of the SIMD paths of the CPU Adam kernels for compressed state (bf16 master, bf16 or
// 8-bit moments; adam_state.h), written once for any vector width: a traits type V (Avx2 in
// adam_avx2_vec.h, Avx512 in adam_avx512_vec.h) gives the vector types and the operations in its
// intrinsics, this header the decode-update-encode sequence and the block loops around them.
// Each width's .cc defines STRATA_SIMD_TARGET as its target attribute before including it.
//
// Elements are decoded, updated and encoded in registers with the same IEEE operations, in the
// same order, as the scalar state_element(), so the bits are the scalar path's. 8-bit moments run
// block by block in two passes: the first updates the block and keeps its new fp32 moments in two
// on-stack buffers (8 KiB each at most, so they stay in L1) while tracking their maxima; the
// second encodes them against the block's new absmax.
#pragma once

#ifndef STRATA_SIMD_TARGET
#error "define STRATA_SIMD_TARGET (the vector width's target attribute) before including this"
#endif

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam_internal.h"
#include "kernels/cpu/adam_state.h"

namespace strata::kernels::detail::simd {

// What one range keeps in registers.
template <typename V>
struct StateRange {
  typename V::Constants k;
  typename V::I lane_mul;  // lane * kIndexMul
  RoundingKeys keys;
  CopyKind copy;
  bool stream;  // the copy-out is aligned for streaming stores
};

// One 8-bit block's first pass in registers: the stored scales, the new moments' maxima.
template <typename V>
struct Q8VectorPass {
  typename V::F scale_m, scale_v;
  typename V::F max_m, max_v;
  typename V::F limit;  // q8_m_limit() of the block
};

// rounding_bits(stream_key, i + lane) for the V::kLanes lanes.
template <typename V>
STRATA_SIMD_TARGET inline typename V::I rounding_bits(std::uint32_t stream_key, std::size_t i,
                                                      typename V::I lane_mul) {
  const std::uint32_t base = static_cast<std::uint32_t>(i) * kIndexMul + stream_key;
  return V::lowbias32(V::hash_input(base, lane_mul));
}

// The copy-out of V::kLanes new weights (`stored`: the master as stored, widened); streaming
// stores when the copy is aligned for them (it is not read back here).
template <typename V>
STRATA_SIMD_TARGET inline void store_copy_vector(void* copy, CopyKind kind, bool stream,
                                                 std::size_t i, typename V::F stored) {
  if (kind == CopyKind::kNone) return;
  if (kind == CopyKind::kF32) {
    V::store_floats(static_cast<float*>(copy) + i, stored, stream);
    return;
  }
  V::store_halves(static_cast<std::uint16_t*>(copy) + i,
                  kind == CopyKind::kBF16 ? V::to_bf16(stored) : V::to_f16(stored), stream);
}

// Elements [i, i + V::kLanes): decode, update, and encode all but 8-bit moments, which go to the
// block buffers of `pass` (block-relative index i - pass.base).
template <typename V, DType kMaster, MomentFormat kMoments, DType kGrad, bool kL2>
STRATA_SIMD_TARGET inline void state_vector(const StateRange<V>& r, const StatePointers& s,
                                            std::size_t i, Q8Pass* pass, Q8VectorPass<V>* q8) {
  using F = typename V::F;
  const typename V::Constants& k = r.k;
  F g = V::mul(V::template load_grad<kGrad>(s.grad, i), k.grad_scale);
  F w;
  if constexpr (kMaster == DType::kF32) {
    w = V::loadu(static_cast<const float*>(s.master) + i);
  } else {
    w = V::load_bf16(s.master, i);
  }
  F m;
  F v;
  if constexpr (kMoments == MomentFormat::kF32) {
    m = V::loadu(static_cast<const float*>(s.exp_avg) + i);
    v = V::loadu(static_cast<const float*>(s.exp_avg_sq) + i);
  } else if constexpr (kMoments == MomentFormat::kBF16) {
    m = V::load_bf16(s.exp_avg, i);
    v = V::load_bf16(s.exp_avg_sq, i);
  } else {
    F t2;
    v = V::q8_decode_v(static_cast<const std::uint8_t*>(s.exp_avg_sq) + i, q8->scale_v, &t2);
    m = V::q8_decode_m(static_cast<const std::int8_t*>(s.exp_avg) + i, q8->scale_m,
                       V::mul(t2, q8->limit));
  }
  // adam_update(), operation for operation.
  if constexpr (kL2) g = V::fmadd(k.l2, w, g);
  m = V::fmadd(k.beta1, m, V::mul(k.one_minus_beta1, g));
  v = V::fmadd(k.beta2, v, V::mul(V::mul(k.one_minus_beta2, g), g));
  const F sqrt_v = V::sqrt(v);
  const F denom = V::fmadd(sqrt_v, k.inv_sqrt_bc2, k.eps);
  w = V::mul(w, k.decay);
  w = V::fmadd(k.neg_step_size, V::div(m, denom), w);

  if constexpr (kMaster == DType::kF32) {
    V::storeu(static_cast<float*>(s.master) + i, w);
  } else {
    const typename V::H h = V::sr_bf16(w, rounding_bits<V>(r.keys.master, i, r.lane_mul));
    V::store_bf16(s.master, i, h);
    w = V::widen_bf16(h);
  }
  store_copy_vector<V>(s.copy, r.copy, r.stream, i, w);
  if constexpr (kMoments == MomentFormat::kF32) {
    V::storeu(static_cast<float*>(s.exp_avg) + i, m);
    V::storeu(static_cast<float*>(s.exp_avg_sq) + i, v);
  } else if constexpr (kMoments == MomentFormat::kBF16) {
    V::store_bf16(s.exp_avg, i, V::sr_bf16(m, rounding_bits<V>(r.keys.exp_avg, i, r.lane_mul)));
    V::store_bf16(s.exp_avg_sq, i,
                  V::sr_bf16(v, rounding_bits<V>(r.keys.exp_avg_sq, i, r.lane_mul)));
  } else {
    V::store(pass->new_m + (i - pass->base), m);
    V::store(pass->new_sqrt_v + (i - pass->base), sqrt_v);
    // maxps(x, acc): acc where x is NaN, as max_ps() in the scalar pass.
    q8->max_m = V::max(V::abs(m), q8->max_m);
    q8->max_v = V::max(v, q8->max_v);
  }
}

// A block's second pass: its buffers, where its codes go, the scales they are encoded with, and
// the hash input of the next V::kLanes elements (tile index times kIndexMul plus the key, per
// lane).
template <typename V>
struct Q8Encoder {
  // Elements one encode() codes: four vectors.
  static constexpr std::size_t kElems = 4 * V::kLanes;

  const float* new_m;
  const float* new_sqrt_v;
  std::int8_t* codes_m;
  std::uint8_t* codes_v;
  typename V::F inv_m, inv_sqrt_v;
  typename V::I hash_in;
  bool zero_m, zero_v;  // stored as zeros

  STRATA_SIMD_TARGET Q8Encoder(const StateRange<V>& r, const Q8Pass& pass, const Q8Scales& scales,
                               const StatePointers& s)
      : new_m(pass.new_m),
        new_sqrt_v(pass.new_sqrt_v),
        codes_m(static_cast<std::int8_t*>(s.exp_avg) + pass.base),
        codes_v(static_cast<std::uint8_t*>(s.exp_avg_sq) + pass.base),
        inv_m(V::set1(scales.inv_m)),
        inv_sqrt_v(V::set1(scales.inv_sqrt_v)),
        hash_in(V::hash_input(static_cast<std::uint32_t>(pass.base) * kIndexMul + r.keys.exp_avg,
                              r.lane_mul)),
        zero_m(scales.scale_m == 0.0f),
        zero_v(scales.scale_v == 0.0f) {}

  // The codes of block elements [k, k + kElems) (blocks are multiples of 64, so of kElems).
  STRATA_SIMD_TARGET void encode(std::size_t k) {
    typename V::I qm[4];
    typename V::I qv[4];
    for (std::size_t j = 0; j < 4; ++j) {
      const typename V::I bits = V::lowbias32(hash_in);
      hash_in = V::add(hash_in, static_cast<std::uint32_t>(V::kLanes * kIndexMul));
      qm[j] = V::q8_code_m(V::load(new_m + k + V::kLanes * j), inv_m, bits);
      qv[j] = V::q8_code_v(V::load(new_sqrt_v + k + V::kLanes * j), inv_sqrt_v, bits);
    }
    V::template store_codes<true>(codes_m + k, qm, zero_m);
    V::template store_codes<false>(codes_v + k, qv, zero_v);
  }
};

// The Path of dispatch_state() (adam_state.h) for vector width V.
template <typename V>
struct StatePath {
  template <DType kMaster, MomentFormat kMoments, DType kGrad, bool kL2>
  STRATA_SIMD_TARGET static void range(const AdamConstants& constants, const AdamTile& t,
                                       std::size_t begin, std::size_t end) {
    constexpr std::size_t kLanes = V::kLanes;
    const AdamConstants c = constants;
    const StatePointers s = state_pointers(t);
    const StateRange<V> r{typename V::Constants(c), V::lane_mul(),
                          RoundingKeys(t.rounding_key, t.rounding_offset), copy_kind(t),
                          copy_aligned(t, begin, kLanes)};
    if constexpr (kMoments != MomentFormat::kQ8) {
      std::size_t i = begin;
      for (; i + kLanes <= end; i += kLanes)
        state_vector<V, kMaster, kMoments, kGrad, kL2>(r, s, i, nullptr, nullptr);
      for (; i < end; ++i) {
        state_element<kMaster, kMoments, kL2>(c, s, r.keys, load_grad(s.grad, kGrad, i), r.copy, i,
                                              nullptr);
      }
    } else {
      // Software-pipelined over blocks: the first pass of block b + 1 runs vector by vector
      // beside the second pass of block b, so the divider-bound update and the port-bound encode
      // overlap and the memory streams never pause for an encode-only phase. Two buffer pairs.
      constexpr std::size_t kEncode = Q8Encoder<V>::kElems;
      const std::size_t block = t.block;
      Q8Buffers buffers;
      Q8Pass done;  // the block whose first pass finished and whose codes are pending
      bool pending = false;
      int parity = 0;
      for (std::size_t b = begin; b < end; b += block, parity ^= 1) {
        Q8Pass pass =
            q8_begin_block(c, s, block, b, buffers.get(parity, 0), buffers.get(parity, 1));
        Q8VectorPass<V> q8{V::set1(pass.scale_m), V::set1(pass.scale_v), V::zero(), V::zero(),
                           V::set1(pass.limit)};
        if (pending) {
          const Q8Scales scales(done);
          Q8Encoder<V> e(r, done, scales, s);
          for (std::size_t k = 0; k < block; k += kEncode) {
            for (std::size_t j = k; j < k + kEncode; j += kLanes)
              state_vector<V, kMaster, kMoments, kGrad, kL2>(r, s, b + j, &pass, &q8);
            e.encode(k);
          }
          q8_store_scales(done, scales, s, block);
        } else {
          for (std::size_t k = 0; k < block; k += kLanes)
            state_vector<V, kMaster, kMoments, kGrad, kL2>(r, s, b + k, &pass, &q8);
        }
        pass.max_m = V::reduce_max(q8.max_m);
        pass.max_v = V::reduce_max(q8.max_v);
        done = pass;
        pending = true;
      }
      if (pending) {
        const Q8Scales scales(done);
        Q8Encoder<V> e(r, done, scales, s);
        for (std::size_t k = 0; k < block; k += kEncode)
          e.encode(k);
        q8_store_scales(done, scales, s, block);
      }
    }
    if (r.copy != CopyKind::kNone && r.stream) _mm_sfence();
  }
};

}  // namespace strata::kernels::detail::simd
