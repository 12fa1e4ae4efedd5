// The TCP rendezvous (tcp_bootstrap.h). Messages, all integers in network byte order:
//   hello (rank k -> rank 0): magic, version, rank, world size, blob bytes   (5 x u32)
//   reply (rank 0 -> rank k): magic, status (0 ok, 1 error), payload bytes   (3 x u32)
//                             then the blob (ok) or the error message (error)
#include "comm/tcp_bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/log.h"

namespace strata::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kMagic = 0x53545241;  // "STRA"
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kMessageBytesMax = 4096;

// Closes a file descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

int ms_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

Status io_error(const std::string& where, const std::string& what) {
  return Status(ErrorCode::kUnavailable, what, "tcp bootstrap: " + where);
}

// Writes or reads exactly `bytes`, waiting at most until `deadline`.
Status transfer_all(int fd, std::byte* data, std::size_t bytes, bool writing,
                    Clock::time_point deadline, const std::string& peer) {
  std::size_t done = 0;
  while (done < bytes) {
    pollfd p{fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&p, 1, ms_left(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return io_error(peer, fmt::format("poll: {}", std::strerror(errno)));
    if (ready == 0) return io_error(peer, "timed out");
    const ssize_t n = writing ? ::send(fd, data + done, bytes - done, MSG_NOSIGNAL)
                              : ::recv(fd, data + done, bytes - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      return io_error(peer, fmt::format("{}: {}", writing ? "send" : "recv", std::strerror(errno)));
    }
    if (n == 0) return io_error(peer, "the connection closed");
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

void put_u32(std::byte* at, std::uint32_t value) {
  const std::uint32_t net = htonl(value);
  std::memcpy(at, &net, 4);
}

std::uint32_t get_u32(const std::byte* at) {
  std::uint32_t net = 0;
  std::memcpy(&net, at, 4);
  return ntohl(net);
}

// Sends a reply: the blob (ok) or an error message.
Status send_reply(int fd, bool ok, const void* payload, std::size_t bytes,
                  Clock::time_point deadline, const std::string& peer) {
  std::byte header[12];
  put_u32(header, kMagic);
  put_u32(header + 4, ok ? 0 : 1);
  put_u32(header + 8, static_cast<std::uint32_t>(bytes));
  STRATA_TRY(transfer_all(fd, header, sizeof header, true, deadline, peer));
  return transfer_all(fd, static_cast<std::byte*>(const_cast<void*>(payload)), bytes, true,
                      deadline, peer);
}

// ---- rank 0 -------------------------------------------------------------------------------------

Result<Fd> listen_on(int port) {
  // IPv6 with IPv4-mapped addresses accepts both families; fall back to IPv4 alone.
  for (int family : {AF_INET6, AF_INET}) {
    Fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = -1;
    if (family == AF_INET6) {
      int zero = 0;
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_addr = in6addr_any;
      addr.sin6_port = htons(static_cast<std::uint16_t>(port));
      rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    } else {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<std::uint16_t>(port));
      rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    }
    if (rc != 0) {
      if (errno == EADDRINUSE) {
        return Status(ErrorCode::kUnavailable,
                      fmt::format("port {} is in use on rank 0's host; choose a free port with "
                                  "MASTER_PORT (or STRATA_BOOTSTRAP_PORT)",
                                  port),
                      "tcp bootstrap");
      }
      continue;
    }
    if (::listen(fd.get(), 128) != 0) continue;
    return fd;
  }
  return Status(ErrorCode::kUnavailable,
                fmt::format("cannot listen on port {}: {}", port, std::strerror(errno)),
                "tcp bootstrap");
}

// Tells every connected rank why the rendezvous failed (best effort) and returns `error`.
// The rendezvous's deadline may have passed (a timeout), so telling them gets its own 2 s.
Status fail_all(std::vector<Fd>& clients, const Status& error) {
  const std::string text = error.to_string();
  const auto soon = Clock::now() + std::chrono::seconds(2);
  for (Fd& fd : clients) {
    if (fd.get() >= 0) (void)send_reply(fd.get(), false, text.data(), text.size(), soon, "");
  }
  return error;
}

Status serve(const RendezvousOptions& o, std::span<std::byte> blob, Clock::time_point deadline) {
  STRATA_ASSIGN_OR_RETURN(Fd listener, listen_on(o.port));
  std::vector<Fd> clients(static_cast<std::size_t>(o.world_size));  // by rank; [0] unused
  int arrived = 1;
  while (arrived < o.world_size) {
    pollfd p{listener.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, ms_left(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      std::string missing;
      int missing_count = 0;
      for (int k = 1; k < o.world_size; ++k) {
        if (clients[static_cast<std::size_t>(k)].get() >= 0) continue;
        if (missing_count < 16) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", k);
        ++missing_count;
      }
      if (missing_count > 16) missing += fmt::format(" and {} more", missing_count - 16);
      return fail_all(
          clients, Status(ErrorCode::kUnavailable,
                          fmt::format("rank{} {} did not connect to port {} within {} s "
                                      "(strata.comm_timeout_s)",
                                      missing_count == 1 ? "" : "s", missing, o.port, o.timeout_s),
                          "tcp bootstrap"));
    }
    Fd client(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (client.get() < 0) continue;
    std::byte hello[20];
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    if (!transfer_all(client.get(), hello, sizeof hello, false, hello_deadline, "").is_ok() ||
        get_u32(hello) != kMagic) {
      STRATA_LOG_WARN("tcp bootstrap: ignored a connection on port {} that is not a Strata rank",
                      o.port);
      continue;
    }
    const std::uint32_t version = get_u32(hello + 4);
    const auto rank = static_cast<int>(get_u32(hello + 8));
    const auto world = static_cast<int>(get_u32(hello + 12));
    const std::uint32_t blob_bytes = get_u32(hello + 16);
    std::string problem;
    if (version != kVersion) {
      problem = fmt::format(
          "a rank speaks bootstrap version {}, rank 0 speaks {}; run the same "
          "strata build on every node",
          version, kVersion);
    } else if (world != o.world_size) {
      problem = fmt::format("rank {} says the world size is {}, rank 0 says {}", rank, world,
                            o.world_size);
    } else if (rank < 1 || rank >= o.world_size) {
      problem = fmt::format("a rank announced rank {}; valid: 1 to {}", rank, o.world_size - 1);
    } else if (clients[static_cast<std::size_t>(rank)].get() >= 0) {
      problem = fmt::format("rank {} arrived twice; every process needs its own RANK", rank);
    } else if (blob_bytes != blob.size()) {
      problem =
          fmt::format("rank {} expects {} bytes, rank 0 has {}", rank, blob_bytes, blob.size());
    }
    if (!problem.empty()) {
      clients[0] = std::move(client);  // slot 0 is free: tell the offender as well
      return fail_all(clients, Status(ErrorCode::kConfig, problem, "tcp bootstrap"));
    }
    clients[static_cast<std::size_t>(rank)] = std::move(client);
    ++arrived;
  }
  for (int k = 1; k < o.world_size; ++k) {
    STRATA_TRY(send_reply(clients[static_cast<std::size_t>(k)].get(), true, blob.data(),
                          blob.size(), deadline, fmt::format("rank {}", k)));
  }
  return Status::ok();
}

// ---- the other ranks ----------------------------------------------------------------------------

// Connects to host:port once; kUnavailable with the reason when it fails.
Result<Fd> connect_once(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(rc)),
                  "tcp bootstrap (MASTER_ADDR)");
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (fd.get() < 0) continue;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last_error = std::strerror(errno);
      continue;
    }
    pollfd p{fd.get(), POLLOUT, 0};
    const int wait_ms = std::min(ms_left(deadline), 2000);
    if (::poll(&p, 1, wait_ms) <= 0) {
      last_error = "connect timed out";
      continue;
    }
    int error = 0;
    socklen_t length = sizeof error;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) {
      last_error = std::strerror(error);
      continue;
    }
    ::freeaddrinfo(found);
    return fd;
  }
  ::freeaddrinfo(found);
  return Status(ErrorCode::kUnavailable, last_error, "tcp bootstrap");
}

