// RoPE frequencies per rope_type (see rope.h). Each formula follows transformers'
// modeling_rope_utils step by step, in T: a Python scalar meeting a float32 tensor is rounded to
// float32 first, as torch does, while the scalar-only arithmetic (YaRN's correction range, the
// attention factors) stays in double as in Python.
#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace strata::model {
namespace {

using config::RopeType;

// transformers' `dim`: int(head_dim * partial_rotary_factor), before rounding up to even.
std::int64_t raw_rotary_dim(const ModelShape& s) {
  return static_cast<std::int64_t>(static_cast<double>(s.head_dim) *
                                   s.arch.rope.partial_rotary_factor);
}

// base ** (arange(0, dim, 2).float() / dim): one value per rotated pair.
template <typename T>
std::vector<T> base_powers(const ModelShape& s) {
  const std::int64_t dim = raw_rotary_dim(s);
  const std::int64_t half = rotary_dim(s) / 2;
  std::vector<T> out(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    const T exponent = static_cast<T>(2 * i) / static_cast<T>(dim);
    out[static_cast<std::size_t>(i)] =
        static_cast<T>(std::pow(static_cast<T>(s.rope_theta), exponent));
  }
  return out;
}

double scaled_factor(const ModelShape& s) {
  const config::RopeScaling& r = s.arch.rope;
  if (r.factor > 0) return r.factor;
  return static_cast<double>(s.max_seq_len) / static_cast<double>(r.original_max_positions);
}

template <typename T>
std::vector<T> llama3(const ModelShape& s, std::vector<T> inv) {
  const config::RopeScaling& r = s.arch.rope;
  const double old_context = static_cast<double>(r.original_max_positions);
  const T low_wavelen = static_cast<T>(old_context / r.low_freq_factor);
  const T high_wavelen = static_cast<T>(old_context / r.high_freq_factor);
  const T factor = static_cast<T>(r.factor);
  for (T& f : inv) {
    const T wavelen = static_cast<T>(2.0 * M_PI) / f;
    const T scaled = wavelen > low_wavelen ? f / factor : f;
    const T smooth = (static_cast<T>(old_context) / wavelen - static_cast<T>(r.low_freq_factor)) /
                     static_cast<T>(r.high_freq_factor - r.low_freq_factor);
    const T smoothed = (T(1) - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : scaled;
  }
  return inv;
}

template <typename T>
std::vector<T> yarn(const ModelShape& s, const std::vector<T>& powers) {
  const config::RopeScaling& r = s.arch.rope;
  const double dim = static_cast<double>(raw_rotary_dim(s));
  const double base = s.rope_theta;
  const double orig = static_cast<double>(r.original_max_positions);
  const double factor = scaled_factor(s);
  const double beta_fast = r.beta_fast > 0 ? r.beta_fast : 32.0;
  const double beta_slow = r.beta_slow > 0 ? r.beta_slow : 1.0;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
  };
  double low = correction_dim(beta_fast);
  double high = correction_dim(beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const T t_low = static_cast<T>(low);
  const T t_width = static_cast<T>(high - low);
  std::vector<T> inv(powers.size());
  for (std::size_t i = 0; i < powers.size(); ++i) {
    const T extrapolation = T(1) / powers[i];
    const T interpolation = T(1) / (static_cast<T>(factor) * powers[i]);
    const T ramp = std::clamp((static_cast<T>(i) - t_low) / t_width, T(0), T(1));
    const T extrapolation_factor = T(1) - ramp;
    inv[i] = interpolation * (T(1) - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

template <typename T>
std::vector<T> rope_inv_freq(const ModelShape& s, bool long_factors) {
  const config::RopeScaling& r = s.arch.rope;
  const std::vector<T> powers = base_powers<T>(s);
  std::vector<T> inv(powers.size());
  switch (r.type) {
    case RopeType::kYarn:
      return yarn(s, powers);
    case RopeType::kLongRope: {
      const std::vector<double>& ext = long_factors ? r.long_factor : r.short_factor;
      for (std::size_t i = 0; i < powers.size(); ++i)
        inv[i] = T(1) / (static_cast<T>(ext[i]) * powers[i]);
      return inv;
    }
    default:
      break;
  }
  for (std::size_t i = 0; i < powers.size(); ++i)
    inv[i] = T(1) / powers[i];
  if (r.type == RopeType::kLinear) {
    for (T& f : inv)
      f /= static_cast<T>(r.factor);
  } else if (r.type == RopeType::kLlama3) {
    inv = llama3(s, std::move(inv));
  }
  return inv;
}

double rope_attention_scaling(const ModelShape& s) {
  const config::RopeScaling& r = s.arch.rope;
  if (r.type == RopeType::kYarn) {
    if (r.attention_factor > 0) return r.attention_factor;
    const double factor = scaled_factor(s);
    if (r.mscale > 0 && r.mscale_all_dim > 0) {
      return yarn_mscale(factor, r.mscale) / yarn_mscale(factor, r.mscale_all_dim);
    }
    return yarn_mscale(factor, 1.0);
  }
  if (r.type == RopeType::kLongRope) {
    if (r.attention_factor > 0) return r.attention_factor;
    const double factor = scaled_factor(s);
    if (factor <= 1.0) return 1.0;
    return std::sqrt(1.0 +
                     std::log(factor) / std::log(static_cast<double>(r.original_max_positions)));
  }
  return 1.0;
}

bool rope_needs_long_tables(const ModelShape& s, std::int64_t seq_len) {
  return s.arch.rope.type == RopeType::kLongRope && seq_len > s.arch.rope.original_max_positions;
}

bool rope_uses_long_factors(const ModelShape& s, std::int64_t max_position) {
  return s.arch.rope.type == RopeType::kLongRope &&
         max_position + 1 > s.arch.rope.original_max_positions;
}

template std::vector<float> rope_inv_freq<float>(const ModelShape&, bool);
template std::vector<double> rope_inv_freq<double>(const ModelShape&, bool);

}  // namespace strata::model
