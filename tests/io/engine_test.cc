// The IoEngine contract, run against every implementation: io_uring, the pread/pwrite pool and
// the in-memory twin.
#include "io/engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

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

FileSpec new_file(const std::string& path, std::uint64_t bytes) {
  FileSpec spec;
  spec.paths = {path};
  spec.size_bytes = bytes;
  return spec;
}

EngineOptions small_options(EngineKind kind) {
  EngineOptions o;
  o.kind = kind;
  o.block_size_bytes = 256 * 1024;
  o.queue_depth = 4;
  o.threads = 2;
  o.requests_max = 64;
  return o;
}

class EngineTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    auto made = make_engine(small_options(GetParam()));
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    engine_ = std::move(made).value();
  }
  std::string path(const std::string& name) const { return dir_.path() + "/" + name; }
  FileId create(const std::string& name, std::uint64_t bytes) {
    FileSpec spec;
    spec.paths = {path(name)};
    spec.size_bytes = bytes;
    auto file = engine_->open_file(spec);
    EXPECT_TRUE(file.is_ok()) << file.status().to_string();
    return file.is_ok() ? *file : FileId{};
  }
  IoCompletion run(Op op, FileId file, std::uint64_t offset, std::uint64_t length, void* buffer,
                   Priority priority = Priority::kPrefetch) {
    auto handle = engine_->submit({op, file, offset, length, buffer, priority});
    EXPECT_TRUE(handle.is_ok()) << handle.status().to_string();
    if (!handle.is_ok()) return IoCompletion{handle.status()};
    return engine_->wait(*handle);
  }

  TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(EngineTest, OffsetStampedDataRoundTrips) {
  const std::uint64_t size = 8 * kMiB;
  FileId file = create("data", size);
  AlignedBuffer out(size), in(size);
  stamp(out.data(), size, 0, 7);
  // Eight 1 MiB writes in flight at once, each cut into 256 KiB pieces.
  std::vector<IoHandle> handles;
  for (std::uint64_t off = 0; off < size; off += kMiB) {
    auto h = engine_->submit({Op::kWrite, file, off, kMiB, out.data() + off});
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  for (IoHandle h : handles) {
    IoCompletion c = engine_->wait(h);
    ASSERT_TRUE(c.status.is_ok()) << c.status.to_string();
    EXPECT_EQ(c.bytes_done, kMiB);
  }
  // Read back in the opposite order, into a different buffer.
  handles.clear();
  for (std::uint64_t off = size; off > 0; off -= kMiB) {
    auto h = engine_->submit({Op::kRead, file, off - kMiB, kMiB, in.data() + off - kMiB});
    ASSERT_TRUE(h.is_ok());
    handles.push_back(*h);
  }
  for (IoHandle h : handles)
    ASSERT_TRUE(engine_->wait(h).status.is_ok());
  EXPECT_EQ(first_unstamped(in.data(), size, 0, 7), -1);
}

TEST_P(EngineTest, RegisteredBuffersRoundTrip) {
  const std::uint64_t size = 2 * kMiB;
  FileId file = create("data", size);
  AlignedBuffer out(size), in(size);
  ASSERT_TRUE(engine_->register_buffer(out.data(), size).is_ok());
  ASSERT_TRUE(engine_->register_buffer(in.data(), size).is_ok());
  stamp(out.data(), size, 0, 11);
  ASSERT_TRUE(run(Op::kWrite, file, 0, size, out.data()).status.is_ok());
  ASSERT_TRUE(run(Op::kRead, file, 0, size, in.data()).status.is_ok());
  EXPECT_EQ(first_unstamped(in.data(), size, 0, 11), -1);
  EXPECT_TRUE(engine_->unregister_buffer(out.data()).is_ok());
  EXPECT_EQ(engine_->unregister_buffer(out.data()).code(), ErrorCode::kInvalidArgument);
}

TEST_P(EngineTest, StripedFileSpreadsStripesRoundRobin) {
  std::vector<std::string> dirs = {path("a"), path("b"), path("c")};
  FileSpec spec;
  for (const std::string& d : dirs) {
    std::filesystem::create_directory(d);
    spec.paths.push_back(d + "/striped");
  }
  const std::uint64_t stripe = 64 * 1024;
  const std::uint64_t size = 30 * stripe;
  spec.size_bytes = size;
  spec.stripe_bytes = stripe;
  auto file = engine_->open_file(spec);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  AlignedBuffer out(size), in(size);
  stamp(out.data(), size, 0, 3);
  ASSERT_TRUE(run(Op::kWrite, *file, 0, size, out.data()).status.is_ok());
  ASSERT_TRUE(run(Op::kRead, *file, 0, size, in.data()).status.is_ok());
  EXPECT_EQ(first_unstamped(in.data(), size, 0, 3), -1);

  // Logical stripe s lives in backing file s % 3 at offset (s / 3) * stripe.
  ASSERT_TRUE(engine_->close_file(*file, false).is_ok());
  for (std::uint64_t s = 0; s < size / stripe; ++s) {
    const std::string& backing = spec.paths[s % 3];
    std::vector<std::uint8_t> got(stripe);
    if (GetParam() == EngineKind::kSim) {
      auto bytes = sim_control(engine_.get())->contents(backing);
      ASSERT_TRUE(bytes.is_ok());
      std::memcpy(got.data(), bytes->data() + (s / 3) * stripe, stripe);
    } else {
      int fd = ::open(backing.c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::pread(fd, got.data(), stripe, static_cast<off_t>((s / 3) * stripe)),
                static_cast<ssize_t>(stripe));
      ::close(fd);
    }
    EXPECT_EQ(first_unstamped(got.data(), stripe, s * stripe, 3), -1) << "stripe " << s;
  }
}

TEST_P(EngineTest, UnalignedRequestsAreRejectedNamingTheAlignment) {
  FileId file = create("data", kMiB);
  AlignedBuffer buffer(2 * kMiB);
  struct Case {
    std::uint64_t offset, length;
    std::size_t buffer_shift;
    const char* what;
  } cases[] = {{100, 4096, 0, "offset is not a multiple of 4096"},
               {0, 1000, 0, "length is not a multiple of 4096"},
               {0, 4096, 8, "is not a multiple of 4096"}};
  for (const Case& c : cases) {
    auto h = engine_->submit({Op::kRead, file, c.offset, c.length, buffer.data() + c.buffer_shift});
    ASSERT_FALSE(h.is_ok());
    EXPECT_EQ(h.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(h.status().message().find(c.what), std::string::npos) << h.status().to_string();
    EXPECT_NE(h.status().context().find("data"), std::string::npos);
  }
}

TEST_P(EngineTest, RangePastTheEndIsRejected) {
  FileId file = create("data", kMiB);
  AlignedBuffer buffer(2 * kMiB);
  auto h = engine_->submit({Op::kWrite, file, kMiB - 4096, 8192, buffer.data()});
  ASSERT_FALSE(h.is_ok());
  EXPECT_NE(h.status().message().find("past the file's 1048576 bytes"), std::string::npos)
      << h.status().to_string();
}

TEST_P(EngineTest, SubmitReportsBusyWhenEveryHandleIsOutstanding) {
  EngineOptions o = small_options(GetParam());
  o.requests_max = 2;
  auto made = make_engine(o);
  ASSERT_TRUE(made.is_ok());
  FileSpec spec = new_file(path("busy"), kMiB);
  auto file = (*made)->open_file(spec);
  ASSERT_TRUE(file.is_ok());
  AlignedBuffer buffer(kMiB);
  auto a = (*made)->submit({Op::kRead, *file, 0, 4096, buffer.data()});
  auto b = (*made)->submit({Op::kRead, *file, 4096, 4096, buffer.data() + 4096});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto c = (*made)->submit({Op::kRead, *file, 8192, 4096, buffer.data() + 8192});
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(c.status().message().find("busy"), std::string::npos);
  EXPECT_EQ((*made)->outstanding(), 2u);
  EXPECT_TRUE((*made)->wait(*a).status.is_ok());
  auto d = (*made)->submit({Op::kRead, *file, 8192, 4096, buffer.data() + 8192});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_TRUE((*made)->wait(*b).status.is_ok());
  EXPECT_TRUE((*made)->wait(*d).status.is_ok());
}

TEST_P(EngineTest, ClosingAFileWithOutstandingRequestsFails) {
  FileId file = create("data", kMiB);
  AlignedBuffer buffer(kMiB);
  auto h = engine_->submit({Op::kRead, file, 0, kMiB, buffer.data()});
  ASSERT_TRUE(h.is_ok());
  Status closed = engine_->close_file(file, true);
  EXPECT_EQ(closed.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(closed.message().find("outstanding"), std::string::npos);
  EXPECT_TRUE(engine_->wait(*h).status.is_ok());
  EXPECT_TRUE(engine_->close_file(file, true).is_ok());
}

TEST_P(EngineTest, CreatingAnExistingFileFailsAndLeavesItAlone) {
  FileId file = create("data", kMiB);
  ASSERT_TRUE(engine_->close_file(file, false).is_ok());
  FileSpec spec = new_file(path("data"), kMiB);
  auto again = engine_->open_file(spec);
  ASSERT_FALSE(again.is_ok());
  EXPECT_NE(again.status().message().find("already exists"), std::string::npos);
}

TEST_P(EngineTest, PollAndWaitForReturnTheCompletion) {
  FileId file = create("data", kMiB);
  AlignedBuffer buffer(kMiB);
  auto h = engine_->submit({Op::kWrite, file, 0, kMiB, buffer.data()});
  ASSERT_TRUE(h.is_ok());
  std::optional<IoCompletion> done = engine_->wait_for(*h, 10'000'000);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.is_ok());
  EXPECT_EQ(done->bytes_done, kMiB);
  auto h2 = engine_->submit({Op::kRead, file, 0, kMiB, buffer.data()});
  ASSERT_TRUE(h2.is_ok());
  std::optional<IoCompletion> polled;
  while (!(polled = engine_->poll(*h2)).has_value()) {
  }
  EXPECT_TRUE(polled->status.is_ok());
  EXPECT_EQ(engine_->outstanding(), 0u);
}

TEST_P(EngineTest, WaitAnyConsumesEachRequestOnceAndSkipsEmptyEntries) {
  FileId file = create("data", 4 * kMiB);
  AlignedBuffer buffer(4 * kMiB);
  std::vector<IoHandle> handles(6);  // entries 1 and 4 stay empty
  for (std::uint32_t i : {0u, 2u, 3u, 5u}) {
    auto h = engine_->submit(
        {Op::kWrite, file, i * 512 * 1024ull, 512 * 1024, buffer.data() + i * 512 * 1024});
    ASSERT_TRUE(h.is_ok());
    handles[i] = *h;
  }
  std::vector<std::uint32_t> seen;
  for (int n = 0; n < 4; ++n) {
    std::uint32_t index = 99;
    IoCompletion c = engine_->wait_any(handles.data(), 6, &index);
    ASSERT_LT(index, 6u);
    EXPECT_TRUE(handles[index].valid());
    EXPECT_TRUE(c.status.is_ok());
    EXPECT_EQ(c.bytes_done, 512u * 1024);
    handles[index] = IoHandle{};
    seen.push_back(index);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::uint32_t>{0, 2, 3, 5}));
  EXPECT_EQ(engine_->outstanding(), 0u);
}

TEST_P(EngineTest, SubmitBatchIsAllOrNothing) {
  FileId file = create("data", 4 * kMiB);
  AlignedBuffer out(4 * kMiB), in(4 * kMiB);
  stamp(out.data(), out.size(), 0, 13);
  std::vector<IoRequest> requests;
  for (std::uint64_t off = 0; off < 4 * kMiB; off += kMiB) {
    requests.push_back({Op::kWrite, file, off, kMiB, out.data() + off});
  }
  std::vector<IoHandle> handles(4);
  ASSERT_TRUE(engine_->submit_batch(requests.data(), 4, handles.data()).is_ok());
  for (IoHandle h : handles)
    ASSERT_TRUE(engine_->wait(h).status.is_ok());
  // One bad request in the batch: none is queued.
  requests[2].offset_bytes = 100;
  Status bad = engine_->submit_batch(requests.data(), 4, handles.data());
  EXPECT_EQ(bad.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->outstanding(), 0u);
  for (IoRequest& r : requests)
    r.op = Op::kRead;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    requests[i].offset_bytes = i * kMiB;
    requests[i].buffer = in.data() + i * kMiB;
  }
  ASSERT_TRUE(engine_->submit_batch(requests.data(), 4, handles.data()).is_ok());
  for (IoHandle h : handles)
    ASSERT_TRUE(engine_->wait(h).status.is_ok());
  EXPECT_EQ(first_unstamped(in.data(), in.size(), 0, 13), -1);
}

