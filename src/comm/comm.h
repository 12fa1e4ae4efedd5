// Collectives between the data-parallel ranks of one training run. src/comm/ owns how ranks find
// each other (launch.h), where each rank runs (binding.h), and how they exchange data: the Comm
// interface below, with one implementation per transport:
//   - single rank: no transport; the collectives are copies (create_single_comm);
//   - MPI (OpenMPI) for the CPU backend, over host memory (mpi_comm.h);
//   - NCCL for the CUDA backend, over device memory, NCCL opened at run time (nccl_comm.h).
// world.h puts them together: join_world() reads the launcher, binds, and builds the Comm.
//
// Every collective is asynchronous: it is queued and returns a Handle; test() and wait() tell when
// it has completed. Operations of one Comm run one after another in issue order, and every rank
// must issue the same operations in the same order with the same counts, types, ops and roots
// (as with NCCL and MPI). At most in_flight_max() operations are queued or running; issuing one
// more first waits for the oldest to complete. Errors are values: a failed operation (a rank lost
// or silent for longer than the timeout, a transport error) fails every later call of that Comm
// with the same Status, which names the rank(s) at fault where the transport can tell. A Comm is
// used from one thread (the trainer's, or the scheduler's); its transport may run its own threads.
// Destroy it after wait_all(): a Comm destroyed with operations outstanding makes the process end
// MPI with MPI_Abort (the other ranks could not finish them).
//
// Summation order (the determinism contract): a sum over ranks is computed as a left fold in rank
// order, ((x_0 + x_1) + x_2) + ... + x_{W-1}, element by element, in fp32 for fp32/bf16/fp16
// data (16-bit results are rounded once, at the end), in fp64 for fp64 and in 64-bit integers for
// integer data. So results are bit-identical from run to run and across ranks, and equal to what
// one rank gets by accumulating the W inputs one after another in rank order. NCCL's order is its
// own (nccl_comm.h); it is reproducible on a fixed machine and configuration, not equal to the
// fold.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace strata::comm {

enum class DataType : std::uint8_t { kF32 = 0, kBF16, kF16, kF64, kI32, kI64, kU8 };
// Bytes per element.
std::uint64_t data_type_bytes(DataType type);
// "fp32", "bf16", "fp16", "fp64", "int32", "int64", "uint8".
const char* to_string(DataType type);

// kMax propagates NaN: the maximum of NaN and anything is NaN (so an inf/NaN flag survives).
enum class ReduceOp : std::uint8_t { kSum = 0, kMax };
const char* to_string(ReduceOp op);

enum class CollectiveKind : std::uint8_t {
  kAllGather = 0,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier
};
const char* to_string(CollectiveKind kind);

// Names one queued operation: its sequence number (1, 2, ... in issue order) on its Comm.
struct Handle {
  std::uint64_t sequence = 0;
  bool valid() const { return sequence != 0; }
};

// Limits shared by the transports. Every rank must use the same values.
struct CommOptions {
  // An operation that makes no progress for this long fails, naming the ranks it waits for.
  double timeout_s = 300.0;
  // Operations queued or running at once; issuing one more waits for the oldest.
  int in_flight_max = 16;
};

// One collective as the transports see it (the public methods below fill it in).
struct CollectiveOp {
  CollectiveKind kind = CollectiveKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::uint64_t count = 0;  // elements: per rank (all-gather, reduce-scatter) or in total
  DataType type = DataType::kU8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;  // broadcast
};

class Comm {
 public:
  virtual ~Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // This process's rank, 0 <= rank() < world_size().
  int rank() const { return rank_; }
  // Number of ranks.
  int world_size() const { return world_size_; }
  // The transport: "single", "mpi" or "nccl".
  virtual const char* kind() const = 0;
  // One line for logs: transport, library version, ranks, device.
  virtual std::string description() const = 0;
  // Operations that may be queued or running at once.
  int in_flight_max() const { return options_.in_flight_max; }
  // The limits this Comm was built with.
  const CommOptions& options() const { return options_; }

  // recv[r * count .. (r+1) * count) = rank r's send[0 .. count), for every rank r. In place when
  // send == recv + rank() * count * bytes; other overlaps are kInvalidArgument.
  Result<Handle> all_gather(const void* send, void* recv, std::uint64_t count, DataType type);
  // recv[0 .. count) = op over ranks r of rank r's send[rank() * count .. (rank()+1) * count):
  // rank k receives the k-th block of the reduction. In place when recv == send + rank() * count
  // * bytes.
  Result<Handle> reduce_scatter(const void* send, void* recv, std::uint64_t count, DataType type,
                                ReduceOp op);
  // recv[0 .. count) = op over ranks of send[0 .. count), on every rank. In place when send ==
  // recv.
  Result<Handle> all_reduce(const void* send, void* recv, std::uint64_t count, DataType type,
                            ReduceOp op);
  // buffer[0 .. count) on every rank = buffer on rank `root`.
  Result<Handle> broadcast(void* buffer, std::uint64_t count, DataType type, int root);
  // Completes on a rank once every rank has issued its barrier.
  Result<Handle> barrier();

  // Whether the operation has completed (and every one issued before it); never blocks. Errors:
  // the Comm's failure, or kInvalidArgument for a handle this Comm did not issue.
  virtual Result<bool> test(Handle handle) = 0;
  // Blocks until the operation (and every one issued before it) has completed, or fails: a rank
  // lost or silent for options().timeout_s, or a transport error. Never blocks forever.
  virtual Status wait(Handle handle) = 0;
  // Waits for every operation issued so far.
  Status wait_all();
  // Ok, or the failure that made this Comm unusable (sticky).
  virtual Status health() const = 0;
  // Sequence number of the last operation issued (0 before the first).
  std::uint64_t issued() const { return issued_; }

 protected:
  Comm(int rank, int world_size, const CommOptions& options);
  // Queues a validated operation with sequence number `sequence` (issued() + 1). Called by the
  // public methods after argument checks.
  virtual Status issue(const CollectiveOp& op, std::uint64_t sequence) = 0;

 private:
  Result<Handle> submit(const CollectiveOp& op);

  int rank_ = 0;
  int world_size_ = 1;
  CommOptions options_;
  std::uint64_t issued_ = 0;
};

// Checks `options` (timeout > 0, 1 <= in_flight_max <= 4096). kInvalidArgument naming the field.
Status validate(const CommOptions& options);

// The single-rank Comm: every collective is a copy (or nothing, in place), done when issued.
std::unique_ptr<Comm> create_single_comm(const CommOptions& options = {});

}  // namespace strata::comm
