// Ops<float> and OptimizerOps of the CUDA backend: each op checks its shape (programmer errors
// assert, as in the CPU kernels; limits of the GPU kernels become errors), launches kernels/cuda on
// the compute stream and records any launch failure in the backend's cuda::ErrorSink. sum() and
// sum_squares() wait for their result; everything else is asynchronous.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "backend/optimizer_ops.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(backend) {

// Device and pinned memory the ops use, allocated once by the backend.
struct OpsScratch {
  double* reduce = nullptr;  // column-reduction partials
  std::int64_t reduce_doubles = 0;
  double* partials = nullptr;     // 2 * kReduceBlocks doubles for reduce_stats
  double* sum_result = nullptr;   // 2 doubles: sum() / sum_squares()
  double* tile_result = nullptr;  // 2 doubles: check_finite of one Adam tile
  double* host = nullptr;         // pinned: 2 doubles the results are read back into
  // The 16-bit workspace the flash attention rounds its inputs into (the GEMMs' conversion
  // workspace: both run on the compute stream, never at once); null without 16-bit GEMMs.
  std::uint16_t* sixteen = nullptr;
  std::int64_t sixteen_elements = 0;
};

class CudaOps final : public backend::Ops<float> {
 public:
  CudaOps(cudaStream_t stream, cuda::GemmEngine* gemm, const OpsScratch& scratch,
          cuda::ErrorSink* sink)
      : stream_(stream), gemm_(gemm), scratch_(scratch), sink_(sink) {}

