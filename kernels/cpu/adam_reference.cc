#include "kernels/cpu/adam_reference.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/adam_internal.h"
#include "kernels/cpu/float16.h"

namespace strata::kernels {
namespace {

double grad_at(const void* grad, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(grad)[i];
    case DType::kBF16:
      return bf16_to_float(static_cast<const std::uint16_t*>(grad)[i]);
    case DType::kF16:
      return fp16_to_float(static_cast<const std::uint16_t*>(grad)[i]);
  }
  return 0.0;
}

}  // namespace

AdamResult adam_reference(const AdamParams& params, const AdamFusion& fusion,
                          const AdamReferenceInput& in, double* out_master, double* out_exp_avg,
                          double* out_exp_avg_sq) {
  AdamResult result;
  if (fusion.check_finite) {
    for (std::size_t i = 0; i < in.n; ++i) {
      if (!std::isfinite(grad_at(in.grad, in.grad_dtype, i))) ++result.nonfinite_count;
    }
    result.skipped = result.nonfinite_count > 0;
  }

  const double lr = params.lr;
  const double beta1 = params.beta1;
  const double beta2 = params.beta2;
  const double eps = params.eps;
  const double weight_decay = params.weight_decay;
  const double t = static_cast<double>(params.step);
  const double bias_correction1 = params.bias_correction ? 1.0 - std::pow(beta1, t) : 1.0;
  const double bias_correction2 = params.bias_correction ? 1.0 - std::pow(beta2, t) : 1.0;
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);

  for (std::size_t i = 0; i < in.n; ++i) {
    double p = in.master[i];
    double m = in.exp_avg[i];
    double v = in.exp_avg_sq[i];
    if (!result.skipped) {
      double g = grad_at(in.grad, in.grad_dtype, i);
      g = g * static_cast<double>(fusion.grad_scale_inv) * static_cast<double>(fusion.clip_coef);
      if (!params.adamw_mode) g = g + weight_decay * p;  // Adam: L2 penalty in the gradient
      m = beta1 * m + (1.0 - beta1) * g;
      v = beta2 * v + (1.0 - beta2) * g * g;
      if (params.adamw_mode) p = p * (1.0 - lr * weight_decay);  // AdamW: decoupled decay
      const double denom = std::sqrt(v) / bias_correction2_sqrt + eps;
      p = p - step_size * m / denom;
    }
    out_master[i] = p;
    out_exp_avg[i] = m;
    out_exp_avg_sq[i] = v;
  }
  return result;
}

// ---- compressed state: the exact fp32 definition ------------------------------------------

namespace {

std::uint32_t lowbias32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

float grad_f32(const void* grad, DType dtype, std::size_t i) {
  return static_cast<float>(grad_at(grad, dtype, i));  // exact: the value is a widened fp32
}

std::uint16_t rounded_bf16(float x, std::uint32_t key, int array, std::size_t i) {
  return stochastic_round_bf16(x, state_rounding_bits(key, array, i));
}

}  // namespace

std::uint32_t state_rounding_bits(std::uint32_t rounding_key, int array, std::size_t i) {
  const std::uint32_t key = lowbias32(rounding_key + static_cast<std::uint32_t>(array) + 1);
  return lowbias32(static_cast<std::uint32_t>(i) * 0x9E3779B1U + key);
}

std::uint16_t stochastic_round_bf16(float x, std::uint32_t r) {
  if (!std::isfinite(x)) return float_to_bf16(x);
  return static_cast<std::uint16_t>((std::bit_cast<std::uint32_t>(x) + (r & 0xFFFFu)) >> 16);
}

float q8_decode_exp_avg(std::int8_t code, float absmax) {
  const float t = static_cast<float>(std::abs(static_cast<int>(code))) * (1.0f / 127.0f);
  return std::copysign((t * t) * absmax, static_cast<float>(code));
}

float q8_decode_exp_avg_sq(std::uint8_t code, float absmax) {
  const float t = static_cast<float>(code) * (1.0f / 255.0f);
  const float t2 = t * t;
  return (t2 * t2) * absmax;
}

