// Copies between host vectors and a backend's device memory for the backends' start-up checks
// (attention_check.cc, gemm_check.cc): through the compute stream, from and to ordinary (pageable)
// host memory, so each copy has completed when the call returns (Backend::copy_async).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"

namespace strata::backend {

// A device buffer (256-byte aligned, at least one element) holding a copy of `host`.
template <typename T>
Result<Buffer> device_copy(Backend& backend, const std::vector<T>& host, const char* purpose) {
  const std::uint64_t bytes = std::max<std::uint64_t>(host.size() * sizeof(T), sizeof(T));
  STRATA_ASSIGN_OR_RETURN(Buffer buffer, backend.allocate_device(bytes, purpose, 256));
  if (!host.empty()) {
    STRATA_TRY(backend.copy_async(StreamKind::kCompute, buffer.data(), host.data(),
                                  host.size() * sizeof(T)));
  }
  return buffer;
}

// The first host->size() elements of `buffer` into *host.
template <typename T>
Status copy_to_host(Backend& backend, std::vector<T>* host, const Buffer& buffer) {
  return backend.copy_async(StreamKind::kCompute, host->data(), buffer.data(),
                            host->size() * sizeof(T));
}

}  // namespace strata::backend
