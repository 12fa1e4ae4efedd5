// NCCL-style checks for CUDA runtime and cuBLASLt results: every call's result is checked, in
// release builds too; a failure is logged with file:line and the failing call, and returned as a
// Status (kOutOfMemory for allocation failures, kUnavailable for a missing or unusable device,
// kInternal otherwise). Never assert on these results.
//
//   STRATA_TRY(STRATA_CUDA_CHECK(cudaStreamSynchronize(stream)));
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/cuda/cuda_namespace.h"

STRATA_CUDA_NAMESPACE(cuda) {

// Ok for cudaSuccess; otherwise logs "file:line: call failed: name (message)", clears the
// runtime's last-error slot (so a later launch check does not report it again) and returns it.
Status check_cuda(cudaError_t result, const char* call, const char* file, int line);
// The same for cuBLASLt statuses.
Status check_cublas(cublasStatus_t result, const char* call, const char* file, int line);
// "CUBLAS_STATUS_NOT_SUPPORTED".
const char* cublas_status_name(cublasStatus_t status);

// The first error of work that cannot return one (op launches): kept until read, like CUDA's own
// sticky errors. The backend reports it from its next Status-returning call.
class ErrorSink {
 public:
  // Keeps `status` when it is the first error; ok statuses are ignored.
  void add(const Status& status) {
    if (first_.is_ok() && !status.is_ok()) first_ = status;
  }
  bool failed() const { return !first_.is_ok(); }
  const Status& first() const { return first_; }

 private:
  Status first_;
};

}  // STRATA_CUDA_NAMESPACE(cuda)

#define STRATA_CUDA_CHECK(call) ::strata::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define STRATA_CUBLAS_CHECK(call) ::strata::cuda::check_cublas((call), #call, __FILE__, __LINE__)
