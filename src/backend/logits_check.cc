// The start-up check of the head's logits in 16 bits alone (see logits_check.h).
#include "backend/logits_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"
#include "kernels/cpu/cast.h"

namespace strata::backend {
namespace {

constexpr std::int64_t kRows = 6;
constexpr std::int64_t kVocab = 150;  // not a multiple of 32: a partial warp
constexpr std::int64_t kLd = 152;     // the 16-bit rows padded to a multiple of 8, as the head's
constexpr std::int64_t kHidden = 40;
constexpr double kGradScale = 0.25;
constexpr std::uint16_t kPad = 0xffff;  // a NaN in bf16 and fp16: what the padding must keep

// The spacing of the type's values relative to their magnitude: one unit in the last place of v
// is at most this times |v|.
double ulp_relative(DType type) {
  return type == DType::kBF16 ? 0x1p-7 : 0x1p-10;
}

// The kRows x kVocab values of 16-bit rows kLd apart, widened and packed.
std::vector<float> widened(const std::vector<std::uint16_t>& h, DType type) {
  std::vector<float> f(static_cast<std::size_t>(kRows * kVocab));
  for (std::int64_t r = 0; r < kRows; ++r)
    kernels::cast_array(f.data() + r * kVocab, DType::kF32, h.data() + r * kLd, type, kVocab);
  return f;
}

// v rounded to the type and widened back.
std::vector<float> rounded(const std::vector<float>& v, DType type) {
  const auto n = static_cast<std::int64_t>(v.size());
  std::vector<std::uint16_t> h(v.size());
  std::vector<float> f(v.size());
  kernels::cast_array(h.data(), type, v.data(), DType::kF32, n);
  kernels::cast_array(f.data(), DType::kF32, h.data(), type, n);
  return f;
}

float largest(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v)
    m = std::max(m, std::fabs(x));
  return m;
}

// The first element of `got` outside rel * |want| + abs of `want` (a NaN is always outside).
Status within(const std::string& what, const std::vector<float>& got,
              const std::vector<float>& want, double rel, double abs) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double bound = rel * std::fabs(want[i]) + abs;
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(diff <= bound)) {
      return Status(ErrorCode::kInternal,
                    fmt::format("{} over {} rows of a {}-word vocabulary (hidden {}): element {} "
                                "is {}, the verified path gives {} (allowed difference {:.3g})",
                                what, kRows, kVocab, kHidden, i, got[i], want[i], bound));
    }
  }
  return Status::ok();
}

}  // namespace

