// Running programs under `mpirun -np N` from tests: the mpirun found at build time, the
// environment tests need (root in containers; a session directory per run), and a skip with the
// reason when MPI is missing.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "support/run_strata.h"

namespace strata::testing {

// OpenMPI refuses to run as root unless told twice; tests run as root in containers.
inline const std::vector<std::string>& mpi_env() {
  static const std::vector<std::string> env = {"OMPI_ALLOW_RUN_AS_ROOT=1",
                                               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};
  return env;
}

inline std::string mpirun() {
  const std::string path = STRATA_MPIEXEC;
  return !path.empty() && ::access(path.c_str(), X_OK) == 0 ? path : "";
}

#define SKIP_WITHOUT_MPIRUN()                                                                \
  if (::strata::testing::mpirun().empty()) {                                                 \
    GTEST_SKIP() << "no mpirun: MPI was off or not found at build time ('" << STRATA_MPIEXEC \
                 << "'); install openmpi-bin and libopenmpi-dev with tools/setup.sh";        \
  }

// `mpirun -np ranks program args...`.
inline RunOutput run_ranks(int ranks, const std::string& program,
                           const std::vector<std::string>& args, int timeout_s = 120) {
  // A session directory of its own: two mpiruns started at once (ctest --parallel) race to
  // create the same /tmp/ompi.<host>.<uid>, and the loser fails in orte_init.
  TempDir session;
  std::vector<std::string> env = mpi_env();
  env.push_back("OMPI_MCA_orte_tmpdir_base=" + session.path());
  std::vector<std::string> all = {"--oversubscribe", "-np", std::to_string(ranks), program};
  all.insert(all.end(), args.begin(), args.end());
  return run_program(mpirun(), all, env, timeout_s);
}

}  // namespace strata::testing
