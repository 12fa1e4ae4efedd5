// Op dispatch: the model operations a backend executes on its compute stream, one virtual
// function per kernel (ggml-backend style: the model code calls this interface; CpuOps forwards to
// kernels/cpu, a CUDA implementation to kernels/cuda). T is the compute type: every backend
// provides Ops<float>; Ops<double> exists only where the backend supports it (the CPU backend,
// for finite-difference checks). Pointers are device pointers of the backend that made the Ops.
// Shapes and accumulate/write conventions are those of kernels/cpu/nn_ops.h.
#pragma once

#include <cstdint>

#include "common/assert.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/nn_ops.h"

namespace strata::backend {

using kernels::AttentionShape;
using kernels::DType;
using kernels::RopeShape;

template <typename T>
class Ops {
 public:
  virtual ~Ops() = default;

  // Row-major C(m,n) = alpha op(A) op(B) + beta C (contract of kernels::gemm).
  virtual void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta,
                    T* c, std::int64_t ldc) = 0;

  // C(m,n) = op(A) op(B) + bias(n) on every row, C contiguous (leading dimension n). This default
  // runs gemm, then add_bias; a backend may fuse the two (the CUDA backend's bias epilogue).
  virtual void gemm_bias(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                         const T* a, std::int64_t lda, const T* b, std::int64_t ldb, const T* bias,
                         T* c) {
    gemm(trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, T(0), c, n);
    add_bias(c, bias, m, n);
  }
  // C(m,n) = op(A) op(B) (+ bias(n) on every row where bias is not null) + res(m,n), C and res
  // contiguous (leading dimension n) and apart: a block's output projection and its residual add.
  // This default runs gemm_bias (or gemm), then add; a backend may fuse the add into the product
  // (the CUDA backend's cuBLASLt C matrix with beta 1).
  virtual void gemm_residual(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                             std::int64_t k, const T* a, std::int64_t lda, const T* b,
                             std::int64_t ldb, const T* bias, const T* res, T* c) {
    if (bias != nullptr) {
      gemm_bias(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c);
    } else {
      gemm(trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, T(0), c, n);
    }
    add(c, c, res, m * n);
  }

