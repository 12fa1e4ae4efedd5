// The machine's processing and memory layout from hwloc: cores, hardware threads, NUMA nodes and
// which I/O devices (GPUs, NVMe and other block devices) sit nearest to which node. Used by
// `strata report` and, later, to keep CPU Adam threads and I/O buffers on the right node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::sys {

struct NumaNode {
  int os_index = 0;
  std::uint64_t memory_bytes = 0;  // local memory of this node
  int cores = 0;                   // physical cores whose memory is local to this node
  std::string cpus;                // OS cpu list, e.g. "0-15,32-47"
};

struct IoDevice {
  std::string kind;        // "gpu", "nvme", "block"
  std::string name;        // OS name (nvme0n1, sda, card0) or PCI description
  std::string pci_bus_id;  // "0000:3b:00.0"; "" when not on PCI
  int numa_node = -1;      // nearest NUMA node's OS index; -1 when unknown
};

struct Topology {
  int packages = 0;
  int cores = 0;
  int hardware_threads = 0;
  std::vector<NumaNode> numa_nodes;
  std::vector<IoDevice> io_devices;
};

// Loads the topology of this machine with I/O devices. Errors are kUnavailable with hwloc's
// reason.
Result<Topology> probe_topology();

}  // namespace strata::sys
