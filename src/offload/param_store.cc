// ParamStore (param_store.h): the units' extents in one swap space, and the blocking reads and
// writes over it, direct or through an aligned bounce buffer.
#include "offload/param_store.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/log.h"
#include "common/thread_priority.h"
#include "common/units.h"
#include "io/probe.h"

namespace strata::offload {
namespace {

// Swap operations outstanding at once: one per read() or write() in flight, so far above the
// threads a caller uses (a prefetcher and the training loop). The engine needs two requests per
// operation with checksums (the extent and its footer).
constexpr std::uint32_t kOperationsMax = 64;
constexpr std::uint32_t kRequestsPerOperation = 2;
// A unit, and the swap file, at most: far beyond any drive, and safe from overflow below.
constexpr std::uint64_t kBytesMax = std::uint64_t{1} << 56;

Status invalid(const std::string& what, const std::string& message) {
  return Status(ErrorCode::kInvalidArgument, message, what);
}

// The swap space's kind name: the file is strata-param-r0.swp in each run folder.
constexpr const char* kKindName = "param";

}  // namespace

void ParamStore::Bounce::operator()(void* p) const {
  std::free(p);
}

Result<std::unique_ptr<ParamStore>> ParamStore::create(
    const ParamStoreSettings& settings, const std::vector<std::uint64_t>& unit_bytes) {
  if (unit_bytes.empty()) return invalid("unit_bytes", "a parameter store needs at least one unit");
  for (std::size_t u = 0; u < unit_bytes.size(); ++u) {
    if (unit_bytes[u] == 0 || unit_bytes[u] > kBytesMax) {
      return invalid("unit_bytes", fmt::format("unit {} has {} bytes; valid: 1 to {}", u,
                                               unit_bytes[u], kBytesMax));
    }
  }
  if (settings.dirs.empty() || settings.dirs.size() > io::kStripesMax) {
    return Status(ErrorCode::kConfig,
                  fmt::format("the parameters' swap file needs 1 to {} folders on the NVMe "
                              "drive(s), got {}; give a path or a list of paths",
                              io::kStripesMax, settings.dirs.size()),
                  kPathKey);
  }
  // Each folder probed as the tier manager's (TierManager::check_paths); the strictest
  // alignment pads the units.
  std::uint32_t alignment = 4096;
  for (const std::string& dir : settings.dirs) {
    auto probe = io::probe_swap_folder(dir, kPathKey);
    if (!probe.is_ok()) return probe.status();
    alignment = std::max(alignment, io::required_alignment(*probe));
  }

  std::unique_ptr<ParamStore> store(new ParamStore());
  ParamStore& s = *store;
  s.checksum_ = settings.checksum;
  io::EngineOptions eo = settings.engine;
  eo.requests_max = kOperationsMax * kRequestsPerOperation;
  {
    // The engine's threads reap completions: above busy compute threads under chrt.
    ServiceThreadPriority service;
    if (settings.engine_factory) {
      STRATA_ASSIGN_OR_RETURN(s.engine_, settings.engine_factory(eo));
    } else {
      STRATA_ASSIGN_OR_RETURN(s.engine_, io::make_engine(eo));
    }
  }
  // The files may ask for more alignment than the probes said (a second look at the same
  // device): then the layout is made again with theirs.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::uint64_t footer = settings.checksum ? alignment : 0;
    std::uint64_t capacity = 0;
    for (std::uint64_t bytes : unit_bytes)
      capacity += align_up(bytes, alignment) + footer;
    if (capacity > kBytesMax) {
      return invalid("unit_bytes", fmt::format("the units need {} bytes; valid: at most {}",
                                               capacity, kBytesMax));
    }
    if (settings.bytes_max > 0 && capacity > settings.bytes_max) {
      return Status(ErrorCode::kConfig,
                    fmt::format("the parameters' swap file needs {} ({} bytes, {} unit{}{}) but "
                                "strata.nvme_bytes_max leaves {} ({} bytes); raise it or store "
                                "fewer parameters on NVMe",
                                format_bytes(capacity), capacity, unit_bytes.size(),
                                unit_bytes.size() == 1 ? "" : "s",
                                settings.checksum ? " with their checksum blocks" : "",
                                format_bytes(settings.bytes_max), settings.bytes_max),
                    kBudgetKey);
    }
    io::SwapOptions so;
    so.dirs = settings.dirs;
    so.tag = settings.swap_tag.empty() ? fmt::format("p{}", ::getpid()) : settings.swap_tag;
    so.checksums = settings.checksum;
    so.operations_max = kOperationsMax;
    so.kinds.push_back({kKindName, capacity});
    auto space = io::SwapSpace::create(s.engine_.get(), so);
    if (!space.is_ok()) return space.status().with_context(kPathKey);
    if ((*space)->alignment_bytes() > alignment && attempt == 0) {
      alignment = (*space)->alignment_bytes();
      continue;  // the space's destructor removes what it made
    }
    s.space_ = std::move(*space);
    s.alignment_ = alignment;
    s.nvme_bytes_ = capacity;
    break;
  }
  if (s.space_ == nullptr || s.space_->alignment_bytes() > s.alignment_) {
    return Status(ErrorCode::kIo, "the swap file's alignment changed while it was made", kPathKey);
  }
  // Extents in unit order, so a pass over the units streams the file.
  s.units_.resize(unit_bytes.size());
  for (std::size_t u = 0; u < unit_bytes.size(); ++u) {
    Unit& unit = s.units_[u];
    unit.bytes = unit_bytes[u];
    auto extent = s.space_->allocate(0, align_up(unit.bytes, s.alignment_));
    if (!extent.is_ok()) return extent.status().with_context(kPathKey);
    unit.extent = *extent;
    s.bounce_bytes_ = std::max(s.bounce_bytes_, unit.extent.length_bytes);
  }
  s.unit_locks_ = std::make_unique<std::shared_mutex[]>(unit_bytes.size());
  s.run_dirs_ = s.space_->run_dirs();
  return store;
}

