// Test support for the CPU Adam kernels: seeded tile data at chosen misalignments, running a
// kernel on a copy, and the element-wise comparison against the double-precision reference with
// error bounds derived from the operation sequence (so a wrong formula fails, rounding does not).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/adam_reference.h"
#include "kernels/cpu/float16.h"

namespace strata::kernels::testing {

// Element offsets of each array from a 64-byte boundary: misalignments to test.
struct Offsets {
  std::size_t master = 0, exp_avg = 0, exp_avg_sq = 0, grad = 0, copy = 0;
};

// A 64-byte aligned byte buffer.
class AlignedBytes {
 public:
  explicit AlignedBytes(std::size_t bytes);
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  std::size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t bytes_;
};

// The inputs of one tile, and storage that AdamKernel::step() updates.
class TileData {
 public:
  // Random state and gradient (seeded) for n elements; the gradient is stored multiplied by
  // `loss_scale` in `grad_dtype`; step_one makes m and v zero as before PyTorch's first step.
  TileData(std::size_t n, DType grad_dtype, DType copy_dtype, bool with_copy, Offsets offsets,
           std::uint32_t seed, float loss_scale = 1.0f, bool step_one = false);

  // Restores master/exp_avg/exp_avg_sq to the inputs and fills copy_out with 0xAB bytes.
  void reset();
  // The tile over the working storage.
  AdamTile tile();
  // The reference input over the original values.
  AdamReferenceInput reference_input() const;

  std::size_t n() const { return n_; }
  float* master() { return at<float>(master_buf_, offsets_.master); }
  float* exp_avg() { return at<float>(exp_avg_buf_, offsets_.exp_avg); }
  float* exp_avg_sq() { return at<float>(exp_avg_sq_buf_, offsets_.exp_avg_sq); }
  void* grad() { return grad_buf_.data() + offsets_.grad * dtype_bytes(grad_dtype_); }
  std::uint16_t* copy() {
    return with_copy_ ? at<std::uint16_t>(copy_buf_, offsets_.copy) : nullptr;
  }
  DType grad_dtype() const { return grad_dtype_; }
  DType copy_dtype() const { return copy_dtype_; }
  // Sets gradient element i (converted to grad_dtype).
  void set_grad(std::size_t i, float value);
  // Every byte of the working arrays, to check that nothing changed.
  std::vector<std::byte> snapshot();

  const std::vector<float>& master0() const { return master0_; }
  const std::vector<float>& exp_avg0() const { return exp_avg0_; }
  const std::vector<float>& exp_avg_sq0() const { return exp_avg_sq0_; }

 private:
  template <typename T>
  T* at(AlignedBytes& buf, std::size_t offset) {
    return reinterpret_cast<T*>(buf.data()) + offset;
  }
  std::size_t n_;
  DType grad_dtype_;
  DType copy_dtype_;
  bool with_copy_;
  Offsets offsets_;
  std::vector<float> master0_, exp_avg0_, exp_avg_sq0_;
  AlignedBytes master_buf_, exp_avg_buf_, exp_avg_sq_buf_, grad_buf_, copy_buf_;
};

// Compares the kernel's outputs in `data` with adam_reference(): every state element within its
// derived error bound, no NaN, and copy_out equal to the round-to-nearest-even of master bit for
// bit. Failures name the element and values; at most a few are reported.
inline void expect_matches_reference(const AdamParams& params, const AdamFusion& fusion,
                                     TileData& data, const std::string& what);

// Expects the working arrays of a and b to be bitwise equal.
inline void expect_bit_identical(TileData& a, TileData& b, const std::string& what);

// Representative hyperparameter sets: AdamW, Adam (L2), bias correction off, late step.
struct NamedParams {
  std::string name;
  AdamParams params;
  bool step_one;  // m and v start at zero
};
inline std::vector<NamedParams> param_sets();

// ---- implementation ----------------------------------------------------------------------------

namespace support_detail {

inline constexpr double kU = 1.0 / 16777216.0;  // 2^-24: unit roundoff of fp32
inline constexpr double kTiny = 1e-44;          // below fp32's smallest subnormal spacing

inline std::uint16_t encode(float value, DType dtype) {
  return dtype == DType::kBF16 ? float_to_bf16(value) : float_to_fp16(value);
}
inline float decode(std::uint16_t bits, DType dtype) {
  return dtype == DType::kBF16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

}  // namespace support_detail
using support_detail::decode;
using support_detail::encode;
using support_detail::kTiny;
using support_detail::kU;

// Gradient element i of a stored gradient, widened to double.
inline double decode_grad(const void* grad, DType dtype, std::size_t i) {
  if (dtype == DType::kF32) return static_cast<const float*>(grad)[i];
  return decode(static_cast<const std::uint16_t*>(grad)[i], dtype);
}

inline AlignedBytes::AlignedBytes(std::size_t bytes)
    : data_(static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64))),
      bytes_(bytes) {}

