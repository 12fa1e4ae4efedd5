// The launches behind tests/kernels/flash_attention_gputest.h: the tensor-core flash attention
// forward and backward (kernels/cuda/flash_attention_kernels.cuh,
// flash_attention_backward_kernels.cuh) through CudaLauncher on the default stream, head sizes 64
// and 128 only (to keep compile time down), bf16 and fp16.
#include <cuda_runtime.h>

#include "kernels/cuda/flash_attention_backward_kernels.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/flash_attention_gputest.h"

namespace strata::testing {
namespace {

using cuda_kernels::CudaLauncher;
using cuda_kernels::FlashBf16;
using cuda_kernels::FlashFault;
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

// The backward's pointers.
struct BackwardPointers {
  std::uint16_t *dq, *dk, *dv;
  float* delta;
  const std::uint16_t *dout, *out;
  const float* lse;
  const std::uint16_t *q, *k, *v;
};

// Queues one backward pass (its three kernels) on `stream`: run_flash_attention_backward's
// arguments, with only head sizes 64 and 128 instantiated.
cudaError_t launch_backward(cudaStream_t stream, bool bf16, const BackwardPointers& p,
                            const kernels::AttentionShape& s) {
  const CudaLauncher launcher{stream};
  cuda_kernels::FlashBackwardArgs a = cuda_kernels::flash_attention_backward_args(s);
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.out = p.out;
  a.dout = p.dout;
  a.lse = p.lse;
  a.delta = p.delta;
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  constexpr FlashFault kNone = FlashFault::kNone;
  if (s.head_dim == 64) {
    return bf16
               ? cuda_kernels::run_flash_attention_backward_d<FlashBf16, 64, kNone>(launcher, a, s)
               : cuda_kernels::run_flash_attention_backward_d<FlashFp16, 64, kNone>(launcher, a, s);
  }
  return bf16 ? cuda_kernels::run_flash_attention_backward_d<FlashBf16, 128, kNone>(launcher, a, s)
              : cuda_kernels::run_flash_attention_backward_d<FlashFp16, 128, kNone>(launcher, a, s);
}

std::string check_shape(const kernels::AttentionShape& s) {
  if (!flash_gpu_head_dim(s.head_dim)) return "head size not instantiated in this test";
  if (!cuda_kernels::flash_attention_supported(s)) return "shape not supported by the kernel";
  return "";
}

std::string check_backward_shape(const kernels::AttentionShape& s) {
  if (!flash_gpu_head_dim(s.head_dim)) return "head size not instantiated in this test";
  if (!cuda_kernels::flash_attention_backward_supported(s)) {
    return "shape not supported by the backward kernels";
  }
  return "";
}

// One call of `queue` (which queues work on the default stream and returns its cudaError_t),
// waiting for the device before and after.
template <typename Queue>
std::string run_once(Queue&& queue) {
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return error_text("before the launch", err);
  err = queue();
  if (err != cudaSuccess) return error_text("launch", err);
  err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return error_text("kernel", err);
  return "";
}

// `warmup` calls of `queue`, then `runs` more, each timed alone with CUDA events on the default
// stream: their milliseconds, in order, in `ms`.
template <typename Queue>
std::string time_runs(int warmup, int runs, std::vector<double>& ms, Queue&& queue) {
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return error_text("before the launches", err);
  for (int i = 0; i < warmup; ++i) {
    err = queue();
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
    } else if ((err = queue()) != cudaSuccess) {
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

}  // namespace

std::string flash_forward_on_gpu(bool bf16, std::uint16_t* out, float* lse, const std::uint16_t* q,
                                 const std::uint16_t* k, const std::uint16_t* v,
                                 const kernels::AttentionShape& shape) {
  if (std::string bad = check_shape(shape); !bad.empty()) return bad;
  return run_once([&] { return launch(nullptr, bf16, out, lse, q, k, v, shape); });
}

std::string time_flash_forward_on_gpu(bool bf16, std::uint16_t* out, float* lse,
                                      const std::uint16_t* q, const std::uint16_t* k,
                                      const std::uint16_t* v, const kernels::AttentionShape& shape,
                                      int warmup, int runs, std::vector<double>& ms) {
  ms.clear();
  if (std::string bad = check_shape(shape); !bad.empty()) return bad;
  return time_runs(warmup, runs, ms,
                   [&] { return launch(nullptr, bf16, out, lse, q, k, v, shape); });
}

std::string flash_backward_on_gpu(bool bf16, std::uint16_t* dq, std::uint16_t* dk,
                                  std::uint16_t* dv, float* delta, const std::uint16_t* dout,
                                  const std::uint16_t* out, const float* lse,
                                  const std::uint16_t* q, const std::uint16_t* k,
                                  const std::uint16_t* v, const kernels::AttentionShape& shape) {
  if (std::string bad = check_backward_shape(shape); !bad.empty()) return bad;
  const BackwardPointers p{dq, dk, dv, delta, dout, out, lse, q, k, v};
  return run_once([&] { return launch_backward(nullptr, bf16, p, shape); });
}

std::string time_flash_backward_on_gpu(bool bf16, std::uint16_t* dq, std::uint16_t* dk,
                                       std::uint16_t* dv, float* delta, const std::uint16_t* dout,
                                       const std::uint16_t* out, const float* lse,
                                       const std::uint16_t* q, const std::uint16_t* k,
                                       const std::uint16_t* v, const kernels::AttentionShape& shape,
                                       int warmup, int runs, std::vector<double>& ms) {
  ms.clear();
  if (std::string bad = check_backward_shape(shape); !bad.empty()) return bad;
  const BackwardPointers p{dq, dk, dv, delta, dout, out, lse, q, k, v};
  return time_runs(warmup, runs, ms, [&] { return launch_backward(nullptr, bf16, p, shape); });
}

}  // namespace strata::testing
