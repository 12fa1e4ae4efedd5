#include "sys/nccl.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>

namespace strata::sys {

NcclProbe probe_nccl() {
  NcclProbe probe;
  void* handle = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    probe.error = why != nullptr ? why : "dlopen(libnccl.so.2) failed";
    return probe;
  }
  using GetVersion = int (*)(int*);
  auto get_version = reinterpret_cast<GetVersion>(::dlsym(handle, "ncclGetVersion"));
  int code = 0;
  if (get_version == nullptr || get_version(&code) != 0) {
    probe.error = "libnccl.so.2 has no working ncclGetVersion";
    ::dlclose(handle);
    return probe;
  }
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older releases major*1000 + minor*100.
  if (code >= 10000) {
    probe.version = fmt::format("{}.{}.{}", code / 10000, (code % 10000) / 100, code % 100);
  } else {
    probe.version = fmt::format("{}.{}.{}", code / 1000, (code % 1000) / 100, code % 100);
  }
  struct link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    probe.library = map->l_name;
  }
  probe.available = true;
  ::dlclose(handle);
  return probe;
}

}  // namespace strata::sys
