// The start-up check of the gradient of q, k and v kept in 16 bits alone (see qkv_grad_check.h).
#include "backend/qkv_grad_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"
#include "kernels/cpu/nn_ops.h"

namespace strata::backend {
namespace {

struct Case {
  const char* name;
  std::int64_t seq_len, rotary_dim;
};

Status check_case(Backend& backend, const QkvGradAlonePath& path, std::int64_t head_dim,
                  const Case& c) {
  AttentionShape s{};
  s.batch = 2;
  s.seq_len = c.seq_len;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = head_dim;
  const std::int64_t rows = s.batch * s.seq_len, hd = s.heads * head_dim;
  const std::int64_t kvd = s.kv_heads * head_dim, stride = hd + 2 * kvd, n = rows * stride;
  s.q_stride = s.kv_stride = stride;
  s.out_stride = hd;
  s.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const std::string where = fmt::format("{} (head size {}, rotary width {}, {} x {} tokens)",
                                        c.name, head_dim, c.rotary_dim, s.batch, s.seq_len);
  if (!path.keeps(s)) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{}: the ops would not keep its q/k/v gradient alone", where));
  }
  std::mt19937_64 rng(7900 + static_cast<std::uint64_t>(head_dim * 3 + c.rotary_dim));
  const std::int64_t half = c.rotary_dim / 2;
  std::vector<float> cos(static_cast<std::size_t>(s.seq_len * half)), sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), s.seq_len, c.rotary_dim, 10000.0);
  const char* purpose = "qkv_grad_16bit_alone check";
  STRATA_ASSIGN_OR_RETURN(Buffer qkv,
                          device_copy(backend, normal_values(rng, n, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dout,
                          device_copy(backend, normal_values(rng, rows * hd, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_cos, device_copy(backend, cos, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_sin, device_copy(backend, sin, purpose));
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer out, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer lse, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer wide, device_copy(backend, zeros, purpose));
  Buffer companions[2];
  for (Buffer& b : companions) {
    STRATA_ASSIGN_OR_RETURN(
        b,
        device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0), purpose));
  }
  float* beside = wide.as<float>();
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_TRY(pairs.beside(beside, companions[0].data(), n, where));
  STRATA_ASSIGN_OR_RETURN(float* key, pairs.alone(companions[1].data(), n,
                                                  "the qkv_grad_16bit_alone check's key", where));
  if (!path.reads_companion(key, n)) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: a product reading the q/k/v gradient kept alone would not read "
                              "its companion",
                              where));
  }

  kernels::QkRotation<float> rope;
  rope.cos = d_cos.as<float>();
  rope.sin = d_sin.as<float>();
  rope.rotary_dim = c.rotary_dim;
  const float* q = qkv.as<float>();
  const float* k = q + hd;
  const float* v = k + kvd;
  path.forward_rotated(out.as<float>(), lse.as<float>(), q, k, v, s, rope);
  for (float* d : {beside, key}) {
    path.backward_rotated(d, d + hd, d + hd + kvd, dout.as<float>(), out.as<float>(),
                          lse.as<float>(), q, k, v, s, rope);
  }
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(same_companions(backend, companions[0], companions[1], n, where,
                             "the rotated backward (dq, dk, dv side by side)"));
  return check_products_alone(backend, path.gemm, path.finish, beside, key, rows, stride, where,
                              "the rotated backward");
}

}  // namespace

QkvGradAlonePath ops_qkv_grad_path(
    Ops<float>& ops, std::function<bool(const float* p, std::int64_t n)> reads_companion,
    std::function<Status()> finish) {
  // The pairing is the activations' (alone_check.h): one way to pair, for every path.
  const NarrowAlonePath activations = ops_alone_path(ops, std::move(reads_companion), {});
  QkvGradAlonePath path;
  Ops<float>* o = &ops;
  path.type = activations.type;
  path.pair = activations.pair;
  path.unpair = activations.unpair;
  path.reads_companion = activations.reads_companion;
  path.keeps = [o](const AttentionShape& s) { return o->keeps_qkv_grad_alone(s); };
  path.forward_rotated = [o](float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttentionShape& s, const kernels::QkRotation<float>& rope) {
    o->attention_forward_rotated(out, lse, q, k, v, s, rope);
  };
  path.backward_rotated = [o](float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const AttentionShape& s, const kernels::QkRotation<float>& rope) {
    o->attention_backward_rotated(dq, dk, dv, dout, out, lse, q, k, v, s, rope);
  };
  path.gemm = activations.gemm;
  path.finish = std::move(finish);
  return path;
}

Status check_qkv_grad_alone(Backend& backend, const QkvGradAlonePath& path, std::int64_t head_dim) {
  if (path.type != DType::kBF16 && path.type != DType::kF16) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("a q/k/v gradient kept in 16 bits alone is bf16 or fp16, not {}",
                              to_string(path.type)));
  }
  // A partial width rounded down to an even number, at least 2.
  const std::int64_t partial = std::max<std::int64_t>(2, (head_dim / 2) & ~std::int64_t{1});
  for (const Case& c :
       {Case{"GQA, whole head rotated", 24, head_dim}, Case{"partial rotary width", 23, partial}}) {
    STRATA_TRY(check_case(backend, path, head_dim, c));
  }
  return Status::ok();
}

}  // namespace strata::backend
