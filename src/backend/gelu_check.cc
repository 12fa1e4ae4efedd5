// The start-up check of GPT-2's MLP pre-activation in 16 bits (see gelu_check.h).
#include "backend/gelu_check.h"

#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"
#include "kernels/cpu/cast.h"

namespace strata::backend {
namespace {

constexpr std::int64_t kIns = 24;  // the forward's k (the hidden size)

struct Shape {
  std::int64_t rows, inner;
};

Status check_shape(Backend& backend, const NarrowGeluPath& path, const Shape& s) {
  Ops<float>& ops = backend.ops_f32();
  const std::int64_t n = s.rows * s.inner;
  std::mt19937_64 rng(7500 + static_cast<std::uint64_t>(s.inner));
  const char* purpose = "gelu_16bit check";
  const std::string where = fmt::format("{} rows of {} inner columns", s.rows, s.inner);
  STRATA_ASSIGN_OR_RETURN(
      Buffer x, device_copy(backend, normal_values(rng, s.rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer w, device_copy(backend, normal_values(rng, kIns * s.inner, 0.4f, 0.0f), purpose));
  // The bias holds 16-bit values, as a parameter widened from its 16-bit copy does.
  STRATA_ASSIGN_OR_RETURN(
      Buffer bias,
      device_copy(backend, sixteen_bit_values(normal_values(rng, s.inner, 0.5f, 0.0f), path.type),
                  purpose));
  // The backward's product: dy (rows x kIns) times the next projection's weight (inner x kIns),
  // transposed.
  STRATA_ASSIGN_OR_RETURN(
      Buffer dy, device_copy(backend, normal_values(rng, s.rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer proj, device_copy(backend, normal_values(rng, s.inner * kIns, 0.4f, 0.0f), purpose));
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  Buffer pre, act_ref, act_got, scratch_ref, scratch_got, d_ref, d_got;
  for (Buffer* b : {&pre, &act_ref, &act_got, &scratch_ref, &scratch_got, &d_ref, &d_got}) {
    STRATA_ASSIGN_OR_RETURN(*b, device_copy(backend, zeros, purpose));
  }
  STRATA_ASSIGN_OR_RETURN(
      Buffer pre16,
      device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0), purpose));

  // The forward: the verified product and bias in fp32, the path's in 16 bits and GELU on them.
  ops.gemm_bias(false, false, s.rows, s.inner, kIns, x.as<float>(), kIns, w.as<float>(), s.inner,
                bias.as<float>(), pre.as<float>());
  path.forward(false, false, s.rows, s.inner, kIns, x.as<float>(), kIns, w.as<float>(), s.inner,
               bias.as<float>(), pre16.data(), act_got.as<float>());
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(within_one_unit_then_widen(backend, pre, pre16, n, path.type, where,
                                        "the 16-bit pre-activation"));
  ops.gelu_forward(act_ref.as<float>(), pre.as<float>(), n);
  // The backward: the verified product and GELU's gradient onto a zeroed array, on the widened
  // pre-activation; the path's on its 16 bits.
  ops.gemm(false, true, s.rows, s.inner, kIns, 1.0f, dy.as<float>(), kIns, proj.as<float>(), kIns,
           0.0f, scratch_ref.as<float>(), s.inner);
  ops.gelu_backward(d_ref.as<float>(), pre.as<float>(), scratch_ref.as<float>(), n);
  path.backward(false, true, s.rows, s.inner, kIns, dy.as<float>(), kIns, proj.as<float>(), kIns,
                pre16.data(), scratch_got.as<float>(), d_got.as<float>());
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(same_bits(backend, act_ref, act_got, n, where, "GELU's forward"));
  return same_bits(backend, d_ref, d_got, n, where, "GELU's backward");
}

Status check_grad_shape(Backend& backend, const GeluGradAlonePath& path, const Shape& s) {
  const std::int64_t n = s.rows * s.inner;
  std::mt19937_64 rng(7900 + static_cast<std::uint64_t>(s.inner));
  const char* purpose = "gelu_grad_16bit_alone check";
  const std::string where = fmt::format("{} rows of {} inner columns", s.rows, s.inner);
  // The pre-activation in 16 bits, and the backward's product: dy (rows x kIns) times the next
  // projection's weight (inner x kIns), transposed.
  const std::vector<float> raw = normal_values(rng, n, 1.0f, 0.0f);
  std::vector<std::uint16_t> pre(static_cast<std::size_t>(n));
  kernels::cast_array(pre.data(), path.type, raw.data(), DType::kF32, n);
  STRATA_ASSIGN_OR_RETURN(Buffer pre16, device_copy(backend, pre, purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer dy, device_copy(backend, normal_values(rng, s.rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer proj, device_copy(backend, normal_values(rng, s.inner * kIns, 0.4f, 0.0f), purpose));
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  Buffer wide, scratch, widened, dbias_ref, dbias_got;
  for (Buffer* b : {&wide, &scratch, &widened, &dbias_ref, &dbias_got}) {
    STRATA_ASSIGN_OR_RETURN(*b, device_copy(backend, zeros, purpose));
  }
  Buffer companions[2];
  for (Buffer& c : companions) {
    STRATA_ASSIGN_OR_RETURN(
        c,
        device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0), purpose));
  }
  float* beside = wide.as<float>();
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_TRY(pairs.beside(beside, companions[0].data(), n, where));
  STRATA_ASSIGN_OR_RETURN(float* key, pairs.alone(companions[1].data(), n,
                                                  "the gelu_grad_16bit_alone check's key", where));
  if (!path.reads_companion(key, n)) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: a product reading GELU's gradient kept alone would not read "
                              "its companion",
                              where));
  }
  for (float* d : {beside, key}) {
    path.backward(false, true, s.rows, s.inner, kIns, dy.as<float>(), kIns, proj.as<float>(), kIns,
                  pre16.data(), scratch.as<float>(), d);
  }
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(same_companions(backend, companions[0], companions[1], n, where, "GELU's backward"));
  STRATA_TRY(check_products_alone(backend, path.gemm, path.finish, beside, key, s.rows, s.inner,
                                  where, "GELU's backward"));
  // The bias's column sums of the gradient kept alone, against the verified sums of its
  // companion's values widened.
  std::vector<std::uint16_t> companion(static_cast<std::size_t>(n));
  STRATA_TRY(copy_to_host(backend, &companion, companions[1]));
  std::vector<float> values(static_cast<std::size_t>(n));
  kernels::cast_array(values.data(), DType::kF32, companion.data(), path.type, n);
  STRATA_TRY(backend.copy_async(StreamKind::kCompute, widened.data(), values.data(),
                                values.size() * sizeof(float)));
  backend.ops_f32().bias_backward(dbias_ref.as<float>(), widened.as<float>(), s.rows, s.inner);
  path.bias_backward(dbias_got.as<float>(), key, s.rows, s.inner);
  STRATA_TRY(path.finish().with_context(where));
  return same_bits(backend, dbias_ref, dbias_got, s.inner, where,
                   "the bias's gradient (its column sums) of the gradient kept alone");
}

}  // namespace

GeluGradAlonePath ops_gelu_grad_path(
    Ops<float>& ops, std::function<bool(const float* p, std::int64_t n)> reads_companion,
    std::function<Status()> finish) {
  // The pairing is the activations' (alone_check.h): one way to pair, for every path.
  const NarrowAlonePath activations = ops_alone_path(ops, std::move(reads_companion), {});
  GeluGradAlonePath path;
  Ops<float>* o = &ops;
  path.type = activations.type;
  path.pair = activations.pair;
  path.unpair = activations.unpair;
  path.reads_companion = activations.reads_companion;
  path.keeps = [o] { return o->keeps_gelu_grad_alone(); };
  path.backward = [o](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                      const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                      const void* pre16, float* scratch, float* dpre) {
    o->gemm_dgelu_narrow(ta, tb, m, n, k, a, lda, b, ldb, pre16, scratch, dpre);
  };
  path.bias_backward = [o](float* dbias, const float* dout, std::int64_t rows,
                           std::int64_t channels) {
    o->bias_backward(dbias, dout, rows, channels);
  };
  path.gemm = activations.gemm;
  path.finish = std::move(finish);
  return path;
}

Status check_gelu_grad_alone(Backend& backend, const GeluGradAlonePath& path) {
  STRATA_TRY(sixteen_bit_type(path.type, "GELU's gradient kept in 16 bits alone"));
  if (!path.keeps()) {
    return Status(ErrorCode::kUnavailable,
                  "the ops would not keep GELU's gradient in 16 bits alone");
  }
  for (const Shape& s : {Shape{6, 40}, Shape{3, 33}}) {
    STRATA_TRY(check_grad_shape(backend, path, s));
  }
  return Status::ok();
}

NarrowGeluPath ops_gelu_path(Ops<float>& ops, std::function<Status()> finish) {
  NarrowGeluPath path;
  Ops<float>* o = &ops;
  path.type = ops.narrow_type();
  path.forward = [o](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     const float* bias, void* pre16, float* act) {
    o->gemm_bias_gelu_narrow(ta, tb, m, n, k, a, lda, b, ldb, bias, pre16, act);
  };
  path.backward = [o](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                      const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                      const void* pre16, float* scratch, float* dpre) {
    o->gemm_dgelu_narrow(ta, tb, m, n, k, a, lda, b, ldb, pre16, scratch, dpre);
  };
  path.finish = std::move(finish);
  return path;
}

Status check_narrow_gelu(Backend& backend, const NarrowGeluPath& path) {
  STRATA_TRY(sixteen_bit_type(path.type, "GPT-2's MLP pre-activation in 16 bits"));
  for (const Shape& s : {Shape{6, 40}, Shape{3, 33}}) {
    STRATA_TRY(check_shape(backend, path, s));
  }
  return Status::ok();
}

}  // namespace strata::backend
