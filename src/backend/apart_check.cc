// The start-up check of the parameters kept apart (see apart_check.h).
#include "backend/apart_check.h"

#include <fmt/format.h>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"

namespace strata::backend {
namespace {

constexpr std::int64_t kRows = 3;
constexpr std::int64_t kChannels = 40;  // not a multiple of 32: a partial warp
constexpr std::int64_t kInner = 24;     // the product's inner dimension

// The first element where the two outputs' bits differ (a NaN: a read of the copy).
Status compare(Backend& backend, const char* op, const Buffer& want, const Buffer& got,
               std::int64_t n) {
  STRATA_ASSIGN_OR_RETURN(const BitsDiffer d, first_bits_differ(backend, want, got, n));
  if (d.index < 0) return Status::ok();
  return Status(ErrorCode::kInternal,
                fmt::format("{} over {} rows of {} channels, its parameters kept apart: "
                            "output[{}] is {}, reading them in place gives {} (the bits must "
                            "match)",
                            op, kRows, kChannels, d.index, d.got, d.want));
}

}  // namespace

Status check_kept_apart(Backend& backend, const KeptApartPath& path) {
  std::mt19937_64 rng(9301);
  auto draw = [&](std::int64_t count, float scale, float offset) {
    return normal_values(rng, count, scale, offset);
  };
  // The unit's copy: LayerNorm's weight and bias side by side, a matrix (8 elements, never read
  // by these ops), then the bias; all NaN, as nothing was widened into it. Apart, packed: weight,
  // bias, bias of the product.
  const std::int64_t begin[2] = {0, 2 * kChannels + 8};
  const std::int64_t count[2] = {2 * kChannels, kChannels};
  const std::int64_t at[2] = {0, 2 * kChannels};
  const std::vector<float> nan(static_cast<std::size_t>(3 * kChannels + 8),
                               std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> params = draw(3 * kChannels, 0.2f, 0.5f);
  const std::vector<float> x = draw(kRows * kChannels, 1.5f, 0.25f);
  const std::vector<float> a = draw(kRows * kInner, 1.0f, 0.0f);
  const std::vector<float> b = draw(kInner * kChannels, 0.2f, 0.0f);
  const std::vector<float> zeros(static_cast<std::size_t>(kRows * kChannels), 0.0f);
  const char* purpose = "parameters-apart check";
  STRATA_ASSIGN_OR_RETURN(Buffer copy, device_copy(backend, nan, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer apart, device_copy(backend, params, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dx, device_copy(backend, x, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer da, device_copy(backend, a, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer db, device_copy(backend, b, purpose));
  Buffer want[3], got[3], stats[4];
  for (int i = 0; i < 3; ++i) {
    STRATA_ASSIGN_OR_RETURN(want[i], device_copy(backend, zeros, purpose));
    STRATA_ASSIGN_OR_RETURN(got[i], device_copy(backend, zeros, purpose));
  }
  for (Buffer& s : stats) {
    STRATA_ASSIGN_OR_RETURN(s, device_copy(backend, zeros, purpose));
  }
  Ops<float>& ops = backend.ops_f32();
  const double eps = 1e-5;
  // The three ops reading w, beta and bias at the given addresses.
  const auto run = [&](Buffer* out, const float* w, const float* beta, const float* bias) {
    ops.layernorm_forward(out[0].as<float>(), stats[0].as<float>(), stats[1].as<float>(),
                          dx.as<float>(), w, beta, kRows, kChannels, eps);
    ops.rmsnorm_forward(out[1].as<float>(), stats[2].as<float>(), dx.as<float>(), w, kRows,
                        kChannels, eps);
    ops.gemm_bias(false, false, kRows, kChannels, kInner, da.as<float>(), kInner, db.as<float>(),
                  kChannels, bias, out[2].as<float>());
  };
  const float* in_apart = apart.as<float>();
  run(want, in_apart, in_apart + kChannels, in_apart + 2 * kChannels);
  float* wide = copy.as<float>();
  if (!path.note(wide, in_apart, begin, count, at, 2)) {
    return Status(ErrorCode::kUnavailable, "the backend refused to keep the parameters apart");
  }
  run(got, wide + begin[0], wide + begin[0] + kChannels, wide + begin[1]);
  path.forget(wide);
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  const std::int64_t n = kRows * kChannels;
  STRATA_TRY(compare(backend, "LayerNorm", want[0], got[0], n));
  STRATA_TRY(compare(backend, "RMSNorm", want[1], got[1], n));
  return compare(backend, "a product with a bias", want[2], got[2], n);
}

}  // namespace strata::backend
