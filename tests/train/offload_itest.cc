// Offloading does not change the arithmetic, and budgets hold: the same seed, data and config
// trained with state homed on the device, in host memory or on NVMe (parameters, optimizer
// state, both; several tiles per unit; activation checkpoints on the host; with and without the
// optimizer overlapping the next forward) give bit-identical losses and final state, for GPT-2,
// Llama and Llama-family fixtures (Qwen2, Phi-3); each tier's recorded peak stays within its
// budget and equals the estimate.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <json/json.h>

#include "offload/estimate.h"
#include "support/run_strata.h"
#include "train/offload_support.h"
#include "train/run_settings.h"

namespace strata {
namespace {

using testing::TempDir;
using testing::Tiers;

const std::vector<Tiers>& tier_matrix() {
  static const std::vector<Tiers> m = {
      {"in_memory", 0, "none", "none", "", ""},
      {"optimizer_cpu", 2, "none", "cpu", "", ""},
      {"optimizer_nvme", 2, "none", "nvme", "", ""},
      // offload_optimizer none with the state and AdamW on the device (here the CPU backend's
      // arena and its OptimizerOps), at ZeRO 0 and 3.
      {"optimizer_device", 0, "none", "none", "", R"("device_optimizer": "on",)"},
      {"optimizer_device_stage3", 3, "none", "none", "", R"("device_optimizer": "on",)"},
      {"params_cpu", 3, "cpu", "cpu", "", ""},
      {"params_nvme", 3, "nvme", "cpu", "", ""},
      {"both_nvme", 3, "nvme", "nvme", "", ""},
      // Tiles of 4096 elements: several per unit, so the pipeline runs three deep within units.
      {"both_nvme_small_tiles", 3, "nvme", "nvme", R"(, "sub_group_size": 4096)", ""},
      {"both_nvme_no_overlap", 3, "nvme", "nvme", "", R"("overlap_optimizer": false,)"},
      {"both_nvme_no_prefetch", 3, "nvme", "nvme", "", "", 0},
      {"both_nvme_activations_on_host", 3, "nvme", "nvme", "",
       R"("model": {"activation_checkpointing": true, "activation_offload": true},)"},
  };
  return m;
}

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> state;
  offload::TierUsage usage;
  std::uint64_t estimate[offload::kTierCount] = {0, 0, 0};
};

// The model section of extra_strata merges into the config's model section.
std::string merge_model(std::string text, const Tiers& t) {
  const std::string key =
      R"("model": {"activation_checkpointing": true, "activation_offload": true},)";
  if (t.extra_strata.find(key) == std::string::npos) return text;
  text.erase(text.find(key), key.size());
  const std::string model = R"("model": {"family")";
  text.insert(text.find(model) + std::string(R"("model": {)").size(),
              R"("activation_checkpointing": true, "activation_offload": true, )");
  return text;
}

TrainedRun train_with(const std::string& family, const std::string& precision, const Tiers& t,
                      int steps) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nvme");
  const std::string text = merge_model(
      testing::tiny_config(family, precision, t, dir.path() + "/out", dir.path() + "/nvme", steps),
      t);
  const config::Config config = testing::load(text);
  train::TrainerOptions options;
  options.quiet = true;
  auto trainer = train::Trainer::create(config, options);
  EXPECT_TRUE(trainer.is_ok()) << t.name << ": " << trainer.status().to_string();
  TrainedRun run;
  if (!trainer.is_ok()) return run;
  for (int s = 0; s < steps; ++s) {
    auto report = (*trainer)->train_step();
    EXPECT_TRUE(report.is_ok()) << t.name << ": " << report.status().to_string();
    if (!report.is_ok()) return run;
    run.losses.push_back(report->loss);
  }
  run.state = testing::state_bytes(**trainer);
  run.usage = (*trainer)->state().tiers().usage();
  offload::EstimateInput input;
  input.shape = (*trainer)->shape();
  input.params = model::total_params(input.shape);
  input.device_budget_bytes = config.strata.device_bytes_max;
  const offload::Estimate e = train::estimate(config, input);
  for (int k = 0; k < offload::kTierCount; ++k)
    run.estimate[k] = e.bytes(static_cast<offload::Tier>(k));
  return run;
}

