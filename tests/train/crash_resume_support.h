// kill -9 at random points of training and of checkpoint writes, then recovery as a user would
// do it: resume from `latest` (never a torn checkpoint), take the model with `strata convert`
// when the last checkpoint is the final step, or start afresh when no checkpoint was complete.
// The recovered model must equal an uninterrupted run's bit for bit. Points come from a seed
// that is printed, so a failure replays.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "tests/train/reliability_support.h"

namespace strata::testing {

inline constexpr int kCrashSteps = 6;  // checkpoints every 2 steps: at 2, 4 and 6

struct CrashScenario {
  std::string name;
  std::vector<std::string> env;  // e.g. STRATA_TEST_CRASH_POINT=17
  double kill_after_s = -1.0;    // >= 0: SIGKILL after this many seconds instead
};

class CrashHarness {
 public:
  explicit CrashHarness(const TempDir& dir) : dir_(dir) {
    const std::string out = dir_.path() + "/reference";
    const auto start = std::chrono::steady_clock::now();
    auto r = train_with(config_for(out));
    reference_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 0) << r.err;
    reference_model_ = out + "/final/model.safetensors";
  }

  double reference_seconds() const { return reference_s_; }

  // The names of the crash points a whole run passes, in order (STRATA_TEST_CRASH_POINT=trace).
  std::vector<std::string> crash_points() {
    const std::string out = dir_.path() + "/trace";
    auto r = train_with(config_for(out), {}, {"STRATA_TEST_CRASH_POINT=trace"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> names;
    const std::regex line("strata: crash point ([0-9]+): ([a-z_.]+)");
    for (std::sregex_iterator it(r.err.begin(), r.err.end(), line), end; it != end; ++it)
      names.push_back((*it)[2]);
    return names;
  }

  // Crashes a run as `s` says, recovers, and checks the model against the reference.
  void crash_and_recover(const CrashScenario& s) {
    SCOPED_TRACE(s.name);
    const std::string out = dir_.path() + "/" + s.name;
    const std::string config = config_for(out);
    RunOutput crashed;
    if (s.kill_after_s >= 0.0) {
      crashed = sh_then_strata(
          "( sleep " + std::to_string(s.kill_after_s) + "; kill -9 $$ 2>/dev/null ) & ",
          {"train", "--config", config, "--quiet"}, s.env);
    } else {
      crashed = train_with(config, {}, s.env);
      EXPECT_EQ(crashed.exit_code, 128 + 9) << crashed.err;
    }
    if (crashed.exit_code == 0) {  // the timer fired after the run had finished
      EXPECT_TRUE(same_bytes(reference_model_, out + "/final/model.safetensors"));
      return;
    }
    const int latest = latest_step(out);
    std::string model = out + "/final/model.safetensors";
    if (latest == kCrashSteps) {
      // Killed after the last checkpoint, while (or before) writing final/.
      auto r = run_strata({"convert", out + "/checkpoints", out + "/recovered"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      model = out + "/recovered/model.safetensors";
    } else if (latest > 0) {
      auto r = train_with(config, {"--set", "strata.resume_from=" + out + "/checkpoints"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    } else {
      auto r = train_with(config, {"--overwrite"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    EXPECT_TRUE(same_bytes(reference_model_, model)) << "latest step " << latest;
  }

 private:
  std::string config_for(const std::string& out) {
    const std::string name = std::filesystem::path(out).filename().string() + ".json";
    return dir_.write_file(name,
                           reliability_config(out, kCrashSteps, R"("checkpoint_every_steps": 2,)"));
  }

  const TempDir& dir_;
  double reference_s_ = 0.0;
  std::string reference_model_;
};

// Kills at `count` crash points drawn from `seed` (all of them when count <= 0), then at
// `timed` random moments of a run.
inline void crash_everywhere(std::uint64_t seed, int count, int timed) {
  std::printf("crash seed %llu\n", static_cast<unsigned long long>(seed));
  TempDir dir;
  CrashHarness harness(dir);
  const std::vector<std::string> points = harness.crash_points();
  ASSERT_GT(points.size(), 100u);  // three checkpoints and the final model, each many steps
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < points.size(); ++i)
    chosen.push_back(i);
  if (count > 0) {
    std::shuffle(chosen.begin(), chosen.end(), rng);
    chosen.resize(static_cast<std::size_t>(count));
  }
  for (std::size_t i : chosen) {
    std::printf("crash point %zu: %s\n", i + 1, points[i].c_str());
    harness.crash_and_recover(
        {"point" + std::to_string(i + 1), {"STRATA_TEST_CRASH_POINT=" + std::to_string(i + 1)}});
  }
  std::uniform_real_distribution<double> when(0.0, harness.reference_seconds());
  for (int k = 0; k < timed; ++k) {
    const double t = when(rng);
    std::printf("kill -9 after %.3f s\n", t);
    harness.crash_and_recover({"timed" + std::to_string(k), {}, t});
  }
}

}  // namespace strata::testing
