// CudaOps and CudaOptimizerOps (see cuda_ops.h).
#include "backend/cuda/cuda_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "kernels/cpu/adam_internal.h"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(backend) {

namespace ck = strata::cuda_kernels;
namespace plan = strata::cuda;

namespace {

// Elements from the first of `rows` rows of `width` values, `stride` apart, to the last one's end.
std::int64_t strided(std::int64_t rows, std::int64_t stride, std::int64_t width) {
  return rows < 1 ? 0 : (rows - 1) * stride + width;
}

}  // namespace

#define STRATA_OPS_CHECK(call, op) check((call), op, __FILE__, __LINE__)

void CudaOps::check(cudaError_t result, const char* op, const char* file, int line) {
  if (result == cudaSuccess) return;
  sink_->add(cuda::check_cuda(result, op, file, line));
}

plan::ColumnReducePlan CudaOps::reduce_plan(std::int64_t rows, std::int64_t cols, int arrays,
                                            const char* op) {
  const plan::ColumnReducePlan p =
      plan::plan_column_reduce(rows, cols, arrays, scratch_.reduce_doubles);
  if (p.chunks == 0) {
    sink_->add(Status(ErrorCode::kInvalidArgument,
                      fmt::format("{}: a gradient of {} columns needs {} doubles of reduction "
                                  "scratch; the CUDA backend has {}",
                                  op, cols, cols * arrays, scratch_.reduce_doubles),
                      "CUDA"));
  }
  return p;
}

void CudaOps::gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                   float beta, float* c, std::int64_t ldc) {
  STRATA_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n);
  if (m > 0 && n > 0 && alone(c, (m - 1) * ldc + n)) {
    // An output kept in 16 bits alone (keeps_attention_grad_alone, keeps_swiglu_grad_alone):
    // written into its companion, the fp32 accumulation rounded once.
    STRATA_ASSERT_MSG(alpha == 1.0f && beta == 0.0f,
                      "a product writing an output kept in 16 bits alone has alpha 1 and beta 0");
    sink_->add(gemm_->gemm_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb,
                                 narrow_for(c, (m - 1) * ldc + n).p, ldc));
    return;
  }
  sink_->add(gemm_->gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

bool CudaOps::epilogue_done(const Result<bool>& fused) {
  if (!fused.is_ok()) {
    sink_->add(fused.status());
    return true;
  }
  return *fused;
}

void CudaOps::gemm_bias(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                        const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                        const float* bias, float* c) {
  STRATA_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n));
  if (m > 0 && n > 0 && alone(c, m * n)) {
    // An output kept in 16 bits alone (keeps_qkv_alone: a qkv projection with a bias).
    ++bias_alone_writes_;
    gemm_bias_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, narrow_for(c, m * n).p);
    return;
  }
  bias = param(bias, n);
  if (!epilogue_done(gemm_->gemm_bias(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c))) {
    add_bias(c, bias, m, n);  // C holds the product alone
  }
}

void CudaOps::gemm_residual(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                            std::int64_t k, const float* a, std::int64_t lda, const float* b,
                            std::int64_t ldb, const float* bias, const float* res, float* c) {
  STRATA_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n));
  // An output kept in 16 bits alone has no fp32 D for the epilogue (no caller keeps one so).
  if (m > 0 && n > 0 && !alone(c, m * n) &&
      epilogue_done(gemm_->gemm_residual(trans_a, trans_b, m, n, k, a, lda, b, ldb, param(bias, n),
                                         res, c))) {
    wrote(c, m * n);
    return;
  }
  Ops<float>::gemm_residual(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, res, c);
}

void CudaOps::gemm_bias_to_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                              std::int64_t k, const float* a, std::int64_t lda, const float* b,
                              std::int64_t ldb, const float* bias, void* c16) {
  // The bias's 16-bit twin is noted where it lies in the unit's compute copy; its fp32 values may
  // be read from the area kept apart.
  sink_->add(
      gemm_->gemm_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb, c16, n, param(bias, n), bias));
}

void CudaOps::gemm_bias_gelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                             std::int64_t k, const float* a, std::int64_t lda, const float* b,
                             std::int64_t ldb, const float* bias, float* pre, float* act) {
  STRATA_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n));
  bias = param(bias, n);
  // An activation kept in 16 bits alone has no fp32 array for the epilogue's D: the product, then
  // GELU writing its companion alone.
  if (!alone(act, m * n) && epilogue_done(gemm_->gemm_bias_gelu(trans_a, trans_b, m, n, k, a, lda,
                                                                b, ldb, bias, pre, act))) {
    return;
  }
  gemm_bias(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, pre);
  gelu_forward(act, pre, m * n);
}

void CudaOps::gemm_dgelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                         const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                         const float* pre, float* scratch, float* dpre) {
  STRATA_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n));
  if (epilogue_done(gemm_->gemm_dgelu(trans_a, trans_b, m, n, k, a, lda, b, ldb, pre, dpre))) {
    return;
  }
  Ops<float>::gemm_dgelu(trans_a, trans_b, m, n, k, a, lda, b, ldb, pre, scratch, dpre);
}

void CudaOps::embedding_forward(float* out, const std::int32_t* tokens,
                                const std::int32_t* positions, const float* wte, const float* wpe,
                                std::int64_t rows, std::int64_t seq_len, std::int64_t channels) {
  STRATA_ASSERT(seq_len > 0 && channels > 0);
  wrote(out, rows * channels);
  STRATA_OPS_CHECK(
      ck::embedding_forward(stream_, out, tokens, positions, wte, wpe, rows, seq_len, channels),
      "embedding_forward");
}

void CudaOps::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                 const std::int32_t* tokens, const std::int32_t* positions,
                                 std::int64_t rows, std::int64_t seq_len, std::int64_t channels,
                                 std::int32_t padding_idx) {
  STRATA_ASSERT(seq_len > 0 && channels > 0);
  STRATA_OPS_CHECK(ck::embedding_backward(stream_, dwte, dwpe, dout, tokens, positions, rows,
                                          seq_len, channels, padding_idx),
                   "embedding_backward");
}

