// The NCCL Comm (nccl_comm.h). Everything that touches CUDA is compiled only with STRATA_HAVE_CUDA.
#include "comm/nccl_comm.h"

#include <fmt/format.h>

#include "comm/mpi_comm.h"

#if defined(STRATA_HAVE_CUDA)

#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>
#include <vector>

namespace strata::comm {
namespace {

using Clock = std::chrono::steady_clock;

Status cuda_failed(const char* call, cudaError_t rc) {
  return Status(
      ErrorCode::kUnavailable,
      fmt::format("{} failed: {} ({})", call, cudaGetErrorString(rc), cudaGetErrorName(rc)),
      "comm nccl");
}

nccl::DataTypeCode nccl_type(DataType type) {
  switch (type) {
    case DataType::kF32:
      return nccl::kFloat32;
    case DataType::kBF16:
      return nccl::kBfloat16;
    case DataType::kF16:
      return nccl::kFloat16;
    case DataType::kF64:
      return nccl::kFloat64;
    case DataType::kI32:
      return nccl::kInt32;
    case DataType::kI64:
      return nccl::kInt64;
    case DataType::kU8:
      return nccl::kUint8;
  }
  return nccl::kUint8;
}

class NcclComm final : public Comm {
 public:
  NcclComm(const nccl::Api& api, const NcclCommConfig& config)
      : Comm(config.rank, config.world_size, config.options),
        api_(api),
        device_(config.device),
        stream_(static_cast<cudaStream_t>(config.stream)),
        events_(static_cast<std::size_t>(config.options.in_flight_max), nullptr),
        issued_at_(static_cast<std::size_t>(config.options.in_flight_max)) {}

