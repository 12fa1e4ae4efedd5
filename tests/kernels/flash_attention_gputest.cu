// The launches behind tests/kernels/flash_attention_gputest.h: the tensor-core flash attention
// forward (kernels/cuda/flash_attention_kernels.cuh) through CudaLauncher on the default stream,
// head sizes 64 and 128, bf16 and fp16.
#include <cuda_runtime.h>

#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/flash_attention_gputest.h"

namespace strata::testing {
namespace {

using cuda_kernels::CudaLauncher;
using cuda_kernels::FlashBf16;
using cuda_kernels::FlashFp16;

std::string error_text(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

// Queues one forward pass on `stream`.
cudaError_t launch(cudaStream_t stream, bool bf16, std::uint16_t* out, float* lse,
                   const std::uint16_t* q, const std::uint16_t* k, const std::uint16_t* v,
                   const kernels::AttentionShape& s) {
  const CudaLauncher launcher{stream};
  if (s.head_dim == 64) {
    return bf16 ? cuda_kernels::run_flash_attention_forward_d<FlashBf16, 64>(launcher, out, lse, q,
                                                                             k, v, s)
                : cuda_kernels::run_flash_attention_forward_d<FlashFp16, 64>(launcher, out, lse, q,
                                                                             k, v, s);
  }
  return bf16 ? cuda_kernels::run_flash_attention_forward_d<FlashBf16, 128>(launcher, out, lse, q,
                                                                            k, v, s)
              : cuda_kernels::run_flash_attention_forward_d<FlashFp16, 128>(launcher, out, lse, q,
                                                                            k, v, s);
}

std::string check_shape(const kernels::AttentionShape& s) {
  if (!flash_gpu_head_dim(s.head_dim)) return "head size not instantiated in this test";
  if (!cuda_kernels::flash_attention_supported(s)) return "shape not supported by the kernel";
  return "";
}

}  // namespace

std::string flash_forward_on_gpu(bool bf16, std::uint16_t* out, float* lse, const std::uint16_t* q,
                                 const std::uint16_t* k, const std::uint16_t* v,
                                 const kernels::AttentionShape& shape) {
  if (std::string bad = check_shape(shape); !bad.empty()) return bad;
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return error_text("before the launch", err);
  err = launch(nullptr, bf16, out, lse, q, k, v, shape);
  if (err != cudaSuccess) return error_text("launch", err);
  err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return error_text("kernel", err);
  return "";
}

std::string time_flash_forward_on_gpu(bool bf16, std::uint16_t* out, float* lse,
                                      const std::uint16_t* q, const std::uint16_t* k,
                                      const std::uint16_t* v, const kernels::AttentionShape& shape,
                                      int warmup, int runs, std::vector<double>& ms) {
  ms.clear();
  if (std::string bad = check_shape(shape); !bad.empty()) return bad;
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return error_text("before the launches", err);
  for (int i = 0; i < warmup; ++i) {
    err = launch(nullptr, bf16, out, lse, q, k, v, shape);
    if (err != cudaSuccess) return error_text("warm-up launch", err);
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  if ((err = cudaEventCreate(&start)) != cudaSuccess) return error_text("event", err);
  if ((err = cudaEventCreate(&stop)) != cudaSuccess) {
    cudaEventDestroy(start);
    return error_text("event", err);
  }
  std::string result;
  for (int i = 0; i < runs && result.empty(); ++i) {
    float elapsed = 0.0f;
    if ((err = cudaEventRecord(start, nullptr)) != cudaSuccess) {
      result = error_text("event record", err);
    } else if ((err = launch(nullptr, bf16, out, lse, q, k, v, shape)) != cudaSuccess) {
      result = error_text("timed launch", err);
    } else if ((err = cudaEventRecord(stop, nullptr)) != cudaSuccess ||
               (err = cudaEventSynchronize(stop)) != cudaSuccess ||
               (err = cudaEventElapsedTime(&elapsed, start, stop)) != cudaSuccess) {
      result = error_text("timed kernel", err);
    } else {
      ms.push_back(static_cast<double>(elapsed));
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (result.empty() && (err = cudaDeviceSynchronize()) != cudaSuccess) {
    result = error_text("after the launches", err);
  }
  return result;
}

}  // namespace strata::testing