INSTANTIATE_TEST_SUITE_P(AllEngines, EngineTest,
                         ::testing::Values(EngineKind::kUring, EngineKind::kPosix,
                                           EngineKind::kSim),
                         [](const auto& info) { return engine_kind_name(info.param); });

TEST(EngineFactory, AutoPicksIoUringWhereItWorks) {
  EngineOptions o;
  auto engine = make_engine(o);
  ASSERT_TRUE(engine.is_ok());
  EXPECT_STREQ((*engine)->name(), "uring");
}

TEST(EngineFactory, BadOptionsNameTheOptionAndRange) {
  EngineOptions o;
  o.block_size_bytes = 1000;
  auto engine = make_engine(o);
  ASSERT_FALSE(engine.is_ok());
  EXPECT_NE(engine.status().message().find("block size 1000 must be a multiple of 4096"),
            std::string::npos);
  o = EngineOptions{};
  o.queue_depth = 0;
  EXPECT_NE(make_engine(o).status().message().find("queue depth 0"), std::string::npos);
}

TEST(EngineFactory, MissingDirectoryIsNamed) {
  TempDir dir;
  for (EngineKind kind : {EngineKind::kUring, EngineKind::kPosix}) {
    auto engine = make_engine(small_options(kind));
    ASSERT_TRUE(engine.is_ok());
    FileSpec spec = new_file(dir.path() + "/nope/file", kMiB);
    auto file = (*engine)->open_file(spec);
    ASSERT_FALSE(file.is_ok());
    EXPECT_EQ(file.status().code(), ErrorCode::kNotFound);
    EXPECT_NE(file.status().message().find(dir.path() + "/nope does not exist"), std::string::npos)
        << file.status().to_string();
  }
}

}  // namespace
}  // namespace strata::io
