// The CPU backend's stream-jitter mode (backend/cpu/cpu_backend.h) finds missing stream waits: a
// trainer with one wait planted out (common/fault_points.h, planted_race) still trains to the same
// bits on the plain CPU backend, whose compute stream is synchronous and hides the bug, but not
// under jitter, where the compute stream runs behind the host thread and every stream command is
// delayed at random. Without a planted race, jittered runs give the plain run's bits.
// The engine's bit-identity tests also run under jitter (CTest's jitter.* entries).
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>

#include "common/fault_points.h"
#include "support/run_strata.h"
#include "train/offload_support.h"

namespace strata {
namespace {

using testing::TempDir;
using testing::Tiers;

// Sets the process's jitter seed and planted race for one scope.
class Seams {
 public:
  Seams(std::optional<std::uint64_t> jitter, const std::string& race) {
    set_stream_jitter(jitter);
    set_planted_race(race);
  }
  ~Seams() {
    set_stream_jitter(std::nullopt);
    set_planted_race("");
  }
  Seams(const Seams&) = delete;
  Seams& operator=(const Seams&) = delete;
};

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> state;
};

TrainedRun train(const Tiers& tiers, std::optional<std::uint64_t> jitter, const std::string& race) {
  Seams seams(jitter, race);
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nvme");
  const config::Config config = testing::load(
      testing::tiny_config("llama", "bf16", tiers, dir.path() + "/out", dir.path() + "/nvme", 3));
  train::TrainerOptions options;
  options.quiet = true;
  auto trainer = train::Trainer::create(config, options);
  EXPECT_TRUE(trainer.is_ok()) << trainer.status().to_string();
  TrainedRun run;
  if (!trainer.is_ok()) return run;
  for (int s = 0; s < 3; ++s) {
    auto report = (*trainer)->train_step();
    EXPECT_TRUE(report.is_ok()) << report.status().to_string();
    if (!report.is_ok()) return run;
    run.losses.push_back(report->loss);
  }
  run.state = testing::state_bytes(**trainer);
  return run;
}

bool same(const TrainedRun& a, const TrainedRun& b) {
  return a.losses == b.losses && testing::same_bits(a.state, b.state);
}

const Tiers kInMemory{"in_memory", 0, "none", "none", "", ""};
const Tiers kParamsOnHost{"params_cpu", 3, "cpu", "cpu", "", ""};

TEST(StreamJitter, JitteredRunsGiveThePlainRunsBits) {
  for (const Tiers& tiers : {kInMemory, kParamsOnHost}) {
    const TrainedRun plain = train(tiers, std::nullopt, "");
    ASSERT_EQ(plain.losses.size(), 3u);
    for (std::uint64_t seed : {5u, 6u}) {
      EXPECT_TRUE(same(train(tiers, seed, ""), plain)) << tiers.name << ", seed " << seed;
    }
  }
}

// Each planted race: the plain backend does not see it; every jittered run does.
void expect_caught(const Tiers& tiers, const std::string& race) {
  const TrainedRun plain = train(tiers, std::nullopt, "");
  ASSERT_EQ(plain.losses.size(), 3u);
  EXPECT_TRUE(same(train(tiers, std::nullopt, race), plain))
      << race << ": the synchronous compute stream hides the missing wait";
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const TrainedRun jittered = train(tiers, seed, race);
    EXPECT_FALSE(same(jittered, plain)) << race << " went unnoticed with jitter seed " << seed;
  }
}

TEST(StreamJitter, CatchesTheGradientCopyNotWaitingForTheBackward) {
  // GradPath::ready: the device->host copy of a unit's gradient must wait for the kernels that
  // compute it (and the cast to the storage type).
  expect_caught(kInMemory, "grad.d2h_waits_for_compute");
}

TEST(StreamJitter, CatchesAFetchOverwritingAFrameStillBeingRead) {
  // ParamScheduler: a prefetch into a frame must wait for the kernels of the unit it held before.
  // This is the race the jitter mode found on its first run (docs/reliability.md).
  expect_caught(kParamsOnHost, "param.frame_free");
}

}  // namespace
}  // namespace strata
