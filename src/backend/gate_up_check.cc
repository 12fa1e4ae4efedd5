// The start-up check of the gate and up projections in 16 bits alone (see gate_up_check.h).
#include "backend/gate_up_check.h"

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"
#include "kernels/cpu/cast.h"

namespace strata::backend {
namespace {

constexpr std::int64_t kIns = 24;  // the product's k (the hidden size)

struct Shape {
  std::int64_t rows, inner;
};

Status check_shape(Backend& backend, const NarrowGateUpPath& path, const Shape& s) {
  Ops<float>& ops = backend.ops_f32();
  const std::int64_t width = 2 * s.inner, n = s.rows * width, outs = s.rows * s.inner;
  std::mt19937_64 rng(7100 + static_cast<std::uint64_t>(s.inner));
  const char* purpose = "gate_up_16bit check";
  STRATA_ASSIGN_OR_RETURN(
      Buffer x, device_copy(backend, normal_values(rng, s.rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer w, device_copy(backend, normal_values(rng, width * kIns, 0.4f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dout,
                          device_copy(backend, normal_values(rng, outs, 1.0f, 0.0f), purpose));
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer wide, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer out_ref, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer out_got, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_ref, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_got, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer narrow,
      device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0), purpose));
  const std::string where = fmt::format("{} rows of {} inner columns", s.rows, s.inner);

  // The product: verified in fp32 (into `wide` for now), the path's in 16 bits.
  ops.gemm(false, true, s.rows, width, kIns, 1.0f, x.as<float>(), kIns, w.as<float>(), kIns, 0.0f,
           wide.as<float>(), width);
  path.to_narrow(false, true, s.rows, width, kIns, x.as<float>(), kIns, w.as<float>(), kIns,
                 narrow.data(), width);
  STRATA_TRY(path.finish().with_context(where));
  // SwiGLU on the 16-bit gate and up, against the verified kernels on their values widened.
  STRATA_TRY(
      within_one_unit_then_widen(backend, wide, narrow, n, path.type, where, "the 16-bit product"));
  ops.swiglu_forward(out_ref.as<float>(), wide.as<float>(), s.rows, s.inner);
  path.forward(out_got.as<float>(), narrow.data(), s.rows, s.inner);
  ops.swiglu_backward(d_ref.as<float>(), wide.as<float>(), dout.as<float>(), s.rows, s.inner);
  path.backward(d_got.as<float>(), narrow.data(), dout.as<float>(), s.rows, s.inner);
  STRATA_TRY(path.finish().with_context(where));
  const auto same = [&](const char* what, const Buffer& want, const Buffer& got,
                        std::int64_t count) -> Status {
    STRATA_ASSIGN_OR_RETURN(const BitsDiffer d, first_bits_differ(backend, want, got, count));
    if (d.index < 0) return Status::ok();
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: {}[{}] is {}, the verified kernel on the widened gate and up "
                              "gives {} (the bits must match)",
                              where, what, d.index, d.got, d.want));
  };
  STRATA_TRY(same("SwiGLU's forward", out_ref, out_got, outs));
  return same("SwiGLU's backward", d_ref, d_got, n);
}

Status check_grad_shape(Backend& backend, const SwigluGradAlonePath& path, const Shape& s) {
  Ops<float>& ops = backend.ops_f32();
  const std::int64_t outs = s.rows * s.inner, n = 2 * outs;
  std::mt19937_64 rng(7300 + static_cast<std::uint64_t>(s.inner));
  const char* purpose = "swiglu_grad_16bit check";
  const std::string where = fmt::format("{} rows of {} inner columns", s.rows, s.inner);
  // Gate and up in 16 bits, and their values widened for the verified kernel.
  const std::vector<float> raw = normal_values(rng, n, 1.0f, 0.0f);
  std::vector<std::uint16_t> gate_up16(static_cast<std::size_t>(n));
  std::vector<float> widened(static_cast<std::size_t>(n));
  kernels::cast_array(gate_up16.data(), path.type, raw.data(), DType::kF32, n);
  kernels::cast_array(widened.data(), DType::kF32, gate_up16.data(), path.type, n);
  STRATA_ASSIGN_OR_RETURN(Buffer gate_up, device_copy(backend, gate_up16, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer wide_gate_up, device_copy(backend, widened, purpose));
  // The product dact(rows, inner) = dy(rows, k) x down(k, inner), as the Llama family's blocks run
  // it.
  STRATA_ASSIGN_OR_RETURN(
      Buffer dy, device_copy(backend, normal_values(rng, s.rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer down, device_copy(backend, normal_values(rng, kIns * s.inner, 0.4f, 0.0f), purpose));
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer product, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_ref, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_got, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer companion,
      device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(outs), 0), purpose));
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_ASSIGN_OR_RETURN(
      float* key, pairs.alone(companion.data(), outs, "the swiglu_grad_16bit check's key", where));

  ops.gemm(false, false, s.rows, s.inner, kIns, 1.0f, dy.as<float>(), kIns, down.as<float>(),
           s.inner, 0.0f, product.as<float>(), s.inner);
  path.gemm(false, false, s.rows, s.inner, kIns, dy.as<float>(), kIns, down.as<float>(), s.inner,
            key, s.inner);
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(within_one_unit_then_widen(backend, product, companion, outs, path.type, where,
                                        "the 16-bit gradient"));
  // SwiGLU's backward reading the gradient kept alone, against the verified kernel on gate, up and
  // the gradient widened.
  ops.swiglu_backward(d_ref.as<float>(), wide_gate_up.as<float>(), product.as<float>(), s.rows,
                      s.inner);
  path.backward(d_got.as<float>(), gate_up.data(), key, s.rows, s.inner);
  STRATA_TRY(path.finish().with_context(where));
  return same_bits(backend, d_ref, d_got, n, where, "SwiGLU's backward on the gradient kept alone");
}

Status check_gate_up_grad_shape(Backend& backend, const GateUpGradAlonePath& path, const Shape& s) {
  const std::int64_t outs = s.rows * s.inner, n = 2 * outs;
  std::mt19937_64 rng(7700 + static_cast<std::uint64_t>(s.inner));
  const char* purpose = "gate_up_grad_16bit_alone check";
  const std::string where = fmt::format("{} rows of {} inner columns", s.rows, s.inner);
  const std::vector<float> raw = normal_values(rng, n, 1.0f, 0.0f);
  std::vector<std::uint16_t> gate_up16(static_cast<std::size_t>(n));
  kernels::cast_array(gate_up16.data(), path.type, raw.data(), DType::kF32, n);
  STRATA_ASSIGN_OR_RETURN(Buffer gate_up, device_copy(backend, gate_up16, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dout,
                          device_copy(backend, normal_values(rng, outs, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer wide, device_copy(backend, std::vector<float>(static_cast<std::size_t>(n)), purpose));
  Buffer companions[2];
  for (Buffer& c : companions) {
    STRATA_ASSIGN_OR_RETURN(
        c,
        device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0), purpose));
  }
  float* beside = wide.as<float>();
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_TRY(pairs.beside(beside, companions[0].data(), n, where));
  STRATA_ASSIGN_OR_RETURN(
      float* key,
      pairs.alone(companions[1].data(), n, "the gate_up_grad_16bit_alone check's key", where));
  if (!path.reads_companion(key, n)) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: a product reading the gradient of gate and up kept alone "
                              "would not read its companion",
                              where));
  }
  for (float* d : {beside, key})
    path.backward(d, gate_up.data(), dout.as<float>(), s.rows, s.inner);
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(same_companions(backend, companions[0], companions[1], n, where, "SwiGLU's backward"));
  return check_products_alone(backend, path.gemm, path.finish, beside, key, s.rows, 2 * s.inner,
                              where, "SwiGLU's backward");
}

}  // namespace