void CudaOps::layernorm_forward(float* out, float* mean, float* rstd, const float* x,
                                const float* w, const float* b, std::int64_t rows,
                                std::int64_t channels, double eps) {
  w = param(w, channels);
  b = param(b, channels);
  const ck::Narrow narrow = narrow_for(out, rows * channels);
  wrote(mean, rows);
  wrote(rstd, rows);
  STRATA_OPS_CHECK(ck::layernorm_forward(stream_, wide_out(out, rows * channels), mean, rstd, x, w,
                                         b, rows, channels, eps, narrow),
                   "layernorm_forward");
  wrote(out, rows * channels, narrow);
}

void CudaOps::add_layernorm_forward(float* res, const float* x, float* out, float* mean,
                                    float* rstd, const float* w, const float* b, std::int64_t rows,
                                    std::int64_t channels, double eps) {
  if (!fused_norm_) {
    Ops<float>::add_layernorm_forward(res, x, out, mean, rstd, w, b, rows, channels, eps);
    return;
  }
  ++fused_norm_calls_;
  w = param(w, channels);
  b = param(b, channels);
  const ck::Narrow narrow = narrow_for(out, rows * channels);
  wrote(res, rows * channels);
  wrote(mean, rows);
  wrote(rstd, rows);
  STRATA_OPS_CHECK(ck::add_layernorm_forward(stream_, res, x, wide_out(out, rows * channels), mean,
                                             rstd, w, b, rows, channels, eps, narrow),
                   "add_layernorm_forward");
  wrote(out, rows * channels, narrow);
}

void CudaOps::add_rmsnorm_forward(float* res, const float* x, float* out, float* rstd,
                                  const float* w, std::int64_t rows, std::int64_t channels,
                                  double eps) {
  if (!fused_norm_) {
    Ops<float>::add_rmsnorm_forward(res, x, out, rstd, w, rows, channels, eps);
    return;
  }
  ++fused_norm_calls_;
  w = param(w, channels);
  const ck::Narrow narrow = narrow_for(out, rows * channels);
  wrote(res, rows * channels);
  wrote(rstd, rows);
  STRATA_OPS_CHECK(ck::add_rmsnorm_forward(stream_, res, x, wide_out(out, rows * channels), rstd, w,
                                           rows, channels, eps, narrow),
                   "add_rmsnorm_forward");
  wrote(out, rows * channels, narrow);
}

void CudaOps::layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                                 const float* w, const float* mean, const float* rstd,
                                 std::int64_t rows, std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  const plan::ColumnReducePlan p = reduce_plan(rows, channels, 2, "layernorm_backward");
  if (p.chunks == 0) return;
  w = param(w, channels);
  const ck::Narrow narrow = narrow_for(dx, rows * channels);
  const ck::Sixteen dout16 =
      grad_alone(&dout, rows * channels, keeps_norm_grad_alone(), &norm_grad_reads_);
  STRATA_OPS_CHECK(ck::layernorm_backward(stream_, dx, dw, db, dout, x, w, mean, rstd, rows,
                                          channels, p, scratch_.reduce, narrow, dout16),
                   "layernorm_backward");
  wrote(dx, rows * channels, narrow);
}

void CudaOps::rmsnorm_forward(float* out, float* rstd, const float* x, const float* w,
                              std::int64_t rows, std::int64_t channels, double eps) {
  w = param(w, channels);
  const ck::Narrow narrow = narrow_for(out, rows * channels);
  wrote(rstd, rows);
  STRATA_OPS_CHECK(ck::rmsnorm_forward(stream_, wide_out(out, rows * channels), rstd, x, w, rows,
                                       channels, eps, narrow),
                   "rmsnorm_forward");
  wrote(out, rows * channels, narrow);
}

void CudaOps::rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x,
                               const float* w, const float* rstd, std::int64_t rows,
                               std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  const plan::ColumnReducePlan p = reduce_plan(rows, channels, 1, "rmsnorm_backward");
  if (p.chunks == 0) return;
  w = param(w, channels);
  const ck::Narrow narrow = narrow_for(dx, rows * channels);
  const ck::Sixteen dout16 =
      grad_alone(&dout, rows * channels, keeps_norm_grad_alone(), &norm_grad_reads_);
  STRATA_OPS_CHECK(ck::rmsnorm_backward(stream_, dx, dw, dout, x, w, rstd, rows, channels, p,
                                        scratch_.reduce, narrow, dout16),
                   "rmsnorm_backward");
  wrote(dx, rows * channels, narrow);
}

void CudaOps::rmsnorm_heads_forward(float* out, float* rstd, const float* x, const float* w,
                                    std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                                    std::int64_t x_stride, std::int64_t out_stride, double eps) {
  STRATA_ASSERT(x_stride >= heads * head_dim && out_stride >= heads * head_dim);
  w = param(w, head_dim);
  wrote(out, strided(rows, out_stride, heads * head_dim));
  wrote(rstd, rows * heads);
  STRATA_OPS_CHECK(ck::rmsnorm_heads_forward(stream_, out, rstd, x, w, rows, heads, head_dim,
                                             x_stride, out_stride, eps),
                   "rmsnorm_heads_forward");
}

void CudaOps::rmsnorm_heads_backward(float* d, float* dw, const float* x, const float* w,
                                     const float* rstd, std::int64_t rows, std::int64_t heads,
                                     std::int64_t head_dim, std::int64_t d_stride,
                                     std::int64_t x_stride) {
  STRATA_ASSERT(x_stride >= heads * head_dim && d_stride >= heads * head_dim);
  if (rows <= 0 || heads <= 0 || head_dim <= 0) return;
  const plan::ColumnReducePlan p = reduce_plan(rows * heads, head_dim, 1, "rmsnorm_heads_backward");
  if (p.chunks == 0) return;
  w = param(w, head_dim);
  const ck::Narrow narrow = rewrite_in_place(d, strided(rows, d_stride, heads * head_dim));
  STRATA_OPS_CHECK(ck::rmsnorm_heads_backward(stream_, d, dw, x, w, rstd, rows, heads, head_dim,
                                              d_stride, x_stride, p, scratch_.reduce, narrow),
                   "rmsnorm_heads_backward");
}

void CudaOps::gelu_forward(float* out, const float* x, std::int64_t n) {
  const ck::Narrow narrow = narrow_for(out, n);
  STRATA_OPS_CHECK(ck::gelu_forward(stream_, wide_out(out, n), x, n, narrow), "gelu_forward");
  wrote(out, n, narrow);
}

void CudaOps::gelu_backward(float* dx, const float* x, const float* dout, std::int64_t n) {
  const ck::Narrow narrow = narrow_for(dx, n);
  STRATA_OPS_CHECK(ck::gelu_backward(stream_, dx, x, dout, n, narrow), "gelu_backward");
  wrote(dx, n, narrow);
}

