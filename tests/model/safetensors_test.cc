// The safetensors reader treats files as hostile: every malformed header, offset or shape is a
// clear kCorrupt error, random corruption never crashes; the writer round-trips.
#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "kernels/cpu/cast.h"
#include "support/run_strata.h"

namespace strata::model {
namespace {

// A file from a raw header text and data bytes.
std::string make_file(const testing::TempDir& dir, const std::string& header,
                      const std::string& data, std::uint64_t declared = UINT64_MAX) {
  const std::uint64_t n = declared == UINT64_MAX ? header.size() : declared;
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return dir.write_file("t.safetensors", bytes + header + data);
}

Status open_status(const std::string& path) {
  return SafetensorsFile::open(path).status();
}

void expect_corrupt(const std::string& path, const std::string& fragment) {
  Status s = open_status(path);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_NE(s.to_string().find(fragment), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find(path), std::string::npos) << s.to_string();
}

TEST(Safetensors, WriteThenReadRoundTrips) {
  testing::TempDir dir;
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1.0f};
  std::vector<std::uint16_t> b(4);
  const float bsrc[4] = {0.5f, 1.0f, -3.0f, 100.0f};
  kernels::cast_array(b.data(), kernels::DType::kBF16, bsrc, kernels::DType::kF32, 4);
  const std::string path = dir.path() + "/m.safetensors";
  ASSERT_TRUE(write_safetensors(path,
                                {{"layer.a", StDType::kF32, {2, 3}, a.data()},
                                 {"b \"quoted\"", StDType::kBF16, {4}, b.data()}},
                                {{"format", "pt"}})
                  .is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  ASSERT_EQ(file->tensors().size(), 2u);
  std::vector<float> got(6), got_b(4);
  ASSERT_TRUE(file->read_f32("layer.a", {2, 3}, got.data()).is_ok());
  EXPECT_EQ(got, a);
  ASSERT_TRUE(file->read_f32("b \"quoted\"", {4}, got_b.data()).is_ok());
  EXPECT_EQ(got_b, (std::vector<float>{0.5f, 1.0f, -3.0f, 100.0f}));
  Status wrong = file->read_f32("layer.a", {3, 2}, got.data());
  EXPECT_NE(wrong.to_string().find("shape [2, 3], expected [3, 2]"), std::string::npos);
  EXPECT_EQ(file->read_f32("missing", {1}, got.data()).code(), ErrorCode::kNotFound);
}

TEST(Safetensors, RejectsTruncatedAndOversizedHeaders) {
  testing::TempDir dir;
  expect_corrupt(dir.write_file("short.safetensors", "abc"), "too short");
  expect_corrupt(make_file(dir, "{}", "", 1000), "runs past the end");
  expect_corrupt(make_file(dir, "{}", "", 200ull << 20), "100 MiB");
  expect_corrupt(make_file(dir, "[1,2]", ""), "does not start with '{'");
  expect_corrupt(make_file(dir, "{\"a\": ", ""), "not a valid JSON object");
  expect_corrupt(make_file(dir, "{} junk", ""), "not a valid JSON object");
}

TEST(Safetensors, RejectsBadEntries) {
  testing::TempDir dir;
  const std::string four(4, '\0');
  expect_corrupt(
      make_file(
          dir,
          R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
          four),
      "not a valid JSON");
  expect_corrupt(make_file(dir, R"({"x":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", four),
                 "unknown dtype 'Q7'");
  expect_corrupt(make_file(dir, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four),
                 "needs 8 bytes but data_offsets span 4");
  expect_corrupt(make_file(dir, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", four),
                 "outside the 4 data bytes");
  expect_corrupt(make_file(dir, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", four),
                 "outside");
  expect_corrupt(make_file(dir, R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four),
                 "dimension");
  expect_corrupt(
      make_file(dir, R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", four),
      "dimension");
  expect_corrupt(
      make_file(
          dir,
          R"({"x":{"dtype":"U8","shape":[281474976710656,281474976710656],"data_offsets":[0,4]}})",
          four),
      "overflows");
  expect_corrupt(make_file(dir, R"({"x":{"dtype":"F32","shape":[1]}})", four), "data_offsets");
  expect_corrupt(
      make_file(dir, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", four),
      "unknown field 'extra'");
  expect_corrupt(make_file(dir, R"({"x":[1,2]})", four), "not an object");
  expect_corrupt(make_file(dir, R"({"__metadata__":{"k":1}})", ""), "__metadata__.k");
}

TEST(Safetensors, RejectsOverlapsHolesAndTrailingBytes) {
  testing::TempDir dir;
  const std::string eight(8, '\0');
  expect_corrupt(
      make_file(
          dir,
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
          eight),
      "overlaps");
  expect_corrupt(make_file(dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
                 "belong to no tensor");
  expect_corrupt(make_file(dir, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight),
                 "at the end of the data");
}

TEST(Safetensors, ReadingAnUnsupportedDtypeIsAnError) {
  testing::TempDir dir;
  const std::string path = make_file(
      dir, R"({"ids":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok());
  float out = 0;
  Status s = file->read_f32("ids", {1}, &out);
  EXPECT_NE(s.to_string().find("dtype I32; valid: F32, F64, F16, BF16"), std::string::npos);
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  testing::TempDir dir;
  std::vector<float> a(64, 1.0f), b(32, 2.0f);
  const std::string path = dir.path() + "/ok.safetensors";
  ASSERT_TRUE(write_safetensors(
                  path,
                  {{"a", StDType::kF32, {8, 8}, a.data()}, {"b", StDType::kF32, {32}, b.data()}},
                  {{"format", "pt"}})
                  .is_ok());
  const std::string original = testing::read_file(path);
  std::mt19937_64 rng(1234);
  int opened = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes = original;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Mostly the length prefix and header, where parsing happens.
      const std::size_t limit = std::min<std::size_t>(bytes.size(), 8 + 200);
      bytes[rng() % limit] = static_cast<char>(rng() & 0xff);
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    const std::string p = dir.write_file("fuzz.safetensors", bytes);
    auto file = SafetensorsFile::open(p);
    if (file.is_ok()) {
      ++opened;
      for (const StTensor& t : file->tensors()) {
        std::vector<float> out(t.numel() + 1);
        (void)file->read_f32(t.name, t.shape, out.data());
      }
    } else {
      EXPECT_FALSE(file.status().message().empty());
    }
  }
  EXPECT_LT(opened, 500);
}

}  // namespace
}  // namespace strata::model
