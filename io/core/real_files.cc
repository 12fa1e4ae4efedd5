#include "io/core/real_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/units.h"
#include "io/probe.h"

namespace strata::io::core {
namespace {

std::string parent_dir(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

Status open_error(int err, const std::string& path, bool create) {
  const std::string dir = parent_dir(path);
  switch (err) {
    case ENOENT:
      return Status(ErrorCode::kNotFound,
                    create ? fmt::format("cannot create the file: directory {} does not exist", dir)
                           : "the file does not exist",
                    path);
    case ENOTDIR:
      return Status(ErrorCode::kNotFound,
                    fmt::format("cannot create the file: {} is not a directory", dir), path);
    case EROFS:
      return Status(ErrorCode::kIo,
                    fmt::format("cannot {} the file: {} is on a read-only file system",
                                create ? "create" : "open", dir),
                    path);
    case EACCES:
    case EPERM:
      return Status(ErrorCode::kIo,
                    fmt::format("cannot {} the file: permission denied in {}",
                                create ? "create" : "open", dir),
                    path);
    case EEXIST:
      return Status(ErrorCode::kIo,
                    "the file already exists; Strata only creates new files and never "
                    "overwrites one it did not create",
                    path);
    case ENOSPC:
    case EDQUOT:
      return Status(ErrorCode::kNoSpace,
                    fmt::format("cannot create the file: no space left in {}", dir), path);
    default:
      return Status(ErrorCode::kIo, fmt::format("cannot open the file: {}", errno_text(err)), path);
  }
}

// Closes what was opened so far and removes what was created, on an error path.
void undo(const OpenedFile& file, std::size_t opened, bool created) {
  for (std::size_t i = 0; i < opened; ++i) {
    if (file.fds[i] >= 0) ::close(file.fds[i]);
    if (created) ::unlink(file.info.paths[i].c_str());
  }
}

Status write_header(int fd, const std::string& header, std::uint64_t header_bytes,
                    std::uint32_t alignment, const std::string& path) {
  void* raw = nullptr;
  if (::posix_memalign(&raw, alignment, header_bytes) != 0) {
    return Status(ErrorCode::kOutOfMemory, "cannot allocate the header block", path);
  }
  std::unique_ptr<void, decltype(&std::free)> block(raw, &std::free);
  std::memset(raw, 0, header_bytes);
  std::memcpy(raw, header.data(), header.size());
  std::uint64_t done = 0;
  while (done < header_bytes) {
    ssize_t n =
        ::pwrite(fd, static_cast<char*>(raw) + done, header_bytes - done, static_cast<off_t>(done));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      return Status(err == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIo,
                    fmt::format("cannot write the header block: {}", errno_text(err)), path);
    }
    done += static_cast<std::uint64_t>(n);
  }
  return Status::ok();
}

Status preallocate(int fd, std::uint64_t bytes, const std::string& path) {
  if (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0) return Status::ok();
  int err = errno;
  if (err == EOPNOTSUPP) {
    // No preallocation here (ramfs, some FUSE): size the file; a full disk then shows up as an
    // ENOSPC error value on write.
    if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) return Status::ok();
    err = errno;
  }
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    std::uint64_t free = 0;
    if (auto f = real_free_bytes(parent_dir(path)); f.is_ok()) free = *f;
    return Status(ErrorCode::kNoSpace,
                  fmt::format("cannot reserve {} ({} bytes) for the file: {} has {} free ({})",
                              format_bytes(bytes), bytes, parent_dir(path), format_bytes(free),
                              errno_text(err)),
                  path);
  }
  return Status(ErrorCode::kIo,
                fmt::format("cannot preallocate {} bytes: {}", bytes, errno_text(err)), path);
}

}  // namespace

std::uint64_t data_bytes_per_stripe_file(std::uint64_t logical_bytes, std::uint64_t stripe_bytes,
                                         std::uint32_t stripes) {
  if (stripes <= 1) return logical_bytes;
  const std::uint64_t units = (logical_bytes + stripe_bytes - 1) / stripe_bytes;
  return (units + stripes - 1) / stripes * stripe_bytes;
}