GateUpGradAlonePath ops_gate_up_grad_path(
    Ops<float>& ops, std::function<bool(const float* p, std::int64_t n)> reads_companion,
    std::function<Status()> finish) {
  // The pairing is the activations' (alone_check.h): one way to pair, for every path.
  const NarrowAlonePath activations = ops_alone_path(ops, std::move(reads_companion), {});
  GateUpGradAlonePath path;
  Ops<float>* o = &ops;
  path.type = activations.type;
  path.pair = activations.pair;
  path.unpair = activations.unpair;
  path.reads_companion = activations.reads_companion;
  path.keeps = [o] { return o->keeps_gate_up_grad_alone(); };
  path.backward = [o](float* d, const void* gate_up, const float* dout, std::int64_t rows,
                      std::int64_t inner) {
    o->swiglu_backward_narrow(d, gate_up, dout, rows, inner);
  };
  path.gemm = activations.gemm;
  path.finish = std::move(finish);
  return path;
}

Status check_gate_up_grad_alone(Backend& backend, const GateUpGradAlonePath& path) {
  STRATA_TRY(sixteen_bit_type(path.type, "the gradient of gate and up kept in 16 bits alone"));
  if (!path.keeps()) {
    return Status(ErrorCode::kUnavailable,
                  "the ops would not keep the gradient of gate and up in 16 bits alone");
  }
  for (const Shape& s : {Shape{6, 40}, Shape{3, 33}}) {
    STRATA_TRY(check_gate_up_grad_shape(backend, path, s));
  }
  return Status::ok();
}