void CudaOps::swiglu_forward(float* out, const float* gate_up, std::int64_t rows,
                             std::int64_t inner) {
  const ck::Narrow narrow = narrow_for(out, rows * inner);
  STRATA_OPS_CHECK(
      ck::swiglu_forward(stream_, wide_out(out, rows * inner), gate_up, rows, inner, narrow),
      "swiglu_forward");
  wrote(out, rows * inner, narrow);
}

void CudaOps::swiglu_backward(float* dgate_up, const float* gate_up, const float* dout,
                              std::int64_t rows, std::int64_t inner) {
  const ck::Narrow narrow = narrow_for(dgate_up, 2 * rows * inner);
  STRATA_OPS_CHECK(ck::swiglu_backward(stream_, dgate_up, gate_up, dout, rows, inner, narrow),
                   "swiglu_backward");
  wrote(dgate_up, 2 * rows * inner, narrow);
}

void CudaOps::add(float* out, const float* a, const float* b, std::int64_t n) {
  wrote(out, n);
  STRATA_OPS_CHECK(ck::add(stream_, out, a, b, n), "add");
}

void CudaOps::add_bias(float* x, const float* bias, std::int64_t rows, std::int64_t channels) {
  bias = param(bias, channels);
  wrote(x, rows * channels);
  STRATA_OPS_CHECK(ck::add_bias(stream_, x, bias, rows, channels), "add_bias");
}

void CudaOps::bias_backward(float* dbias, const float* dout, std::int64_t rows,
                            std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  const plan::ColumnReducePlan p = reduce_plan(rows, channels, 1, "bias_backward");
  if (p.chunks == 0) return;
  // A gradient kept in 16 bits alone is read from its companion, widened: GPT-2's q/k/v gradient
  // (keeps_qkv_grad_alone), the values of the fp32 array it stands for; GPT-2's GELU gradient
  // (keeps_gelu_grad_alone), its values rounded.
  const bool gelu = dout == gelu_grad_key_;
  const ck::Sixteen dout16 =
      grad_alone(&dout, rows * channels, gelu ? keeps_gelu_grad_alone() : qkv_grad_alone_,
                 gelu ? &gelu_grad_bias_reads_ : &qkv_grad_bias_reads_);
  STRATA_OPS_CHECK(
      ck::bias_backward(stream_, dbias, dout, rows, channels, p, scratch_.reduce, dout16),
      "bias_backward");
}

namespace {

void check_rope(const backend::RopeShape& s) {
  const std::int64_t rotary = s.rotary_dim > 0 ? s.rotary_dim : s.head_dim;
  STRATA_ASSERT(rotary % 2 == 0 && rotary <= s.head_dim && s.seq_len > 0);
}

}  // namespace

void CudaOps::rope_forward(float* x, const backend::RopeShape& shape, const float* cos,
                           const float* sin) {
  check_rope(shape);
  wrote(x, strided(shape.rows, shape.stride, shape.heads * shape.head_dim));
  STRATA_OPS_CHECK(ck::rope(stream_, x, shape, cos, sin, 1.0f), "rope_forward");
}

void CudaOps::rope_backward(float* dx, const backend::RopeShape& shape, const float* cos,
                            const float* sin) {
  check_rope(shape);
  const ck::Narrow narrow =
      rewrite_in_place(dx, strided(shape.rows, shape.stride, shape.heads * shape.head_dim));
  STRATA_OPS_CHECK(ck::rope(stream_, dx, shape, cos, sin, -1.0f, narrow), "rope_backward");
}

namespace {

// The CPU kernel's preconditions (kernels/cpu/attention.cc), then the GPU kernels' own limit.
Status attention_launch(const backend::AttentionShape& s, plan::AttentionLaunch* launch) {
  STRATA_ASSERT(s.batch > 0 && s.seq_len > 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0);
  STRATA_ASSERT(s.heads % s.kv_heads == 0);
  STRATA_ASSERT(s.q_stride >= s.heads * s.head_dim);
  STRATA_ASSERT(s.kv_stride >= s.kv_heads * s.head_dim);
  STRATA_ASSERT(s.out_stride >= s.heads * s.head_dim);
  *launch = plan::plan_attention(s.head_dim);
  if (launch->per_lane == 0) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("attention head_dim {} is not supported by the CUDA kernels; "
                              "valid: 1 to {}",
                              s.head_dim, plan::kAttentionHeadDimMax),
                  "CUDA");
  }
  if (s.batch > 65535 || s.heads > 65535) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("attention with batch {} and {} heads exceeds the CUDA grid "
                              "(at most 65535 each)",
                              s.batch, s.heads),
                  "CUDA");
  }
  return Status::ok();
}

}  // namespace

bool CudaOps::takes_flash(const backend::AttentionShape& s) const {
  if (scratch_.sixteen == nullptr) return false;
  if (std::find(flash_head_sizes_.begin(), flash_head_sizes_.end(), s.head_dim) ==
      flash_head_sizes_.end()) {
    return false;
  }
  return plan::flash_io_takes(s.batch, s.seq_len, s.heads, s.kv_heads, s.head_dim,
                              scratch_.sixteen_elements);
}

bool CudaOps::takes_cudnn(const backend::AttentionShape& s, const float* lse) const {
  // cuDNN reads the lse (its stats) where the caller keeps it, as a 16-byte-aligned tensor.
  if (cudnn_.inner == nullptr || s.positions != nullptr) return false;
  if (reinterpret_cast<std::uintptr_t>(lse) % 16 != 0) return false;
  if (std::find(cudnn_.head_sizes.begin(), cudnn_.head_sizes.end(), s.head_dim) ==
      cudnn_.head_sizes.end()) {
    return false;
  }
  return takes_flash(s) && cudnn_.accepts(s);
}

bool CudaOps::staged_ran(cudaError_t result, const char* op) {
  if (result == cudaSuccess) {
    ++cudnn_calls_;
    return true;
  }
  if (result == cudaErrorUnknown) {
    Status why = cudnn_.take_error();
    if (!why.is_ok()) {
      // cuDNN refused the call (nothing of it ran on the device past the refusal): the path goes
      // off for the rest of the run, with one warning, and this call runs the flash kernels.
      const StagedAttention off = std::exchange(cudnn_, StagedAttention{});
      if (off.refused) off.refused(why.with_context(op));
      return false;
    }
  }
  STRATA_OPS_CHECK(result, op);
  return true;
}

