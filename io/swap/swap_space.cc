#include "io/swap_space.h"

#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "common/fault_points.h"
#include "common/log.h"
#include "common/units.h"
#include "io/core/real_files.h"
#include "io/swap/run_dir.h"

namespace strata::io {
namespace {

// How long close() waits for operations still in flight before it closes the files anyway.
constexpr std::int64_t kCloseWaitMs = 10'000;

constexpr char kFooterMagic[8] = {'S', 'T', 'R', 'X', 'S', 'U', 'M', '1'};

// The checksum footer block that follows an extent's data when checksums are on.
struct Footer {
  char magic[8];
  std::uint32_t kind;
  std::uint32_t reserved;
  std::uint64_t offset_bytes;
  std::uint64_t length_bytes;
  std::uint64_t hash;  // xxHash3 of the data, seeded with the extent's place
};

std::uint64_t extent_hash(const Extent& e, const void* data) {
  const std::uint64_t seed = e.offset_bytes * 0x9E3779B97F4A7C15ull ^ e.kind;
  return XXH3_64bits_withSeed(data, e.length_bytes, seed);
}

bool valid_kind_name(const std::string& name) {
  if (name.empty() || name.size() > 32) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

struct SwapSpace::Impl {
  struct Kind {
    SwapKind spec;
    FileId file;
    std::map<std::uint64_t, std::uint64_t> free;  // offset -> bytes, coalesced
  };
  struct Operation {
    std::uint32_t generation = 0;
    bool live = false;
    bool read = false;
    Extent extent;
    void* data = nullptr;
    IoHandle data_handle;
    IoHandle footer_handle;
    Footer* footer = nullptr;  // this operation's footer block (alignment bytes)
  };

  IoEngine* engine = nullptr;
  SwapOptions options;
  std::uint32_t alignment = 4096;
  std::vector<swap::RunDir> runs;
  std::vector<std::string> run_paths;
  std::vector<Kind> kinds;
  std::mutex mu;  // guards kinds[].free and operations
  std::vector<Operation> operations;
  std::vector<std::uint32_t> free_operations;
  std::uint8_t* footers = nullptr;  // operations_max blocks, allocated once
  bool closed = false;

  ~Impl() { std::free(footers); }

  std::string describe(const Extent& e) const {
    return fmt::format("extent {}[offset {}, {} bytes]", kinds[e.kind].spec.name, e.offset_bytes,
                       e.length_bytes);
  }

  Status check_extent(const Extent& e, const void* data) const {
    if (e.kind >= kinds.size()) {
      return Status(ErrorCode::kInvalidArgument, fmt::format("no swap kind {}", e.kind));
    }
    if (data == nullptr || reinterpret_cast<std::uintptr_t>(data) % alignment != 0) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("{}: the buffer must be non-null and aligned to {} bytes",
                                describe(e), alignment));
    }
    return Status::ok();
  }

  Result<SwapHandle> start(const Extent& e, void* data, bool read, Priority priority) {
    STRATA_TRY(check_extent(e, data));
    std::uint32_t index = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (free_operations.empty()) {
        return Status(ErrorCode::kUnavailable,
                      fmt::format("busy: all {} swap operations are outstanding (operations_max)",
                                  options.operations_max));
      }
      index = free_operations.back();
      free_operations.pop_back();
    }
    Operation& op = operations[index];
    op.generation++;
    op.live = true;
    op.read = read;
    op.extent = e;
    op.data = data;
    op.data_handle = IoHandle{};
    op.footer_handle = IoHandle{};
    const FileId file = kinds[e.kind].file;
    if (options.checksums && !read) {
      std::memset(op.footer, 0, alignment);
      std::memcpy(op.footer->magic, kFooterMagic, sizeof(kFooterMagic));
      op.footer->kind = e.kind;
      op.footer->offset_bytes = e.offset_bytes;
      op.footer->length_bytes = e.length_bytes;
      op.footer->hash = extent_hash(e, data);
      // A test's corruption (fault_points.h): the stored checksum no longer matches the data.
      if (swap_write_corrupts(kinds[e.kind].spec.name)) op.footer->hash ^= 1;
    }
    const Op io_op = read ? Op::kRead : Op::kWrite;
    auto data_handle =
        engine->submit({io_op, file, e.offset_bytes, e.length_bytes, data, priority});
    if (!data_handle.is_ok()) {
      finish(index);
      return data_handle.status().with_context(describe(e));
    }
    op.data_handle = *data_handle;
    if (options.checksums) {
      auto footer_handle = engine->submit(
          {io_op, file, e.offset_bytes + e.length_bytes, alignment, op.footer, priority});
      if (!footer_handle.is_ok()) {
        (void)engine->wait(op.data_handle);
        finish(index);
        return footer_handle.status().with_context(describe(e));
      }
      op.footer_handle = *footer_handle;
    }
    return SwapHandle{index, op.generation};
  }

