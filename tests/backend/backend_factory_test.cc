// Backend selection (backend/backend_factory.h): `cpu`, `auto` and `cuda` against what the CUDA
// probe saw, tested with made-up probes; and make_backend on this machine, whatever it has.
#include "backend/backend_factory.h"

#include <gtest/gtest.h>

namespace strata::backend {
namespace {

sys::CudaProbe no_gpu() {
  sys::CudaProbe probe;
  probe.built_with_cuda = true;
  probe.error = "CUDA driver version is insufficient for CUDA runtime version";
  return probe;
}

sys::CudaProbe one_gpu() {
  sys::CudaProbe probe;
  probe.built_with_cuda = true;
  sys::GpuInfo gpu;
  gpu.name = "NVIDIA H100 80GB HBM3";
  gpu.compute_major = 9;
  gpu.memory_bytes = 80ull << 30;
  probe.gpus.push_back(gpu);
  return probe;
}

TEST(ChooseBackend, CpuIsAlwaysTheCpuBackend) {
  auto choice = choose_backend(config::Backend::kCpu, one_gpu());
  ASSERT_TRUE(choice.is_ok());
  EXPECT_FALSE(choice->cuda);
}

TEST(ChooseBackend, AutoWithoutAGpuUsesTheCpuAndSaysWhy) {
  auto choice = choose_backend(config::Backend::kAuto, no_gpu());
  ASSERT_TRUE(choice.is_ok());
  EXPECT_FALSE(choice->cuda);
  EXPECT_NE(choice->note.find("no GPU"), std::string::npos) << choice->note;
  EXPECT_NE(choice->note.find("driver version is insufficient"), std::string::npos) << choice->note;
}

TEST(ChooseBackend, AutoWithAGpuUsesIt) {
  auto choice = choose_backend(config::Backend::kAuto, one_gpu());
  ASSERT_TRUE(choice.is_ok());
  EXPECT_TRUE(choice->cuda);
  EXPECT_NE(choice->note.find("H100"), std::string::npos) << choice->note;
}

TEST(ChooseBackend, CudaWithoutAGpuIsAnErrorNamingTheKeyAndTheReason) {
  auto choice = choose_backend(config::Backend::kCuda, no_gpu());
  ASSERT_FALSE(choice.is_ok());
  EXPECT_EQ(choice.status().code(), ErrorCode::kUnavailable);
  EXPECT_EQ(choice.status().context(), "strata.backend");
  EXPECT_NE(choice.status().message().find("no usable GPU"), std::string::npos);
  EXPECT_NE(choice.status().message().find("driver version"), std::string::npos);
}

TEST(ChooseBackend, CudaInABuildWithoutCudaIsAnError) {
  sys::CudaProbe probe;  // built_with_cuda = false
  auto choice = choose_backend(config::Backend::kCuda, probe, "--backend");
  ASSERT_FALSE(choice.is_ok());
  EXPECT_EQ(choice.status().context(), "--backend");
  EXPECT_NE(choice.status().message().find("built without CUDA"), std::string::npos);
}

TEST(ResolveGemmPrecision, AutoFollowsTheTrainingPrecision) {
  using config::GemmPrecision;
  using config::Precision;
  EXPECT_EQ(resolve_gemm_precision(GemmPrecision::kAuto, Precision::kBf16),
            cuda::GemmPrecision::kBf16);
  EXPECT_EQ(resolve_gemm_precision(GemmPrecision::kAuto, Precision::kFp16),
            cuda::GemmPrecision::kFp16);
  EXPECT_EQ(resolve_gemm_precision(GemmPrecision::kAuto, Precision::kFp32),
            cuda::GemmPrecision::kFp32);
  EXPECT_EQ(resolve_gemm_precision(GemmPrecision::kTf32, Precision::kBf16),
            cuda::GemmPrecision::kTf32);
}

TEST(MakeBackend, CpuMakesTheCpuBackendWithTheGivenBudget) {
  BackendRequest request;
  request.kind = config::Backend::kCpu;
  request.device_bytes_max = 8 << 20;
  request.host_bytes_max = 8 << 20;
  request.cpu_threads = 1;
  auto made = make_backend(request);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  EXPECT_EQ(made->backend->name(), "cpu");
  EXPECT_EQ(made->backend->device_memory().bytes_max, 8u << 20);
}

TEST(MakeBackend, AutoPicksWhatThisMachineHas) {
  BackendRequest request;
  request.device_bytes_max = 64 << 20;
  request.host_bytes_max = 64 << 20;
  request.cpu_threads = 1;
  auto made = make_backend(request);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  const sys::CudaProbe probe = sys::probe_cuda();
  if (probe.gpus.empty()) {
    EXPECT_EQ(made->backend->name(), "cpu");
    EXPECT_NE(made->note.find("no GPU"), std::string::npos) << made->note;
  } else {
    EXPECT_EQ(made->backend->name(), "cuda:0") << made->note;
  }
}

TEST(MakeBackend, CudaWithoutAGpuFailsWithTheReason) {
  if (!sys::probe_cuda().gpus.empty()) GTEST_SKIP() << "this machine has a GPU";
  BackendRequest request;
  request.kind = config::Backend::kCuda;
  auto made = make_backend(request);
  ASSERT_FALSE(made.is_ok());
  EXPECT_EQ(made.status().code(), ErrorCode::kUnavailable);
  EXPECT_EQ(made.status().context(), "strata.backend");
}

}  // namespace
}  // namespace strata::backend
