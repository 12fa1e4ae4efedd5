// cuBLASLt, loaded at run time with dlopen: `strata` (and every test program) starts on machines
// without libcublasLt, and only a CUDA backend that is actually created needs the library. The
// library's major version must match the CUDA runtime this build links (libcublasLt.so.<major>).
// Search order: the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache), then the toolkit's
// library directory seen at build time.
#pragma once

#include <cublasLt.h>

#include <string>

#include "common/status.h"
#include "kernels/cuda/cuda_namespace.h"

STRATA_CUDA_NAMESPACE(cuda) {

struct CublasLtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  std::string path;  // the file that was loaded
};

// Loads the library once per process (thread-safe); later calls return the same table or the same
// error. kUnavailable naming every place tried when it cannot be loaded or lacks a symbol.
Result<const CublasLtApi*> load_cublaslt();

}  // STRATA_CUDA_NAMESPACE(cuda)
