// One process at a time in a directory (see dir_lock.h).
#include "common/dir_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/fault_points.h"

namespace strata {
namespace {

constexpr char kMagic[] = "strata-lock v1\n";
constexpr int kAttemptsMax = 64;  // the lock file changed under us this often: give up
constexpr std::size_t kCommandChars = 1000;
constexpr std::size_t kLockFileBytes = 8192;

std::string errno_text(int err) {
  const char* name = strerrorname_np(err);
  return fmt::format("{} ({})", std::strerror(err), name != nullptr ? name : "?");
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// Field 22 of /proc/<pid>/stat (the start time in clock ticks after boot); 0 when unknown.
std::uint64_t start_ticks_of(std::int64_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0')
    raw.pop_back();
  std::string out;
  for (char c : raw) {
    out += c == '\0' ? ' ' : (c == '\n' || c == '\r' ? ' ' : c);
    if (out.size() >= kCommandChars) {
      out += " ...";
      break;
    }
  }
  return out;
}

// When the process that started `ticks` clock ticks after boot began, in UTC ("now" when /proc
// does not say).
std::string start_utc(std::uint64_t ticks) {
  std::time_t t = std::time(nullptr);
  std::ifstream in("/proc/stat");
  std::string key;
  long long boot = -1;
  while (in >> key) {
    if (key == "btime") {
      in >> boot;
      break;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (boot > 0 && hz > 0 && ticks > 0)
    t = static_cast<std::time_t>(boot +
                                 static_cast<long long>(ticks / static_cast<std::uint64_t>(hz)));
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char text[64] = {};
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

std::string lock_text(const LockHolder& h) {
  return fmt::format("{}pid={}\nhost={}\nstarted={}\nstart_ticks={}\ncommand={}\n", kMagic, h.pid,
                     h.host, h.started, h.start_ticks, h.command);
}

// The file's text (at most kLockFileBytes); empty when it cannot be read.
std::string read_text(int fd) {
  std::string text(kLockFileBytes, '\0');
  const ssize_t got = ::pread(fd, text.data(), text.size(), 0);
  text.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
  return text;
}

std::string read_text(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return "";
  std::string text = read_text(fd);
  ::close(fd);
  return text;
}

// The holder of a held flock lock: it writes its description right after locking, so an empty
// file is one being written; wait for it a little (1 s at most).
LockHolder read_holder_of_locked(int fd) {
  LockHolder holder;
  for (int i = 0; i < 100; ++i) {
    holder = parse_lock_holder(read_text(fd));
    if (holder.pid > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return holder;
}

// Whether `fd` is the file that `path` names now (its holder may have removed it meanwhile).
bool names_the_same_file(int fd, const std::string& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd, &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

bool flock_unsupported(int err) {
  return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS;
}

// Whether the process a holder names still runs: on this host only (elsewhere nobody can tell).
bool holder_alive_here(const LockHolder& h) {
  if (h.pid <= 0 || h.pid > std::numeric_limits<pid_t>::max()) return false;
  if (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH) return false;
  // The pid runs; it is the same process only if it started when the holder did.
  const std::uint64_t ticks = start_ticks_of(h.pid);
  return h.start_ticks == 0 || ticks == 0 || ticks == h.start_ticks;
}

Status busy(const LockRequest& r, const LockHolder& holder, const std::string& extra) {
  const std::string who = holder.pid > 0 ? holder.describe()
                                         : std::string(
                                               "a process that has not described itself "
                                               "yet (it is starting)");
  std::string message = fmt::format("{} is in use by another Strata process: {}", r.dir, who);
  if (!extra.empty()) message += ". " + extra;
  if (!r.advice.empty()) message += ". " + r.advice;
  return Status(r.busy_code, message, r.context);
}

Status io_error(const LockRequest& r, const std::string& what, int err, const std::string& path) {
  return Status(ErrorCode::kIo,
                fmt::format("cannot take the lock on {} ({}): {}: {}", r.dir, r.context, what,
                            errno_text(err)),
                path);
}

}  // namespace

std::string dir_lock_name(int rank) {
  return rank == 0 ? std::string(kDirLockName) : fmt::format(".strata.rank{}.lock", rank);
}

std::string LockHolder::describe() const {
  return fmt::format("pid {} on host {}, started {}: {}", pid, host.empty() ? "?" : host,
                     started.empty() ? "?" : started, command.empty() ? "?" : command);
}

const char* to_string(LockMode mode) {
  return mode == LockMode::kFlock ? "flock" : "exclusive file";
}

LockHolder this_process() {
  // Described once per process: a child made by fork() describes itself anew.
  static std::mutex mutex;
  static LockHolder self;
  std::lock_guard<std::mutex> lock(mutex);
  if (self.pid != ::getpid()) {
    self.pid = ::getpid();
    self.host = host_name();
    self.start_ticks = start_ticks_of(self.pid);
    self.started = start_utc(self.start_ticks);
    self.command = command_line();
  }
  return self;
}

LockHolder parse_lock_holder(const std::string& text) {
  LockHolder h;
  if (text.compare(0, std::strlen(kMagic), kMagic) != 0) return h;
  std::istringstream in(text.substr(std::strlen(kMagic)));
  std::string line;
  LockHolder parsed;
  bool complete = false;
  while (std::getline(in, line)) {
    const std::size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "pid") parsed.pid = std::strtoll(value.c_str(), nullptr, 10);
    if (key == "host") parsed.host = value;
    if (key == "started") parsed.started = value;
    if (key == "start_ticks") parsed.start_ticks = std::strtoull(value.c_str(), nullptr, 10);
    if (key == "command") {
      parsed.command = value;
      complete = true;  // the last line: a file cut short is not yet written
    }
  }
  return complete ? parsed : h;
}

DirLock::~DirLock() {
  release();
}

DirLock::DirLock(DirLock&& other) noexcept {
  *this = std::move(other);
}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    mode_ = other.mode_;
    fd_ = other.fd_;
    self_ = std::move(other.self_);
    file_held_ = other.file_held_;
    other.fd_ = -1;
    other.file_held_ = false;
  }
  return *this;
}

void DirLock::release() {
  if (fd_ >= 0) {
    // Unlinked while still locked: whoever opened this file meanwhile sees that the path no longer
    // names it once it gets the lock, and tries again on a new file.
    ::unlink(path_.c_str());
    ::close(fd_);
    fd_ = -1;
  }
  if (file_held_) {
    const LockHolder now = parse_lock_holder(read_text(path_));
    if (now.pid == self_.pid && now.host == self_.host && now.start_ticks == self_.start_ticks)
      ::unlink(path_.c_str());
    file_held_ = false;
  }
}

Result<DirLock> DirLock::acquire(const LockRequest& r) {
  DirLock lock;
  lock.path_ = r.dir + "/" + r.name;
  const std::string& path = lock.path_;
  const LockHolder self = this_process();
  // Whether flock works here, asked of a private file first: the lock's own file must not be
  // created by a process that then finds it cannot lock it.
  bool use_flock = !flock_disabled_for_test();
  if (use_flock) {
    const std::string probe = fmt::format("{}/{}.probe.{}", r.dir, r.name, self.pid);
    const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return io_error(r, "cannot create a file in it", errno, probe);
    const int err = ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
    ::unlink(probe.c_str());
    ::close(fd);
    if (err != 0 && !flock_unsupported(err)) return io_error(r, "flock", err, probe);
    use_flock = err == 0;
  }
  const std::string text = lock_text(self);
  for (int attempt = 0; attempt < kAttemptsMax; ++attempt) {
    if (use_flock) {
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0) return io_error(r, "cannot open the lock file", errno, path);
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err != EWOULDBLOCK) {
          ::close(fd);
          return io_error(r, "flock", err, path);
        }
        const LockHolder holder = read_holder_of_locked(fd);
        ::close(fd);
        return busy(r, holder, "");
      }
      if (!names_the_same_file(fd, path)) {  // its last holder removed it as we opened it
        ::close(fd);
        continue;
      }
      if (::ftruncate(fd, 0) != 0 ||
          ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
        const int err = errno;
        ::unlink(path.c_str());
        ::close(fd);
        return io_error(r, "cannot write the lock file", err, path);
      }
      lock.fd_ = fd;
      lock.mode_ = LockMode::kFlock;
      return lock;
    }
    // The exclusive file: written whole under a private name, then linked to the lock's name.
    const std::string mine = fmt::format("{}.{}.{}", path, self.host, self.pid);
    const int fd =
        ::open(mine.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return io_error(r, "cannot create a file in it", errno, mine);
    const bool written =
        ::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
    const int write_err = errno;
    ::close(fd);
    if (!written) {
      ::unlink(mine.c_str());
      return io_error(r, "cannot write the lock file", write_err, mine);
    }
    const int linked = ::link(mine.c_str(), path.c_str()) == 0 ? 0 : errno;
    ::unlink(mine.c_str());
    if (linked == 0) {
      lock.mode_ = LockMode::kExclusiveFile;
      lock.self_ = self;
      lock.file_held_ = true;
      return lock;
    }
    if (linked != EEXIST) return io_error(r, "cannot link the lock file", linked, path);
    const std::string held_text = read_text(path);
    const LockHolder holder = parse_lock_holder(held_text);
    if (held_text.empty() && ::access(path.c_str(), F_OK) != 0) continue;  // released meanwhile
    if (holder.pid == 0) {
      return busy(r, holder,
                  fmt::format("{} is not a Strata lock file this version can read; remove it if "
                              "no Strata process uses the directory",
                              path));
    }
    if (holder.host != self.host) {
      return busy(r, holder,
                  fmt::format("flock does not work on this file system, so whether that process "
                              "still runs can be checked only on {}; if it has ended, remove {}",
                              holder.host, path));
    }
    if (holder_alive_here(holder)) return busy(r, holder, "");
    // Its holder is gone: take it over. Renamed aside first and read again, so that a lock a
    // live process made in the meantime is put back rather than removed.
    const std::string stale = fmt::format("{}.stale.{}", path, self.pid);
    if (::rename(path.c_str(), stale.c_str()) != 0) {
      if (errno == ENOENT) continue;
      return io_error(r, "cannot remove the stale lock file", errno, path);
    }
    if (read_text(stale) != held_text) {
      if (::link(stale.c_str(), path.c_str()) != 0 && errno != EEXIST)
        return io_error(r, "cannot put back the lock file", errno, path);
    }
    ::unlink(stale.c_str());
  }
  return Status(ErrorCode::kIo,
                fmt::format("cannot take the lock on {}: its lock file changed {} times while "
                            "this process tried",
                            r.dir, kAttemptsMax),
                path);
}

}  // namespace strata
