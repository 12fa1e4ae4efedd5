// ZeRO stages 0-3 across two ranks: `mpirun -np 2 strata train` on the CPU backend (MPI) against
// one rank that accumulates the same micro-batches. The ranks take turns through one stream of
// micro-batches and gradients are summed in rank order (comm.h), so in fp32 two ranks x b must
// equal one rank x 2 accumulated micro-batches of b to within fp32 rounding — the tolerance below
// is a relative 1e-6 of the largest weight; on this CPU backend the results are in fact
// bit-identical, which the repeat test relies on for two-rank runs. Skips without mpirun.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <json/json.h>

#include "model/safetensors.h"
#include "offload_support.h"
#include "support/mpi_run.h"
#include "support/run_strata.h"

namespace strata::train {
namespace {

using testing::RunOutput;
using testing::TempDir;
using testing::Tiers;

constexpr double kRelativeTolerance = 1e-6;

Tiers tiers_of(const std::string& name, int stage, const std::string& param = "none",
               const std::string& optimizer = "none", const std::string& extra_strata = "") {
  Tiers t;
  t.name = name;
  t.stage = stage;
  t.param = param;
  t.optimizer = optimizer;
  t.extra_strata = extra_strata;
  return t;
}

struct TrainRun {
  RunOutput out;
  std::string dir;
};

// Trains the tiny GPT-2 of offload_support.h for `steps` on `ranks` ranks, with
// `accumulation` micro-batches of 2 per rank and step.
TrainRun train(const TempDir& tmp, const std::string& name, int ranks, int accumulation,
               const Tiers& tiers, int steps = 3, const std::string& family = "gpt2",
               std::vector<std::string> extra = {}) {
  const std::string out = tmp.path() + "/" + name;
  const std::string nvme = tmp.path() + "/nvme";
  std::filesystem::create_directories(nvme);
  const std::string config_path = tmp.path() + "/" + name + ".json";
  std::ofstream(config_path) << testing::tiny_config(family, "fp32", tiers, out, nvme, steps);
  std::vector<std::string> args = {
      "train",     "--config",
      config_path, "--quiet",
      "--set",     "gradient_accumulation_steps=" + std::to_string(accumulation),
      "--set",     "strata.comm_timeout_s=20"};
  for (const std::string& e : extra) {
    args.push_back("--set");
    args.push_back(e);
  }
  TrainRun r;
  r.dir = out;
  r.out = ranks == 1 ? testing::run_strata(args) : testing::run_ranks(ranks, STRATA_BINARY, args);
  return r;
}

// The largest |a - b| over every tensor of two final models, relative to the largest |a|.
double relative_difference(const std::string& a_dir, const std::string& b_dir) {
  auto a = model::SafetensorsFile::open(a_dir + "/final/model.safetensors");
  auto b = model::SafetensorsFile::open(b_dir + "/final/model.safetensors");
  EXPECT_TRUE(a.is_ok() && b.is_ok());
  if (!a.is_ok() || !b.is_ok()) return INFINITY;
  double diff = 0.0, scale = 0.0;
  EXPECT_EQ(a->tensors().size(), b->tensors().size());
  for (const model::StTensor& t : a->tensors()) {
    const model::StTensor* u = b->find(t.name);
    EXPECT_NE(u, nullptr) << t.name;
    if (u == nullptr || u->numel() != t.numel()) return INFINITY;
    const auto* x = reinterpret_cast<const float*>(a->data(t));
    const auto* y = reinterpret_cast<const float*>(b->data(*u));
    for (std::uint64_t i = 0; i < t.numel(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(x[i]) - y[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(x[i])));
    }
  }
  return scale > 0 ? diff / scale : diff;
}

// step -> training loss, from a run's metrics.jsonl.
std::map<int, double> losses(const std::string& dir) {
  std::map<int, double> out;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    Json::Value v;
    Json::CharReaderBuilder builder;
    std::string errors;
    std::istringstream text(line);
    if (!Json::parseFromStream(builder, text, &v, &errors)) continue;
    if (v.isMember("loss") && v.isMember("step")) out[v["step"].asInt()] = v["loss"].asDouble();
  }
  return out;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class ZeroTwoRanks : public ::testing::TestWithParam<Tiers> {};

TEST_P(ZeroTwoRanks, EqualsOneRankAccumulatingTheSameMicroBatches) {
  SKIP_WITHOUT_MPIRUN();
  TempDir tmp;
  const TrainRun one = train(tmp, "one", 1, 2, GetParam());
  ASSERT_EQ(one.out.exit_code, 0) << one.out.err;
  const TrainRun two = train(tmp, "two", 2, 1, GetParam());
  ASSERT_EQ(two.out.exit_code, 0) << two.out.err;
  EXPECT_LE(relative_difference(one.dir, two.dir), kRelativeTolerance);
  // The same loss curve: rank 0 logs the mean over both ranks' micro-batches.
  EXPECT_NE(two.out.out.find("\"steps\":3"), std::string::npos) << two.out.out;
  if (GetParam().stage == 3) {
    // Every use gathers its unit; from the second step on, each gather but the pass's first is
    // started one use ahead, while the unit before it computes.
    EXPECT_NE(two.out.out.find("\"param_gathers_ahead\":"), std::string::npos) << two.out.out;
    EXPECT_EQ(two.out.out.find("\"param_gathers_ahead\":0,"), std::string::npos) << two.out.out;
  }
}

std::vector<Tiers> cases() {
  std::vector<Tiers> v;
  v.push_back(tiers_of("stage0", 0));
  v.push_back(tiers_of("stage1", 1));
  v.push_back(tiers_of("stage1_optimizer_nvme", 1, "none", "nvme"));
  v.push_back(tiers_of("stage2", 2));
  v.push_back(tiers_of("stage2_optimizer_cpu", 2, "none", "cpu"));
  // The optimizer state and AdamW on the device (the CPU backend's arena): gradients are
  // reduce-scattered and added on the device, the shards regathered after the update.
  v.push_back(
      tiers_of("stage2_optimizer_device", 2, "none", "none", R"("device_optimizer": "on",)"));
  v.push_back(tiers_of("stage3", 3));
  v.push_back(
      tiers_of("stage3_optimizer_device", 3, "none", "none", R"("device_optimizer": "on",)"));
  v.push_back(tiers_of("stage3_params_cpu_optimizer_nvme", 3, "cpu", "nvme"));
  v.push_back(tiers_of("stage3_all_nvme", 3, "nvme", "nvme"));
  return v;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroTwoRanks, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Llama, and Llama-family fixtures with what plain Llama lacks (tied embeddings, biases, per-head
// norms, windows, fused tensors, scaled and partial RoPE).
class ZeroFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(ZeroFamilies, Stage3EqualsOneRank) {
  SKIP_WITHOUT_MPIRUN();
  TempDir tmp;
  const Tiers tiers = tiers_of("stage3", 3, "nvme", "cpu");
  const TrainRun one = train(tmp, "one", 1, 2, tiers, 3, GetParam());
  ASSERT_EQ(one.out.exit_code, 0) << one.out.err;
  const TrainRun two = train(tmp, "two", 2, 1, tiers, 3, GetParam());
  ASSERT_EQ(two.out.exit_code, 0) << two.out.err;
  EXPECT_LE(relative_difference(one.dir, two.dir), kRelativeTolerance);
}

INSTANTIATE_TEST_SUITE_P(Families, ZeroFamilies,
                         ::testing::Values("llama", "qwen2_tied", "qwen3", "phi3_partial_longrope"),
                         [](const auto& info) { return info.param; });

TEST(ZeroMpi, TwoRankRunsRepeatBitIdentically) {
  SKIP_WITHOUT_MPIRUN();
  TempDir tmp;
  const Tiers tiers = tiers_of("stage3", 3, "nvme", "nvme");
  const TrainRun first = train(tmp, "first", 2, 2, tiers);
  const TrainRun second = train(tmp, "second", 2, 2, tiers);
  ASSERT_EQ(first.out.exit_code, 0) << first.out.err;
  ASSERT_EQ(second.out.exit_code, 0) << second.out.err;
  const std::string a = file_bytes(first.dir + "/final/model.safetensors");
  EXPECT_GT(a.size(), 10000u);
  EXPECT_EQ(a, file_bytes(second.dir + "/final/model.safetensors"));
}

// Half a run on `first_ranks`, resumed from its checkpoint on `second_ranks`, against the whole
// run on one rank: the loss curve and the final weights go on as if nothing had changed.
void resume_across_rank_counts(int first_ranks, int second_ranks) {
  TempDir tmp;
  const Tiers tiers = tiers_of("stage3", 3, "nvme", "nvme");
  auto accumulation = [](int ranks) { return 2 / ranks; };  // 2 micro-batches per step in all
  const std::vector<std::string> log = {"strata.log_every_steps=1"};
  const TrainRun whole = train(tmp, "whole", 1, 2, tiers, 6, "gpt2", log);
  ASSERT_EQ(whole.out.exit_code, 0) << whole.out.err;
  const TrainRun first =
      train(tmp, "first", first_ranks, accumulation(first_ranks), tiers, 3, "gpt2", log);
  ASSERT_EQ(first.out.exit_code, 0) << first.out.err;
  std::vector<std::string> resume = log;
  resume.push_back("strata.resume_from=" + first.dir + "/checkpoints");
  const TrainRun second =
      train(tmp, "second", second_ranks, accumulation(second_ranks), tiers, 6, "gpt2", resume);
  ASSERT_EQ(second.out.exit_code, 0) << second.out.err;

  const std::map<int, double> expected = losses(whole.dir);
  const std::map<int, double> before = losses(first.dir), after = losses(second.dir);
  ASSERT_EQ(expected.size(), 6u);
  ASSERT_EQ(before.size(), 3u);
  ASSERT_EQ(after.size(), 3u);
  for (const auto& [step, loss] : before)
    EXPECT_NEAR(loss, expected.at(step), 1e-6 * std::fabs(expected.at(step))) << "step " << step;
  for (const auto& [step, loss] : after) {
    EXPECT_GE(step, 4);
    EXPECT_NEAR(loss, expected.at(step), 1e-6 * std::fabs(expected.at(step))) << "step " << step;
  }
  EXPECT_LE(relative_difference(whole.dir, second.dir), kRelativeTolerance);
}

TEST(ZeroMpi, TwoRankCheckpointResumesOnOneRank) {
  SKIP_WITHOUT_MPIRUN();
  resume_across_rank_counts(2, 1);
}

TEST(ZeroMpi, OneRankCheckpointResumesOnTwoRanks) {
  SKIP_WITHOUT_MPIRUN();
  resume_across_rank_counts(1, 2);
}

TEST(ZeroMpi, KilledRankStopsTrainingAndIsNamed) {
  SKIP_WITHOUT_MPIRUN();
  TempDir tmp;
  const std::string out = tmp.path() + "/killed";
  const std::string config_path = tmp.path() + "/killed.json";
  std::ofstream(config_path) << testing::tiny_config("gpt2", "fp32", tiers_of("stage3", 3), out,
                                                     tmp.path(), 100000);
  // Rank 1 is killed (SIGKILL) 3 s into training; rank 0 must not hang: mpirun, or failing that
  // its collective's watchdog (strata.comm_timeout_s), ends it with an error naming rank 1.
  const std::string script =
      std::string("if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then (sleep 3; kill -9 $$) & fi; exec ") +
      STRATA_BINARY + " train --config " + config_path + " --quiet --set strata.comm_timeout_s=10";
  const RunOutput r = testing::run_ranks(2, "/bin/sh", {"-c", script}, 90);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(
      std::regex_search(r.out + r.err, std::regex("rank 1 .*(exited|killed|signal|sent nothing)")))
      << r.out << r.err;
}

}  // namespace
}  // namespace strata::train
