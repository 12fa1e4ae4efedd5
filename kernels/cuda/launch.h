// Host-callable launchers of the CUDA kernels, one per model operation (the contracts are those of
// kernels/cpu/nn_ops.h and cast.h, on device pointers, fp32 compute). Each queues its kernels on
// `stream` and returns the launch's cudaError_t (cudaSuccess for empty work, which launches
// nothing); errors while a kernel runs surface at the next synchronisation. Shapes are checked by
// the caller (CudaOps); launch configurations come from launch_plan.h. The kernels
// themselves are in *_kernels.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cpu/nn_ops.h"
#include "kernels/cuda/adam_constants.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/dtype_codes.h"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

using kernels::AttentionShape;
using kernels::RopeShape;

// ---- element-wise (elementwise.cu) ----
cudaError_t embedding_forward(cudaStream_t s, float* out, const std::int32_t* tokens,
                              const std::int32_t* positions, const float* wte, const float* wpe,
                              std::int64_t rows, std::int64_t seq_len, std::int64_t channels);
// The kernels taking a Narrow (dtype_codes.h) also write their fp32 output's rounding to it
// (the final values, for those that accumulate). The norms' forwards (with or without the
// residual), gelu_forward and swiglu_forward take a null `out` with a companion: they write the
// companion alone (an activation kept in 16 bits alone).
cudaError_t gelu_forward(cudaStream_t s, float* out, const float* x, std::int64_t n,
                         Narrow narrow = {});
cudaError_t gelu_backward(cudaStream_t s, float* dx, const float* x, const float* dout,
                          std::int64_t n, Narrow narrow = {});
// GELU's forward and backward on x (the pre-activation) in 16 bits (`code`, kCodeBF16 or
// kCodeF16): the bits of gelu_forward and of gelu_backward onto a zeroed dx, on the widened values.
// The backward assigns dx. Either's fp32 output may be null with a companion: it writes the
// companion alone; null without one is cudaErrorInvalidValue.
cudaError_t gelu_forward_16(cudaStream_t s, float* out, const void* x, int code, std::int64_t n,
                            Narrow narrow = {});
cudaError_t gelu_backward_16(cudaStream_t s, float* dx, const void* x, int code, const float* dout,
                             std::int64_t n, Narrow narrow = {});
cudaError_t swiglu_forward(cudaStream_t s, float* out, const float* gate_up, std::int64_t rows,
                           std::int64_t inner, Narrow narrow = {});
cudaError_t swiglu_backward(cudaStream_t s, float* dgate_up, const float* gate_up,
                            const float* dout, std::int64_t rows, std::int64_t inner,
                            Narrow narrow = {});
// SwiGLU's forward and backward on gate_up in 16 bits (`code`, kCodeBF16 or kCodeF16): the bits of
// swiglu_forward and swiglu_backward on the widened values. The backward's dout is fp32 (`dout`,
// `dout16` null) or in the same 16 bits (`dout16`, `dout` null: a gradient kept in 16 bits alone),
// widened likewise; both or neither is cudaErrorInvalidValue. The backward's `dgate_up` may be null
// with a companion: it writes the companion alone (a gradient kept in 16 bits alone).
cudaError_t swiglu_forward_16(cudaStream_t s, float* out, const void* gate_up, int code,
                              std::int64_t rows, std::int64_t inner, Narrow narrow = {});
cudaError_t swiglu_backward_16(cudaStream_t s, float* dgate_up, const void* gate_up, int code,
                               const float* dout, const void* dout16, std::int64_t rows,
                               std::int64_t inner, Narrow narrow = {});
cudaError_t add(cudaStream_t s, float* out, const float* a, const float* b, std::int64_t n);
// dst[at[i], at[i] + n[i]) = src's 16-bit `code` elements [begin[i], begin[i] + n[i]), widened,
// for i < count (one launch per 16 ranges).
cudaError_t cast_ranges_from_16(cudaStream_t s, float* dst, const void* src, int code,
                                const std::int64_t* begin, const std::int64_t* n, int count,
                                const std::int64_t* at);
// acc = g rounded to the 16-bit `code` and widened back (assign), or acc += that.
cudaError_t add_rounded(cudaStream_t s, float* acc, const float* g, int code, std::int64_t n,
                        bool assign);
cudaError_t add_bias(cudaStream_t s, float* x, const float* bias, std::int64_t rows,
                     std::int64_t channels);
