// The engine on real file systems made for the test: one that refuses O_DIRECT (ramfs), a full
// one (a 1 MiB tmpfs) and a read-only one. Mounting needs root; where it is not allowed the
// test skips and says why.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <filesystem>

#include "io/engine.h"
#include "io_test_util.h"
#include "support/run_strata.h"

namespace strata::io {
namespace {

using testing::AlignedBuffer;
using testing::first_unstamped;
using testing::ScopedMount;
using testing::stamp;
using testing::TempDir;

constexpr std::uint64_t kMiB = 1 << 20;

FileSpec new_file(const std::string& path, std::uint64_t bytes) {
  FileSpec spec;
  spec.paths = {path};
  spec.size_bytes = bytes;
  return spec;
}

class EngineFsTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  std::unique_ptr<IoEngine> engine(DirectIo direct = DirectIo::kAuto) {
    EngineOptions o;
    o.kind = GetParam();
    o.block_size_bytes = 256 * 1024;
    o.direct_io = direct;
    auto made = make_engine(o);
    EXPECT_TRUE(made.is_ok());
    return std::move(made).value();
  }
  TempDir dir_;
};

TEST_P(EngineFsTest, BufferedFallbackWhereODirectIsRefused) {
  ScopedMount ramfs(dir_.path(), "ramfs", 0, "size=64m");
  if (!ramfs.ok()) GTEST_SKIP() << "cannot make a file system without O_DIRECT: " << ramfs.why();
  auto io = engine();
  ::testing::internal::CaptureStderr();
  auto a = io->open_file(new_file(dir_.path() + "/a", 2 * kMiB));
  auto b = io->open_file(new_file(dir_.path() + "/b", 2 * kMiB));
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok());
  EXPECT_FALSE(io->file_info(*a)->direct);
  // One warning for the engine, not one per file.
  const auto first = warnings.find("refuses O_DIRECT");
  ASSERT_NE(first, std::string::npos) << warnings;
  EXPECT_EQ(warnings.find("refuses O_DIRECT", first + 1), std::string::npos) << warnings;

  AlignedBuffer out(2 * kMiB), in(2 * kMiB);
  stamp(out.data(), out.size(), 0, 21);
  auto w = io->submit({Op::kWrite, *a, 0, out.size(), out.data()});
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE(io->wait(*w).status.is_ok());
  auto r = io->submit({Op::kRead, *a, 0, in.size(), in.data()});
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(io->wait(*r).status.is_ok());
  EXPECT_EQ(first_unstamped(in.data(), in.size(), 0, 21), -1);
}

TEST_P(EngineFsTest, RequiredODirectIsAnErrorWhereRefused) {
  ScopedMount ramfs(dir_.path(), "ramfs", 0, "size=64m");
  if (!ramfs.ok()) GTEST_SKIP() << "cannot make a file system without O_DIRECT: " << ramfs.why();
  auto io = engine(DirectIo::kRequire);
  auto file = io->open_file(new_file(dir_.path() + "/a", kMiB));
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), ErrorCode::kUnavailable);
  EXPECT_NE(file.status().message().find("refuses O_DIRECT"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/a")) << "a failed create left a file";
}

TEST_P(EngineFsTest, FullFileSystemGivesNoSpaceWithTheNumbers) {
  ScopedMount small(dir_.path(), "tmpfs", 0, "size=1m,mode=0700");
  if (!small.ok()) GTEST_SKIP() << "cannot make a size-limited file system: " << small.why();
  auto io = engine();
  auto file = io->open_file(new_file(dir_.path() + "/big", 4 * kMiB));
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), ErrorCode::kNoSpace);
  EXPECT_NE(file.status().message().find("cannot reserve 4.00 MiB"), std::string::npos)
      << file.status().to_string();
  EXPECT_NE(file.status().message().find("1.00 MiB free"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/big")) << "a failed create left a file";
}

TEST_P(EngineFsTest, ReadOnlyDirectoryIsNamed) {
  ScopedMount ro(dir_.path(), "tmpfs", MS_RDONLY, "size=1m");
  if (!ro.ok()) GTEST_SKIP() << "cannot make a read-only file system: " << ro.why();
  auto io = engine();
  auto file = io->open_file(new_file(dir_.path() + "/state", kMiB));
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), ErrorCode::kIo);
  EXPECT_NE(file.status().message().find(dir_.path() + " is on a read-only file system"),
            std::string::npos)
      << file.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(RealEngines, EngineFsTest,
                         ::testing::Values(EngineKind::kUring, EngineKind::kPosix),
                         [](const auto& info) { return engine_kind_name(info.param); });

}  // namespace
}  // namespace strata::io
