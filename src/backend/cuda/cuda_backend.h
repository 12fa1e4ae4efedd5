// CudaBackend: the Backend on an NVIDIA GPU (cuda_backend.cc beside this header, built only when
// nvcc was found; elsewhere make_cuda_backend says so).
//   - device memory: ONE cudaMalloc of the device budget at creation, carved by an Arena; nothing
//     calls cudaMalloc afterwards;
//   - pinned memory: mmap + cudaHostRegister at exact size, counted against the host budget and
//     RLIMIT_MEMLOCK (`ulimit -l`);
//   - three non-blocking streams (compute, host->device, device->host) and a fixed pool of
//     cudaEvent_t; every CUDA and cuBLASLt result is checked and turned into a Status;
//   - Ops<float> on kernels/cuda (GEMMs through cuBLASLt, loaded at run time so that `strata`
//     starts on machines without it), OptimizerOps (device AdamW, gradient statistics).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_factory.h"
#include "kernels/cuda/cuda_namespace.h"
#include "kernels/cuda/launch_plan.h"

STRATA_CUDA_NAMESPACE(backend) {

struct CudaBackendOptions {
  int device = 0;                      // CUDA device index
  std::uint64_t device_bytes_max = 0;  // arena budget; 0 = free GPU memory less device_reserve
  std::uint64_t device_reserve_bytes = 512ull << 20;  // left to the CUDA context and libraries
  std::uint64_t host_bytes_max = 0;                   // pinned budget; 0 = 80% of available memory
  int cpu_threads = 0;  // host threads (compute_threads()); 0 = all available
  cuda::GemmPrecision gemm_precision = cuda::GemmPrecision::kFp32;
  // The backend's own workspaces, from the arena: each at most this size and at most a fraction
  // of the budget (memory_plan.h, plan_workspaces).
  // 16-bit conversion workspace of bf16/fp16 GEMMs (GEMMs larger than it are cut into blocks).
  std::uint64_t gemm_workspace_bytes = 128ull << 20;
  std::uint64_t cublas_workspace_bytes = 32ull << 20;  // cuBLASLt's own workspace
  std::uint64_t reduce_scratch_bytes = 16ull << 20;    // column-reduction partials
  bool use_cublaslt = true;  // false: every GEMM runs Strata's fallback kernel (tests)
  // The run's attention head sizes: the flash attention is checked at start for these alone
  // (empty: for every head size it has kernels for, as `strata report` lists them).
  std::vector<std::int64_t> attention_head_sizes;
  std::string device_budget_name = "strata.device_bytes_max";
  std::string host_budget_name = "strata.host_bytes_max";
};

// The options a run's request makes the backend with (make_backend, and the tests' emulated CUDA
// backend).
inline CudaBackendOptions cuda_backend_options(const BackendRequest& request) {
  CudaBackendOptions options;
  options.device = request.device;
  options.device_bytes_max = request.device_bytes_max;
  options.host_bytes_max = request.host_bytes_max;
  options.cpu_threads = request.cpu_threads;
  options.gemm_precision = resolve_gemm_precision(request.gemm_precision, request.precision);
  options.device_budget_name = request.device_budget_name;
  options.host_budget_name = request.host_budget_name;
  options.attention_head_sizes = request.attention_head_sizes;
  return options;
}

// Whether this build has the CUDA backend at all.
bool cuda_backend_built();

// Creates the backend on options.device: context, streams, events, the arena, cuBLASLt.
// kUnavailable when built without CUDA, when there is no usable GPU, or when libcublasLt cannot
// be loaded; kOutOfMemory when the budget exceeds the GPU's free memory; kInvalidArgument for
// budgets too small for the backend's own workspaces.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options);

}  // STRATA_CUDA_NAMESPACE(backend)