namespace {

// Whether an attention call rotates q and k in its staging (the rotation's width checked).
bool rotating(const backend::AttentionShape& shape, const kernels::QkRotation<float>& rope) {
  if (rope.cos == nullptr) return false;
  const std::int64_t rotary = rope.rotary_dim > 0 ? rope.rotary_dim : shape.head_dim;
  STRATA_ASSERT(rotary % 2 == 0 && rotary <= shape.head_dim && rope.sin != nullptr);
  return true;
}

}  // namespace

int CudaOps::attention_code() const {
  return flash_bf16_ ? ck::kCodeBF16 : ck::kCodeF16;
}

bool CudaOps::keeps_attention_typed_alone() const {
  return keeps_narrow_alone() && static_cast<int>(narrow_type_) == attention_code();
}

bool CudaOps::keeps_attention_alone(const backend::AttentionShape& s) const {
  return attention_alone_ && keeps_attention_typed_alone() &&
         s.out_stride == s.heads * s.head_dim && takes_flash(s);
}

bool CudaOps::keeps_qkv_grad_alone(const backend::AttentionShape& s) const {
  return qkv_grad_alone_ && keeps_attention_typed_alone() && takes_flash(s);
}

bool CudaOps::keeps_qkv_alone(const backend::AttentionShape& s) const {
  return qkv_alone_ && keeps_attention_typed_alone() && takes_flash(s);
}

bool CudaOps::attention_rotates(const backend::AttentionShape& shape) const {
  return rope_in_attention_ && takes_flash(shape);
}

void CudaOps::attention_forward(float* out, float* lse, const float* q, const float* k,
                                const float* v, const backend::AttentionShape& shape) {
  attention_forward_impl(out, lse, q, k, v, shape, {});
}

void CudaOps::attention_forward_rotated(float* out, float* lse, const float* q, const float* k,
                                        const float* v, const backend::AttentionShape& shape,
                                        const kernels::QkRotation<float>& rope) {
  STRATA_ASSERT(attention_rotates(shape) && rope.cos != nullptr);  // rotating() checks the rest
  attention_forward_impl(out, lse, q, k, v, shape, rope);
}

void CudaOps::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                 const float* out, const float* lse, const float* q, const float* k,
                                 const float* v, const backend::AttentionShape& shape) {
  attention_backward_impl(dq, dk, dv, dout, out, lse, q, k, v, shape, {});
}

void CudaOps::attention_backward_rotated(float* dq, float* dk, float* dv, const float* dout,
                                         const float* out, const float* lse, const float* q,
                                         const float* k, const float* v,
                                         const backend::AttentionShape& shape,
                                         const kernels::QkRotation<float>& rope) {
  STRATA_ASSERT(attention_rotates(shape) && rope.cos != nullptr);  // rotating() checks the rest
  attention_backward_impl(dq, dk, dv, dout, out, lse, q, k, v, shape, rope);
}

void CudaOps::attention_forward_impl(float* out, float* lse, const float* q, const float* k,
                                     const float* v, const backend::AttentionShape& shape,
                                     const kernels::QkRotation<float>& rope) {
  if (rotating(shape, rope)) ++rotated_attention_calls_;
  const std::int64_t rows = shape.batch * shape.seq_len;
  const std::int64_t width = shape.heads * shape.head_dim;
  // An output kept alone (keeps_attention_alone) has no fp32 array: the 16-bit attention writes its
  // companion alone.
  float* wide = out;
  if (alone(out, rows * width)) {
    STRATA_ASSERT_MSG(keeps_attention_alone(shape),
                      "an attention output kept in 16 bits alone of a shape the 16-bit attention "
                      "does not take");
    ++attention_alone_writes_;
    wide = nullptr;
  } else {
    wrote(out, strided(rows, shape.out_stride, width));
  }
  wrote(lse, rows * shape.heads);
  // The 16-bit paths round their output into its companion too, where its rows lie side by side
  // (every value of the range written).
  const ck::Narrow narrow =
      shape.out_stride == width ? narrow_for(out, rows * width) : ck::Narrow{};
  // q, k and v kept in 16 bits alone are staged from their companion.
  const float *q_wide = q, *k_wide = k, *v_wide = v;
  const ck::QkvSixteen qkv16 = qkv_alone(&q_wide, &k_wide, &v_wide, shape);
  if (takes_cudnn(shape, lse) &&
      staged_ran(ck::attention16_forward_f32(stream_, flash_bf16_, *cudnn_.inner, scratch_.sixteen,
                                             scratch_.sixteen_elements, wide, lse, q_wide, k_wide,
                                             v_wide, shape, narrow, rope, qkv16),
                 "cuDNN attention forward")) {
    wrote(out, rows * width, narrow);
    return;
  }
  if (takes_flash(shape)) {
    ++flash_calls_;
    STRATA_OPS_CHECK(ck::flash_attention_forward_f32(stream_, flash_bf16_, scratch_.sixteen,
                                                     scratch_.sixteen_elements, wide, lse, q_wide,
                                                     k_wide, v_wide, shape, narrow, rope, qkv16),
                     "flash attention forward");
    wrote(out, rows * width, narrow);
    return;
  }
  // The fp32 kernels read q and k as they are: attention_rotates() promised the staging.
  STRATA_ASSERT(rope.cos == nullptr);
  ++fp32_attention_calls_;
  plan::AttentionLaunch launch;
  const Status ok = attention_launch(shape, &launch);
  if (!ok.is_ok()) {
    sink_->add(ok);
    return;
  }
  STRATA_OPS_CHECK(ck::attention_forward(stream_, out, lse, q, k, v, shape, launch),
                   "attention_forward");
}

const std::uint16_t* CudaOps::staged_companion(const float* out,
                                               const backend::AttentionShape& shape) const {
  const std::int64_t width = shape.heads * shape.head_dim;
  const int code = attention_code();
  if (shape.out_stride != width || static_cast<int>(narrow_type_) != code) return nullptr;
  const std::int64_t n = shape.batch * shape.seq_len * width;
  if (!gemm_->has_companion(out, n, code)) return nullptr;
  const ck::Narrow companion = narrow_for(out, n);
  if (reinterpret_cast<std::uintptr_t>(companion.p) % 16 != 0) return nullptr;
  return companion.p;
}