  void finish(std::uint32_t index) {
    std::lock_guard<std::mutex> lock(mu);
    operations[index].live = false;
    free_operations.push_back(index);
  }

  // Checks a read extent against its footer.
  Status verify(const Operation& op) const {
    const Extent& e = op.extent;
    const Footer& f = *op.footer;
    auto place = [&] {
      auto info = engine->file_info(kinds[e.kind].file);
      return fmt::format("{} in {}", describe(e), info.is_ok() ? info->paths[0] : "?");
    };
    if (std::memcmp(f.magic, kFooterMagic, sizeof(kFooterMagic)) != 0) {
      return Status(ErrorCode::kCorrupt,
                    place() + ": no checksum footer (the extent was never written completely)");
    }
    if (f.kind != e.kind || f.offset_bytes != e.offset_bytes || f.length_bytes != e.length_bytes) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("{}: the footer belongs to extent kind {} offset {} length {}",
                                place(), f.kind, f.offset_bytes, f.length_bytes));
    }
    const std::uint64_t hash = extent_hash(e, op.data);
    if (hash != f.hash) {
      return Status(ErrorCode::kCorrupt,
                    fmt::format("{}: checksum mismatch (stored {:016x}, computed {:016x}); the "
                                "data on disk is corrupt",
                                place(), f.hash, hash));
    }
    return Status::ok();
  }

  Status complete(std::uint32_t index, IoCompletion data, std::optional<IoCompletion> footer) {
    Operation& op = operations[index];
    Status result = data.status;
    if (result.is_ok() && footer.has_value()) result = footer->status;
    if (result.is_ok() && op.read && options.checksums) result = verify(op);
    if (!result.is_ok() && result.code() != ErrorCode::kCorrupt) {
      result = result.with_context(describe(op.extent));
    }
    finish(index);
    return result;
  }

  Operation& live(SwapHandle h) {
    STRATA_ASSERT_MSG(h.valid() && h.slot < operations.size(), "invalid swap handle");
    Operation& op = operations[h.slot];
    STRATA_ASSERT_MSG(op.live && op.generation == h.generation, "swap handle already consumed");
    return op;
  }
};