inline void AlignedBytes::Free::operator()(std::byte* p) const {
  std::free(p);
}

inline TileData::TileData(std::size_t n, DType grad_dtype, DType copy_dtype, bool with_copy,
                          Offsets offsets, std::uint32_t seed, float loss_scale, bool step_one)
    : n_(n),
      grad_dtype_(grad_dtype),
      copy_dtype_(copy_dtype),
      with_copy_(with_copy),
      offsets_(offsets),
      master0_(n),
      exp_avg0_(n),
      exp_avg_sq0_(n),
      master_buf_((n + offsets.master) * 4),
      exp_avg_buf_((n + offsets.exp_avg) * 4),
      exp_avg_sq_buf_((n + offsets.exp_avg_sq) * 4),
      grad_buf_((n + offsets.grad) * 4),
      copy_buf_((n + offsets.copy) * 2) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    // Weights over three decades, gradients over four, moments of a matching size.
    master0_[i] = normal(rng) * std::pow(10.0f, uniform(rng) * 3.0f - 2.0f);
    // Some weights as small as one update, so the update's own rounding shows in the result.
    if (i % 11 == 3) master0_[i] = normal(rng) * 1e-4f;
    float g = normal(rng) * std::pow(10.0f, uniform(rng) * 4.0f - 5.0f);
    if (i % 37 == 5) g = 0.0f;
    if (i % 53 == 7) g = 1e-30f;  // bf16/fp32 subnormal-free, flushes to fp16 zero or subnormal
    exp_avg0_[i] = step_one ? 0.0f : normal(rng) * 1e-3f;
    const float sd = normal(rng) * 1e-3f;
    exp_avg_sq0_[i] = step_one ? 0.0f : sd * sd;
    set_grad(i, g * loss_scale);
  }
  reset();
}

inline void TileData::set_grad(std::size_t i, float value) {
  if (grad_dtype_ == DType::kF32) {
    static_cast<float*>(grad())[i] = value;
  } else {
    static_cast<std::uint16_t*>(grad())[i] = encode(value, grad_dtype_);
  }
}

inline void TileData::reset() {
  if (n_ == 0) return;  // memcpy from an empty vector's null data() is undefined
  std::memcpy(master(), master0_.data(), n_ * 4);
  std::memcpy(exp_avg(), exp_avg0_.data(), n_ * 4);
  std::memcpy(exp_avg_sq(), exp_avg_sq0_.data(), n_ * 4);
  if (with_copy_) std::memset(copy(), 0xab, n_ * 2);
}

inline AdamTile TileData::tile() {
  AdamTile t;
  t.master = master();
  t.exp_avg = exp_avg();
  t.exp_avg_sq = exp_avg_sq();
  t.grad = grad();
  t.grad_dtype = grad_dtype_;
  t.copy_out = copy();
  t.copy_dtype = copy_dtype_;
  t.n = n_;
  return t;
}

