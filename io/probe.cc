#include "io/probe.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "common/units.h"

namespace strata::io {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string fs_type_name(long magic) {
  switch (static_cast<unsigned long>(magic)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlay";
    case 0x2FC12FC1:
      return "zfs";
    case 0xF2F52010:
      return "f2fs";
    case 0x6969:
      return "nfs";
    case 0x65735546:
      return "fuse";
    case 0x858458F6:
      return "ramfs";
    default:
      return fmt::format("0x{:x}", static_cast<unsigned long>(magic));
  }
}

std::string read_first_line(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

// Finds the block device behind `st_dev` in sysfs: its name and logical block size. A partition
// has no queue/ of its own; its parent disk's is used.
void probe_block_device(dev_t dev, DirectoryProbe* probe) {
  std::string base = fmt::format("/sys/dev/block/{}:{}", major(dev), minor(dev));
  std::string uevent_dev;
  {
    std::ifstream in(base + "/uevent");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("DEVNAME=", 0) == 0) uevent_dev = line.substr(8);
    }
  }
  if (uevent_dev.empty()) return;
  probe->block_device = uevent_dev;
  for (const char* queue : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
    std::string text = read_first_line(base + queue);
    if (!text.empty()) {
      probe->logical_block_bytes =
          static_cast<std::uint32_t>(std::strtoul(text.c_str(), nullptr, 10));
      return;
    }
  }
}

struct FdCloser {
  void operator()(int* fd) const {
    if (fd != nullptr && *fd >= 0) ::close(*fd);
    delete fd;
  }
};

}  // namespace

UringProbe probe_io_uring() {
  UringProbe result;
  struct utsname uts {};
  if (::uname(&uts) == 0) result.kernel_release = uts.release;

  struct io_uring ring {};
  int rc = io_uring_queue_init(8, &ring, 0);
  if (rc < 0) {
    result.error = fmt::format("io_uring_queue_init failed: {}", errno_text(-rc));
    return result;
  }
  struct io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  if (sqe == nullptr) {
    result.error = "io_uring_get_sqe returned no entry";
    io_uring_queue_exit(&ring);
    return result;
  }
  io_uring_prep_nop(sqe);
  rc = io_uring_submit(&ring);
  if (rc != 1) {
    result.error = fmt::format("io_uring_submit failed: {}", rc < 0 ? errno_text(-rc) : "no entry");
    io_uring_queue_exit(&ring);
    return result;
  }
  struct io_uring_cqe* cqe = nullptr;
  rc = io_uring_wait_cqe(&ring, &cqe);
  if (rc < 0) {
    result.error = fmt::format("io_uring_wait_cqe failed: {}", errno_text(-rc));
    io_uring_queue_exit(&ring);
    return result;
  }
  int nop_result = cqe->res;
  io_uring_cqe_seen(&ring, cqe);
  if (nop_result < 0) {
    result.error = fmt::format("io_uring NOP completed with {}", errno_text(-nop_result));
    io_uring_queue_exit(&ring);
    return result;
  }
  if (struct io_uring_probe* p = io_uring_get_probe_ring(&ring)) {
    result.read_fixed = io_uring_opcode_supported(p, IORING_OP_READ_FIXED);
    result.write_fixed = io_uring_opcode_supported(p, IORING_OP_WRITE_FIXED);
    io_uring_free_probe(p);
  }
  io_uring_queue_exit(&ring);
  result.available = true;
  return result;
}

Result<DirectoryProbe> probe_swap_folder(const std::string& dir, const char* key) {
  auto probe = probe_directory(dir);
  if (!probe.is_ok()) {
    return Status(probe.status().code(),
                  "nvme_path '" + dir +
                      "' cannot hold the swap files: " + probe.status().to_string() +
                      "; give an existing, writable directory on the NVMe drive",
                  key);
  }
  return probe;
}

