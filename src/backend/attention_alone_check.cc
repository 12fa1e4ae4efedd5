// The start-up check of each block's attention output kept in 16 bits alone (see
// attention_alone_check.h).
#include "backend/attention_alone_check.h"

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"

namespace strata::backend {
namespace {

// GQA 2:1 over two batch rows of 24 tokens (partial tiles), q, k, v side by side in each row as
// the model keeps them, the output's rows compact.
AttentionShape check_shape(std::int64_t head_dim) {
  AttentionShape s{};
  s.batch = 2;
  s.seq_len = 24;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = head_dim;
  s.q_stride = s.kv_stride = (s.heads + 2 * s.kv_heads) * head_dim;
  s.out_stride = s.heads * head_dim;
  s.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  return s;
}

// The shape as the checks' errors name it.
std::string where_of(const AttentionShape& s) {
  return fmt::format("head size {}, {} x {} tokens, {} heads over {}", s.head_dim, s.batch,
                     s.seq_len, s.heads, s.kv_heads);
}

}  // namespace

AttentionAlonePath ops_attention_alone_path(
    Ops<float>& ops, std::function<bool(const float* p, std::int64_t n)> reads_companion,
    std::function<Status()> finish) {
  // The pairing is the activations' (alone_check.h): one way to pair, for both paths.
  const NarrowAlonePath activations = ops_alone_path(ops, std::move(reads_companion), {});
  AttentionAlonePath path;
  Ops<float>* o = &ops;
  path.type = activations.type;
  path.pair = activations.pair;
  path.unpair = activations.unpair;
  path.reads_companion = activations.reads_companion;
  path.keeps = [o](const AttentionShape& s) { return o->keeps_attention_alone(s); };
  path.keeps_grad = [o](const AttentionShape& s) { return o->keeps_attention_grad_alone(s); };
  path.forward = [o](float* out, float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& s) { o->attention_forward(out, lse, q, k, v, s); };
  path.backward = [o](float* dq, float* dk, float* dv, const float* dout, const float* out,
                      const float* lse, const float* q, const float* k, const float* v,
                      const AttentionShape& s) {
    o->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s);
  };
  path.gemm = activations.gemm;
  path.finish = std::move(finish);
  return path;
}

Status check_attention_alone(Backend& backend, const AttentionAlonePath& path,
                             std::int64_t head_dim) {
  STRATA_TRY(sixteen_bit_type(path.type, "an attention output kept in 16 bits alone"));
  const AttentionShape s = check_shape(head_dim);
  const std::int64_t rows = s.batch * s.seq_len, hd = s.heads * head_dim;
  const std::int64_t kvd = s.kv_heads * head_dim, n = rows * hd,
                     lse_n = s.batch * s.heads * s.seq_len;
  const std::string where = where_of(s);
  if (!path.keeps(s)) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{}: the ops would not keep its attention output alone", where));
  }
  std::mt19937_64 rng(6100 + static_cast<std::uint64_t>(head_dim));
  const char* purpose = "attention_16bit_alone check";
  STRATA_ASSIGN_OR_RETURN(
      Buffer qkv, device_copy(backend, normal_values(rng, rows * s.q_stride, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer dout,
                          device_copy(backend, normal_values(rng, n, 1.0f, 0.0f), purpose));
  const std::vector<float> zeros(static_cast<std::size_t>(rows * s.q_stride), 0.0f);
  const std::vector<std::uint16_t> zeros16(static_cast<std::size_t>(n), 0);
  Buffer wide, lse[2], grads[2], companions[2];
  STRATA_ASSIGN_OR_RETURN(wide, device_copy(backend, zeros, purpose));
  for (int i = 0; i < 2; ++i) {
    STRATA_ASSIGN_OR_RETURN(lse[i], device_copy(backend, zeros, purpose));
    STRATA_ASSIGN_OR_RETURN(grads[i], device_copy(backend, zeros, purpose));
    STRATA_ASSIGN_OR_RETURN(companions[i], device_copy(backend, zeros16, purpose));
  }
  float* beside = wide.as<float>();
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_TRY(pairs.beside(beside, companions[0].data(), n, where));
  STRATA_ASSIGN_OR_RETURN(float* key, pairs.alone(companions[1].data(), n,
                                                  "the attention_16bit_alone check's key", where));
  if (!path.reads_companion(key, n)) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: a product reading the attention output kept alone would not "
                              "read its companion",
                              where));
  }

  const float* q = qkv.as<float>();
  const float* k = q + hd;
  const float* v = k + kvd;
  float* outs[2] = {beside, key};
  for (int side = 0; side < 2; ++side)
    path.forward(outs[side], lse[side].as<float>(), q, k, v, s);
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(same_companions(backend, companions[0], companions[1], n, where, "the forward"));
  STRATA_TRY(same_bits(backend, lse[0], lse[1], lse_n, where, "the forward's log-sum-exp"));

  for (int side = 0; side < 2; ++side) {
    float* dq = grads[side].as<float>();
    path.backward(dq, dq + hd, dq + hd + kvd, dout.as<float>(), outs[side], lse[side].as<float>(),
                  q, k, v, s);
  }
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(same_bits(backend, grads[0], grads[1], rows * s.q_stride, where,
                       "the backward's dq, dk, dv (side by side)"));
  return check_products_alone(backend, path.gemm, path.finish, beside, key, rows, hd, where,
                              "the attention");
}

