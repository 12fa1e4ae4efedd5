// What a checkpoint loader must refuse, by name: a flipped bit anywhere (a rank file's tensor or
// header, the manifest), a shard of another step put beside the others (even with the manifest
// made to match it), non-finite or impossible values, and a state that may not be checkpointed
// in the first place. The ranks are offload stores built in-process (rank_state_support.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "checkpoint/checkpoint.h"
#include "checkpoint/reader.h"
#include "model/safetensors.h"
#include "tests/checkpoint/checkpoint_tamper.h"
#include "tests/support/run_strata.h"
#include "tests/train/rank_state_checks.h"

namespace strata::checkpoint {
namespace {

constexpr std::uint64_t kSeed = 11;

// A world-1 checkpoint of step `step` holding known values; returns its directory.
std::string checkpoint_of(const std::string& root, std::int64_t step, int salt = 0) {
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  testing::checked_fill_known(*one, salt);
  auto dir =
      write_checkpoint(root, testing::counters_after(step), *one->state, one->shape, "fp32", kSeed);
  EXPECT_TRUE(dir.is_ok()) << dir.status().to_string();
  return dir.is_ok() ? *dir : std::string();
}

Status load(const std::string& dir) {
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  return read_checkpoint(dir, *one->state, one->shape, "fp32", kSeed).status();
}

void expect_refused(const Status& s, const std::string& fragment, const std::string& file) {
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_NE(s.to_string().find(fragment), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find(file), std::string::npos) << s.to_string();
}

std::string state_file(const std::string& dir) {
  return dir + "/" + state_file_name(0, 1);
}

TEST(CheckpointIntegrity, AnUntouchedCheckpointLoadsVerified) {
  testing::TempDir tmp;
  const std::string dir = checkpoint_of(tmp.path(), 3);
  auto reader = CheckpointReader::open(dir);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_TRUE(reader->verified());
  EXPECT_EQ(reader->format_version(), 3);
  EXPECT_TRUE(load(dir).is_ok());
}

TEST(CheckpointIntegrity, AFormatTwoCheckpointStillLoadsUnverified) {
  testing::TempDir tmp;
  const std::string dir = checkpoint_of(tmp.path(), 3, 4);
  Json::Value meta = testing::parse_json(testing::read_file(dir + "/trainer_state.json"));
  meta["format"] = "strata-checkpoint-2";
  meta.removeMember("files");
  meta.removeMember("checksum");
  std::ofstream(dir + "/trainer_state.json", std::ios::trunc) << meta.toStyledString();
  auto reader = CheckpointReader::open(dir);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_FALSE(reader->verified());
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  ASSERT_TRUE(read_checkpoint(dir, *one->state, one->shape, "fp32", kSeed).is_ok());
  EXPECT_EQ(testing::checked_count_unknown(*one, 4), 0);
}

TEST(CheckpointIntegrity, AFlippedBitInATensorIsNamed) {
  testing::TempDir tmp;
  const std::string dir = checkpoint_of(tmp.path(), 3);
  auto file = model::SafetensorsFile::open(state_file(dir));
  ASSERT_TRUE(file.is_ok());
  const model::StTensor* t = file->find("block.1.exp_avg");
  ASSERT_NE(t, nullptr);
  // Byte 13 of the tensor's data: the data section starts after the length and the header.
  const std::uint64_t header = file->file_bytes() - [&] {
    std::uint64_t data = 0;
    for (const model::StTensor& x : file->tensors())
      data += x.end - x.begin;
    return data;
  }();
  testing::flip_byte(state_file(dir), header + t->begin + 13, 0x10);
  expect_refused(load(dir), "tensor 'block.1.exp_avg' fails its checksum", state_file(dir));
}

TEST(CheckpointIntegrity, AFlippedBitInAHeaderIsNamed) {
  testing::TempDir tmp;
  const std::string dir = checkpoint_of(tmp.path(), 3);
  // Byte 20 is inside the JSON header (a character of "__metadata__" or a key): the file may
  // still parse, but it is not the file the manifest lists.
  testing::flip_byte(state_file(dir), 20, 0x01);
  Status s = load(dir);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_NE(s.to_string().find(state_file(dir)), std::string::npos) << s.to_string();
}

TEST(CheckpointIntegrity, AFlippedBitInTheManifestIsNamed) {
  testing::TempDir tmp;
  const std::string dir = checkpoint_of(tmp.path(), 3);
  const std::string manifest = dir + "/trainer_state.json";
  const std::string text = testing::read_file(manifest);
  // A digit of tokens_seen: still valid JSON with consistent counters, only the checksum knows.
  const std::size_t at = text.find("\"tokens_seen\"");
  ASSERT_NE(at, std::string::npos);
  testing::flip_byte(manifest, text.find_first_of("0123456789", at), 0x01);
  expect_refused(load(dir), "fails its checksum", manifest);
}

TEST(CheckpointIntegrity, ATruncatedShardIsNamed) {
  testing::TempDir tmp;
  const std::string dir = checkpoint_of(tmp.path(), 3);
  std::filesystem::resize_file(state_file(dir), std::filesystem::file_size(state_file(dir)) - 4);
  Status s = load(dir);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_NE(s.to_string().find(state_file(dir)), std::string::npos) << s.to_string();
}

TEST(CheckpointIntegrity, AShardOfAnOlderStepIsRefusedEvenWithAMatchingManifest) {
  testing::TempDir tmp;
  const std::string old_dir = checkpoint_of(tmp.path(), 2, 1);
  const std::string new_dir = checkpoint_of(tmp.path(), 4, 2);
  std::filesystem::copy_file(state_file(old_dir), state_file(new_dir),
                             std::filesystem::copy_options::overwrite_existing);
  expect_refused(load(new_dir), "the file is of step 2", state_file(new_dir));
  // Someone "repairs" the manifest's digests: the file's own identity still says step 2.
  testing::rewrite_manifest(new_dir, testing::read_manifest(new_dir));
  expect_refused(load(new_dir), "the file is of step 2", state_file(new_dir));
  // `strata convert` reads through the same checks.
  auto reader = CheckpointReader::open(new_dir);
  EXPECT_EQ(reader.status().code(), ErrorCode::kCorrupt) << reader.status().to_string();
}

// Rewrites tensor `name` of the checkpoint's rank file with element `index` set to `value`, and
// the manifest to match, so that only the value check stands between it and training.
void poison(const std::string& dir, const std::string& name, std::int64_t index, float value) {
  const std::string path = state_file(dir);
  std::map<std::string, std::string> metadata;
  std::vector<model::StTensorToWrite> tensors;
  std::vector<std::vector<float>> data;
  {
    auto file = model::SafetensorsFile::open(path);
    ASSERT_TRUE(file.is_ok());
    metadata = file->metadata();
    for (const model::StTensor& t : file->tensors()) {
      data.emplace_back(t.numel());
      std::memcpy(data.back().data(), file->data(t), t.end - t.begin);
      if (t.name == name) data.back()[static_cast<std::size_t>(index)] = value;
    }
    std::size_t i = 0;
    for (const model::StTensor& t : file->tensors())
      tensors.push_back({t.name, t.dtype, t.shape, data[i++].data()});
  }
  ASSERT_TRUE(model::write_safetensors(path, tensors, metadata).is_ok());
  testing::rewrite_manifest(dir, testing::read_manifest(dir));
}

TEST(CheckpointIntegrity, NonFiniteMastersAndMomentsAreRefusedByName) {
  testing::TempDir tmp;
  struct Case {
    const char* tensor;
    float value;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const Case& c : {Case{"block.0.master", nan}, Case{"head.master", inf},
                        Case{"embedding.exp_avg", -inf}, Case{"block.1.exp_avg_sq", -1.0f}}) {
    const std::string dir = checkpoint_of(tmp.path() + "/" + c.tensor, 3);
    poison(dir, c.tensor, 7, c.value);
    expect_refused(load(dir), fmt::format("tensor '{}' holds {} at element 7", c.tensor, c.value),
                   state_file(dir));
  }
}

TEST(CheckpointIntegrity, AStateWithANanIsNotCheckpointedAndLatestStays) {
  testing::TempDir tmp;
  const std::string good = checkpoint_of(tmp.path(), 2);
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  testing::checked_fill_known(*one);
  float* buffer = one->state->fill_buffer(offload::SlotKind::kMaster, 1);
  auto view = one->state->view(offload::SlotKind::kMaster, 1);
  ASSERT_TRUE(view.is_ok());
  std::memcpy(buffer, *view, static_cast<std::size_t>(one->layout.units[1].padded_numel) * 4);
  buffer[5] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(one->state->store(offload::SlotKind::kMaster, 1, buffer).is_ok());
  auto written = write_checkpoint(tmp.path(), testing::counters_after(4), *one->state, one->shape,
                                  "fp32", kSeed);
  ASSERT_FALSE(written.is_ok());
  EXPECT_NE(written.status().to_string().find("'block.0.master' holds nan at element 5"),
            std::string::npos)
      << written.status().to_string();
  EXPECT_EQ(testing::read_file(tmp.path() + "/latest"), "step_00000002\n");
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/step_00000004"));
  EXPECT_TRUE(load(good).is_ok());
}

}  // namespace
}  // namespace strata::checkpoint
