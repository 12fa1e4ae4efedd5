// The QueueEngine's tables (see queue_engine.h): the open files with their backing paths and
// stripes, and the registered buffers, with the hooks an implementation runs as they change.
// Requests, pieces and completions are in queue_engine.cc.
#include "io/core/queue_engine.h"

#include <fmt/format.h>

#include "common/log.h"

namespace strata::io::core {

// ---- files ---------------------------------------------------------------------------------

Result<FileId> QueueEngine::open_file(const FileSpec& spec) {
  if (spec.paths.empty() || spec.paths.size() > kStripesMax) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("a file needs 1 to {} backing paths, got {}", kStripesMax, spec.paths.size()));
  }
  for (const std::string& path : spec.paths) {
    if (path.empty()) return Status(ErrorCode::kInvalidArgument, "empty backing file path");
  }
  const std::uint64_t stripe =
      spec.stripe_bytes != 0 ? spec.stripe_bytes : options_.block_size_bytes;
  if (stripe % 4096 != 0) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("stripe size {} is not a multiple of 4096", stripe),
                  spec.paths.front());
  }
  if (spec.create && spec.size_bytes == 0) {
    return Status(ErrorCode::kInvalidArgument, "a new file needs a size", spec.paths.front());
  }
  if (!spec.create && (spec.paths.size() != 1 || !spec.header.empty())) {
    return Status(ErrorCode::kInvalidArgument,
                  "only single, header-less files can be opened without create",
                  spec.paths.front());
  }

  std::int32_t index = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < files_.size(); ++i) {
      if (!files_[i].used) {
        index = static_cast<std::int32_t>(i);
        files_[i].used = true;  // reserved while the backing files open
        files_[i].outstanding = 0;
        break;
      }
    }
  }
  if (index < 0) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("all {} file slots are open (files_max)", options_.files_max),
                  spec.paths.front());
  }
  auto release = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    files_[index] = FileEntry{};
  };

  Result<OpenedFile> opened = open_backing(spec, stripe);
  if (!opened.is_ok()) {
    release();
    return opened.status();
  }
  const FileInfo& info = opened->info;
  if (info.size_bytes % info.alignment_bytes != 0 || info.stripe_bytes % info.alignment_bytes) {
    Status closed = close_backing(*opened, spec.create);
    (void)closed;
    release();
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("size {} and stripe {} must be multiples of the file's alignment {}",
                              info.size_bytes, info.stripe_bytes, info.alignment_bytes),
                  spec.paths.front());
  }
  Status hooked = on_file_opened(index, *opened);
  if (!hooked.is_ok()) {
    Status closed = close_backing(*opened, spec.create);
    (void)closed;
    release();
    return hooked;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!opened->buffered_reason.empty() && !warned_buffered_) {
    warned_buffered_ = true;
    STRATA_LOG_WARN("{}: {}; using buffered I/O for files there (the page cache keeps copies)",
                    spec.paths.front(), opened->buffered_reason);
  }
  files_[index].file = std::move(opened).value();
  return FileId{index};
}

Result<FileInfo> QueueEngine::file_info(FileId file) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file.valid() || static_cast<std::size_t>(file.index) >= files_.size() ||
      !files_[file.index].used) {
    return Status(ErrorCode::kInvalidArgument, fmt::format("no open file with id {}", file.index));
  }
  return files_[file.index].file.info;
}

Status QueueEngine::close_file(FileId file, bool remove) {
  OpenedFile opened;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!file.valid() || static_cast<std::size_t>(file.index) >= files_.size() ||
        !files_[file.index].used) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("no open file with id {}", file.index));
    }
    if (files_[file.index].outstanding != 0) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("{} requests on the file are still outstanding; wait for them "
                                "before closing it",
                                files_[file.index].outstanding),
                    files_[file.index].file.info.paths.front());
    }
    opened = files_[file.index].file;
  }
  on_file_closing(file.index);
  Status closed = close_backing(opened, remove);
  std::lock_guard<std::mutex> lock(mu_);
  files_[file.index] = FileEntry{};
  return closed;
}

std::string QueueEngine::file_path(std::int32_t file, std::uint32_t stripe) const {
  const auto& paths = files_[file].file.info.paths;
  return stripe < paths.size() ? paths[stripe] : std::string("?");
}

// ---- buffers -------------------------------------------------------------------------------

Status QueueEngine::register_buffer(void* addr, std::uint64_t bytes) {
  if (addr == nullptr || bytes == 0) {
    return Status(ErrorCode::kInvalidArgument, "cannot register an empty buffer");
  }
  if (reinterpret_cast<std::uintptr_t>(addr) % 4096 != 0 || bytes % 4096 != 0) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("a registered buffer must start and end on a 4096-byte boundary "
                              "(address {}, {} bytes)",
                              addr, bytes));
  }
  std::int32_t index = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      if (buffers_[i].addr == addr) {
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("buffer at {} is already registered", addr));
      }
      if (index < 0 && buffers_[i].addr == nullptr) index = static_cast<std::int32_t>(i);
    }
    if (index < 0) {
      return Status(
          ErrorCode::kUnavailable,
          fmt::format("all {} buffer slots are in use (buffers_max)", options_.buffers_max));
    }
    buffers_[index] = Buffer{static_cast<std::uint8_t*>(addr), 0};  // reserved, matches nothing
  }
  Status hooked = on_buffer_changed(index, addr, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (!hooked.is_ok()) {
    buffers_[index] = Buffer{};
    return hooked;
  }
  buffers_[index].bytes = bytes;
  return Status::ok();
}

Status QueueEngine::unregister_buffer(void* addr) {
  std::int32_t index = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      if (buffers_[i].addr == addr && buffers_[i].bytes != 0) index = static_cast<std::int32_t>(i);
    }
    if (index < 0) {
      return Status(ErrorCode::kInvalidArgument, fmt::format("no buffer registered at {}", addr));
    }
    buffers_[index].bytes = 0;  // no new piece will match it
  }
  Status hooked = on_buffer_changed(index, nullptr, 0);
  std::lock_guard<std::mutex> lock(mu_);
  buffers_[index] = Buffer{};
  return hooked;
}

// Default hooks: nothing to do.
Status QueueEngine::on_file_opened(std::int32_t, const OpenedFile&) {
  return Status::ok();
}
void QueueEngine::on_file_closing(std::int32_t) {}
Status QueueEngine::on_buffer_changed(std::int32_t, void*, std::uint64_t) {
  return Status::ok();
}

void QueueEngine::close_all_files() {
  for (std::size_t i = 0; i < files_.size(); ++i) {
    if (!files_[i].used || files_[i].file.info.paths.empty()) continue;
    Status closed = close_backing(files_[i].file, false);
    if (!closed.is_ok()) STRATA_LOG_WARN("{}", closed.to_string());
    files_[i] = FileEntry{};
  }
}

}  // namespace strata::io::core