void CudaOps::attention_backward_impl(float* dq, float* dk, float* dv, const float* dout,
                                      const float* out, const float* lse, const float* q,
                                      const float* k, const float* v,
                                      const backend::AttentionShape& shape,
                                      const kernels::QkRotation<float>& rope) {
  if (rotating(shape, rope)) ++rotated_attention_calls_;
  const std::int64_t rows = shape.batch * shape.seq_len;
  const std::int64_t hd = shape.heads * shape.head_dim, kvd = shape.kv_heads * shape.head_dim;
  // dq, dk and dv side by side in every row of one buffer (the model's q/k/v gradient): the 16-bit
  // paths round them into its companion too, noted as one range once all three are written.
  const std::int64_t stride = hd + 2 * kvd;
  const bool side_by_side =
      dk == dq + hd && dv == dk + kvd && shape.q_stride == stride && shape.kv_stride == stride;
  ck::QkvNarrow narrow;
  if (side_by_side) {
    const ck::Narrow all = narrow_for(dq, rows * stride);
    if (all.p != nullptr) narrow = {all, {all.p + hd, all.code}, {all.p + hd + kvd, all.code}};
  }
  // A gradient kept in 16 bits alone (keeps_qkv_grad_alone): the flash epilogue or the staging's
  // widening writes its companion alone.
  float *dq_wide = dq, *dk_wide = dk, *dv_wide = dv;
  if (side_by_side && alone(dq, rows * stride)) {
    STRATA_ASSERT_MSG(keeps_qkv_grad_alone(shape) && narrow.q.p != nullptr,
                      "the gradient of q, k and v kept in 16 bits alone without its path on");
    dq_wide = dk_wide = dv_wide = nullptr;
    ++qkv_grad_writes_;
  } else {
    wrote(dq, strided(rows, shape.q_stride, hd));
    wrote(dk, strided(rows, shape.kv_stride, kvd));
    wrote(dv, strided(rows, shape.kv_stride, kvd));
  }
  const std::uint16_t* out16 = staged_companion(out, shape);
  // An output kept alone is read from its companion alone; so is a gradient kept alone.
  const float* out_wide = out;
  if (alone(out, rows * hd)) {
    STRATA_ASSERT_MSG(keeps_attention_alone(shape) && out16 != nullptr,
                      "an attention output kept in 16 bits alone without its companion to read");
    out_wide = nullptr;
  }
  const float* dout_wide = dout;
  const std::uint16_t* dout16 = nullptr;
  if (alone(dout, rows * hd)) {
    dout16 = staged_companion(dout, shape);
    STRATA_ASSERT_MSG(keeps_attention_grad_alone(shape) && dout16 != nullptr,
                      "an attention output's gradient kept in 16 bits alone without its companion "
                      "to read");
    dout_wide = nullptr;
    ++attention_grad_reads_;
  }
  // q, k and v kept in 16 bits alone are staged from their companion.
  const float *q_wide = q, *k_wide = k, *v_wide = v;
  const ck::QkvSixteen qkv16 = qkv_alone(&q_wide, &k_wide, &v_wide, shape);
  if (takes_cudnn(shape, lse) &&
      staged_ran(ck::attention16_backward_f32(stream_, flash_bf16_, *cudnn_.inner, scratch_.sixteen,
                                              scratch_.sixteen_elements, dq_wide, dk_wide, dv_wide,
                                              dout_wide, out_wide, lse, q_wide, k_wide, v_wide,
                                              shape, narrow, rope, out16, dout16, qkv16),
                 "cuDNN attention backward")) {
    if (out16 != nullptr) ++staged_companion_reads_;
    wrote(dq, rows * stride, narrow.q);
    return;
  }
  if (takes_flash(shape)) {
    ++flash_calls_;
    if (out16 != nullptr) ++staged_companion_reads_;
    STRATA_OPS_CHECK(ck::flash_attention_backward_f32(
                         stream_, flash_bf16_, scratch_.sixteen, scratch_.sixteen_elements, dq_wide,
                         dk_wide, dv_wide, dout_wide, out_wide, lse, q_wide, k_wide, v_wide, shape,
                         narrow, rope, out16, dout16, qkv16),
                     "flash attention backward");
    wrote(dq, rows * stride, narrow.q);
    return;
  }
  STRATA_ASSERT(rope.cos == nullptr);
  ++fp32_attention_calls_;
  plan::AttentionLaunch launch;
  const Status ok = attention_launch(shape, &launch);
  if (!ok.is_ok()) {
    sink_->add(ok);
    return;
  }
  STRATA_OPS_CHECK(
      ck::attention_backward(stream_, dq, dk, dv, dout, out, lse, q, k, v, shape, launch),
      "attention_backward");
}

void CudaOps::cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets,
                                    std::int64_t rows, std::int64_t vocab) {
  STRATA_ASSERT(vocab > 0);
  wrote(losses, rows);
  STRATA_OPS_CHECK(ck::cross_entropy_forward(stream_, losses, logits, targets, rows, vocab),
                   "cross_entropy_forward");
}

void CudaOps::cross_entropy_fused(float* logits, float* losses, const std::int32_t* targets,
                                  std::int64_t rows, std::int64_t vocab, double grad_scale) {
  STRATA_ASSERT(vocab > 0);
  const ck::Narrow narrow = narrow_for(logits, rows * vocab);
  wrote(losses, rows);
  STRATA_OPS_CHECK(ck::cross_entropy_fused(stream_, logits, losses, targets, rows, vocab,
                                           static_cast<float>(grad_scale), narrow),
                   "cross_entropy_fused");
  wrote(logits, rows * vocab, narrow);
}

void CudaOps::gemm_to_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                             std::int64_t k, const float* a, std::int64_t lda, const float* b,
                             std::int64_t ldb, void* c, std::int64_t ldc) {
  STRATA_ASSERT(logits_in_narrow() || keeps_gate_up_narrow());
  STRATA_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n);
  sink_->add(gemm_->gemm_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc));
}