SwigluGradAlonePath ops_swiglu_grad_path(Ops<float>& ops, std::function<Status()> finish) {
  // The pairing is the activations' (alone_check.h): one way to pair, for every path.
  const NarrowAlonePath activations = ops_alone_path(ops, {}, {});
  SwigluGradAlonePath path;
  Ops<float>* o = &ops;
  path.type = activations.type;
  path.pair = activations.pair;
  path.unpair = activations.unpair;
  path.keeps = [o] { return o->keeps_swiglu_grad_alone(); };
  path.gemm = activations.gemm;
  path.backward = [o](float* d, const void* gate_up, const float* dout, std::int64_t rows,
                      std::int64_t inner) {
    o->swiglu_backward_narrow(d, gate_up, dout, rows, inner);
  };
  path.finish = std::move(finish);
  return path;
}

Status check_swiglu_grad_alone(Backend& backend, const SwigluGradAlonePath& path) {
  STRATA_TRY(sixteen_bit_type(path.type, "SwiGLU's output gradient kept in 16 bits alone"));
  if (!path.keeps()) {
    return Status(ErrorCode::kUnavailable,
                  "the ops would not keep SwiGLU's output gradient in 16 bits alone");
  }
  for (const Shape& s : {Shape{6, 40}, Shape{3, 33}}) {
    STRATA_TRY(check_grad_shape(backend, path, s));
  }
  return Status::ok();
}

NarrowGateUpPath ops_gate_up_path(Ops<float>& ops, std::function<Status()> finish) {
  NarrowGateUpPath path;
  Ops<float>* o = &ops;
  path.type = ops.narrow_type();
  path.to_narrow = [o](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb, void* c,
                       std::int64_t ldc) {
    o->gemm_to_narrow(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  };
  path.forward = [o](float* out, const void* gate_up, std::int64_t rows, std::int64_t inner) {
    o->swiglu_forward_narrow(out, gate_up, rows, inner);
  };
  path.backward = [o](float* d, const void* gate_up, const float* dout, std::int64_t rows,
                      std::int64_t inner) {
    o->swiglu_backward_narrow(d, gate_up, dout, rows, inner);
  };
  path.finish = std::move(finish);
  return path;
}

Status check_narrow_gate_up(Backend& backend, const NarrowGateUpPath& path) {
  if (path.type != DType::kBF16 && path.type != DType::kF16) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("gate and up in 16 bits are bf16 or fp16, not {}", to_string(path.type)));
  }
  for (const Shape& s : {Shape{6, 40}, Shape{3, 33}}) {
    STRATA_TRY(check_shape(backend, path, s));
  }
  return Status::ok();
}

}  // namespace strata::backend