Status join(const RendezvousOptions& o, std::span<std::byte> blob, Clock::time_point deadline) {
  const std::string where = fmt::format("rank 0 at {}:{}", o.host, o.port);
  Fd fd;
  std::string last_error;
  for (;;) {
    Result<Fd> connected = connect_once(o.host, o.port, deadline);
    if (connected.is_ok()) {
      fd = std::move(connected).value();
      break;
    }
    if (connected.status().context() == "tcp bootstrap (MASTER_ADDR)") return connected.status();
    last_error = connected.status().message();
    if (ms_left(deadline) == 0) {
      return Status(ErrorCode::kUnavailable,
                    fmt::format("rank {} could not reach {} within {} s (strata.comm_timeout_s): "
                                "{}; is rank 0 running, and are MASTER_ADDR and MASTER_PORT the "
                                "same on every rank?",
                                o.rank, where, o.timeout_s, last_error),
                    "tcp bootstrap");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::byte hello[20];
  put_u32(hello, kMagic);
  put_u32(hello + 4, kVersion);
  put_u32(hello + 8, static_cast<std::uint32_t>(o.rank));
  put_u32(hello + 12, static_cast<std::uint32_t>(o.world_size));
  put_u32(hello + 16, static_cast<std::uint32_t>(blob.size()));
  STRATA_TRY(transfer_all(fd.get(), hello, sizeof hello, true, deadline, where));
  std::byte header[12];
  Status s = transfer_all(fd.get(), header, sizeof header, false, deadline, where);
  if (!s.is_ok()) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("rank {} got no answer from {} within {} s: {}", o.rank, where,
                              o.timeout_s, s.message()),
                  "tcp bootstrap");
  }
  const std::uint32_t bytes = get_u32(header + 8);
  if (get_u32(header) != kMagic || bytes > kMessageBytesMax + blob.size()) {
    return Status(ErrorCode::kUnavailable, fmt::format("{} is not a Strata rank 0", where),
                  "tcp bootstrap");
  }
  if (get_u32(header + 4) != 0) {
    std::string text(bytes, '\0');
    STRATA_TRY(transfer_all(fd.get(), reinterpret_cast<std::byte*>(text.data()), bytes, false,
                            deadline, where));
    return Status(ErrorCode::kConfig, fmt::format("rank 0 stopped the rendezvous: {}", text),
                  "tcp bootstrap");
  }
  if (bytes != blob.size()) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("{} sent {} bytes, expected {}", where, bytes, blob.size()),
                  "tcp bootstrap");
  }
  return transfer_all(fd.get(), blob.data(), blob.size(), false, deadline, where);
}

}  // namespace

Status tcp_share_blob(const RendezvousOptions& options, std::span<std::byte> blob) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return Status(
        ErrorCode::kInvalidArgument,
        fmt::format("rank {} of {} is not a valid rank", options.rank, options.world_size),
        "tcp bootstrap");
  }
  if (options.world_size == 1) return Status::ok();
  if (options.port < 1 || options.port > 65535) {
    return Status(
        ErrorCode::kConfig,
        fmt::format("port {} is invalid; set MASTER_PORT to 1-65535 on every rank", options.port),
        "tcp bootstrap");
  }
  if (options.rank != 0 && options.host.empty()) {
    return Status(ErrorCode::kConfig,
                  "MASTER_ADDR is not set; set it to rank 0's host name on every rank",
                  "tcp bootstrap");
  }
  if (blob.size() > kMessageBytesMax) {
    return Status(ErrorCode::kInvalidArgument, "blob larger than 4 KiB", "tcp bootstrap");
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options.timeout_s));
  return options.rank == 0 ? serve(options, blob, deadline) : join(options, blob, deadline);
}

}  // namespace strata::comm
