// Where each rank runs: its GPU, its CPU cores and its NVMe paths, chosen from the machine's layout
// (hwloc) so that a rank's threads, memory and drives sit on the NUMA node nearest its GPU.
//
// Rules (plan_binding):
//   - GPU: local rank i uses CUDA device i (mod the device count); more ranks on a node than GPUs
//     is an error for the CUDA backend (NCCL needs one GPU per rank).
//   - NUMA node: the GPU's node when hwloc knows it; without a GPU, local ranks are spread over the
//     nodes in blocks (ranks 0..k-1 on node 0, ...).
//   - CPUs: the whole cores of that node, split evenly among the local ranks placed on it (a rank
//     gets at least one core; cores are shared when ranks outnumber them).
//   - A process that may already run on fewer CPUs than the machine has (mpirun's default
//     --bind-to core, srun --cpu-bind, taskset, a container's cpuset) keeps that binding: the
//     launcher knows the allocation better than Strata does.
//   - NVMe: of the configured paths, those on drives attached to the rank's node; all of them when
//     none is, or when the node or the drives' locality is unknown.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace strata::comm {

// The parts of the machine's layout binding needs.
struct MachineLayout {
  struct Node {
    int os_index = 0;
    std::vector<std::vector<int>> cores;  // per physical core, the OS indices of its CPUs
  };
  std::vector<Node> nodes;          // NUMA nodes with CPUs (one node on a machine without NUMA)
  int cpu_count = 0;                // CPUs (hardware threads) of the whole machine
  std::vector<int> gpu_numa_nodes;  // per CUDA device index: its node's OS index, -1 unknown
};

// Loads the layout of this machine (hwloc; GPUs from the CUDA runtime when built with CUDA).
Result<MachineLayout> load_machine_layout();

struct BindingRequest {
  int local_rank = 0;
  int local_world_size = 0;             // 0: unknown (then CPUs are not bound)
  bool use_gpu = false;                 // the CUDA backend runs this rank
  std::vector<int> allowed_cpus;        // the CPUs this process may run on now
  std::vector<std::string> nvme_paths;  // configured NVMe paths
  std::vector<int> nvme_numa_nodes;     // per path: its drive's node OS index, -1 unknown
};

struct BindingPlan {
  int gpu = -1;                         // CUDA device index; -1 = none
  int numa_node = -1;                   // OS index of the chosen node; -1 = none chosen
  std::vector<int> cpus;                // CPUs to bind to; empty = keep the current binding
  std::vector<std::string> nvme_paths;  // the paths this rank should use
  std::string summary;                  // one line for logs
};

// Plans the binding. Errors: kConfig when the CUDA backend has more local ranks than GPUs, or no
// GPU at all.
Result<BindingPlan> plan_binding(const MachineLayout& layout, const BindingRequest& request);

// The CPUs this process may run on now (sched_getaffinity).
std::vector<int> current_cpus();

// The NUMA node (OS index) of the drive holding `path`, from sysfs; -1 when unknown (tmpfs,
// overlay, virtual disks, no NUMA).
int numa_node_of_path(const std::string& path);

// Binds every thread of this process to plan.cpus (no-op when empty). Errors: kUnavailable with
// the OS's reason.
Status apply_binding(const BindingPlan& plan);

}  // namespace strata::comm
