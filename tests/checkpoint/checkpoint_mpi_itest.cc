// write_checkpoint(..., comm) across real processes (`mpirun -np N` of checkpoint_mpi_helper.cc):
// every rank writes its shard and the result loads into a single-rank state element for element;
// a rank that cannot write makes every rank fail at once, naming it, with no checkpoint left
// behind. Skips when mpirun is missing (tools/setup.sh installs it).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "support/mpi_run.h"
#include "support/run_strata.h"
#include "tests/train/rank_state_checks.h"

namespace strata::checkpoint {
namespace {

// `mpirun -np ranks` of the checkpoint helper (support/mpi_run.h).
testing::RunOutput run_ranks(int ranks, const std::vector<std::string>& args) {
  return testing::run_ranks(
      ranks, std::string(STRATA_TEST_BINARY_DIR) + "/strata_checkpoint_mpi_helper", args);
}

TEST(CheckpointMpi, TwoRanksWriteAndOneRankReads) {
  SKIP_WITHOUT_MPIRUN();
  testing::TempDir dir;
  auto r = run_ranks(2, {"write", dir.path(), "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string ckpt = dir.path() + "/step_00000003";
  EXPECT_NE(r.out.find("checkpoint " + ckpt), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/state-rank00001-of-00002.safetensors"));
  auto one = testing::checked_rank_state("gpt2", 0, 0, 1);
  auto counters = read_checkpoint(ckpt, *one->state, one->shape, "fp32", 11);
  ASSERT_TRUE(counters.is_ok()) << counters.status().to_string();
  EXPECT_EQ(counters->step, 3);
  EXPECT_EQ(testing::checked_count_unknown(*one), 0);
}

TEST(CheckpointMpi, ARankThatCannotWriteFailsEveryRank) {
  SKIP_WITHOUT_MPIRUN();
  testing::TempDir dir;
  auto r = run_ranks(2, {"fail", dir.path(), "1", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("rank 1 could not write its checkpoint shard"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir.path() + "/elsewhere/step_00000003.tmp"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/latest"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/step_00000003"));
}

}  // namespace
}  // namespace strata::checkpoint
