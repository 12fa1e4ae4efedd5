// MPI for the CPU backend: process-wide MPI start and end, and a Comm over host memory.
//
// Transport: OpenMPI's point-to-point messages (MPI_Isend/MPI_Irecv) on a private duplicate of
// MPI_COMM_WORLD; the collectives' arithmetic is Strata's own, so that the summation order is the
// one comm.h promises whatever MPI implementation runs underneath (MPI leaves the order of its
// built-in reductions unspecified). Algorithms, all "direct" (every rank exchanges with every
// other rank, so a silent rank is named by everyone waiting for it):
//   - all-gather: each rank sends its block to every other rank;
//   - reduce-scatter: each rank sends block k to rank k, which folds the W blocks in rank order;
//   - all-reduce: reduce-scatter on W nearly equal blocks, then all-gather of the results;
//   - broadcast: from the root directly (small), else scatter + all-gather;
//   - barrier: an empty message from every rank to every other.
// Each rank sends and receives (W-1)/W of the data per phase, as a ring would. Messages are cut
// into segments (4 MiB for 2 ranks; smaller with more ranks so that staging stays ~32 MiB) with two
// segments per peer in flight, so receiving segment s+1 overlaps folding segment s.
//
// Operations run on one progress thread per Comm, in issue order; it is the only thread that calls
// MPI after start-up (MPI_THREAD_SERIALIZED). It polls its requests with a short back-off and a
// watchdog: when no request completes for CommOptions::timeout_s, the operation fails naming the
// ranks whose messages are missing, and the Comm stays failed.
#pragma once

#include <memory>

#include "comm/comm.h"
#include "comm/launch.h"

namespace strata::comm {

// Whether this strata was built with MPI (libopenmpi-dev at build time).
bool mpi_built();

// Starts MPI once per process (MPI_Init_thread, MPI_THREAD_SERIALIZED) and registers its end at
// process exit. Checks that the MPI world matches `expected` (a singleton MPI_Init under a
// non-MPI launcher sees a world of 1). Errors: kUnavailable (built without MPI, MPI_Init failed,
// thread level too low), kConfig (world size or rank disagree with the launcher).
Status mpi_initialize(const LaunchInfo& expected);
// Whether mpi_initialize() succeeded in this process.
bool mpi_initialized();
// Copies `bytes` from world rank 0's `data` into every rank's `data` over MPI_COMM_WORLD, with a
// deadline (used to hand NCCL's unique id around before any Comm exists).
Status mpi_broadcast_bytes(void* data, std::uint64_t bytes, double timeout_s);
// Asks that, at process exit, MPI end with MPI_Abort(exit_code) (which stops every rank at once)
// instead of MPI_Finalize (which waits for all of them). Call it when this rank is about to exit
// with an error; failed Comms call it themselves. No-op without MPI.
void mpi_abort_at_exit(int exit_code);

// A Comm over MPI_COMM_WORLD (duplicated). mpi_initialize() must have succeeded. Errors:
// kUnavailable without MPI, kInvalidArgument for bad options. Destroy it only after wait_all().
Result<std::unique_ptr<Comm>> create_mpi_comm(const CommOptions& options);

// MPI's own collective for `op` (MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce, MPI_Bcast,
// MPI_Barrier), run on `comm`'s progress thread after the operations queued before it; blocks
// until done, without the watchdog. Only for `strata bench comm`'s baseline; fp32/fp64/integer
// types only. `comm` must come from create_mpi_comm().
Status run_mpi_builtin(Comm& comm, const CollectiveOp& op);

}  // namespace strata::comm
