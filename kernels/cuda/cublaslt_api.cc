// Run-time loading of cuBLASLt (see cublaslt_api.h).
#include "kernels/cuda/cublaslt_api.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <vector>

namespace strata::cuda {
namespace {

#if !defined(STRATA_CUDA_LIBRARY_DIR)
#define STRATA_CUDA_LIBRARY_DIR "/usr/local/cuda/lib64"
#endif

template <typename Fn>
bool bind(void* library, const char* name, Fn* out, std::string* missing) {
  void* symbol = ::dlsym(library, name);
  if (symbol == nullptr) {
    *missing += missing->empty() ? std::string(name) : fmt::format(", {}", name);
    return false;
  }
  *out = reinterpret_cast<Fn>(symbol);
  return true;
}

Result<CublasLtApi> load() {
  const std::string name = fmt::format("libcublasLt.so.{}", CUDART_VERSION / 1000);
  const std::vector<std::string> candidates = {name,
                                               std::string(STRATA_CUDA_LIBRARY_DIR) + "/" + name};
  std::string tried;
  void* library = nullptr;
  CublasLtApi api;
  for (const std::string& candidate : candidates) {
    library = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) {
      api.path = candidate;
      break;
    }
    const char* why = ::dlerror();
    tried += fmt::format("{}{} ({})", tried.empty() ? "" : "; ", candidate,
                         why != nullptr ? why : "not found");
  }
  if (library == nullptr) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("cannot load cuBLASLt: tried {}; install the CUDA {} math "
                              "libraries or add their directory to LD_LIBRARY_PATH",
                              tried, CUDART_VERSION / 1000),
                  "cuBLASLt");
  }
  std::string missing;
  bool ok = true;
  ok &= bind(library, "cublasLtCreate", &api.create, &missing);
  ok &= bind(library, "cublasLtDestroy", &api.destroy, &missing);
  ok &= bind(library, "cublasLtGetVersion", &api.get_version, &missing);
  ok &= bind(library, "cublasLtMatmul", &api.matmul, &missing);
  ok &= bind(library, "cublasLtMatmulDescCreate", &api.desc_create, &missing);
  ok &= bind(library, "cublasLtMatmulDescDestroy", &api.desc_destroy, &missing);
  ok &= bind(library, "cublasLtMatmulDescSetAttribute", &api.desc_set, &missing);
  ok &= bind(library, "cublasLtMatrixLayoutCreate", &api.layout_create, &missing);
  ok &= bind(library, "cublasLtMatrixLayoutDestroy", &api.layout_destroy, &missing);
  ok &= bind(library, "cublasLtMatmulPreferenceCreate", &api.pref_create, &missing);
  ok &= bind(library, "cublasLtMatmulPreferenceDestroy", &api.pref_destroy, &missing);
  ok &= bind(library, "cublasLtMatmulPreferenceSetAttribute", &api.pref_set, &missing);
  ok &= bind(library, "cublasLtMatmulAlgoGetHeuristic", &api.heuristic, &missing);
  if (!ok) {
    // The library stays loaded: unloading libraries that started threads is unsafe.
    return Status(ErrorCode::kUnavailable, fmt::format("{} lacks {}", api.path, missing),
                  "cuBLASLt");
  }
  return api;
}

}  // namespace

Result<const CublasLtApi*> load_cublaslt() {
  static const Result<CublasLtApi> loaded = load();
  if (!loaded.is_ok()) return loaded.status();
  return &loaded.value();
}

}  // namespace strata::cuda
