// Internal to the CPU Adam kernels (adam*.cc): the constants one step needs, the per-element
// update every SIMD path's scalar tail shares, and the table of range functions each path
// provides. Not part of the public API (see adam.h).
#pragma once

#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/float16.h"

namespace strata::kernels::detail {

// Everything per-step, precomputed once in double and rounded to fp32.
struct AdamConstants {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float eps = 0;
  float step_size = 0;     // lr / bc1
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(bc2)
  float decay = 1;         // AdamW: 1 - lr * weight_decay; Adam: 1
  float l2 = 0;            // Adam: weight_decay; AdamW: 0
  float grad_scale = 1;    // grad_scale_inv * clip_coef
  // Adam's bound on |exp_avg| / sqrt(exp_avg_sq) (8-bit moments clamp the decoded exp_avg to it;
  // docs/adam.md): (1 - beta1) / sqrt((1 - beta2)(1 - beta1^2 / beta2)), FLT_MAX where
  // beta1^2 >= beta2 gives none.
  float m_bound = 0;
};

// The constants of one step, computed in double and rounded to fp32 (every path, CPU and GPU,
// starts from these).
inline AdamConstants make_constants(const AdamParams& p, const AdamFusion& f) {
  const double beta1 = p.beta1;
  const double beta2 = p.beta2;
  const double t = static_cast<double>(p.step);
  const double bc1 = p.bias_correction ? 1.0 - std::pow(beta1, t) : 1.0;
  const double bc2 = p.bias_correction ? 1.0 - std::pow(beta2, t) : 1.0;
  AdamConstants c;
  c.beta1 = p.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = p.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.eps = p.eps;
  c.step_size = static_cast<float>(static_cast<double>(p.lr) / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decay =
      p.adamw_mode ? static_cast<float>(1.0 - static_cast<double>(p.lr) * p.weight_decay) : 1.0f;
  c.l2 = p.adamw_mode ? 0.0f : p.weight_decay;
  c.grad_scale = static_cast<float>(static_cast<double>(f.grad_scale_inv) * f.clip_coef);
  // |m_t| <= sqrt(sum_i a_i^2 / b_i) sqrt(v_t) (Cauchy-Schwarz) with a_i = (1 - beta1) beta1^(t-i),
  // b_i = (1 - beta2) beta2^(t-i): a geometric series when beta1^2 < beta2.
  double bound = DBL_MAX;
  if (beta1 * beta1 < beta2 && beta2 < 1.0) {
    bound = (1.0 - beta1) / std::sqrt((1.0 - beta2) * (1.0 - beta1 * beta1 / beta2));
  }
  c.m_bound = bound < FLT_MAX ? static_cast<float>(bound) : FLT_MAX;
  return c;
}

// Copy-out variants: template arguments of the fp32 paths (kNone, kBF16, kF16; an fp32 copy is
// made in adam.cc there), a run-time choice of the compressed-state paths (all four).
enum class CopyKind { kNone = 0, kBF16 = 1, kF16 = 2, kF32 = 3 };

inline CopyKind copy_kind(const AdamTile& t) {
  if (t.copy_out == nullptr) return CopyKind::kNone;
  switch (t.copy_dtype) {
    case DType::kBF16:
      return CopyKind::kBF16;
    case DType::kF16:
      return CopyKind::kF16;
    case DType::kF32:
      return CopyKind::kF32;
  }
  return CopyKind::kNone;
}

// Runs [begin, end) of one tile; the tile's pointers are the tile's base pointers, so begin and
// end are tile indices (the stochastic rounding of compressed state hashes them). The fp32 paths
// take an all-fp32 tile; the compressed-state paths any other, with begin a multiple of the tile's
// block for 8-bit moments (and end too, or n).
using AdamRangeFn = void (*)(const AdamConstants& c, const AdamTile& tile, std::size_t begin,
                             std::size_t end);
// Stats of grad[begin, end): nonfinite count, and grad^2 summed into 16 lanes (element i goes to
// lane (i - begin) % 16) that combine_lanes() adds in a fixed order, so every path agrees.
using StatsRangeFn = GradStats (*)(const void* grad, DType dtype, std::size_t begin,
                                   std::size_t end);
// p += g; m += g; v += g over [begin, end).
using RooflineRangeFn = void (*)(float* p, float* m, float* v, const float* g, std::size_t begin,
                                 std::size_t end);

struct AdamPath {
  AdamRangeFn adam = nullptr;        // fp32 master and moments
  AdamRangeFn adam_state = nullptr;  // any other state format (adam_state.h)
  StatsRangeFn stats = nullptr;
  RooflineRangeFn roofline = nullptr;
};

AdamPath scalar_path();
AdamPath avx2_path();
AdamPath avx512_path();

inline constexpr int kStatsLanes = 16;

// The kernels run with the default floating-point environment (round to nearest, no
// flush-to-zero, no denormals-are-zero) whatever the calling thread set, so results never depend
// on which thread ran a block; the caller's MXCSR is restored afterwards.
class MxcsrGuard {
 public:
  MxcsrGuard() : saved_(_mm_getcsr()) { _mm_setcsr(kDefault); }
  ~MxcsrGuard() { _mm_setcsr(saved_); }
  MxcsrGuard(const MxcsrGuard&) = delete;
  MxcsrGuard& operator=(const MxcsrGuard&) = delete;

 private:
  static constexpr unsigned kDefault = 0x1f80;  // all exceptions masked, round to nearest
  unsigned saved_;
};

// Gradient element i of a tile, widened to fp32 (exact).
[[gnu::always_inline]] inline float load_grad(const void* grad, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(grad)[i];
    case DType::kBF16:
      return bf16_to_float(static_cast<const std::uint16_t*>(grad)[i]);
    case DType::kF16:
      return fp16_to_float(static_cast<const std::uint16_t*>(grad)[i]);
  }
  return 0.0f;
}

// The update of one element in fp32: the exact operation sequence every vector path performs,
// whatever the state is stored as.
template <bool kL2>
[[gnu::always_inline]] inline void adam_update(const AdamConstants& c, float grad, float& param,
                                               float& m, float& v) {
  float g = grad * c.grad_scale;
  if constexpr (kL2) g = std::fma(c.l2, param, g);
  m = std::fma(c.beta1, m, c.one_minus_beta1 * g);
  v = std::fma(c.beta2, v, (c.one_minus_beta2 * g) * g);
  const float denom = std::fma(std::sqrt(v), c.inv_sqrt_bc2, c.eps);
  param = param * c.decay;
  param = std::fma(-c.step_size, m / denom, param);
}

// The update of one fp32 element in place, with its copy-out.
template <bool kL2, CopyKind kCopy>
[[gnu::always_inline]] inline void adam_element(const AdamConstants& c, float grad, float* p,
                                                float* m, float* v, void* copy_out, std::size_t i) {
  float param = *p;
  float new_m = *m;
  float new_v = *v;
  adam_update<kL2>(c, grad, param, new_m, new_v);
  *p = param;
  *m = new_m;
  *v = new_v;
  if constexpr (kCopy == CopyKind::kBF16) {
    static_cast<std::uint16_t*>(copy_out)[i] = float_to_bf16(param);
  } else if constexpr (kCopy == CopyKind::kF16) {
    static_cast<std::uint16_t*>(copy_out)[i] = float_to_fp16(param);
  }
}

// Scalar stats of grad[begin, end) into lanes (the tail of every path, and the scalar path).
[[gnu::always_inline]] inline void stats_tail(const void* grad, DType dtype, std::size_t begin,
                                              std::size_t from, std::size_t end,
                                              double lanes[kStatsLanes], std::uint64_t* nonfinite) {
  for (std::size_t i = from; i < end; ++i) {
    const float x = load_grad(grad, dtype, i);
    if (!std::isfinite(x)) ++*nonfinite;
    const double d = x;
    double& lane = lanes[(i - begin) % kStatsLanes];
    lane = std::fma(d, d, lane);
  }
}

// Adds the 16 lanes in a fixed pairwise order.
inline double combine_lanes(const double lanes[kStatsLanes]) {
  double level[kStatsLanes];
  for (int k = 0; k < kStatsLanes; ++k)
    level[k] = lanes[k];
  for (int width = kStatsLanes / 2; width >= 1; width /= 2) {
    for (int k = 0; k < width; ++k)
      level[k] = level[2 * k] + level[2 * k + 1];
  }
  return level[0];
}

}  // namespace strata::kernels::detail
