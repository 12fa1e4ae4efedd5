// The CUDA backend's fast paths by name (backend/fast_path.h), for what lists them without making
// the backend: `strata report` on a machine without a GPU or a build without CUDA. CUDA-free.
#pragma once

#include <string>
#include <vector>

#include "backend/fast_path.h"

namespace strata::backend {

// Every fast path the CUDA backend checks at its start, each off and "not checked" with `why`,
// with what it replaces. The emulated CUDA backend's test holds the list to the backend's own.
std::vector<FastPath> cuda_fast_paths_unchecked(const std::string& why);

}  // namespace strata::backend
