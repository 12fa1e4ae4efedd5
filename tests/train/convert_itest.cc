// `strata convert`: a 2-rank checkpoint consolidates into the Hugging Face directory that the
// world-1 state's save_hf_model writes (byte-identical tensors, in fp32 and bf16), which
// load_hf_weights reads back; bad input exits non-zero naming the path.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "model/hf_io.h"
#include "model/safetensors.h"
#include "tests/support/run_strata.h"
#include "tests/train/rank_state_checks.h"

namespace strata::train {
namespace {

using testing::RankState;

constexpr std::uint64_t kSeed = 11;

// A 2-rank ZeRO-2 checkpoint of known values under `root`, and the same values in a world-1
// state (`one`).
std::string two_rank_checkpoint(const std::string& root, const std::string& family,
                                std::unique_ptr<RankState>& one) {
  std::vector<std::unique_ptr<RankState>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(testing::checked_rank_state(family, 2, r, 2));
    testing::checked_fill_known(*ranks.back());
  }
  one = testing::checked_rank_state(family, 0, 0, 1);
  testing::checked_fill_known(*one);
  const checkpoint::TrainerCounters c = testing::counters_after(7);
  EXPECT_TRUE(checkpoint::prepare_checkpoint(root, c.step).is_ok());
  std::vector<checkpoint::StateFileDigest> digests;
  for (int r = 0; r < 2; ++r) {
    auto d = checkpoint::write_checkpoint_shard(
        root, c.step, *ranks[static_cast<std::size_t>(r)]->state, {r, 2, 2});
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    if (d.is_ok()) digests.push_back(*d);
  }
  auto dir =
      checkpoint::commit_checkpoint(root, c, ranks[0]->shape, "fp32", kSeed, {0, 2, 2}, digests);
  EXPECT_TRUE(dir.is_ok()) << dir.status().to_string();
  return dir.is_ok() ? *dir : std::string();
}

Status save_reference(RankState& one, const std::string& dir, kernels::DType dtype) {
  return model::save_hf_model(
      dir, one.shape, one.layout,
      [&](int u) { return one.state->view(offload::SlotKind::kMaster, u); }, dtype);
}

void expect_same_tensors(const std::string& a_dir, const std::string& b_dir) {
  auto a = model::SafetensorsFile::open(a_dir + "/model.safetensors");
  auto b = model::SafetensorsFile::open(b_dir + "/model.safetensors");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (const model::StTensor& t : a->tensors()) {
    const model::StTensor* u = b->find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(t.dtype, u->dtype) << t.name;
    EXPECT_EQ(t.shape, u->shape) << t.name;
    ASSERT_EQ(t.end - t.begin, u->end - u->begin) << t.name;
    EXPECT_EQ(std::memcmp(a->data(t), b->data(*u), t.end - t.begin), 0) << t.name;
  }
  EXPECT_EQ(testing::read_file(a_dir + "/config.json"), testing::read_file(b_dir + "/config.json"));
}

TEST(Convert, TwoRanksConsolidateToTheOneRankModel) {
  testing::TempDir dir;
  std::unique_ptr<RankState> one;
  const std::string ckpt = two_rank_checkpoint(dir.path() + "/ckpt", "llama", one);
  ASSERT_FALSE(ckpt.empty());
  ASSERT_TRUE(save_reference(*one, dir.path() + "/reference", kernels::DType::kF32).is_ok());
  // The checkpoint root (through `latest`) works as well as the step directory.
  auto run = testing::run_strata({"convert", dir.path() + "/ckpt", dir.path() + "/hf"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("2 rank(s), ZeRO stage 2"), std::string::npos) << run.out;
  expect_same_tensors(dir.path() + "/reference", dir.path() + "/hf");

  std::vector<std::vector<float>> units;
  std::vector<float*> targets;
  for (const model::UnitLayout& unit : one->layout.units)
    units.emplace_back(static_cast<std::size_t>(unit.padded_numel), -1.0f);
  for (auto& u : units)
    targets.push_back(u.data());
  Status loaded = model::load_hf_weights(dir.path() + "/hf", one->layout, targets);
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  std::int64_t wrong = 0;
  for (const model::UnitLayout& unit : one->layout.units) {
    // The tied or untied layout puts each real element where known_value says.
    for (const model::TensorSlot& slot : unit.tensors) {
      for (std::int64_t i = slot.offset; i < slot.offset + slot.numel; ++i)
        wrong += units[static_cast<std::size_t>(unit.index)][static_cast<std::size_t>(i)] !=
                         testing::known_value(unit, offload::SlotKind::kMaster, i)
                     ? 1
                     : 0;
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Convert, Bf16MatchesSaveHfModel) {
  testing::TempDir dir;
  std::unique_ptr<RankState> one;
  const std::string ckpt = two_rank_checkpoint(dir.path() + "/ckpt", "gpt2", one);
  ASSERT_FALSE(ckpt.empty());
  ASSERT_TRUE(save_reference(*one, dir.path() + "/reference", kernels::DType::kBF16).is_ok());
  auto run = testing::run_strata({"convert", ckpt, dir.path() + "/hf", "--dtype", "bf16"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  expect_same_tensors(dir.path() + "/reference", dir.path() + "/hf");
}

TEST(Convert, NotACheckpointIsNamed) {
  testing::TempDir dir;
  auto run = testing::run_strata({"convert", dir.path(), dir.path() + "/hf"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("no checkpoint here"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find(dir.path()), std::string::npos) << run.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/hf"));
}

TEST(Convert, MissingShardIsNamed) {
  testing::TempDir dir;
  std::unique_ptr<RankState> one;
  const std::string ckpt = two_rank_checkpoint(dir.path() + "/ckpt", "gpt2", one);
  ASSERT_FALSE(ckpt.empty());
  std::filesystem::remove(ckpt + "/state-rank00000-of-00002.safetensors");
  auto run = testing::run_strata({"convert", ckpt, dir.path() + "/hf"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find(ckpt + "/state-rank00000-of-00002.safetensors"), std::string::npos)
      << run.err;
}

TEST(Convert, UnknownDtypeIsAUsageError) {
  testing::TempDir dir;
  auto run = testing::run_strata({"convert", dir.path(), dir.path() + "/hf", "--dtype", "fp8"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("--dtype"), std::string::npos) << run.err;
}

TEST(Convert, HelpDescribesTheCommand) {
  auto run = testing::run_strata({"convert", "--help"});
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_NE(run.out.find("CHECKPOINT"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("--dtype"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace strata::train
