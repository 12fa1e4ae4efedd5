// Bounded reading of hostile files: only regular files (a FIFO, /dev/zero or a directory is
// refused at once, never waited on or read without end), a size limit, JSON depth and size
// limits, and named errors instead of jsoncpp's exceptions.
#include "common/bounded_read.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "support/run_strata.h"

namespace strata {
namespace {

using testing::TempDir;

TEST(BoundedRead, ReadsARegularFile) {
  TempDir dir;
  const std::string path = dir.write_file("a.txt", "hello");
  auto text = read_regular_file(path, 16, "the test file");
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_EQ(*text, "hello");
}

TEST(BoundedRead, RefusesAFileOverItsLimit) {
  TempDir dir;
  const std::string path = dir.write_file("a.txt", std::string(100, 'x'));
  auto text = read_regular_file(path, 99, "the test file");
  ASSERT_FALSE(text.is_ok());
  EXPECT_EQ(text.status().context(), path);
  EXPECT_NE(text.status().message().find("more than the 99 bytes"), std::string::npos)
      << text.status().to_string();
}

TEST(BoundedRead, RefusesAFifoWithoutWaitingForAWriter) {
  TempDir dir;
  const std::string path = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto text = read_regular_file(path, 1 << 20, "the test file");  // would block without the check
  ASSERT_FALSE(text.is_ok());
  EXPECT_NE(text.status().message().find("FIFO"), std::string::npos) << text.status().to_string();
}

TEST(BoundedRead, RefusesALinkToDevZero) {
  TempDir dir;
  const std::string path = dir.path() + "/zero";
  std::filesystem::create_symlink("/dev/zero", path);
  auto text = read_regular_file(path, 1 << 20, "the test file");
  ASSERT_FALSE(text.is_ok());
  EXPECT_NE(text.status().message().find("character device"), std::string::npos)
      << text.status().to_string();
}

TEST(BoundedRead, RefusesADirectoryAndNamesAMissingFile) {
  TempDir dir;
  auto directory = read_regular_file(dir.path(), 16, "the test file");
  EXPECT_NE(directory.status().message().find("a directory"), std::string::npos);
  auto missing = read_regular_file(dir.path() + "/none", 16, "the test file");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
}

TEST(BoundedRead, RefusesAPathComponentLongerThanTheFileSystemAllows) {
  auto text = read_regular_file("/tmp/" + std::string(300, 'a') + "/x", 16, "the test file");
  ASSERT_FALSE(text.is_ok());
  EXPECT_EQ(text.status().code(), ErrorCode::kIo) << text.status().to_string();
}

TEST(BoundedJson, RefusesNestingBeyondTheLimitNamingWhere) {
  JsonLimits limits;
  limits.depth_max = 8;
  const std::string deep = std::string(9, '[') + std::string(9, ']');
  auto v = parse_json_bounded(deep, "deep.json", limits);
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(v.status().message().find("deeper than 8 levels at line 1, column 9"),
            std::string::npos)
      << v.status().to_string();
  EXPECT_TRUE(
      parse_json_bounded(std::string(8, '[') + std::string(8, ']'), "ok.json", limits).is_ok());
}

TEST(BoundedJson, HundredThousandLevelsAreRefusedWithoutRecursion) {
  const std::string deep = std::string(100000, '{');
  auto v = parse_json_bounded(deep, "deep.json", JsonLimits{});
  EXPECT_EQ(v.status().code(), ErrorCode::kCorrupt) << v.status().to_string();
}

TEST(BoundedJson, BracketsInsideStringsDoNotCount) {
  JsonLimits limits;
  limits.depth_max = 2;
  auto v = parse_json_bounded(R"({"a": "[[[[{{{{\"", "b": [1]})", "s.json", limits);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ((*v)["b"][0].asInt(), 1);
}

TEST(BoundedJson, MalformedAndDuplicateKeysAreNamedOnOneLine) {
  auto bad = parse_json_bounded("{\"a\": 1,,}", "bad.json", JsonLimits{});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().context(), "bad.json");
  EXPECT_EQ(bad.status().message().find('\n'), std::string::npos) << bad.status().message();
  auto dup = parse_json_bounded(R"({"a": 1, "a": 2})", "dup.json", JsonLimits{});
  EXPECT_NE(dup.status().message().find("Duplicate key"), std::string::npos)
      << dup.status().to_string();
}

TEST(BoundedJson, SizeLimitIsChecked) {
  JsonLimits limits;
  limits.bytes_max = 10;
  auto v = parse_json_bounded(R"({"a": "0123456789"})", "big.json", limits);
  EXPECT_NE(v.status().message().find("exceed the limit of 10 bytes"), std::string::npos)
      << v.status().to_string();
}

}  // namespace
}  // namespace strata
