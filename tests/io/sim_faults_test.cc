// The fault twin: each injected fault surfaces as the error (or the retry) it stands for,
// decisions replay from the seed, priorities order queued work, and acknowledged data survives
// every fault.
#include <gtest/gtest.h>

#include <vector>

#include "io/engine.h"
#include "io/sim/sim_engine.h"
#include "io_test_util.h"

namespace strata::io {
namespace {

using testing::AlignedBuffer;
using testing::first_unstamped;
using testing::stamp;

constexpr std::uint64_t kMiB = 1 << 20;

struct Twin {
  std::unique_ptr<IoEngine> engine;
  SimControl* control = nullptr;
  FileId file;
};

Twin make_twin(const SimFaults& faults, std::uint64_t seed = 42, std::uint32_t threads = 2) {
  EngineOptions o;
  o.block_size_bytes = 64 * 1024;
  o.queue_depth = 4;
  o.threads = threads;
  SimOptions sim;
  sim.seed = seed;
  sim.faults = faults;
  auto made = make_sim_engine(o, sim);
  EXPECT_TRUE(made.is_ok());
  Twin twin;
  twin.engine = std::move(made).value();
  twin.control = sim_control(twin.engine.get());
  FileSpec spec;
  spec.paths = {"/sim/disk0/state"};
  spec.size_bytes = 8 * kMiB;
  auto file = twin.engine->open_file(spec);
  EXPECT_TRUE(file.is_ok());
  twin.file = *file;
  return twin;
}

IoCompletion run(Twin& twin, Op op, std::uint64_t offset, std::uint64_t length, void* buffer) {
  auto h = twin.engine->submit({op, twin.file, offset, length, buffer});
  EXPECT_TRUE(h.is_ok());
  return twin.engine->wait(*h);
}

TEST(SimFaults, EioSurfacesNamingFileOffsetAndErrno) {
  Twin twin =
      make_twin(SimFaults{.eio_rate = 1.0}, 42, 1);  // one thread: the first piece fails first
  AlignedBuffer buffer(kMiB);
  IoCompletion c = run(twin, Op::kWrite, 2 * kMiB, kMiB, buffer.data());
  ASSERT_FALSE(c.status.is_ok());
  EXPECT_EQ(c.status.code(), ErrorCode::kIo);
  EXPECT_EQ(c.status.context(), "/sim/disk0/state");
  EXPECT_NE(c.status.message().find("at offset 2097152"), std::string::npos)
      << c.status.to_string();
  EXPECT_NE(c.status.message().find("Input/output error (EIO)"), std::string::npos);
  EXPECT_GT(twin.control->counters().eio, 0u);
}

TEST(SimFaults, EnospcSurfacesAsNoSpace) {
  Twin twin = make_twin(SimFaults{.enospc_rate = 1.0});
  AlignedBuffer buffer(kMiB);
  IoCompletion c = run(twin, Op::kWrite, 0, kMiB, buffer.data());
  EXPECT_EQ(c.status.code(), ErrorCode::kNoSpace);
  EXPECT_NE(c.status.message().find("ENOSPC"), std::string::npos) << c.status.to_string();
  // Reads are not affected by ENOSPC.
  EXPECT_TRUE(run(twin, Op::kRead, 0, kMiB, buffer.data()).status.is_ok());
}

TEST(SimFaults, ShortTransfersAreResubmittedUntilComplete) {
  Twin twin = make_twin(SimFaults{.short_rate = 0.7});
  AlignedBuffer out(4 * kMiB), in(4 * kMiB);
  stamp(out.data(), out.size(), 0, 5);
  IoCompletion w = run(twin, Op::kWrite, 0, out.size(), out.data());
  ASSERT_TRUE(w.status.is_ok()) << w.status.to_string();
  EXPECT_EQ(w.bytes_done, out.size());
  EXPECT_GT(w.retries, 0u);
  IoCompletion r = run(twin, Op::kRead, 0, in.size(), in.data());
  ASSERT_TRUE(r.status.is_ok());
  EXPECT_GT(r.retries, 0u);
  EXPECT_EQ(first_unstamped(in.data(), in.size(), 0, 5), -1);
  EXPECT_GT(twin.control->counters().short_transfers, 0u);
}

TEST(SimFaults, TornWriteFailsAndLandsOnlyAPrefix) {
  Twin twin = make_twin(SimFaults{.torn_rate = 1.0}, 42, 1);
  AlignedBuffer out(64 * 1024), in(64 * 1024);
  stamp(out.data(), out.size(), 0, 9);
  IoCompletion c = run(twin, Op::kWrite, 0, out.size(), out.data());
  ASSERT_FALSE(c.status.is_ok());
  EXPECT_EQ(c.status.code(), ErrorCode::kIo);
  twin.control->set_faults(SimFaults{});
  ASSERT_TRUE(run(twin, Op::kRead, 0, in.size(), in.data()).status.is_ok());
  // Some whole 4 KiB units landed, the rest is still the old (zero) content.
  const std::int64_t bad = first_unstamped(in.data(), in.size(), 0, 9);
  ASSERT_GT(bad, 0);
  EXPECT_EQ(bad % 4096, 0);
  EXPECT_LT(bad, static_cast<std::int64_t>(in.size()));
  EXPECT_EQ(in.data()[in.size() - 1], 0);
}

TEST(SimFaults, LatencyDelaysButDoesNotFail) {
  Twin twin = make_twin(SimFaults{.latency_rate = 1.0, .latency_us = 100});
  AlignedBuffer buffer(256 * 1024);
  IoCompletion c = run(twin, Op::kWrite, 0, buffer.size(), buffer.data());
  EXPECT_TRUE(c.status.is_ok());
  EXPECT_EQ(twin.control->counters().delayed, 4u);  // one per 64 KiB piece
}

// Runs 64 writes with faults and returns which failed.
std::vector<bool> failure_pattern(std::uint64_t seed) {
  Twin twin = make_twin(SimFaults{.eio_rate = 0.05, .short_rate = 0.2, .torn_rate = 0.05}, seed);
  AlignedBuffer buffer(64 * 4096);
  std::vector<bool> failed;
  for (std::uint64_t i = 0; i < 64; ++i) {
    failed.push_back(!run(twin, Op::kWrite, i * 4 * 4096, 4 * 4096, buffer.data()).status.is_ok());
  }
  return failed;
}

TEST(SimFaults, TheSameSeedReplaysTheSameFaults) {
  std::vector<bool> a = failure_pattern(1234);
  EXPECT_EQ(a, failure_pattern(1234));
  EXPECT_NE(a, failure_pattern(99));
  EXPECT_NE(std::count(a.begin(), a.end(), true), 0);
}

TEST(SimFaults, DemandRequestsJumpQueuedPrefetches) {
  Twin twin = make_twin(SimFaults{}, 1, 1);
  twin.control->set_paused(true);
  AlignedBuffer buffer(kMiB);
  std::vector<IoHandle> prefetch;
  for (int i = 0; i < 4; ++i) {
    auto h = twin.engine->submit({Op::kRead, twin.file, i * 65536ull, 65536,
                                  buffer.data() + i * 65536, Priority::kPrefetch});
    ASSERT_TRUE(h.is_ok());
    prefetch.push_back(*h);
  }
  auto demand = twin.engine->submit(
      {Op::kRead, twin.file, 5 * 65536ull, 65536, buffer.data() + 5 * 65536, Priority::kDemand});
  ASSERT_TRUE(demand.is_ok());
  // While paused nothing completes, and wait_for gives up.
  EXPECT_FALSE(twin.engine->wait_for(*demand, 1000).has_value());
  EXPECT_FALSE(twin.engine->poll(prefetch[0]).has_value());
  twin.control->set_paused(false);
  EXPECT_EQ(twin.engine->wait(*demand).sequence, 1u);
  for (std::size_t i = 0; i < prefetch.size(); ++i) {
    EXPECT_EQ(twin.engine->wait(prefetch[i]).sequence, i + 2);
  }
}

TEST(SimFaults, AcknowledgedDataSurvivesEveryFault) {
  Twin twin = make_twin(SimFaults{.eio_rate = 0.1,
                                  .enospc_rate = 0.05,
                                  .short_rate = 0.3,
                                  .torn_rate = 0.1,
                                  .latency_rate = 0.05,
                                  .latency_us = 50},
                        7);
  constexpr std::uint64_t kExtent = 128 * 1024;
  constexpr int kExtents = 48;
  AlignedBuffer out(kExtent * kExtents), in(kExtent);
  std::vector<bool> acked(kExtents, false);
  int failures = 0;
  // Each extent is written until a write is acknowledged, as a caller would retry.
  for (int round = 0; round < 20; ++round) {
    for (int e = 0; e < kExtents; ++e) {
      if (acked[e]) continue;
      std::uint8_t* data = out.data() + e * kExtent;
      stamp(data, kExtent, e * kExtent, 100 + e);
      IoCompletion c = run(twin, Op::kWrite, e * kExtent, kExtent, data);
      acked[e] = c.status.is_ok();
      failures += acked[e] ? 0 : 1;
    }
  }
  ASSERT_GT(failures, 0);
  // Reads with faults still on: a failed read never changes the disk.
  for (int e = 0; e < kExtents; ++e) {
    (void)run(twin, Op::kRead, e * kExtent, kExtent, in.data());
  }
  twin.control->set_faults(SimFaults{});
  for (int e = 0; e < kExtents; ++e) {
    ASSERT_TRUE(acked[e]) << "extent " << e << " never acknowledged in 20 tries";
    ASSERT_TRUE(run(twin, Op::kRead, e * kExtent, kExtent, in.data()).status.is_ok());
    EXPECT_EQ(first_unstamped(in.data(), kExtent, e * kExtent, 100 + e), -1) << "extent " << e;
  }
}

TEST(SimFaults, FileBeyondCapacityIsRefusedWithTheNumbers) {
  EngineOptions o;
  SimOptions sim;
  sim.capacity_bytes = 4 * kMiB;
  auto engine = make_sim_engine(o, sim);
  ASSERT_TRUE(engine.is_ok());
  FileSpec spec;
  spec.paths = {"/sim/big"};
  spec.size_bytes = 8 * kMiB;
  auto file = (*engine)->open_file(spec);
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), ErrorCode::kNoSpace);
  EXPECT_NE(file.status().message().find("8.00 MiB"), std::string::npos)
      << file.status().to_string();
  EXPECT_NE(file.status().message().find("4.00 MiB free"), std::string::npos);
}

}  // namespace
}  // namespace strata::io
