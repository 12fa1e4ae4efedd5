// What CUDA can see on this machine: runtime and driver versions and the GPUs. The CUDA runtime
// is linked statically, so this works (and says "no GPU") on machines without a driver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::sys {

struct GpuInfo {
  int index = 0;
  std::string name;
  std::uint64_t memory_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  std::string pci_bus_id;  // "0000:3b:00.0", lower case, matching sys::IoDevice
};

struct CudaProbe {
  bool built_with_cuda = false;  // false: this binary was built without the CUDA parts
  int runtime_version = 0;       // e.g. 13000 for 13.0
  int driver_version = 0;        // highest CUDA version the driver supports; 0 = no driver
  std::string error;             // why no GPU is usable ("" when gpus is non-empty)
  std::vector<GpuInfo> gpus;
};

// Asks the CUDA runtime for its version, the driver's and every device's properties.
CudaProbe probe_cuda();

// "13.0" from 13000.
std::string cuda_version_string(int version);

}  // namespace strata::sys
