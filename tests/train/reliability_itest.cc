// `strata train` and `strata convert` in a hostile world, as users run them: a used output_dir
// is never silently replaced, a resume past train_steps is refused, checkpoints rotate, SIGTERM
// and SIGINT stop cleanly with a checkpoint (a second signal at once), a closed stdout is no
// failure, a torn metrics line is repaired on resume, a diverged run never publishes a non-finite
// model, and absurd settings or files are named errors (never a crash or a hang).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "tests/train/reliability_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::latest_step;
using testing::losses_of;
using testing::read_file;
using testing::reliability_config;
using testing::same_bytes;
using testing::TempDir;
using testing::train_with;

TEST(Reliability, AUsedOutputDirIsRefusedUnlessResumingOrOverwriting) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config =
      dir.write_file("c.json", reliability_config(out, 4, R"("checkpoint_every_steps": 2,)"));
  ASSERT_EQ(train_with(config).exit_code, 0);
  const std::string metrics = read_file(out + "/metrics.jsonl");

  auto again = train_with(config);
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.err.find(out + " holds another run"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("strata.overwrite_output_dir"), std::string::npos) << again.err;
  EXPECT_EQ(read_file(out + "/metrics.jsonl"), metrics);  // nothing was touched
  EXPECT_EQ(latest_step(out), 4);

  // Continuing the same run is what resume_from says.
  auto resumed = train_with(config, {"--set", "strata.train_steps=6", "--set",
                                     "strata.resume_from=" + out + "/checkpoints"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(latest_step(out), 6);

  // Starting over is what --overwrite says: the old checkpoints go.
  auto over = train_with(config, {"--overwrite", "--set", "strata.train_steps=2"});
  EXPECT_EQ(over.exit_code, 0) << over.err;
  EXPECT_EQ(latest_step(out), 2);
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step_00000006"));
  EXPECT_EQ(losses_of(out).size(), 2u);
}

TEST(Reliability, ResumingAtOrPastTrainStepsIsRefused) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config = dir.write_file("c.json", reliability_config(out, 4));
  ASSERT_EQ(train_with(config).exit_code, 0);
  for (const char* steps : {"3", "4"}) {
    auto r = train_with(config, {"--set", std::string("strata.train_steps=") + steps, "--set",
                                 "strata.resume_from=" + out + "/checkpoints"});
    EXPECT_EQ(r.exit_code, 2) << steps;
    EXPECT_NE(r.err.find("strata.train_steps"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("nothing is left to train"), std::string::npos) << r.err;
  }
}

TEST(Reliability, ASingleRankStageThreeRunRecordsItsStageAndRotates) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config = dir.write_file(
      "c.json",
      reliability_config(out, 5, R"("checkpoint_every_steps": 1, "checkpoint_keep_last": 2,)"));
  auto r = train_with(config, {"--set", "zero_optimization.stage=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json::Value meta =
      testing::parse_json(read_file(out + "/checkpoints/step_00000005/trainer_state.json"));
  EXPECT_EQ(meta["zero_stage"].asInt(), 3);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_00000004"));
  for (const char* gone : {"step_00000001", "step_00000002", "step_00000003"})
    EXPECT_FALSE(fs::exists(out + "/checkpoints/" + gone)) << gone;
}

// The reference: N uninterrupted steps in `name`.
std::string reference(const TempDir& dir, const std::string& name, int steps) {
  const std::string out = dir.path() + "/" + name;
  auto r = train_with(dir.write_file(name + ".json", reliability_config(out, steps)));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

TEST(Reliability, SigtermStopsAfterTheStepWithACheckpointAndTheResumeIsBitIdentical) {
  TempDir dir;
  const std::string out = dir.path() + "/stopped";
  const std::string config = dir.write_file("c.json", reliability_config(out, 100000));
  auto r = testing::sh_then_strata(testing::signal_after_step(out, 2, "-TERM $$"),
                                   {"train", "--config", config, "--quiet"});
  ASSERT_EQ(r.exit_code, 128 + 15) << r.err;
  const int stopped = latest_step(out);
  ASSERT_GE(stopped, 2) << r.err;
  EXPECT_NE(r.err.find("stopped by SIGTERM after step " + std::to_string(stopped)),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--resume-from " + out + "/checkpoints/"), std::string::npos) << r.err;
  const Json::Value summary = testing::parse_json(r.out);
  EXPECT_EQ(summary["stopped_by"].asString(), "SIGTERM");
  EXPECT_FALSE(fs::exists(out + "/final"));

  const int steps = stopped + 3;
  auto resumed = train_with(config, {"--set", "strata.train_steps=" + std::to_string(steps),
                                     "--set", "strata.resume_from=" + out + "/checkpoints"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const std::string straight = reference(dir, "straight", steps);
  EXPECT_TRUE(same_bytes(straight + "/final/model.safetensors", out + "/final/model.safetensors"));
  EXPECT_EQ(losses_of(straight), losses_of(out));
}

TEST(Reliability, ASecondSigintStopsAtOnce) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config = dir.write_file("c.json", reliability_config(out, 100000));
  // Steps long enough (~0.6 s here) that the second signal, 50 ms after the first, lands while
  // the first waits for the step; two signals sent back to back could merge into one.
  auto r = testing::sh_then_strata(
      testing::signal_after_step(out, 1, "-INT $$; sleep 0.05; kill -INT $$"),
      {"train", "--config", config, "--quiet", "--set", "train_micro_batch_size_per_gpu=128",
       "--set", "gradient_accumulation_steps=16"});
  EXPECT_EQ(r.exit_code, 128 + 2) << r.err;
  EXPECT_NE(r.err.find("stop requested"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("stopped by SIGINT after step"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Reliability, AClosedStdoutDoesNotFailAFinishedRun) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config = dir.write_file("c.json", reliability_config(out, 2));
  // `true` exits at once, so the summary's write finds no reader (EPIPE; SIGPIPE without care).
  auto r = testing::run_program(
      "/bin/sh", {"-c", "{ " + std::string(STRATA_BINARY) + " train --config " + config +
                            " --quiet; echo $? > " + dir.path() + "/rc; } | true"});
  EXPECT_EQ(read_file(dir.path() + "/rc"), "0\n") << r.err;
  EXPECT_TRUE(fs::exists(out + "/final/model.safetensors"));
}

TEST(Reliability, ATornMetricsLineIsRepairedOnResume) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config =
      dir.write_file("c.json", reliability_config(out, 4, R"("checkpoint_every_steps": 2,)"));
  ASSERT_EQ(train_with(config).exit_code, 0);
  // As after a crash between steps 2 and 4 on a full disk: the step-4 checkpoint is not there,
  // and the metrics end in the middle of a line.
  fs::remove_all(out + "/checkpoints/step_00000004");
  std::ofstream(out + "/checkpoints/latest", std::ios::trunc) << "step_00000002\n";
  std::ofstream(out + "/metrics.jsonl", std::ios::app) << R"({"step":5,"lo)";
  auto resumed = train_with(config, {"--set", "strata.resume_from=" + out + "/checkpoints"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto losses = losses_of(out);  // every line parses, every step once
  EXPECT_EQ(losses.size(), 4u);
  EXPECT_EQ(losses, losses_of(reference(dir, "straight", 4)));
}

TEST(Reliability, TheTraceFolderIsCreatedPrivate) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config = dir.write_file("c.json", reliability_config(out, 1));
  auto r = train_with(config, {"--trace", dir.path() + "/traces/a/trace.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.path() + "/traces/a/trace.json"));
  EXPECT_EQ(fs::status(dir.path() + "/traces/a").permissions(), fs::perms::owner_all);
}

TEST(Reliability, ADivergedRunStopsAndWritesNoNonFiniteModel) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config = dir.write_file("c.json", reliability_config(out, 20));
  auto r = train_with(config, {"--set", "optimizer.params.lr=1e30"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("were all skipped"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out + "/final/model.safetensors"));
}

TEST(Reliability, AbsurdSettingsAndFilesAreNamedErrors) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  const std::string config = dir.write_file("c.json", reliability_config(out, 2));
  auto batch = train_with(config, {"--set", "train_micro_batch_size_per_gpu=4611686018427387904"});
  EXPECT_EQ(batch.exit_code, 2) << batch.err;
  EXPECT_NE(batch.err.find("train_micro_batch_size_per_gpu"), std::string::npos) << batch.err;

  const std::string model = dir.path() + "/model";
  fs::create_directories(model);
  dir.write_file("model/config.json", R"({"model_type": "gpt2", "n_layer": 1e9})");
  auto layers = train_with(config, {"--set", "strata.model.path=" + model});
  EXPECT_EQ(layers.exit_code, 2) << layers.err;
  EXPECT_NE(layers.err.find("n_layer"), std::string::npos) << layers.err;

  const std::string fifo = dir.path() + "/tokens.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto tokens = train_with(
      config, {"--set", "strata.data.source=tokens", "--set", "strata.data.path=" + fifo});
  EXPECT_EQ(tokens.exit_code, 1) << tokens.err;
  EXPECT_NE(tokens.err.find("FIFO"), std::string::npos) << tokens.err;

  const std::string long_path = dir.path() + "/" + std::string(300, 'x');
  auto resume = train_with(config, {"--set", "strata.resume_from=" + long_path});
  EXPECT_EQ(resume.exit_code, 1) << resume.err;
  EXPECT_NE(resume.err.find("too long"), std::string::npos) << resume.err;
}

TEST(Convert, ANonEmptyOutDirIsRefusedUnlessOverwrite) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  ASSERT_EQ(train_with(dir.write_file("c.json", reliability_config(out, 1))).exit_code, 0);
  const std::string target = dir.path() + "/hf";
  fs::create_directories(target);
  dir.write_file("hf/keep.txt", "mine");
  auto refused = testing::run_strata({"convert", out + "/checkpoints", target});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("not empty"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(target + "/model.safetensors"));
  auto over = testing::run_strata({"convert", out + "/checkpoints", target, "--overwrite"});
  EXPECT_EQ(over.exit_code, 0) << over.err;
  EXPECT_NE(over.out.find("checksums verified"), std::string::npos) << over.out;
  EXPECT_TRUE(same_bytes(target + "/model.safetensors", out + "/final/model.safetensors"));
  EXPECT_EQ(read_file(target + "/keep.txt"), "mine");
}

TEST(Convert, APathComponentTooLongIsANamedError) {
  TempDir dir;
  for (const auto& args :
       {std::vector<std::string>{"convert", dir.path() + "/" + std::string(300, 'c'), "out"},
        std::vector<std::string>{"convert", dir.path(),
                                 dir.path() + "/" + std::string(300, 'o')}}) {
    auto r = testing::run_strata(args);
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << r.exit_code << r.err;
    EXPECT_NE(r.err.find("strata: "), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace strata
