// Who this process is in a multi-rank run, read from the launcher's environment:
//   - OpenMPI's mpirun:   OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE
//   - PMI (MPICH's mpiexec, srun --mpi=pmi2): PMI_RANK, PMI_SIZE (+ MPI_LOCALRANKID/_LOCALNRANKS)
//   - torchrun / deepspeed: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT
//   - Slurm's srun:       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                         SLURM_TASKS_PER_NODE (or SLURM_STEP_TASKS_PER_NODE)
// The first family present in that order decides; a later family that is also present must agree
// on rank and world size (an mpirun inside an sbatch script inherits the batch step's SLURM_*,
// which describe the batch script, not this process: Slurm values are only checked against the
// others when they describe a step of more than one task). No variable at all means one rank.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace strata::comm {

enum class Launcher : std::uint8_t { kNone = 0, kOpenMpi, kPmi, kTorchrun, kSlurm };
// "none", "mpirun (OpenMPI)", "PMI", "torchrun-style environment", "Slurm".
const char* to_string(Launcher launcher);

struct LaunchInfo {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this node (= rank when unknown)
  int local_world_size = 0;  // processes on this node; 0 when the launcher does not say
  std::string master_addr;   // MASTER_ADDR, "" when unset
  int master_port = 0;       // MASTER_PORT, 0 when unset
  std::string variables;     // the variables the values came from, for messages
  // Whether an MPI launcher started the processes (mpirun, PMI, srun --mpi=pmix), so that
  // MPI_Init joins them into one world.
  bool mpi_launched = false;
};

// Looks up an environment variable: nullptr when unset. Tests pass a map-backed lookup.
using EnvLookup = std::function<const char*(const char* name)>;

// The process environment (std::getenv).
EnvLookup process_environment();

// Reads and checks the launcher's variables. Errors (kConfig) name the variables and values at
// fault and what would be valid: a value that is not a whole number, rank >= world size, a rank
// variable without its size (RANK without WORLD_SIZE), two launchers that disagree.
Result<LaunchInfo> launch_from_environment(const EnvLookup& env);
Result<LaunchInfo> launch_from_environment();

// The world size the launcher announced (OMPI_COMM_WORLD_SIZE, PMI_SIZE, WORLD_SIZE with RANK,
// or an srun step's size), or 1 when there is no launcher: what a config's batch sizes are derived
// with. Errors as launch_from_environment.
Result<std::int64_t> world_size_from_environment();

// One line for logs: "rank 1 of 4 (local 1 of 2) from mpirun (OpenMPI)".
std::string describe(const LaunchInfo& info);

}  // namespace strata::comm