Status check_attention_grad_alone(Backend& backend, const AttentionAlonePath& path,
                                  std::int64_t head_dim) {
  STRATA_TRY(sixteen_bit_type(path.type, "an attention gradient kept in 16 bits alone"));
  Ops<float>& ops = backend.ops_f32();
  const AttentionShape s = check_shape(head_dim);
  const std::int64_t rows = s.batch * s.seq_len, hd = s.heads * head_dim;
  const std::int64_t kvd = s.kv_heads * head_dim, n = rows * hd;
  constexpr std::int64_t kIns = 40;  // the product's k (the hidden size)
  const std::string where = where_of(s);
  if (!path.keeps_grad(s)) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{}: the ops would not keep its attention gradient alone", where));
  }
  std::mt19937_64 rng(6300 + static_cast<std::uint64_t>(head_dim));
  const char* purpose = "attention_grad_16bit check";
  STRATA_ASSIGN_OR_RETURN(
      Buffer qkv, device_copy(backend, normal_values(rng, rows * s.q_stride, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer x, device_copy(backend, normal_values(rng, rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer w,
                          device_copy(backend, normal_values(rng, kIns * hd, 0.3f, 0.0f), purpose));
  const std::vector<float> zeros(static_cast<std::size_t>(rows * s.q_stride), 0.0f);
  Buffer out, lse, product, grads[2];
  STRATA_ASSIGN_OR_RETURN(out, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(lse, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(product, device_copy(backend, zeros, purpose));
  for (Buffer& g : grads) {
    STRATA_ASSIGN_OR_RETURN(g, device_copy(backend, zeros, purpose));
  }
  STRATA_ASSIGN_OR_RETURN(
      Buffer companion,
      device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0), purpose));
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_ASSIGN_OR_RETURN(
      float* key, pairs.alone(companion.data(), n, "the attention_grad_16bit check's key", where));

  const float* q = qkv.as<float>();
  const float* k = q + hd;
  const float* v = k + kvd;
  ops.attention_forward(out.as<float>(), lse.as<float>(), q, k, v, s);
  for (const bool trans_b : {true, false}) {
    const std::string layout =
        trans_b ? "GPT-2's product (B transposed)" : "the Llama family's product";
    // The verified product in fp32, the path's into the gradient kept alone.
    ops.gemm(false, trans_b, rows, hd, kIns, 1.0f, x.as<float>(), kIns, w.as<float>(),
             trans_b ? kIns : hd, 0.0f, product.as<float>(), hd);
    path.gemm(false, trans_b, rows, hd, kIns, x.as<float>(), kIns, w.as<float>(),
              trans_b ? kIns : hd, key, hd);
    STRATA_TRY(path.finish().with_context(where));
    STRATA_TRY(within_one_unit_then_widen(backend, product, companion, n, path.type,
                                          fmt::format("{}, {}", where, layout),
                                          "the 16-bit gradient"));
    // The verified backward on the 16-bit values widened, the path's on the gradient kept alone.
    float* dq = grads[0].as<float>();
    ops.attention_backward(dq, dq + hd, dq + hd + kvd, product.as<float>(), out.as<float>(),
                           lse.as<float>(), q, k, v, s);
    dq = grads[1].as<float>();
    path.backward(dq, dq + hd, dq + hd + kvd, key, out.as<float>(), lse.as<float>(), q, k, v, s);
    STRATA_TRY(path.finish().with_context(where));
    STRATA_TRY(same_bits(backend, grads[0], grads[1], rows * s.q_stride, where,
                         layout + ": the backward's dq, dk, dv (side by side)"));
  }
  return Status::ok();
}

}  // namespace strata::backend