inline AdamReferenceInput TileData::reference_input() const {
  AdamReferenceInput in;
  in.master = master0_.data();
  in.exp_avg = exp_avg0_.data();
  in.exp_avg_sq = exp_avg_sq0_.data();
  in.grad = const_cast<TileData*>(this)->grad();
  in.grad_dtype = grad_dtype_;
  in.n = n_;
  return in;
}

inline std::vector<std::byte> TileData::snapshot() {
  std::vector<std::byte> bytes;
  auto append = [&](const void* p, std::size_t size) {
    const auto* b = static_cast<const std::byte*>(p);
    bytes.insert(bytes.end(), b, b + size);
  };
  append(master(), n_ * 4);
  append(exp_avg(), n_ * 4);
  append(exp_avg_sq(), n_ * 4);
  if (with_copy_) append(copy(), n_ * 2);
  return bytes;
}

inline void expect_matches_reference(const AdamParams& params, const AdamFusion& fusion,
                                     TileData& data, const std::string& what) {
  const std::size_t n = data.n();
  std::vector<double> ref_p(n), ref_m(n), ref_v(n);
  const AdamReferenceInput in = data.reference_input();
  adam_reference(params, fusion, in, ref_p.data(), ref_m.data(), ref_v.data());

  const double beta1 = params.beta1;
  const double beta2 = params.beta2;
  const double t = static_cast<double>(params.step);
  const double bc2 = params.bias_correction ? 1.0 - std::pow(beta2, t) : 1.0;
  const double bc1 = params.bias_correction ? 1.0 - std::pow(beta1, t) : 1.0;
  const double c2 = 1.0 / std::sqrt(bc2);
  const double step_size = params.lr / bc1;
  const double scale = static_cast<double>(fusion.grad_scale_inv) * fusion.clip_coef;
  const double l2 = params.adamw_mode ? 0.0 : params.weight_decay;
  const double decay = params.adamw_mode ? 1.0 - double(params.lr) * params.weight_decay : 1.0;

  int failures = 0;
  auto fail = [&](const char* field, std::size_t i, double got, double want, double bound) {
    if (++failures <= 5) {
      ADD_FAILURE() << what << ": " << field << "[" << i << "] = " << got << ", reference " << want
                    << ", |diff| " << std::fabs(got - want) << " > bound " << bound;
    }
  };
  for (std::size_t i = 0; i < n; ++i) {
    const double p0 = in.master[i];
    const double m0 = in.exp_avg[i];
    const double v0 = in.exp_avg_sq[i];
    double graw = 0;
    if (in.grad_dtype == DType::kF32) {
      graw = static_cast<const float*>(in.grad)[i];
    } else {
      graw = decode(static_cast<const std::uint16_t*>(in.grad)[i], in.grad_dtype);
    }
    // Error bounds of the fp32 operation sequence (each rounding contributes u of its result).
    const double big_g = std::fabs(graw * scale) + std::fabs(l2 * p0);
    const double err_g = 4 * kU * big_g;
    const double err_m =
        (1 - beta1) * err_g + 4 * kU * (std::fabs(beta1 * m0) + (1 - beta1) * big_g);
    const double err_v = (1 - beta2) * (2 * big_g * err_g + err_g * err_g) +
                         5 * kU * (beta2 * v0 + (1 - beta2) * big_g * big_g);
    const double v_ref = ref_v[i];
    const double sqrt_v = std::sqrt(v_ref);
    const double err_sqrt = sqrt_v - std::sqrt(std::max(0.0, v_ref - err_v)) + kU * sqrt_v;
    const double denom = sqrt_v * c2 + params.eps;
    const double err_denom = c2 * err_sqrt + 3 * kU * denom;
    const double denom_lo = denom - err_denom;
    const double q = ref_m[i] / denom;
    const double err_q = (err_m + std::fabs(q) * err_denom) / denom_lo + kU * std::fabs(q);
    const double err_update = step_size * err_q + 3 * kU * step_size * std::fabs(q);
    const double err_p = 3 * kU * std::fabs(p0 * decay) + err_update + kU * std::fabs(ref_p[i]);

    const double got_p = data.master()[i];
    const double got_m = data.exp_avg()[i];
    const double got_v = data.exp_avg_sq()[i];
    // Twice the derived bound: the first-order analysis leaves out products of small errors.
    const double bound_p = 2 * err_p + kTiny;
    const double bound_m = 2 * err_m + kTiny;
    const double bound_v = 2 * err_v + kTiny;
    if (std::isnan(got_p) || !(std::fabs(got_p - ref_p[i]) <= bound_p)) {
      fail("master", i, got_p, ref_p[i], bound_p);
    }
    if (std::isnan(got_m) || !(std::fabs(got_m - ref_m[i]) <= bound_m)) {
      fail("exp_avg", i, got_m, ref_m[i], bound_m);
    }
    if (std::isnan(got_v) || !(std::fabs(got_v - ref_v[i]) <= bound_v)) {
      fail("exp_avg_sq", i, got_v, ref_v[i], bound_v);
    }
    if (data.copy() != nullptr) {
      const std::uint16_t bits = data.copy()[i];
      const std::uint16_t want = encode(data.master()[i], data.copy_dtype());
      if (bits != want && ++failures <= 5) {
        ADD_FAILURE() << what << ": copy_out[" << i << "] = 0x" << std::hex << bits
                      << ", round-to-nearest-even of master is 0x" << want << std::dec;
      }
      // And the narrow copy is within half a unit in its last place of the reference.
      const double half_ulp = data.copy_dtype() == DType::kBF16
                                  ? std::fabs(ref_p[i]) / 256.0
                                  : std::fabs(ref_p[i]) / 2048.0 + 1.0 / (1 << 25);
      const double got_copy = decode(bits, data.copy_dtype());
      if (std::isnan(got_copy) || !(std::fabs(got_copy - ref_p[i]) <= bound_p + half_ulp)) {
        fail("copy_out", i, got_copy, ref_p[i], bound_p + half_ulp);
      }
    }
  }
  if (failures > 5) ADD_FAILURE() << what << ": " << failures << " mismatches in all";
}

