// An emulated kernel launch's result (the SIMT emulator's launcher returns 0 once the kernel ran)
// as a Status, for the fast paths' start-up checks run on the emulated kernels
// (tests/backend/*_check_emulated_test.cc).
#pragma once

#include <string>

#include "common/status.h"

namespace strata::testing {

inline Status emulated_launched(int rc, const char* what) {
  if (rc == 0) return Status::ok();
  return Status(ErrorCode::kInternal, std::string(what) + ": the emulated launch failed");
}

}  // namespace strata::testing
