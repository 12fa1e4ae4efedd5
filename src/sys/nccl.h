// Whether NCCL can be loaded here, and its version. NCCL is opened at run time (dlopen) so that
// `strata` starts on machines without it; multi-GPU runs need it, single-GPU and CPU runs do not.
#pragma once

#include <string>

namespace strata::sys {

struct NcclProbe {
  bool available = false;
  std::string version;  // "2.27.7"
  std::string library;  // the file that was loaded
  std::string error;    // why not, when !available
};

// dlopens libnccl.so.2 and calls ncclGetVersion.
NcclProbe probe_nccl();

}  // namespace strata::sys
