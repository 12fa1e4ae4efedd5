// Run-time loading of cuBLASLt (see cublaslt_api.h).
#include "kernels/cuda/cublaslt_api.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <vector>

#include "kernels/cuda/dl_library.h"

STRATA_CUDA_NAMESPACE(cuda) {
namespace {

#if !defined(STRATA_CUDA_LIBRARY_DIR)
#define STRATA_CUDA_LIBRARY_DIR "/usr/local/cuda/lib64"
#endif

Result<CublasLtApi> load() {
  const std::string name = fmt::format("libcublasLt.so.{}", CUDART_VERSION / 1000);
  const std::vector<std::string> candidates = {name,
                                               std::string(STRATA_CUDA_LIBRARY_DIR) + "/" + name};
  std::string tried;
  CublasLtApi api;
  void* library = open_first_library(candidates, &api.path, &tried);
  if (library == nullptr) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("cannot load cuBLASLt: tried {}; install the CUDA {} math "
                              "libraries or add their directory to LD_LIBRARY_PATH",
                              tried, CUDART_VERSION / 1000),
                  "cuBLASLt");
  }
  std::string missing;
  bool ok = true;
  ok &= bind_symbol(library, "cublasLtCreate", &api.create, &missing);
  ok &= bind_symbol(library, "cublasLtDestroy", &api.destroy, &missing);
  ok &= bind_symbol(library, "cublasLtGetVersion", &api.get_version, &missing);
  ok &= bind_symbol(library, "cublasLtMatmul", &api.matmul, &missing);
  ok &= bind_symbol(library, "cublasLtMatmulDescCreate", &api.desc_create, &missing);
  ok &= bind_symbol(library, "cublasLtMatmulDescDestroy", &api.desc_destroy, &missing);
  ok &= bind_symbol(library, "cublasLtMatmulDescSetAttribute", &api.desc_set, &missing);
  ok &= bind_symbol(library, "cublasLtMatrixLayoutCreate", &api.layout_create, &missing);
  ok &= bind_symbol(library, "cublasLtMatrixLayoutDestroy", &api.layout_destroy, &missing);
  ok &= bind_symbol(library, "cublasLtMatmulPreferenceCreate", &api.pref_create, &missing);
  ok &= bind_symbol(library, "cublasLtMatmulPreferenceDestroy", &api.pref_destroy, &missing);
  ok &= bind_symbol(library, "cublasLtMatmulPreferenceSetAttribute", &api.pref_set, &missing);
  ok &= bind_symbol(library, "cublasLtMatmulAlgoGetHeuristic", &api.heuristic, &missing);
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

}  // STRATA_CUDA_NAMESPACE(cuda)
