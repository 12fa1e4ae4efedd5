// Support for the `gpu` tests (*_gputest.cc): a CUDA backend, or a skip that says why there is
// none; a CPU backend to compute the reference on; moving test data to and from device memory;
// and element-wise comparison with per-dtype tolerances that fails on NaN.
//
// A test skips ONLY when the CUDA backend reports kUnavailable (no GPU, no driver, built without
// CUDA, no cuBLASLt). Any other failure to create it fails the test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"

namespace strata::testing {

struct GpuBackend {
  std::unique_ptr<backend::Backend> backend;
  std::string skip_reason;  // set when there is no GPU to test on
};

// A CUDA backend with a small budget (tests share the GPU), or the reason there is none.
inline GpuBackend make_gpu_backend(backend::CudaBackendOptions options = {}) {
  if (options.device_bytes_max == 0) options.device_bytes_max = 1ull << 30;
  if (options.host_bytes_max == 0) options.host_bytes_max = 256ull << 20;
  GpuBackend made;
  auto cuda = backend::make_cuda_backend(options);
  if (cuda.is_ok()) {
    made.backend = std::move(cuda).value();
  } else if (cuda.status().code() == ErrorCode::kUnavailable) {
    made.skip_reason = cuda.status().message();
  } else {
    ADD_FAILURE() << "the CUDA backend failed to start: " << cuda.status().to_string();
    made.skip_reason = "(failed, see above)";
  }
  return made;
}

// Declares `name` (a Backend&) bound to a CUDA backend made with `options`, or skips the test:
// GTEST_SKIP() << "no GPU: <why>".
#define STRATA_GPU_OR_SKIP(name, options)                          \
  auto name##_made = ::strata::testing::make_gpu_backend(options); \
  if (!name##_made.backend) {                                      \
    GTEST_SKIP() << "no GPU: " << name##_made.skip_reason;         \
  }                                                                \
  ::strata::backend::Backend& name = *name##_made.backend

// The CPU backend the references run on.
inline std::unique_ptr<backend::Backend> make_reference_backend() {
  backend::CpuBackendOptions options;
  options.device_bytes_max = 1ull << 30;
  options.host_bytes_max = 256ull << 20;
  options.threads = 2;
  auto cpu = backend::make_cpu_backend(options);
  EXPECT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  return std::move(cpu).value();
}

// Seeded uniform values in [lo, hi).
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v)
    x = dist(rng);
  return v;
}

// Device memory of `backend` holding a copy of `values` (complete on return).
template <typename T>
backend::Buffer to_device(backend::Backend& backend, const std::vector<T>& values) {
  auto buffer = backend.allocate_device(std::max<std::size_t>(values.size(), 1) * sizeof(T),
                                        "test data", 256);
  EXPECT_TRUE(buffer.is_ok()) << buffer.status().to_string();
  if (!buffer.is_ok()) return {};
  if (!values.empty()) {
    const Status copied = backend.copy_async(backend::StreamKind::kCompute, buffer->data(),
                                             values.data(), values.size() * sizeof(T));
    EXPECT_TRUE(copied.is_ok()) << copied.to_string();
  }
  return std::move(buffer).value();
}

// n elements of device memory at `device`, after all compute-stream work before this call.
template <typename T>
std::vector<T> to_host(backend::Backend& backend, const void* device, std::size_t n) {
  std::vector<T> values(n);
  const Status synced = backend.synchronize(backend::StreamKind::kCompute);
  EXPECT_TRUE(synced.is_ok()) << synced.to_string();
  if (n > 0 && synced.is_ok()) {
    const Status copied =
        backend.copy_async(backend::StreamKind::kCompute, values.data(), device, n * sizeof(T));
    EXPECT_TRUE(copied.is_ok()) << copied.to_string();
  }
  return values;
}

template <typename T>
std::vector<T> to_host(backend::Backend& backend, const backend::Buffer& buffer) {
  return to_host<T>(backend, buffer.data(), buffer.bytes() / sizeof(T));
}

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
};
// Per-dtype tolerances for fp32 kernels against the CPU's fp32 kernels: the same operations in a
// different order (tree reductions, fused multiply-adds, libm versus CUDA's math functions).
inline constexpr Tolerance kFp32Elementwise{1e-6, 1e-5};
inline constexpr Tolerance kFp32Reduction{1e-5, 1e-4};

// |got - want| <= atol + rtol * |want| for every element; NaN in `got` (or where `want` is not
// NaN) fails. Reports the first three failures and returns the largest error.
template <typename G, typename W>
double expect_all_close(const std::string& what, const std::vector<G>& got,
                        const std::vector<W>& want, Tolerance tol) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double g = static_cast<double>(got[i]);
    const double w = static_cast<double>(want[i]);
    const double error = std::abs(g - w);
    const bool bad =
        std::isnan(g) || std::isnan(w) || !(error <= tol.atol + tol.rtol * std::abs(w));
    if (bad && ++failures <= 3) {
      ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << w << " (error " << error
                    << ", allowed " << tol.atol + tol.rtol * std::abs(w) << ")";
    }
    if (!std::isnan(error)) worst = std::max(worst, error);
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << want.size()
                         << " elements outside atol " << tol.atol << " + rtol " << tol.rtol;
  return worst;
}

// Bit-for-bit equality of two arrays (NaN payloads included).
template <typename T>
void expect_bitwise_equal(const std::string& what, const std::vector<T>& got,
                          const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && ++failures <= 3) {
      ADD_FAILURE() << what << "[" << i << "]: got " << static_cast<double>(got[i]) << ", want "
                    << static_cast<double>(want[i]) << " (bits differ)";
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << got.size() << " differ";
}

}  // namespace strata::testing