ParamStore::~ParamStore() {
  Status closed = close();
  if (!closed.is_ok()) STRATA_LOG_WARN("parameter store: {}", closed.to_string());
}

std::uint64_t ParamStore::padded_bytes(int u) const {
  return units_[static_cast<std::size_t>(u)].extent.length_bytes;
}

Status ParamStore::check_call(int u, const void* buffer, std::uint64_t room,
                              const char* what) const {
  if (u < 0 || u >= units()) {
    return invalid("unit", fmt::format("{} is not a unit; valid: 0 to {}", u, units() - 1));
  }
  if (buffer == nullptr) return invalid(what, "no buffer");
  if (room < unit_bytes(u)) {
    return invalid(what, fmt::format("{} bytes is too small for unit {}; valid: at least {} bytes",
                                     room, u, unit_bytes(u)));
  }
  return Status::ok();
}

Result<ParamStore::BounceBuffer> ParamStore::take_bounce() {
  {
    std::lock_guard<std::mutex> lock(bounce_mu_);
    if (!bounce_free_.empty()) {
      BounceBuffer b = std::move(bounce_free_.back());
      bounce_free_.pop_back();
      return b;
    }
  }
  void* raw = nullptr;
  if (::posix_memalign(&raw, alignment_, bounce_bytes_) != 0) {
    return Status(ErrorCode::kOutOfMemory,
                  fmt::format("cannot allocate a bounce buffer of {} for an unaligned buffer",
                              format_bytes(bounce_bytes_)));
  }
  std::lock_guard<std::mutex> lock(bounce_mu_);
  ++bounce_made_;
  return BounceBuffer(static_cast<std::uint8_t*>(raw));
}

void ParamStore::give_bounce(BounceBuffer buffer) {
  std::lock_guard<std::mutex> lock(bounce_mu_);
  bounce_free_.push_back(std::move(buffer));
}

Status ParamStore::move(int u, void* buffer, bool read) {
  const io::Extent& e = units_[static_cast<std::size_t>(u)].extent;
  auto handle = read ? space_->read(e, buffer, io::Priority::kDemand)
                     : space_->write(e, buffer, io::Priority::kDemand);
  if (!handle.is_ok()) return handle.status();
  return space_->wait(*handle);
}

