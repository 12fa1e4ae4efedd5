// A small single-threaded CPU backend for the tests of the fast paths' start-up checks
// (backend/attention_check.h, gemm_check.h, norm_check.h), which run on a backend's memory.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "backend/cpu/cpu_backend.h"

namespace strata::testing {

inline std::unique_ptr<backend::Backend> small_cpu_backend(std::uint64_t device_bytes) {
  backend::CpuBackendOptions options;
  options.device_bytes_max = device_bytes;
  options.threads = 1;
  auto made = backend::make_cpu_backend(options);
  EXPECT_TRUE(made.is_ok()) << made.status().to_string();
  return std::move(made).value();
}

}  // namespace strata::testing