void CudaOps::gemm_bias_gelu_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                    std::int64_t k, const float* a, std::int64_t lda,
                                    const float* b, std::int64_t ldb, const float* bias,
                                    void* pre16, float* act) {
  STRATA_ASSERT(keeps_gelu_narrow());
  STRATA_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n));
  ++narrow_gelu_calls_;
  const ck::Narrow narrow = narrow_for(act, m * n);
  // An activation kept in 16 bits alone: the product, its bias and GELU in one call where the
  // 16-bit GELU epilogue is on (GELU of the fp32 pre-activation; both rounded once).
  if (alone(act, m * n) &&
      epilogue_done(gemm_->gemm_bias_gelu_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb,
                                                param(bias, n), bias, pre16, narrow.p))) {
    ++alone_writes_;
    wrote(act, m * n, narrow);
    return;
  }
  // The product and its bias rounded once into pre16, then GELU on those 16 bits.
  gemm_bias_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, pre16);
  STRATA_OPS_CHECK(ck::gelu_forward_16(stream_, wide_out(act, m * n), pre16,
                                       static_cast<int>(narrow_type_), m * n, narrow),
                   "gelu_forward_16");
  wrote(act, m * n, narrow);
}

void CudaOps::gemm_dgelu_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                std::int64_t k, const float* a, std::int64_t lda, const float* b,
                                std::int64_t ldb, const void* pre16, float* scratch, float* dpre) {
  STRATA_ASSERT(keeps_gelu_narrow());
  ++narrow_gelu_calls_;
  const ck::Narrow narrow = narrow_for(dpre, m * n);
  // A gradient kept in 16 bits alone: its companion alone is written, in the product's epilogue
  // where the 16-bit DGELU epilogue is on (no fp32 product is written or read).
  float* dpre_wide = dpre;
  if (alone(dpre, m * n)) {
    STRATA_ASSERT_MSG(keeps_gelu_grad_alone() && narrow.p != nullptr,
                      "GELU's gradient kept in 16 bits alone without its path on");
    dpre_wide = nullptr;
    gelu_grad_key_ = dpre;
    ++gelu_grad_writes_;
    // Without a scratch the product's epilogue must run (the fallback kernel's where cuBLASLt
    // declines it).
    if (epilogue_done(gemm_->gemm_dgelu_to_16(trans_a, trans_b, m, n, k, a, lda, b, ldb, pre16,
                                              narrow.p, scratch == nullptr))) {
      wrote(dpre, m * n, narrow);
      return;
    }
  }
  STRATA_ASSERT_MSG(scratch != nullptr,
                    "GELU's gradient without its fp32 scratch outside its fused path");
  gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, scratch, n);
  STRATA_OPS_CHECK(ck::gelu_backward_16(stream_, dpre_wide, pre16, static_cast<int>(narrow_type_),
                                        scratch, m * n, narrow),
                   "gelu_backward_16");
  wrote(dpre, m * n, narrow);
}

bool CudaOps::fuses_gelu_grad() const {
  return keeps_gelu_grad_alone() && gemm_->dgelu_epilogue_16();
}

void CudaOps::swiglu_forward_narrow(float* out, const void* gate_up, std::int64_t rows,
                                    std::int64_t inner) {
  STRATA_ASSERT(keeps_gate_up_narrow());
  ++narrow_swiglu_calls_;
  const ck::Narrow narrow = narrow_for(out, rows * inner);
  STRATA_OPS_CHECK(ck::swiglu_forward_16(stream_, wide_out(out, rows * inner), gate_up,
                                         static_cast<int>(narrow_type_), rows, inner, narrow),
                   "swiglu_forward_16");
  wrote(out, rows * inner, narrow);
}

void CudaOps::swiglu_backward_narrow(float* dgate_up, const void* gate_up, const float* dout,
                                     std::int64_t rows, std::int64_t inner) {
  STRATA_ASSERT(keeps_gate_up_narrow());
  ++narrow_swiglu_calls_;
  const ck::Narrow narrow = narrow_for(dgate_up, 2 * rows * inner);
  // A gradient kept in 16 bits alone is read from its companion, widened.
  const ck::Sixteen dout16 =
      grad_alone(&dout, rows * inner, keeps_swiglu_grad_alone(), &swiglu_grad_reads_);
  // A gradient of gate and up kept in 16 bits alone: its companion alone is written.
  float* dgate_up_wide = dgate_up;
  if (alone(dgate_up, 2 * rows * inner)) {
    STRATA_ASSERT_MSG(keeps_gate_up_grad_alone() && narrow.p != nullptr,
                      "the gradient of gate and up kept in 16 bits alone without its path on");
    dgate_up_wide = nullptr;
    ++gate_up_grad_writes_;
  }
  STRATA_OPS_CHECK(
      ck::swiglu_backward_16(stream_, dgate_up_wide, gate_up, static_cast<int>(narrow_type_), dout,
                             dout16.p, rows, inner, narrow),
      "swiglu_backward_16");
  wrote(dgate_up, 2 * rows * inner, narrow);
}

