// The start-up check of a 16-bit attention fast path (see attention_check.h).
#include "backend/attention_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "backend/host_copies.h"

namespace strata::backend {
namespace {

namespace fc = kernels::flash_check;

std::vector<float> narrowed(const std::vector<double>& wide) {
  std::vector<float> f(wide.size());
  for (std::size_t i = 0; i < wide.size(); ++i)
    f[i] = static_cast<float>(wide[i]);  // exact: the values are 16-bit ones
  return f;
}

Status mismatch(const fc::FlashCase& c, const std::string& what) {
  return Status(ErrorCode::kInternal, fmt::format("case {}: {}", fc::case_name(c), what));
}

Status check_case(Backend& backend, const AttentionPath& path, const fc::FlashCase& c) {
  AttentionShape host_shape = fc::shape_of(c);
  const std::vector<std::int32_t> positions = fc::packed_positions(c);
  if (c.packed) host_shape.positions = positions.data();
  const std::int64_t rows = c.batch * c.seq_len;
  const std::int64_t hd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;

  std::mt19937_64 rng(7000 + static_cast<std::uint64_t>(c.seq_len * 131 + c.head_dim));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const fc::BackwardInputs in =
      fc::random_backward_inputs(c, host_shape, [&] { return unit(rng); });

  // Device inputs (fp32 holding the 16-bit values) and outputs (zero, so that a written padding
  // column shows).
  STRATA_ASSIGN_OR_RETURN(Buffer qkv,
                          device_copy(backend, narrowed(in.qkv_wide), "attention check"));
  STRATA_ASSIGN_OR_RETURN(Buffer pos, device_copy(backend, positions, "attention check"));
  const std::vector<float> zeros_out(static_cast<std::size_t>(rows * host_shape.out_stride), 0.0f);
  const std::vector<float> zeros_qkv(in.qkv_wide.size(), 0.0f);
  const std::vector<float> nan_lse(in.lse.size(), std::nanf(""));
  STRATA_ASSIGN_OR_RETURN(Buffer out, device_copy(backend, zeros_out, "attention check"));
  STRATA_ASSIGN_OR_RETURN(Buffer lse, device_copy(backend, nan_lse, "attention check"));
  AttentionShape shape = host_shape;
  if (c.packed) shape.positions = pos.as<std::int32_t>();
  const float* q = qkv.as<float>();

  // Forward, against attention_forward<double> within forward_bounds.
  STRATA_TRY(path.forward(out.as<float>(), lse.as<float>(), q, q + hd, q + hd + kvd, shape)
                 .with_context("forward"));
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  std::vector<float> got_out(zeros_out.size()), got_lse(in.lse.size());
  STRATA_TRY(copy_to_host(backend, &got_out, out));
  STRATA_TRY(copy_to_host(backend, &got_lse, lse));
  std::vector<double> want(got_out.size(), 0.0), want_lse(got_lse.size(), 0.0);
  const double* qw = in.qkv_wide.data();
  kernels::attention_forward<double>(want.data(), want_lse.data(), qw, qw + hd, qw + hd + kvd,
                                     host_shape);
  double v_max = 0.0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = hd + kvd; j < hd + 2 * kvd; ++j)
      v_max = std::max(v_max, std::abs(qw[r * host_shape.q_stride + j]));
  const fc::ForwardBounds bounds =
      fc::forward_bounds(c, host_shape, qw, v_max, /*all_earlier_keys=*/true);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < host_shape.out_stride; ++j) {
      const auto at = static_cast<std::size_t>(r * host_shape.out_stride + j);
      const double got = got_out[at];
      if (j >= hd) {
        if (got != 0.0) return mismatch(c, fmt::format("out row {} wrote padding column {}", r, j));
        continue;
      }
      if (!(std::abs(got - want[at]) <= bounds.out)) {
        return mismatch(c, fmt::format("out row {}, column {}: got {}, want {} (bound {:.3g})", r,
                                       j, got, want[at], bounds.out));
      }
    }
  }
  for (std::size_t i = 0; i < got_lse.size(); ++i) {
    const double bound = bounds.lse(want_lse[i]);
    if (!(std::abs(static_cast<double>(got_lse[i]) - want_lse[i]) <= bound)) {
      return mismatch(c, fmt::format("lse {}: got {}, want {} (bound {:.3g})", i, got_lse[i],
                                     want_lse[i], bound));
    }
  }

  // The forward's buffers go back first: the check runs before the model takes the arena, but a
  // small device budget (configs/demo.json's 8 MiB) has little room beside the workspaces.
  out.reset();
  lse.reset();

  // Backward from the inputs' 16-bit out and dO and fp32 lse, against attention_backward<double>
  // within backward_bounds, element by element.
  STRATA_ASSIGN_OR_RETURN(Buffer out16,
                          device_copy(backend, narrowed(in.out_wide), "attention check"));
  STRATA_ASSIGN_OR_RETURN(Buffer dout,
                          device_copy(backend, narrowed(in.dout_wide), "attention check"));
  STRATA_ASSIGN_OR_RETURN(Buffer lse32, device_copy(backend, in.lse, "attention check"));
  STRATA_ASSIGN_OR_RETURN(Buffer grad, device_copy(backend, zeros_qkv, "attention check"));
  float* g = grad.as<float>();
  STRATA_TRY(path.backward(g, g + hd, g + hd + kvd, dout.as<float>(), out16.as<float>(),
                           lse32.as<float>(), q, q + hd, q + hd + kvd, shape)
                 .with_context("backward"));
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  std::vector<float> got_grad(zeros_qkv.size());
  STRATA_TRY(copy_to_host(backend, &got_grad, grad));
  const std::vector<double> want_grad = fc::backward_reference(c, host_shape, in);
  const std::vector<double> grad_bounds = fc::backward_bounds(c, host_shape, in, want_grad);
  const fc::BackwardComparison cmp = fc::compare_backward(
      c, host_shape, std::vector<double>(got_grad.begin(), got_grad.end()), want_grad, grad_bounds);
  if (cmp.padding_written > 0) {
    return mismatch(c, fmt::format("the backward wrote {} padding elements", cmp.padding_written));
  }
  if (!cmp.first_failures.empty()) {
    return mismatch(
        c, fmt::format("{} dq, {} dk, {} dv elements over their bounds; first: {}", cmp.failures[0],
                       cmp.failures[1], cmp.failures[2], cmp.first_failures.front()));
  }
  return Status::ok();
}

}  // namespace

