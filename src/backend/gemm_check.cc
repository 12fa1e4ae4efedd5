// The start-up check of a GEMM with a fused bias (see gemm_check.h).
#include "backend/gemm_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/host_copies.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/float16.h"

namespace strata::backend {
namespace {

struct Case {
  bool trans_a, trans_b;
  std::int64_t m, n, k;
};

// Uniform in [-1, 1), rounded to the 16-bit type and widened.
std::vector<float> draw(std::size_t count, bool fp16, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) {
    const float f = unit(rng);
    x = fp16 ? kernels::fp16_to_float(kernels::float_to_fp16(f))
             : kernels::bf16_to_float(kernels::float_to_bf16(f));
  }
  return v;
}

// The GELU of the model (tanh form), in double.
double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_slope(double x) {
  const double inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double t = std::tanh(inner);
  return 0.5 * (1.0 + t) +
         0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

// The fused call a check runs: one of the five.
struct Fused {
  const GemmBiasFn* bias = nullptr;          // C = product + bias
  const GemmBiasGeluFn* gelu = nullptr;      // pre and act
  const GemmDgeluFn* dgelu = nullptr;        // dpre = product ∘ GELU'(pre)
  const GemmBiasGelu16Fn* gelu16 = nullptr;  // pre and act in 16 bits
  const GemmDgelu16Fn* dgelu16 = nullptr;    // dpre in 16 bits, from pre in 16 bits
  const GemmResidualFn* residual = nullptr;  // C = product (+ bias) + R
  bool no_bias = false;                      // the residual's case without a bias
};

// One unit in the last place of the 16-bit type at magnitude x (bf16: 8 significant bits; fp16:
// 11, and no finer than its subnormals' 2^-24).
double ulp16(double x, bool fp16) {
  const int e = x > 0.0 ? std::ilogb(x) : -126;
  return fp16 ? std::ldexp(1.0, std::max(e, -14) - 10) : std::ldexp(1.0, e - 7);
}

// How far GELU' may move within the rounding interval of a 16-bit pre-activation x (half a unit in
// its last place either side): |GELU''| at most at x and at both ends (numerically, in double)
// times that half unit.
double slope_spread(double x, bool fp16) {
  const double h = 0.5 * ulp16(std::abs(x), fp16);
  const auto curvature = [](double y) {
    const double d = 1e-4;
    return std::abs(gelu_slope(y + d) - gelu_slope(y - d)) / (2.0 * d);
  };
  return std::max({curvature(x - h), curvature(x), curvature(x + h)}) * h;
}

// v rounded to the 16-bit type, and 16-bit values widened (kernels::cast_array).
std::vector<std::uint16_t> to_16(const std::vector<float>& v, bool fp16) {
  std::vector<std::uint16_t> out(v.size());
  kernels::cast_array(out.data(), fp16 ? DType::kF16 : DType::kBF16, v.data(), DType::kF32,
                      static_cast<std::int64_t>(v.size()));
  return out;
}

std::vector<float> widen(const std::vector<std::uint16_t>& v, bool fp16) {
  std::vector<float> out(v.size());
  kernels::cast_array(out.data(), DType::kF32, v.data(), fp16 ? DType::kF16 : DType::kBF16,
                      static_cast<std::int64_t>(v.size()));
  return out;
}

// One case of a check.
Status check_case(Backend& backend, const Fused& fused, bool fp16, const Case& c) {
  const GemmBiasFn* bias_fn = fused.bias;
  const bool gelu_fn = fused.gelu != nullptr || fused.gelu16 != nullptr;
  const bool dgelu_fn = fused.dgelu != nullptr || fused.dgelu16 != nullptr;
  const bool narrow = fused.gelu16 != nullptr || fused.dgelu16 != nullptr;
  std::mt19937_64 rng(static_cast<std::uint64_t>(c.m * 1000003 + c.n * 101 + c.k) +
                      (c.trans_a ? 7u : 0u) + (c.trans_b ? 13u : 0u));
  // A stored (m, k) or, transposed, (k, m); B (k, n) or (n, k); leading dimensions padded by 3.
  const std::int64_t lda = (c.trans_a ? c.m : c.k) + 3, ldb = (c.trans_b ? c.k : c.n) + 3;
  const std::vector<float> a =
      draw(static_cast<std::size_t>((c.trans_a ? c.k : c.m) * lda), fp16, rng);
  const std::vector<float> b =
      draw(static_cast<std::size_t>((c.trans_b ? c.n : c.k) * ldb), fp16, rng);
  const std::vector<float> bias = draw(static_cast<std::size_t>(c.n), fp16, rng);
  const std::vector<float> residual = draw(static_cast<std::size_t>(c.m * c.n), fp16, rng);
  // The arrays only some checks read are copied to the device for those alone.
  Buffer dres, dpre_in16, dc16, dact16;
  if (fused.residual != nullptr) {
    STRATA_ASSIGN_OR_RETURN(dres, device_copy(backend, residual, "GEMM check"));
  }
  // DGELU's pre-activation, fp32 in [-4, 4): both tails and the knee of GELU'.
  std::vector<float> pre(static_cast<std::size_t>(c.m * c.n));
  std::uniform_real_distribution<float> wide(-4.0f, 4.0f);
  for (float& x : pre)
    x = wide(rng);
  // Read in 16 bits by the 16-bit DGELU: its values are those of the 16-bit type.
  if (narrow) pre = widen(to_16(pre, fp16), fp16);
  STRATA_ASSIGN_OR_RETURN(Buffer dpre_in, device_copy(backend, pre, "GEMM check"));
  STRATA_ASSIGN_OR_RETURN(Buffer da, device_copy(backend, a, "GEMM check"));
  STRATA_ASSIGN_OR_RETURN(Buffer db, device_copy(backend, b, "GEMM check"));
  STRATA_ASSIGN_OR_RETURN(Buffer dbias, device_copy(backend, bias, "GEMM check"));
  std::vector<float> out(static_cast<std::size_t>(c.m * c.n), std::nanf(""));
  std::vector<float> act(out.size(), std::nanf(""));
  STRATA_ASSIGN_OR_RETURN(Buffer dc, device_copy(backend, out, "GEMM check"));
  STRATA_ASSIGN_OR_RETURN(Buffer dact, device_copy(backend, act, "GEMM check"));
  if (narrow) {
    STRATA_ASSIGN_OR_RETURN(dpre_in16, device_copy(backend, to_16(pre, fp16), "GEMM check"));
    STRATA_ASSIGN_OR_RETURN(dc16, device_copy(backend, to_16(out, fp16), "GEMM check"));
    STRATA_ASSIGN_OR_RETURN(dact16, device_copy(backend, to_16(act, fp16), "GEMM check"));
  }
  const std::string name =
      fmt::format("m={} n={} k={}{}{}{}", c.m, c.n, c.k, c.trans_a ? ", A transposed" : "",
                  c.trans_b ? ", B transposed" : "", fused.no_bias ? ", no bias" : "");
  const float* a_in = da.as<float>();
  const float* b_in = db.as<float>();
  Result<bool> ran = bias_fn != nullptr ? (*bias_fn)(c.trans_a, c.trans_b, c.m, c.n, c.k, a_in, lda,
                                                     b_in, ldb, dbias.as<float>(), dc.as<float>())
                     : fused.gelu != nullptr
                         ? (*fused.gelu)(c.trans_a, c.trans_b, c.m, c.n, c.k, a_in, lda, b_in, ldb,
                                         dbias.as<float>(), dc.as<float>(), dact.as<float>())
                     : fused.dgelu != nullptr
                         ? (*fused.dgelu)(c.trans_a, c.trans_b, c.m, c.n, c.k, a_in, lda, b_in, ldb,
                                          dpre_in.as<float>(), dc.as<float>())
                     : fused.residual != nullptr
                         ? (*fused.residual)(c.trans_a, c.trans_b, c.m, c.n, c.k, a_in, lda, b_in,
                                             ldb, fused.no_bias ? nullptr : dbias.as<float>(),
                                             dres.as<float>(), dc.as<float>())
                     : fused.gelu16 != nullptr
                         ? (*fused.gelu16)(c.trans_a, c.trans_b, c.m, c.n, c.k, a_in, lda, b_in,
                                           ldb, dbias.as<float>(), dc16.data(), dact16.data())
                         : (*fused.dgelu16)(c.trans_a, c.trans_b, c.m, c.n, c.k, a_in, lda, b_in,
                                            ldb, dpre_in16.data(), dc16.data());
  if (!ran.is_ok()) return ran.status().with_context(name);
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  if (!*ran) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{}: the epilogue did not run (no algorithm with it)", name));
  }
  if (narrow) {
    std::vector<std::uint16_t> out16(out.size()), act16(act.size());
    STRATA_TRY(copy_to_host(backend, &out16, dc16));
    STRATA_TRY(copy_to_host(backend, &act16, dact16));
    out = widen(out16, fp16);
    act = widen(act16, fp16);
  } else {
    STRATA_TRY(copy_to_host(backend, &out, dc));
    STRATA_TRY(copy_to_host(backend, &act, dact));
  }
  // A 16-bit result is the fp32 one rounded once: one unit in its last place more, with room.
  const auto rounding = [&](double want, double bound) {
    return narrow ? ulp16(std::abs(want) + bound, fp16) : 0.0;
  };
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.n; ++j) {
      double sum = dgelu_fn || fused.no_bias ? 0.0 : bias[static_cast<std::size_t>(j)];
      double mag = std::abs(sum);
      if (fused.residual != nullptr) {
        const double r = residual[static_cast<std::size_t>(i * c.n + j)];
        sum += r;
        mag += std::abs(r);
      }
      for (std::int64_t p = 0; p < c.k; ++p) {
        const double x = a[static_cast<std::size_t>(c.trans_a ? p * lda + i : i * lda + p)];
        const double y = b[static_cast<std::size_t>(c.trans_b ? j * ldb + p : p * ldb + j)];
        sum += x * y;
        mag += std::abs(x * y);
      }
      const double bound = static_cast<double>(c.k + 2) * std::ldexp(1.0, -24) * mag;
      const auto at = static_cast<std::size_t>(i * c.n + j);
      const double got = out[at];
      if (dgelu_fn) {
        const double slope = gelu_slope(pre[at]);
        const double want = sum * slope;
        double dbound = std::abs(slope) * bound +
                        std::ldexp(1.0, -20) * std::abs(sum) * (1.0 + std::abs(slope)) +
                        std::ldexp(1.0, -24);
        // A 16-bit pre-activation stands for any value it is the rounding of: GELU' anywhere in
        // that interval is as good.
        if (narrow) dbound += std::abs(sum) * slope_spread(pre[at], fp16);
        dbound += rounding(want, dbound);
        if (!(std::abs(got - want) <= dbound)) {
          return Status(ErrorCode::kInternal,
                        fmt::format("{}: dpre[{}][{}] = {}, want {} x GELU'({}) = {} (bound "
                                    "{:.3g})",
                                    name, i, j, got, sum, pre[at], want, dbound));
        }
        continue;
      }
      const double pre_bound = bound + rounding(sum, bound);
      if (!(std::abs(got - sum) <= pre_bound)) {
        return Status(ErrorCode::kInternal,
                      fmt::format("{}: {}[{}][{}] = {}, want {} (bound {:.3g})", name,
                                  gelu_fn ? "pre" : "C", i, j, got, sum, pre_bound));
      }
      if (!gelu_fn) continue;
      const double want = gelu(sum);
      double act_bound = std::abs(gelu_slope(sum)) * pre_bound +
                         std::ldexp(1.0, -20) * (std::abs(want) + std::abs(sum)) +
                         std::ldexp(1.0, -24);
      act_bound += rounding(want, act_bound);
      if (!(std::abs(act[at] - want) <= act_bound)) {
        return Status(ErrorCode::kInternal,
                      fmt::format("{}: act[{}][{}] = {}, want GELU({}) = {} (bound {:.3g})", name,
                                  i, j, act[at], sum, want, act_bound));
      }
    }
  }
  return Status::ok();
}