  ~NcclComm() override {
    if (comm_ != nullptr && failure_.is_ok()) (void)wait_all();
    if (comm_ != nullptr) {
      if (failure_.is_ok()) {
        api_.comm_destroy(comm_);
      } else {
        api_.comm_abort(comm_);
      }
    }
    for (cudaEvent_t event : events_) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    if (barrier_scratch_ != nullptr) cudaFree(barrier_scratch_);
    if (own_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status init(const nccl::UniqueId& id) {
    cudaError_t rc = cudaSetDevice(device_);
    if (rc != cudaSuccess) return cuda_failed("cudaSetDevice", rc);
    if (stream_ == nullptr) {
      rc = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
      if (rc != cudaSuccess) return cuda_failed("cudaStreamCreateWithFlags", rc);
      own_stream_ = true;
    }
    for (cudaEvent_t& event : events_) {
      rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (rc != cudaSuccess) return cuda_failed("cudaEventCreateWithFlags", rc);
    }
    // Four bytes of device memory for the barrier's all-reduce (outside the device budget).
    rc = cudaMalloc(&barrier_scratch_, 4);
    if (rc != cudaSuccess) return cuda_failed("cudaMalloc", rc);
    rc = cudaMemsetAsync(barrier_scratch_, 0, 4, stream_);
    if (rc != cudaSuccess) return cuda_failed("cudaMemsetAsync", rc);
    const nccl::Result r = api_.comm_init_rank(&comm_, world_size(), id, rank());
    if (r != nccl::kSuccess) {
      comm_ = nullptr;
      return Status(ErrorCode::kUnavailable,
                    fmt::format("ncclCommInitRank (rank {} of {}, device {}): {}", rank(),
                                world_size(), device_, nccl::error_text(api_, r)),
                    "comm nccl");
    }
    return Status::ok();
  }

  const char* kind() const override { return "nccl"; }
  std::string description() const override {
    return fmt::format("NCCL {}.{}.{} ({}), rank {} of {}, CUDA device {}", api_.version / 10000,
                       (api_.version % 10000) / 100, api_.version % 100, api_.library, rank(),
                       world_size(), device_);
  }

  Result<bool> test(Handle handle) override {
    STRATA_TRY(check_handle(handle));
    STRATA_TRY(failure_);
    while (completed_ < handle.sequence) {
      STRATA_ASSIGN_OR_RETURN(bool done, poll_next());
      if (!done) return false;
    }
    return true;
  }

  Status wait(Handle handle) override {
    STRATA_TRY(check_handle(handle));
    int idle_polls = 0;
    while (completed_ < handle.sequence) {
      STRATA_TRY(failure_);
      STRATA_ASSIGN_OR_RETURN(bool done, poll_next());
      if (done) {
        idle_polls = 0;
        continue;
      }
      const std::uint64_t next = completed_ + 1;
      const Clock::time_point since = std::max(last_completion_, issued_at_[slot(next)]);
      if (Clock::now() - since > timeout()) {
        api_.comm_abort(comm_);
        comm_ = nullptr;
        failure_ = Status(
            ErrorCode::kUnavailable,
            fmt::format("operation #{} did not complete within {} s (strata.comm_timeout_s): a "
                        "rank died or hangs (NCCL does not say which); the NCCL communicator was "
                        "aborted",
                        next, options().timeout_s),
            fmt::format("comm nccl: rank {}", rank()));
        mpi_abort_at_exit(1);  // under mpirun: take the job down, do not leave the others waiting
        return failure_;
      }
      if (++idle_polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return failure_;
  }

  Status health() const override { return failure_; }

  cudaStream_t stream() const { return stream_; }

 protected:
  Status issue(const CollectiveOp& op, std::uint64_t sequence) override {
    const auto depth = static_cast<std::uint64_t>(in_flight_max());
    if (sequence > depth) STRATA_TRY(wait(Handle{sequence - depth}));
    cudaError_t rc = cudaSetDevice(device_);
    if (rc != cudaSuccess) return fail(cuda_failed("cudaSetDevice", rc));
    const nccl::DataTypeCode type = nccl_type(op.type);
    const nccl::RedOpCode reduce = op.op == ReduceOp::kSum ? nccl::kSum : nccl::kMax;
    nccl::Result r = nccl::kSuccess;
    switch (op.kind) {
      case CollectiveKind::kAllGather:
        r = api_.all_gather(op.send, op.recv, op.count, type, comm_, stream_);
        break;
      case CollectiveKind::kReduceScatter:
        r = api_.reduce_scatter(op.send, op.recv, op.count, type, reduce, comm_, stream_);
        break;
      case CollectiveKind::kAllReduce:
        r = api_.all_reduce(op.send, op.recv, op.count, type, reduce, comm_, stream_);
        break;
      case CollectiveKind::kBroadcast:
        r = api_.broadcast(op.recv, op.recv, op.count, type, op.root, comm_, stream_);
        break;
      case CollectiveKind::kBarrier:
        r = api_.all_reduce(barrier_scratch_, barrier_scratch_, 1, nccl::kInt32, nccl::kSum, comm_,
                            stream_);
        break;
    }
    if (r != nccl::kSuccess) {
      return fail(Status(
          ErrorCode::kUnavailable,
          fmt::format("nccl {} #{}: {}", to_string(op.kind), sequence, nccl::error_text(api_, r)),
          fmt::format("comm nccl: rank {}", rank())));
    }
    rc = cudaEventRecord(events_[slot(sequence)], stream_);
    if (rc != cudaSuccess) return fail(cuda_failed("cudaEventRecord", rc));
    issued_at_[slot(sequence)] = Clock::now();
    return Status::ok();
  }

 private:
  std::size_t slot(std::uint64_t sequence) const {
    return static_cast<std::size_t>(sequence % events_.size());
  }
  Clock::duration timeout() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options().timeout_s));
  }
  Status check_handle(Handle handle) const {
    if (!handle.valid() || handle.sequence > issued()) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("handle {} was not issued by this comm (last issued: {})",
                                handle.sequence, issued()),
                    "comm nccl");
    }
    return Status::ok();
  }
  Status fail(Status status) {
    if (failure_.is_ok()) failure_ = std::move(status);
    return failure_;
  }
  // Whether the oldest incomplete operation has completed; records it when it has.
  Result<bool> poll_next() {
    const std::uint64_t next = completed_ + 1;
    const cudaError_t rc = cudaEventQuery(events_[slot(next)]);
    if (rc == cudaSuccess) {
      completed_ = next;
      last_completion_ = Clock::now();
      return true;
    }
    if (rc != cudaErrorNotReady) return fail(cuda_failed("cudaEventQuery", rc));
    nccl::Result async = nccl::kSuccess;
    if (api_.comm_get_async_error(comm_, &async) == nccl::kSuccess && async != nccl::kSuccess &&
        async != nccl::kInProgress) {
      api_.comm_abort(comm_);
      comm_ = nullptr;
      return fail(
          Status(ErrorCode::kUnavailable,
                 fmt::format("operation #{} failed: {}", next, nccl::error_text(api_, async)),
                 fmt::format("comm nccl: rank {}", rank())));
    }
    return false;
  }

