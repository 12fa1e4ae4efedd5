// Test support for the tensor-core flash attention (kernels/cuda/flash_attention_kernels.cuh,
// flash_attention_backward_kernels.cuh), shared by its emulator tests
// (flash_attention_emulated_test.cc, flash_attention_backward_emulated_test.cc) and its GPU test
// (flash_attention_gputest.cc, which compiles without CUDA too, so nothing here needs it): the
// cases and their names, 16-bit conversions, the padded q | k | v layout, packed documents, seeded
// inputs, and the forward's error bounds (derived in flash_attention_emulated_test.cc's header).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cpu/float16.h"
#include "kernels/cpu/nn_ops.h"

namespace strata::kernels::testing {

// One attention shape to test.
struct FlashCase {
  bool bf16;
  std::int64_t batch, seq_len, heads, kv_heads, head_dim;
  std::int64_t window;  // 0 = none
  bool packed;          // documents of lengths 50, 3, 77, ... packed in each row
};

inline std::string case_name(const FlashCase& c) {
  std::string n = std::string(c.bf16 ? "Bf16" : "Fp16") + "D" + std::to_string(c.head_dim) + "T" +
                  std::to_string(c.seq_len) + "H" + std::to_string(c.heads) + "KV" +
                  std::to_string(c.kv_heads) + "B" + std::to_string(c.batch);
  if (c.window > 0) n += "Window" + std::to_string(c.window);
  if (c.packed) n += "Packed";
  return n;
}

// gtest's name for a parameter (found by argument-dependent lookup).
inline void PrintTo(const FlashCase& c, std::ostream* os) {
  *os << case_name(c);
}

// `v` rounded to bf16 (else fp16) through fp32, and back widened exactly.
inline std::uint16_t to_bits(double v, bool bf16) {
  const auto f = static_cast<float>(v);
  return bf16 ? float_to_bf16(f) : float_to_fp16(f);
}
inline double from_bits(std::uint16_t h, bool bf16) {
  return bf16 ? bf16_to_float(h) : fp16_to_float(h);
}

// q, k, v side by side in one buffer with a padded row (a multiple of 8 elements, as cp.async's
// 16-byte copies need); out (and dout) padded too. No positions.
inline AttentionShape shape_of(const FlashCase& c) {
  AttentionShape s;
  s.batch = c.batch;
  s.seq_len = c.seq_len;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.q_stride = s.kv_stride = (c.heads + 2 * c.kv_heads) * c.head_dim + 8;
  s.out_stride = c.heads * c.head_dim + 8;
  s.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  s.window = c.window;
  return s;
}

// Each token's position in its document, batch * seq_len of them: with `c.packed`, documents of
// lengths 50, 3, 77, 50, ... one after another in each row; zeros otherwise (unused then).
inline std::vector<std::int32_t> packed_positions(const FlashCase& c) {
  std::vector<std::int32_t> positions(static_cast<std::size_t>(c.batch * c.seq_len));
  if (!c.packed) return positions;
  const std::int64_t lengths[] = {50, 3, 77};
  for (std::int64_t b = 0; b < c.batch; ++b) {
    std::int64_t doc = 0, pos = 0;
    for (std::int64_t t = 0; t < c.seq_len; ++t) {
      if (pos == lengths[doc % 3]) {
        ++doc;
        pos = 0;
      }
      positions[static_cast<std::size_t>(b * c.seq_len + t)] = static_cast<std::int32_t>(pos++);
    }
  }
  return positions;
}

// One row of q | k | v (heads * head_dim columns, then kv_heads * head_dim twice): Q in [-4, 4)
// (peaked softmax rows, so the running max moves), K and V in [-1, 1), `unit()` drawing from
// [-1, 1) once per element in column order; rounded to the 16-bit type in `bits`, the same values
// widened in `wide`. Returns the row's largest |V|.
template <typename Unit>
double random_qkv_row(const FlashCase& c, std::uint16_t* bits, double* wide, Unit&& unit) {
  const std::int64_t hd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  double v_max = 0.0;
  for (std::int64_t j = 0; j < hd + 2 * kvd; ++j) {
    bits[j] =
        to_bits(j < hd ? 4.0 * static_cast<double>(unit()) : static_cast<double>(unit()), c.bf16);
    wide[j] = from_bits(bits[j], c.bf16);
    if (j >= hd + kvd) v_max = std::max(v_max, std::abs(wide[j]));
  }
  return v_max;
}

// The inputs of a forward test: every row of the layout of shape_of(c) (padding zero).
struct QkvInputs {
  std::vector<std::uint16_t> bits;
  std::vector<double> wide;
  double v_max = 0.0;  // the largest |V|
};

template <typename Unit>
QkvInputs random_qkv(const FlashCase& c, const AttentionShape& s, Unit&& unit) {
  const std::int64_t rows = c.batch * c.seq_len;
  QkvInputs in;
  in.bits.assign(static_cast<std::size_t>(rows * s.q_stride), 0);
  in.wide.assign(in.bits.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto at = static_cast<std::size_t>(r * s.q_stride);
    in.v_max = std::max(in.v_max, random_qkv_row(c, &in.bits[at], &in.wide[at], unit));
  }
  return in;
}

// The forward's error bounds (flash_attention_emulated_test.cc's header; u = 2^-8 for bf16,
// 2^-11 for fp16):
//   out: |O - ref| <= (2u + 2 ds + slack) * max|V|;
//   lse: |lse - ref| <= ds + (T + 16) 2^-24 (1 + |ref|);
//   ds = (D + 2) 2^-24 * scale * max over (query, key) of sum_d |q_d k_d|.
// slack = 2^-16 covers the fp32 sums of at most 130 terms and, for fp16, P values below the normal
// range (2^-25 each); for longer rows it is (T + 16) 2^-24 + T 2^-25 by the same reasoning (equal
// to 2^-16 near T = 130, 1.5 * 2^-14 at T = 1024).
struct ForwardBounds {
  double ds = 0.0;   // the fp32 error of one scaled score
  double out = 0.0;  // every out element's
  double seq_len = 0.0;
  double lse(double ref) const {
    return ds + (seq_len + 16.0) * std::ldexp(1.0, -24) * (1.0 + std::abs(ref));
  }
};

// The bounds for case `c` on the widened q | k | v of `shape` (the layout of shape_of(c));
// ds's maximum runs over the keys each query sees (attention_first_key), or with
// `all_earlier_keys` over every key up to the query's.
inline ForwardBounds forward_bounds(const FlashCase& c, const AttentionShape& shape,
                                    const double* qkv_wide, double v_max,
                                    bool all_earlier_keys = false) {
  const std::int64_t hd = c.heads * c.head_dim, group = c.heads / c.kv_heads;
  double dot_max = 0.0;
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t t = 0; t < c.seq_len; ++t) {
        const double* qrow = qkv_wide + (b * c.seq_len + t) * shape.q_stride + h * c.head_dim;
        const std::int64_t first = all_earlier_keys ? 0 : attention_first_key(shape, b, t);
        for (std::int64_t key = first; key <= t; ++key) {
          const double* krow =
              qkv_wide + (b * c.seq_len + key) * shape.kv_stride + hd + (h / group) * c.head_dim;
          double sum = 0.0;
          for (std::int64_t d = 0; d < c.head_dim; ++d)
            sum += std::abs(qrow[d] * krow[d]);
          dot_max = std::max(dot_max, sum);
        }
      }
  ForwardBounds bounds;
  bounds.seq_len = static_cast<double>(c.seq_len);
  bounds.ds = static_cast<double>(c.head_dim + 2) * std::ldexp(1.0, -24) * shape.scale * dot_max;
  const double u = std::ldexp(1.0, c.bf16 ? -8 : -11);
  const double T = bounds.seq_len;
  const double slack =
      std::max(std::ldexp(1.0, -16), (T + 16.0) * std::ldexp(1.0, -24) + T * std::ldexp(1.0, -25));
  bounds.out = (2.0 * u + 2.0 * bounds.ds + slack) * v_max;
  return bounds;
}

}  // namespace strata::kernels::testing
