// Reading the launcher's environment (launch.h).
#include "comm/launch.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <vector>

namespace strata::comm {

const char* to_string(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "none";
    case Launcher::kOpenMpi:
      return "mpirun (OpenMPI)";
    case Launcher::kPmi:
      return "PMI";
    case Launcher::kTorchrun:
      return "torchrun-style environment";
    case Launcher::kSlurm:
      return "Slurm";
  }
  return "unknown";
}

EnvLookup process_environment() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

namespace {

constexpr int kWorldSizeMax = 1 << 20;

Status env_error(std::string message) {
  return Status(ErrorCode::kConfig, std::move(message), "launcher environment");
}

// The variable's value, or nullopt when it is unset or empty.
std::optional<std::string> get(const EnvLookup& env, const char* name) {
  const char* value = env(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// Parses a whole decimal number in [lo, hi]; the error names the variable and the range.
Result<int> parse_int(const char* name, const std::string& text, int lo, int hi) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE) {
    return env_error(fmt::format("{}='{}' is not a whole number", name, text));
  }
  if (value < lo || value > hi) {
    return env_error(fmt::format("{}={} is out of range; valid: {} to {}", name, value, lo, hi));
  }
  return static_cast<int>(value);
}

// Reads an optional integer variable; nullopt when unset.
Result<std::optional<int>> optional_int(const EnvLookup& env, const char* name, int lo, int hi) {
  std::optional<std::string> text = get(env, name);
  if (!text) return std::optional<int>{};
  STRATA_ASSIGN_OR_RETURN(int value, parse_int(name, *text, lo, hi));
  return std::optional<int>{value};
}

// One launcher family's reading.
struct Reading {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  std::string variables;
};

// Reads a (rank, size) pair of variables, both required once either is set.
Result<std::optional<Reading>> read_pair(const EnvLookup& env, Launcher launcher,
                                         const char* rank_name, const char* size_name,
                                         bool size_alone_ok) {
  std::optional<std::string> rank_text = get(env, rank_name);
  std::optional<std::string> size_text = get(env, size_name);
  if (!rank_text && !size_text) return std::optional<Reading>{};
  Reading r;
  r.launcher = launcher;
  r.variables = fmt::format("{}, {}", rank_name, size_name);
  if (!size_text) {
    return env_error(fmt::format("{}={} is set but {} is not; a launcher sets both", rank_name,
                                 *rank_text, size_name));
  }
  STRATA_ASSIGN_OR_RETURN(r.world_size, parse_int(size_name, *size_text, 1, kWorldSizeMax));
  if (!rank_text) {
    if (size_alone_ok && r.world_size == 1) return std::optional<Reading>{r};
    return env_error(fmt::format("{}={} is set but {} is not; a launcher sets both", size_name,
                                 r.world_size, rank_name));
  }
  STRATA_ASSIGN_OR_RETURN(r.rank, parse_int(rank_name, *rank_text, 0, kWorldSizeMax));
  if (r.rank >= r.world_size) {
    return env_error(fmt::format("{}={} is not below {}={}; valid ranks: 0 to {}", rank_name,
                                 r.rank, size_name, r.world_size, r.world_size - 1));
  }
  return std::optional<Reading>{r};
}

// Adds the node-local pair and checks it against the global one.
Status read_local(const EnvLookup& env, Reading* r, const char* local_rank_name,
                  std::initializer_list<const char*> local_size_names) {
  STRATA_ASSIGN_OR_RETURN(r->local_rank, optional_int(env, local_rank_name, 0, kWorldSizeMax));
  const char* size_name = nullptr;
  for (const char* name : local_size_names) {
    STRATA_ASSIGN_OR_RETURN(std::optional<int> size, optional_int(env, name, 1, kWorldSizeMax));
    if (size) {
      r->local_world_size = size;
      size_name = name;
      break;
    }
  }
  if (r->local_rank && *r->local_rank >= r->world_size) {
    return env_error(fmt::format("{}={} is not below the world size {}", local_rank_name,
                                 *r->local_rank, r->world_size));
  }
  if (r->local_world_size) {
    if (*r->local_world_size > r->world_size) {
      return env_error(fmt::format("{}={} is larger than the world size {}", size_name,
                                   *r->local_world_size, r->world_size));
    }
    if (r->local_rank && *r->local_rank >= *r->local_world_size) {
      return env_error(fmt::format("{}={} is not below {}={}", local_rank_name, *r->local_rank,
                                   size_name, *r->local_world_size));
    }
  }
  return Status::ok();
}

// Slurm's compressed task counts per node, "2(x3),1", expanded and indexed by node.
Result<int> tasks_on_node(const char* name, const std::string& text, int node) {
  int index = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    int count = 0;
    int repeat = 1;
    const std::size_t paren = item.find("(x");
    auto bad = [&] {
      return env_error(
          fmt::format("{}='{}' is not Slurm's list of task counts (e.g. '2(x3),1')", name, text));
    };
    char* end = nullptr;
    count = static_cast<int>(std::strtol(item.c_str(), &end, 10));
    if (end == item.c_str() || count < 0) return bad();
    if (paren != std::string::npos) {
      if (static_cast<std::size_t>(end - item.c_str()) != paren || item.back() != ')') return bad();
      repeat = static_cast<int>(std::strtol(item.c_str() + paren + 2, &end, 10));
      if (repeat < 1 || *end != ')') return bad();
    } else if (*end != '\0') {
      return bad();
    }
    if (node < index + repeat) return count;
    index += repeat;
    pos = comma + 1;
  }
  return env_error(fmt::format("{}='{}' lists {} nodes; SLURM_NODEID={} is not among them", name,
                               text, index, node));
}

