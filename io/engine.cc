#include "io/engine.h"

#include "common/log.h"
#include "io/posix/posix_engine.h"
#include "io/probe.h"
#include "io/sim/sim_engine.h"
#include "io/uring/uring_engine.h"

namespace strata::io {

const char* engine_kind_name(EngineKind kind) {
  switch (kind) {
    case EngineKind::kAuto:
      return "auto";
    case EngineKind::kUring:
      return "uring";
    case EngineKind::kPosix:
      return "posix";
    case EngineKind::kSim:
      return "sim";
  }
  return "?";
}

std::optional<EngineKind> parse_engine_kind(std::string_view text) {
  for (EngineKind kind :
       {EngineKind::kAuto, EngineKind::kUring, EngineKind::kPosix, EngineKind::kSim}) {
    if (text == engine_kind_name(kind)) return kind;
  }
  return std::nullopt;
}

Status validate(const EngineOptions& o) {
  auto bad = [](const std::string& message) {
    return Status(ErrorCode::kInvalidArgument, message);
  };
  constexpr std::uint64_t kBlockMax = 256ull << 20;
  if (o.block_size_bytes == 0 || o.block_size_bytes % 4096 != 0 || o.block_size_bytes > kBlockMax) {
    return bad(fmt::format("block size {} must be a multiple of 4096 between 4096 and {}",
                           o.block_size_bytes, kBlockMax));
  }
  if (o.queue_depth < 1 || o.queue_depth > 1024) {
    return bad(fmt::format("queue depth {} must be between 1 and 1024", o.queue_depth));
  }
  if (o.threads < 1 || o.threads > 64) {
    return bad(fmt::format("I/O threads {} must be between 1 and 64", o.threads));
  }
  if (o.requests_max < 1 || o.requests_max > 65536) {
    return bad(fmt::format("requests_max {} must be between 1 and 65536", o.requests_max));
  }
  if (o.files_max < 1 || o.files_max > 1024) {
    return bad(fmt::format("files_max {} must be between 1 and 1024", o.files_max));
  }
  if (o.buffers_max < 1 || o.buffers_max > 1024) {
    return bad(fmt::format("buffers_max {} must be between 1 and 1024", o.buffers_max));
  }
  return Status::ok();
}

Result<std::unique_ptr<IoEngine>> make_engine(const EngineOptions& options) {
  STRATA_TRY(validate(options));
  switch (options.kind) {
    case EngineKind::kUring:
      return make_uring_engine(options);
    case EngineKind::kPosix:
      return make_posix_engine(options);
    case EngineKind::kSim:
      return make_sim_engine(options, SimOptions{});
    case EngineKind::kAuto:
      break;
  }
  UringProbe probe = probe_io_uring();
  std::string why = probe.error;
  if (probe.available) {
    auto uring = make_uring_engine(options);
    if (uring.is_ok()) return uring;
    why = uring.status().message();
  }
  STRATA_LOG_WARN(
      "io_uring cannot be used on this machine (kernel {}: {}); falling back to a pread/pwrite "
      "thread pool, which costs CPU and some throughput",
      probe.kernel_release, why);
  return make_posix_engine(options);
}

}  // namespace strata::io
