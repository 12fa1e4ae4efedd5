// Opening a shared library at run time (dlopen) from a list of candidates, and binding its
// symbols: what cuBLASLt (cublaslt_api.cc) and cuDNN (cudnn_api.cc) share, so that `strata` and
// every test program start on machines without either library.
#pragma once

#include <dlfcn.h>
#include <fmt/format.h>

#include <string>
#include <vector>
#include "kernels/cuda/cuda_namespace.h"

STRATA_CUDA_NAMESPACE(cuda) {

// The first of `candidates` (a file name for the loader's search path, or a full path) that
// dlopen accepts, or null; `tried` lists every one refused with the loader's reason.
inline void* open_first_library(const std::vector<std::string>& candidates, std::string* loaded,
                                std::string* tried) {
  for (const std::string& candidate : candidates) {
    if (candidate.empty()) continue;
    void* library = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      *loaded = candidate;
      return library;
    }
    const char* why = ::dlerror();
    *tried += fmt::format("{}{} ({})", tried->empty() ? "" : "; ", candidate,
                          why != nullptr ? why : "not found");
  }
  return nullptr;
}

// Binds `name` into `out`; a missing symbol is appended to `missing` ("a, b").
template <typename Fn>
bool bind_symbol(void* library, const char* name, Fn* out, std::string* missing) {
  void* symbol = ::dlsym(library, name);
  if (symbol == nullptr) {
    *missing += missing->empty() ? std::string(name) : fmt::format(", {}", name);
    return false;
  }
  *out = reinterpret_cast<Fn>(symbol);
  return true;
}

}  // STRATA_CUDA_NAMESPACE(cuda)
