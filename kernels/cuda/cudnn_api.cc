// Run-time loading of cuDNN (see cudnn_api.h).
#include "kernels/cuda/cudnn_api.h"

#include <fmt/format.h>

#include <vector>

#include "kernels/cuda/dl_library.h"

STRATA_CUDA_NAMESPACE(cuda) {
namespace {

#if !defined(STRATA_CUDNN_LIBRARY_DIR)
#define STRATA_CUDNN_LIBRARY_DIR ""
#endif

Result<CudnnApi> load() {
  const std::string name = "libcudnn.so.9";
  const std::string built_dir = STRATA_CUDNN_LIBRARY_DIR;
  const std::vector<std::string> candidates = {name,
                                               built_dir.empty() ? "" : built_dir + "/" + name};
  std::string tried;
  CudnnApi api;
  void* library = open_first_library(candidates, &api.path, &tried);
  if (library == nullptr) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("cannot load cuDNN: tried {}; install cuDNN 9 (or PyTorch's "
                              "nvidia-cudnn wheel) and add its lib directory to LD_LIBRARY_PATH",
                              tried),
                  "cuDNN");
  }
  std::string missing;
  bool ok = true;
  ok &= bind_symbol(library, "cudnnGetVersion", &api.get_version, &missing);
  ok &= bind_symbol(library, "cudnnGetErrorString", &api.error_string, &missing);
  ok &= bind_symbol(library, "cudnnGetLastErrorString", &api.last_error, &missing);
  ok &= bind_symbol(library, "cudnnCreate", &api.create, &missing);
  ok &= bind_symbol(library, "cudnnDestroy", &api.destroy, &missing);
  ok &= bind_symbol(library, "cudnnSetStream", &api.set_stream, &missing);
  ok &= bind_symbol(library, "cudnnBackendCreateDescriptor", &api.create_descriptor, &missing);
  ok &= bind_symbol(library, "cudnnBackendDestroyDescriptor", &api.destroy_descriptor, &missing);
  ok &= bind_symbol(library, "cudnnBackendSetAttribute", &api.set_attribute, &missing);
  ok &= bind_symbol(library, "cudnnBackendGetAttribute", &api.get_attribute, &missing);
  ok &= bind_symbol(library, "cudnnBackendFinalize", &api.finalize, &missing);
  ok &= bind_symbol(library, "cudnnBackendExecute", &api.execute, &missing);
  if (!ok) {
    // The library stays loaded: unloading libraries that started threads is unsafe.
    return Status(ErrorCode::kUnavailable, fmt::format("{} lacks {}", api.path, missing), "cuDNN");
  }
  api.version = api.get_version();
  if (api.version < kCudnnMinVersion) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{} is cuDNN {}.{}.{}; the attention needs 9.0 or later", api.path,
                              api.version / 10000, api.version / 100 % 100, api.version % 100),
                  "cuDNN");
  }
  return api;
}

}  // namespace

std::string CudnnApi::describe(cudnnStatus_t status) const {
  char message[512] = {};
  if (last_error != nullptr) last_error(message, sizeof(message));
  const char* name = error_string != nullptr ? error_string(status) : nullptr;
  std::string text =
      name != nullptr ? name : fmt::format("cuDNN status {}", static_cast<int>(status));
  if (message[0] != '\0') text += fmt::format(": {}", message);
  return text;
}

Result<const CudnnApi*> load_cudnn() {
  static const Result<CudnnApi> loaded = load();
  if (!loaded.is_ok()) return loaded.status();
  return &loaded.value();
}

}  // STRATA_CUDA_NAMESPACE(cuda)
