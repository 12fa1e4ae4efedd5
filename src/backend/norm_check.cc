// The start-up check of the fused residual + norm (see norm_check.h).
#include "backend/norm_check.h"

#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"

namespace strata::backend {
namespace {

struct Shape {
  std::int64_t rows, channels;
};

// The device arrays of one run: res (in and out), out, mean and rstd.
struct Run {
  Buffer res, out, mean, rstd;
};

Result<Run> prepare(Backend& backend, const std::vector<float>& res, std::int64_t rows) {
  Run r;
  const std::vector<float> zeros_out(res.size(), 0.0f), zeros_rows(static_cast<std::size_t>(rows));
  STRATA_ASSIGN_OR_RETURN(r.res, device_copy(backend, res, "residual norm check"));
  STRATA_ASSIGN_OR_RETURN(r.out, device_copy(backend, zeros_out, "residual norm check"));
  STRATA_ASSIGN_OR_RETURN(r.mean, device_copy(backend, zeros_rows, "residual norm check"));
  STRATA_ASSIGN_OR_RETURN(r.rstd, device_copy(backend, zeros_rows, "residual norm check"));
  return r;
}

// The first element of `name` where the two runs' bits differ.
Status compare(Backend& backend, const char* norm, const Shape& s, const char* name,
               const Buffer& want, const Buffer& got, std::int64_t n) {
  STRATA_ASSIGN_OR_RETURN(const BitsDiffer d, first_bits_differ(backend, want, got, n));
  if (d.index < 0) return Status::ok();
  return Status(ErrorCode::kInternal,
                fmt::format("{} over {} rows of {} channels: {}[{}] is {}, the verified path "
                            "gives {} (the bits must match)",
                            norm, s.rows, s.channels, name, d.index, d.got, d.want));
}

Status check_shape(Backend& backend, const ResidualNormPath& reference,
                   const ResidualNormPath& fused, const Shape& s, bool rms) {
  const std::int64_t n = s.rows * s.channels;
  std::mt19937_64 rng(9100 + static_cast<std::uint64_t>(n));
  auto draw = [&](std::int64_t count, float scale, float offset) {
    return normal_values(rng, count, scale, offset);
  };
  const std::vector<float> res0 = draw(n, 2.0f, 0.5f), x = draw(n, 1.0f, 0.0f);
  const std::vector<float> w = draw(s.channels, 0.2f, 1.0f), b = draw(s.channels, 0.1f, 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer dx, device_copy(backend, x, "residual norm check"));
  STRATA_ASSIGN_OR_RETURN(Buffer dw, device_copy(backend, w, "residual norm check"));
  STRATA_ASSIGN_OR_RETURN(Buffer db, device_copy(backend, b, "residual norm check"));
  STRATA_ASSIGN_OR_RETURN(Run want, prepare(backend, res0, s.rows));
  STRATA_ASSIGN_OR_RETURN(Run got, prepare(backend, res0, s.rows));
  const double eps = 1e-5;
  const char* norm = rms ? "RMSNorm" : "LayerNorm";
  const auto run = [&](const ResidualNormPath& path, Run& r) -> Status {
    if (rms) {
      return path.rmsnorm(r.res.as<float>(), dx.as<float>(), r.out.as<float>(), r.rstd.as<float>(),
                          dw.as<float>(), s.rows, s.channels, eps);
    }
    return path.layernorm(r.res.as<float>(), dx.as<float>(), r.out.as<float>(), r.mean.as<float>(),
                          r.rstd.as<float>(), dw.as<float>(), db.as<float>(), s.rows, s.channels,
                          eps);
  };
  STRATA_TRY(run(reference, want).with_context(fmt::format("{}: the verified path", norm)));
  STRATA_TRY(run(fused, got).with_context(fmt::format("{}: the fused path", norm)));
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  STRATA_TRY(compare(backend, norm, s, "res", want.res, got.res, n));
  STRATA_TRY(compare(backend, norm, s, "out", want.out, got.out, n));
  if (!rms) STRATA_TRY(compare(backend, norm, s, "mean", want.mean, got.mean, s.rows));
  return compare(backend, norm, s, "rstd", want.rstd, got.rstd, s.rows);
}

}  // namespace

Status check_residual_norm(Backend& backend, const ResidualNormPath& reference,
                           const ResidualNormPath& fused) {
  for (const bool rms : {false, true}) {
    for (const Shape s : {Shape{3, 768}, Shape{5, 33}})
      STRATA_TRY(check_shape(backend, reference, fused, s, rms));
  }
  return Status::ok();
}

}  // namespace strata::backend
