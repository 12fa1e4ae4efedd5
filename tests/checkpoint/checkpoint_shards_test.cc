// Sharded checkpoints: every rank writes its shard, and a checkpoint loads at any world size
// (2 -> 1, 1 -> 2, 2 -> 3, stage 0 at 2 ranks), element for element; the old single-file format
// still loads; a missing rank file or an uncovered element is an error naming it. The ranks are
// offload stores built in-process (plans for rank r of W), so no MPI is needed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/reader.h"
#include "comm/comm.h"
#include "model/safetensors.h"
#include "tests/checkpoint/checkpoint_tamper.h"
#include "tests/support/run_strata.h"
#include "tests/train/rank_state_checks.h"

namespace strata::checkpoint {
namespace {

using testing::RankState;

constexpr std::uint64_t kSeed = 11;  // tiny_config's seed

TrainerCounters counters_at(std::int64_t step) {
  TrainerCounters c = testing::counters_after(step, 1);
  c.tokens_seen = 64 * step;
  c.data.epoch = 1;
  c.data.sample = 5;
  c.recent_losses = {3.5, 3.25};
  return c;
}

// Writes a checkpoint of `ranks` (all ranks of one world, in rank order) through the three phases.
Result<std::string> write_all(const std::string& root,
                              std::vector<std::unique_ptr<RankState>>& ranks, int stage,
                              std::int64_t step = 4) {
  const int world = static_cast<int>(ranks.size());
  STRATA_TRY(prepare_checkpoint(root, step).status());
  std::vector<StateFileDigest> digests;
  for (int r = 0; r < world; ++r) {
    STRATA_ASSIGN_OR_RETURN(
        StateFileDigest d,
        write_checkpoint_shard(root, step, *ranks[static_cast<std::size_t>(r)]->state,
                               CheckpointRank{r, world, stage}));
    if (!d.name.empty()) digests.push_back(std::move(d));
  }
  return commit_checkpoint(root, counters_at(step), ranks[0]->shape, "fp32", kSeed,
                           CheckpointRank{0, world, stage}, digests);
}

std::vector<std::unique_ptr<RankState>> world_of(int world, int stage,
                                                 const std::string& family = "gpt2",
                                                 const std::string& optimizer = "none",
                                                 const std::string& nvme = "/tmp") {
  std::vector<std::unique_ptr<RankState>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(testing::checked_rank_state(family, stage, r, world, optimizer, nvme));
  }
  return ranks;
}

Status load(const std::string& dir, RankState& r) {
  return read_checkpoint(dir, *r.state, r.shape, "fp32", kSeed).status();
}

TEST(CheckpointShards, EachRankWritesItsShardAndRankZeroTheMetadata) {
  testing::TempDir dir;
  auto ranks = world_of(2, 2);
  for (auto& r : ranks)
    testing::checked_fill_known(*r);
  auto written = write_all(dir.path(), ranks, 2);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  EXPECT_EQ(*written, dir.path() + "/step_00000004");
  EXPECT_EQ(testing::read_file(dir.path() + "/latest"), "step_00000004\n");
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/step_00000004.tmp"));
  const Json::Value meta =
      testing::parse_json(testing::read_file(*written + "/trainer_state.json"));
  EXPECT_EQ(meta["world_size"].asInt(), 2);
  EXPECT_EQ(meta["zero_stage"].asInt(), 2);
  EXPECT_EQ(meta["state_files"].asInt(), 2);
  for (int r = 0; r < 2; ++r) {
    auto file = model::SafetensorsFile::open(*written + "/" + state_file_name(r, 2));
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    const offload::UnitPlan& up =
        ranks[static_cast<std::size_t>(r)]->state->tiers().plan().units[1];
    const model::StTensor* t = file->find("block.0.exp_avg");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->shape, std::vector<std::int64_t>{up.shard_numel});
    EXPECT_EQ(file->metadata().at("block.0.shard_begin"), std::to_string(up.shard_begin));
    EXPECT_EQ(up.shard_numel * 2, up.padded_numel);
  }
}

TEST(CheckpointShards, TwoRanksLoadIntoOne) {
  testing::TempDir dir;
  auto ranks = world_of(2, 1);
  for (auto& r : ranks)
    testing::checked_fill_known(*r);
  auto written = write_all(dir.path(), ranks, 1);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  auto counters = read_checkpoint(*written, *one->state, one->shape, "fp32", kSeed);
  ASSERT_TRUE(counters.is_ok()) << counters.status().to_string();
  EXPECT_EQ(testing::checked_count_unknown(*one), 0);
  EXPECT_EQ(counters->step, 4);
  EXPECT_EQ(counters->adam_step, 3);
  EXPECT_EQ(counters->data.sample, 5);
  EXPECT_EQ(counters->recent_losses, (std::vector<double>{3.5, 3.25}));
}