void CudaOps::gemm_from_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                               std::int64_t k, float alpha, const void* a, std::int64_t lda,
                               const float* b, std::int64_t ldb, float beta, float* c,
                               std::int64_t ldc) {
  STRATA_ASSERT(logits_in_narrow());
  STRATA_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n);
  sink_->add(gemm_->gemm_from_16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

void CudaOps::cross_entropy_narrow(bool gradient, void* logits, std::int64_t ld, float* losses,
                                   const std::int32_t* targets, std::int64_t rows,
                                   std::int64_t vocab, double grad_scale) {
  STRATA_ASSERT(logits_in_narrow() && vocab > 0 && ld >= vocab);
  wrote(losses, rows);
  narrow_logit_rows_ += rows;
  STRATA_OPS_CHECK(
      ck::cross_entropy_16(stream_, gradient, logits, ld, gemm_->sixteen_code(), losses, targets,
                           rows, vocab, static_cast<float>(grad_scale)),
      "cross_entropy_16");
}

double CudaOps::reduce(const float* x, std::int64_t n, bool squares) {
  if (n <= 0) return 0.0;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  STRATA_OPS_CHECK(ck::reduce_stats(stream_, x, ck::kCodeF32, n, squares, scratch_.partials,
                                    scratch_.sum_result, false),
                   squares ? "sum_squares" : "sum");
  STRATA_OPS_CHECK(cudaMemcpyAsync(scratch_.host, scratch_.sum_result, 2 * sizeof(double),
                                   cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpyAsync (reduction result)");
  STRATA_OPS_CHECK(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (reduction result)");
  return sink_->failed() ? nan : scratch_.host[0];
}

double CudaOps::sum_squares(const float* x, std::int64_t n) {
  return reduce(x, n, true);
}

double CudaOps::sum(const float* x, std::int64_t n) {
  return reduce(x, n, false);
}

void CudaOps::scale(float* x, std::int64_t n, double alpha) {
  wrote(x, n);
  STRATA_OPS_CHECK(ck::scale(stream_, x, n, static_cast<float>(alpha)), "scale");
}

void CudaOps::zero(float* x, std::int64_t n) {
  if (n <= 0) return;
  wrote(x, n);
  STRATA_OPS_CHECK(cudaMemsetAsync(x, 0, static_cast<std::size_t>(n) * sizeof(float), stream_),
                   "cudaMemsetAsync (zero)");
}

void CudaOps::copy(float* dst, const float* src, std::int64_t n) {
  if (n <= 0) return;
  wrote(dst, n);
  STRATA_OPS_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_),
                   "cudaMemcpyAsync (copy)");
}

void CudaOps::cast_from(float* dst, const void* src, backend::DType src_type, std::int64_t n) {
  wrote(dst, n);
  STRATA_OPS_CHECK(ck::cast(stream_, dst, ck::kCodeF32, src, static_cast<int>(src_type), n),
                   "cast_from");
}

void CudaOps::cast_to(void* dst, backend::DType dst_type, const float* src, std::int64_t n) {
  if (n > 0) wrote_bytes(dst, static_cast<std::uint64_t>(n) * kernels::dtype_bytes(dst_type));
  STRATA_OPS_CHECK(ck::cast(stream_, dst, static_cast<int>(dst_type), src, ck::kCodeF32, n),
                   "cast_to");
}

void CudaOps::add_rounded(float* acc, const float* g, backend::DType type, std::int64_t n,
                          bool assign) {
  STRATA_ASSERT(type == backend::DType::kBF16 || type == backend::DType::kF16);
  wrote(acc, n);
  STRATA_OPS_CHECK(ck::add_rounded(stream_, acc, g, static_cast<int>(type), n, assign),
                   "add_rounded");
}

void CudaOps::note_widened(const float* wide, const void* narrow, backend::DType type,
                           std::int64_t n) {
  if (type == backend::DType::kBF16 || type == backend::DType::kF16)
    gemm_->note_widened(wide, narrow, static_cast<int>(type), n);
}

void CudaOps::forget_widened(const float* wide) {
  gemm_->forget_widened(wide);
  std::erase_if(aparts_, [wide](const Apart& a) { return a.wide == wide; });
}

void CudaOps::cast_from_ranges(float* dst, const void* src, backend::DType src_type,
                               const std::int64_t* begin, const std::int64_t* n, int count,
                               const std::int64_t* at) {
  if (src_type != backend::DType::kBF16 && src_type != backend::DType::kF16) {
    Ops<float>::cast_from_ranges(dst, src, src_type, begin, n, count, at);
    return;
  }
  for (int i = 0; i < count; ++i)
    wrote(dst + at[i], n[i]);
  STRATA_OPS_CHECK(
      ck::cast_ranges_from_16(stream_, dst, src, static_cast<int>(src_type), begin, n, count, at),
      "cast_from_ranges");
}

bool CudaOps::note_kept_apart(const float* wide, const float* apart, const std::int64_t* begin,
                              const std::int64_t* n, const std::int64_t* at, int count) {
  if (!kept_apart_) return false;
  std::erase_if(aparts_, [wide](const Apart& a) { return a.wide == wide; });
  if (static_cast<int>(aparts_.size()) >= kApartMax) return false;
  aparts_.push_back({wide, apart, std::vector<std::int64_t>(begin, begin + count),
                     std::vector<std::int64_t>(n, n + count),
                     std::vector<std::int64_t>(at, at + count)});
  return true;
}

const float* CudaOps::param(const float* p, std::int64_t n) {
  if (aparts_.empty() || p == nullptr) return p;
  // Addresses as integers: p may lie in no noted copy at all.
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (const Apart& a : aparts_) {
    for (std::size_t i = 0; i < a.begin.size(); ++i) {
      const auto first = reinterpret_cast<std::uintptr_t>(a.wide + a.begin[i]);
      const auto last = first + static_cast<std::uintptr_t>(a.n[i]) * sizeof(float);
      if (at < first || at >= last) continue;
      const auto offset = static_cast<std::int64_t>((at - first) / sizeof(float));
      if (offset + n > a.n[i]) {
        sink_->add(Status(ErrorCode::kInternal,
                          fmt::format("a parameter of {} elements starts {} elements before the "
                                      "end of a range kept apart from its compute copy",
                                      n, a.n[i] - offset),
                          "CUDA"));
        return p;
      }
      ++apart_reads_;
      return a.apart + a.at[i] + offset;
    }
  }
  return p;
}

bool CudaOps::note_widened_weights_only(const float* wide, const void* narrow, backend::DType type,
                                        std::int64_t n) {
  if (type != backend::DType::kBF16 && type != backend::DType::kF16) return false;
  return gemm_->note_weights_only_in_16(wide, narrow, static_cast<int>(type), n);
}

void CudaOps::use_companions(backend::DType type) {
  STRATA_ASSERT(type == backend::DType::kF32 || type == backend::DType::kBF16 ||
                type == backend::DType::kF16);
  narrow_type_ = type;
  gemm_->use_companions(type != backend::DType::kF32);
  if (type == backend::DType::kF32) pairs_.clear();
}

void CudaOps::pair_narrow(const float* wide, void* narrow, std::int64_t n) {
  if (narrow_type_ == backend::DType::kF32 || n < 1) return;
  unpair_narrow(wide);
  pairs_.push_back({wide, narrow, n});
}

bool CudaOps::pair_narrow_alone(const float* key, void* narrow, std::int64_t n) {
  if (!keeps_narrow_alone() || n < 1) return false;
  unpair_narrow(key);
  if (!gemm_->note_rounded_alone(key, narrow, static_cast<int>(narrow_type_), n)) return false;
  pairs_.push_back({key, narrow, n, true});
  return true;
}

float* CudaOps::wide_out(float* out, std::int64_t n) {
  if (!alone(out, n)) return out;
  ++alone_writes_;
  return nullptr;
}

const CudaOps::Pair* CudaOps::pair_of(const float* p, std::int64_t n) const {
  for (const Pair& pair : pairs_) {
    if (p >= pair.wide && p + n <= pair.wide + pair.n) return &pair;
  }
  return nullptr;
}

bool CudaOps::alone(const float* p, std::int64_t n) const {
  const Pair* pair = pair_of(p, n);
  return pair != nullptr && pair->alone;
}

void CudaOps::unpair_narrow(const float* wide) {
  for (const Pair& p : pairs_) {
    if (p.wide != wide) continue;
    if (p.alone) {
      gemm_->forget_alone(wide);
    } else {
      wrote(p.wide, p.n);  // what the GEMMs knew of it goes too
    }
  }
  std::erase_if(pairs_, [wide](const Pair& p) { return p.wide == wide; });
}

ck::Narrow CudaOps::narrow_for(const float* out, std::int64_t n) const {
  if (narrow_type_ == backend::DType::kF32 || n < 1) return {};
  const Pair* p = pair_of(out, n);
  if (p == nullptr) return {};
  return {static_cast<std::uint16_t*>(p->narrow) + (out - p->wide), static_cast<int>(narrow_type_)};
}

ck::QkvSixteen CudaOps::qkv_alone(const float** q, const float** k, const float** v,
                                  const backend::AttentionShape& shape) {
  const std::int64_t rows = shape.batch * shape.seq_len;
  const std::int64_t nq = strided(rows, shape.q_stride, shape.heads * shape.head_dim);
  const std::int64_t nkv = strided(rows, shape.kv_stride, shape.kv_heads * shape.head_dim);
  if (!alone(*q, nq)) return {};
  const ck::Narrow cq = narrow_for(*q, nq), ck_ = narrow_for(*k, nkv), cv = narrow_for(*v, nkv);
  STRATA_ASSERT_MSG(keeps_qkv_alone(shape) && alone(*k, nkv) && alone(*v, nkv) && cq.p != nullptr &&
                        ck_.p != nullptr && cv.p != nullptr,
                    "q, k and v kept in 16 bits alone reached an attention without their path on");
  *q = *k = *v = nullptr;
  ++qkv_alone_reads_;
  return {{cq.p, cq.code}, {ck_.p, ck_.code}, {cv.p, cv.code}};
}

ck::Sixteen CudaOps::grad_alone(const float** dout, std::int64_t n, bool kept,
                                std::int64_t* reads) const {
  if (!alone(*dout, n)) return {};
  const ck::Narrow companion = narrow_for(*dout, n);
  STRATA_ASSERT_MSG(kept && companion.p != nullptr,
                    "a gradient kept in 16 bits alone reached a reader without its path on");
  *dout = nullptr;
  ++*reads;
  return {companion.p, companion.code};
}

ck::Narrow CudaOps::rewrite_in_place(const float* x, std::int64_t n) {
  if (narrow_type_ != backend::DType::kF32 &&
      gemm_->has_companion(x, n, static_cast<int>(narrow_type_))) {
    const ck::Narrow narrow = narrow_for(x, n);
    if (narrow.p != nullptr) return narrow;
  }
  wrote(x, n);
  return {};
}

void CudaOps::wrote(const float* out, std::int64_t n, const ck::Narrow& narrow) {
  if (n < 1) return;
  if (alone(out, n)) {
    // Its companion is all there is, noted for good by pair_narrow_alone.
    STRATA_ASSERT_MSG(narrow.p != nullptr,
                      "an activation kept in 16 bits alone was written without its companion");
    return;
  }
  if (narrow.p != nullptr) {
    gemm_->note_rounded(out, narrow.p, narrow.code, n);
  } else {
    gemm_->forget_written(out, static_cast<std::uint64_t>(n) * sizeof(float));
  }
}

// ---- CudaOptimizerOps
// ----------------------------------------------------------------------------

Status CudaOptimizerOps::read_back(const double* device) {
  STRATA_TRY(STRATA_CUDA_CHECK(
      cudaMemcpyAsync(scratch_.host, device, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream_)));
  return STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

Result<kernels::AdamResult> CudaOptimizerOps::adam_step(const kernels::AdamParams& params,
                                                        const kernels::AdamFusion& fusion,
                                                        const kernels::AdamTile& tile) {
  STRATA_TRY(kernels::validate(params));
  STRATA_ASSERT_MSG(tile.copy_out == nullptr || tile.copy_dtype != kernels::DType::kF32,
                    "copy_out is bf16 or fp16; the fp32 result is master itself");
  kernels::AdamResult result;
  if (tile.n == 0) return result;
  STRATA_ASSERT(tile.master != nullptr && tile.exp_avg != nullptr && tile.exp_avg_sq != nullptr &&
                tile.grad != nullptr);
  STRATA_ASSERT_MSG(
      tile.moments == kernels::MomentFormat::kF32 && tile.master_dtype == kernels::DType::kF32,
      "the CUDA Adam step keeps fp32 master and moments");
  if (sink_->failed()) return sink_->first();
  const kernels::detail::AdamConstants k = kernels::detail::make_constants(params, fusion);
  const ck::AdamDeviceConstants c{k.beta1, k.one_minus_beta1, k.beta2,        k.one_minus_beta2,
                                  k.eps,   k.step_size,       k.inv_sqrt_bc2, k.decay,
                                  k.l2,    k.grad_scale};
  const auto n = static_cast<std::int64_t>(tile.n);
  const int grad_code = static_cast<int>(tile.grad_dtype);
  const double* skip = nullptr;
  if (fusion.check_finite) {
    STRATA_TRY(STRATA_CUDA_CHECK(ck::reduce_stats(stream_, tile.grad, grad_code, n, true,
                                                  scratch_.partials, scratch_.tile_result, false)));
    skip = scratch_.tile_result;
  }
  STRATA_TRY(STRATA_CUDA_CHECK(
      ck::adam_step(stream_, c, static_cast<float*>(tile.master), static_cast<float*>(tile.exp_avg),
                    static_cast<float*>(tile.exp_avg_sq), tile.grad, grad_code, tile.copy_out,
                    tile.copy_out == nullptr ? -1 : static_cast<int>(tile.copy_dtype), n, skip)));
  if (fusion.check_finite) {
    STRATA_TRY(read_back(scratch_.tile_result));
    result.nonfinite_count = static_cast<std::uint64_t>(scratch_.host[1]);
    result.skipped = result.nonfinite_count > 0;
  }
  return result;
}

}  // STRATA_CUDA_NAMESPACE(backend)