namespace {

// The code at position limit * s with 16 random bits j: floor(limit * s + u) in one fma, with
// u = 2^-11 + j * (1 - 2^-10) / 65535 (in [2^-11, 1 - 2^-11]: a position within 2^-11 of an
// integer takes that integer); at most limit, and limit for NaN.
int q8_code(float s, std::uint32_t j, float limit) {
  const float step = static_cast<float>((1.0 - 1.0 / 1024.0) / 65535.0);
  const float u = std::fma(static_cast<float>(j), step, 1.0f / 2048.0f);
  float code = std::floor(std::fma(s, limit, u));
  if (!(code < limit)) code = limit;  // also NaN
  return static_cast<int>(code);
}

}  // namespace

float q8_encode_exp_avg_block(const float* m, std::size_t count, std::int8_t* codes,
                              std::uint32_t rounding_key, std::size_t first) {
  float max = 0.0f;
  for (std::size_t k = 0; k < count; ++k) {
    if (std::fabs(m[k]) > max) max = std::fabs(m[k]);  // NaN never compares greater
  }
  const float absmax = max >= FLT_MIN ? max : 0.0f;
  const float inv = absmax != 0.0f ? 1.0f / absmax : 0.0f;
  for (std::size_t k = 0; k < count; ++k) {
    int q = 0;
    if (absmax != 0.0f) {
      const float s = std::sqrt(std::fabs(m[k]) * inv);
      const std::uint32_t j = state_rounding_bits(rounding_key, 1, first + k) & 0xFFFFu;
      q = q8_code(s, j, 127.0f);
      if (m[k] < 0.0f) q = -q;
    }
    codes[k] = static_cast<std::int8_t>(q);
  }
  return absmax;
}

float q8_encode_exp_avg_sq_block(const float* v, std::size_t count, std::uint8_t* codes,
                                 std::uint32_t rounding_key, std::size_t first) {
  float max = 0.0f;
  for (std::size_t k = 0; k < count; ++k) {
    if (v[k] > max) max = v[k];
  }
  const float absmax = max >= FLT_MIN ? max : 0.0f;
  const float inv_sqrt = absmax != 0.0f ? 1.0f / std::sqrt(absmax) : 0.0f;
  for (std::size_t k = 0; k < count; ++k) {
    int q = 0;
    if (absmax != 0.0f) {
      const float s = std::sqrt(std::sqrt(v[k]) * inv_sqrt);
      const std::uint32_t j = state_rounding_bits(rounding_key, 1, first + k) >> 16;
      q = q8_code(s, j, 255.0f);
    }
    codes[k] = static_cast<std::uint8_t>(q);
  }
  return absmax;
}