cudaError_t scale(cudaStream_t s, float* x, std::int64_t n, float alpha);
// direction +1: the forward rotation; -1: its transpose (backward).
cudaError_t rope(cudaStream_t s, float* x, const RopeShape& shape, const float* cos,
                 const float* sin, float direction, Narrow narrow = {});
// dst[i] = src[i] converted between DTypeCode types.
cudaError_t cast(cudaStream_t s, void* dst, int dst_code, const void* src, int src_code,
                 std::int64_t n);
// dst (rows x cols, leading dimension dst_ld, 16-bit `dst_code`) = src (rows x cols of fp32,
// leading dimension src_ld), rounding to nearest even: one GEMM operand block.
cudaError_t cast_block_to_16(cudaStream_t s, void* dst, int dst_code, std::int64_t dst_ld,
                             const float* src, std::int64_t src_ld, std::int64_t rows,
                             std::int64_t cols);

// ---- normalisation and column reductions (norm.cu) ----
// `scratch` holds at least plan.chunks * arrays * channels doubles (launch_plan.h).
cudaError_t layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* x,
                              const float* w, const float* b, std::int64_t rows,
                              std::int64_t channels, double eps, Narrow narrow = {});
// res += x, then layernorm_forward of res, in one kernel (the bits of add, then layernorm_forward).
cudaError_t add_layernorm_forward(cudaStream_t s, float* res, const float* x, float* out,
                                  float* mean, float* rstd, const float* w, const float* b,
                                  std::int64_t rows, std::int64_t channels, double eps,
                                  Narrow narrow = {});
// The norms' backwards read dout in fp32, or in 16 bits widened (`dout16` set, `dout` null: a
// gradient kept in 16 bits alone; both or neither is cudaErrorInvalidValue).
cudaError_t layernorm_backward(cudaStream_t s, float* dx, float* dw, float* db, const float* dout,
                               const float* x, const float* w, const float* mean, const float* rstd,
                               std::int64_t rows, std::int64_t channels,
                               const cuda::ColumnReducePlan& plan, double* scratch,
                               Narrow narrow = {}, Sixteen dout16 = {});
cudaError_t rmsnorm_forward(cudaStream_t s, float* out, float* rstd, const float* x, const float* w,
                            std::int64_t rows, std::int64_t channels, double eps,
                            Narrow narrow = {});
// res += x, then rmsnorm_forward of res, in one kernel (the bits of add, then rmsnorm_forward).
cudaError_t add_rmsnorm_forward(cudaStream_t s, float* res, const float* x, float* out, float* rstd,
                                const float* w, std::int64_t rows, std::int64_t channels,
                                double eps, Narrow narrow = {});
cudaError_t rmsnorm_backward(cudaStream_t s, float* dx, float* dw, const float* dout,
                             const float* x, const float* w, const float* rstd, std::int64_t rows,
                             std::int64_t channels, const cuda::ColumnReducePlan& plan,
                             double* scratch, Narrow narrow = {}, Sixteen dout16 = {});
cudaError_t rmsnorm_heads_forward(cudaStream_t s, float* out, float* rstd, const float* x,
                                  const float* w, std::int64_t rows, std::int64_t heads,
                                  std::int64_t head_dim, std::int64_t x_stride,
                                  std::int64_t out_stride, double eps);
// In place on d; `plan` splits rows * heads vectors of head_dim columns.
cudaError_t rmsnorm_heads_backward(cudaStream_t s, float* d, float* dw, const float* x,
                                   const float* w, const float* rstd, std::int64_t rows,
                                   std::int64_t heads, std::int64_t head_dim, std::int64_t d_stride,
                                   std::int64_t x_stride, const cuda::ColumnReducePlan& plan,
                                   double* scratch, Narrow narrow = {});
// dout in fp32, or in 16 bits (`dout16`, dout null: a gradient kept in 16 bits alone) read widened;
// both or neither is cudaErrorInvalidValue.
cudaError_t bias_backward(cudaStream_t s, float* dbias, const float* dout, std::int64_t rows,
                          std::int64_t channels, const cuda::ColumnReducePlan& plan,
                          double* scratch, Sixteen dout16 = {});
// Deterministic without atomics: each (token, column) gradient adds its rows in row order (and
// each (position, column) of dwpe likewise); rows of token padding_idx (-1: none) add nothing.
cudaError_t embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dout,
                               const std::int32_t* tokens, const std::int32_t* positions,
                               std::int64_t rows, std::int64_t seq_len, std::int64_t channels,
                               std::int32_t padding_idx);

