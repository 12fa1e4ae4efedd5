// Launchers of the element-wise kernels (elementwise_kernels.cuh) on a CUDA stream.
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/launch.h"

STRATA_CUDA_NAMESPACE(cuda_kernels) {

cudaError_t embedding_forward(cudaStream_t s, float* out, const std::int32_t* tokens,
                              const std::int32_t* positions, const float* wte, const float* wpe,
                              std::int64_t rows, std::int64_t seq_len, std::int64_t channels) {
  if (rows * channels <= 0) return cudaSuccess;
  return run_embedding_forward(CudaLauncher{s}, out, tokens, positions, wte, wpe, rows, seq_len,
                               channels);
}

cudaError_t gelu_forward(cudaStream_t s, float* out, const float* x, std::int64_t n,
                         Narrow narrow) {
  if (n <= 0) return cudaSuccess;
  return run_gelu_forward(CudaLauncher{s}, out, x, n, narrow);
}

cudaError_t gelu_backward(cudaStream_t s, float* dx, const float* x, const float* dout,
                          std::int64_t n, Narrow narrow) {
  if (n <= 0) return cudaSuccess;
  return run_gelu_backward(CudaLauncher{s}, dx, x, dout, n, narrow);
}

cudaError_t gelu_forward_16(cudaStream_t s, float* out, const void* x, int code, std::int64_t n,
                            Narrow narrow) {
  if (!gelu_16_valid(out, narrow)) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  return run_gelu_forward_16(CudaLauncher{s}, out, static_cast<const std::uint16_t*>(x), code, n,
                             narrow);
}

cudaError_t gelu_backward_16(cudaStream_t s, float* dx, const void* x, int code, const float* dout,
                             std::int64_t n, Narrow narrow) {
  if (!gelu_16_valid(dx, narrow)) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  return run_gelu_backward_16(CudaLauncher{s}, dx, static_cast<const std::uint16_t*>(x), code, dout,
                              n, narrow);
}

cudaError_t swiglu_forward(cudaStream_t s, float* out, const float* gate_up, std::int64_t rows,
                           std::int64_t inner, Narrow narrow) {
  if (rows * inner <= 0) return cudaSuccess;
  return run_swiglu_forward(CudaLauncher{s}, out, gate_up, rows, inner, narrow);
}

cudaError_t swiglu_backward(cudaStream_t s, float* dgate_up, const float* gate_up,
                            const float* dout, std::int64_t rows, std::int64_t inner,
                            Narrow narrow) {
  if (rows * inner <= 0) return cudaSuccess;
  return run_swiglu_backward(CudaLauncher{s}, dgate_up, gate_up, dout, rows, inner, narrow);
}

cudaError_t swiglu_forward_16(cudaStream_t s, float* out, const void* gate_up, int code,
                              std::int64_t rows, std::int64_t inner, Narrow narrow) {
  if (rows * inner <= 0) return cudaSuccess;
  return run_swiglu_forward_16(CudaLauncher{s}, out, static_cast<const std::uint16_t*>(gate_up),
                               code, rows, inner, narrow);
}

cudaError_t swiglu_backward_16(cudaStream_t s, float* dgate_up, const void* gate_up, int code,
                               const float* dout, const void* dout16, std::int64_t rows,
                               std::int64_t inner, Narrow narrow) {
  const auto* dout_16 = static_cast<const std::uint16_t*>(dout16);
  if (!swiglu_backward_16_valid(dgate_up, narrow, dout, dout_16)) return cudaErrorInvalidValue;
  if (rows * inner <= 0) return cudaSuccess;
  return run_swiglu_backward_16(CudaLauncher{s}, dgate_up,
                                static_cast<const std::uint16_t*>(gate_up), code, dout, dout_16,
                                rows, inner, narrow);
}

cudaError_t cast_ranges_from_16(cudaStream_t s, float* dst, const void* src, int code,
                                const std::int64_t* begin, const std::int64_t* n, int count,
                                const std::int64_t* at) {
  // The non-empty ranges, each once, up to CastRanges::kMax a launch.
  CastRanges r;
  for (int i = 0; i < count; ++i) {
    if (n[i] <= 0) continue;
    r.begin[r.count] = begin[i];
    r.n[r.count] = n[i];
    r.at[r.count] = at[i];
    if (++r.count < CastRanges::kMax) continue;
    const cudaError_t err = run_cast_ranges_from_16(CudaLauncher{s}, dst, src, code, r);
    if (err != cudaSuccess) return err;
    r = CastRanges{};
  }
  return r.count == 0 ? cudaSuccess : run_cast_ranges_from_16(CudaLauncher{s}, dst, src, code, r);
}

cudaError_t add_rounded(cudaStream_t s, float* acc, const float* g, int code, std::int64_t n,
                        bool assign) {
  if (n <= 0) return cudaSuccess;
  return run_add_rounded(CudaLauncher{s}, acc, g, code, n, assign);
}

cudaError_t add(cudaStream_t s, float* out, const float* a, const float* b, std::int64_t n) {
  if (n <= 0) return cudaSuccess;
  return run_add(CudaLauncher{s}, out, a, b, n);
}

cudaError_t add_bias(cudaStream_t s, float* x, const float* bias, std::int64_t rows,
                     std::int64_t channels) {
  if (rows * channels <= 0) return cudaSuccess;
  return run_add_bias(CudaLauncher{s}, x, bias, rows, channels);
}

cudaError_t scale(cudaStream_t s, float* x, std::int64_t n, float alpha) {
  if (n <= 0) return cudaSuccess;
  return run_scale(CudaLauncher{s}, x, n, alpha);
}

cudaError_t rope(cudaStream_t s, float* x, const RopeShape& shape, const float* cos,
                 const float* sin, float direction, Narrow narrow) {
  if (shape.rows * shape.heads * shape.head_dim <= 0) return cudaSuccess;
  return run_rope(CudaLauncher{s}, x, shape, cos, sin, direction, narrow);
}

cudaError_t cast(cudaStream_t s, void* dst, int dst_code, const void* src, int src_code,
                 std::int64_t n) {
  if (n <= 0) return cudaSuccess;
  return run_cast(CudaLauncher{s}, dst, dst_code, src, src_code, n);
}

cudaError_t cast_block_to_16(cudaStream_t s, void* dst, int dst_code, std::int64_t dst_ld,
                             const float* src, std::int64_t src_ld, std::int64_t rows,
                             std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  return run_cast_block_to_16(CudaLauncher{s}, dst, dst_code, dst_ld, src, src_ld, rows, cols);
}

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)