Result<DirectoryProbe> probe_directory(const std::string& dir) {
  DirectoryProbe probe;
  probe.path = dir;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    return Status(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                  fmt::format("cannot use directory: {}", errno_text(err)), dir);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status(ErrorCode::kInvalidArgument, "not a directory", dir);
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status(ErrorCode::kIo, fmt::format("directory is not writable: {}", errno_text(errno)),
                  dir);
  }

  struct statfs sfs {};
  if (::statfs(dir.c_str(), &sfs) == 0) probe.fs_type = fs_type_name(sfs.f_type);
  struct statvfs svfs {};
  if (::statvfs(dir.c_str(), &svfs) == 0) {
    probe.free_bytes = static_cast<std::uint64_t>(svfs.f_bavail) * svfs.f_frsize;
    probe.total_bytes = static_cast<std::uint64_t>(svfs.f_blocks) * svfs.f_frsize;
  }
  probe_block_device(st.st_dev, &probe);

  // A temporary file to test O_DIRECT on; unlinked as soon as it is open.
  std::string pattern = dir + "/.strata-probe-XXXXXX";
  std::unique_ptr<char[]> name(new char[pattern.size() + 1]);
  std::memcpy(name.get(), pattern.c_str(), pattern.size() + 1);
  int buffered_fd = ::mkostemp(name.get(), O_CLOEXEC);
  if (buffered_fd < 0) {
    return Status(ErrorCode::kIo,
                  fmt::format("cannot create a file in the directory: {}", errno_text(errno)), dir);
  }
  std::unique_ptr<int, FdCloser> buffered(new int(buffered_fd));
  int direct_fd = ::open(name.get(), O_RDWR | O_DIRECT | O_CLOEXEC);
  int open_errno = errno;
  ::unlink(name.get());

  struct statx stx {};
  if (::statx(buffered_fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0 && stx.stx_dio_offset_align != 0) {
    probe.mem_align_bytes = stx.stx_dio_mem_align;
    probe.offset_align_bytes = stx.stx_dio_offset_align;
    probe.align_source = "statx";
  } else if (probe.logical_block_bytes != 0) {
    probe.mem_align_bytes = probe.logical_block_bytes;
    probe.offset_align_bytes = probe.logical_block_bytes;
    probe.align_source = "block device";
  } else {
    probe.align_source = "default";
  }

  if (direct_fd < 0) {
    probe.direct_io_error = fmt::format("open(O_DIRECT) failed: {}", errno_text(open_errno));
    return probe;
  }
  std::unique_ptr<int, FdCloser> direct(new int(direct_fd));
  const std::size_t size = std::max<std::uint32_t>(required_alignment(probe), 4096);
  void* raw = nullptr;
  if (::posix_memalign(&raw, size, size) != 0) {
    return Status(ErrorCode::kOutOfMemory, "cannot allocate an aligned probe buffer", dir);
  }
  std::unique_ptr<void, decltype(&std::free)> buffer(raw, &std::free);
  std::memset(raw, 0x5a, size);
  ssize_t wrote = ::pwrite(direct_fd, raw, size, 0);
  if (wrote != static_cast<ssize_t>(size)) {
    probe.direct_io_error = wrote < 0 ? fmt::format("O_DIRECT write failed: {}", errno_text(errno))
                                      : "O_DIRECT write was short";
    return probe;
  }
  std::memset(raw, 0, size);
  ssize_t got = ::pread(direct_fd, raw, size, 0);
  if (got != static_cast<ssize_t>(size)) {
    probe.direct_io_error = got < 0 ? fmt::format("O_DIRECT read failed: {}", errno_text(errno))
                                    : "O_DIRECT read was short";
    return probe;
  }
  const auto* bytes = static_cast<const unsigned char*>(raw);
  if (!std::all_of(bytes, bytes + size, [](unsigned char b) { return b == 0x5a; })) {
    probe.direct_io_error = "O_DIRECT read returned different bytes than were written";
    return probe;
  }
  probe.direct_io = true;
  return probe;
}

std::uint32_t direct_io_alignment(int fd) {
  std::uint32_t align = 0;
  struct statx stx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0 && stx.stx_dio_offset_align != 0) {
    align = std::max(stx.stx_dio_mem_align, stx.stx_dio_offset_align);
  } else {
    struct stat st {};
    if (::fstat(fd, &st) == 0) {
      DirectoryProbe probe;
      probe_block_device(st.st_dev, &probe);
      align = probe.logical_block_bytes;
    }
  }
  return std::max<std::uint32_t>(align, 4096u);
}

}  // namespace strata::io