TEST(CheckpointShards, OneRankLoadsIntoTwo) {
  testing::TempDir dir;
  auto one = testing::checked_rank_state("llama", 0, 0, 1);
  testing::checked_fill_known(*one, 1);
  auto written =
      write_checkpoint(dir.path(), counters_at(2), *one->state, one->shape, "fp32", kSeed);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  EXPECT_TRUE(std::filesystem::exists(*written + "/state-rank00000-of-00001.safetensors"));
  auto ranks = world_of(2, 3, "llama");
  for (auto& r : ranks) {
    ASSERT_TRUE(load(*written, *r).is_ok());
    EXPECT_EQ(testing::checked_count_unknown(*r, 1), 0);
  }
}

TEST(CheckpointShards, TwoRanksLoadIntoThree) {
  testing::TempDir dir;
  auto two = world_of(2, 2);
  for (auto& r : two)
    testing::checked_fill_known(*r, 2);
  auto written = write_all(dir.path(), two, 2);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  auto three = world_of(3, 2);
  for (auto& r : three) {
    Status s = load(*written, *r);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(testing::checked_count_unknown(*r, 2), 0);
  }
}

TEST(CheckpointShards, OffloadedShardsRoundTripThroughNvme) {
  testing::TempDir dir;
  auto two = world_of(2, 3, "gpt2", "nvme", dir.path());
  for (auto& r : two)
    testing::checked_fill_known(*r, 3);
  auto written = write_all(dir.path() + "/ckpt", two, 3);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  auto back = world_of(2, 3, "gpt2", "nvme", dir.path());
  for (auto& r : back) {
    ASSERT_TRUE(load(*written, *r).is_ok());
    EXPECT_EQ(testing::checked_count_unknown(*r, 3), 0);
  }
}

TEST(CheckpointShards, StageZeroAtTwoRanksWritesOneFile) {
  testing::TempDir dir;
  auto two = world_of(2, 0);
  for (auto& r : two)
    testing::checked_fill_known(*r, 1);
  auto written = write_all(dir.path(), two, 0);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  EXPECT_TRUE(std::filesystem::exists(*written + "/state-rank00000-of-00001.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(*written + "/state-rank00001-of-00002.safetensors"));
  auto sharded = world_of(2, 1);
  for (auto& r : sharded) {
    ASSERT_TRUE(load(*written, *r).is_ok());
    EXPECT_EQ(testing::checked_count_unknown(*r, 1), 0);
  }
}

// The format before rank files: one state.safetensors of whole units.
TEST(CheckpointShards, SingleFileFormatStillLoads) {
  testing::TempDir dir;
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  testing::checked_fill_known(*one, 2);
  auto written =
      write_checkpoint(dir.path(), counters_at(3), *one->state, one->shape, "fp32", kSeed);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  // Rewrite it as format 1 wrote it.
  std::vector<model::StTensorToWrite> tensors;
  std::vector<std::vector<float>> data;
  for (const model::UnitLayout& unit : one->layout.units) {
    for (offload::SlotKind kind : testing::kOptimizerKinds) {
      auto view = one->state->view(kind, unit.index);
      ASSERT_TRUE(view.is_ok());
      data.emplace_back(*view, *view + unit.padded_numel);
    }
  }
  std::size_t i = 0;
  for (const model::UnitLayout& unit : one->layout.units) {
    for (offload::SlotKind kind : testing::kOptimizerKinds) {
      tensors.push_back({unit.name + "." + offload::to_string(kind),
                         model::StDType::kF32,
                         {unit.padded_numel},
                         data[i++].data()});
    }
  }
  ASSERT_TRUE(model::write_safetensors(*written + "/state.safetensors", tensors,
                                       {{"format", "strata-checkpoint-1"}})
                  .is_ok());
  std::filesystem::remove(*written + "/" + state_file_name(0, 1));
  Json::Value meta = testing::parse_json(testing::read_file(*written + "/trainer_state.json"));
  meta["format"] = "strata-checkpoint-1";
  meta.removeMember("world_size");
  meta.removeMember("zero_stage");
  meta.removeMember("state_files");
  std::ofstream(*written + "/trainer_state.json") << meta.toStyledString();

  auto two = world_of(2, 2);
  for (auto& r : two) {
    Status s = load(*written, *r);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(testing::checked_count_unknown(*r, 2), 0);
  }
}

TEST(CheckpointShards, MissingRankFileIsNamed) {
  testing::TempDir dir;
  auto ranks = world_of(2, 1);
  auto written = write_all(dir.path(), ranks, 1);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  const std::string missing = *written + "/state-rank00001-of-00002.safetensors";
  std::filesystem::remove(missing);
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  Status s = load(*written, *one);
  EXPECT_EQ(s.code(), ErrorCode::kNotFound) << s.to_string();
  EXPECT_NE(s.to_string().find(missing), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("rank 1 of 2"), std::string::npos) << s.to_string();
}

TEST(CheckpointShards, CommitNamesARankThatDidNotWrite) {
  testing::TempDir dir;
  auto ranks = world_of(2, 1);
  ASSERT_TRUE(prepare_checkpoint(dir.path(), 4).is_ok());
  auto digest = write_checkpoint_shard(dir.path(), 4, *ranks[0]->state, {0, 2, 1});
  ASSERT_TRUE(digest.is_ok());
  StateFileDigest missing;
  missing.name = state_file_name(1, 2);
  auto committed = commit_checkpoint(dir.path(), counters_at(4), ranks[0]->shape, "fp32", kSeed,
                                     {0, 2, 1}, {*digest, missing});
  ASSERT_FALSE(committed.is_ok());
  EXPECT_NE(committed.status().to_string().find("state-rank00001-of-00002.safetensors"),
            std::string::npos)
      << committed.status().to_string();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/latest"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/step_00000004"));
}