Status check_narrow_logits(Backend& backend, const NarrowLogitsPath& path) {
  const DType type = path.type;
  if (type != DType::kBF16 && type != DType::kF16) {
    return Status(ErrorCode::kInvalidArgument, "the logits' 16-bit type must be bf16 or fp16");
  }
  std::mt19937_64 rng(4099);
  const std::vector<float> x = normal_values(rng, kRows * kHidden, 1.0f, 0.0f);
  const std::vector<float> w = normal_values(rng, kVocab * kHidden, 0.25f, 0.0f);
  const std::vector<std::int32_t> targets = {3, -1, 149, 0, 77, -1};
  const char* purpose = "16-bit logits check";
  const std::int64_t cells = kRows * kVocab;
  STRATA_ASSIGN_OR_RETURN(Buffer dx, device_copy(backend, x, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dw, device_copy(backend, w, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dtargets, device_copy(backend, targets, purpose));
  const std::vector<float> zero_cells(static_cast<std::size_t>(cells), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer logits32, device_copy(backend, zero_cells, purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer logits16,
      device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(kRows * kLd), kPad),
                  purpose));
  const std::vector<float> zero_rows(static_cast<std::size_t>(kRows), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer losses_got, device_copy(backend, zero_rows, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer losses_want, device_copy(backend, zero_rows, purpose));
  const std::vector<float> zero_dx(static_cast<std::size_t>(kRows * kHidden), 0.0f);
  const std::vector<float> zero_dw(static_cast<std::size_t>(kVocab * kHidden), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer dx_got, device_copy(backend, zero_dx, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dx_want, device_copy(backend, zero_dx, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dw_got, device_copy(backend, zero_dw, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dw_want, device_copy(backend, zero_dw, purpose));
  Ops<float>& ops = backend.ops_f32();
  const auto* t = dtargets.as<std::int32_t>();
  const double rel = ulp_relative(type);

  // The logits, both ways, and the path's loss alone (the logits stay).
  ops.gemm(false, true, kRows, kVocab, kHidden, 1.0f, dx.as<float>(), kHidden, dw.as<float>(),
           kHidden, 0.0f, logits32.as<float>(), kVocab);
  STRATA_TRY(path.to_narrow(false, true, kRows, kVocab, kHidden, dx.as<float>(), kHidden,
                            dw.as<float>(), kHidden, logits16.data(), kLd));
  STRATA_TRY(path.cross_entropy(false, logits16.data(), kLd, losses_got.as<float>(), t, kRows,
                                kVocab, kGradScale));
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  std::vector<float> fp32_logits(static_cast<std::size_t>(cells));
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(kRows * kLd));
  STRATA_TRY(copy_to_host(backend, &fp32_logits, logits32));
  STRATA_TRY(copy_to_host(backend, &bits, logits16));
  const std::vector<float> logits = widened(bits, type);
  const float scale = largest(fp32_logits);
  STRATA_TRY(within("the 16-bit logits", logits, rounded(fp32_logits, type), rel, 1e-6 * scale));

  // The verified cross-entropy of the same 16-bit logits.
  STRATA_ASSIGN_OR_RETURN(Buffer verified, device_copy(backend, logits, purpose));
  ops.cross_entropy_fused(verified.as<float>(), losses_want.as<float>(), t, kRows, kVocab,
                          kGradScale);
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  std::vector<float> want_losses(static_cast<std::size_t>(kRows)), got_losses(want_losses.size());
  std::vector<float> gradient(static_cast<std::size_t>(cells));
  STRATA_TRY(copy_to_host(backend, &want_losses, losses_want));
  STRATA_TRY(copy_to_host(backend, &got_losses, losses_got));
  STRATA_TRY(copy_to_host(backend, &gradient, verified));
  STRATA_TRY(within("the losses", got_losses, want_losses, 1e-5, 1e-6));

  // The path's loss and gradient, then its two products reading that gradient in 16 bits.
  STRATA_TRY(path.cross_entropy(true, logits16.data(), kLd, losses_got.as<float>(), t, kRows,
                                kVocab, kGradScale));
  STRATA_TRY(path.from_narrow(false, false, kRows, kHidden, kVocab, 1.0f, logits16.data(), kLd,
                              dw.as<float>(), kHidden, 0.0f, dx_got.as<float>(), kHidden));
  STRATA_TRY(path.from_narrow(true, false, kVocab, kHidden, kRows, 1.0f, logits16.data(), kLd,
                              dx.as<float>(), kHidden, 0.0f, dw_got.as<float>(), kHidden));
  const std::vector<float> gradient16 = rounded(gradient, type);
  STRATA_ASSIGN_OR_RETURN(Buffer verified16, device_copy(backend, gradient16, purpose));
  ops.gemm(false, false, kRows, kHidden, kVocab, 1.0f, verified16.as<float>(), kVocab,
           dw.as<float>(), kHidden, 0.0f, dx_want.as<float>(), kHidden);
  ops.gemm(true, false, kVocab, kHidden, kRows, 1.0f, verified16.as<float>(), kVocab,
           dx.as<float>(), kHidden, 0.0f, dw_want.as<float>(), kHidden);
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  STRATA_TRY(copy_to_host(backend, &got_losses, losses_got));
  STRATA_TRY(within("the losses with the gradient", got_losses, want_losses, 1e-5, 1e-6));
  STRATA_TRY(copy_to_host(backend, &bits, logits16));
  for (std::int64_t r = 0; r < kRows; ++r) {
    for (std::int64_t j = kVocab; j < kLd; ++j) {
      if (bits[static_cast<std::size_t>(r * kLd + j)] != kPad) {
        return Status(ErrorCode::kInternal,
                      fmt::format("row {} of the 16-bit logits was written past its {} words, at "
                                  "column {} (its rows are {} apart)",
                                  r, kVocab, j, kLd));
      }
    }
  }
  STRATA_TRY(within("the 16-bit gradient", widened(bits, type), gradient16, rel,
                    1e-6 * largest(gradient16)));
  std::vector<float> got_dx(zero_dx.size()), want_dx(zero_dx.size());
  std::vector<float> got_dw(zero_dw.size()), want_dw(zero_dw.size());
  STRATA_TRY(copy_to_host(backend, &got_dx, dx_got));
  STRATA_TRY(copy_to_host(backend, &want_dx, dx_want));
  STRATA_TRY(copy_to_host(backend, &got_dw, dw_got));
  STRATA_TRY(copy_to_host(backend, &want_dw, dw_want));
  STRATA_TRY(within("the input gradient", got_dx, want_dx, 0.0, largest(want_dx) / 64.0));
  return within("the weight gradient", got_dw, want_dw, 0.0, largest(want_dw) / 64.0);
}

}  // namespace strata::backend
