// SIGTERM to one rank of `mpirun -np 2 strata train`: the ranks agree (the stop request rides the
// step's loss/norm all-reduce) and both stop after the same step with one complete two-rank
// checkpoint instead of hanging in a collective; resuming on two ranks then ends bit-identical to
// an uninterrupted two-rank run. Skips without mpirun.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/mpi_run.h"
#include "tests/train/reliability_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

testing::RunOutput two_ranks(const std::string& config, const std::string& before,
                             const std::vector<std::string>& extra = {}) {
  std::string command = before + " exec " + std::string(STRATA_BINARY) + " train --config " +
                        config + " --quiet --set zero_optimization.stage=2 --set " +
                        "strata.comm_timeout_s=30";
  for (const std::string& e : extra)
    command += " --set " + e;
  return testing::run_ranks(2, "/bin/sh", {"-c", command}, 180);
}

TEST(StopMpi, ASignalToOneRankStopsBothAfterTheSameStep) {
  SKIP_WITHOUT_MPIRUN();
  testing::TempDir dir;
  const std::string out = dir.path() + "/stopped";
  const std::string config = dir.write_file("c.json", testing::reliability_config(out, 100000));
  const std::string signal_rank_1 = "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then " +
                                    testing::signal_after_step(out, 2, "-TERM $$") + " fi;";
  auto r = two_ranks(config, signal_rank_1);
  EXPECT_NE(r.exit_code, 0);
  const int stopped = testing::latest_step(out);
  ASSERT_GE(stopped, 2) << r.out << r.err;
  const std::string ckpt = out + "/checkpoints/" + fmt::format("step_{:08d}", stopped);
  EXPECT_TRUE(fs::exists(ckpt + "/state-rank00000-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(ckpt + "/state-rank00001-of-00002.safetensors"));
  EXPECT_NE(r.err.find("stopped by another rank's signal after step " + std::to_string(stopped)),
            std::string::npos)
      << r.err;
  EXPECT_EQ(testing::losses_of(out).size(), static_cast<std::size_t>(stopped));

  const int steps = stopped + 2;
  auto resumed = two_ranks(config, "",
                           {"strata.train_steps=" + std::to_string(steps),
                            "strata.resume_from=" + out + "/checkpoints"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const std::string straight = dir.path() + "/straight";
  const std::string straight_config =
      dir.write_file("s.json", testing::reliability_config(straight, steps));
  ASSERT_EQ(two_ranks(straight_config, "").exit_code, 0);
  EXPECT_TRUE(
      testing::same_bytes(straight + "/final/model.safetensors", out + "/final/model.safetensors"));
}

}  // namespace
}  // namespace strata
