// Binding ranks to GPUs, cores and drives (binding.h).
#include "comm/binding.h"

#include <fmt/format.h>
#include <hwloc.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "sys/gpu.h"
#include "sys/topology.h"

namespace strata::comm {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

Result<TopologyPtr> load_hwloc() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    return make_error(ErrorCode::kUnavailable, "hwloc_topology_init failed: {}",
                      std::strerror(errno));
  }
  TopologyPtr topology(raw);
  // Every CPU of the machine, not only those this process may use now.
  hwloc_topology_set_flags(raw, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  if (hwloc_topology_load(raw) != 0) {
    return make_error(ErrorCode::kUnavailable, "hwloc_topology_load failed: {}",
                      std::strerror(errno));
  }
  return topology;
}

std::vector<int> bitmap_members(hwloc_const_bitmap_t set) {
  std::vector<int> members;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i))
    members.push_back(i);
  return members;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1)
      ++j;
    text += text.empty() ? "" : ",";
    text += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace

Result<MachineLayout> load_machine_layout() {
  STRATA_ASSIGN_OR_RETURN(TopologyPtr topology, load_hwloc());
  hwloc_topology_t t = topology.get();
  MachineLayout layout;
  layout.cpu_count = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  const int node_count = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < std::max(node_count, 1); ++i) {
    hwloc_obj_t node = node_count > 0
                           ? hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i))
                           : nullptr;
    hwloc_const_cpuset_t set =
        node != nullptr ? node->cpuset : hwloc_topology_get_topology_cpuset(t);
    if (set == nullptr || hwloc_bitmap_iszero(set)) continue;
    MachineLayout::Node n;
    n.os_index = node != nullptr ? static_cast<int>(node->os_index) : 0;
    const int cores = hwloc_get_nbobjs_inside_cpuset_by_type(t, set, HWLOC_OBJ_CORE);
    for (int c = 0; c < cores; ++c) {
      hwloc_obj_t core =
          hwloc_get_obj_inside_cpuset_by_type(t, set, HWLOC_OBJ_CORE, static_cast<unsigned>(c));
      if (core != nullptr && core->cpuset != nullptr)
        n.cores.push_back(bitmap_members(core->cpuset));
    }
    if (n.cores.empty()) {  // no core objects: one "core" per CPU
      for (int cpu : bitmap_members(set))
        n.cores.push_back({cpu});
    }
    layout.nodes.push_back(std::move(n));
  }
  const sys::CudaProbe cuda = sys::probe_cuda();
  if (!cuda.gpus.empty()) {
    Result<sys::Topology> io = sys::probe_topology();
    for (const sys::GpuInfo& gpu : cuda.gpus) {
      int numa = -1;
      if (io.is_ok()) {
        for (const sys::IoDevice& d : io->io_devices) {
          if (d.kind == "gpu" && d.pci_bus_id == gpu.pci_bus_id) numa = d.numa_node;
        }
      }
      layout.gpu_numa_nodes.push_back(numa);
    }
  }
  return layout;
}