Result<std::optional<Reading>> read_slurm(const EnvLookup& env) {
  std::optional<std::string> procid = get(env, "SLURM_PROCID");
  // Only a task of an srun step describes this process: the batch script itself (and an mpirun
  // started from it) sees the allocation's SLURM_NTASKS with SLURM_PROCID=0.
  const bool in_step = get(env, "SLURM_STEP_NUM_TASKS").has_value() ||
                       get(env, "SLURM_STEP_ID").has_value() ||
                       get(env, "SLURM_STEPID").has_value();
  if (!procid || !in_step) return std::optional<Reading>{};
  const char* size_name =
      get(env, "SLURM_STEP_NUM_TASKS").has_value() ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  STRATA_ASSIGN_OR_RETURN(std::optional<Reading> r,
                          read_pair(env, Launcher::kSlurm, "SLURM_PROCID", size_name, false));
  STRATA_ASSIGN_OR_RETURN(r->local_rank, optional_int(env, "SLURM_LOCALID", 0, kWorldSizeMax));
  STRATA_ASSIGN_OR_RETURN(std::optional<int> node,
                          optional_int(env, "SLURM_NODEID", 0, kWorldSizeMax));
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    std::optional<std::string> text = get(env, name);
    if (!text || !node) continue;
    STRATA_ASSIGN_OR_RETURN(int tasks, tasks_on_node(name, *text, *node));
    r->local_world_size = tasks;
    break;
  }
  r->variables = fmt::format("SLURM_PROCID, {}, SLURM_LOCALID", size_name);
  if (r->local_rank && r->local_world_size && *r->local_rank >= *r->local_world_size) {
    return env_error(fmt::format("SLURM_LOCALID={} is not below the {} tasks of this node",
                                 *r->local_rank, *r->local_world_size));
  }
  return r;
}

}  // namespace