class OffloadArithmetic : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(OffloadArithmetic, EveryTierChoiceGivesBitIdenticalLossesAndState) {
  const auto& [family, precision] = GetParam();
  constexpr int kSteps = 4;
  const TrainedRun reference = train_with(family, precision, tier_matrix()[0], kSteps);
  ASSERT_EQ(reference.losses.size(), static_cast<std::size_t>(kSteps));
  ASSERT_FALSE(reference.state.empty());
  // Training moved the weights (the comparison is not between two untouched models).
  EXPECT_NE(reference.losses.front(), reference.losses.back());
  for (std::size_t i = 1; i < tier_matrix().size(); ++i) {
    const Tiers& t = tier_matrix()[i];
    const TrainedRun run = train_with(family, precision, t, kSteps);
    EXPECT_EQ(run.losses, reference.losses) << t.name;
    EXPECT_TRUE(testing::same_bits(run.state, reference.state)) << t.name;
  }
}

TEST_P(OffloadArithmetic, PeaksStayWithinBudgetsAndEqualTheEstimate) {
  const auto& [family, precision] = GetParam();
  for (const Tiers& t : tier_matrix()) {
    const TrainedRun run = train_with(family, precision, t, 2);
    for (int k = 0; k < 2; ++k) {  // device and host have budgets here
      EXPECT_GT(run.usage.bytes_peak[k], 0u) << t.name;
      EXPECT_LE(run.usage.bytes_peak[k], run.usage.bytes_max[k]) << t.name << " tier " << k;
    }
    for (int k = 0; k < offload::kTierCount; ++k) {
      EXPECT_EQ(run.usage.bytes_peak[k], run.estimate[k])
          << t.name << ": " << offload::to_string(static_cast<offload::Tier>(k));
    }
    const bool nvme = t.param == "nvme" || t.optimizer == "nvme";
    EXPECT_EQ(run.usage.bytes_peak[2] > 0, nvme) << t.name;
  }
}

// The Llama-family fixtures switch on what plain Llama lacks: Qwen2's biases, tied embeddings and
// a sliding window in one layer; Phi-3's fused tensors, partial rotary, LongRoPE and window.
INSTANTIATE_TEST_SUITE_P(Families, OffloadArithmetic,
                         ::testing::Values(std::make_pair("gpt2", "bf16"),
                                           std::make_pair("llama", "fp16"),
                                           std::make_pair("qwen2_tied", "bf16"),
                                           std::make_pair("phi3_partial_longrope", "fp32")),
                         [](const auto& info) { return info.param.first; });

TEST(Offload, DeviceBudgetBelowTheMinimumWorkingSetFailsAtStartNamingIt) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nvme");
  const Tiers t{"both_nvme", 3, "nvme", "nvme", "", ""};
  const std::string text =
      testing::tiny_config("gpt2", "bf16", t, dir.path() + "/out", dir.path() + "/nvme", 1);
  config::Config config = testing::load(text);
  offload::EstimateInput input;
  auto shape = model::shape_of(config.strata.model);
  ASSERT_TRUE(shape.is_ok());
  input.shape = *shape;
  input.params = model::total_params(*shape);
  // The minimum: base frames only. One byte less must fail, naming the key and the minimum.
  const model::ModelLayout layout = model::build_layout(*shape);
  model::RunnerOptions ro;
  ro.batch = 2;
  ro.seq_len = 16;
  const model::RunnerMemory acts = model::ModelRunner<float>::memory_needed(*shape, ro);
  offload::PlanInput pi;
  pi.settings = train::plan_settings(config);
  pi.layout = &layout;
  pi.activation_device_bytes = acts.device_bytes;
  pi.device_is_host = true;  // the run's CPU backend
  const std::uint64_t minimum = offload::make_plan_unchecked(pi).device_minimum_bytes;
  config.strata.device_bytes_max = minimum - 1;
  train::TrainerOptions options;
  options.quiet = true;
  auto too_small = train::Trainer::create(config, options);
  ASSERT_FALSE(too_small.is_ok());
  EXPECT_EQ(too_small.status().context(), "strata.device_bytes_max");
  EXPECT_NE(too_small.status().message().find(std::to_string(minimum) + " bytes"),
            std::string::npos)
      << too_small.status().message();
  // At the minimum it trains, with one frame per size class, within the budget.
  config.strata.device_bytes_max = minimum;
  auto fits = train::Trainer::create(config, options);
  ASSERT_TRUE(fits.is_ok()) << fits.status().to_string();
  auto step = (*fits)->train_step();
  ASSERT_TRUE(step.is_ok()) << step.status().to_string();
  ASSERT_TRUE((*fits)->finish_step().is_ok());
  EXPECT_LE((*fits)->state().tiers().usage().bytes_peak[0], minimum);
}

