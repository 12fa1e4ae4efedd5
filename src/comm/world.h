// Joining the run's world: read the launcher (launch.h), bind this rank (binding.h), and build the
// Comm for the backend (comm.h). The one call a command makes before it starts its backend.
//
//   backend  launcher                          transport
//   any      none, or a world of 1             single rank (no transport)
//   cpu      mpirun / PMI / srun --mpi=pmix    MPI (mpi_comm.h)
//   cpu      torchrun-style env or Slurm only  error: MPI cannot join processes it did not start;
//                                              use mpirun (or srun --mpi=pmix)
//   cuda     mpirun / PMI / srun --mpi=pmix    NCCL, unique id broadcast over MPI
//   cuda     torchrun-style env or Slurm       NCCL, unique id over the TCP bootstrap on
//                                              MASTER_ADDR:MASTER_PORT (tcp_bootstrap.h)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/binding.h"
#include "comm/comm.h"
#include "comm/launch.h"

namespace strata::comm {

// What the ranks compute on, which decides their transport (the table above).
enum class Device : std::uint8_t { kAuto = 0, kCpu, kCuda };  // kAuto: CUDA when a GPU is visible

// train/run_settings.h fills these from a training config.
struct WorldOptions {
  Device device = Device::kCpu;
  CommOptions comm;
  bool bind = true;                     // bind to GPU, cores and NVMe paths (binding.h)
  std::vector<std::string> nvme_paths;  // the configured NVMe paths, for the nearest choice
};

struct World {
  LaunchInfo launch;
  BindingPlan binding;
  std::unique_ptr<Comm> comm;
};

// Joins the world described by the launcher's environment. Errors: kConfig for an inconsistent
// or unusable launch (naming the variables and what to do), kUnavailable for a transport that
// cannot start or a rank that does not arrive within options.comm.timeout_s.
Result<World> join_world(const WorldOptions& options, const EnvLookup& env);
Result<World> join_world(const WorldOptions& options);

// The port the TCP bootstrap uses: STRATA_BOOTSTRAP_PORT when set, else MASTER_PORT, except under
// torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True), which holds MASTER_PORT itself:
// then MASTER_PORT + 1. Errors (kConfig) for a port that is not 1-65535 or missing.
Result<int> bootstrap_port(const LaunchInfo& launch, const EnvLookup& env);

// Call when this rank is about to exit with an error: with MPI, the process then ends with
// MPI_Abort, which stops the other ranks at once instead of leaving them to their timeout.
void abort_world_at_exit(int exit_code);

}  // namespace strata::comm
