// cuDNN's backend (graph) API, loaded at run time with dlopen as cuBLASLt is (cublaslt_api.h):
// `strata` starts on machines without libcudnn, and only a CUDA backend that adopts the cuDNN
// attention (cudnn_sdpa.h) needs it. Built when cuDNN 9's headers were found at configure time
// (STRATA_HAVE_CUDNN; CMake looks in CUDNN_ROOT, the toolkit, the system and the PyTorch wheels of
// tools/py_venv.sh). Search order: libcudnn.so.9 on the dynamic loader's path (LD_LIBRARY_PATH,
// ld.so.cache), then the directory the library was found in at build time.
#pragma once

#include <cudnn_graph.h>

#include <string>

#include "common/status.h"
#include "kernels/cuda/cuda_namespace.h"

STRATA_CUDA_NAMESPACE(cuda) {

struct CudnnApi {
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnGetLastErrorString) last_error = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) set_attribute = nullptr;
  decltype(&cudnnBackendGetAttribute) get_attribute = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  decltype(&cudnnBackendExecute) execute = nullptr;
  std::string path;         // the file that was loaded
  std::size_t version = 0;  // cudnnGetVersion(): 9xyyy for 9.x.yy

  // "CUDNN_STATUS_...: <cuDNN's last error message>" for a failed call.
  std::string describe(cudnnStatus_t status) const;
};

// The oldest libcudnn the attention accepts: 9.0 (the backend API without the deprecated
// attributes' removal; the fused attention's composite graph).
inline constexpr std::size_t kCudnnMinVersion = 90000;

// Loads the library once per process (thread-safe); later calls return the same table or the same
// error: kUnavailable naming every place tried, a missing symbol, or a version older than 9.0.
Result<const CudnnApi*> load_cudnn();

}  // STRATA_CUDA_NAMESPACE(cuda)
