// The TCP rendezvous that hands NCCL's id around without MPI: ranks as threads of this process on
// the loopback interface.
#include "comm/tcp_bootstrap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <thread>
#include <vector>

namespace strata::comm {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// A port that was free a moment ago (bound to port 0, then released).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t length = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
}

using Blob = std::array<std::byte, 128>;

RendezvousOptions options_for(int rank, int world, int port, double timeout_s) {
  RendezvousOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rank = rank;
  o.world_size = world;
  o.timeout_s = timeout_s;
  return o;
}

// Runs ranks as threads with the given announced ranks; returns each one's status. Rank 0 waits
// `timeout_s`, the others ten times as long (so that they hear rank 0's verdict).
std::vector<Status> run_ranks(const std::vector<int>& announced, int world, double timeout_s,
                              std::vector<Blob>* blobs) {
  const int port = free_port();
  blobs->assign(announced.size(), Blob{});
  for (std::size_t i = 0; i < (*blobs)[0].size(); ++i)
    (*blobs)[0][i] = static_cast<std::byte>(i * 7 + 1);
  std::vector<Status> results(announced.size());
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < announced.size(); ++t) {
    threads.emplace_back([&, t] {
      const double timeout = announced[t] == 0 ? timeout_s : 10 * timeout_s;
      results[t] = tcp_share_blob(options_for(announced[t], world, port, timeout), (*blobs)[t]);
    });
  }
  for (std::thread& t : threads)
    t.join();
  return results;
}

TEST(TcpBootstrap, EveryRankReceivesRankZerosBlob) {
  std::vector<Blob> blobs;
  std::vector<Status> results = run_ranks({0, 1, 2, 3}, 4, 20.0, &blobs);
  for (std::size_t t = 0; t < results.size(); ++t) {
    EXPECT_TRUE(results[t].is_ok()) << t << ": " << results[t].to_string();
    EXPECT_EQ(blobs[t], blobs[0]) << "rank " << t;
  }
  EXPECT_NE(blobs[0], Blob{});
}

TEST(TcpBootstrap, MissingRankIsNamedAfterTheTimeout) {
  std::vector<Blob> blobs;
  std::vector<Status> results = run_ranks({0, 1}, 3, 1.0, &blobs);
  ASSERT_FALSE(results[0].is_ok());
  EXPECT_CONTAINS(results[0].to_string(), "rank 2 did not connect");
  // The rank that did arrive hears why instead of waiting on its own.
  ASSERT_FALSE(results[1].is_ok());
  EXPECT_CONTAINS(results[1].to_string(), "rank 2 did not connect");
}

TEST(TcpBootstrap, DuplicateRankStopsEveryone) {
  std::vector<Blob> blobs;
  std::vector<Status> results = run_ranks({0, 1, 1}, 3, 10.0, &blobs);
  ASSERT_FALSE(results[0].is_ok());
  EXPECT_CONTAINS(results[0].to_string(), "rank 1 arrived twice");
  EXPECT_FALSE(results[1].is_ok());
  EXPECT_FALSE(results[2].is_ok());
}

TEST(TcpBootstrap, WorldSizeMismatchIsNamed) {
  const int port = free_port();
  Blob zero{};
  Blob one{};
  Status s0;
  Status s1;
  std::thread t0([&] { s0 = tcp_share_blob(options_for(0, 2, port, 10.0), zero); });
  std::thread t1([&] { s1 = tcp_share_blob(options_for(1, 3, port, 10.0), one); });
  t0.join();
  t1.join();
  ASSERT_FALSE(s0.is_ok());
  EXPECT_CONTAINS(s0.to_string(), "rank 1 says the world size is 3, rank 0 says 2");
  ASSERT_FALSE(s1.is_ok());
  EXPECT_CONTAINS(s1.to_string(), "world size is 3");
}

TEST(TcpBootstrap, NoRankZeroTimesOutNamingTheAddress) {
  Blob blob{};
  const int port = free_port();
  Status s = tcp_share_blob(options_for(1, 2, port, 0.5), blob);
  ASSERT_FALSE(s.is_ok());
  EXPECT_CONTAINS(s.to_string(), "could not reach rank 0 at 127.0.0.1:" + std::to_string(port));
}

TEST(TcpBootstrap, MissingMasterAddrIsAConfigError) {
  Blob blob{};
  RendezvousOptions o = options_for(1, 2, 29500, 1.0);
  o.host.clear();
  Status s = tcp_share_blob(o, blob);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), ErrorCode::kConfig);
  EXPECT_CONTAINS(s.to_string(), "MASTER_ADDR is not set");
}

TEST(TcpBootstrap, UnresolvableHostIsNamed) {
  Blob blob{};
  RendezvousOptions o = options_for(1, 2, 29500, 1.0);
  o.host = "no-such-host.invalid";
  Status s = tcp_share_blob(o, blob);
  ASSERT_FALSE(s.is_ok());
  EXPECT_CONTAINS(s.to_string(), "cannot resolve 'no-such-host.invalid'");
}

}  // namespace
}  // namespace strata::comm