  const nccl::Api& api_;
  int device_;
  cudaStream_t stream_;
  bool own_stream_ = false;
  nccl::CommHandle comm_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::vector<Clock::time_point> issued_at_;
  Clock::time_point last_completion_{};
  std::uint64_t completed_ = 0;
  void* barrier_scratch_ = nullptr;
  Status failure_;
};

}  // namespace

Status nccl_usable() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status(ErrorCode::kUnavailable,
                  rc != cudaSuccess ? fmt::format("no usable GPU: {}", cudaGetErrorString(rc))
                                    : "no GPU is visible",
                  "comm nccl");
  }
  STRATA_ASSIGN_OR_RETURN(const nccl::Api* api, nccl::load_api());
  (void)api;
  return Status::ok();
}

Result<nccl::UniqueId> nccl_unique_id() {
  STRATA_ASSIGN_OR_RETURN(const nccl::Api* api, nccl::load_api());
  nccl::UniqueId id{};
  const nccl::Result r = api->get_unique_id(&id);
  if (r != nccl::kSuccess) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("ncclGetUniqueId: {}", nccl::error_text(*api, r)), "comm nccl");
  }
  return id;
}

Result<std::unique_ptr<Comm>> create_nccl_comm(const NcclCommConfig& config) {
  STRATA_TRY(validate(config.options));
  if (config.world_size < 1 || config.rank < 0 || config.rank >= config.world_size) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("rank {} of {} is not a valid rank", config.rank, config.world_size),
                  "comm nccl");
  }
  STRATA_TRY(nccl_usable());
  STRATA_ASSIGN_OR_RETURN(const nccl::Api* api, nccl::load_api());
  auto comm = std::make_unique<NcclComm>(*api, config);
  STRATA_TRY(comm->init(config.id));
  return std::unique_ptr<Comm>(std::move(comm));
}

void* nccl_stream(Comm& comm) {
  auto* nccl_comm = dynamic_cast<NcclComm*>(&comm);
  STRATA_ASSERT_MSG(nccl_comm != nullptr, "nccl_stream needs a Comm from create_nccl_comm");
  return nccl_comm->stream();
}

}  // namespace strata::comm

#else  // !STRATA_HAVE_CUDA

namespace strata::comm {

namespace {
Status no_cuda() {
  return Status(ErrorCode::kUnavailable,
                "this strata was built without CUDA, so it has no NCCL transport", "comm nccl");
}
}  // namespace

Status nccl_usable() {
  return no_cuda();
}
Result<nccl::UniqueId> nccl_unique_id() {
  return no_cuda();
}
Result<std::unique_ptr<Comm>> create_nccl_comm(const NcclCommConfig&) {
  return no_cuda();
}
void* nccl_stream(Comm&) {
  STRATA_ASSERT_MSG(false, "nccl_stream without CUDA");
  return nullptr;
}

}  // namespace strata::comm

#endif
