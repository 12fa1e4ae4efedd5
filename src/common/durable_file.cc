// Durable, atomic file writing (see durable_file.h).
#include "common/durable_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/fault_points.h"

namespace strata {
namespace {

constexpr int kRetriesMax = 100;  // EINTR / EAGAIN retries of one call before giving up

std::string parent_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status write_error(int err, const std::string& what, const std::string& path) {
  const char* hint = err == ENOSPC   ? " (the file system is full)"
                     : err == EDQUOT ? " (the disk quota is used up)"
                     : err == EIO    ? " (the device reported an I/O error)"
                                     : "";
  return Status(error_code_for_write(err), fmt::format("{}: {}{}", what, std::strerror(err), hint),
                path);
}

}  // namespace

ErrorCode error_code_for_write(int err) {
  return err == ENOSPC || err == EDQUOT || err == EFBIG ? ErrorCode::kNoSpace : ErrorCode::kIo;
}

Result<DurableFile> DurableFile::create(const std::string& path, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, mode);
  if (fd < 0) return write_error(errno, "cannot create the file", path);
  crash_point("file.create");
  return DurableFile(path, fd);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
}

DurableFile::DurableFile(DurableFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), written_(other.written_) {
  other.fd_ = -1;
}

Status DurableFile::write(const void* data, std::uint64_t bytes) {
  STRATA_ASSERT(fd_ >= 0);
  crash_point("file.write");
  std::uint64_t allowed = bytes;
  const int injected = injected_file_error(FileOp::kWrite, path_, written_, bytes, &allowed);
  const auto* p = static_cast<const char*>(data);
  std::uint64_t done = 0;
  int retries = 0;
  while (done < allowed) {
    const ssize_t n = ::write(fd_, p + done, allowed - done);
    if (n < 0) {
      const int err = errno;
      if ((err == EINTR || err == EAGAIN) && ++retries < kRetriesMax) continue;
      return write_error(err, fmt::format("cannot write at byte {}", written_ + done), path_);
    }
    if (n == 0) {
      return Status(ErrorCode::kIo,
                    fmt::format("write made no progress at byte {}", written_ + done), path_);
    }
    done += static_cast<std::uint64_t>(n);
  }
  written_ += done;
  if (injected != 0) {
    return write_error(injected, fmt::format("cannot write at byte {}", written_), path_);
  }
  return Status::ok();
}

Status DurableFile::sync() {
  STRATA_ASSERT(fd_ >= 0);
  crash_point("file.fsync");
  const int injected = injected_file_error(FileOp::kSync, path_);
  if (injected != 0 || ::fsync(fd_) != 0) {
    return write_error(injected != 0 ? injected : errno, "fsync failed", path_);
  }
  crash_point("file.synced");
  return Status::ok();
}

Status DurableFile::close() {
  if (fd_ < 0) return Status::ok();
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return write_error(errno, "close failed", path_);
  return Status::ok();
}

Status sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return write_error(errno, "cannot open the directory to fsync it", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL): they order metadata themselves.
  if (rc != 0 && err != EINVAL) return write_error(err, "fsync of the directory failed", dir);
  crash_point("dir.synced");
  return Status::ok();
}

Status rename_durably(const std::string& from, const std::string& to) {
  crash_point("file.rename");
  const int injected = injected_file_error(FileOp::kRename, to);
  if (injected != 0 || std::rename(from.c_str(), to.c_str()) != 0) {
    const int err = injected != 0 ? injected : errno;
    return Status(error_code_for_write(err),
                  fmt::format("cannot rename {} into place: {}", from, std::strerror(err)), to);
  }
  crash_point("file.renamed");
  STRATA_TRY(sync_directory(parent_of(to)));
  if (parent_of(from) != parent_of(to)) STRATA_TRY(sync_directory(parent_of(from)));
  return Status::ok();
}

Status write_file_atomically(const std::string& path, std::string_view text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  Status s = [&]() -> Status {
    STRATA_ASSIGN_OR_RETURN(DurableFile file, DurableFile::create(tmp, mode));
    STRATA_TRY(file.write(text.data(), text.size()));
    STRATA_TRY(file.sync());
    return file.close();
  }();
  if (!s.is_ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  s = rename_durably(tmp, path);
  if (!s.is_ok()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace strata
