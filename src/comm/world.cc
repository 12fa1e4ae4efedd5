// Joining the world (world.h).
#include "comm/world.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <span>

#include "comm/mpi_comm.h"
#include "comm/nccl_comm.h"
#include "comm/tcp_bootstrap.h"
#include "common/log.h"
#include "sys/gpu.h"

namespace strata::comm {

Result<int> bootstrap_port(const LaunchInfo& launch, const EnvLookup& env) {
  if (const char* text = env("STRATA_BOOTSTRAP_PORT"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const long port = std::strtol(text, &end, 10);
    if (*end != '\0' || port < 1 || port > 65535) {
      return Status(
          ErrorCode::kConfig,
          fmt::format("STRATA_BOOTSTRAP_PORT='{}' is not a port; valid: 1 to 65535", text),
          "launcher environment");
    }
    return static_cast<int>(port);
  }
  if (launch.master_port == 0) {
    return Status(ErrorCode::kConfig,
                  "MASTER_PORT is not set; without mpirun, the CUDA backend's ranks meet on "
                  "MASTER_ADDR:MASTER_PORT (set both on every rank, or STRATA_BOOTSTRAP_PORT)",
                  "launcher environment");
  }
  const char* agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
  if (agent_store != nullptr &&
      (std::strcmp(agent_store, "True") == 0 || std::strcmp(agent_store, "true") == 0 ||
       std::strcmp(agent_store, "1") == 0)) {
    if (launch.master_port == 65535) {
      return Status(ErrorCode::kConfig,
                    "MASTER_PORT=65535 is held by torchrun's store and MASTER_PORT+1 does not "
                    "exist; set STRATA_BOOTSTRAP_PORT",
                    "launcher environment");
    }
    return launch.master_port + 1;
  }
  return launch.master_port;
}

namespace {

bool resolve_cuda(Device device) {
  if (device == Device::kCuda) return true;
  if (device == Device::kCpu) return false;
  return !sys::probe_cuda().gpus.empty();
}

Result<BindingPlan> bind(const WorldOptions& options, const LaunchInfo& launch, bool cuda) {
  BindingPlan none;
  none.summary = "binding off";
  none.nvme_paths = options.nvme_paths;
  if (!options.bind) return none;
  Result<MachineLayout> layout = load_machine_layout();
  if (!layout.is_ok()) {
    if (cuda) return layout.status();
    STRATA_LOG_WARN("rank {}: not binding CPUs: {}", launch.rank, layout.status().to_string());
    none.summary = "binding skipped: " + layout.status().message();
    return none;
  }
  BindingRequest request;
  request.local_rank = launch.local_rank;
  request.local_world_size = launch.local_world_size;
  request.use_gpu = cuda;
  request.allowed_cpus = current_cpus();
  request.nvme_paths = options.nvme_paths;
  for (const std::string& path : options.nvme_paths) {
    request.nvme_numa_nodes.push_back(numa_node_of_path(path));
  }
  STRATA_ASSIGN_OR_RETURN(BindingPlan plan, plan_binding(*layout, request));
  STRATA_TRY(apply_binding(plan));
  return plan;
}

Status cpu_needs_mpi(const LaunchInfo& launch) {
  return Status(
      ErrorCode::kConfig,
      fmt::format("the {} ({}) says this is rank {} of {}, but on the CPU backend ranks talk "
                  "through MPI, which cannot join processes it did not start: launch with "
                  "`mpirun -np {} strata ...` (or `srun --mpi=pmix strata ...` under Slurm)",
                  to_string(launch.launcher), launch.variables, launch.rank, launch.world_size,
                  launch.world_size),
      "launch");
}

Result<std::unique_ptr<Comm>> join_nccl(const WorldOptions& options, const LaunchInfo& launch,
                                        const BindingPlan& plan, const EnvLookup& env) {
  NcclCommConfig config;
  config.rank = launch.rank;
  config.world_size = launch.world_size;
  config.device = plan.gpu >= 0 ? plan.gpu : launch.local_rank;
  config.options = options.comm;
  // Rank 0 makes the id; an empty id stands in when it cannot, so that the others still meet it
  // and fail with its error rather than time out.
  Status made = Status::ok();
  if (launch.rank == 0) {
    Result<nccl::UniqueId> id = nccl_unique_id();
    if (id.is_ok()) {
      config.id = *id;
    } else {
      made = id.status();
    }
  }
  std::span<std::byte> blob(reinterpret_cast<std::byte*>(config.id.internal),
                            sizeof config.id.internal);
  if (launch.mpi_launched) {
    STRATA_TRY(mpi_initialize(launch));
    STRATA_TRY(mpi_broadcast_bytes(blob.data(), blob.size(), options.comm.timeout_s));
  } else {
    STRATA_ASSIGN_OR_RETURN(int port, bootstrap_port(launch, env));
    RendezvousOptions r;
    r.host = launch.master_addr;
    r.port = port;
    r.rank = launch.rank;
    r.world_size = launch.world_size;
    r.timeout_s = options.comm.timeout_s;
    STRATA_TRY(tcp_share_blob(r, blob));
  }
  STRATA_TRY(made);
  return create_nccl_comm(config);
}

}  // namespace

Result<World> join_world(const WorldOptions& options, const EnvLookup& env) {
  STRATA_TRY(validate(options.comm));
  World world;
  STRATA_ASSIGN_OR_RETURN(world.launch, launch_from_environment(env));
  const LaunchInfo& launch = world.launch;
  const bool cuda = resolve_cuda(options.device);
  if (launch.world_size > 1 && !cuda && !launch.mpi_launched) return cpu_needs_mpi(launch);
  if (launch.world_size == 1 && !cuda) {
    // One rank on the CPU backend uses the whole machine: nothing to split.
    world.binding.summary = "single rank: not bound";
    world.binding.nvme_paths = options.nvme_paths;
  } else {
    STRATA_ASSIGN_OR_RETURN(world.binding, bind(options, launch, cuda));
  }
  if (launch.world_size == 1) {
    world.comm = create_single_comm(options.comm);
  } else if (!cuda) {
    STRATA_TRY(mpi_initialize(launch));
    STRATA_ASSIGN_OR_RETURN(world.comm, create_mpi_comm(options.comm));
  } else {
    STRATA_ASSIGN_OR_RETURN(world.comm, join_nccl(options, launch, world.binding, env));
  }
  log_at(launch.world_size > 1 ? LogLevel::kInfo : LogLevel::kDebug, "rank {}: {}; {}; {}",
         launch.rank, describe(launch), world.binding.summary, world.comm->description());
  return world;
}

Result<World> join_world(const WorldOptions& options) {
  return join_world(options, process_environment());
}

void abort_world_at_exit(int exit_code) {
  mpi_abort_at_exit(exit_code);
}

}  // namespace strata::comm
