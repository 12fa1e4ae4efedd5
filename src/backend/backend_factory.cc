// Backend selection (see backend_factory.h), and the stand-in for make_cuda_backend in builds
// without the CUDA parts.
#include "backend/backend_factory.h"

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "common/units.h"

namespace strata::backend {

#if !defined(STRATA_HAVE_CUDA)
bool cuda_backend_built() {
  return false;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions&) {
  return Status(ErrorCode::kUnavailable,
                "this strata was built without CUDA (STRATA_CUDA=OFF or no nvcc at build time)");
}
#endif

Result<BackendChoice> choose_backend(config::Backend requested, const sys::CudaProbe& probe,
                                     const std::string& backend_key) {
  BackendChoice choice;
  const bool usable = probe.built_with_cuda && !probe.gpus.empty();
  switch (requested) {
    case config::Backend::kCpu:
      return choice;
    case config::Backend::kCuda:
      if (!probe.built_with_cuda) {
        return Status(ErrorCode::kUnavailable,
                      "\"cuda\" was requested but this strata was built without CUDA; rebuild "
                      "with the CUDA toolkit installed, or use \"cpu\" or \"auto\"",
                      backend_key);
      }
      if (!usable) {
        return Status(ErrorCode::kUnavailable,
                      fmt::format("\"cuda\" was requested but there is no usable GPU: {}; use "
                                  "\"cpu\" or \"auto\"",
                                  probe.error),
                      backend_key);
      }
      choice.cuda = true;
      return choice;
    case config::Backend::kAuto:
      if (usable) {
        choice.cuda = true;
        const sys::GpuInfo& gpu = probe.gpus.front();
        choice.note =
            fmt::format("backend auto: GPU 0 is {} (sm_{}{}, {}); using the CUDA backend", gpu.name,
                        gpu.compute_major, gpu.compute_minor, format_bytes(gpu.memory_bytes));
      } else {
        choice.note = fmt::format("backend auto: no GPU ({}); using the CPU backend", probe.error);
      }
      return choice;
  }
  return choice;
}

cuda::GemmPrecision resolve_gemm_precision(config::GemmPrecision setting,
                                           config::Precision precision) {
  switch (setting) {
    case config::GemmPrecision::kFp32:
      return cuda::GemmPrecision::kFp32;
    case config::GemmPrecision::kTf32:
      return cuda::GemmPrecision::kTf32;
    case config::GemmPrecision::kBf16:
      return cuda::GemmPrecision::kBf16;
    case config::GemmPrecision::kFp16:
      return cuda::GemmPrecision::kFp16;
    case config::GemmPrecision::kAuto:
      break;
  }
  switch (precision) {
    case config::Precision::kBf16:
      return cuda::GemmPrecision::kBf16;
    case config::Precision::kFp16:
      return cuda::GemmPrecision::kFp16;
    case config::Precision::kFp32:
      break;
  }
  return cuda::GemmPrecision::kFp32;
}

namespace {

Result<std::unique_ptr<Backend>> make_cpu(const BackendRequest& request) {
  CpuBackendOptions options;  // its default device budget is the CPU backend's "auto"
  if (request.device_bytes_max > 0) options.device_bytes_max = request.device_bytes_max;
  options.host_bytes_max = request.host_bytes_max;
  options.threads = request.cpu_threads;
  options.device_budget_name = request.device_budget_name;
  options.host_budget_name = request.host_budget_name;
  return make_cpu_backend(options);
}

}  // namespace

Result<MadeBackend> make_backend(const BackendRequest& request) {
  MadeBackend made;
  const sys::CudaProbe probe =
      request.kind == config::Backend::kCpu ? sys::CudaProbe{} : sys::probe_cuda();
  STRATA_ASSIGN_OR_RETURN(BackendChoice choice,
                          choose_backend(request.kind, probe, request.backend_key));
  made.note = choice.note;
  if (choice.cuda) {
    auto cuda = make_cuda_backend(cuda_backend_options(request));
    if (cuda.is_ok()) {
      made.backend = std::move(cuda).value();
      return made;
    }
    // Only a missing facility (no cuBLASLt, no usable device after all) falls back under
    // "auto"; a budget or memory error is the user's to see.
    if (request.kind == config::Backend::kCuda || cuda.status().code() != ErrorCode::kUnavailable) {
      return cuda.status().with_context(request.backend_key);
    }
    made.note = fmt::format(
        "backend auto: the CUDA backend could not start ({}); using the CPU "
        "backend",
        cuda.status().to_string());
  }
  STRATA_ASSIGN_OR_RETURN(made.backend, make_cpu(request));
  return made;
}

}  // namespace strata::backend