  // pre(m,n) = op(A) op(B) + bias(n) on every row and act = GELU(pre) (the tanh form), both
  // contiguous. This default runs gemm_bias, then gelu_forward; a backend may fuse them.
  virtual void gemm_bias_gelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                              std::int64_t k, const T* a, std::int64_t lda, const T* b,
                              std::int64_t ldb, const T* bias, T* pre, T* act) {
    gemm_bias(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, pre);
    gelu_forward(act, pre, m * n);
  }

  // dpre(m,n) = (op(A) op(B)) ∘ GELU'(pre) (the tanh form), all contiguous: GELU's backward
  // after the product that gives the gradient of its output. This default runs gemm into
  // `scratch` (m·n), then zero and gelu_backward into dpre; a backend may fuse them (scratch then
  // untouched).
  virtual void gemm_dgelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                          std::int64_t k, const T* a, std::int64_t lda, const T* b,
                          std::int64_t ldb, const T* pre, T* scratch, T* dpre) {
    gemm(trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, T(0), scratch, n);
    zero(dpre, m * n);
    gelu_backward(dpre, pre, scratch, m * n);
  }

  // out(N,C) = wte[tokens] + wpe[pos] (wpe may be null; positions null: r % seq_len).
  virtual void embedding_forward(T* out, const std::int32_t* tokens, const std::int32_t* positions,
                                 const T* wte, const T* wpe, std::int64_t rows,
                                 std::int64_t seq_len, std::int64_t channels) = 0;
  // dwte[tokens] += dout, dwpe[pos] += dout (dwpe may be null); rows of token padding_idx add
  // nothing to dwte (-1: none).
  virtual void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens,
                                  const std::int32_t* positions, std::int64_t rows,
                                  std::int64_t seq_len, std::int64_t channels,
                                  std::int32_t padding_idx) = 0;
  // LayerNorm; writes out, mean, rstd.
  virtual void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b,
                                 std::int64_t rows, std::int64_t channels, double eps) = 0;
  // res += x, then out = LayerNorm(res) (mean, rstd written): a residual add and the norm after
  // it. This default runs add, then layernorm_forward; a backend may fuse them into one pass.
  virtual void add_layernorm_forward(T* res, const T* x, T* out, T* mean, T* rstd, const T* w,
                                     const T* b, std::int64_t rows, std::int64_t channels,
                                     double eps) {
    add(res, res, x, rows * channels);
    layernorm_forward(out, mean, rstd, res, w, b, rows, channels, eps);
  }
  // Accumulates dx, dw, db.
  virtual void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w,
                                  const T* mean, const T* rstd, std::int64_t rows,
                                  std::int64_t channels) = 0;
  // RMSNorm; writes out, rstd.
  virtual void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                               std::int64_t channels, double eps) = 0;
  // res += x, then out = RMSNorm(res) (rstd written); the default runs add, then rmsnorm_forward.
  virtual void add_rmsnorm_forward(T* res, const T* x, T* out, T* rstd, const T* w,
                                   std::int64_t rows, std::int64_t channels, double eps) {
    add(res, res, x, rows * channels);
    rmsnorm_forward(out, rstd, res, w, rows, channels, eps);
  }
  // Accumulates dx, dw.
  virtual void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                                std::int64_t rows, std::int64_t channels) = 0;
  // RMSNorm of each head of strided rows; writes out, rstd(rows*heads).
  virtual void rmsnorm_heads_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t rows,
                                     std::int64_t heads, std::int64_t head_dim,
                                     std::int64_t x_stride, std::int64_t out_stride,
                                     double eps) = 0;
  // In place on d (dout in, dx out); accumulates dw.
  virtual void rmsnorm_heads_backward(T* d, T* dw, const T* x, const T* w, const T* rstd,
                                      std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                                      std::int64_t d_stride, std::int64_t x_stride) = 0;
  // GELU (tanh form); writes out.
  virtual void gelu_forward(T* out, const T* x, std::int64_t n) = 0;
  // Accumulates dx.
  virtual void gelu_backward(T* dx, const T* x, const T* dout, std::int64_t n) = 0;
  // out(N,I) = silu(gate) * up for gate_up(N,2I).
  virtual void swiglu_forward(T* out, const T* gate_up, std::int64_t rows, std::int64_t inner) = 0;
  // Writes dgate_up(N,2I).
  virtual void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, std::int64_t rows,
                               std::int64_t inner) = 0;
  // out = a + b (may alias).
  virtual void add(T* out, const T* a, const T* b, std::int64_t n) = 0;
  // x(N,C) += bias(C).
  virtual void add_bias(T* x, const T* bias, std::int64_t rows, std::int64_t channels) = 0;
  // dbias += column sums of dout.
  virtual void bias_backward(T* dbias, const T* dout, std::int64_t rows, std::int64_t channels) = 0;
  // Rotary embedding in place on `heads` heads of strided rows.
  virtual void rope_forward(T* x, const RopeShape& shape, const T* cos, const T* sin) = 0;
  // Its transpose, in place on the gradient.
  virtual void rope_backward(T* dx, const RopeShape& shape, const T* cos, const T* sin) = 0;
  // Causal GQA attention (windowed, packed documents); writes out and lse.
  virtual void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                                 const AttentionShape& shape) = 0;
  // Writes dq, dk, dv.
  virtual void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                                  const T* q, const T* k, const T* v,
                                  const AttentionShape& shape) = 0;
  // RoPE fused into the attention (fast path `rope_in_attention`): whether attention of this
  // shape can take q and k unrotated and rotate them as it reads them (the two ops below). false
  // (the default): they must not be called, and rope_forward rotates q and k in place first. The
  // answer is the same for the forward and the backward of one shape.
  virtual bool attention_rotates(const AttentionShape& shape) const {
    (void)shape;
    return false;
  }
  // attention_forward and attention_backward of q and k rotated by rope_forward with these tables
  // (rope: cos, sin and the rotary width; the attention's positions), which are read unrotated and
  // left so: out, lse and dv are those of the rotated q and k, and dq, dk those rope_backward gives
  // from the rotated q's and k's gradients (the gradients with respect to the unrotated q and k:
  // no rope_backward follows).
  virtual void attention_forward_rotated(T* out, T* lse, const T* q, const T* k, const T* v,
                                         const AttentionShape& shape,
                                         const kernels::QkRotation<T>& rope) {
    (void)out, (void)lse, (void)q, (void)k, (void)v, (void)shape, (void)rope;
    STRATA_ASSERT_MSG(false, "attention_forward_rotated where attention_rotates() is false");
  }
  virtual void attention_backward_rotated(T* dq, T* dk, T* dv, const T* dout, const T* out,
                                          const T* lse, const T* q, const T* k, const T* v,
                                          const AttentionShape& shape,
                                          const kernels::QkRotation<T>& rope) {
    (void)dq, (void)dk, (void)dv, (void)dout, (void)out, (void)lse, (void)q, (void)k, (void)v,
        (void)shape, (void)rope;
    STRATA_ASSERT_MSG(false, "attention_backward_rotated where attention_rotates() is false");
  }
  // losses[r] = cross-entropy of logits row r (0 for a target of -1).
  virtual void cross_entropy_forward(T* losses, const T* logits, const std::int32_t* targets,
                                     std::int64_t rows, std::int64_t vocab) = 0;
  // Losses, then logits overwritten with their gradient times grad_scale.
  virtual void cross_entropy_fused(T* logits, T* losses, const std::int32_t* targets,
                                   std::int64_t rows, std::int64_t vocab, double grad_scale) = 0;

  // The head's logits held in narrow_type() alone, never in fp32 (fast path `logits_16bit`):
  // whether this backend promises the three ops below. false (the default): they must not be
  // called, and the head computes fp32 logits (cross_entropy_fused).
  virtual bool logits_in_narrow() const { return false; }
  // C(m,n) (leading dimension ldc, narrow_type()) = op(A) op(B), accumulated in fp32 and rounded
  // once to nearest even.
  virtual void gemm_to_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                              std::int64_t k, const T* a, std::int64_t lda, const T* b,
                              std::int64_t ldb, void* c, std::int64_t ldc) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb,
        (void)c, (void)ldc;
    STRATA_ASSERT_MSG(false,
                      "gemm_to_narrow on a backend without logits_in_narrow() or "
                      "keeps_gate_up_narrow()");
  }
  // Whether the Llama family's gate and up projections may be kept in narrow_type() alone
  // (false, the default): gemm_to_narrow writes them, swiglu_forward_narrow and
  // swiglu_backward_narrow read them.
  virtual bool keeps_gate_up_narrow() const { return false; }
  // swiglu_forward and swiglu_backward with gate_up (N, 2I) in narrow_type(): the results of the
  // fp32 ops on the widened values. Only where keeps_gate_up_narrow().
  virtual void swiglu_forward_narrow(T* out, const void* gate_up, std::int64_t rows,
                                     std::int64_t inner) {
    (void)out, (void)gate_up, (void)rows, (void)inner;
    STRATA_ASSERT_MSG(false, "swiglu_forward_narrow on a backend without keeps_gate_up_narrow()");
  }
  virtual void swiglu_backward_narrow(T* dgate_up, const void* gate_up, const T* dout,
                                      std::int64_t rows, std::int64_t inner) {
    (void)dgate_up, (void)gate_up, (void)dout, (void)rows, (void)inner;
    STRATA_ASSERT_MSG(false, "swiglu_backward_narrow on a backend without keeps_gate_up_narrow()");
  }
  // Whether GPT-2's MLP pre-activation (fc, N x 4C, saved for GELU's backward) may be kept in
  // narrow_type() alone (false, the default): gemm_bias_gelu_narrow writes it, and it and
  // gemm_dgelu_narrow read it.
  virtual bool keeps_gelu_narrow() const { return false; }
  // Whether GELU's gradient there (GPT-2's backward scratch dfc, N x 4C, written by
  // gemm_dgelu_narrow and read by the fc projection's two products and its bias's column sums) is
  // kept in narrow_type() alone too (false, the default; only where keeps_gelu_narrow() and
  // keeps_narrow_alone()): pair_narrow_alone then takes it, gemm_dgelu_narrow writing it writes
  // the companion alone (the bits pair_narrow's companion would hold), the products read the
  // companion, and bias_backward reading it as `dout` reads the companion, widened (its values
  // rounded, where the fp32 array held them unrounded).
  virtual bool keeps_gelu_grad_alone() const { return false; }
  // Whether gemm_dgelu_narrow writing a gradient kept alone (keeps_gelu_grad_alone()) runs the
  // product and GELU's gradient in one call and never touches its fp32 scratch, which may then be
  // null (false, the default: the scratch is needed).
  virtual bool fuses_gelu_grad() const { return false; }
  // pre16(m,n) (narrow_type(), contiguous) = op(A) op(B) + bias, the fp32 sum rounded once; act =
  // GELU(pre16 widened), written as gelu_forward writes it (with its companion, or its companion
  // alone where it is kept so); or, where act is kept alone and the backend fuses GELU into the
  // product, GELU of the fp32 sum rounded once (the CUDA backend's
  // gemm_bias_gelu_epilogue_16bit). Only where keeps_gelu_narrow().
  virtual void gemm_bias_gelu_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                     std::int64_t k, const T* a, std::int64_t lda, const T* b,
                                     std::int64_t ldb, const T* bias, void* pre16, T* act) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb,
        (void)bias, (void)pre16, (void)act;
    STRATA_ASSERT_MSG(false, "gemm_bias_gelu_narrow on a backend without keeps_gelu_narrow()");
  }
  // dpre(m,n) = (op(A) op(B)) * GELU'(pre16 widened), pre16 a gemm_bias_gelu_narrow output: the
  // product into `scratch` (m x n, fp32), then GELU's backward writing dpre (with its companion
  // where it has one); or in one call where dpre is kept alone and the backend fuses it
  // (fuses_gelu_grad(): `scratch` may be null). Only where keeps_gelu_narrow().
  virtual void gemm_dgelu_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                 std::int64_t k, const T* a, std::int64_t lda, const T* b,
                                 std::int64_t ldb, const void* pre16, T* scratch, T* dpre) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb,
        (void)pre16, (void)scratch, (void)dpre;
    STRATA_ASSERT_MSG(false, "gemm_dgelu_narrow on a backend without keeps_gelu_narrow()");
  }
  // C = alpha op(A) op(B) + beta C with A in narrow_type() (a gemm_to_narrow output).
  virtual void gemm_from_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                std::int64_t k, T alpha, const void* a, std::int64_t lda,
                                const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda,
        (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
    STRATA_ASSERT_MSG(false, "gemm_from_narrow on a backend without logits_in_narrow()");
  }
  // cross_entropy_forward (gradient false) or cross_entropy_fused (true) on logits in
  // narrow_type(), rows `ld` elements apart (ld >= vocab; the columns past vocab are neither read
  // nor written): losses in T, the gradient times grad_scale written over the logits in
  // narrow_type(). The statistics are fp32 (the sum of exp in double).
  virtual void cross_entropy_narrow(bool gradient, void* logits, std::int64_t ld, T* losses,
                                    const std::int32_t* targets, std::int64_t rows,
                                    std::int64_t vocab, double grad_scale) {
    (void)gradient, (void)logits, (void)ld, (void)losses, (void)targets, (void)rows, (void)vocab,
        (void)grad_scale;
    STRATA_ASSERT_MSG(false, "cross_entropy_narrow on a backend without logits_in_narrow()");
  }

  // Sum of squares in double, fixed order (waits for the result).
  virtual double sum_squares(const T* x, std::int64_t n) = 0;
  // Sum in double, fixed order (waits for the result).
  virtual double sum(const T* x, std::int64_t n) = 0;
  // x *= alpha.
  virtual void scale(T* x, std::int64_t n, double alpha) = 0;
  // x[0..n) = 0.
  virtual void zero(T* x, std::int64_t n) = 0;
  // dst = src for n elements (device to device).
  virtual void copy(T* dst, const T* src, std::int64_t n) = 0;
  // dst(T) = src converted from `src_type` (fp32, bf16, fp16).
  virtual void cast_from(T* dst, const void* src, DType src_type, std::int64_t n) = 0;
  // dst (`dst_type`) = src converted, rounding to nearest even.
  virtual void cast_to(void* dst, DType dst_type, const T* src, std::int64_t n) = 0;
  // acc = g rounded to the 16-bit `type` (nearest even) and widened back (assign), or acc += that:
  // the bits of cast_to, cast_from, then copy or add, without the 16-bit array between.
  virtual void add_rounded(T* acc, const T* g, DType type, std::int64_t n, bool assign) = 0;
  // `wide` (n elements) holds exactly the values of `narrow` (n elements of the 16-bit `type`)
  // until forget_widened(wide): a unit's fp32 compute copy beside the 16-bit parameters it was
  // widened from (cast_from), both unchanged in between. A backend whose GEMMs take 16-bit inputs
  // may read operands inside `wide` from `narrow` instead of converting them again. Ignored by
  // default.
  virtual void note_widened(const T* wide, const void* narrow, DType type, std::int64_t n) {
    (void)wide, (void)narrow, (void)type, (void)n;
  }
  virtual void forget_widened(const T* wide) { (void)wide; }
  // dst[at[i], at[i] + n[i]) = src's elements [begin[i], begin[i] + n[i]) converted from 16-bit
  // `src_type`, i < count (the tensors of a unit that other kernels than GEMMs read: widened in
  // place, at == begin, or packed apart from the unit's copy, note_kept_apart).
  virtual void cast_from_ranges(T* dst, const void* src, DType src_type, const std::int64_t* begin,
                                const std::int64_t* n, int count, const std::int64_t* at) {
    const std::size_t bytes = kernels::dtype_bytes(src_type);
    for (int i = 0; i < count; ++i) {
      cast_from(dst + at[i], static_cast<const char*>(src) + begin[i] * bytes, src_type, n[i]);
    }
  }
  // Like note_widened, for a copy into which only some ranges were widened (cast_from_ranges): the
  // rest of `wide` does not hold the parameters, and until forget_widened(wide) every GEMM operand
  // inside `wide` must be read from `narrow`. Returns whether this backend promises that (its
  // GEMMs read 16-bit operands of `type` in place, and it can keep the range); false, the default,
  // notes nothing, and the caller widens the whole copy.
  virtual bool note_widened_weights_only(const T* wide, const void* narrow, DType type,
                                         std::int64_t n) {
    (void)wide, (void)narrow, (void)type, (void)n;
    return false;
  }
  // For a copy noted by note_widened_weights_only: its other tensors, the element ranges
  // [begin[i], begin[i] + n[i]) of `wide` (norm weights, biases), are not widened into it either
  // but kept at apart[at[i], at[i] + n[i]) (widened there once per change of the parameters,
  // cast_from_ranges), and until forget_widened(wide) every kernel reading a parameter inside
  // those ranges reads it from `apart`. Returns whether this backend promises that (false, the
  // default: nothing is noted, and the caller widens them into `wide`). The ranges are copied.
  virtual bool note_kept_apart(const T* wide, const T* apart, const std::int64_t* begin,
                               const std::int64_t* n, const std::int64_t* at, int count) {
    (void)wide, (void)apart, (void)begin, (void)n, (void)at, (void)count;
    return false;
  }

  // The 16-bit type this backend's GEMMs round fp32 operands to, where they can read an
  // activation's 16-bit companion (pair_narrow) instead of converting it; kF32 (the default) when
  // they cannot, and pair_narrow is then ignored.
  virtual DType narrow_type() const { return DType::kF32; }
  // `narrow` (n elements of narrow_type()) becomes the companion of the activation buffer `wide`
  // (n elements) until unpair_narrow(wide): an op writing into `wide` that can also write its
  // values rounded to nearest even into the companion does (the norms' outputs and input
  // gradients, GELU's and SwiGLU's outputs and gradients), and GEMMs reading values written that
  // way read the companion: the bits their own conversion would give. Any other write into
  // `wide` makes them convert again. `wide` must be written only through these Ops (not by copies
  // from the host, not as a parameter gradient).
  virtual void pair_narrow(const T* wide, void* narrow, std::int64_t n) {
    (void)wide, (void)narrow, (void)n;
  }
  virtual void unpair_narrow(const T* wide) { (void)wide; }
  // Whether pair_narrow_alone takes the activations only GEMMs read (the norms' outputs, GELU's or
  // SwiGLU's) at this time (false, the default): the runner then keeps them in 16 bits alone.
  virtual bool keeps_narrow_alone() const { return false; }
  // `narrow` (n elements of narrow_type()) holds the activation `key` alone, until
  // unpair_narrow(key): `key` is an address range with nothing stored behind it (any access to it
  // faults); layernorm_forward, rmsnorm_forward, add_layernorm_forward and add_rmsnorm_forward (as
  // `out`), gelu_forward, swiglu_forward and gemm_bias_gelu (as `act`) writing `key` write the
  // companion alone (the bits pair_narrow's companion would hold), and every product reading
  // inside `key` reads the companion. Nothing else may read or write `key`. Returns whether this
  // backend promises that (keeps_narrow_alone); false: nothing is paired.
  virtual bool pair_narrow_alone(const T* key, void* narrow, std::int64_t n) {
    (void)key, (void)narrow, (void)n;
    return false;
  }
  // Whether attention outputs of this shape are kept in narrow_type() alone too (false, the
  // default; only where keeps_narrow_alone()): pair_narrow_alone then takes such an output, the
  // attention's forward (attention_forward, attention_forward_rotated) writing it as `out` writes
  // the companion alone (the bits pair_narrow's companion would hold), and its backward reading it
  // as `out` reads the companion.
  virtual bool keeps_attention_alone(const AttentionShape& shape) const {
    (void)shape;
    return false;
  }
  // Whether the gradient of attention outputs of this shape (the backward's dout) is kept in
  // narrow_type() alone too (false, the default; only where keeps_attention_alone(shape)):
  // pair_narrow_alone then takes it, the product writing it (gemm with alpha 1 and beta 0, C
  // inside the key) writes it in 16 bits into the companion (fp32 accumulation rounded once), and
  // the attention's backward reading it as `dout` reads the companion.
  virtual bool keeps_attention_grad_alone(const AttentionShape& shape) const {
    (void)shape;
    return false;
  }
  // Whether the gradient of SwiGLU's output (the Llama family's backward dact, the down
  // projection's input gradient) is kept in narrow_type() alone too (false, the default; only where
  // keeps_gate_up_narrow() and keeps_narrow_alone()): pair_narrow_alone then takes it, the product
  // writing it (gemm with alpha 1 and beta 0, C inside the key) writes it in 16 bits into the
  // companion (fp32 accumulation rounded once), and swiglu_backward_narrow reading it as `dout`
  // reads the companion, widened.
  virtual bool keeps_swiglu_grad_alone() const { return false; }
  // Whether the gradient of the blocks' norm outputs (the backward scratch dln, written by the
  // projections' input gradients) is kept in narrow_type() alone too (false, the default; only
  // where keeps_narrow_alone()): pair_narrow_alone then takes it, the product writing it (gemm with
  // alpha 1 and beta 0, C inside the key) writes it in 16 bits into the companion, and
  // layernorm_backward and rmsnorm_backward reading it as `dout` read the companion, widened.
  virtual bool keeps_norm_grad_alone() const { return false; }
  // Whether the gradient of the Llama family's gate and up (the backward scratch dfc, N x 2I,
  // written by swiglu_backward_narrow and read by the two products of the gate/up projection's
  // backward alone) is kept in narrow_type() alone too (false, the default; only where
  // keeps_gate_up_narrow() and keeps_narrow_alone()): pair_narrow_alone then takes it,
  // swiglu_backward_narrow writing it writes the companion alone (the bits pair_narrow's companion
  // would hold), and the products reading it read the companion.
  virtual bool keeps_gate_up_grad_alone() const { return false; }
  // Whether the gradient of q, k and v of this shape (the backward scratch dqkv: dq, dk, dv side by
  // side in each row, written by attention_backward or attention_backward_rotated and read by the
  // two products of the qkv projection's backward, and by bias_backward where the projection has a
  // bias) is kept in narrow_type() alone too (false, the default; only where keeps_narrow_alone()):
  // pair_narrow_alone then takes it, the attention's backward writing it (dq, dk, dv at their
  // places in the key, of q_stride and kv_stride its row width) writes the companion alone (the
  // bits pair_narrow's companion would hold), the products reading it read the companion, and
  // bias_backward reading it as `dout` reads the companion, widened. Which blocks may keep it so is
  // the model's to say (model::keeps_qkv_alone): an unrotated gradient's companion holds its values
  // exactly, a rotated one's holds them rounded.
  virtual bool keeps_qkv_grad_alone(const AttentionShape& shape) const {
    (void)shape;
    return false;
  }
  // Whether q, k and v of this shape (the qkv projection's output: q, k, v side by side in each
  // row, read by the attention's forward and backward alone in a block without q/k norms) are kept
  // in narrow_type() alone too (false, the default; only where keeps_narrow_alone()):
  // pair_narrow_alone then takes them, the product writing them (gemm with alpha 1 and beta 0, or
  // gemm_bias, C inside the key) writes them in 16 bits into the companion (fp32 accumulation, plus
  // the bias in fp32, rounded once), and the attention's forward and backward reading them (q, k,
  // v at their places in the key; rotated or not) read the companion, widened. Which blocks may
  // keep them so is the model's to say (model::keeps_qkv_alone): where the family rotates q and k,
  // only where the attention rotates them (attention_rotates), since the rope kernel would rotate
  // them in place in fp32.
  virtual bool keeps_qkv_alone(const AttentionShape& shape) const {
    (void)shape;
    return false;
  }
};

}  // namespace strata::backend
