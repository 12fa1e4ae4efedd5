// `strata report`: every fact about this machine and this build that decides how Strata will run
// here (what DeepSpeed's ds_report tells, and the memory, NUMA, pinning and I/O facts it does
// not), gathered once and printed as text or JSON.
#pragma once

#include <json/value.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sys/cpu_features.h"
#include "sys/gpu.h"
#include "sys/io_facts.h"
#include "sys/memory.h"
#include "sys/nccl.h"
#include "sys/topology.h"

namespace strata::sys {

struct MachineReport {
  CpuFeatures cpu;
  SimdLevel simd = SimdLevel::kScalar;
  Result<Topology> topology = Status(ErrorCode::kUnavailable, "not probed");
  Result<HostMemory> memory = Status(ErrorCode::kUnavailable, "not probed");
  CudaProbe cuda;
  NcclProbe nccl;
  UringProbe uring;
  std::optional<DirectoryProbe> directory;  // with --path
  // Things the user should act on (a low `ulimit -l`, no O_DIRECT, no io_uring), one sentence
  // each, saying what Strata will do about it.
  std::vector<std::string> warnings;
};

// Probes the machine's own facts and adds the I/O stack's, which the caller probed (io/probe.h,
// a layer above): io_uring, and `directory` (optional) to test for the NVMe tier.
MachineReport collect_report(UringProbe uring, std::optional<DirectoryProbe> directory);

std::string report_text(const MachineReport& report);
Json::Value report_json(const MachineReport& report);

}  // namespace strata::sys