SwapSpace::SwapSpace(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SwapSpace::~SwapSpace() {
  Status closed = close();
  if (!closed.is_ok()) STRATA_LOG_WARN("swap space: {}", closed.to_string());
}

Result<std::unique_ptr<SwapSpace>> SwapSpace::create(IoEngine* engine, const SwapOptions& options) {
  STRATA_ASSERT(engine != nullptr);
  if (options.dirs.empty() || options.dirs.size() > kStripesMax) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("swap space needs 1 to {} directories (nvme_path), got {}",
                              kStripesMax, options.dirs.size()));
  }
  for (std::size_t i = 0; i < options.dirs.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (options.dirs[i] == options.dirs[j]) {
        return Status(ErrorCode::kInvalidArgument, "directory listed twice", options.dirs[i]);
      }
    }
  }
  if (options.kinds.empty()) {
    return Status(ErrorCode::kInvalidArgument, "swap space needs at least one state kind");
  }
  for (const SwapKind& kind : options.kinds) {
    if (!valid_kind_name(kind.name)) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("swap kind name '{}' must be 1-32 of [a-z0-9_]", kind.name));
    }
    if (kind.capacity_bytes == 0) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("swap kind '{}' has no capacity", kind.name));
    }
  }
  if (options.operations_max == 0 || options.rank < 0) {
    return Status(ErrorCode::kInvalidArgument, "operations_max must be > 0 and rank >= 0");
  }
  const std::uint32_t uid = ::geteuid();
  const std::string tag = options.tag.empty() ? fmt::format("p{}", ::getpid()) : options.tag;

  StaleCleanup stale = clean_stale_swap(options.dirs, uid);
  for (const std::string& dir : stale.removed_dirs) {
    STRATA_LOG_INFO("swap space: removed {} left by a run that ended without cleaning up", dir);
  }
  for (const std::string& kept : stale.kept)
    STRATA_LOG_WARN("swap space: kept {}", kept);

  auto impl = std::make_unique<Impl>();
  impl->engine = engine;
  impl->options = options;
  impl->options.tag = tag;
  const std::uint64_t stripe =
      options.stripe_bytes != 0 ? options.stripe_bytes : engine->options().block_size_bytes;

  // Free space, per file system: several directories may share one.
  const auto stripes = static_cast<std::uint32_t>(options.dirs.size());
  std::map<dev_t, std::pair<std::uint64_t, std::string>> need;  // device -> bytes, dirs
  for (const std::string& dir : options.dirs) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      const int err = errno;
      return Status(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                    fmt::format("nvme_path is not usable: {}", core::errno_text(err)), dir);
    }
    std::uint64_t bytes = 0;
    for (const SwapKind& kind : options.kinds) {
      bytes += 64 * 1024 + core::data_bytes_per_stripe_file(align_up(kind.capacity_bytes, 4096),
                                                            stripe, stripes);
    }
    auto& entry = need[st.st_dev];
    entry.first += bytes;
    entry.second += (entry.second.empty() ? "" : ", ") + dir;
  }
  for (const auto& [dev, entry] : need) {
    const std::string first_dir = entry.second.substr(0, entry.second.find(','));
    STRATA_ASSIGN_OR_RETURN(std::uint64_t free, engine->free_bytes(first_dir));
    if (entry.first > free) {
      return Status(ErrorCode::kNoSpace,
                    fmt::format("the swap files need {} ({} bytes) on the file system of {} but "
                                "it has {} ({} bytes) free; free space or lower the offloaded "
                                "state",
                                format_bytes(entry.first), entry.first, entry.second,
                                format_bytes(free), free),
                    first_dir);
    }
  }

  // From here on the SwapSpace's destructor removes whatever was made if a step fails.
  std::unique_ptr<SwapSpace> space(new SwapSpace(std::move(impl)));
  Impl& s = *space->impl_;
  for (const std::string& dir : options.dirs) {
    auto run = swap::create_run_dir(dir, uid, tag);
    if (!run.is_ok()) return run.status();
    s.runs.push_back(*run);
    s.run_paths.push_back(run->path);
  }
  for (std::uint32_t k = 0; k < options.kinds.size(); ++k) {
    const SwapKind& kind = options.kinds[k];
    FileSpec spec;
    for (const std::string& run : s.run_paths) {
      spec.paths.push_back(run + "/" + swap::swap_file_name(kind.name, options.rank));
    }
    spec.size_bytes = align_up(kind.capacity_bytes, 4096);
    spec.stripe_bytes = stripe;
    spec.header = fmt::format("{}kind={} rank={} uid={} pid={} stripes={}\n", swap::kFileMagic,
                              kind.name, options.rank, uid, ::getpid(), stripes);
    auto file = engine->open_file(spec);
    if (!file.is_ok()) return file.status();  // `space` going out of scope removes the rest
    STRATA_ASSIGN_OR_RETURN(FileInfo info, engine->file_info(*file));
    s.alignment = std::max(s.alignment, info.alignment_bytes);
    Impl::Kind entry;
    entry.spec = kind;
    entry.file = *file;
    s.kinds.push_back(std::move(entry));
  }
  for (Impl::Kind& kind : s.kinds) {
    const std::uint64_t usable =
        engine->file_info(kind.file)->size_bytes / s.alignment * s.alignment;
    kind.free[0] = usable;
  }
  void* raw = nullptr;
  if (::posix_memalign(&raw, s.alignment, std::size_t{s.alignment} * options.operations_max) != 0) {
    return Status(ErrorCode::kOutOfMemory, "cannot allocate the checksum footer blocks");
  }
  s.footers = static_cast<std::uint8_t*>(raw);
  std::memset(s.footers, 0, std::size_t{s.alignment} * options.operations_max);
  s.operations.resize(options.operations_max);
  for (std::uint32_t i = 0; i < options.operations_max; ++i) {
    s.operations[i].footer = reinterpret_cast<Footer*>(s.footers + std::size_t{i} * s.alignment);
    s.free_operations.push_back(options.operations_max - 1 - i);
  }
  return space;
}

std::uint64_t SwapSpace::footprint_bytes(std::uint64_t length_bytes) const {
  return align_up(length_bytes, impl_->alignment) +
         (impl_->options.checksums ? impl_->alignment : 0);
}

std::uint32_t SwapSpace::alignment_bytes() const {
  return impl_->alignment;
}

const std::vector<std::string>& SwapSpace::run_dirs() const {
  return impl_->run_paths;
}

std::vector<std::string> SwapSpace::kind_paths(std::uint32_t kind) const {
  STRATA_ASSERT(kind < impl_->kinds.size());
  return impl_->engine->file_info(impl_->kinds[kind].file)->paths;
}

Result<Extent> SwapSpace::allocate(std::uint32_t kind, std::uint64_t length_bytes) {
  if (kind >= impl_->kinds.size() || length_bytes == 0) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("cannot allocate {} bytes in swap kind {}", length_bytes, kind));
  }
  const std::uint64_t need = footprint_bytes(length_bytes);
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& free = impl_->kinds[kind].free;
  std::uint64_t largest = 0;
  for (auto it = free.begin(); it != free.end(); ++it) {
    largest = std::max(largest, it->second);
    if (it->second < need) continue;
    const std::uint64_t offset = it->first;
    const std::uint64_t rest = it->second - need;
    free.erase(it);
    if (rest != 0) free[offset + need] = rest;
    return Extent{kind, offset, align_up(length_bytes, impl_->alignment)};
  }
  return Status(ErrorCode::kNoSpace,
                fmt::format("swap kind '{}' has no room for {} bytes (largest free gap {} bytes "
                            "of {} capacity)",
                            impl_->kinds[kind].spec.name, need, largest,
                            impl_->kinds[kind].spec.capacity_bytes));
}

