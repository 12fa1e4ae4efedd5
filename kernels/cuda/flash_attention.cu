// Launchers of the tensor-core flash attention on fp32 activations (flash_attention_f32.cuh) on a
// CUDA stream.
#include "kernels/cuda/flash_attention_f32.cuh"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

cudaError_t flash_attention_forward_f32(cudaStream_t s, bool bf16, std::uint16_t* workspace,
                                        std::int64_t workspace_elements, float* out, float* lse,
                                        const float* q, const float* k, const float* v,
                                        const AttentionShape& shape, Narrow out_narrow,
                                        const kernels::QkRotation<float>& rope,
                                        const QkvSixteen& qkv16) {
  if (shape.batch <= 0 || shape.seq_len <= 0 || shape.heads <= 0) return cudaSuccess;
  if (!flash_f32_supported(shape, workspace_elements) ||
      !flash_f32_forward_out_valid(out, out_narrow, shape, bf16) ||
      !flash_f32_inputs_valid(q, k, v, qkv16)) {
    return cudaErrorInvalidValue;
  }
  const CudaLauncher launch{s};
  return bf16 ? run_flash_attention_forward_f32<FlashBf16>(launch, workspace, workspace_elements,
                                                           out, lse, q, k, v, shape, out_narrow,
                                                           rope, qkv16)
              : run_flash_attention_forward_f32<FlashFp16>(launch, workspace, workspace_elements,
                                                           out, lse, q, k, v, shape, out_narrow,
                                                           rope, qkv16);
}

cudaError_t flash_attention_backward_f32(cudaStream_t s, bool bf16, std::uint16_t* workspace,
                                         std::int64_t workspace_elements, float* dq, float* dk,
                                         float* dv, const float* dout, const float* out,
                                         const float* lse, const float* q, const float* k,
                                         const float* v, const AttentionShape& shape,
                                         QkvNarrow d_narrow, const kernels::QkRotation<float>& rope,
                                         const std::uint16_t* out16, const std::uint16_t* dout16,
                                         const QkvSixteen& qkv16) {
  if (shape.batch <= 0 || shape.seq_len <= 0 || shape.heads <= 0) return cudaSuccess;
  if (!flash_f32_supported(shape, workspace_elements) ||
      !flash_f32_backward_out_valid(out, out16, dout, dout16, shape) ||
      !flash_f32_backward_grads_valid(dq, dk, dv, d_narrow) ||
      !flash_f32_inputs_valid(q, k, v, qkv16)) {
    return cudaErrorInvalidValue;
  }
  const CudaLauncher launch{s};
  return bf16 ? run_flash_attention_backward_f32<FlashBf16>(
                    launch, workspace, workspace_elements, dq, dk, dv, dout, out, lse, q, k, v,
                    shape, d_narrow, rope, out16, dout16, qkv16)
              : run_flash_attention_backward_f32<FlashFp16>(
                    launch, workspace, workspace_elements, dq, dk, dv, dout, out, lse, q, k, v,
                    shape, d_narrow, rope, out16, dout16, qkv16);
}

cudaError_t attention16_forward_f32(cudaStream_t s, bool bf16, const Attention16& inner,
                                    std::uint16_t* workspace, std::int64_t workspace_elements,
                                    float* out, float* lse, const float* q, const float* k,
                                    const float* v, const AttentionShape& shape, Narrow out_narrow,
                                    const kernels::QkRotation<float>& rope,
                                    const QkvSixteen& qkv16) {
  if (shape.batch <= 0 || shape.seq_len <= 0 || shape.heads <= 0) return cudaSuccess;
  if (!flash_f32_supported(shape, workspace_elements) ||
      !flash_f32_forward_out_valid(out, out_narrow, shape, bf16) ||
      !flash_f32_inputs_valid(q, k, v, qkv16)) {
    return cudaErrorInvalidValue;
  }
  // Attention16's two calls are flash_attention_f32.cuh's inner ones.
  const CudaLauncher launch{s};
  return bf16 ? run_attention16_forward_f32<FlashBf16>(launch, inner, workspace, workspace_elements,
                                                       out, lse, q, k, v, shape, out_narrow, rope,
                                                       qkv16)
              : run_attention16_forward_f32<FlashFp16>(launch, inner, workspace, workspace_elements,
                                                       out, lse, q, k, v, shape, out_narrow, rope,
                                                       qkv16);
}

cudaError_t attention16_backward_f32(cudaStream_t s, bool bf16, const Attention16& inner,
                                     std::uint16_t* workspace, std::int64_t workspace_elements,
                                     float* dq, float* dk, float* dv, const float* dout,
                                     const float* out, const float* lse, const float* q,
                                     const float* k, const float* v, const AttentionShape& shape,
                                     QkvNarrow d_narrow, const kernels::QkRotation<float>& rope,
                                     const std::uint16_t* out16, const std::uint16_t* dout16,
                                     const QkvSixteen& qkv16) {
  if (shape.batch <= 0 || shape.seq_len <= 0 || shape.heads <= 0) return cudaSuccess;
  if (!flash_f32_supported(shape, workspace_elements) ||
      !flash_f32_backward_out_valid(out, out16, dout, dout16, shape) ||
      !flash_f32_backward_grads_valid(dq, dk, dv, d_narrow) ||
      !flash_f32_inputs_valid(q, k, v, qkv16)) {
    return cudaErrorInvalidValue;
  }
  const CudaLauncher launch{s};
  return bf16
             ? run_attention16_backward_f32<FlashBf16>(launch, inner, workspace, workspace_elements,
                                                       dq, dk, dv, dout, out, lse, q, k, v, shape,
                                                       d_narrow, rope, out16, dout16, qkv16)
             : run_attention16_backward_f32<FlashFp16>(launch, inner, workspace, workspace_elements,
                                                       dq, dk, dv, dout, out, lse, q, k, v, shape,
                                                       d_narrow, rope, out16, dout16, qkv16);
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
