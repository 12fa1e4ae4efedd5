// Elapsed time for measurements and per-step accounting (steady clock, never wall time).
#pragma once

#include <chrono>

namespace strata {

// Milliseconds from `start` to now.
inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace strata