std::vector<kernels::flash_check::FlashCase> attention_check_cases(bool bf16, std::int64_t head_dim,
                                                                   bool documents) {
  // Partial key and query tiles (70 and 80 are not multiples of 64), GQA 2:1 over two batch rows
  // (of packed documents where the path takes them), and 2:1 with a window of 33 keys.
  return {{bf16, 2, 70, 4, 2, head_dim, 0, documents}, {bf16, 1, 80, 2, 1, head_dim, 33, false}};
}

Status check_attention_path(Backend& backend, const AttentionPath& path, bool bf16,
                            std::int64_t head_dim, bool documents) {
  for (const fc::FlashCase& c : attention_check_cases(bf16, head_dim, documents))
    STRATA_TRY(check_case(backend, path, c));
  return Status::ok();
}

namespace {

// Checks `check` for each of `sizes` and lists `name` on for those that passed (covers: "LABEL,
// head sizes ...; OTHERS", and the failures), off when none did, with one warning for the failures
// while it stays on. Returns the sizes that passed.
std::vector<std::int64_t> choose_head_sizes(FastPaths& paths, const char* name,
                                            const char* replaces, const std::string& label,
                                            const std::vector<std::int64_t>& sizes,
                                            const std::string& others,
                                            const std::function<Status(std::int64_t)>& check) {
  std::vector<std::int64_t> passed;
  std::string failed;
  for (const std::int64_t d : sizes) {
    const Status result = check(d);
    if (result.is_ok()) {
      passed.push_back(d);
    } else {
      failed +=
          fmt::format("{}head size {}: {}", failed.empty() ? "" : "; ", d, result.to_string());
    }
  }
  std::string covers = fmt::format("{}, head sizes {}; {}", label, fmt::join(passed, ", "), others);
  if (!failed.empty()) covers += fmt::format(" (failed their check: {})", failed);
  paths.adopt(name, replaces, covers, [&]() -> Status {
    if (passed.empty()) return Status(ErrorCode::kInternal, failed);
    return Status::ok();
  });
  if (!passed.empty() && !failed.empty()) {
    paths.warn(fmt::format("fast path {} is off for some head sizes, where {} run instead: {}",
                           name, replaces, failed));
  }
  return paths.active(name) ? passed : std::vector<std::int64_t>{};
}

}  // namespace

std::vector<std::int64_t> choose_flash_attention(
    FastPaths& paths, bool sixteen_bit, bool bf16,
    const std::function<Status(std::int64_t head_dim)>& check,
    const std::vector<std::int64_t>& wanted) {
  if (!sixteen_bit) {
    paths.not_applicable(kFlashAttentionName, kFlashAttentionReplaces,
                         "GEMM inputs are fp32 or tf32, so attention stays fp32 "
                         "(strata.gemm_precision bf16 or fp16 turns it on)");
    return {};
  }
  std::vector<std::int64_t> sizes;
  for (const std::int64_t d : kFlashHeadSizes) {
    if (wanted.empty() || std::find(wanted.begin(), wanted.end(), d) != wanted.end()) {
      sizes.push_back(d);
    }
  }
  if (sizes.empty()) {
    paths.not_applicable(kFlashAttentionName, kFlashAttentionReplaces,
                         fmt::format("the run's head sizes ({}) have no flash kernels (they are "
                                     "{})",
                                     fmt::join(wanted, ", "), fmt::join(kFlashHeadSizes, ", ")));
    return {};
  }
  return choose_head_sizes(paths, kFlashAttentionName, kFlashAttentionReplaces,
                           bf16 ? "bf16" : "fp16", sizes, "other head sizes run the fp32 kernels",
                           check);
}

std::vector<std::int64_t> choose_cudnn_attention(
    FastPaths& paths, const std::vector<std::int64_t>& flash_sizes, bool bf16,
    const Status& library, const std::function<Status(std::int64_t head_dim)>& check) {
  if (flash_sizes.empty()) {
    paths.not_applicable(kCudnnAttentionName, kCudnnAttentionReplaces,
                         fmt::format("{} is off, and the cuDNN attention runs only over it (the "
                                     "calls it declines fall back to it)",
                                     kFlashAttentionName));
    return {};
  }
  if (!library.is_ok()) {
    paths.not_applicable(kCudnnAttentionName, kCudnnAttentionReplaces, library.to_string());
    return {};
  }
  return choose_head_sizes(
      paths, kCudnnAttentionName, kCudnnAttentionReplaces,
      fmt::format("cuDNN's fused attention, {}", bf16 ? "bf16" : "fp16"), flash_sizes,
      fmt::format("packed documents and shapes whose cuDNN plan is not built or needs more "
                  "workspace run {}",
                  kFlashAttentionName),
      check);
}

}  // namespace strata::backend