Result<OpenedFile> open_real_files(const FileSpec& spec, std::uint64_t stripe_bytes,
                                   DirectIo direct) {
  OpenedFile file;
  file.info.paths = spec.paths;
  file.info.stripe_bytes = stripe_bytes;
  file.info.direct = direct != DirectIo::kOff;
  std::uint32_t alignment = 4096;
  const std::size_t count = spec.paths.size();

  for (std::size_t i = 0; i < count; ++i) {
    const std::string& path = spec.paths[i];
    int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW;
    if (spec.create) flags |= O_CREAT | O_EXCL;
    int fd = ::open(path.c_str(), flags, 0600);
    if (fd < 0) {
      Status error = open_error(errno, path, spec.create);
      undo(file, i, spec.create);
      return error;
    }
    file.fds[i] = fd;
    if (direct == DirectIo::kOff) continue;
    // Switch O_DIRECT on for the open file: the file system refuses it here (EINVAL) without
    // the create-then-fail dance that open(O_DIRECT) would need.
    int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_DIRECT) != 0) {
      int err = errno;
      std::string fs;
      struct statfs sfs {};
      if (::fstatfs(fd, &sfs) == 0)
        fs = fmt::format(" (file system magic 0x{:x})", static_cast<unsigned long>(sfs.f_type));
      std::string reason =
          fmt::format("the file system refuses O_DIRECT{}: {}", fs, errno_text(err));
      if (direct == DirectIo::kRequire) {
        undo(file, i + 1, spec.create);
        return Status(ErrorCode::kUnavailable, reason + " (direct_io is required)", path);
      }
      file.info.direct = false;
      file.buffered_reason = reason;
      continue;
    }
    alignment = std::max(alignment, direct_io_alignment(fd));
  }
  file.info.alignment_bytes = alignment;
  if (stripe_bytes % alignment != 0) {
    undo(file, count, spec.create);
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("stripe size {} is not a multiple of the direct-I/O alignment {}",
                              stripe_bytes, alignment),
                  spec.paths.front());
  }

  if (!spec.create) {
    struct stat st {};
    if (::fstat(file.fds[0], &st) != 0) {
      int err = errno;
      undo(file, count, false);
      return Status(ErrorCode::kIo, fmt::format("cannot stat the file: {}", errno_text(err)),
                    spec.paths.front());
    }
    const std::uint64_t have = static_cast<std::uint64_t>(st.st_size) / alignment * alignment;
    const std::uint64_t want = spec.size_bytes != 0 ? spec.size_bytes : have;
    if (want == 0 || want > have) {
      undo(file, count, false);
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("the file holds {} usable bytes, {} were asked for", have, want),
                    spec.paths.front());
    }
    file.info.size_bytes = want;
    return file;
  }

  file.info.size_bytes = spec.size_bytes;
  file.info.header_bytes = spec.header.empty() ? 0 : align_up(spec.header.size(), alignment);
  const std::uint64_t per_file =
      file.info.header_bytes +
      data_bytes_per_stripe_file(spec.size_bytes, stripe_bytes, static_cast<std::uint32_t>(count));
  for (std::size_t i = 0; i < count; ++i) {
    const std::string& path = spec.paths[i];
    Status reserved = preallocate(file.fds[i], per_file, path);
    if (!reserved.is_ok()) {
      undo(file, count, true);
      return reserved;
    }
    if (!spec.header.empty()) {
      Status written =
          write_header(file.fds[i], spec.header, file.info.header_bytes, alignment, path);
      if (!written.is_ok()) {
        undo(file, count, true);
        return written;
      }
    }
  }
  return file;
}

Status close_real_files(const OpenedFile& file, bool remove) {
  Status result;
  for (std::size_t i = 0; i < file.info.paths.size(); ++i) {
    if (file.fds[i] >= 0 && ::close(file.fds[i]) != 0 && result.is_ok()) {
      result = Status(ErrorCode::kIo, fmt::format("close failed: {}", errno_text(errno)),
                      file.info.paths[i]);
    }
    if (remove && ::unlink(file.info.paths[i].c_str()) != 0 && errno != ENOENT && result.is_ok()) {
      result = Status(ErrorCode::kIo, fmt::format("cannot remove the file: {}", errno_text(errno)),
                      file.info.paths[i]);
    }
  }
  return result;
}

Result<std::uint64_t> real_free_bytes(const std::string& dir) {
  struct statvfs svfs {};
  if (::statvfs(dir.c_str(), &svfs) != 0) {
    int err = errno;
    return Status(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                  fmt::format("cannot query free space: {}", errno_text(err)), dir);
  }
  return static_cast<std::uint64_t>(svfs.f_bavail) * svfs.f_frsize;
}

}  // namespace strata::io::core
