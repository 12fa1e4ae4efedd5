#include "sys/topology.h"

#include <hwloc.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace strata::sys {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

std::string bitmap_list(hwloc_const_bitmap_t set) {
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "";
  std::string result(text);
  std::free(text);
  return result;
}

// The OS index of the first NUMA node local to `obj`'s nearest non-I/O ancestor, or -1.
int nearest_numa_node(hwloc_topology_t topology, hwloc_obj_t obj) {
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topology, obj);
  if (ancestor == nullptr || ancestor->nodeset == nullptr) return -1;
  int first = hwloc_bitmap_first(ancestor->nodeset);
  // A device whose ancestor spans every node (the machine object) has no particular locality.
  if (hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE) > 1 &&
      hwloc_bitmap_isequal(ancestor->nodeset, hwloc_topology_get_topology_nodeset(topology))) {
    return -1;
  }
  return first;
}

std::string pci_bus_id(hwloc_obj_t obj) {
  for (hwloc_obj_t p = obj; p != nullptr; p = p->parent) {
    if (p->type == HWLOC_OBJ_PCI_DEVICE) {
      const auto& pci = p->attr->pcidev;
      return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", pci.domain, pci.bus, pci.dev, pci.func);
    }
  }
  return "";
}

}  // namespace

Result<Topology> probe_topology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    return make_error(ErrorCode::kUnavailable, "hwloc_topology_init failed: {}",
                      std::strerror(errno));
  }
  TopologyPtr topology(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(raw) != 0) {
    return make_error(ErrorCode::kUnavailable, "hwloc_topology_load failed: {}",
                      std::strerror(errno));
  }

  Topology result;
  result.packages = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PACKAGE);
  result.cores = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_CORE);
  result.hardware_threads = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PU);

  for (hwloc_obj_t node = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_NUMANODE, nullptr);
       node != nullptr; node = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_NUMANODE, node)) {
    NumaNode n;
    n.os_index = static_cast<int>(node->os_index);
    n.memory_bytes = node->attr != nullptr ? node->attr->numanode.local_memory : 0;
    n.cpus = bitmap_list(node->cpuset);
    n.cores = hwloc_get_nbobjs_inside_cpuset_by_type(raw, node->cpuset, HWLOC_OBJ_CORE);
    result.numa_nodes.push_back(std::move(n));
  }

  // NVIDIA GPUs are found as PCI devices (class 0x03xx, vendor 0x10de): the CUDA and NVML hwloc
  // plugins are not part of Debian's build. Block devices come from the OS device list.
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(raw, nullptr); pci != nullptr;
       pci = hwloc_get_next_pcidev(raw, pci)) {
    const auto& attr = pci->attr->pcidev;
    if (attr.vendor_id == 0x10de && (attr.class_id >> 8) == 0x03) {
      IoDevice d;
      d.kind = "gpu";
      d.name = pci->name != nullptr ? pci->name : "NVIDIA GPU";
      d.pci_bus_id = pci_bus_id(pci);
      d.numa_node = nearest_numa_node(raw, pci);
      result.io_devices.push_back(std::move(d));
    }
  }
  for (hwloc_obj_t os = hwloc_get_next_osdev(raw, nullptr); os != nullptr;
       os = hwloc_get_next_osdev(raw, os)) {
    if (os->attr->osdev.type != HWLOC_OBJ_OSDEV_BLOCK || os->name == nullptr) continue;
    IoDevice d;
    d.name = os->name;
    d.kind = d.name.rfind("nvme", 0) == 0 ? "nvme" : "block";
    d.pci_bus_id = pci_bus_id(os);
    d.numa_node = nearest_numa_node(raw, os);
    result.io_devices.push_back(std::move(d));
  }
  return result;
}

}  // namespace strata::sys
