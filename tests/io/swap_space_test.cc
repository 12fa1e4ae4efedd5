// SwapSpace over the fault twin and over real files (io_uring): extents, round trips with and
// without checksums, striping, corruption detection, free-space checks and removal at close.
#include "io/swap_space.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "io/sim/sim_engine.h"
#include "io_test_util.h"
#include "support/run_strata.h"

namespace strata::io {
namespace {

using testing::AlignedBuffer;
using testing::first_unstamped;
using testing::stamp;
using testing::TempDir;

constexpr std::uint64_t kMiB = 1 << 20;

struct Backend {
  EngineKind kind;
  bool checksums;
};

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  return std::string(engine_kind_name(info.param.kind)) +
         (info.param.checksums ? "_checksums" : "_plain");
}

class SwapSpaceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    EngineOptions o;
    o.kind = GetParam().kind;
    o.block_size_bytes = 128 * 1024;
    o.queue_depth = 4;
    o.threads = 2;
    SimOptions sim;
    sim.capacity_bytes = 256 * kMiB;
    auto made = o.kind == EngineKind::kSim ? make_sim_engine(o, sim) : make_engine(o);
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    engine_ = std::move(made).value();
  }

  SwapOptions options(int dirs = 1) {
    SwapOptions o;
    for (int i = 0; i < dirs; ++i) {
      std::string d = dir_.path() + "/nvme" + std::to_string(i);
      std::filesystem::create_directories(d);
      o.dirs.push_back(d);
    }
    o.tag = "test";
    o.kinds = {{"master", 8 * kMiB}, {"exp_avg", 4 * kMiB}};
    o.checksums = GetParam().checksums;
    return o;
  }

  std::unique_ptr<SwapSpace> make(const SwapOptions& o) {
    auto space = SwapSpace::create(engine_.get(), o);
    EXPECT_TRUE(space.is_ok()) << space.status().to_string();
    return space.is_ok() ? std::move(space).value() : nullptr;
  }

  // Flips one byte of the data of `e` in its (first stripe's) backing file.
  void corrupt(SwapSpace& space, const Extent& e, std::uint64_t byte) {
    const std::string path = space.kind_paths(e.kind)[0];
    // The header block is one alignment unit (the header text is shorter than that).
    const std::uint64_t offset = space.alignment_bytes() + e.offset_bytes + byte;
    if (GetParam().kind == EngineKind::kSim) {
      ASSERT_TRUE(sim_control(engine_.get())->corrupt_byte(path, offset).is_ok());
      return;
    }
    int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    std::uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
    b ^= 0xFF;
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
    ::fsync(fd);
    ::close(fd);
  }

  TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(SwapSpaceTest, ExtentsAreAlignedDisjointAndReusable) {
  auto space = make(options());
  ASSERT_NE(space, nullptr);
  const std::uint64_t align = space->alignment_bytes();
  std::vector<Extent> extents;
  for (std::uint64_t bytes : {std::uint64_t{1}, std::uint64_t{5000}, kMiB, 3 * kMiB + 12}) {
    auto e = space->allocate(0, bytes);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    EXPECT_EQ(e->offset_bytes % align, 0u);
    EXPECT_EQ(e->length_bytes % align, 0u);
    EXPECT_GE(e->length_bytes, bytes);
    for (const Extent& other : extents) {
      const bool apart =
          e->offset_bytes >= other.offset_bytes + space->footprint_bytes(other.length_bytes) ||
          other.offset_bytes >= e->offset_bytes + space->footprint_bytes(e->length_bytes);
      EXPECT_TRUE(apart);
    }
    extents.push_back(*e);
  }
  auto too_big = space->allocate(0, 8 * kMiB);
  ASSERT_FALSE(too_big.is_ok());
  EXPECT_EQ(too_big.status().code(), ErrorCode::kNoSpace);
  EXPECT_NE(too_big.status().message().find("swap kind 'master' has no room"), std::string::npos);
  for (const Extent& e : extents)
    ASSERT_TRUE(space->release(e).is_ok());
  EXPECT_EQ(space->release(extents[0]).code(), ErrorCode::kInvalidArgument);  // twice
  // Released gaps merge back into one: the whole capacity fits again.
  EXPECT_TRUE(space->allocate(0, 8 * kMiB - space->footprint_bytes(0)).is_ok());
}

