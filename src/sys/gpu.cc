#include "sys/gpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#if defined(STRATA_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace strata::sys {

std::string cuda_version_string(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

#if defined(STRATA_HAVE_CUDA)

CudaProbe probe_cuda() {
  CudaProbe probe;
  probe.built_with_cuda = true;
  cudaRuntimeGetVersion(&probe.runtime_version);
  if (cudaDriverGetVersion(&probe.driver_version) != cudaSuccess) probe.driver_version = 0;
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    probe.error = fmt::format("{} ({})", cudaGetErrorString(rc), cudaGetErrorName(rc));
    cudaGetLastError();  // clear the sticky error so later CUDA calls start clean
    return probe;
  }
  if (count == 0) {
    probe.error = "the CUDA runtime found no device";
    return probe;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuInfo gpu;
    gpu.index = i;
    gpu.name = prop.name;
    gpu.memory_bytes = prop.totalGlobalMem;
    gpu.compute_major = prop.major;
    gpu.compute_minor = prop.minor;
    gpu.multiprocessors = prop.multiProcessorCount;
    gpu.pci_bus_id =
        fmt::format("{:04x}:{:02x}:{:02x}.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
    probe.gpus.push_back(std::move(gpu));
  }
  return probe;
}

#else

CudaProbe probe_cuda() {
  CudaProbe probe;
  probe.error = "this strata was built without CUDA (STRATA_CUDA=OFF or no nvcc at build time)";
  return probe;
}

#endif

}  // namespace strata::sys
