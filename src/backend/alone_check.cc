// The start-up check of the MLP's activation kept in 16 bits alone (see alone_check.h).
#include "backend/alone_check.h"

#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"
#include "common/address_range.h"

namespace strata::backend {
namespace {

struct Shape {
  std::int64_t rows, inner;
};
constexpr std::int64_t kOuts = 24;  // the products' other side (the hidden size)
constexpr std::int64_t kIns = 16;   // the up-projection's inputs

Status check_shape(Backend& backend, const NarrowAlonePath& path, const Shape& s) {
  const std::int64_t n = s.rows * s.inner;
  std::mt19937_64 rng(4200 + static_cast<std::uint64_t>(s.inner));
  const char* purpose = "activations_16bit_alone check";
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer pre_in,
                          device_copy(backend, normal_values(rng, n, 2.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer gate_up,
                          device_copy(backend, normal_values(rng, 2 * n, 2.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer x, device_copy(backend, normal_values(rng, s.rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer w_up, device_copy(backend, normal_values(rng, kIns * s.inner, 0.5f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer bias,
                          device_copy(backend, normal_values(rng, s.inner, 0.5f, 0.0f), purpose));
  const std::vector<float> residual = normal_values(rng, n, 1.0f, 0.5f);
  STRATA_ASSIGN_OR_RETURN(Buffer norm_in,
                          device_copy(backend, normal_values(rng, n, 1.5f, 0.25f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer norm_w,
                          device_copy(backend, normal_values(rng, s.inner, 0.5f, 1.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer norm_b,
                          device_copy(backend, normal_values(rng, s.inner, 0.5f, 0.0f), purpose));
  // Residual sums, one pair (the verified path's, the path's) for each norm with the add fused.
  Buffer res_ref[2], res_got[2];
  for (int i = 0; i < 2; ++i) {
    STRATA_ASSIGN_OR_RETURN(res_ref[i], device_copy(backend, residual, purpose));
    STRATA_ASSIGN_OR_RETURN(res_got[i], device_copy(backend, residual, purpose));
  }
  STRATA_ASSIGN_OR_RETURN(Buffer stats_ref, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer stats_got, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer wide, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer pre_ref, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer pre_got, device_copy(backend, zeros, purpose));
  const std::vector<std::uint16_t> zeros16(static_cast<std::size_t>(n), 0);
  STRATA_ASSIGN_OR_RETURN(Buffer beside16, device_copy(backend, zeros16, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer alone16, device_copy(backend, zeros16, purpose));
  float* beside = wide.as<float>();
  const std::string where = fmt::format("{} rows of {}", s.rows, s.inner);

  CheckPairs pairs(path.pair, path.unpair);
  STRATA_TRY(pairs.beside(beside, beside16.data(), n, where));
  STRATA_ASSIGN_OR_RETURN(
      float* key, pairs.alone(alone16.data(), n, "the activations_16bit_alone check's key", where));
  if (!path.reads_companion(key, n)) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: a product reading the activation kept alone would not read its "
                              "companion",
                              where));
  }

  const auto same16 = [&](const char* op) {
    return same_companions(backend, beside16, alone16, n, where, op);
  };
  const auto same32 = [&](const std::string& what, const Buffer& want, const Buffer& got,
                          std::int64_t count) {
    return same_bits(backend, want, got, count, where, what);
  };
  const auto products = [&](const char* op) -> Status {
    return check_products_alone(backend, path.gemm, path.finish, beside, key, s.rows, s.inner,
                                where, op);
  };

  // After a writer: its companions, then the products on them.
  const auto written = [&](const char* op) -> Status {
    STRATA_TRY(path.finish().with_context(where));
    STRATA_TRY(same16(op));
    return products(op);
  };
  // The norms' statistics (mean, then rstd: `count` rows each) and residual sums.
  const auto same_stats = [&](const char* op, std::int64_t count) {
    return same32(fmt::format("{}: its statistics", op), stats_ref, stats_got, count);
  };
  const float* xn = norm_in.as<float>();
  const float* nw = norm_w.as<float>();
  const float* nb = norm_b.as<float>();
  const double eps = 1e-5;
  float* mean_ref = stats_ref.as<float>();
  float* mean_got = stats_got.as<float>();

  path.layernorm(beside, mean_ref, mean_ref + s.rows, xn, nw, nb, s.rows, s.inner, eps);
  path.layernorm(key, mean_got, mean_got + s.rows, xn, nw, nb, s.rows, s.inner, eps);
  STRATA_TRY(written("LayerNorm"));
  STRATA_TRY(same_stats("LayerNorm", 2 * s.rows));

  path.add_layernorm(res_ref[0].as<float>(), xn, beside, mean_ref, mean_ref + s.rows, nw, nb,
                     s.rows, s.inner, eps);
  path.add_layernorm(res_got[0].as<float>(), xn, key, mean_got, mean_got + s.rows, nw, nb, s.rows,
                     s.inner, eps);
  STRATA_TRY(written("LayerNorm after the residual add"));
  STRATA_TRY(same_stats("LayerNorm after the residual add", 2 * s.rows));
  STRATA_TRY(
      same32("LayerNorm after the residual add: its residual sum", res_ref[0], res_got[0], n));

  path.rmsnorm(beside, mean_ref, xn, nw, s.rows, s.inner, eps);
  path.rmsnorm(key, mean_got, xn, nw, s.rows, s.inner, eps);
  STRATA_TRY(written("RMSNorm"));
  STRATA_TRY(same_stats("RMSNorm", s.rows));

  path.add_rmsnorm(res_ref[1].as<float>(), xn, beside, mean_ref, nw, s.rows, s.inner, eps);
  path.add_rmsnorm(res_got[1].as<float>(), xn, key, mean_got, nw, s.rows, s.inner, eps);
  STRATA_TRY(written("RMSNorm after the residual add"));
  STRATA_TRY(same_stats("RMSNorm after the residual add", s.rows));
  STRATA_TRY(same32("RMSNorm after the residual add: its residual sum", res_ref[1], res_got[1], n));

  path.gelu(beside, pre_in.as<float>(), n);
  path.gelu(key, pre_in.as<float>(), n);
  STRATA_TRY(written("GELU"));

  path.swiglu(beside, gate_up.as<float>(), s.rows, s.inner);
  path.swiglu(key, gate_up.as<float>(), s.rows, s.inner);
  STRATA_TRY(written("SwiGLU"));

  // The GEMM with bias and GELU: its verified path is the product with bias, then GELU.
  path.gemm_bias(false, false, s.rows, s.inner, kIns, x.as<float>(), kIns, w_up.as<float>(),
                 s.inner, bias.as<float>(), pre_ref.as<float>());
  path.gelu(beside, pre_ref.as<float>(), n);
  path.gemm_bias_gelu(false, false, s.rows, s.inner, kIns, x.as<float>(), kIns, w_up.as<float>(),
                      s.inner, bias.as<float>(), pre_got.as<float>(), key);
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(same32("the GEMM with bias and GELU: its pre-activation", pre_ref, pre_got, n));
  return written("the GEMM with bias and GELU");
}

}  // namespace

Status check_products_alone(Backend& backend, const AloneGemm& gemm,
                            const std::function<Status()>& finish, const float* beside,
                            const float* key, std::int64_t rows, std::int64_t cols,
                            const std::string& where, const std::string& after) {
  std::mt19937_64 rng(5100 + static_cast<std::uint64_t>(rows * 97 + cols));
  const char* purpose = "the 16-bit-alone checks' products";
  const std::vector<float> zeros(static_cast<std::size_t>(std::max(rows, cols) * kOuts), 0.0f);
  STRATA_ASSIGN_OR_RETURN(
      Buffer w, device_copy(backend, normal_values(rng, cols * kOuts, 0.5f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer dout, device_copy(backend, normal_values(rng, rows * kOuts, 1.0f, 0.0f), purpose));
  Buffer c[2];
  for (Buffer& b : c) {
    STRATA_ASSIGN_OR_RETURN(b, device_copy(backend, zeros, purpose));
  }
  struct Product {
    const char* name;
    std::int64_t count;
  };
  const Product list[] = {{"the next projection (activation as A)", rows * kOuts},
                          {"GPT-2's weight gradient (activation as A transposed)", cols * kOuts},
                          {"the Llama family's weight gradient (activation as B)", kOuts * cols}};
  const float* acts[2] = {beside, key};
  for (int p = 0; p < 3; ++p) {
    for (int side = 0; side < 2; ++side) {
      const float* a = acts[side];
      float* out = c[side].as<float>();
      if (p == 0) {
        gemm(false, false, rows, kOuts, cols, a, cols, w.as<float>(), kOuts, out, kOuts);
      } else if (p == 1) {
        gemm(true, false, cols, kOuts, rows, a, cols, dout.as<float>(), kOuts, out, kOuts);
      } else {
        gemm(true, false, kOuts, cols, rows, dout.as<float>(), kOuts, a, cols, out, cols);
      }
    }
    STRATA_TRY(finish().with_context(where));
    STRATA_TRY(same_bits(backend, c[0], c[1], list[p].count, where,
                         fmt::format("after {}: {}", after, list[p].name)));
  }
  return Status::ok();
}

CheckPairs::~CheckPairs() {
  for (const float* wide : paired_)
    unpair_(wide);
}

Status CheckPairs::beside(float* wide, void* narrow, std::int64_t n, const std::string& where) {
  STRATA_TRY(pair_(wide, narrow, n, false).with_context(where));
  paired_.push_back(wide);
  return Status::ok();
}

Result<float*> CheckPairs::alone(void* narrow, std::int64_t n, const std::string& what,
                                 const std::string& where) {
  STRATA_ASSIGN_OR_RETURN(
      AddressRange range,
      AddressRange::reserve(static_cast<std::uint64_t>(n) * sizeof(float), what));
  auto* key = static_cast<float*>(range.begin());
  ranges_.push_back(std::move(range));
  STRATA_TRY(pair_(key, narrow, n, true).with_context(where));
  paired_.push_back(key);
  return key;
}

Status same_companions(Backend& backend, const Buffer& beside, const Buffer& alone, std::int64_t n,
                       const std::string& where, const std::string& op) {
  STRATA_ASSIGN_OR_RETURN(const Bits16Differ d, first_16_bits_differ(backend, beside, alone, n));
  if (d.index < 0) return Status::ok();
  return Status(ErrorCode::kInternal,
                fmt::format("{}, {}: the companion kept alone holds 0x{:04x} at [{}], the one "
                            "kept beside its fp32 values 0x{:04x} (the bits must match)",
                            where, op, d.got, d.index, d.want));
}

NarrowAlonePath ops_alone_path(Ops<float>& ops,
                               std::function<bool(const float* p, std::int64_t n)> reads_companion,
                               std::function<Status()> finish) {
  NarrowAlonePath path;
  Ops<float>* o = &ops;
  path.type = ops.narrow_type();
  path.pair = [o](float* wide, void* narrow, std::int64_t n, bool alone) -> Status {
    if (!alone) {
      o->pair_narrow(wide, narrow, n);
      return Status::ok();
    }
    if (o->pair_narrow_alone(wide, narrow, n)) return Status::ok();
    return Status(ErrorCode::kUnavailable, "the ops refused to keep an activation alone");
  };
  path.unpair = [o](const float* wide) { o->unpair_narrow(wide); };
  path.reads_companion = std::move(reads_companion);
  path.layernorm = [o](float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, std::int64_t rows, std::int64_t channels, double eps) {
    o->layernorm_forward(out, mean, rstd, x, w, b, rows, channels, eps);
  };
  path.add_layernorm = [o](float* res, const float* x, float* out, float* mean, float* rstd,
                           const float* w, const float* b, std::int64_t rows, std::int64_t channels,
                           double eps) {
    o->add_layernorm_forward(res, x, out, mean, rstd, w, b, rows, channels, eps);
  };
  path.rmsnorm = [o](float* out, float* rstd, const float* x, const float* w, std::int64_t rows,
                     std::int64_t channels,
                     double eps) { o->rmsnorm_forward(out, rstd, x, w, rows, channels, eps); };
  path.add_rmsnorm = [o](float* res, const float* x, float* out, float* rstd, const float* w,
                         std::int64_t rows, std::int64_t channels, double eps) {
    o->add_rmsnorm_forward(res, x, out, rstd, w, rows, channels, eps);
  };
  path.gelu = [o](float* out, const float* x, std::int64_t n) { o->gelu_forward(out, x, n); };
  path.swiglu = [o](float* out, const float* gate_up, std::int64_t rows, std::int64_t inner) {
    o->swiglu_forward(out, gate_up, rows, inner);
  };
  path.gemm_bias = [o](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                       const float* bias,
                       float* c) { o->gemm_bias(ta, tb, m, n, k, a, lda, b, ldb, bias, c); };
  path.gemm_bias_gelu = [o](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                            const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                            const float* bias, float* pre, float* act) {
    o->gemm_bias_gelu(ta, tb, m, n, k, a, lda, b, ldb, bias, pre, act);
  };
  path.gemm = [o](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                  std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc) {
    o->gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  };
  path.finish = std::move(finish);
  return path;
}

Status check_narrow_alone(Backend& backend, const NarrowAlonePath& path) {
  STRATA_TRY(sixteen_bit_type(path.type, "an activation kept in 16 bits alone"));
  for (const Shape& s : {Shape{6, 40}, Shape{3, 33}}) {
    STRATA_TRY(check_shape(backend, path, s));
  }
  return Status::ok();
}

Status sixteen_bit_type(DType type, const std::string& what) {
  if (type == DType::kBF16 || type == DType::kF16) return Status::ok();
  return Status(ErrorCode::kInvalidArgument,
                fmt::format("{} is bf16 or fp16, not {}", what, to_string(type)));
}
}  // namespace strata::backend
