// The start-up check of RoPE fused into the attention's staging (see rope_check.h).
#include "backend/rope_check.h"

#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "backend/host_copies.h"
#include "kernels/cpu/nn_ops.h"

namespace strata::backend {
namespace {

struct Case {
  const char* name;
  std::int64_t batch, seq_len, heads, kv_heads, rotary_dim, window;
  bool documents;
};

// The first element of `name` where the two paths' bits differ.
Status compare(Backend& backend, const Case& c, std::int64_t head_dim, const char* name,
               const Buffer& want, const Buffer& got, std::int64_t n) {
  STRATA_ASSIGN_OR_RETURN(const BitsDiffer d, first_bits_differ(backend, want, got, n));
  if (d.index < 0) return Status::ok();
  return Status(ErrorCode::kInternal,
                fmt::format("{} (head size {}, rotary width {}): {}[{}] is {}, the verified path "
                            "gives {} (the bits must match)",
                            c.name, head_dim, c.rotary_dim, name, d.index, d.got, d.want));
}

Status check_case(Backend& backend, const RopeAttentionPaths& paths, std::int64_t head_dim,
                  const Case& c) {
  const std::int64_t rows = c.batch * c.seq_len;
  const std::int64_t hd = c.heads * head_dim, kvd = c.kv_heads * head_dim;
  const std::int64_t stride = hd + 2 * kvd;
  std::mt19937_64 rng(9300 + static_cast<std::uint64_t>(head_dim * 7 + c.rotary_dim));
  const std::vector<float> qkv = normal_values(rng, rows * stride, 1.0f, 0.0f);
  const std::vector<float> dout = normal_values(rng, rows * hd, 1.0f, 0.0f);
  const std::int64_t half = c.rotary_dim / 2;
  std::vector<float> cos(static_cast<std::size_t>(c.seq_len * half));
  std::vector<float> sin(cos.size());
  kernels::rope_tables(cos.data(), sin.data(), c.seq_len, c.rotary_dim, 10000.0);
  // Packed documents: each batch row holds documents of 5, then 7, ... tokens (positions restart).
  std::vector<std::int32_t> positions;
  if (c.documents) {
    for (std::int64_t b = 0; b < c.batch; ++b) {
      std::int32_t p = 0, length = 5 + 2 * static_cast<std::int32_t>(b);
      for (std::int64_t t = 0; t < c.seq_len; ++t) {
        if (p == length) p = 0, length += 2;
        positions.push_back(p++);
      }
    }
  }
  const std::vector<float> zeros_out(static_cast<std::size_t>(rows * hd), 0.0f);
  const std::vector<float> zeros_lse(static_cast<std::size_t>(rows * c.heads), 0.0f);
  const std::vector<float> zeros_d(qkv.size(), 0.0f);
  const char* purpose = "rope_in_attention check";
  STRATA_ASSIGN_OR_RETURN(Buffer unrotated, device_copy(backend, qkv, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer ref_qkv, device_copy(backend, qkv, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer got_qkv, device_copy(backend, qkv, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_out, device_copy(backend, dout, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_cos, device_copy(backend, cos, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_sin, device_copy(backend, sin, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer d_positions, device_copy(backend, positions, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer ref_out, device_copy(backend, zeros_out, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer got_out, device_copy(backend, zeros_out, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer ref_lse, device_copy(backend, zeros_lse, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer got_lse, device_copy(backend, zeros_lse, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer ref_d, device_copy(backend, zeros_d, purpose));
  STRATA_ASSIGN_OR_RETURN(Buffer got_d, device_copy(backend, zeros_d, purpose));
  const std::int32_t* pos = c.documents ? d_positions.as<std::int32_t>() : nullptr;

  AttentionShape shape;
  shape.batch = c.batch;
  shape.seq_len = c.seq_len;
  shape.heads = c.heads;
  shape.kv_heads = c.kv_heads;
  shape.head_dim = head_dim;
  shape.q_stride = shape.kv_stride = stride;
  shape.out_stride = hd;
  shape.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  shape.window = c.window;
  shape.positions = pos;
  RopeShape rope;  // q's heads and k's, as the model rotates them
  rope.rows = rows;
  rope.stride = stride;
  rope.seq_len = c.seq_len;
  rope.heads = c.heads + c.kv_heads;
  rope.head_dim = head_dim;
  rope.rotary_dim = c.rotary_dim;
  rope.positions = pos;
  kernels::QkRotation<float> rotation;
  rotation.cos = d_cos.as<float>();
  rotation.sin = d_sin.as<float>();
  rotation.rotary_dim = c.rotary_dim;

  const auto qkv_of = [&](Buffer& b) {
    float* q = b.as<float>();
    return std::vector<float*>{q, q + hd, q + hd + kvd};
  };
  const std::string verified = fmt::format("{}: the verified path", c.name);
  const std::string fused = fmt::format("{}: the fused path", c.name);
  {
    const std::vector<float*> x = qkv_of(ref_qkv), d = qkv_of(ref_d);
    STRATA_TRY(paths.rotate(x[0], rope, rotation.cos, rotation.sin).with_context(verified));
    STRATA_TRY(
        paths.attention.forward(ref_out.as<float>(), ref_lse.as<float>(), x[0], x[1], x[2], shape)
            .with_context(verified));
    STRATA_TRY(paths.attention
                   .backward(d[0], d[1], d[2], d_out.as<float>(), ref_out.as<float>(),
                             ref_lse.as<float>(), x[0], x[1], x[2], shape)
                   .with_context(verified));
    STRATA_TRY(paths.rotate_back(d[0], rope, rotation.cos, rotation.sin).with_context(verified));
  }
  {
    const std::vector<float*> x = qkv_of(got_qkv), d = qkv_of(got_d);
    STRATA_TRY(paths
                   .forward_rotated(got_out.as<float>(), got_lse.as<float>(), x[0], x[1], x[2],
                                    shape, rotation)
                   .with_context(fused));
    STRATA_TRY(paths
                   .backward_rotated(d[0], d[1], d[2], d_out.as<float>(), got_out.as<float>(),
                                     got_lse.as<float>(), x[0], x[1], x[2], shape, rotation)
                   .with_context(fused));
  }
  STRATA_TRY(backend.synchronize(StreamKind::kCompute));
  STRATA_TRY(compare(backend, c, head_dim, "out", ref_out, got_out, rows * hd));
  STRATA_TRY(compare(backend, c, head_dim, "lse", ref_lse, got_lse, rows * c.heads));
  STRATA_TRY(compare(backend, c, head_dim, "dqkv", ref_d, got_d, rows * stride));
  return compare(backend, c, head_dim, "qkv (to be left unrotated)", unrotated, got_qkv,
                 rows * stride);
}

}  // namespace

Status check_rope_in_attention(Backend& backend, const RopeAttentionPaths& paths,
                               std::int64_t head_dim) {
  // A partial width rounded down to an even number, at least 2.
  const std::int64_t partial = std::max<std::int64_t>(2, (head_dim / 2) & ~std::int64_t{1});
  const Case cases[] = {
      {"GQA, whole head rotated", 2, 19, 4, 2, head_dim, 0, false},
      {"partial rotary width, packed documents, window 6", 2, 23, 2, 1, partial, 6, true},
  };
  for (const Case& c : cases)
    STRATA_TRY(check_case(backend, paths, head_dim, c));
  return Status::ok();
}

}  // namespace strata::backend
