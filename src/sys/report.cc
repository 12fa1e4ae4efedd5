#include "sys/report.h"

#include <fmt/format.h>

#include <utility>

#include "common/units.h"
#include "strata/build_info.h"

namespace strata::sys {
namespace {

// Pinned staging below this is too small for even one default-sized optimizer tile pipeline.
constexpr std::uint64_t kMemlockWarnBytes = 1 * kGiB;

std::string yes_no(bool value) {
  return value ? "yes" : "no";
}

std::string memlock_text(const std::optional<std::uint64_t>& bytes) {
  return bytes ? format_bytes(*bytes) : "unlimited";
}

std::string numa_text(int node) {
  return node < 0 ? "no particular node" : fmt::format("NUMA node {}", node);
}

void add_warnings(MachineReport& report) {
  if (report.memory.is_ok()) {
    const HostMemory& m = *report.memory;
    if (!m.can_lock_unlimited && m.memlock_soft_bytes &&
        *m.memlock_soft_bytes < kMemlockWarnBytes) {
      report.warnings.push_back(fmt::format(
          "ulimit -l is {}: pinned staging buffers beyond it cannot be locked, so Strata will "
          "refuse a pinned-host budget above it; raise it (ulimit -l unlimited, or memlock in "
          "/etc/security/limits.conf)",
          format_bytes(*m.memlock_soft_bytes)));
    }
  }
  if (!report.uring.available) {
    report.warnings.push_back(fmt::format(
        "io_uring is not usable ({}): the NVMe tier will use a pread/pwrite thread pool",
        report.uring.error));
  }
  if (report.directory && !report.directory->direct_io) {
    report.warnings.push_back(fmt::format(
        "O_DIRECT does not work in {} ({}): the NVMe tier there would go through the page cache",
        report.directory->path, report.directory->direct_io_error));
  }
  if (report.cuda.gpus.empty()) {
    report.warnings.push_back(
        fmt::format("no GPU ({}): training runs on the CPU backend", report.cuda.error));
  }
}

}  // namespace

MachineReport collect_report(UringProbe uring, std::optional<DirectoryProbe> directory) {
  MachineReport report;
  report.directory = std::move(directory);
  report.cpu = cpu_features();
  report.simd = best_simd_level();
  report.topology = probe_topology();
  report.memory = probe_host_memory();
  report.cuda = probe_cuda();
  report.nccl = probe_nccl();
  report.uring = std::move(uring);
  add_warnings(report);
  return report;
}

std::string report_text(const MachineReport& r) {
  std::string out;
  auto line = [&out](const std::string& key, const std::string& value) {
    out += fmt::format("  {:<22} {}\n", key, value);
  };
  out += "build\n";
  line("version", fmt::format("{} ({})", build::kVersion, build::kGitCommit));
  line("build type", build::kBuildType);
  line("C++ compiler", build::kCxxCompiler);
  line("CUDA parts", r.cuda.built_with_cuda
                         ? fmt::format("built ({}; architectures {})", build::kCudaCompiler,
                                       build::kCudaArchitectures)
                         : "not built");
  if (*build::kSanitizers != '\0') line("sanitizers", build::kSanitizers);

  const CpuFeatures& c = r.cpu;
  out += "cpu\n";
  line("model", c.brand.empty() ? c.vendor : c.brand);
  line("AVX2 / FMA / F16C",
       fmt::format("{} / {} / {}", yes_no(c.avx2), yes_no(c.fma), yes_no(c.f16c)));
  line("AVX-512 F/BW/VL/DQ", fmt::format("{} / {} / {} / {}", yes_no(c.avx512f), yes_no(c.avx512bw),
                                         yes_no(c.avx512vl), yes_no(c.avx512dq)));
  line("AVX-512 BF16 / FP16", fmt::format("{} / {}", yes_no(c.avx512_bf16), yes_no(c.avx512_fp16)));
  line("AMX-BF16", yes_no(c.amx_bf16));
  line("kernel SIMD path", to_string(r.simd));
  if (r.topology.is_ok()) {
    const Topology& t = *r.topology;
    line("packages/cores/threads",
         fmt::format("{} / {} / {}", t.packages, t.cores, t.hardware_threads));
    for (const NumaNode& n : t.numa_nodes) {
      line(fmt::format("NUMA node {}", n.os_index),
           fmt::format("{} cores (cpus {}), {}", n.cores, n.cpus, format_bytes(n.memory_bytes)));
    }
  } else {
    line("topology", "unknown: " + r.topology.status().to_string());
  }

  out += "memory\n";
  if (r.memory.is_ok()) {
    const HostMemory& m = *r.memory;
    line("total / available",
         fmt::format("{} / {}", format_bytes(m.total_bytes), format_bytes(m.available_bytes)));
    line("ulimit -l (soft/hard)",
         fmt::format("{} / {}{}", memlock_text(m.memlock_soft_bytes),
                     memlock_text(m.memlock_hard_bytes),
                     m.can_lock_unlimited ? " (CAP_IPC_LOCK: no limit)" : ""));
    line("huge pages free",
         fmt::format("{} x {}", m.huge_pages_free, format_bytes(m.huge_page_bytes)));
  } else {
    line("memory", "unknown: " + r.memory.status().to_string());
  }

  out += "gpu\n";
  if (r.cuda.built_with_cuda) {
    line("CUDA runtime", sys::cuda_version_string(r.cuda.runtime_version));
    line("CUDA driver",
         r.cuda.driver_version > 0 ? sys::cuda_version_string(r.cuda.driver_version) : "none");
  }
  if (r.cuda.gpus.empty()) line("GPUs", "no GPU: " + r.cuda.error);
  for (const GpuInfo& g : r.cuda.gpus) {
    int node = -1;
    if (r.topology.is_ok()) {
      for (const IoDevice& d : r.topology->io_devices) {
        if (d.kind == "gpu" && d.pci_bus_id == g.pci_bus_id) node = d.numa_node;
      }
    }
    line(fmt::format("GPU {}", g.index),
         fmt::format("{}, {}, sm_{}{}, {} SMs, {} ({})", g.name, format_bytes(g.memory_bytes),
                     g.compute_major, g.compute_minor, g.multiprocessors, g.pci_bus_id,
                     numa_text(node)));
  }
  line("NCCL", r.nccl.available ? fmt::format("{} ({})", r.nccl.version, r.nccl.library)
                                : "not available: " + r.nccl.error);

  out += "storage\n";
  line("io_uring",
       r.uring.available
           ? fmt::format("available (kernel {}; fixed buffers: {})", r.uring.kernel_release,
                         yes_no(r.uring.read_fixed && r.uring.write_fixed))
           : fmt::format("not usable (kernel {}): {}", r.uring.kernel_release, r.uring.error));
  if (r.topology.is_ok()) {
    for (const IoDevice& d : r.topology->io_devices) {
      if (d.kind == "gpu") continue;
      line(d.name,
           fmt::format("{}{}, {}", d.kind, d.pci_bus_id.empty() ? "" : " at " + d.pci_bus_id,
                       numa_text(d.numa_node)));
    }
  }
  if (r.directory) {
    const DirectoryProbe& d = *r.directory;
    out += fmt::format("path {}\n", d.path);
    line("file system", d.fs_type + (d.block_device.empty() ? "" : " on " + d.block_device));
    line("O_DIRECT", d.direct_io ? "works" : "does not work: " + d.direct_io_error);
    line("logical block size", d.logical_block_bytes != 0
                                   ? fmt::format("{} B", d.logical_block_bytes)
                                   : "none (not a block device)");
    line("direct-I/O alignment",
         fmt::format("memory {} B, offset {} B (from {}); Strata aligns to {} B", d.mem_align_bytes,
                     d.offset_align_bytes, d.align_source, required_alignment(d)));
    line("free / total",
         fmt::format("{} / {}", format_bytes(d.free_bytes), format_bytes(d.total_bytes)));
  }
  if (!r.warnings.empty()) {
    out += "warnings\n";
    for (const std::string& w : r.warnings)
      out += "  - " + w + "\n";
  }
  return out;
}

Json::Value report_json(const MachineReport& r) {
  using Json::Value;
  using U = Json::UInt64;
  Value root(Json::objectValue);
  Value& b = root["build"];
  b["version"] = build::kVersion;
  b["git_commit"] = build::kGitCommit;
  b["build_type"] = build::kBuildType;
  b["cxx_compiler"] = build::kCxxCompiler;
  b["cuda_built"] = r.cuda.built_with_cuda;
  b["cuda_architectures"] = r.cuda.built_with_cuda ? build::kCudaArchitectures : "";
  b["sanitizers"] = build::kSanitizers;

  const CpuFeatures& c = r.cpu;
  Value& cpu = root["cpu"];
  cpu["vendor"] = c.vendor;
  cpu["model"] = c.brand;
  cpu["avx2"] = c.avx2;
  cpu["fma"] = c.fma;
  cpu["f16c"] = c.f16c;
  cpu["avx512f"] = c.avx512f;
  cpu["avx512bw"] = c.avx512bw;
  cpu["avx512vl"] = c.avx512vl;
  cpu["avx512dq"] = c.avx512dq;
  cpu["avx512_bf16"] = c.avx512_bf16;
  cpu["avx512_fp16"] = c.avx512_fp16;
  cpu["amx_bf16"] = c.amx_bf16;
  cpu["simd_path"] = to_string(r.simd);
  if (r.topology.is_ok()) {
    cpu["packages"] = r.topology->packages;
    cpu["cores"] = r.topology->cores;
    cpu["hardware_threads"] = r.topology->hardware_threads;
    Value& nodes = root["numa_nodes"] = Value(Json::arrayValue);
    for (const NumaNode& n : r.topology->numa_nodes) {
      Value node;
      node["node"] = n.os_index;
      node["cores"] = n.cores;
      node["cpus"] = n.cpus;
      node["memory_bytes"] = U{n.memory_bytes};
      nodes.append(node);
    }
    Value& devices = root["io_devices"] = Value(Json::arrayValue);
    for (const IoDevice& d : r.topology->io_devices) {
      Value device;
      device["kind"] = d.kind;
      device["name"] = d.name;
      device["pci_bus_id"] = d.pci_bus_id;
      device["numa_node"] = d.numa_node;
      devices.append(device);
    }
  }
  if (r.memory.is_ok()) {
    const HostMemory& m = *r.memory;
    Value& mem = root["memory"];
    mem["total_bytes"] = U{m.total_bytes};
    mem["available_bytes"] = U{m.available_bytes};
    mem["memlock_soft_bytes"] = m.memlock_soft_bytes ? Value(U{*m.memlock_soft_bytes}) : Value();
    mem["memlock_hard_bytes"] = m.memlock_hard_bytes ? Value(U{*m.memlock_hard_bytes}) : Value();
    mem["memlock_unlimited_capability"] = m.can_lock_unlimited;
  }
  Value& gpu = root["cuda"];
  gpu["runtime_version"] =
      r.cuda.built_with_cuda ? cuda_version_string(r.cuda.runtime_version) : "";
  gpu["driver_version"] =
      r.cuda.driver_version > 0 ? cuda_version_string(r.cuda.driver_version) : "";
  gpu["error"] = r.cuda.error;
  Value& gpus = gpu["gpus"] = Value(Json::arrayValue);
  for (const GpuInfo& g : r.cuda.gpus) {
    Value one;
    one["index"] = g.index;
    one["name"] = g.name;
    one["memory_bytes"] = U{g.memory_bytes};
    one["compute_capability"] = fmt::format("{}.{}", g.compute_major, g.compute_minor);
    one["pci_bus_id"] = g.pci_bus_id;
    gpus.append(one);
  }
  root["nccl"]["available"] = r.nccl.available;
  root["nccl"]["version"] = r.nccl.version;
  root["nccl"]["error"] = r.nccl.error;
  root["io_uring"]["available"] = r.uring.available;
  root["io_uring"]["kernel"] = r.uring.kernel_release;
  root["io_uring"]["fixed_buffers"] = r.uring.read_fixed && r.uring.write_fixed;
  root["io_uring"]["error"] = r.uring.error;
  if (r.directory) {
    const DirectoryProbe& d = *r.directory;
    Value& p = root["path"];
    p["path"] = d.path;
    p["fs_type"] = d.fs_type;
    p["block_device"] = d.block_device;
    p["direct_io"] = d.direct_io;
    p["direct_io_error"] = d.direct_io_error;
    p["logical_block_bytes"] = d.logical_block_bytes;
    p["mem_align_bytes"] = d.mem_align_bytes;
    p["offset_align_bytes"] = d.offset_align_bytes;
    p["alignment_bytes"] = required_alignment(d);
    p["free_bytes"] = U{d.free_bytes};
    p["total_bytes"] = U{d.total_bytes};
  }
  Value& warnings = root["warnings"] = Value(Json::arrayValue);
  for (const std::string& w : r.warnings)
    warnings.append(w);
  return root;
}

}  // namespace strata::sys
