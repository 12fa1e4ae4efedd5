// The machine's NUMA layout as hwloc sees it: how many memory nodes, which CPUs belong to each,
// and which node holds a given buffer's pages. Used by CpuExecutor to keep the memory-bound
// kernels' threads next to their data.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::sys {

class NumaTopology {
 public:
  // The topology of this machine, restricted to the CPUs this process may run on.
  static Result<NumaTopology> load_this_machine();
  // A made-up topology in hwloc's synthetic syntax (e.g. "node:2 core:4 pu:1"), for tests of the
  // placement logic on machines with a single node. node_of_memory() returns -1 for it.
  static Result<NumaTopology> load_synthetic(const std::string& description);

  NumaTopology(NumaTopology&& other) noexcept;
  NumaTopology& operator=(NumaTopology&& other) noexcept;
  ~NumaTopology();

  // NUMA nodes with at least one usable CPU; at least 1 (a machine without NUMA is one node).
  int node_count() const { return static_cast<int>(node_cpus_.size()); }
  // OS indices of the CPUs of node `node` (0 <= node < node_count()), ascending.
  const std::vector<int>& node_cpus(int node) const;
  // The node index (0-based, as node_cpus) whose memory holds the first, middle and last page of
  // [ptr, ptr + bytes); -1 when they lie on different nodes, are not placed yet (never touched),
  // or the operating system cannot tell.
  int node_of_memory(const void* ptr, std::size_t bytes) const;

 private:
  struct Impl;
  explicit NumaTopology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::vector<std::vector<int>> node_cpus_;
  std::vector<unsigned> node_os_index_;  // hwloc's OS index of each node, parallel to node_cpus_
  bool synthetic_ = false;
};

}  // namespace strata::sys