TEST(Offload, HostBudgetTooSmallFailsAtStartNamingIt) {
  TempDir dir;
  const Tiers t{"optimizer_cpu", 2, "none", "cpu", "", ""};
  config::Config config = testing::load(
      testing::tiny_config("gpt2", "bf16", t, dir.path() + "/out", dir.path() + "/nvme", 1),
      {"strata.host_bytes_max=1MiB"});
  train::TrainerOptions options;
  options.quiet = true;
  auto trainer = train::Trainer::create(config, options);
  ASSERT_FALSE(trainer.is_ok());
  EXPECT_EQ(trainer.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(trainer.status().context(), "strata.host_bytes_max");
}

TEST(Offload, PrefetchLeavesNoDemandFetchesAfterTheFirstStep) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nvme");
  const Tiers t{"both_nvme", 3, "nvme", "nvme", "", ""};
  const config::Config config = testing::load(
      testing::tiny_config("gpt2", "bf16", t, dir.path() + "/out", dir.path() + "/nvme", 3));
  train::TrainerOptions options;
  options.quiet = true;
  auto trainer = train::Trainer::create(config, options);
  ASSERT_TRUE(trainer.is_ok()) << trainer.status().to_string();
  ASSERT_TRUE((*trainer)->train_step().is_ok());  // records the order; fetches on demand
  const offload::SchedulerStats first = (*trainer)->state().scheduler().stats();
  EXPECT_GT(first.demand_fetches, 0u);
  ASSERT_TRUE((*trainer)->train_step().is_ok());
  ASSERT_TRUE((*trainer)->train_step().is_ok());
  const offload::SchedulerStats later = (*trainer)->state().scheduler().stats();
  // Each unit's first use in a step waits for its own update (overlap), so it is demanded once
  // the update lands; every other use is prefetched.
  EXPECT_GT(later.prefetches, first.prefetches);
  // Units whose update was still pending when the prefetcher reached them had their frame offered
  // to the optimizer, which wrote the new parameters straight into it (the CPU backend's device
  // memory is host memory); EveryTierChoiceGivesBitIdenticalLossesAndState covers the values.
  EXPECT_GT(later.handoffs, 0u);
  EXPECT_EQ(later.evictions >= first.evictions, true);
  EXPECT_EQ((*trainer)->state().scheduler().order().divergences(), 0u);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

Json::Value parse_json(const std::string& text) {
  Json::CharReaderBuilder builder;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  Json::Value v;
  std::string errors;
  EXPECT_TRUE(reader->parse(text.data(), text.data() + text.size(), &v, &errors)) << errors;
  return v;
}

TEST(OffloadCli, TraceHasALanePerEngineAndStepLinesSayWaitAndPeaks) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nvme");
  const Tiers t{"both_nvme", 3, "nvme", "nvme", "", ""};
  const std::string config = dir.write_file(
      "c.json",
      testing::tiny_config("gpt2", "bf16", t, dir.path() + "/out", dir.path() + "/nvme", 3));
  auto r =
      testing::run_strata({"train", "--config", config, "--trace", dir.path() + "/trace.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("where the bytes lived"), std::string::npos) << r.err;
  const Json::Value trace = parse_json(testing::read_file(dir.path() + "/trace.json"));
  ASSERT_TRUE(trace.isArray());
  std::set<std::string> lanes, events;
  for (const Json::Value& e : trace) {
    if (e["ph"].asString() == "M" && e["name"].asString() == "thread_name") {
      lanes.insert(e["args"]["name"].asString());
    }
    if (e["ph"].asString() == "X") {
      events.insert(e["name"].asString());
      EXPECT_GE(e["dur"].asInt64(), 0);
    }
  }
  for (const char* lane :
       {"compute", "host->device", "device->host", "nvme read", "nvme write", "adam"}) {
    EXPECT_TRUE(lanes.count(lane)) << lane;
  }
  // No "param to device" here: on the CPU backend NVMe reads land in the device frames directly.
  for (const char* event : {"forward + backward", "param read", "grad to host", "optimizer read",
                            "optimizer write", "adam"}) {
    EXPECT_TRUE(events.count(event)) << event;
  }
  int steps = 0;
  std::ifstream metrics(dir.path() + "/out/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const Json::Value v = parse_json(line);
    if (!v.isMember("loss")) continue;
    ++steps;
    EXPECT_TRUE(v["compute_wait_ms"].isDouble()) << line;
    for (const char* key : {"device_bytes_peak", "host_bytes_peak", "nvme_bytes_peak"})
      EXPECT_GT(v[key].asUInt64(), 0u) << key;
  }
  EXPECT_EQ(steps, 3);
  const Json::Value summary = parse_json(r.out);
  EXPECT_LE(summary["device_bytes_peak"].asUInt64(), summary["device_bytes_max"].asUInt64());
  EXPECT_LE(summary["host_bytes_peak"].asUInt64(), summary["host_bytes_max"].asUInt64());
}

}  // namespace
}  // namespace strata
