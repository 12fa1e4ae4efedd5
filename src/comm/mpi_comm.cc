// The MPI Comm (mpi_comm.h): a fixed ring of queued operations, one progress thread that runs them
// in order through the exchange engine, and the watchdog that turns a silent rank into an error.
#include "comm/mpi_comm.h"

#include <fmt/format.h>

#if defined(STRATA_HAVE_MPI)

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/mpi_exchange.h"
#include "common/log.h"

namespace strata::comm {
namespace {

using Clock = std::chrono::steady_clock;

using detail::mpi_error_text;

std::string mpi_version_text() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "MPI";
  std::string version(text, static_cast<std::size_t>(length));
  const std::size_t comma = version.find(',');  // "Open MPI v4.1.4, package: ..."
  return comma == std::string::npos ? version : version.substr(0, comma);
}

Result<MPI_Datatype> builtin_type(DataType type) {
  switch (type) {
    case DataType::kF32:
      return MPI_FLOAT;
    case DataType::kF64:
      return MPI_DOUBLE;
    case DataType::kI32:
      return MPI_INT32_T;
    case DataType::kI64:
      return MPI_INT64_T;
    case DataType::kU8:
      return MPI_UINT8_T;
    case DataType::kBF16:
    case DataType::kF16:
      break;
  }
  return Status(ErrorCode::kInvalidArgument,
                fmt::format("MPI has no built-in reduction for {}", to_string(type)), "mpi");
}

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm comm, int rank, int world_size, const CommOptions& options)
      : Comm(rank, world_size, options),
        comm_(comm),
        exchange_(comm, rank, world_size),
        ring_(static_cast<std::size_t>(options.in_flight_max)),
        version_(mpi_version_text()) {
    thread_ = std::thread([this] { progress_loop(); });
  }

  ~MpiComm() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      stop_requested_.store(true);
    }
    work_.notify_all();
    thread_.join();
    // The duplicated communicator is not freed: MPI_Comm_free is collective, and a rank must not
    // wait here for the others; MPI_Finalize releases it.
    if (failed_.load() || completed_ != queued_) {
      // Operations were abandoned or failed: the other ranks cannot finish theirs, so this process
      // must end MPI with MPI_Abort, not wait in MPI_Finalize.
      mpi_abort_at_exit(1);
    }
  }

  const char* kind() const override { return "mpi"; }
  std::string description() const override {
    return fmt::format("MPI ({}), rank {} of {}, {} staging, {} operations in flight at most",
                       version_, rank(), world_size(), format_staging(), in_flight_max());
  }

  Result<bool> test(Handle handle) override {
    STRATA_TRY(check_handle(handle));
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.load()) return failure_;
    return completed_ >= handle.sequence;
  }

  Status wait(Handle handle) override {
    STRATA_TRY(check_handle(handle));
    std::unique_lock<std::mutex> lock(mutex_);
    // The progress thread's watchdog bounds this wait: the operation completes or fails.
    done_.wait(lock, [&] { return failed_.load() || completed_ >= handle.sequence; });
    if (failed_.load()) return failure_;
    return Status::ok();
  }

  Status health() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return failed_.load() ? failure_ : Status::ok();
  }

  Status run_builtin(const CollectiveOp& op) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (failed_.load()) return failure_;
    builtin_op_ = op;
    builtin_pending_ = true;
    builtin_status_ = Status::ok();
    work_.notify_all();
    done_.wait(lock, [&] { return !builtin_pending_ || failed_.load(); });
    if (failed_.load()) return failure_;
    return builtin_status_;
  }

 protected:
  Status issue(const CollectiveOp& op, std::uint64_t sequence) override {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto depth = static_cast<std::uint64_t>(in_flight_max());
    // Back-pressure: wait for the oldest operation to leave the ring (bounded by the watchdog).
    done_.wait(lock, [&] { return failed_.load() || sequence - completed_ <= depth; });
    if (failed_.load()) return failure_;
    STRATA_ASSERT(sequence == queued_ + 1);
    ring_[sequence % depth] = op;
    queued_ = sequence;
    work_.notify_all();
    return Status::ok();
  }

 private:
  Status check_handle(Handle handle) const {
    if (!handle.valid() || handle.sequence > issued()) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("handle {} was not issued by this comm (last issued: {})",
                                handle.sequence, issued()),
                    "comm mpi");
    }
    return Status::ok();
  }

  std::string format_staging() const {
    return fmt::format("{} MiB", exchange_.staging_bytes() >> 20);
  }

  void fail(Status status) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed_.load()) {
        failure_ = std::move(status);
        failed_.store(true);
      }
    }
    mpi_abort_at_exit(1);
    done_.notify_all();
  }

  // Runs one operation to completion or failure. Returns false when stopped or failed.
  bool run(const CollectiveOp& op, std::uint64_t sequence) {
    // The operation's name for errors, formatted only when one happens (no allocation per op).
    auto what = [&] {
      return fmt::format("comm mpi: rank {}: {} #{} ({} x {})", rank(), to_string(op.kind),
                         sequence, op.count, to_string(op.type));
    };
    if (Status s = exchange_.start(op, sequence); !s.is_ok()) {
      fail(s.with_context(what()));
      return false;
    }
    const auto timeout = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options().timeout_s));
    Clock::time_point last_progress = Clock::now();
    for (;;) {
      bool done = false;
      Result<int> moved = exchange_.poll(&done);
      if (!moved.is_ok()) {
        // A transport error (e.g. a lost TCP connection): say whose data was outstanding.
        fail(Status(moved.status().code(),
                    fmt::format("{} (while waiting for {})", moved.status().message(),
                                exchange_.waiting_for()),
                    what()));
        return false;
      }
      if (done) return true;
      const Clock::time_point now = Clock::now();
      if (*moved > 0) {
        last_progress = now;
        continue;
      }
      if (now - last_progress > timeout) {
        fail(Status(ErrorCode::kUnavailable,
                    fmt::format("{} sent nothing for {} s (strata.comm_timeout_s): it died or "
                                "hangs",
                                exchange_.waiting_for(), options().timeout_s),
                    what()));
        return false;
      }
      if (stop_requested_.load()) return false;
      // MPI moves data only inside its calls, so poll again at once while data flows; after
      // 200 us without progress, yield the core to the compute threads between polls.
      if (now - last_progress < std::chrono::microseconds(200)) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  Status run_builtin_now(const CollectiveOp& op) {
    const std::uint64_t size = data_type_bytes(op.type);
    STRATA_ASSIGN_OR_RETURN(MPI_Datatype type, builtin_type(op.type));
    const MPI_Op mpi_op = op.op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
    if (op.count > static_cast<std::uint64_t>(INT32_MAX)) {
      return Status(ErrorCode::kInvalidArgument, "count too large for MPI's int counts", "mpi");
    }
    const int n = static_cast<int>(op.count);
    int rc = MPI_SUCCESS;
    switch (op.kind) {
      case CollectiveKind::kAllGather: {
        const void* in_place = static_cast<const char*>(op.recv) + rank() * op.count * size;
        rc = MPI_Allgather(op.send == in_place ? MPI_IN_PLACE : op.send, n, type, op.recv, n, type,
                           comm_);
        break;
      }
      case CollectiveKind::kReduceScatter:
        rc = MPI_Reduce_scatter_block(op.send, op.recv, n, type, mpi_op, comm_);
        break;
      case CollectiveKind::kAllReduce:
        rc = MPI_Allreduce(op.send == op.recv ? MPI_IN_PLACE : op.send, op.recv, n, type, mpi_op,
                           comm_);
        break;
      case CollectiveKind::kBroadcast:
        rc = MPI_Bcast(op.recv, n, type, op.root, comm_);
        break;
      case CollectiveKind::kBarrier:
        rc = MPI_Barrier(comm_);
        break;
    }
    if (rc != MPI_SUCCESS) {
      return Status(ErrorCode::kUnavailable,
                    fmt::format("MPI's {} failed: {}", to_string(op.kind), mpi_error_text(rc)),
                    "mpi");
    }
    return Status::ok();
  }

  void progress_loop() {
    std::uint64_t next = 1;
    for (;;) {
      CollectiveOp op;
      bool builtin = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] {
          return stop_ || queued_ >= next || (builtin_pending_ && completed_ == queued_);
        });
        if (stop_) return;
        if (queued_ >= next) {
          op = ring_[next % ring_.size()];
        } else if (builtin_pending_ && completed_ == queued_) {
          op = builtin_op_;
          builtin = true;
        } else {
          continue;
        }
      }
      if (builtin) {
        Status s = run_builtin_now(op);
        std::lock_guard<std::mutex> lock(mutex_);
        builtin_status_ = std::move(s);
        builtin_pending_ = false;
        done_.notify_all();
        continue;
      }
      if (!run(op, next)) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        completed_ = next;
      }
      done_.notify_all();
      ++next;
    }
  }

  MPI_Comm comm_;
  detail::Exchange exchange_;
  std::vector<CollectiveOp> ring_;
  std::string version_;

  mutable std::mutex mutex_;
  std::condition_variable work_;  // progress thread: something queued, or stop
  std::condition_variable done_;  // callers: an operation completed, or the comm failed
  std::uint64_t queued_ = 0;      // sequence of the last queued operation
  std::uint64_t completed_ = 0;   // sequence of the last completed operation
  bool stop_ = false;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> failed_{false};
  Status failure_;
  bool builtin_pending_ = false;
  CollectiveOp builtin_op_;
  Status builtin_status_;
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<Comm>> create_mpi_comm(const CommOptions& options) {
  STRATA_TRY(validate(options));
  if (!mpi_initialized()) {
    return Status(ErrorCode::kInternal, "create_mpi_comm before mpi_initialize", "comm mpi");
  }
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc != MPI_SUCCESS) {
    return Status(ErrorCode::kUnavailable, fmt::format("MPI_Comm_dup: {}", mpi_error_text(rc)),
                  "comm mpi");
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  return std::unique_ptr<Comm>(std::make_unique<MpiComm>(comm, rank, size, options));
}

Status run_mpi_builtin(Comm& comm, const CollectiveOp& op) {
  auto* mpi = dynamic_cast<MpiComm*>(&comm);
  STRATA_ASSERT_MSG(mpi != nullptr, "run_mpi_builtin needs a Comm from create_mpi_comm");
  return mpi->run_builtin(op);
}

}  // namespace strata::comm

#else  // !STRATA_HAVE_MPI

namespace strata::comm {

Result<std::unique_ptr<Comm>> create_mpi_comm(const CommOptions&) {
  return Status(ErrorCode::kUnavailable,
                "this strata was built without MPI (install libopenmpi-dev with tools/setup.sh and "
                "rebuild)",
                "comm mpi");
}

Status run_mpi_builtin(Comm&, const CollectiveOp&) {
  return Status(ErrorCode::kUnavailable, "this strata was built without MPI", "comm mpi");
}

}  // namespace strata::comm

#endif
