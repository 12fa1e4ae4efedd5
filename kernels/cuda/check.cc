// CUDA and cuBLASLt result checks (see check.h).
#include "kernels/cuda/check.h"

#include <fmt/format.h>

#include "common/log.h"

STRATA_CUDA_NAMESPACE(cuda) {

Status check_cuda(cudaError_t result, const char* call, const char* file, int line) {
  if (result == cudaSuccess) return Status::ok();
  // The runtime also keeps this error as its "last error"; clear it, or the next kernel launch's
  // cudaGetLastError() would report it as its own (a sticky error comes back regardless).
  (void)cudaGetLastError();
  const std::string message = fmt::format("{}:{}: {} failed: {} ({})", file, line, call,
                                          cudaGetErrorName(result), cudaGetErrorString(result));
  STRATA_LOG_ERROR("CUDA: {}", message);
  ErrorCode code = ErrorCode::kInternal;
  if (result == cudaErrorMemoryAllocation) code = ErrorCode::kOutOfMemory;
  if (result == cudaErrorNoDevice || result == cudaErrorInsufficientDriver ||
      result == cudaErrorInvalidDevice || result == cudaErrorDevicesUnavailable) {
    code = ErrorCode::kUnavailable;
  }
  return Status(code, message, "CUDA");
}

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}

Status check_cublas(cublasStatus_t result, const char* call, const char* file, int line) {
  if (result == CUBLAS_STATUS_SUCCESS) return Status::ok();
  const std::string message = fmt::format("{}:{}: {} failed: {} ({})", file, line, call,
                                          cublas_status_name(result), static_cast<int>(result));
  STRATA_LOG_ERROR("cuBLASLt: {}", message);
  return Status(
      result == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
      message, "cuBLASLt");
}

}  // STRATA_CUDA_NAMESPACE(cuda)