inline void expect_bit_identical(TileData& a, TileData& b, const std::string& what) {
  ASSERT_EQ(a.n(), b.n());
  const std::vector<std::byte> x = a.snapshot();
  const std::vector<std::byte> y = b.snapshot();
  ASSERT_EQ(x.size(), y.size()) << what;
  EXPECT_TRUE(x == y) << what << ": outputs differ";
}

inline std::vector<NamedParams> param_sets() {
  std::vector<NamedParams> sets;
  AdamParams adamw;
  adamw.lr = 1e-3f;
  adamw.weight_decay = 0.01f;
  adamw.adamw_mode = true;
  adamw.step = 1;
  sets.push_back({"adamw_step1", adamw, true});

  AdamParams adam = adamw;
  adam.adamw_mode = false;
  adam.weight_decay = 0.1f;
  adam.step = 10;
  adam.beta1 = 0.85f;
  adam.beta2 = 0.99f;
  adam.eps = 1e-6f;
  sets.push_back({"adam_l2_step10", adam, false});

  AdamParams no_bias = adamw;
  no_bias.bias_correction = false;
  no_bias.step = 3;
  sets.push_back({"adamw_no_bias_correction", no_bias, false});

  AdamParams late = adamw;
  late.weight_decay = 0.0f;
  late.lr = 3e-4f;
  late.beta2 = 0.95f;
  late.step = 100000;
  sets.push_back({"adam_late_step", late, false});
  return sets;
}

}  // namespace strata::kernels::testing
