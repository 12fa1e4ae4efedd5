// Threads for the CPU kernels: oneTBB arenas of a fixed size. On a machine with more than one
// NUMA node, work on a buffer runs in an arena whose threads are pinned to the CPUs of the node
// that holds the buffer's pages, so the memory-bound kernels (Adam) read local memory; with one
// node (or pages spread over several) it runs in an unpinned arena.
//
// Create one executor at start-up and share it: arenas and their observers are built once, so the
// steady-state path allocates nothing. execute() may be called from several threads at once.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "sys/numa_topology.h"

namespace strata::runtime {

class CpuExecutor {
 public:
  struct Options {
    int threads = 0;               // arena size; 0: every CPU this process may run on
    bool follow_memory = true;     // with more than one NUMA node, run next to the buffer
    bool pin_single_node = false;  // build the pinned arena even on a one-node machine (tests)
  };

  // Loads the topology (hwloc) and builds the arenas. Errors: threads < 0 (kInvalidArgument).
  // A topology hwloc cannot load is not an error: the executor then runs unpinned.
  static Result<std::unique_ptr<CpuExecutor>> create(const Options& options);
  // As create(), with a given topology (tests use hwloc's synthetic topologies).
  static Result<std::unique_ptr<CpuExecutor>> create_with(const Options& options,
                                                          sys::NumaTopology topology);
  ~CpuExecutor();
  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  // Threads of the unpinned arena (the most any execute() uses).
  int threads() const { return threads_; }
  // NUMA nodes of the topology (1 without NUMA).
  int numa_nodes() const;
  // Threads of the arena execute() uses for node `node` (-1: the unpinned arena).
  int threads_for_node(int node) const;
  // The node whose pinned arena execute() picks for [near, near + near_bytes); -1 for the unpinned
  // arena (one node and no pin_single_node, follow_memory off, pages not on one node).
  int node_for(const void* near, std::size_t near_bytes) const;

  // Runs f() in the arena chosen by node_for(near, near_bytes) and waits for it. f may use any
  // oneTBB algorithm: its tasks run on that arena's threads (the caller's thread joins them).
  template <typename F>
  void execute(const void* near, std::size_t near_bytes, F&& f) {
    arena(node_for(near, near_bytes)).execute(std::forward<F>(f));
  }

 private:
  struct NodeArena;
  CpuExecutor() = default;
  tbb::task_arena& arena(int node);

  int threads_ = 1;
  bool follow_memory_ = true;
  std::unique_ptr<sys::NumaTopology> topology_;
  std::unique_ptr<tbb::task_arena> default_arena_;
  std::vector<std::unique_ptr<NodeArena>> node_arenas_;  // empty when nothing is pinned
};

}  // namespace strata::runtime