// ---- attention (attention.cu) ----
// Flash-style (online softmax over 32-key tiles, never a T x T matrix), fp32 on CUDA cores.
cudaError_t attention_forward(cudaStream_t s, float* out, float* lse, const float* q,
                              const float* k, const float* v, const AttentionShape& shape,
                              const cuda::AttentionLaunch& launch);
// WRITES dq, dk, dv; deterministic (dq and dk/dv come from separate kernels, no atomics).
cudaError_t attention_backward(cudaStream_t s, float* dq, float* dk, float* dv, const float* dout,
                               const float* out, const float* lse, const float* q, const float* k,
                               const float* v, const AttentionShape& shape,
                               const cuda::AttentionLaunch& launch);

// ---- tensor-core flash attention on fp32 activations (flash_attention.cu) ----
// The contracts of attention_forward / attention_backward above, computed by the flash kernels on
// q, k, v (and out, dO) rounded to bf16 (`bf16`, else fp16) in `workspace` (workspace_elements
// 16-bit elements, 16-byte aligned; launch_plan.h's plan_flash_io); fp32 accumulation and softmax
// statistics, results widened to fp32 (and rounded into their companions, where given: each
// Narrow's pointer at its array's first element, with the array's stride). cudaErrorInvalidValue
// unless flash_f32_supported(shape, workspace_elements) (flash_attention_f32.cuh: head size 64, 80,
// 96, 128 or 256, whole GQA groups, one batch row fits the workspace). The backward's bits do not
// depend on timing (flash_attention_backward_kernels.cuh). With `rope`'s tables, q and k are
// rotated as they are staged (flash_attention_f32.cuh; the arrays keep their values). With
// `out16` (out's 16-bit companion, compact, 16-byte aligned), the backward reads out's 16 bits from
// it instead of rounding out again. An output kept in 16 bits alone has a null `out` in both
// directions: the forward writes its 16-bit results into `out_narrow` alone (of the attention's
// type, compact rows), the backward reads `out16`; cudaErrorInvalidValue without them. The
// backward's dq, dk, dv kept in 16 bits alone are all null: it writes their
// companions (`d_narrow`, all three) alone; cudaErrorInvalidValue otherwise. q, k and v kept in
// 16 bits alone come in `qkv16` (bf16 or fp16, with the caller's strides; their fp32 pointers
// null): the staging reads them widened, with the bits it gives on fp32 arrays holding those
// values; cudaErrorInvalidValue unless each of q, k, v is given once.
cudaError_t flash_attention_forward_f32(cudaStream_t s, bool bf16, std::uint16_t* workspace,
                                        std::int64_t workspace_elements, float* out, float* lse,
                                        const float* q, const float* k, const float* v,
                                        const AttentionShape& shape, Narrow out_narrow = {},
                                        const kernels::QkRotation<float>& rope = {},
                                        const QkvSixteen& qkv16 = {});
cudaError_t flash_attention_backward_f32(
    cudaStream_t s, bool bf16, std::uint16_t* workspace, std::int64_t workspace_elements, float* dq,
    float* dk, float* dv, const float* dout, const float* out, const float* lse, const float* q,
    const float* k, const float* v, const AttentionShape& shape, QkvNarrow d_narrow = {},
    const kernels::QkRotation<float>& rope = {}, const std::uint16_t* out16 = nullptr,
    const std::uint16_t* dout16 = nullptr, const QkvSixteen& qkv16 = {});

// Another 16-bit attention on the same staging (cuDNN's fused attention, cudnn_sdpa.h): each pass's
// q, k, v (and out, dO) in the compact 16-bit layout (strides heads * head_dim and
// kv_heads * head_dim), lse (B, H, T) fp32, `delta` room for (B*T, H) floats the backward may use;
// the calls enqueue their work on the stream the launchers below were given.
class Attention16 {
 public:
  virtual ~Attention16() = default;
  virtual cudaError_t forward(std::uint16_t* out, float* lse, const std::uint16_t* q,
                              const std::uint16_t* k, const std::uint16_t* v,
                              const AttentionShape& pass) const = 0;
  virtual cudaError_t backward(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                               float* delta, const std::uint16_t* dout, const std::uint16_t* out,
                               const float* lse, const std::uint16_t* q, const std::uint16_t* k,
                               const std::uint16_t* v, const AttentionShape& pass) const = 0;
};
// The flash launchers' contracts with `inner` computing each pass.
cudaError_t attention16_forward_f32(cudaStream_t s, bool bf16, const Attention16& inner,
                                    std::uint16_t* workspace, std::int64_t workspace_elements,
                                    float* out, float* lse, const float* q, const float* k,
                                    const float* v, const AttentionShape& shape,
                                    Narrow out_narrow = {},
                                    const kernels::QkRotation<float>& rope = {},
                                    const QkvSixteen& qkv16 = {});
