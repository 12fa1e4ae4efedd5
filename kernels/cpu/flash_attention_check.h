// The tensor-core flash attention's numerical checks (kernels/cuda/flash_attention_kernels.cuh,
// flash_attention_backward_kernels.cuh), shared by the product and the tests: the CUDA backend's
// start-up self-check of its flash-attention fast path (src/backend/attention_check.cc), the
// emulator tests (tests/kernels/flash_attention_emulated_test.cc,
// flash_attention_backward_emulated_test.cc) and the GPU test (flash_attention_gputest.cc). Here:
// the cases and their names, 16-bit conversions, the padded q | k | v layout, packed documents,
// seeded inputs, the forward's error bounds (derived in flash_attention_emulated_test.cc's header)
// and the backward's inputs, error bounds and comparison (derived in
// flash_attention_backward_emulated_test.cc's header). Plain C++: nothing here needs CUDA.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cpu/float16.h"
#include "kernels/cpu/nn_ops.h"

namespace strata::kernels::flash_check {

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

// The inputs of a backward test, in the layouts of shape_of(c) (padding zero): q | k | v and dO
// rounded to the 16-bit type (`*_bits`) and widened (`*_wide`), the forward's O (the CPU's, in
// double, rounded to 16 bits) and lse (rounded to fp32), both also widened exactly: the kernel and
// the CPU backward take exactly these.
struct BackwardInputs {
  std::vector<std::uint16_t> qkv_bits, dout_bits, out_bits;
  std::vector<double> qkv_wide, dout_wide, out_wide, lse_wide;
  std::vector<float> lse;  // (B, H, T)
};

// Q in [-4, 4) (peaked rows), K, V, dO in [-1, 1), `unit()` drawing from [-1, 1): per row, the
// q | k | v row (random_qkv_row), then dO's heads * head_dim columns. `s` is shape_of(c), with
// host positions when c.packed.
template <typename Unit>
BackwardInputs random_backward_inputs(const FlashCase& c, const AttentionShape& s, Unit&& unit) {
  const std::int64_t rows = c.batch * c.seq_len;
  const std::int64_t hd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  BackwardInputs in;
  in.qkv_bits.assign(static_cast<std::size_t>(rows * s.q_stride), 0);
  in.qkv_wide.assign(in.qkv_bits.size(), 0.0);
  in.dout_bits.assign(static_cast<std::size_t>(rows * s.out_stride), 0);
  in.dout_wide.assign(in.dout_bits.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>(r * s.q_stride);
    random_qkv_row(c, &in.qkv_bits[row], &in.qkv_wide[row], unit);
    for (std::int64_t j = 0; j < hd; ++j) {
      const auto at = static_cast<std::size_t>(r * s.out_stride + j);
      in.dout_bits[at] = to_bits(unit(), c.bf16);
      in.dout_wide[at] = from_bits(in.dout_bits[at], c.bf16);
    }
  }
  const double* qw = in.qkv_wide.data();
  in.out_wide.assign(in.dout_bits.size(), 0.0);
  in.lse_wide.assign(static_cast<std::size_t>(c.heads * rows), 0.0);
  attention_forward<double>(in.out_wide.data(), in.lse_wide.data(), qw, qw + hd, qw + hd + kvd, s);
  in.out_bits.assign(in.out_wide.size(), 0);
  in.lse.assign(in.lse_wide.size(), 0.0f);
  for (std::size_t i = 0; i < in.out_bits.size(); ++i) {
    in.out_bits[i] = to_bits(in.out_wide[i], c.bf16);
    in.out_wide[i] = from_bits(in.out_bits[i], c.bf16);
  }
  for (std::size_t i = 0; i < in.lse.size(); ++i) {
    in.lse[i] = static_cast<float>(in.lse_wide[i]);
    in.lse_wide[i] = in.lse[i];
  }
  return in;
}

// The CPU backward (attention_backward<double>) on the widened inputs: dq | dk | dv in the layout
// of q | k | v (padding zero).
inline std::vector<double> backward_reference(const FlashCase& c, const AttentionShape& s,
                                              const BackwardInputs& in) {
  const std::int64_t hd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  std::vector<double> want(in.qkv_wide.size(), 0.0);
  double* ww = want.data();
  const double* qw = in.qkv_wide.data();
  attention_backward<double>(ww, ww + hd, ww + hd + kvd, in.dout_wide.data(), in.out_wide.data(),
                             in.lse_wide.data(), qw, qw + hd, qw + hd + kvd, s);
  return want;
}

// The backward's error bound for every element of dq | dk | dv (the layout of q | k | v; 0 in
// the padding), as derived in flash_attention_backward_emulated_test.cc's header, for case `c` on
// inputs `in` and the reference `want` (backward_reference).
inline std::vector<double> backward_bounds(const FlashCase& c, const AttentionShape& s,
                                           const BackwardInputs& in,
                                           const std::vector<double>& want) {
  const std::int64_t rows = c.batch * c.seq_len;
  const std::int64_t T = c.seq_len, D = c.head_dim, group = c.heads / c.kv_heads;
  const std::int64_t hd = c.heads * D, kvd = c.kv_heads * D;
  const double* qw = in.qkv_wide.data();
  // The bound's sums: err[] = sum of |term errors|, mag[] = sum of |terms|, per element.
  const double u = std::ldexp(1.0, c.bf16 ? -8 : -11);
  const double e = std::ldexp(1.0, -24);
  const double a16 = c.bf16 ? 0.0 : std::ldexp(1.0, -25);
  std::vector<double> err(in.qkv_wide.size(), 0.0), mag(in.qkv_wide.size(), 0.0);
  const auto qat = [&](std::int64_t b, std::int64_t t, std::int64_t h) {
    return (b * T + t) * s.q_stride + h * D;
  };
  const auto kat = [&](std::int64_t b, std::int64_t t, std::int64_t g) {
    return (b * T + t) * s.kv_stride + hd + g * D;
  };
  const auto oat = [&](std::int64_t b, std::int64_t t, std::int64_t h) {
    return (b * T + t) * s.out_stride + h * D;
  };
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t t = 0; t < T; ++t) {
        const double* qr = qw + qat(b, t, h);
        const double* dor = in.dout_wide.data() + oat(b, t, h);
        const double* orow = in.out_wide.data() + oat(b, t, h);
        const double lse_t = in.lse_wide[static_cast<std::size_t>((b * c.heads + h) * T + t)];
        double dlt = 0.0, dlt_abs = 0.0;
        for (std::int64_t d = 0; d < D; ++d) {
          dlt += dor[d] * orow[d];
          dlt_abs += std::abs(dor[d] * orow[d]);
        }
        for (std::int64_t key = attention_first_key(s, b, t); key <= t; ++key) {
          const double* kr = qw + kat(b, key, g);
          const double* vr = kr + kvd;
          double qk = 0.0, qk_abs = 0.0, dp = 0.0, dp_abs = 0.0;
          for (std::int64_t d = 0; d < D; ++d) {
            qk += qr[d] * kr[d];
            qk_abs += std::abs(qr[d] * kr[d]);
            dp += dor[d] * vr[d];
            dp_abs += std::abs(dor[d] * vr[d]);
          }
          const double p = std::exp(s.scale * qk - lse_t);
          const double dsv = p * (dp - dlt);
          const double eps = 1.01 * (static_cast<double>(D + 4) * e * s.scale * qk_abs +
                                     4 * e * std::abs(lse_t) + 4 * e);
          const double ep = (eps + u + eps * u) * p + a16;
          const double eds32 = (eps + 2 * e) * std::abs(dsv) +
                               (1 + eps) * p * static_cast<double>(D) * e * (dp_abs + dlt_abs);
          const double eds = (1 + u) * eds32 + u * std::abs(dsv) + a16;
          for (std::int64_t d = 0; d < D; ++d) {
            const auto iq = static_cast<std::size_t>(qat(b, t, h) + d);
            const auto ik = static_cast<std::size_t>(kat(b, key, g) + d);
            const auto iv = ik + static_cast<std::size_t>(kvd);
            err[iq] += s.scale * eds * std::abs(kr[d]);
            mag[iq] += s.scale * std::abs(dsv * kr[d]);
            err[ik] += s.scale * eds * std::abs(qr[d]);
            mag[ik] += s.scale * std::abs(dsv * qr[d]);
            err[iv] += ep * std::abs(dor[d]);
            mag[iv] += p * std::abs(dor[d]);
          }
        }
      }
    }
  const double n = static_cast<double>(group * T + 16);
  std::vector<double> bound(in.qkv_wide.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < hd + 2 * kvd; ++j) {
      const auto at = static_cast<std::size_t>(r * s.q_stride + j);
      bound[at] = (1 + u) * (err[at] + 1.01 * n * e * mag[at] + 2 * e * std::abs(want[at])) +
                  u * std::abs(want[at]) + a16;
    }
  }
  return bound;
}