Result<BindingPlan> plan_binding(const MachineLayout& layout, const BindingRequest& request) {
  BindingPlan plan;
  std::vector<std::string> notes;
  const int gpus = static_cast<int>(layout.gpu_numa_nodes.size());
  if (request.use_gpu) {
    if (gpus == 0) {
      return Status(ErrorCode::kConfig, "the CUDA backend needs a GPU and none is visible",
                    "binding");
    }
    if (request.local_world_size > gpus) {
      return Status(ErrorCode::kConfig,
                    fmt::format("{} ranks run on this node but it has {} GPU{}; NCCL needs one "
                                "GPU per rank (start at most {} ranks per node, or set "
                                "CUDA_VISIBLE_DEVICES)",
                                request.local_world_size, gpus, gpus == 1 ? "" : "s", gpus),
                    "binding");
    }
    plan.gpu = request.local_rank % gpus;
    plan.numa_node = layout.gpu_numa_nodes[static_cast<std::size_t>(plan.gpu)];
    notes.push_back(fmt::format("GPU {}", plan.gpu));
  }

  // Which node, and which ranks share it.
  const int node_count = static_cast<int>(layout.nodes.size());
  const int local_world = request.local_world_size;
  int node_index = -1;
  if (plan.numa_node >= 0) {
    for (int i = 0; i < node_count; ++i) {
      if (layout.nodes[static_cast<std::size_t>(i)].os_index == plan.numa_node) node_index = i;
    }
  }
  auto node_of_rank = [&](int local_rank) {
    if (request.use_gpu) {
      const int numa = layout.gpu_numa_nodes[static_cast<std::size_t>(local_rank % gpus)];
      for (int i = 0; i < node_count; ++i) {
        if (layout.nodes[static_cast<std::size_t>(i)].os_index == numa) return i;
      }
      return -1;
    }
    return static_cast<int>(static_cast<long long>(local_rank) * node_count / local_world);
  };

  const bool restricted = !request.allowed_cpus.empty() &&
                          static_cast<int>(request.allowed_cpus.size()) < layout.cpu_count;
  if (restricted) {
    notes.push_back(
        fmt::format("kept the launcher's binding to CPUs {}", cpu_list_text(request.allowed_cpus)));
  } else if (local_world <= 0) {
    notes.push_back("CPUs not bound (the launcher does not say how many ranks share this node)");
  } else if (node_count > 0 && !request.use_gpu && local_world < node_count) {
    // Fewer ranks than nodes (CPU backend): each rank gets whole nodes of its own.
    const int begin =
        static_cast<int>(static_cast<long long>(request.local_rank) * node_count / local_world);
    const int end =
        static_cast<int>(static_cast<long long>(request.local_rank + 1) * node_count / local_world);
    plan.numa_node = layout.nodes[static_cast<std::size_t>(begin)].os_index;
    for (int i = begin; i < end; ++i) {
      for (const auto& pus : layout.nodes[static_cast<std::size_t>(i)].cores)
        plan.cpus.insert(plan.cpus.end(), pus.begin(), pus.end());
    }
  } else if (node_count > 0) {
    if (node_index < 0) node_index = node_of_rank(request.local_rank);
    if (node_index < 0) node_index = 0;  // the GPU's node is unknown: share the first
    const MachineLayout::Node& node = layout.nodes[static_cast<std::size_t>(node_index)];
    plan.numa_node = node.os_index;
    // The local ranks on this node, and this rank's place among them.
    int sharing = 0;
    int place = 0;
    for (int r = 0; r < local_world; ++r) {
      int n = node_of_rank(r);
      if (n < 0) n = 0;
      if (n != node_index) continue;
      if (r == request.local_rank) place = sharing;
      ++sharing;
    }
    const int cores = static_cast<int>(node.cores.size());
    if (sharing <= cores) {
      const int begin = static_cast<int>(static_cast<long long>(place) * cores / sharing);
      const int end = static_cast<int>(static_cast<long long>(place + 1) * cores / sharing);
      for (int c = begin; c < end; ++c) {
        const auto& pus = node.cores[static_cast<std::size_t>(c)];
        plan.cpus.insert(plan.cpus.end(), pus.begin(), pus.end());
      }
    } else {
      const auto& pus = node.cores[static_cast<std::size_t>(place % cores)];
      plan.cpus.assign(pus.begin(), pus.end());
      notes.push_back(fmt::format("{} ranks share {} cores", sharing, cores));
    }
  }
  if (!plan.cpus.empty()) {
    std::sort(plan.cpus.begin(), plan.cpus.end());
    if (static_cast<int>(plan.cpus.size()) >= layout.cpu_count) {
      plan.cpus.clear();  // the whole machine: nothing to restrict
      notes.push_back("the whole machine (CPUs not restricted)");
    } else {
      notes.push_back(
          fmt::format("NUMA node {}, CPUs {}", plan.numa_node, cpu_list_text(plan.cpus)));
    }
  }

  // NVMe paths next to the chosen node.
  if (!request.nvme_paths.empty()) {
    for (std::size_t i = 0; i < request.nvme_paths.size(); ++i) {
      const int numa = i < request.nvme_numa_nodes.size() ? request.nvme_numa_nodes[i] : -1;
      if (plan.numa_node >= 0 && numa == plan.numa_node)
        plan.nvme_paths.push_back(request.nvme_paths[i]);
    }
    if (plan.nvme_paths.empty()) {
      plan.nvme_paths = request.nvme_paths;
    } else {
      notes.push_back(fmt::format("{} of {} NVMe paths on this node", plan.nvme_paths.size(),
                                  request.nvme_paths.size()));
    }
  }
  for (const std::string& note : notes) {
    plan.summary += (plan.summary.empty() ? "" : "; ") + note;
  }
  if (plan.summary.empty()) plan.summary = "nothing to bind";
  return plan;
}

std::vector<int> current_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

int numa_node_of_path(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  const std::string link = fmt::format("/sys/dev/block/{}:{}", major(st.st_dev), minor(st.st_dev));
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::canonical(link, ec);
  if (ec) return -1;
  // Walk up from the block device (or partition) to the first ancestor with a numa_node: the PCI
  // function of the drive's controller.
  for (; !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    std::ifstream in(dir / "numa_node");
    int node = -1;
    if (in >> node) return node;
  }
  return -1;
}

Status apply_binding(const BindingPlan& plan) {
  if (plan.cpus.empty()) return Status::ok();
  STRATA_ASSIGN_OR_RETURN(TopologyPtr topology, load_hwloc());
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int cpu : plan.cpus)
    hwloc_bitmap_set(set, static_cast<unsigned>(cpu));
  const int rc = hwloc_set_cpubind(topology.get(), set, HWLOC_CPUBIND_PROCESS);
  const int error = errno;
  hwloc_bitmap_free(set);
  if (rc != 0) {
    return Status(
        ErrorCode::kUnavailable,
        fmt::format("cannot bind to CPUs {}: {}", cpu_list_text(plan.cpus), std::strerror(error)),
        "binding");
  }
  return Status::ok();
}

}  // namespace strata::comm
