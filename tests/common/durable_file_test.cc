// Durable, atomic writes: the content lands whole under its final name, and a full disk, an I/O
// error at fsync or a failed rename (injected: common/fault_points.h) is an error naming the file
// that leaves the previous content in place and no temporary file behind.
#include "common/durable_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/fault_points.h"
#include "support/run_strata.h"

namespace strata {
namespace {

using testing::read_file;
using testing::TempDir;

// Removes the injected fault when a test ends, whatever happens.
struct FaultScope {
  explicit FaultScope(FileFault fault) { set_file_fault(std::move(fault)); }
  ~FaultScope() { set_file_fault(std::nullopt); }
};

TEST(DurableFile, WritesAtomically) {
  TempDir dir;
  const std::string path = dir.path() + "/latest";
  ASSERT_TRUE(write_file_atomically(path, "one\n").is_ok());
  ASSERT_TRUE(write_file_atomically(path, "two\n").is_ok());
  EXPECT_EQ(read_file(path), "two\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(DurableFile, AFullDiskNamesTheFileAndKeepsTheOldContent) {
  TempDir dir;
  const std::string path = dir.path() + "/state";
  ASSERT_TRUE(write_file_atomically(path, "old").is_ok());
  FaultScope fault(FileFault{"state", FileOp::kWrite, 28, 2});
  Status s = write_file_atomically(path, "new content");
  EXPECT_EQ(s.code(), ErrorCode::kNoSpace) << s.to_string();
  EXPECT_EQ(s.context(), path + ".tmp");
  EXPECT_NE(s.message().find("file system is full"), std::string::npos) << s.to_string();
  EXPECT_EQ(read_file(path), "old");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(DurableFile, AnIoErrorAtFsyncIsReported) {
  TempDir dir;
  const std::string path = dir.path() + "/state";
  ASSERT_TRUE(write_file_atomically(path, "old").is_ok());
  FaultScope fault(FileFault{"state", FileOp::kSync, 5, 0});
  Status s = write_file_atomically(path, "new");
  EXPECT_EQ(s.code(), ErrorCode::kIo) << s.to_string();
  EXPECT_NE(s.message().find("fsync failed"), std::string::npos) << s.to_string();
  EXPECT_EQ(read_file(path), "old");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(DurableFile, AFailedRenameKeepsTheOldContent) {
  TempDir dir;
  const std::string path = dir.path() + "/state";
  ASSERT_TRUE(write_file_atomically(path, "old").is_ok());
  FaultScope fault(FileFault{"state", FileOp::kRename, 5, 0});
  Status s = write_file_atomically(path, "new");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.context(), path);
  EXPECT_EQ(read_file(path), "old");
}

TEST(DurableFile, AFaultElsewhereDoesNotApply) {
  TempDir dir;
  FaultScope fault(FileFault{"other-file", FileOp::kWrite, 28, 0});
  EXPECT_TRUE(write_file_atomically(dir.path() + "/state", "fine").is_ok());
}

}  // namespace
}  // namespace strata