// A backward's gradients (bits, the layout of q | k | v) against the reference and its bounds.
struct BackwardComparison {
  int failures[3] = {0, 0, 0};  // dq, dk, dv elements over their bound
  int padding_written = 0;
  double worst_ratio[3] = {0.0, 0.0, 0.0};  // largest error / bound
  double worst_error[3] = {0.0, 0.0, 0.0};
  double worst_bound[3] = {0.0, 0.0, 0.0};
  std::vector<std::string> first_failures;  // the first 3, described
};

// `got` holds the gradients' values (widened exactly from 16 bits, or a fast path's fp32).
inline BackwardComparison compare_backward(const FlashCase& c, const AttentionShape& s,
                                           const std::vector<double>& got,
                                           const std::vector<double>& want,
                                           const std::vector<double>& bounds) {
  const std::int64_t rows = c.batch * c.seq_len;
  const std::int64_t hd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const char* names[] = {"dq", "dk", "dv"};
  BackwardComparison res;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < s.q_stride; ++j) {
      const auto at = static_cast<std::size_t>(r * s.q_stride + j);
      if (j >= hd + 2 * kvd) {
        if (got[at] != 0.0) ++res.padding_written;
        continue;
      }
      const int which = j < hd ? 0 : (j < hd + kvd ? 1 : 2);
      const double bound = bounds[at];
      const double error = std::abs(got[at] - want[at]);
      if (!(error <= bound)) {
        ++res.failures[which];
        if (res.first_failures.size() < 3) {
          res.first_failures.push_back(
              std::string(names[which]) + " at row " + std::to_string(r) + ", column " +
              std::to_string(j) + ": got " + std::to_string(got[at]) + ", want " +
              std::to_string(want[at]) + " (bound " + std::to_string(bound) + ")");
        }
      } else if (bound > 0.0 && error / bound > res.worst_ratio[which]) {
        res.worst_ratio[which] = error / bound;
        res.worst_error[which] = error;
        res.worst_bound[which] = bound;
      }
    }
  }
  return res;
}

// The same for gradients as 16-bit bits of c's type.
inline BackwardComparison compare_backward(const FlashCase& c, const AttentionShape& s,
                                           const std::vector<std::uint16_t>& grad,
                                           const std::vector<double>& want,
                                           const std::vector<double>& bounds) {
  std::vector<double> got(grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i)
    got[i] = from_bits(grad[i], c.bf16);
  return compare_backward(c, s, got, want, bounds);
}

}  // namespace strata::kernels::flash_check
