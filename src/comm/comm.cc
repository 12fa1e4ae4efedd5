// The Comm interface's argument checks, shared by every transport, and the single-rank Comm.
#include "comm/comm.h"

#include <fmt/format.h>

#include <cstring>

namespace strata::comm {

std::uint64_t data_type_bytes(DataType type) {
  switch (type) {
    case DataType::kF32:
    case DataType::kI32:
      return 4;
    case DataType::kBF16:
    case DataType::kF16:
      return 2;
    case DataType::kF64:
    case DataType::kI64:
      return 8;
    case DataType::kU8:
      return 1;
  }
  return 1;
}

const char* to_string(DataType type) {
  switch (type) {
    case DataType::kF32:
      return "fp32";
    case DataType::kBF16:
      return "bf16";
    case DataType::kF16:
      return "fp16";
    case DataType::kF64:
      return "fp64";
    case DataType::kI32:
      return "int32";
    case DataType::kI64:
      return "int64";
    case DataType::kU8:
      return "uint8";
  }
  return "unknown";
}

const char* to_string(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : "max";
}

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "unknown";
}

Status validate(const CommOptions& options) {
  if (!(options.timeout_s > 0.0)) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("comm timeout {} s is invalid; valid: more than 0", options.timeout_s));
  }
  if (options.in_flight_max < 1 || options.in_flight_max > 4096) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("comm in_flight_max {} is invalid; valid: 1 to 4096", options.in_flight_max));
  }
  return Status::ok();
}

Comm::Comm(int rank, int world_size, const CommOptions& options)
    : rank_(rank), world_size_(world_size), options_(options) {
  STRATA_ASSERT(world_size >= 1);
  STRATA_ASSERT(rank >= 0 && rank < world_size);
}

namespace {

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, std::uint64_t a_bytes, const void* b, std::uint64_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

Status bad_argument(const CollectiveOp& op, const std::string& why) {
  return Status(ErrorCode::kInvalidArgument, why, fmt::format("comm {}", to_string(op.kind)));
}

}  // namespace

Result<Handle> Comm::submit(const CollectiveOp& op) {
  constexpr std::uint64_t kCountMax = std::uint64_t{1} << 50;
  if (op.count > kCountMax) {
    return bad_argument(op,
                        fmt::format("count {} is larger than the most supported, 2^50", op.count));
  }
  const std::uint64_t size = data_type_bytes(op.type);
  const auto w = static_cast<std::uint64_t>(world_size_);
  const auto r = static_cast<std::uint64_t>(rank_);
  const std::uint64_t bytes = op.count * size;
  if (op.kind != CollectiveKind::kBarrier && op.count != 0 && op.recv == nullptr) {
    return bad_argument(op, "the receive buffer is null");
  }
  if ((op.kind == CollectiveKind::kAllGather || op.kind == CollectiveKind::kReduceScatter ||
       op.kind == CollectiveKind::kAllReduce) &&
      op.count != 0 && op.send == nullptr) {
    return bad_argument(op, "the send buffer is null");
  }
  switch (op.kind) {
    case CollectiveKind::kAllGather: {
      const char* in_place = static_cast<const char*>(op.recv) + r * bytes;
      if (op.send != in_place && overlap(op.send, bytes, op.recv, w * bytes)) {
        return bad_argument(
            op,
            "send and receive buffers overlap; valid: disjoint, or send == recv + rank * count");
      }
      break;
    }
    case CollectiveKind::kReduceScatter: {
      const char* in_place = static_cast<const char*>(op.send) + r * bytes;
      if (op.recv != in_place && overlap(op.send, w * bytes, op.recv, bytes)) {
        return bad_argument(
            op,
            "send and receive buffers overlap; valid: disjoint, or recv == send + rank * count");
      }
      break;
    }
    case CollectiveKind::kAllReduce:
      if (op.send != op.recv && overlap(op.send, bytes, op.recv, bytes)) {
        return bad_argument(op,
                            "send and receive buffers overlap; valid: disjoint, or send == recv");
      }
      break;
    case CollectiveKind::kBroadcast:
      if (op.root < 0 || op.root >= world_size_) {
        return bad_argument(
            op, fmt::format("root {} is not a rank; valid: 0 to {}", op.root, world_size_ - 1));
      }
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  STRATA_TRY(health());
  const std::uint64_t sequence = issued_ + 1;
  STRATA_TRY(issue(op, sequence));
  issued_ = sequence;
  return Handle{sequence};
}

Result<Handle> Comm::all_gather(const void* send, void* recv, std::uint64_t count, DataType type) {
  CollectiveOp op;
  op.kind = CollectiveKind::kAllGather;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.type = type;
  return submit(op);
}

Result<Handle> Comm::reduce_scatter(const void* send, void* recv, std::uint64_t count,
                                    DataType type, ReduceOp reduce) {
  CollectiveOp op;
  op.kind = CollectiveKind::kReduceScatter;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.type = type;
  op.op = reduce;
  return submit(op);
}

Result<Handle> Comm::all_reduce(const void* send, void* recv, std::uint64_t count, DataType type,
                                ReduceOp reduce) {
  CollectiveOp op;
  op.kind = CollectiveKind::kAllReduce;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.type = type;
  op.op = reduce;
  return submit(op);
}

Result<Handle> Comm::broadcast(void* buffer, std::uint64_t count, DataType type, int root) {
  CollectiveOp op;
  op.kind = CollectiveKind::kBroadcast;
  op.send = buffer;
  op.recv = buffer;
  op.count = count;
  op.type = type;
  op.root = root;
  return submit(op);
}

Result<Handle> Comm::barrier() {
  CollectiveOp op;
  op.kind = CollectiveKind::kBarrier;
  return submit(op);
}

Status Comm::wait_all() {
  if (issued_ == 0) return health();
  return wait(Handle{issued_});
}

// ---- the single-rank Comm ---------------------------------------------------------------------

namespace {

class SingleComm final : public Comm {
 public:
  explicit SingleComm(const CommOptions& options) : Comm(0, 1, options) {}

  const char* kind() const override { return "single"; }
  std::string description() const override { return "single rank (no transport)"; }

  Result<bool> test(Handle handle) override {
    if (!handle.valid() || handle.sequence > issued()) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("handle {} was not issued by this comm (last issued: {})",
                                handle.sequence, issued()));
    }
    return true;
  }
  Status wait(Handle handle) override {
    STRATA_ASSIGN_OR_RETURN(bool done, test(handle));
    STRATA_ASSERT(done);
    return Status::ok();
  }
  Status health() const override { return Status::ok(); }

 protected:
  Status issue(const CollectiveOp& op, std::uint64_t /*sequence*/) override {
    // With one rank every collective is the identity: a sum or maximum over one input is that
    // input, bit for bit.
    const std::uint64_t bytes = op.count * data_type_bytes(op.type);
    if (op.kind != CollectiveKind::kBroadcast && op.kind != CollectiveKind::kBarrier &&
        op.send != op.recv && bytes != 0) {
      std::memcpy(op.recv, op.send, bytes);
    }
    return Status::ok();
  }
};

}  // namespace

std::unique_ptr<Comm> create_single_comm(const CommOptions& options) {
  return std::make_unique<SingleComm>(options);
}

}  // namespace strata::comm
