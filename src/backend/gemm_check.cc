// The start-up check of a GEMM with a fused bias (see gemm_check.h).
#include "backend/gemm_check.h"

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/host_copies.h"
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

// The fused call a check runs: one of the three.
struct Fused {
  const GemmBiasFn* bias = nullptr;      // C = product + bias
  const GemmBiasGeluFn* gelu = nullptr;  // pre and act
  const GemmDgeluFn* dgelu = nullptr;    // dpre = product ∘ GELU'(pre)
};

// One case of a check.
Status check_case(Backend& backend, const Fused& fused, bool fp16, const Case& c) {
  const GemmBiasFn* bias_fn = fused.bias;
  const GemmBiasGeluFn* gelu_fn = fused.gelu;
  std::mt19937_64 rng(static_cast<std::uint64_t>(c.m * 1000003 + c.n * 101 + c.k) +
                      (c.trans_a ? 7u : 0u) + (c.trans_b ? 13u : 0u));
  // A stored (m, k) or, transposed, (k, m); B (k, n) or (n, k); leading dimensions padded by 3.
  const std::int64_t lda = (c.trans_a ? c.m : c.k) + 3, ldb = (c.trans_b ? c.k : c.n) + 3;
  const std::vector<float> a =
      draw(static_cast<std::size_t>((c.trans_a ? c.k : c.m) * lda), fp16, rng);
  const std::vector<float> b =
      draw(static_cast<std::size_t>((c.trans_b ? c.n : c.k) * ldb), fp16, rng);
  const std::vector<float> bias = draw(static_cast<std::size_t>(c.n), fp16, rng);
  // DGELU's pre-activation, fp32 in [-4, 4): both tails and the knee of GELU'.
  std::vector<float> pre(static_cast<std::size_t>(c.m * c.n));
  std::uniform_real_distribution<float> wide(-4.0f, 4.0f);
  for (float& x : pre)
    x = wide(rng);
  STRATA_ASSIGN_OR_RETURN(Buffer dpre_in, device_copy(backend, pre, "GEMM check"));
  STRATA_ASSIGN_OR_RETURN(Buffer da, device_copy(backend, a, "GEMM check"));
  STRATA_ASSIGN_OR_RETURN(Buffer db, device_copy(backend, b, "GEMM check"));
  STRATA_ASSIGN_OR_RETURN(Buffer dbias, device_copy(backend, bias, "GEMM check"));
  std::vector<float> out(static_cast<std::size_t>(c.m * c.n), std::nanf(""));
  std::vector<float> act(out.size(), std::nanf(""));
  STRATA_ASSIGN_OR_RETURN(Buffer dc, device_copy(backend, out, "GEMM check"));
  STRATA_ASSIGN_OR_RETURN(Buffer dact, device_copy(backend, act, "GEMM check"));
  const std::string name =
      fmt::format("m={} n={} k={}{}{}", c.m, c.n, c.k, c.trans_a ? ", A transposed" : "",
                  c.trans_b ? ", B transposed" : "");
  Result<bool> ran =
      bias_fn != nullptr ? (*bias_fn)(c.trans_a, c.trans_b, c.m, c.n, c.k, da.as<float>(), lda,
                                      db.as<float>(), ldb, dbias.as<float>(), dc.as<float>())
      : gelu_fn != nullptr
          ? (*gelu_fn)(c.trans_a, c.trans_b, c.m, c.n, c.k, da.as<float>(), lda, db.as<float>(),
                       ldb, dbias.as<float>(), dc.as<float>(), dact.as<float>())
          : (*fused.dgelu)(c.trans_a, c.trans_b, c.m, c.n, c.k, da.as<float>(), lda, db.as<float>(),
                           ldb, dpre_in.as<float>(), dc.as<float>());
  if (!ran.is_ok()) return ran.status().with_context(name);
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  if (!*ran) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{}: the epilogue did not run (no algorithm with it)", name));
  }
  STRATA_TRY(copy_to_host(backend, &out, dc));
  STRATA_TRY(copy_to_host(backend, &act, dact));
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.n; ++j) {
      double sum = fused.dgelu != nullptr ? 0.0 : bias[static_cast<std::size_t>(j)];
      double mag = std::abs(sum);
      for (std::int64_t p = 0; p < c.k; ++p) {
        const double x = a[static_cast<std::size_t>(c.trans_a ? p * lda + i : i * lda + p)];
        const double y = b[static_cast<std::size_t>(c.trans_b ? j * ldb + p : p * ldb + j)];
        sum += x * y;
        mag += std::abs(x * y);
      }
      const double bound = static_cast<double>(c.k + 2) * std::ldexp(1.0, -24) * mag;
      const auto at = static_cast<std::size_t>(i * c.n + j);
      const double got = out[at];
      if (fused.dgelu != nullptr) {
        const double slope = gelu_slope(pre[at]);
        const double want = sum * slope;
        const double dbound = std::abs(slope) * bound +
                              std::ldexp(1.0, -20) * std::abs(sum) * (1.0 + std::abs(slope)) +
                              std::ldexp(1.0, -24);
        if (!(std::abs(got - want) <= dbound)) {
          return Status(ErrorCode::kInternal,
                        fmt::format("{}: dpre[{}][{}] = {}, want {} x GELU'({}) = {} (bound "
                                    "{:.3g})",
                                    name, i, j, got, sum, pre[at], want, dbound));
        }
        continue;
      }
      if (!(std::abs(got - sum) <= bound)) {
        return Status(ErrorCode::kInternal,
                      fmt::format("{}: {}[{}][{}] = {}, want {} (bound {:.3g})", name,
                                  gelu_fn != nullptr ? "pre" : "C", i, j, got, sum, bound));
      }
      if (gelu_fn == nullptr) continue;
      const double want = gelu(sum);
      const double act_bound = std::abs(gelu_slope(sum)) * bound +
                               std::ldexp(1.0, -20) * (std::abs(want) + std::abs(sum)) +
                               std::ldexp(1.0, -24);
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

}  // namespace strata::backend