Result<LaunchInfo> launch_from_environment(const EnvLookup& env) {
  std::vector<Reading> readings;
  STRATA_ASSIGN_OR_RETURN(
      std::optional<Reading> ompi,
      read_pair(env, Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", false));
  if (ompi) {
    STRATA_TRY(
        read_local(env, &*ompi, "OMPI_COMM_WORLD_LOCAL_RANK", {"OMPI_COMM_WORLD_LOCAL_SIZE"}));
    readings.push_back(*ompi);
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<Reading> pmi,
                          read_pair(env, Launcher::kPmi, "PMI_RANK", "PMI_SIZE", false));
  if (pmi) {
    STRATA_TRY(read_local(env, &*pmi, "MPI_LOCALRANKID", {"MPI_LOCALNRANKS"}));
    readings.push_back(*pmi);
  }
  STRATA_ASSIGN_OR_RETURN(std::optional<Reading> torch,
                          read_pair(env, Launcher::kTorchrun, "RANK", "WORLD_SIZE", true));
  if (torch) {
    STRATA_TRY(read_local(env, &*torch, "LOCAL_RANK", {"LOCAL_WORLD_SIZE", "LOCAL_SIZE"}));
    readings.push_back(*torch);
  }
  // The first family decides; the other MPI/torchrun families must agree with it. Slurm is read
  // only when it is alone: under mpirun or torchrun inside an allocation, its variables describe
  // the launcher's own processes (one per node), not the ranks.
  if (readings.empty()) {
    STRATA_ASSIGN_OR_RETURN(std::optional<Reading> slurm, read_slurm(env));
    if (slurm) readings.push_back(*slurm);
  }
  LaunchInfo info;
  if (!readings.empty()) {
    const Reading& first = readings.front();
    for (std::size_t i = 1; i < readings.size(); ++i) {
      const Reading& other = readings[i];
      if (other.rank != first.rank || other.world_size != first.world_size) {
        return env_error(fmt::format(
            "two launchers disagree: {} ({}) say rank {} of {}, {} ({}) say rank {} of {}; unset "
            "the variables of the launcher you are not using",
            to_string(first.launcher), first.variables, first.rank, first.world_size,
            to_string(other.launcher), other.variables, other.rank, other.world_size));
      }
    }
    info.launcher = first.launcher;
    info.rank = first.rank;
    info.world_size = first.world_size;
    info.local_rank = first.local_rank.value_or(info.world_size == 1 ? 0 : -1);
    info.local_world_size = first.local_world_size.value_or(info.world_size == 1 ? 1 : 0);
    info.variables = first.variables;
    if (info.local_rank < 0) {
      // No node-local rank: assume one node when the launcher does not say otherwise.
      info.local_rank = info.rank;
    }
  } else {
    info.local_world_size = 1;
  }
  // PMIx (mpirun, srun --mpi=pmix) lets MPI_Init join the other ranks even when it is not the
  // launcher family that named them; its rank must agree.
  STRATA_ASSIGN_OR_RETURN(std::optional<int> pmix_rank,
                          optional_int(env, "PMIX_RANK", 0, kWorldSizeMax));
  if (pmix_rank && readings.size() > 0 && *pmix_rank != info.rank) {
    return env_error(fmt::format("PMIX_RANK={} disagrees with {} (rank {})", *pmix_rank,
                                 info.variables, info.rank));
  }
  info.mpi_launched = info.launcher == Launcher::kOpenMpi || info.launcher == Launcher::kPmi ||
                      (pmix_rank.has_value() && info.launcher != Launcher::kNone);
  if (std::optional<std::string> addr = get(env, "MASTER_ADDR")) info.master_addr = *addr;
  STRATA_ASSIGN_OR_RETURN(std::optional<int> port, optional_int(env, "MASTER_PORT", 1, 65535));
  info.master_port = port.value_or(0);
  return info;
}

Result<LaunchInfo> launch_from_environment() {
  return launch_from_environment(process_environment());
}

std::string describe(const LaunchInfo& info) {
  if (info.launcher == Launcher::kNone) return "rank 0 of 1 (no launcher)";
  std::string local = info.local_world_size > 0
                          ? fmt::format("local {} of {}", info.local_rank, info.local_world_size)
                          : fmt::format("local {}", info.local_rank);
  return fmt::format("rank {} of {} ({}) from {}", info.rank, info.world_size, local,
                     to_string(info.launcher));
}

Result<std::int64_t> world_size_from_environment() {
  STRATA_ASSIGN_OR_RETURN(LaunchInfo launch, launch_from_environment());
  return std::int64_t{launch.world_size};
}

}  // namespace strata::comm