cudaError_t attention16_backward_f32(
    cudaStream_t s, bool bf16, const Attention16& inner, std::uint16_t* workspace,
    std::int64_t workspace_elements, float* dq, float* dk, float* dv, const float* dout,
    const float* out, const float* lse, const float* q, const float* k, const float* v,
    const AttentionShape& shape, QkvNarrow d_narrow = {},
    const kernels::QkRotation<float>& rope = {}, const std::uint16_t* out16 = nullptr,
    const std::uint16_t* dout16 = nullptr, const QkvSixteen& qkv16 = {});

// ---- loss and reductions (loss.cu) ----
cudaError_t cross_entropy_forward(cudaStream_t s, float* losses, const float* logits,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t vocab);
// The gradient rounded into its companion too, where `narrow` has one.
cudaError_t cross_entropy_fused(cudaStream_t s, float* logits, float* losses,
                                const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                                float grad_scale, Narrow narrow = {});
// Cross-entropy of logits held in 16 bits alone (`code`, kCodeBF16 or kCodeF16; rows of `vocab`
// values, `ld` apart):
// losses[r] in fp32 from one pass over the row (a running max and sum of exp, the sum in double)
// and, with `fused`, the gradient times grad_scale written over the logits in the same 16 bits (a
// second pass). A target of -1 gives loss 0 and a zero gradient row. The logits are never widened
// into an fp32 array: the head's loss reads each logit twice, 2 bytes each time.
cudaError_t cross_entropy_16(cudaStream_t s, bool fused, void* logits, std::int64_t ld, int code,
                             float* losses, const std::int32_t* targets, std::int64_t rows,
                             std::int64_t vocab, float grad_scale);
// Statistics of n elements in double: result[0] = sum (or sum of squares when `squares`),
// result[1] = count of non-finite elements (as a double). With `accumulate` the statistics are
// added to result[], else they overwrite it. `partials` holds 2 * kReduceBlocks doubles. Fixed
// grid and order: the same bits on every run and every GPU.
cudaError_t reduce_stats(cudaStream_t s, const void* x, int code, std::int64_t n, bool squares,
                         double* partials, double* result, bool accumulate);

// ---- optimizer (adam.cu) ----
// The AdamW update of kernels/cpu/adam_internal.h's adam_element, element by element, with the
// same fp32 operations. copy_code < 0: no copy-out. When skip_flag is non-null and
// skip_flag[1] != 0 (reduce_stats's non-finite count), nothing is written.
cudaError_t adam_step(cudaStream_t s, const AdamDeviceConstants& c, float* master, float* exp_avg,
                      float* exp_avg_sq, const void* grad, int grad_code, void* copy_out,
                      int copy_code, std::int64_t n, const double* skip_flag);

// ---- GEMM fallback (gemm_fallback.cu) ----
// Row-major C(m,n) = alpha op(A) op(B) + beta C for any strides and alignment, fp32 accumulation;
// A and B are fp32 or 16-bit (`in_code`); C is fp32 or 16-bit (`out_code`: the fp32 result
// rounded to nearest even once, beta reading C widened); `bias` (n fp32 values, or null) is added
// to each result in fp32 before it is stored (before the rounding); `gelu` (GemmGelu) then stores
// the result into `aux` (C's type and layout) and GELU of it into C, or C = GELU'(aux) times the
// result. Used where cuBLASLt has no algorithm (and in tests).
cudaError_t gemm_fallback(cudaStream_t s, bool trans_a, bool trans_b, std::int64_t m,
                          std::int64_t n, std::int64_t k, float alpha, const void* a,
                          std::int64_t lda, const void* b, std::int64_t ldb, float beta, void* c,
                          std::int64_t ldc, int in_code, int out_code = kCodeF32,
                          const float* bias = nullptr, void* aux = nullptr, int gelu = kGemmNoGelu);

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
