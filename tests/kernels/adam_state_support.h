// Test support for compressed optimizer state in the CPU Adam kernels: a tile in any state format
// (master fp32/bf16, moments fp32/bf16/8-bit) with seeded, valid contents at a chosen misalignment,
// and its bytes for bit-for-bit comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/adam_support.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/adam_reference.h"
#include "kernels/cpu/float16.h"

namespace strata::kernels::testing {

struct StateFormat {
  DType master = DType::kF32;
  MomentFormat moments = MomentFormat::kF32;
  std::size_t block = 2048;  // kQ8 only
};

inline std::string to_string(const StateFormat& f) {
  std::string s = std::string("master_") + kernels::to_string(f.master) + "_moments_" +
                  kernels::to_string(f.moments);
  if (f.moments == MomentFormat::kQ8) s += "_block" + std::to_string(f.block);
  return s;
}

// The copy-out of a test case: none, or bf16 / fp16 / fp32.
struct CopyChoice {
  bool with_copy = false;
  DType dtype = DType::kBF16;
};

inline std::string to_string(const CopyChoice& c) {
  return c.with_copy ? kernels::to_string(c.dtype) : "none";
}

// One tile's arrays in a state format. The same (n, format, grad, copy, offset, seed) always
// makes the same contents, so two instances are an input and its twin.
class StateTile {
 public:
  // Random weights over three decades, gradients over four (stored times loss_scale), moments of
  // a matching size; every 5th 8-bit block (and, for the other formats, a run of elements) is
  // zero, and one block gets gradients below FLT_MIN, so zero and flushed blocks are exercised.
  // `offset` shifts every array by that many elements from a 64-byte boundary.
  StateTile(std::size_t n, StateFormat format, DType grad_dtype, CopyChoice copy_choice,
            std::size_t offset, std::uint32_t seed, float loss_scale = 1.0f)
      : n_(n),
        format_(format),
        grad_dtype_(grad_dtype),
        copy_(copy_choice),
        offset_(offset),
        master_((n + offset) * 4),
        exp_avg_((n + offset) * 4),
        exp_avg_sq_((n + offset) * 4),
        absmax_m_(blocks() * 4 + 4),
        absmax_v_(blocks() * 4 + 4),
        grad_((n + offset) * 4),
        copy_buf_((n + offset) * 4) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    std::vector<float> m(n), v(n);
    const std::size_t zero_from = n / 3, zero_to = n / 3 + std::min<std::size_t>(n / 5, 300);
    const std::size_t block = format.moments == MomentFormat::kQ8 ? format.block : 512;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t b = i / block;
      const bool zero =
          format.moments == MomentFormat::kQ8 ? b % 5 == 4 : (i >= zero_from && i < zero_to);
      float w = normal(rng) * std::pow(10.0f, uniform(rng) * 3.0f - 2.0f);
      if (i % 11 == 3) w = normal(rng) * 1e-4f;
      float g = normal(rng) * std::pow(10.0f, uniform(rng) * 4.0f - 5.0f);
      if (i % 37 == 5) g = 0.0f;
      m[i] = normal(rng) * 1e-3f;
      const float sd = normal(rng) * 1e-3f;
      v[i] = sd * sd;
      if (b % 7 == 2) {  // new moments below FLT_MIN: a block stored as zeros
        g = normal(rng) * 1e-41f;
        m[i] = 0.0f;
        v[i] = 0.0f;
      }
      if (zero) {
        g = 0.0f;
        m[i] = 0.0f;
        v[i] = 0.0f;
      }
      set_master(i, w);
      set_grad(i, g * loss_scale);
    }
    store_moments(m, v);
    if (copy_.with_copy) std::memset(copy(), 0xab, n * dtype_bytes(copy_.dtype));
  }

  AdamTile tile() {
    AdamTile t;
    t.master = master();
    t.master_dtype = format_.master;
    t.exp_avg = exp_avg_.data() + offset_ * moment_bytes(format_.moments);
    t.exp_avg_sq = exp_avg_sq_.data() + offset_ * moment_bytes(format_.moments);
    t.moments = format_.moments;
    if (format_.moments == MomentFormat::kQ8) {
      t.exp_avg_absmax = reinterpret_cast<float*>(absmax_m_.data());
      t.exp_avg_sq_absmax = reinterpret_cast<float*>(absmax_v_.data());
      t.block = format_.block;
    }
    t.rounding_key = 0x5eed0000u + static_cast<std::uint32_t>(n_);
    t.grad = grad();
    t.grad_dtype = grad_dtype_;
    t.copy_out = copy();
    t.copy_dtype = copy_.dtype;
    t.n = n_;
    return t;
  }

  // Every byte the step may write: master, moments, absmax, copy-out.
  std::vector<std::byte> bytes() {
    const AdamTile t = tile();
    std::vector<std::byte> out;
    auto append = [&](const void* p, std::size_t size) {
      const auto* b = static_cast<const std::byte*>(p);
      out.insert(out.end(), b, b + size);
    };
    append(t.master, n_ * dtype_bytes(format_.master));
    append(t.exp_avg, n_ * moment_bytes(format_.moments));
    append(t.exp_avg_sq, n_ * moment_bytes(format_.moments));
    if (format_.moments == MomentFormat::kQ8) {
      append(t.exp_avg_absmax, blocks() * 4);
      append(t.exp_avg_sq_absmax, blocks() * 4);
    }
    if (copy_.with_copy) append(t.copy_out, n_ * dtype_bytes(copy_.dtype));
    return out;
  }

  void set_grad(std::size_t i, float value) {
    if (grad_dtype_ == DType::kF32) {
      static_cast<float*>(grad())[i] = value;
    } else {
      static_cast<std::uint16_t*>(grad())[i] = encode(value, grad_dtype_);
    }
  }

  // Master element i widened to fp32.
  float master_at(std::size_t i) {
    return format_.master == DType::kF32 ? static_cast<float*>(master())[i]
                                         : bf16_to_float(static_cast<std::uint16_t*>(master())[i]);
  }

  std::size_t n() const { return n_; }
  std::size_t blocks() const {
    return format_.moments == MomentFormat::kQ8 ? n_ / format_.block : 0;
  }

 private:
  void* master() { return master_.data() + offset_ * dtype_bytes(format_.master); }
  void* grad() { return grad_.data() + offset_ * dtype_bytes(grad_dtype_); }
  void* copy() {
    return copy_.with_copy ? copy_buf_.data() + offset_ * dtype_bytes(copy_.dtype) : nullptr;
  }

  void set_master(std::size_t i, float w) {
    if (format_.master == DType::kF32) {
      static_cast<float*>(master())[i] = w;
    } else {
      static_cast<std::uint16_t*>(master())[i] = float_to_bf16(w);
    }
  }

  void store_moments(const std::vector<float>& m, const std::vector<float>& v) {
    AdamTile t = tile();
    for (std::size_t i = 0; i < n_; ++i) {
      if (format_.moments == MomentFormat::kF32) {
        static_cast<float*>(t.exp_avg)[i] = m[i];
        static_cast<float*>(t.exp_avg_sq)[i] = v[i];
      } else if (format_.moments == MomentFormat::kBF16) {
        static_cast<std::uint16_t*>(t.exp_avg)[i] = float_to_bf16(m[i]);
        static_cast<std::uint16_t*>(t.exp_avg_sq)[i] = float_to_bf16(v[i]);
      }
    }
    if (format_.moments != MomentFormat::kQ8) return;
    for (std::size_t b = 0; b < n_; b += format_.block) {
      t.exp_avg_absmax[b / format_.block] = q8_encode_exp_avg_block(
          m.data() + b, format_.block, static_cast<std::int8_t*>(t.exp_avg) + b, 0, b);
      t.exp_avg_sq_absmax[b / format_.block] = q8_encode_exp_avg_sq_block(
          v.data() + b, format_.block, static_cast<std::uint8_t*>(t.exp_avg_sq) + b, 0, b);
    }
  }

  std::size_t n_;
  StateFormat format_;
  DType grad_dtype_;
  CopyChoice copy_;
  std::size_t offset_;
  AlignedBytes master_, exp_avg_, exp_avg_sq_, absmax_m_, absmax_v_, grad_, copy_buf_;
};

// Expects equal bytes; on a difference names the first differing byte.
inline void expect_same_bytes(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
                              const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t k = 0; k < got.size(); ++k) {
    if (got[k] != want[k]) {
      ADD_FAILURE() << what << ": byte " << k << " of " << got.size() << " differs ("
                    << static_cast<int>(got[k]) << " vs " << static_cast<int>(want[k]) << ")";
      return;
    }
  }
}

}  // namespace strata::kernels::testing
