// The start-up check of the norms' output gradient kept in 16 bits alone (see norm_grad_check.h).
#include "backend/norm_grad_check.h"

#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"

namespace strata::backend {
namespace {

constexpr std::int64_t kIns = 24;  // the product's k (the projection's width)

struct Shape {
  std::int64_t rows, channels;
};

Status check_shape(Backend& backend, const NormGradAlonePath& path, const Shape& s) {
  Ops<float>& ops = backend.ops_f32();
  const std::int64_t n = s.rows * s.channels;
  std::mt19937_64 rng(7500 + static_cast<std::uint64_t>(s.channels));
  const char* purpose = "norm_grad_16bit check";
  const std::string where = fmt::format("{} rows of {} channels", s.rows, s.channels);
  // The norm's input and parameters, and its statistics from the verified forward.
  STRATA_ASSIGN_OR_RETURN(Buffer x,
                          device_copy(backend, normal_values(rng, n, 1.5f, 0.3f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer w, device_copy(backend, normal_values(rng, s.channels, 0.5f, 1.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer b, device_copy(backend, normal_values(rng, s.channels, 0.5f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer dy, device_copy(backend, normal_values(rng, s.rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer weight,
      device_copy(backend, normal_values(rng, kIns * s.channels, 0.4f, 0.0f), purpose));
  const std::vector<float> dx0 = normal_values(rng, n, 1.0f, 0.0f);
  const std::vector<float> dw0 = normal_values(rng, 2 * s.channels, 1.0f, 0.0f);
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer out, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer stats, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer product, device_copy(backend, zeros, purpose));
  Buffer grads[2];  // dx, then dw and db, for the verified backward and the path's
  for (Buffer& g : grads) {
    STRATA_ASSIGN_OR_RETURN(
        g, device_copy(backend, std::vector<float>(dx0.size() + dw0.size()), purpose));
  }
  STRATA_ASSIGN_OR_RETURN(
      Buffer companion,
      device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0), purpose));
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_ASSIGN_OR_RETURN(
      float* key, pairs.alone(companion.data(), n, "the norm_grad_16bit check's key", where));
  float* mean = stats.as<float>();
  float* rstd = mean + s.rows;
  ops.layernorm_forward(out.as<float>(), mean, rstd, x.as<float>(), w.as<float>(), b.as<float>(),
                        s.rows, s.channels, 1e-5);

  for (const bool trans_b : {true, false}) {
    const std::string layout = fmt::format(
        "{}, {}", where, trans_b ? "GPT-2's product (B transposed)" : "the Llama family's product");
    const std::int64_t ldb = trans_b ? kIns : s.channels;
    ops.gemm(false, trans_b, s.rows, s.channels, kIns, 1.0f, dy.as<float>(), kIns,
             weight.as<float>(), ldb, 0.0f, product.as<float>(), s.channels);
    path.gemm(false, trans_b, s.rows, s.channels, kIns, dy.as<float>(), kIns, weight.as<float>(),
              ldb, key, s.channels);
    STRATA_TRY(path.finish().with_context(layout));
    STRATA_TRY(within_one_unit_then_widen(backend, product, companion, n, path.type, layout,
                                          "the 16-bit gradient"));
    // The verified backwards on the gradient widened, the path's on the gradient kept alone, each
    // adding to the same dx, dw and db.
    const auto reset = [&]() -> Status {
      std::vector<float> start = dx0;
      start.insert(start.end(), dw0.begin(), dw0.end());
      for (Buffer& g : grads) {
        STRATA_TRY(backend.copy_async(StreamKind::kCompute, g.data(), start.data(),
                                      start.size() * sizeof(float)));
      }
      return backend.synchronize(StreamKind::kCompute);
    };
    const auto dx = [&](int i) { return grads[i].as<float>(); };
    const auto dw = [&](int i) { return grads[i].as<float>() + n; };
    const auto db = [&](int i) { return grads[i].as<float>() + n + s.channels; };
    const std::int64_t count = n + 2 * s.channels;
    STRATA_TRY(reset());
    ops.layernorm_backward(dx(0), dw(0), db(0), product.as<float>(), x.as<float>(), w.as<float>(),
                           mean, rstd, s.rows, s.channels);
    path.layernorm_backward(dx(1), dw(1), db(1), key, x.as<float>(), w.as<float>(), mean, rstd,
                            s.rows, s.channels);
    STRATA_TRY(path.finish().with_context(layout));
    STRATA_TRY(same_bits(backend, grads[0], grads[1], count, layout,
                         "LayerNorm's backward on the gradient kept alone: dx, dw, db"));
    STRATA_TRY(reset());
    ops.rmsnorm_backward(dx(0), dw(0), product.as<float>(), x.as<float>(), w.as<float>(), rstd,
                         s.rows, s.channels);
    path.rmsnorm_backward(dx(1), dw(1), key, x.as<float>(), w.as<float>(), rstd, s.rows,
                          s.channels);
    STRATA_TRY(path.finish().with_context(layout));
    STRATA_TRY(same_bits(backend, grads[0], grads[1], count, layout,
                         "RMSNorm's backward on the gradient kept alone: dx, dw"));
  }
  return Status::ok();
}

}  // namespace

NormGradAlonePath ops_norm_grad_path(Ops<float>& ops, std::function<Status()> finish) {
  // The pairing is the activations' (alone_check.h): one way to pair, for every path.
  const NarrowAlonePath activations = ops_alone_path(ops, {}, {});
  NormGradAlonePath path;
  Ops<float>* o = &ops;
  path.type = activations.type;
  path.pair = activations.pair;
  path.unpair = activations.unpair;
  path.keeps = [o] { return o->keeps_norm_grad_alone(); };
  path.gemm = activations.gemm;
  path.layernorm_backward = [o](float* dx, float* dw, float* db, const float* dout, const float* x,
                                const float* w, const float* mean, const float* rstd,
                                std::int64_t rows, std::int64_t channels) {
    o->layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, rows, channels);
  };
  path.rmsnorm_backward = [o](float* dx, float* dw, const float* dout, const float* x,
                              const float* w, const float* rstd, std::int64_t rows,
                              std::int64_t channels) {
    o->rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, channels);
  };
  path.finish = std::move(finish);
  return path;
}

Status check_norm_grad_alone(Backend& backend, const NormGradAlonePath& path) {
  STRATA_TRY(sixteen_bit_type(path.type, "the norms' output gradient kept in 16 bits alone"));
  if (!path.keeps()) {
    return Status(ErrorCode::kUnavailable,
                  "the ops would not keep the norms' output gradient in 16 bits alone");
  }
  for (const Shape& s : {Shape{6, 40}, Shape{3, 33}}) {
    STRATA_TRY(check_shape(backend, path, s));
  }
  return Status::ok();
}

}  // namespace strata::backend