// A rank file whose shard starts later than the unit's previous shard ends leaves real elements
// uncovered.
TEST(CheckpointShards, UncoveredRealElementsAreNamed) {
  testing::TempDir dir;
  auto ranks = world_of(2, 1);
  for (auto& r : ranks)
    testing::checked_fill_known(*r);
  auto written = write_all(dir.path(), ranks, 1);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  const std::string path = *written + "/" + state_file_name(1, 2);
  std::map<std::string, std::string> metadata;
  std::vector<model::StTensorToWrite> tensors;
  std::vector<std::vector<std::uint8_t>> bytes;
  {
    auto file = model::SafetensorsFile::open(path);
    ASSERT_TRUE(file.is_ok());
    metadata = file->metadata();
    for (const model::StTensor& t : file->tensors())
      bytes.emplace_back(file->data(t), file->data(t) + (t.end - t.begin));
    std::size_t i = 0;
    for (const model::StTensor& t : file->tensors())
      tensors.push_back({t.name, t.dtype, t.shape, bytes[i++].data()});
  }
  const std::int64_t begin = std::stoll(metadata.at("block.0.shard_begin"));
  const std::int64_t padded = std::stoll(metadata.at("block.0.padded_numel"));
  metadata["block.0.shard_begin"] = std::to_string(begin + 2048);
  metadata["block.0.padded_numel"] = std::to_string(padded + 2048);
  ASSERT_LT(begin + 2048, ranks[1]->layout.units[1].numel);
  ASSERT_TRUE(model::write_safetensors(path, tensors, metadata).is_ok());
  // The manifest is made to describe the changed file, so that its digests pass.
  testing::rewrite_manifest(*written, testing::read_manifest(*written));
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  Status s = load(*written, *one);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_NE(
      s.to_string().find(fmt::format("elements [{}, {}) of 'block.0.master'", begin, begin + 2048)),
      std::string::npos)
      << s.to_string();
}

TEST(CheckpointShards, WrongSeedIsRefused) {
  testing::TempDir dir;
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  auto written =
      write_checkpoint(dir.path(), counters_at(1), *one->state, one->shape, "fp32", kSeed);
  ASSERT_TRUE(written.is_ok());
  auto read = read_checkpoint(*written, *one->state, one->shape, "fp32", kSeed + 1);
  EXPECT_EQ(read.status().code(), ErrorCode::kInvalidArgument);
}

TEST(CheckpointShards, CommVariantWritesAtWorldOne) {
  testing::TempDir dir;
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  testing::checked_fill_known(*one, 3);
  auto comm = comm::create_single_comm();
  auto written = write_checkpoint(dir.path(), counters_at(5), *one->state, one->shape, "fp32",
                                  kSeed, CheckpointOptions{}, *comm);
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  auto back = testing::checked_rank_state("gpt2", 0, 0, 1);
  ASSERT_TRUE(load(*written, *back).is_ok());
  EXPECT_EQ(testing::checked_count_unknown(*back, 3), 0);
}

}  // namespace
}  // namespace strata::checkpoint