AdamResult adam_state_reference(const AdamParams& params, const AdamFusion& fusion,
                                const AdamTile& t) {
  AdamResult result;
  if (fusion.check_finite) {
    for (std::size_t i = 0; i < t.n; ++i) {
      if (!std::isfinite(grad_at(t.grad, t.grad_dtype, i))) ++result.nonfinite_count;
    }
    result.skipped = result.nonfinite_count > 0;
    if (result.skipped) return result;
  }
  const detail::AdamConstants c = detail::make_constants(params, fusion);
  const std::size_t n = t.n;
  std::vector<float> w(n), m(n), v(n);

  // 1. Decode.
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = t.master_dtype == DType::kF32
               ? static_cast<const float*>(t.master)[i]
               : bf16_to_float(static_cast<const std::uint16_t*>(t.master)[i]);
    switch (t.moments) {
      case MomentFormat::kF32:
        m[i] = static_cast<const float*>(t.exp_avg)[i];
        v[i] = static_cast<const float*>(t.exp_avg_sq)[i];
        break;
      case MomentFormat::kBF16:
        m[i] = bf16_to_float(static_cast<const std::uint16_t*>(t.exp_avg)[i]);
        v[i] = bf16_to_float(static_cast<const std::uint16_t*>(t.exp_avg_sq)[i]);
        break;
      case MomentFormat::kQ8: {
        // m as the update reads it: |m| held to Adam's bound m_bound * sqrt(v), computed as
        // (q_v / 255)^2 * (m_bound * sqrt(absmax_v)) (at most FLT_MAX; 0 for an all-zero
        // block), the comparison as x86 minps does it.
        const float absmax_v = t.exp_avg_sq_absmax[i / t.block];
        const std::uint8_t code_v = static_cast<const std::uint8_t*>(t.exp_avg_sq)[i];
        const float tv = static_cast<float>(code_v) * (1.0f / 255.0f);
        float block_limit = 0.0f;
        if (absmax_v > 0.0f) {
          block_limit = c.m_bound * std::sqrt(absmax_v);
          if (!(block_limit < FLT_MAX)) block_limit = FLT_MAX;
        }
        const float limit = (tv * tv) * block_limit;
        const std::int8_t code_m = static_cast<const std::int8_t*>(t.exp_avg)[i];
        float magnitude = std::fabs(q8_decode_exp_avg(code_m, t.exp_avg_absmax[i / t.block]));
        if (!(magnitude < limit)) magnitude = limit;
        m[i] = std::copysign(magnitude, static_cast<float>(code_m));
        v[i] = q8_decode_exp_avg_sq(code_v, absmax_v);
        break;
      }
    }
  }

  // 2. The fp32 update: adam_update()'s operations in its order.
  for (std::size_t i = 0; i < n; ++i) {
    float g = grad_f32(t.grad, t.grad_dtype, i) * c.grad_scale;
    if (c.l2 != 0.0f) g = std::fma(c.l2, w[i], g);
    m[i] = std::fma(c.beta1, m[i], c.one_minus_beta1 * g);
    v[i] = std::fma(c.beta2, v[i], (c.one_minus_beta2 * g) * g);
    const float denom = std::fma(std::sqrt(v[i]), c.inv_sqrt_bc2, c.eps);
    w[i] = w[i] * c.decay;
    w[i] = std::fma(-c.step_size, m[i] / denom, w[i]);
  }

  // 3. Encode, and the copy-out of the stored master.
  for (std::size_t i = 0; i < n; ++i) {
    float stored = w[i];
    if (t.master_dtype == DType::kF32) {
      static_cast<float*>(t.master)[i] = w[i];
    } else {
      const std::uint16_t bits = rounded_bf16(w[i], t.rounding_key, 0, t.rounding_offset + i);
      static_cast<std::uint16_t*>(t.master)[i] = bits;
      stored = bf16_to_float(bits);
    }
    if (t.copy_out != nullptr) {
      switch (t.copy_dtype) {
        case DType::kF32:
          static_cast<float*>(t.copy_out)[i] = stored;
          break;
        case DType::kBF16:
          static_cast<std::uint16_t*>(t.copy_out)[i] = float_to_bf16(stored);
          break;
        case DType::kF16:
          static_cast<std::uint16_t*>(t.copy_out)[i] = float_to_fp16(stored);
          break;
      }
    }
    if (t.moments == MomentFormat::kF32) {
      static_cast<float*>(t.exp_avg)[i] = m[i];
      static_cast<float*>(t.exp_avg_sq)[i] = v[i];
    } else if (t.moments == MomentFormat::kBF16) {
      static_cast<std::uint16_t*>(t.exp_avg)[i] =
          rounded_bf16(m[i], t.rounding_key, 1, t.rounding_offset + i);
      static_cast<std::uint16_t*>(t.exp_avg_sq)[i] =
          rounded_bf16(v[i], t.rounding_key, 2, t.rounding_offset + i);
    }
  }
  if (t.moments == MomentFormat::kQ8) {
    for (std::size_t b = 0; b < n; b += t.block) {
      t.exp_avg_absmax[b / t.block] =
          q8_encode_exp_avg_block(m.data() + b, t.block, static_cast<std::int8_t*>(t.exp_avg) + b,
                                  t.rounding_key, t.rounding_offset + b);
      t.exp_avg_sq_absmax[b / t.block] = q8_encode_exp_avg_sq_block(
          v.data() + b, t.block, static_cast<std::uint8_t*>(t.exp_avg_sq) + b, t.rounding_key,
          t.rounding_offset + b);
    }
  }
  return result;
}

}  // namespace strata::kernels
