// Picks and creates the backend a run asked for (strata.backend): `cpu`, `cuda`, or `auto` =
// CUDA when this build has it and a GPU is usable, else the CPU backend with a note saying why.
// `cuda` without a usable GPU is an error naming the key.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"
#include "config/config.h"
#include "kernels/cuda/launch_plan.h"
#include "sys/gpu.h"

namespace strata::backend {

// train/run_settings.h fills one from a training config.
struct BackendRequest {
  config::Backend kind = config::Backend::kAuto;
  std::uint64_t device_bytes_max = 0;  // 0 = auto: free GPU memory, or a 4 GiB CPU arena
  std::uint64_t host_bytes_max = 0;    // 0 = 80% of available memory
  int cpu_threads = 0;                 // 0 = every core available
  config::GemmPrecision gemm_precision = config::GemmPrecision::kAuto;
  config::Precision precision = config::Precision::kFp32;  // resolves gemm_precision "auto"
  int device = 0;                                          // CUDA device index
  // The model's attention head sizes (CudaBackendOptions::attention_head_sizes; empty: all).
  std::vector<std::int64_t> attention_head_sizes;
  std::string backend_key = "strata.backend";  // how errors name the settings
  std::string device_budget_name = "strata.device_bytes_max";
  std::string host_budget_name = "strata.host_bytes_max";
};

struct BackendChoice {
  bool cuda = false;
  std::string note;  // for the log: why this backend ("" when there is nothing to say)
};

// The decision alone, from what the CUDA probe saw (no device is touched). kUnavailable naming
// request.backend_key when `cuda` was asked for and cannot be had.
Result<BackendChoice> choose_backend(config::Backend requested, const sys::CudaProbe& probe,
                                     const std::string& backend_key = "strata.backend");

// GEMM inputs for a run: the explicit setting, or for `auto` bf16/fp16 runs their 16-bit type and
// fp32 runs fp32.
cuda::GemmPrecision resolve_gemm_precision(config::GemmPrecision setting,
                                           config::Precision precision);

struct MadeBackend {
  std::unique_ptr<Backend> backend;
  std::string note;  // what was chosen and why, for the log
};

// Probes CUDA, chooses, creates. With `auto`, a GPU whose backend cannot be created (for example
// libcublasLt missing) falls back to the CPU backend and the note says why.
Result<MadeBackend> make_backend(const BackendRequest& request);

}  // namespace strata::backend
