// The start-up checks of q, k, v and their gradient kept in 16 bits alone (see qkv_alone_check.h).
#include "backend/qkv_alone_check.h"

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
  bool bias;  // the qkv projection has one (q, k and v's check)
};

// One case on the backend: its shape (q, k, v side by side in rows of `stride`), its rotation and
// its random inputs (q, k, v and dO).
struct Setup {
  AttentionShape s{};
  std::int64_t rows = 0, hd = 0, kvd = 0, stride = 0, n = 0;
  std::string where;
  Buffer qkv, dout, cos, sin;
  kernels::QkRotation<float> rope;
};

Result<Setup> set_up(Backend& backend, std::int64_t head_dim, const Case& c, std::uint64_t seed,
                     const char* purpose) {
  Setup u;
  AttentionShape& s = u.s;
  s.batch = 2;
  s.seq_len = c.seq_len;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = head_dim;
  u.rows = s.batch * s.seq_len;
  u.hd = s.heads * head_dim;
  u.kvd = s.kv_heads * head_dim;
  u.stride = u.hd + 2 * u.kvd;
  u.n = u.rows * u.stride;
  s.q_stride = s.kv_stride = u.stride;
  s.out_stride = u.hd;
  s.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  u.where = fmt::format("{} (head size {}, rotary width {}, {} x {} tokens)", c.name, head_dim,
                        c.rotary_dim, s.batch, s.seq_len);
  std::mt19937_64 rng(seed + static_cast<std::uint64_t>(head_dim * 3 + c.rotary_dim));
  // No tables without rotation (one element each, unread, for the buffers).
  const std::int64_t half = std::max<std::int64_t>(c.rotary_dim / 2, 1);
  std::vector<float> cos(static_cast<std::size_t>(s.seq_len * half)), sin(cos.size());
  if (c.rotary_dim > 0)
    kernels::rope_tables(cos.data(), sin.data(), s.seq_len, c.rotary_dim, 10000.0);
  STRATA_ASSIGN_OR_RETURN(u.qkv,
                          device_copy(backend, normal_values(rng, u.n, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      u.dout, device_copy(backend, normal_values(rng, u.rows * u.hd, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(u.cos, device_copy(backend, cos, purpose));
  STRATA_ASSIGN_OR_RETURN(u.sin, device_copy(backend, sin, purpose));
  if (c.rotary_dim > 0) {
    u.rope.cos = u.cos.as<float>();
    u.rope.sin = u.sin.as<float>();
    u.rope.rotary_dim = c.rotary_dim;
  }
  return u;
}

// The attention's forward and backward on q, k and v side by side from `q` (rows of u's stride),
// rotating q and k where the case does.
void forward(const QkvAlonePath& path, const Setup& u, float* out, float* lse, const float* q) {
  if (u.rope.cos != nullptr) {
    path.forward_rotated(out, lse, q, q + u.hd, q + u.hd + u.kvd, u.s, u.rope);
  } else {
    path.forward(out, lse, q, q + u.hd, q + u.hd + u.kvd, u.s);
  }
}
void backward(const QkvAlonePath& path, const Setup& u, float* d, const float* out,
              const float* lse, const float* q) {
  float* dk = d + u.hd;
  float* dv = dk + u.kvd;
  const float* dout = u.dout.as<float>();
  if (u.rope.cos != nullptr) {
    path.backward_rotated(d, dk, dv, dout, out, lse, q, q + u.hd, q + u.hd + u.kvd, u.s, u.rope);
  } else {
    path.backward(d, dk, dv, dout, out, lse, q, q + u.hd, q + u.hd + u.kvd, u.s);
  }
}

// n 16-bit zeros on the backend.
Result<Buffer> zeros16(Backend& backend, std::int64_t n, const char* purpose) {
  return device_copy(backend, std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0), purpose);
}

Status check_grad_case(Backend& backend, const QkvAlonePath& path, std::int64_t head_dim,
                       const Case& c) {
  const char* purpose = "qkv_grad_16bit_alone check";
  STRATA_ASSIGN_OR_RETURN(Setup u, set_up(backend, head_dim, c, 7900, purpose));
  const std::string& where = u.where;
  if (!path.keeps_grad(u.s)) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{}: the ops would not keep its q/k/v gradient alone", where));
  }
  const std::vector<float> zeros(static_cast<std::size_t>(u.n), 0.0f);
  STRATA_ASSIGN_OR_RETURN(Buffer out, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer lse, device_copy(backend, zeros, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer wide, device_copy(backend, zeros, purpose));
  Buffer companions[2];
  for (Buffer& b : companions) {
    STRATA_ASSIGN_OR_RETURN(b, zeros16(backend, u.n, purpose));
  }
  float* beside = wide.as<float>();
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_TRY(pairs.beside(beside, companions[0].data(), u.n, where));
  STRATA_ASSIGN_OR_RETURN(float* key, pairs.alone(companions[1].data(), u.n,
                                                  "the qkv_grad_16bit_alone check's key", where));
  if (!path.reads_companion(key, u.n)) {
    return Status(ErrorCode::kInternal,
                  fmt::format("{}: a product reading the q/k/v gradient kept alone would not read "
                              "its companion",
                              where));
  }
  const float* q = u.qkv.as<float>();
  const bool rotates = u.rope.cos != nullptr;
  forward(path, u, out.as<float>(), lse.as<float>(), q);
  for (float* d : {beside, key})
    backward(path, u, d, out.as<float>(), lse.as<float>(), q);
  STRATA_TRY(path.finish().with_context(where));
  const char* writer = rotates ? "the rotated backward" : "the backward";
  STRATA_TRY(same_companions(backend, companions[0], companions[1], u.n, where,
                             fmt::format("{} (dq, dk, dv side by side)", writer)));
  STRATA_TRY(check_products_alone(backend, path.gemm, path.finish, beside, key, u.rows, u.stride,
                                  where, writer));
  if (rotates) return Status::ok();
  // GPT-2's bias: its column sums of the gradient kept beside its fp32 values and of the one kept
  // alone (read from its companion, widened).
  Buffer dbias[2];
  for (Buffer& b : dbias) {
    STRATA_ASSIGN_OR_RETURN(
        b, device_copy(backend, std::vector<float>(static_cast<std::size_t>(u.stride)), purpose));
  }
  path.bias_backward(dbias[0].as<float>(), beside, u.rows, u.stride);
  path.bias_backward(dbias[1].as<float>(), key, u.rows, u.stride);
  STRATA_TRY(path.finish().with_context(where));
  return same_bits(backend, dbias[0], dbias[1], u.stride, where,
                   "the bias's gradient (its column sums)");
}

Status check_qkv_case(Backend& backend, const QkvAlonePath& path, std::int64_t head_dim,
                      const Case& c) {
  const char* purpose = "qkv_16bit check";
  constexpr std::int64_t kIns = 40;  // the projection's k (the hidden size)
  STRATA_ASSIGN_OR_RETURN(Setup u, set_up(backend, head_dim, c, 8100, purpose));
  const std::string& where = u.where;
  if (!path.keeps(u.s)) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{}: the ops would not keep its q, k and v alone", where));
  }
  std::mt19937_64 rng(8200 + static_cast<std::uint64_t>(head_dim));
  STRATA_ASSIGN_OR_RETURN(
      Buffer x, device_copy(backend, normal_values(rng, u.rows * kIns, 1.0f, 0.0f), purpose));
  STRATA_ASSIGN_OR_RETURN(
      Buffer w, device_copy(backend, normal_values(rng, u.stride * kIns, 0.3f, 0.0f), purpose));
  // The bias holds 16-bit values, as a parameter widened from its 16-bit copy does (cuBLASLt's
  // epilogue reads it in D's type).
  STRATA_ASSIGN_OR_RETURN(
      Buffer bias,
      device_copy(backend, sixteen_bit_values(normal_values(rng, u.stride, 0.5f, 0.0f), path.type),
                  purpose));
  const std::vector<float> zeros(static_cast<std::size_t>(u.n), 0.0f);
  Buffer product, outs[2], lses[2], grads[2];
  STRATA_ASSIGN_OR_RETURN(product, device_copy(backend, zeros, purpose));
  for (int side = 0; side < 2; ++side) {
    STRATA_ASSIGN_OR_RETURN(outs[side], device_copy(backend, zeros, purpose));
    STRATA_ASSIGN_OR_RETURN(lses[side], device_copy(backend, zeros, purpose));
    STRATA_ASSIGN_OR_RETURN(grads[side], device_copy(backend, zeros, purpose));
  }
  STRATA_ASSIGN_OR_RETURN(Buffer companion, zeros16(backend, u.n, purpose));
  CheckPairs pairs(path.pair, path.unpair);
  STRATA_ASSIGN_OR_RETURN(float* key,
                          pairs.alone(companion.data(), u.n, "the qkv_16bit check's key", where));

  // The verified product in fp32 (the backend's own gemm or gemm_bias), the path's into q, k, v
  // kept alone (the model's projection: x W^T, plus the bias where it has one).
  if (c.bias) {
    backend.ops_f32().gemm_bias(false, true, u.rows, u.stride, kIns, x.as<float>(), kIns,
                                w.as<float>(), kIns, bias.as<float>(), product.as<float>());
    path.gemm_bias(false, true, u.rows, u.stride, kIns, x.as<float>(), kIns, w.as<float>(), kIns,
                   bias.as<float>(), key);
  } else {
    backend.ops_f32().gemm(false, true, u.rows, u.stride, kIns, 1.0f, x.as<float>(), kIns,
                           w.as<float>(), kIns, 0.0f, product.as<float>(), u.stride);
    path.gemm(false, true, u.rows, u.stride, kIns, x.as<float>(), kIns, w.as<float>(), kIns, key,
              u.stride);
  }
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(within_one_unit_then_widen(
      backend, product, companion, u.n, path.type, where,
      c.bias ? "the 16-bit q, k, v (with their bias)" : "the 16-bit q, k, v"));
  // The attention (rotating q and k where the case does) on fp32 arrays holding those values
  // widened, and on them kept alone.
  const bool rotates = u.rope.cos != nullptr;
  const char* forwards = rotates ? "the rotated forward" : "the forward";
  float* sources[2] = {product.as<float>(), key};
  for (int side = 0; side < 2; ++side)
    forward(path, u, outs[side].as<float>(), lses[side].as<float>(), sources[side]);
  STRATA_TRY(path.finish().with_context(where));
  STRATA_TRY(same_bits(backend, outs[0], outs[1], u.rows * u.hd, where,
                       fmt::format("{}'s out", forwards)));
  STRATA_TRY(same_bits(backend, lses[0], lses[1], u.s.batch * u.s.heads * u.s.seq_len, where,
                       fmt::format("{}'s log-sum-exp", forwards)));
  for (int side = 0; side < 2; ++side) {
    backward(path, u, grads[side].as<float>(), outs[side].as<float>(), lses[side].as<float>(),
             sources[side]);
  }
  STRATA_TRY(path.finish().with_context(where));
  return same_bits(backend, grads[0], grads[1], u.n, where,
                   fmt::format("{}'s dq, dk, dv (side by side)",
                               rotates ? "the rotated backward" : "the backward"));
}

// The checks' three cases at `head_dim` (a partial width rounded down to an even number, at least
// 2): the qkv projection with a bias in the last two (q, k and v's check).
Status each_case(Backend& backend, const QkvAlonePath& path, std::int64_t head_dim,
                 Status (*check)(Backend&, const QkvAlonePath&, std::int64_t, const Case&),
                 const char* what) {
  STRATA_TRY(sixteen_bit_type(path.type, fmt::format("{} kept in 16 bits alone", what)));
  const std::int64_t partial = std::max<std::int64_t>(2, (head_dim / 2) & ~std::int64_t{1});
  for (const Case& c :
       {Case{"GQA, whole head rotated", 24, head_dim, false},
        Case{"partial rotary width", 23, partial, true}, Case{"no rotation", 24, 0, true}}) {
    STRATA_TRY(check(backend, path, head_dim, c));
  }
  return Status::ok();
}

}  // namespace

QkvAlonePath ops_qkv_alone_path(Ops<float>& ops,
                                std::function<bool(const float* p, std::int64_t n)> reads_companion,
                                std::function<Status()> finish) {
  // The pairing is the activations' (alone_check.h): one way to pair, for every path.
  const NarrowAlonePath activations = ops_alone_path(ops, std::move(reads_companion), {});
  QkvAlonePath path;
  Ops<float>* o = &ops;
  path.type = activations.type;
  path.pair = activations.pair;
  path.unpair = activations.unpair;
  path.reads_companion = activations.reads_companion;
  path.keeps = [o](const AttentionShape& s) { return o->keeps_qkv_alone(s); };
  path.keeps_grad = [o](const AttentionShape& s) { return o->keeps_qkv_grad_alone(s); };
  path.forward_rotated = [o](float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttentionShape& s, const kernels::QkRotation<float>& rope) {
    o->attention_forward_rotated(out, lse, q, k, v, s, rope);
  };
  path.backward_rotated = [o](float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const AttentionShape& s, const kernels::QkRotation<float>& rope) {
    o->attention_backward_rotated(dq, dk, dv, dout, out, lse, q, k, v, s, rope);
  };
  path.forward = [o](float* out, float* lse, const float* q, const float* k, const float* v,
                     const AttentionShape& s) { o->attention_forward(out, lse, q, k, v, s); };
  path.backward = [o](float* dq, float* dk, float* dv, const float* dout, const float* out,
                      const float* lse, const float* q, const float* k, const float* v,
                      const AttentionShape& s) {
    o->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s);
  };
  path.bias_backward = [o](float* dbias, const float* dout, std::int64_t rows,
                           std::int64_t channels) {
    o->bias_backward(dbias, dout, rows, channels);
  };
  path.gemm = activations.gemm;
  path.gemm_bias = [o](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                       const float* bias,
                       float* c) { o->gemm_bias(ta, tb, m, n, k, a, lda, b, ldb, bias, c); };
  path.finish = std::move(finish);
  return path;
}

Status check_qkv_grad_alone(Backend& backend, const QkvAlonePath& path, std::int64_t head_dim) {
  return each_case(backend, path, head_dim, check_grad_case, "a q/k/v gradient");
}

Status check_qkv_alone(Backend& backend, const QkvAlonePath& path, std::int64_t head_dim) {
  return each_case(backend, path, head_dim, check_qkv_case, "q, k and v");
}

}  // namespace strata::backend
