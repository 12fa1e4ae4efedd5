#include "sys/numa_topology.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace strata::sys {

struct NumaTopology::Impl {
  hwloc_topology_t topology = nullptr;
  ~Impl() {
    if (topology != nullptr) hwloc_topology_destroy(topology);
  }
};

NumaTopology::NumaTopology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NumaTopology::NumaTopology(NumaTopology&& other) noexcept = default;
NumaTopology& NumaTopology::operator=(NumaTopology&& other) noexcept = default;
NumaTopology::~NumaTopology() = default;

namespace {

// Fills the per-node CPU lists from a loaded topology; nodes without usable CPUs are left out
// (memory-only nodes such as CXL expanders cannot host threads).
void collect_nodes(hwloc_topology_t topology, std::vector<std::vector<int>>* node_cpus,
                   std::vector<unsigned>* node_os_index) {
  const int nodes = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < nodes; ++i) {
    hwloc_obj_t node =
        hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    if (node == nullptr || node->cpuset == nullptr) continue;
    std::vector<int> cpus;
    for (int cpu = hwloc_bitmap_first(node->cpuset); cpu >= 0;
         cpu = hwloc_bitmap_next(node->cpuset, cpu)) {
      cpus.push_back(cpu);
    }
    if (cpus.empty()) continue;
    node_cpus->push_back(std::move(cpus));
    node_os_index->push_back(node->os_index);
  }
  if (node_cpus->empty()) {  // no NUMA information: one node with every usable CPU
    hwloc_const_cpuset_t all = hwloc_topology_get_allowed_cpuset(topology);
    std::vector<int> cpus;
    for (int cpu = hwloc_bitmap_first(all); cpu >= 0; cpu = hwloc_bitmap_next(all, cpu)) {
      cpus.push_back(cpu);
    }
    if (cpus.empty()) cpus.push_back(0);
    node_cpus->push_back(std::move(cpus));
    node_os_index->push_back(0);
  }
}

}  // namespace

Result<NumaTopology> NumaTopology::load_this_machine() {
  auto impl = std::make_unique<Impl>();
  if (hwloc_topology_init(&impl->topology) != 0) {
    impl->topology = nullptr;
    return make_error(ErrorCode::kUnavailable, "hwloc: cannot initialise a topology");
  }
  if (hwloc_topology_load(impl->topology) != 0) {
    return make_error(ErrorCode::kUnavailable, "hwloc: cannot load this machine's topology");
  }
  NumaTopology topology(std::move(impl));
  collect_nodes(topology.impl_->topology, &topology.node_cpus_, &topology.node_os_index_);
  return topology;
}

Result<NumaTopology> NumaTopology::load_synthetic(const std::string& description) {
  auto impl = std::make_unique<Impl>();
  if (hwloc_topology_init(&impl->topology) != 0) {
    impl->topology = nullptr;
    return make_error(ErrorCode::kUnavailable, "hwloc: cannot initialise a topology");
  }
  if (hwloc_topology_set_synthetic(impl->topology, description.c_str()) != 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "not a valid hwloc synthetic topology (e.g. \"node:2 core:4 pu:1\")",
                  "'" + description + "'");
  }
  if (hwloc_topology_load(impl->topology) != 0) {
    return Status(ErrorCode::kInvalidArgument, "hwloc cannot load this synthetic topology",
                  "'" + description + "'");
  }
  NumaTopology topology(std::move(impl));
  topology.synthetic_ = true;
  collect_nodes(topology.impl_->topology, &topology.node_cpus_, &topology.node_os_index_);
  return topology;
}

const std::vector<int>& NumaTopology::node_cpus(int node) const {
  STRATA_ASSERT(node >= 0 && node < node_count());
  return node_cpus_[static_cast<std::size_t>(node)];
}

int NumaTopology::node_of_memory(const void* ptr, std::size_t bytes) const {
  if (synthetic_ || ptr == nullptr || bytes == 0) return -1;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uintptr_t samples[3] = {begin, begin + bytes / 2, begin + bytes - 1};
  hwloc_nodeset_t nodeset = hwloc_bitmap_alloc();
  if (nodeset == nullptr) return -1;
  int found = -1;
  bool mixed = false;
  for (std::uintptr_t address : samples) {
    const std::uintptr_t page_begin = address / page * page;
    hwloc_bitmap_zero(nodeset);
    if (hwloc_get_area_memlocation(impl_->topology, reinterpret_cast<const void*>(page_begin), page,
                                   nodeset, HWLOC_MEMBIND_BYNODESET) != 0 ||
        hwloc_bitmap_weight(nodeset) != 1) {
      mixed = true;  // unknown, untouched or spread: no single node
      break;
    }
    const auto os_index = static_cast<unsigned>(hwloc_bitmap_first(nodeset));
    auto it = std::find(node_os_index_.begin(), node_os_index_.end(), os_index);
    const int node =
        it == node_os_index_.end() ? -1 : static_cast<int>(it - node_os_index_.begin());
    if (node < 0 || (found >= 0 && node != found)) {
      mixed = true;
      break;
    }
    found = node;
  }
  hwloc_bitmap_free(nodeset);
  return mixed ? -1 : found;
}

}  // namespace strata::sys
