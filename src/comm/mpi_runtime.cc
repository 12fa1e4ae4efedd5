// MPI's start and end for the whole process (mpi_comm.h): MPI_Init_thread once, MPI_Finalize or
// MPI_Abort at exit, and a byte broadcast with a deadline for NCCL's unique id.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "comm/mpi_comm.h"

#if defined(STRATA_HAVE_MPI)
#include "comm/mpi_exchange.h"
#endif

namespace strata::comm {

#if defined(STRATA_HAVE_MPI)

namespace {

std::mutex g_mutex;
bool g_initialized = false;
std::atomic<int> g_abort_code{0};

using detail::mpi_error_text;

void end_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  const int code = g_abort_code.load();
  if (code != 0) {
    // Another rank may wait for this one inside a collective: stop them all now rather than let
    // them wait for their timeout. MPI_Abort does not return.
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  MPI_Finalize();
}

}  // namespace

bool mpi_built() {
  return true;
}

Status mpi_initialize(const LaunchInfo& expected) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_initialized) {
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (rc != MPI_SUCCESS) {
        return Status(ErrorCode::kUnavailable,
                      fmt::format("MPI_Init_thread failed: {}", mpi_error_text(rc)), "mpi");
      }
      std::atexit(end_mpi_at_exit);
      if (provided < MPI_THREAD_SERIALIZED) {
        return Status(ErrorCode::kUnavailable,
                      fmt::format("this MPI provides thread level {}; Strata needs "
                                  "MPI_THREAD_SERIALIZED ({}) to run collectives on a progress "
                                  "thread",
                                  provided, MPI_THREAD_SERIALIZED),
                      "mpi");
      }
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    g_initialized = true;
  }
  int size = 0;
  int rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size != expected.world_size || rank != expected.rank) {
    return Status(
        ErrorCode::kConfig,
        fmt::format(
            "MPI started this process as rank {} of {}, but the launcher's environment ({}) "
            "says rank {} of {}; on the CPU backend start the ranks with `mpirun -np {} "
            "strata ...` (or `srun --mpi=pmix`), which MPI can join",
            rank, size, expected.variables.empty() ? "none" : expected.variables, expected.rank,
            expected.world_size, expected.world_size),
        "mpi");
  }
  return Status::ok();
}

bool mpi_initialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_initialized;
}

Status mpi_broadcast_bytes(void* data, std::uint64_t bytes, double timeout_s) {
  if (!mpi_initialized()) {
    return Status(ErrorCode::kInternal, "mpi_broadcast_bytes before mpi_initialize", "mpi");
  }
  if (bytes > (std::uint64_t{1} << 30)) {
    return Status(ErrorCode::kInvalidArgument, "mpi_broadcast_bytes: more than 1 GiB", "mpi");
  }
  MPI_Request request = MPI_REQUEST_NULL;
  int rc = MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD, &request);
  if (rc != MPI_SUCCESS) {
    return Status(ErrorCode::kUnavailable, fmt::format("MPI_Ibcast: {}", mpi_error_text(rc)),
                  "mpi");
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  for (;;) {
    int done = 0;
    rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      mpi_abort_at_exit(1);
      return Status(ErrorCode::kUnavailable, fmt::format("MPI_Ibcast: {}", mpi_error_text(rc)),
                    "mpi");
    }
    if (done) return Status::ok();
    if (std::chrono::steady_clock::now() > deadline) {
      mpi_abort_at_exit(1);
      return Status(ErrorCode::kUnavailable,
                    fmt::format("rank 0's broadcast of {} bytes did not arrive within {} s "
                                "(strata.comm_timeout_s); a rank is missing or hangs",
                                bytes, timeout_s),
                    "mpi");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void mpi_abort_at_exit(int exit_code) {
  g_abort_code.store(exit_code == 0 ? 1 : exit_code);
}

#else  // !STRATA_HAVE_MPI

namespace {
Status no_mpi() {
  return Status(ErrorCode::kUnavailable,
                "this strata was built without MPI (install libopenmpi-dev with tools/setup.sh and "
                "rebuild)",
                "mpi");
}
}  // namespace

bool mpi_built() {
  return false;
}
Status mpi_initialize(const LaunchInfo&) {
  return no_mpi();
}
bool mpi_initialized() {
  return false;
}
Status mpi_broadcast_bytes(void*, std::uint64_t, double) {
  return no_mpi();
}
void mpi_abort_at_exit(int) {}

#endif

}  // namespace strata::comm