namespace {

bool aligned(const void* p, std::uint32_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

Status closed_error() {
  return Status(ErrorCode::kInvalidArgument,
                "the parameter store is closed (its swap file is removed); make a new one",
                "ParamStore");
}

std::string unit_context(int u, bool read) {
  return fmt::format("{} of parameter unit {}", read ? "read" : "write", u);
}

}  // namespace

Status ParamStore::read(int u, void* out, std::uint64_t room) {
  std::shared_lock<std::shared_mutex> life(life_);
  if (closed_) return closed_error();
  STRATA_TRY(check_call(u, out, room, "out"));
  std::shared_lock<std::shared_mutex> lock(unit_locks_[static_cast<std::size_t>(u)]);
  const Unit& unit = units_[static_cast<std::size_t>(u)];
  if (!unit.written) {
    return invalid("unit", fmt::format("unit {} was never written (or its last write failed); "
                                       "write it before reading it",
                                       u));
  }
  const std::uint64_t padded = unit.extent.length_bytes;
  Status status;
  if (aligned(out, alignment_) && room >= padded) {
    status = move(u, out, true);
  } else {
    STRATA_ASSIGN_OR_RETURN(BounceBuffer bounce, take_bounce());
    status = move(u, bounce.get(), true);
    if (status.is_ok()) std::memcpy(out, bounce.get(), unit.bytes);
    give_bounce(std::move(bounce));
  }
  if (!status.is_ok()) return status.with_context(unit_context(u, true));
  read_bytes_ += unit.bytes;
  io_read_bytes_ += padded;
  ++reads_;
  return Status::ok();
}

Status ParamStore::write(int u, const void* src, std::uint64_t room) {
  std::shared_lock<std::shared_mutex> life(life_);
  if (closed_) return closed_error();
  STRATA_TRY(check_call(u, src, room, "src"));
  std::unique_lock<std::shared_mutex> lock(unit_locks_[static_cast<std::size_t>(u)]);
  Unit& unit = units_[static_cast<std::size_t>(u)];
  unit.written = false;
  const std::uint64_t padded = unit.extent.length_bytes;
  Status status;
  if (aligned(src, alignment_) && room >= padded) {
    // The swap space only reads the buffer of a write.
    status = move(u, const_cast<void*>(src), false);
  } else {
    STRATA_ASSIGN_OR_RETURN(BounceBuffer bounce, take_bounce());
    std::memcpy(bounce.get(), src, unit.bytes);
    std::memset(bounce.get() + unit.bytes, 0, padded - unit.bytes);
    status = move(u, bounce.get(), false);
    give_bounce(std::move(bounce));
  }
  if (!status.is_ok()) return status.with_context(unit_context(u, false));
  unit.written = true;
  write_bytes_ += unit.bytes;
  io_write_bytes_ += padded;
  ++writes_;
  return Status::ok();
}

ParamStoreUsage ParamStore::usage() const {
  ParamStoreUsage use;
  use.nvme_bytes = nvme_bytes_;
  use.read_bytes = read_bytes_;
  use.write_bytes = write_bytes_;
  use.io_read_bytes = io_read_bytes_;
  use.io_write_bytes = io_write_bytes_;
  use.reads = reads_;
  use.writes = writes_;
  {
    std::lock_guard<std::mutex> lock(bounce_mu_);
    use.bounce_buffers = bounce_made_;
  }
  use.dirs = run_dirs_;
  use.checksums = checksum_;
  return use;
}

Status ParamStore::close() {
  std::unique_lock<std::shared_mutex> life(life_);
  if (closed_) return Status::ok();
  closed_ = true;
  Status status = space_ ? space_->close() : Status::ok();
  space_.reset();
  engine_.reset();
  std::lock_guard<std::mutex> lock(bounce_mu_);
  bounce_free_.clear();
  return status;
}

bool ParamStore::closed() const {
  std::shared_lock<std::shared_mutex> life(life_);
  return closed_;
}

}  // namespace strata::offload