  void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
            const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
            float* c, std::int64_t ldc) override;
  void embedding_forward(float* out, const std::int32_t* tokens, const std::int32_t* positions,
                         const float* wte, const float* wpe, std::int64_t rows,
                         std::int64_t seq_len, std::int64_t channels) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                          const std::int32_t* positions, std::int64_t rows, std::int64_t seq_len,
                          std::int64_t channels, std::int32_t padding_idx) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, std::int64_t rows, std::int64_t channels,
                         double eps) override;
  // The residual added by cuBLASLt reading it as its C matrix (fast path gemm_residual_epilogue),
  // else the default's product and add.
  void gemm_residual(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                     const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     const float* bias, const float* res, float* c) override;
  void gemm_dgelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  const float* pre, float* scratch, float* dpre) override;
  void add_layernorm_forward(float* res, const float* x, float* out, float* mean, float* rstd,
                             const float* w, const float* b, std::int64_t rows,
                             std::int64_t channels, double eps) override;
  void add_rmsnorm_forward(float* res, const float* x, float* out, float* rstd, const float* w,
                           std::int64_t rows, std::int64_t channels, double eps) override;
  void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                          const float* w, const float* mean, const float* rstd, std::int64_t rows,
                          std::int64_t channels) override;
  void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, std::int64_t rows,
                       std::int64_t channels, double eps) override;
  void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                        const float* rstd, std::int64_t rows, std::int64_t channels) override;
  void rmsnorm_heads_forward(float* out, float* rstd, const float* x, const float* w,
                             std::int64_t rows, std::int64_t heads, std::int64_t head_dim,
                             std::int64_t x_stride, std::int64_t out_stride, double eps) override;
  void rmsnorm_heads_backward(float* d, float* dw, const float* x, const float* w,
                              const float* rstd, std::int64_t rows, std::int64_t heads,
                              std::int64_t head_dim, std::int64_t d_stride,
                              std::int64_t x_stride) override;
  void gelu_forward(float* out, const float* x, std::int64_t n) override;
  void gelu_backward(float* dx, const float* x, const float* dout, std::int64_t n) override;
  void swiglu_forward(float* out, const float* gate_up, std::int64_t rows,
                      std::int64_t inner) override;
  void swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, std::int64_t rows,
                       std::int64_t inner) override;
  void gemm_bias(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 const float* bias, float* c) override;
  void gemm_bias_gelu(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                      const float* bias, float* pre, float* act) override;
  void add(float* out, const float* a, const float* b, std::int64_t n) override;
  void add_bias(float* x, const float* bias, std::int64_t rows, std::int64_t channels) override;
  void bias_backward(float* dbias, const float* dout, std::int64_t rows,
                     std::int64_t channels) override;
  void rope_forward(float* x, const backend::RopeShape& shape, const float* cos,
                    const float* sin) override;
  void rope_backward(float* dx, const backend::RopeShape& shape, const float* cos,
                     const float* sin) override;
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const backend::AttentionShape& shape) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          const backend::AttentionShape& shape) override;
  // With use_rope_in_attention on, every shape the 16-bit staging takes (takes_flash).
  bool attention_rotates(const backend::AttentionShape& shape) const override;
  void attention_forward_rotated(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const backend::AttentionShape& shape,
                                 const kernels::QkRotation<float>& rope) override;
  void attention_backward_rotated(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v,
                                  const backend::AttentionShape& shape,
                                  const kernels::QkRotation<float>& rope) override;
  void cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets,
                             std::int64_t rows, std::int64_t vocab) override;
  void cross_entropy_fused(float* logits, float* losses, const std::int32_t* targets,
                           std::int64_t rows, std::int64_t vocab, double grad_scale) override;
  double sum_squares(const float* x, std::int64_t n) override;
  double sum(const float* x, std::int64_t n) override;
  void scale(float* x, std::int64_t n, double alpha) override;
  void zero(float* x, std::int64_t n) override;
  void copy(float* dst, const float* src, std::int64_t n) override;
  void cast_from(float* dst, const void* src, backend::DType src_type, std::int64_t n) override;
  void cast_to(void* dst, backend::DType dst_type, const float* src, std::int64_t n) override;
  void add_rounded(float* acc, const float* g, backend::DType type, std::int64_t n,
                   bool assign) override;
  void note_widened(const float* wide, const void* narrow, backend::DType type,
                    std::int64_t n) override;
  void forget_widened(const float* wide) override;
  void cast_from_ranges(float* dst, const void* src, backend::DType src_type,
                        const std::int64_t* begin, const std::int64_t* n, int count,
                        const std::int64_t* at) override;
  bool note_widened_weights_only(const float* wide, const void* narrow, backend::DType type,
                                 std::int64_t n) override;
  bool note_kept_apart(const float* wide, const float* apart, const std::int64_t* begin,
                       const std::int64_t* n, const std::int64_t* at, int count) override;
  // note_kept_apart promises (on) or refuses (off, the default): every op reading a parameter (the
  // norms' weights and biases, the biases of add_bias and of the bias epilogues) reads it through
  // param(). At most kApartMax copies are noted at once.
  void use_kept_apart(bool on) {
    kept_apart_ = on;
    if (!on) aparts_.clear();
  }
  static constexpr int kApartMax = 64;
  // Parameters read from where they were kept apart.
  std::int64_t apart_reads() const { return apart_reads_; }
  void reset_apart_reads() { apart_reads_ = 0; }
  backend::DType narrow_type() const override { return narrow_type_; }
  // The head's logits in narrow_type() alone (fast path logits_16bit): on only with the
  // activations' companions on (narrow_type() bf16 or fp16, the GEMMs' input type).
  void use_narrow_logits(bool on) { narrow_logits_ = on; }
  bool logits_in_narrow() const override {
    return narrow_logits_ && narrow_type_ != backend::DType::kF32;
  }
  void gemm_to_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                      const float* a, std::int64_t lda, const float* b, std::int64_t ldb, void* c,
                      std::int64_t ldc) override;
  void gemm_from_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                        float alpha, const void* a, std::int64_t lda, const float* b,
                        std::int64_t ldb, float beta, float* c, std::int64_t ldc) override;
  // The Llama family's gate and up projections in narrow_type() alone (fast path gate_up_16bit):
  // on only with the activations' companions on.
  void use_gate_up_narrow(bool on) { gate_up_narrow_ = on; }
  bool keeps_gate_up_narrow() const override {
    return gate_up_narrow_ && narrow_type_ != backend::DType::kF32;
  }
  // GPT-2's MLP pre-activation in 16 bits (fast path gelu_16bit; off by default): only with
  // 16-bit GEMM inputs and companions.
  void use_gelu_narrow(bool on) { gelu_narrow_ = on; }
  bool keeps_gelu_narrow() const override {
    return gelu_narrow_ && narrow_type_ != backend::DType::kF32;
  }
  void gemm_bias_gelu_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                             std::int64_t k, const float* a, std::int64_t lda, const float* b,
                             std::int64_t ldb, const float* bias, void* pre16, float* act) override;
  void gemm_dgelu_narrow(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                         const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                         const void* pre16, float* scratch, float* dpre) override;
  // GELU calls (forward and backward) on a pre-activation in 16 bits.
  std::int64_t narrow_gelu_calls() const { return narrow_gelu_calls_; }
  // GELU's gradient kept in 16 bits alone too (fast path gelu_grad_16bit_alone; off by default):
  // only with keeps_gelu_narrow() and keeps_narrow_alone().
  void use_gelu_grad_alone(bool on) { gelu_grad_alone_ = on; }
  bool keeps_gelu_grad_alone() const override {
    return gelu_grad_alone_ && keeps_gelu_narrow() && keeps_narrow_alone();
  }
  // With GELU's gradient in the product's epilogue (fast path gemm_dgelu_epilogue_16bit, the
  // engine's use_dgelu_epilogue_16).
  bool fuses_gelu_grad() const override;
  // GELU backwards that wrote their gradient kept in 16 bits alone, and bias_backward calls that
  // read such a gradient.
  std::int64_t gelu_grad_writes() const { return gelu_grad_writes_; }
  std::int64_t gelu_grad_bias_reads() const { return gelu_grad_bias_reads_; }
  void swiglu_forward_narrow(float* out, const void* gate_up, std::int64_t rows,
                             std::int64_t inner) override;
  void swiglu_backward_narrow(float* dgate_up, const void* gate_up, const float* dout,
                              std::int64_t rows, std::int64_t inner) override;
  // SwiGLU calls (forward and backward) that read gate and up in 16 bits.
  std::int64_t narrow_swiglu_calls() const { return narrow_swiglu_calls_; }
  void reset_narrow_swiglu_calls() {
    narrow_swiglu_calls_ = 0;
    narrow_gelu_calls_ = 0;
  }
  void cross_entropy_narrow(bool gradient, void* logits, std::int64_t ld, float* losses,
                            const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                            double grad_scale) override;
  // Rows of logits whose loss read them in 16 bits (cross_entropy_narrow).
  std::int64_t narrow_logit_rows() const { return narrow_logit_rows_; }
  void reset_narrow_logit_rows() { narrow_logit_rows_ = 0; }
  void pair_narrow(const float* wide, void* narrow, std::int64_t n) override;
  void unpair_narrow(const float* wide) override;
  // The MLP's activation kept in 16 bits alone (fast path activations_16bit_alone; off by default):
  // only with the companions on.
  void use_narrow_alone(bool on) { narrow_alone_ = on; }
  bool keeps_narrow_alone() const override {
    return narrow_alone_ && narrow_type_ != backend::DType::kF32;
  }
  bool pair_narrow_alone(const float* key, void* narrow, std::int64_t n) override;
  // GELU and SwiGLU calls that wrote an activation kept in 16 bits alone.
  std::int64_t alone_writes() const { return alone_writes_; }
  void reset_alone_writes() { alone_writes_ = 0; }
  // Each block's attention output kept in 16 bits alone too (fast path attention_16bit_alone; off
  // by default): only with keeps_narrow_alone(), for shapes the 16-bit attention takes
  // (takes_flash) with compact output rows, where the attention's 16-bit type is the companions'.
  void use_attention_alone(bool on) { attention_alone_ = on; }
  bool keeps_attention_alone(const backend::AttentionShape& shape) const override;
  // Attention forwards that wrote an output kept in 16 bits alone.
  std::int64_t attention_alone_writes() const { return attention_alone_writes_; }
  void reset_attention_alone_writes() { attention_alone_writes_ = 0; }
  // The gradient of each block's attention output (the backward's dout) kept in 16 bits alone too
  // (fast path attention_grad_16bit; off by default): only where keeps_attention_alone(shape).
  void use_attention_grad_alone(bool on) { attention_grad_alone_ = on; }
  bool keeps_attention_grad_alone(const backend::AttentionShape& shape) const override {
    return attention_grad_alone_ && keeps_attention_alone(shape);
  }
  // Attention backwards that read their dout kept in 16 bits alone.
  std::int64_t attention_grad_reads() const { return attention_grad_reads_; }
  // The gradient of SwiGLU's output kept in 16 bits alone too (fast path swiglu_grad_16bit; off by
  // default): only with keeps_gate_up_narrow() and keeps_narrow_alone().
  void use_swiglu_grad_alone(bool on) { swiglu_grad_alone_ = on; }
  bool keeps_swiglu_grad_alone() const override {
    return swiglu_grad_alone_ && keeps_gate_up_narrow() && keeps_narrow_alone();
  }
  // SwiGLU backwards that read their dout kept in 16 bits alone.
  std::int64_t swiglu_grad_reads() const { return swiglu_grad_reads_; }
  // The gradient of the norms' outputs kept in 16 bits alone too (fast path norm_grad_16bit; off by
  // default): only with keeps_narrow_alone().
  void use_norm_grad_alone(bool on) { norm_grad_alone_ = on; }
  bool keeps_norm_grad_alone() const override { return norm_grad_alone_ && keeps_narrow_alone(); }
  // Norm backwards that read their dout kept in 16 bits alone.
  std::int64_t norm_grad_reads() const { return norm_grad_reads_; }
  // The gradient of gate and up kept in 16 bits alone too (fast path gate_up_grad_16bit_alone; off
  // by default): only with keeps_gate_up_narrow() and keeps_narrow_alone().
  void use_gate_up_grad_alone(bool on) { gate_up_grad_alone_ = on; }
  bool keeps_gate_up_grad_alone() const override {
    return gate_up_grad_alone_ && keeps_gate_up_narrow() && keeps_narrow_alone();
  }
  // SwiGLU backwards that wrote their dgate_up kept in 16 bits alone.
  std::int64_t gate_up_grad_writes() const { return gate_up_grad_writes_; }
  // The gradient of q, k and v kept in 16 bits alone too (fast path qkv_grad_16bit_alone; off by
  // default): only with keeps_narrow_alone(), for shapes the 16-bit attention takes (its epilogue
  // or its staging's widening then writes the companion), where the attention's 16-bit type is the
  // companions' (so that an unrotated gradient's companion holds its fp32 values exactly, for
  // bias_backward to read).
  void use_qkv_grad_alone(bool on) { qkv_grad_alone_ = on; }
  bool keeps_qkv_grad_alone(const backend::AttentionShape& shape) const override;
  // Attention backwards that wrote their dq, dk, dv kept in 16 bits alone, and bias_backward calls
  // that read such a gradient.
  std::int64_t qkv_grad_writes() const { return qkv_grad_writes_; }
  std::int64_t qkv_grad_bias_reads() const { return qkv_grad_bias_reads_; }
  // Each block's q, k and v kept in 16 bits alone too (fast path qkv_16bit; off by default): only
  // with keeps_narrow_alone(), for shapes the 16-bit attention takes (its staging then reads them),
  // where the attention's 16-bit type is the companions'. Whether a block's attention must rotate
  // them is the model's to say (model::keeps_qkv_alone).
  void use_qkv_alone(bool on) { qkv_alone_ = on; }
  bool keeps_qkv_alone(const backend::AttentionShape& shape) const override;
  // Attention calls (forward and backward) that read q, k and v kept in 16 bits alone, and
  // gemm_bias calls that wrote an output kept so (the product and its bias rounded once).
  std::int64_t qkv_alone_reads() const { return qkv_alone_reads_; }
  std::int64_t bias_alone_writes() const { return bias_alone_writes_; }
  void reset_gradient_reads() {
    attention_grad_reads_ = 0;
    swiglu_grad_reads_ = 0;
    norm_grad_reads_ = 0;
    gate_up_grad_writes_ = 0;
    qkv_grad_writes_ = 0;
    qkv_grad_bias_reads_ = 0;
    qkv_alone_reads_ = 0;
    bias_alone_writes_ = 0;
    gelu_grad_writes_ = 0;
    gelu_grad_bias_reads_ = 0;
  }
  // Activations' 16-bit companions (pair_narrow) in `type`, bf16 or fp16, the GEMMs' input type;
  // kF32 turns them off (the default): narrow_type() is then fp32 and pairs are dropped.
  void use_companions(backend::DType type);

  // Attention of these head sizes runs the tensor-core flash kernels on inputs rounded to bf16
  // (`bf16`, else fp16) where the shape allows (launch_plan.h's flash_io_takes), the fp32 kernels
  // otherwise. Empty: always the fp32 kernels (the default).
  void use_flash_attention(bool bf16, std::vector<std::int64_t> head_sizes) {
    flash_bf16_ = bf16;
    flash_head_sizes_ = std::move(head_sizes);
  }
  // Whether attention of this shape runs the flash kernels.
  bool takes_flash(const backend::AttentionShape& shape) const;
  // RoPE fused into the 16-bit attention's staging (fast path rope_in_attention; off by default):
  // q and k rotated as they are rounded, and dq, dk rotated back as they are widened, with the
  // bits of the rope kernels around the plain staging.
  void use_rope_in_attention(bool on) { rope_in_attention_ = on; }
  // Attention calls (forward and backward) that rotated q and k in their staging.
  std::int64_t rotated_attention_calls() const { return rotated_attention_calls_; }
  void reset_rotated_attention_calls() { rotated_attention_calls_ = 0; }
  // The residual add fused into the norm after it (one kernel; its bits are those of the two).
  void use_fused_residual_norm(bool on) { fused_norm_ = on; }
  std::int64_t fused_norm_calls() const { return fused_norm_calls_; }
  void reset_fused_norm_calls() { fused_norm_calls_ = 0; }
  // A second 16-bit attention on the flash path's staging (cuDNN's fused attention,
  // kernels/cuda/cudnn_sdpa.h) for these head sizes, where `accepts` takes the shape (it prepares
  // the shape's plans); calls it declines, and packed documents, run the flash kernels.
  struct StagedAttention {
    const cuda_kernels::Attention16* inner = nullptr;
    std::vector<std::int64_t> head_sizes;
    std::function<bool(const backend::AttentionShape&)> accepts;
    std::function<Status()> take_error;  // the failure behind a call's cudaErrorUnknown
    // Told once when a call is refused at run time; the path is then dropped and the flash
    // kernels run that call and every later one (their outputs are written, not accumulated).
    std::function<void(const Status&)> refused;
  };
  void use_cudnn_attention(StagedAttention cudnn) { cudnn_ = std::move(cudnn); }
  // Whether attention of this shape, with its lse at `lse`, runs cuDNN's attention (the forward
  // and its backward see the same lse, so they choose alike).
  bool takes_cudnn(const backend::AttentionShape& shape, const float* lse) const;
  // Calls of each path so far (forward and backward count one each).
  std::int64_t cudnn_calls() const { return cudnn_calls_; }
  std::int64_t flash_calls() const { return flash_calls_; }
  // 16-bit attention backwards that read the forward's output from its companion instead of
  // rounding it again (the activations' companions, pair_narrow).
  std::int64_t staged_companion_reads() const { return staged_companion_reads_; }
  void reset_staged_companion_reads() { staged_companion_reads_ = 0; }
  std::int64_t fp32_attention_calls() const { return fp32_attention_calls_; }

 private:
  struct Pair {
    const float* wide = nullptr;
    void* narrow = nullptr;
    std::int64_t n = 0;
    bool alone = false;  // pair_narrow_alone: `wide` is an address range alone
  };
  // The paired buffer the n values at p lie inside, or null.
  const Pair* pair_of(const float* p, std::int64_t n) const;
  // Whether the n values at p lie inside an activation kept in 16 bits alone (pair_narrow_alone):
  // the ops writing them write the companion alone.
  bool alone(const float* p, std::int64_t n) const;
  // Where a kernel writes the n values at `out` in fp32: out, or null (its companion alone) where
  // they are kept alone (counted in alone_writes()).
  float* wide_out(float* out, std::int64_t n);
  // The companion for the n values written at `out` (inside one paired buffer), or none.
  cuda_kernels::Narrow narrow_for(const float* out, std::int64_t n) const;
  // c16 (m x n, contiguous, the products' 16-bit type) = op(A) op(B) + bias, the fp32 sum rounded
  // once (GemmEngine::gemm_to_16 with the bias), errors to the sink.
  void gemm_bias_to_16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                       const float* bias, void* c16);
  // q, k and v of `shape` kept in 16 bits alone: their companions to read, the pointers nulled,
  // and the read counted; asserts keeps_qkv_alone(shape). Otherwise unset, the pointers as they
  // were.
  cuda_kernels::QkvSixteen qkv_alone(const float** q, const float** k, const float** v,
                                     const backend::AttentionShape& shape);
  // The attention's 16-bit type (cuda_kernels::kCodeBF16 or kCodeF16).
  int attention_code() const;
  // Whether activations are kept in 16 bits alone in the attention's 16-bit type (what the paths
  // kept alone around the attention need).
  bool keeps_attention_typed_alone() const;
  // A gradient `dout` (n floats) kept in 16 bits alone: its companion to read, `dout` nulled, and
  // `reads` counted; asserts `kept` (the path that keeps it is on). Otherwise unset, `dout` as it
  // was.
  cuda_kernels::Sixteen grad_alone(const float** dout, std::int64_t n, bool kept,
                                   std::int64_t* reads) const;
  // n values were written at `out`, with their companion where `narrow` has one: the GEMMs may
  // read it; otherwise they forget what they knew of those values.
  void wrote(const float* out, std::int64_t n, const cuda_kernels::Narrow& narrow = {});
  // An op about to rewrite some of the n values at x in place: where all of them have their
  // companion now (noted with the GEMM engine), it is returned for the op to round what it
  // changes into, and the note stays; otherwise what the GEMMs knew of them is forgotten.
  cuda_kernels::Narrow rewrite_in_place(const float* x, std::int64_t n);
  struct Apart {
    const float* wide = nullptr;
    const float* apart = nullptr;
    std::vector<std::int64_t> begin, n, at;
  };
  // Where a kernel reads the parameter tensor of n elements at p: its place apart where p lies in
  // a range kept apart (note_kept_apart), else p. A tensor straddling such a range's end is
  // reported to the sink (it would be read half from a copy that does not hold it).
  const float* param(const float* p, std::int64_t n);
  // `bytes` at p were written without a companion.
  void wrote_bytes(const void* p, std::uint64_t bytes) { gemm_->forget_written(p, bytes); }

  backend::DType narrow_type_ = backend::DType::kF32;
  std::vector<Pair> pairs_;
  bool narrow_logits_ = false;
  bool narrow_alone_ = false;
  bool gate_up_narrow_ = false;
  bool gelu_narrow_ = false;
  std::int64_t narrow_gelu_calls_ = 0;
  bool gelu_grad_alone_ = false;
  std::int64_t gelu_grad_writes_ = 0;
  std::int64_t gelu_grad_bias_reads_ = 0;
  // The last GELU gradient written alone (bias_backward reading it counts in gelu_grad_bias_reads).
  const float* gelu_grad_key_ = nullptr;
  std::int64_t narrow_swiglu_calls_ = 0;
  std::int64_t alone_writes_ = 0;
  bool attention_alone_ = false;
  std::int64_t attention_alone_writes_ = 0;
  bool attention_grad_alone_ = false;
  std::int64_t attention_grad_reads_ = 0;
  bool swiglu_grad_alone_ = false;
  std::int64_t swiglu_grad_reads_ = 0;
  bool norm_grad_alone_ = false;
  std::int64_t norm_grad_reads_ = 0;
  bool gate_up_grad_alone_ = false;
  std::int64_t gate_up_grad_writes_ = 0;
  bool qkv_grad_alone_ = false;
  std::int64_t qkv_grad_writes_ = 0;
  std::int64_t qkv_grad_bias_reads_ = 0;
  bool qkv_alone_ = false;
  std::int64_t bias_alone_writes_ = 0;
  std::int64_t qkv_alone_reads_ = 0;
  std::int64_t narrow_logit_rows_ = 0;
  bool kept_apart_ = false;
  std::vector<Apart> aparts_;
  std::int64_t apart_reads_ = 0;
  void check(cudaError_t result, const char* op, const char* file, int line);
  // Whether a GEMM engine epilogue call is done: it fused, or it failed (reported to the sink);
  // false: the caller runs the unfused ops.
  bool epilogue_done(const Result<bool>& fused);
  // A staged attention call's result: true when it ran (counted) or failed with a CUDA error
  // (reported); false when cuDNN refused it (the path dropped: the caller runs flash instead).
  bool staged_ran(cudaError_t result, const char* op);
  cuda::ColumnReducePlan reduce_plan(std::int64_t rows, std::int64_t cols, int arrays,
                                     const char* op);
  double reduce(const float* x, std::int64_t n, bool squares);
  // The 16-bit staging's copy of the attention output `out` where it can read it in place: out's
  // companion, current (every value written with it), in the attention's 16-bit type, compact
  // (out_stride the heads' width) and 16-byte aligned; else null (the staging rounds out).
  const std::uint16_t* staged_companion(const float* out,
                                        const backend::AttentionShape& shape) const;
  // attention_forward / attention_backward, rotating q and k in the staging where `rope` is given
  // (only where takes_flash holds).
  void attention_forward_impl(float* out, float* lse, const float* q, const float* k,
                              const float* v, const backend::AttentionShape& shape,
                              const kernels::QkRotation<float>& rope);
  void attention_backward_impl(float* dq, float* dk, float* dv, const float* dout, const float* out,
                               const float* lse, const float* q, const float* k, const float* v,
                               const backend::AttentionShape& shape,
                               const kernels::QkRotation<float>& rope);

  cudaStream_t stream_;
  cuda::GemmEngine* gemm_;
  OpsScratch scratch_;
  cuda::ErrorSink* sink_;
  bool flash_bf16_ = true;
  std::vector<std::int64_t> flash_head_sizes_;
  std::int64_t flash_calls_ = 0;
  std::int64_t fp32_attention_calls_ = 0;
  StagedAttention cudnn_;
  bool fused_norm_ = false;
  std::int64_t fused_norm_calls_ = 0;
  std::int64_t staged_companion_reads_ = 0;
  bool rope_in_attention_ = false;
  std::int64_t rotated_attention_calls_ = 0;
  std::int64_t cudnn_calls_ = 0;
};

class CudaOptimizerOps final : public backend::OptimizerOps {
 public:
  CudaOptimizerOps(cudaStream_t stream, const OpsScratch& scratch, cuda::ErrorSink* sink)
      : stream_(stream), scratch_(scratch), sink_(sink) {}

  Result<kernels::AdamResult> adam_step(const kernels::AdamParams& params,
                                        const kernels::AdamFusion& fusion,
                                        const kernels::AdamTile& tile) override;

 private:
  // Copies 2 doubles from the device to the pinned scratch and waits for the stream.
  Status read_back(const double* device);

  cudaStream_t stream_;
  OpsScratch scratch_;
  cuda::ErrorSink* sink_;
};

}  // STRATA_CUDA_NAMESPACE(backend)
