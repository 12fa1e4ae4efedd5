// Loading NCCL at run time (nccl_api.h).
#include "comm/nccl_api.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>

#include <mutex>

// With NCCL's header at hand (CUDA builds where it is installed), check the declarations above
// against it; nothing from it is called directly.
#if defined(STRATA_HAVE_CUDA) && __has_include(<nccl.h>)
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == sizeof(strata::comm::nccl::UniqueId));
static_assert(sizeof(ncclResult_t) == sizeof(int) && sizeof(ncclDataType_t) == sizeof(int) &&
              sizeof(ncclRedOp_t) == sizeof(int));
static_assert(ncclSuccess == strata::comm::nccl::kSuccess);
static_assert(ncclInProgress == strata::comm::nccl::kInProgress);
static_assert(ncclUint8 == strata::comm::nccl::kUint8 && ncclInt32 == strata::comm::nccl::kInt32 &&
              ncclInt64 == strata::comm::nccl::kInt64 &&
              ncclFloat16 == strata::comm::nccl::kFloat16 &&
              ncclFloat32 == strata::comm::nccl::kFloat32 &&
              ncclFloat64 == strata::comm::nccl::kFloat64 &&
              ncclBfloat16 == strata::comm::nccl::kBfloat16);
static_assert(ncclSum == strata::comm::nccl::kSum && ncclMax == strata::comm::nccl::kMax);
#endif

namespace strata::comm::nccl {
namespace {

template <typename F>
bool resolve(void* handle, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(::dlsym(handle, name));
  if (*out == nullptr) {
    *missing += fmt::format("{}{}", missing->empty() ? "" : ", ", name);
    return false;
  }
  return true;
}

}  // namespace

strata::Result<const Api*> load_api() {
  static std::once_flag once;
  static Api api;
  static Status error;
  std::call_once(once, [] {
    void* handle = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      error = Status(ErrorCode::kUnavailable,
                     fmt::format("cannot load NCCL: {}; install NCCL (libnccl2) for multi-GPU "
                                 "runs",
                                 why != nullptr ? why : "dlopen(libnccl.so.2) failed"),
                     "nccl");
      return;
    }
    std::string missing;
    resolve(handle, "ncclGetVersion", &api.get_version, &missing);
    resolve(handle, "ncclGetUniqueId", &api.get_unique_id, &missing);
    resolve(handle, "ncclCommInitRank", &api.comm_init_rank, &missing);
    resolve(handle, "ncclCommDestroy", &api.comm_destroy, &missing);
    resolve(handle, "ncclCommAbort", &api.comm_abort, &missing);
    resolve(handle, "ncclCommGetAsyncError", &api.comm_get_async_error, &missing);
    resolve(handle, "ncclGetErrorString", &api.get_error_string, &missing);
    resolve(handle, "ncclAllGather", &api.all_gather, &missing);
    resolve(handle, "ncclReduceScatter", &api.reduce_scatter, &missing);
    resolve(handle, "ncclAllReduce", &api.all_reduce, &missing);
    resolve(handle, "ncclBroadcast", &api.broadcast, &missing);
    if (!missing.empty()) {
      error = Status(ErrorCode::kUnavailable,
                     fmt::format("libnccl.so.2 lacks {}; Strata needs NCCL 2.12 or newer", missing),
                     "nccl");
      return;
    }
    if (api.get_version(&api.version) != kSuccess) {
      error = Status(ErrorCode::kUnavailable, "ncclGetVersion failed", "nccl");
      return;
    }
    struct link_map* map = nullptr;
    if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
      api.library = map->l_name;
    }
  });
  if (!error.is_ok()) return error;
  return &api;
}

std::string error_text(const Api& api, Result result) {
  const char* text = api.get_error_string != nullptr ? api.get_error_string(result) : nullptr;
  return fmt::format("NCCL error {}: {}", result, text != nullptr ? text : "unknown");
}

}  // namespace strata::comm::nccl