// Runs `run_case` on the checks' shapes, every transposition; the first failure.
template <typename RunCase>
Status each_case(RunCase&& run_case) {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      STRATA_TRY(run_case(Case{ta, tb, 70, 96, 64}));
      STRATA_TRY(run_case(Case{ta, tb, 33, 200, 40}));
    }
  return Status::ok();
}

}  // namespace

Status check_gemm_bias(Backend& backend, const GemmBiasFn& fused, bool fp16_inputs) {
  return each_case(
      [&](const Case& c) { return check_case(backend, Fused{&fused}, fp16_inputs, c); });
}

Status check_gemm_bias_gelu(Backend& backend, const GemmBiasGeluFn& fused, bool fp16_inputs) {
  return each_case([&](const Case& c) {
    return check_case(backend, Fused{nullptr, &fused}, fp16_inputs, c);
  });
}

Status check_gemm_dgelu(Backend& backend, const GemmDgeluFn& fused, bool fp16_inputs) {
  return each_case([&](const Case& c) {
    return check_case(backend, Fused{nullptr, nullptr, &fused}, fp16_inputs, c);
  });
}

Status check_gemm_residual(Backend& backend, const GemmResidualFn& fused, bool fp16_inputs) {
  return each_case([&](const Case& c) -> Status {
    for (const bool no_bias : {false, true}) {
      Fused f;
      f.residual = &fused;
      f.no_bias = no_bias;
      STRATA_TRY(check_case(backend, f, fp16_inputs, c));
    }
    return Status::ok();
  });
}

Status check_gemm_bias_gelu_16(Backend& backend, const GemmBiasGelu16Fn& fused, bool fp16_inputs) {
  return each_case([&](const Case& c) {
    return check_case(backend, Fused{nullptr, nullptr, nullptr, &fused}, fp16_inputs, c);
  });
}

Status check_gemm_dgelu_16(Backend& backend, const GemmDgelu16Fn& fused, bool fp16_inputs) {
  return each_case([&](const Case& c) {
    return check_case(backend, Fused{nullptr, nullptr, nullptr, nullptr, &fused}, fp16_inputs, c);
  });
}

}  // namespace strata::backend