TEST_P(SwapSpaceTest, OffsetStampedExtentsRoundTrip) {
  auto space = make(options());
  ASSERT_NE(space, nullptr);
  constexpr int kCount = 6;
  constexpr std::uint64_t kBytes = 640 * 1024;
  AlignedBuffer out(kBytes * kCount), in(kBytes * kCount);
  std::vector<Extent> extents;
  std::vector<SwapHandle> handles;
  for (int i = 0; i < kCount; ++i) {
    auto e = space->allocate(i % 2, kBytes);
    ASSERT_TRUE(e.is_ok());
    extents.push_back(*e);
    stamp(out.data() + i * kBytes, kBytes, e->offset_bytes, 1000 + i);
    auto h = space->write(*e, out.data() + i * kBytes);
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  for (SwapHandle h : handles)
    ASSERT_TRUE(space->wait(h).is_ok());
  handles.clear();
  for (int i = 0; i < kCount; ++i) {
    auto h = space->read(extents[i], in.data() + i * kBytes, Priority::kDemand);
    ASSERT_TRUE(h.is_ok());
    handles.push_back(*h);
  }
  for (int i = 0; i < kCount; ++i) {
    std::optional<Status> done;
    if (i % 2 == 0) {
      while (!(done = space->poll(handles[i])).has_value()) {
      }
    } else {
      done = space->wait(handles[i]);
    }
    ASSERT_TRUE(done->is_ok()) << done->to_string();
    EXPECT_EQ(first_unstamped(in.data() + i * kBytes, kBytes, extents[i].offset_bytes, 1000 + i),
              -1);
  }
}

TEST_P(SwapSpaceTest, StripedOverThreeDirectories) {
  auto space = make(options(3));
  ASSERT_NE(space, nullptr);
  EXPECT_EQ(space->run_dirs().size(), 3u);
  EXPECT_EQ(space->kind_paths(0).size(), 3u);
  AlignedBuffer out(3 * kMiB), in(3 * kMiB);
  auto e = space->allocate(0, out.size());
  ASSERT_TRUE(e.is_ok());
  stamp(out.data(), out.size(), 0, 77);
  auto w = space->write(*e, out.data());
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE(space->wait(*w).is_ok());
  auto r = space->read(*e, in.data());
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(space->wait(*r).is_ok());
  EXPECT_EQ(first_unstamped(in.data(), in.size(), 0, 77), -1);
}

// Checksum behaviour: only the backends with checksums on.
using SwapChecksumTest = SwapSpaceTest;

TEST_P(SwapChecksumTest, CorruptionIsReportedNamingTheExtent) {
  auto space = make(options());
  ASSERT_NE(space, nullptr);
  AlignedBuffer out(kMiB), in(kMiB);
  ASSERT_TRUE(space->allocate(0, 64 * 1024).is_ok());  // so the extent is not at offset 0
  auto e = space->allocate(0, kMiB);
  ASSERT_TRUE(e.is_ok());
  stamp(out.data(), out.size(), e->offset_bytes, 3);
  auto w = space->write(*e, out.data());
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE(space->wait(*w).is_ok());
  corrupt(*space, *e, 12345);
  auto r = space->read(*e, in.data());
  ASSERT_TRUE(r.is_ok());
  Status read = space->wait(*r);
  EXPECT_EQ(read.code(), ErrorCode::kCorrupt);
  const std::string where =
      fmt::format("extent master[offset {}, {} bytes]", e->offset_bytes, kMiB);
  EXPECT_NE(read.message().find(where), std::string::npos) << read.to_string();
  EXPECT_NE(read.message().find("checksum mismatch"), std::string::npos);
}

TEST_P(SwapChecksumTest, NeverWrittenExtentIsNotTakenForData) {
  auto space = make(options());
  ASSERT_NE(space, nullptr);
  AlignedBuffer in(kMiB);
  auto e = space->allocate(1, kMiB);
  ASSERT_TRUE(e.is_ok());
  auto r = space->read(*e, in.data());
  ASSERT_TRUE(r.is_ok());
  Status read = space->wait(*r);
  EXPECT_EQ(read.code(), ErrorCode::kCorrupt);
  EXPECT_NE(read.message().find("no checksum footer"), std::string::npos) << read.to_string();
}

TEST_P(SwapSpaceTest, FilesAreOwnedPrivateAndRemovedAtClose) {
  auto space = make(options(2));
  ASSERT_NE(space, nullptr);
  const std::vector<std::string> runs = space->run_dirs();
  for (const std::string& run : runs) {
    EXPECT_NE(run.find("strata-swap-u" + std::to_string(::geteuid()) + "-test"), std::string::npos);
    struct stat st {};
    ASSERT_EQ(::stat(run.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    ASSERT_EQ(::stat((run + "/strata-swap.lock").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  const std::string master = space->kind_paths(0)[1];
  EXPECT_EQ(master, runs[1] + "/strata-master-r0.swp");
  if (GetParam().kind != EngineKind::kSim) {
    struct stat st {};
    ASSERT_EQ(::stat(master.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  } else {
    EXPECT_TRUE(sim_control(engine_.get())->contents(master).is_ok());
  }
  ASSERT_TRUE(space->close().is_ok());
  for (const std::string& run : runs)
    EXPECT_FALSE(std::filesystem::exists(run)) << run;
  if (GetParam().kind == EngineKind::kSim) {
    EXPECT_FALSE(sim_control(engine_.get())->contents(master).is_ok());
  }
}

// A caller that stops on an error may leave reads and writes in flight: close() waits for them
// and still removes the files and folders.
TEST_P(SwapSpaceTest, CloseWithOperationsInFlightRemovesTheFolder) {
  auto space = make(options(2));
  ASSERT_NE(space, nullptr);
  const std::vector<std::string> runs = space->run_dirs();
  AlignedBuffer written(kMiB), read(kMiB);
  stamp(written.data(), kMiB, 0, 1);
  auto a = space->allocate(0, kMiB);
  auto b = space->allocate(1, kMiB);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto w = space->write(*a, written.data());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto r = space->read(*b, read.data());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // Neither handle is waited for.
  Status closed = space->close();
  EXPECT_TRUE(closed.is_ok()) << closed.to_string();
  for (const std::string& run : runs)
    EXPECT_FALSE(std::filesystem::exists(run)) << run;
}

TEST_P(SwapSpaceTest, NotEnoughFreeSpaceFailsEarlyWithTheNumbers) {
  SwapOptions o = options();
  o.kinds = {{"master", 200 * kMiB}, {"exp_avg", 200 * kMiB}};
  std::unique_ptr<testing::ScopedMount> small;
  if (GetParam().kind != EngineKind::kSim) {
    small = std::make_unique<testing::ScopedMount>(o.dirs[0], "tmpfs", 0, "size=64m");
    if (!small->ok()) GTEST_SKIP() << "cannot make a size-limited file system: " << small->why();
  }
  auto space = SwapSpace::create(engine_.get(), o);
  ASSERT_FALSE(space.is_ok());
  EXPECT_EQ(space.status().code(), ErrorCode::kNoSpace);
  EXPECT_NE(space.status().message().find("the swap files need 400 MiB"), std::string::npos)
      << space.status().to_string();
  EXPECT_NE(space.status().message().find(GetParam().kind == EngineKind::kSim ? "it has 256 MiB"
                                                                              : "it has 64.0 MiB"),
            std::string::npos)
      << space.status().to_string();
  // Nothing was left behind.
  EXPECT_TRUE(std::filesystem::is_empty(o.dirs[0]));
}

TEST_P(SwapSpaceTest, MissingDirectoryIsNamed) {
  SwapOptions o = options();
  o.dirs = {dir_.path() + "/no-such-nvme"};
  auto space = SwapSpace::create(engine_.get(), o);
  ASSERT_FALSE(space.is_ok());
  EXPECT_EQ(space.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(space.status().context(), dir_.path() + "/no-such-nvme");
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapSpaceTest,
                         ::testing::Values(Backend{EngineKind::kSim, true},
                                           Backend{EngineKind::kSim, false},
                                           Backend{EngineKind::kUring, true},
                                           Backend{EngineKind::kUring, false}),
                         backend_name);
INSTANTIATE_TEST_SUITE_P(Backends, SwapChecksumTest,
                         ::testing::Values(Backend{EngineKind::kSim, true},
                                           Backend{EngineKind::kUring, true}),
                         backend_name);

TEST(SwapSpaceFaults, InjectedFaultsSurfaceNamingTheExtent) {
  EngineOptions o;
  o.block_size_bytes = 64 * 1024;
  SimOptions sim;
  sim.faults.eio_rate = 1.0;
  auto engine = make_sim_engine(o, sim);
  ASSERT_TRUE(engine.is_ok());
  TempDir dir;
  SwapOptions so;
  so.dirs = {dir.path()};
  so.kinds = {{"grad", 4 * kMiB}};
  auto space = SwapSpace::create(engine->get(), so);
  ASSERT_TRUE(space.is_ok()) << space.status().to_string();
  AlignedBuffer buffer(kMiB);
  auto e = (*space)->allocate(0, kMiB);
  ASSERT_TRUE(e.is_ok());
  auto w = (*space)->write(*e, buffer.data());
  ASSERT_TRUE(w.is_ok());
  Status written = (*space)->wait(*w);
  EXPECT_EQ(written.code(), ErrorCode::kIo);
  EXPECT_NE(written.context().find("extent grad[offset 0, 1048576 bytes]"), std::string::npos)
      << written.to_string();
  EXPECT_NE(written.message().find("EIO"), std::string::npos);
}

}  // namespace
}  // namespace strata::io