Status SwapSpace::release(const Extent& extent) {
  if (extent.kind >= impl_->kinds.size()) {
    return Status(ErrorCode::kInvalidArgument, fmt::format("no swap kind {}", extent.kind));
  }
  std::uint64_t offset = extent.offset_bytes;
  std::uint64_t bytes = footprint_bytes(extent.length_bytes);
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& free = impl_->kinds[extent.kind].free;
  auto next = free.lower_bound(offset);
  if ((next != free.end() && next->first < offset + bytes) ||
      (next != free.begin() && std::prev(next)->first + std::prev(next)->second > offset)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("{} overlaps free space: released twice?", impl_->describe(extent)));
  }
  if (next != free.end() && next->first == offset + bytes) {  // merge with the gap after
    bytes += next->second;
    next = free.erase(next);
  }
  if (next != free.begin()) {  // merge with the gap before
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return Status::ok();
    }
  }
  free[offset] = bytes;
  return Status::ok();
}

Result<SwapHandle> SwapSpace::write(const Extent& extent, const void* data, Priority priority) {
  return impl_->start(extent, const_cast<void*>(data), false, priority);
}

Result<SwapHandle> SwapSpace::read(const Extent& extent, void* data, Priority priority) {
  return impl_->start(extent, data, true, priority);
}

Status SwapSpace::wait(SwapHandle handle) {
  Impl::Operation& op = impl_->live(handle);
  IoCompletion data = impl_->engine->wait(op.data_handle);
  std::optional<IoCompletion> footer;
  if (op.footer_handle.valid()) footer = impl_->engine->wait(op.footer_handle);
  return impl_->complete(handle.slot, std::move(data), std::move(footer));
}

std::optional<Status> SwapSpace::poll(SwapHandle handle) {
  Impl::Operation& op = impl_->live(handle);
  // Footer first: once it is consumed the data completion decides.
  if (op.footer_handle.valid()) {
    std::optional<IoCompletion> footer = impl_->engine->poll(op.footer_handle);
    if (!footer.has_value()) return std::nullopt;
    IoCompletion data = impl_->engine->wait(op.data_handle);
    return impl_->complete(handle.slot, std::move(data), std::move(footer));
  }
  std::optional<IoCompletion> data = impl_->engine->poll(op.data_handle);
  if (!data.has_value()) return std::nullopt;
  return impl_->complete(handle.slot, std::move(*data), std::nullopt);
}

Status SwapSpace::close() {
  Impl& s = *impl_;
  if (s.closed) return Status::ok();
  s.closed = true;
  Status result;
  // Operations a caller left in flight (it stopped on an error without waiting for them) would
  // keep the files open, and with them the run folder: wait for them first, bounded.
  std::uint32_t pending = 0, stuck = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kCloseWaitMs);
  for (std::uint32_t i = 0; i < s.operations.size(); ++i) {
    Impl::Operation& op = s.operations[i];
    if (!op.live) continue;
    ++pending;
    for (IoHandle* handle : {&op.data_handle, &op.footer_handle}) {
      if (!handle->valid()) continue;
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
          deadline - std::chrono::steady_clock::now());
      if (!s.engine
               ->wait_for(*handle,
                          static_cast<std::uint64_t>(std::max<std::int64_t>(left.count(), 0)))
               .has_value()) {
        ++stuck;
        continue;
      }
      *handle = IoHandle{};
    }
    s.finish(i);
  }
  if (pending > 0) {
    STRATA_LOG_WARN(
        "swap space: {} read(s)/write(s) were still in flight at close; {} before removing {}",
        pending,
        stuck == 0
            ? "waited for them"
            : fmt::format("{} did not end within {} ms, closing anyway", stuck, kCloseWaitMs),
        s.run_paths.empty() ? std::string("the swap folder") : s.run_paths.front());
  }
  for (Impl::Kind& kind : s.kinds) {
    Status closed = s.engine->close_file(kind.file, true);
    if (!closed.is_ok() && result.is_ok()) result = closed;
  }
  s.kinds.clear();
  for (swap::RunDir& run : s.runs) {
    Status removed = swap::remove_run_dir(&run);
    if (!removed.is_ok() && result.is_ok()) result = removed;
  }
  return result;
}

}  // namespace strata::io
