// Compressed optimizer state (strata.optimizer_state): every tier choice still gives the same
// bits for each format (the host home, the pipeline's stages and NVMe tiles hold the same stored
// image, and the kernel and the gradient path round with keys that do not depend on the tier),
// each tier's peak equals the estimate, the state takes the bytes per parameter the plan says,
// and training with it follows fp32 AdamW closely on a small model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "offload/estimate.h"
#include "support/run_strata.h"
#include "train/offload_support.h"
#include "train/run_settings.h"

namespace strata {
namespace {

using testing::TempDir;
using testing::Tiers;

struct Format {
  std::string name;
  std::string keys;  // the strata.optimizer_state section
};

const std::vector<Format>& formats() {
  static const std::vector<Format> f = {
      {"gradients_bf16", R"("optimizer_state": {"gradients": "bf16"},)"},
      {"moments_8bit", R"("optimizer_state": {"moments": "8bit", "block_size": 256},)"},
      {"moments_bf16_grads_bf16",
       R"("optimizer_state": {"moments": "bf16", "gradients": "bf16"},)"},
      {"all_compressed",
       R"("optimizer_state": {"moments": "8bit", "block_size": 64, "master": "bf16",
                              "gradients": "bf16"},)"},
  };
  return f;
}

const std::vector<Tiers>& tiers() {
  static const std::vector<Tiers> m = {
      {"optimizer_cpu", 2, "none", "cpu", "", ""},
      {"in_memory", 0, "none", "none", "", ""},  // the CPU backend keeps the optimizer on the host
      {"optimizer_nvme", 2, "none", "nvme", "", ""},
      {"params_cpu", 3, "cpu", "cpu", "", ""},
      {"both_nvme", 3, "nvme", "nvme", "", ""},
      // Tiles of 4096 elements: several per unit, each 8-bit tile padded to 4 KiB on its own.
      {"both_nvme_small_tiles", 3, "nvme", "nvme", R"(, "sub_group_size": 4096)", ""},
  };
  return m;
}

struct FormatRun {
  std::vector<double> losses;
  std::vector<float> state;  // decoded
  offload::TierUsage usage;
  offload::Estimate estimate;
};

FormatRun train_with(const std::string& family, const std::string& precision, const Tiers& t,
                     const Format& f, int steps) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nvme");
  Tiers with = t;
  with.extra_strata += f.keys;
  const config::Config config = testing::load(testing::tiny_config(
      family, precision, with, dir.path() + "/out", dir.path() + "/nvme", steps));
  train::TrainerOptions options;
  options.quiet = true;
  auto trainer = train::Trainer::create(config, options);
  EXPECT_TRUE(trainer.is_ok()) << t.name << " " << f.name << ": " << trainer.status().to_string();
  FormatRun run;
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
  input.device_is_host = true;
  run.estimate = train::estimate(config, input);
  return run;
}

class CompressedState : public ::testing::TestWithParam<std::size_t> {};

TEST_P(CompressedState, EveryTierGivesTheSameBitsAndPeaksEqualTheEstimate) {
  const Format& f = formats()[GetParam()];
  constexpr int kSteps = 4;
  const FormatRun reference = train_with("llama", "bf16", tiers()[0], f, kSteps);
  ASSERT_EQ(reference.losses.size(), static_cast<std::size_t>(kSteps));
  EXPECT_NE(reference.losses.front(), reference.losses.back());
  for (const Tiers& t : tiers()) {
    const FormatRun run = &t == &tiers()[0] ? reference : train_with("llama", "bf16", t, f, kSteps);
    EXPECT_EQ(run.losses, reference.losses) << f.name << " " << t.name;
    EXPECT_TRUE(testing::same_bits(run.state, reference.state)) << f.name << " " << t.name;
    for (int k = 0; k < offload::kTierCount; ++k) {
      const auto tier = static_cast<offload::Tier>(k);
      EXPECT_EQ(run.usage.bytes_peak[k], run.estimate.bytes(tier))
          << f.name << " " << t.name << ": " << offload::to_string(tier);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CompressedState,
                         ::testing::Range<std::size_t>(0, formats().size()),
                         [](const auto& info) { return formats()[info.param].name; });

TEST(CompressedState, CompressedRunsDifferFromFp32ButStayClose) {
  // Not the same bits as fp32 (the format is in use), but the same training: the losses of a
  // few steps agree within a few percent.
  const Format fp32{"fp32", ""};
  const FormatRun base = train_with("gpt2", "bf16", tiers()[0], fp32, 6);
  ASSERT_EQ(base.losses.size(), 6u);
  for (const Format& f : formats()) {
    const FormatRun run = train_with("gpt2", "bf16", tiers()[0], f, 6);
    ASSERT_EQ(run.losses.size(), 6u) << f.name;
    EXPECT_FALSE(testing::same_bits(run.state, base.state)) << f.name;
    for (std::size_t i = 0; i < run.losses.size(); ++i) {
      EXPECT_TRUE(std::isfinite(run.losses[i])) << f.name;
      EXPECT_NEAR(run.losses[i], base.losses[i], 0.05 * base.losses[i]) << f.name << " step " << i;
    }
  }
}

TEST(CompressedState, ConvertWritesTheMasterWeightsOfACompressedCheckpoint) {
  // A checkpoint of compressed state (bf16 master, 8-bit moments, on NVMe) converts to the fp32
  // weights the trainer itself saves (its bf16 master decoded, byte for byte), and to bf16
  // weights that are those same values exactly (the master is bf16: nothing is rounded twice).
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/nvme");
  Tiers t = tiers()[4];  // both_nvme
  t.extra_strata += formats()[3].keys;
  const config::Config config = testing::load(
      testing::tiny_config("llama", "bf16", t, dir.path() + "/out", dir.path() + "/nvme", 3));
  train::TrainerOptions options;
  options.quiet = true;
  auto trainer = train::Trainer::create(config, options);
  ASSERT_TRUE(trainer.is_ok()) << trainer.status().to_string();
  for (int s = 0; s < 3; ++s)
    ASSERT_TRUE((*trainer)->train_step().is_ok());
  auto ckpt = (*trainer)->save_checkpoint();
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  ASSERT_TRUE((*trainer)->save_model(dir.path() + "/saved").is_ok());
  trainer->reset();

  auto fp32 = testing::run_strata({"convert", *ckpt, dir.path() + "/fp32"});
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  auto bf16 = testing::run_strata({"convert", *ckpt, dir.path() + "/bf16", "--dtype", "bf16"});
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  auto saved = model::SafetensorsFile::open(dir.path() + "/saved/model.safetensors");
  auto a = model::SafetensorsFile::open(dir.path() + "/fp32/model.safetensors");
  auto b = model::SafetensorsFile::open(dir.path() + "/bf16/model.safetensors");
  ASSERT_TRUE(saved.is_ok() && a.is_ok() && b.is_ok());
  ASSERT_EQ(saved->tensors().size(), a->tensors().size());
  std::uint64_t elements = 0, not_bf16 = 0;
  for (const model::StTensor& s : saved->tensors()) {
    const model::StTensor* x = a->find(s.name);
    const model::StTensor* y = b->find(s.name);
    ASSERT_TRUE(x != nullptr && y != nullptr) << s.name;
    ASSERT_EQ(s.dtype, model::StDType::kF32) << s.name;
    ASSERT_EQ(x->dtype, model::StDType::kF32) << s.name;
    ASSERT_EQ(y->dtype, model::StDType::kBF16) << s.name;
    ASSERT_EQ(s.end - s.begin, x->end - x->begin) << s.name;
    ASSERT_EQ(s.end - s.begin, 2 * (y->end - y->begin)) << s.name;
    EXPECT_EQ(std::memcmp(saved->data(s), a->data(*x), s.end - s.begin), 0) << s.name;
    for (std::uint64_t i = 0; i < x->numel(); ++i) {
      std::uint32_t f32 = 0;
      std::uint16_t b16 = 0;
      std::memcpy(&f32, a->data(*x) + 4 * i, 4);
      std::memcpy(&b16, b->data(*y) + 2 * i, 2);
      ++elements;
      not_bf16 += (f32 & 0xFFFFu) != 0 || (f32 >> 16) != b16 ? 1 : 0;
    }
  }
  EXPECT_GT(elements, 0u);
  EXPECT_EQ(not_bf16, 0u);
}

TEST(CompressedState, EstimateSaysBytesPerParameterForEachChoice) {
  // A 1.3B-parameter model (assumed Llama shape) with the optimizer in host memory and the
  // parameters on the device: fp32 state is 16 bytes per parameter; 8-bit moments with bf16
  // gradients 8 (+ absmax); with a bf16 master as well, 6.
  struct Case {
    std::string keys;
    double bytes;
  };
  for (const Case& c : std::vector<Case>{
           {"", 16.0},
           {R"("optimizer_state": {"moments": "bf16"},)", 12.0},
           {R"("optimizer_state": {"moments": "8bit", "gradients": "bf16"},)", 8.0},
           {R"("optimizer_state": {"moments": "8bit", "master": "bf16", "gradients": "bf16"},)",
            6.0}}) {
    Tiers t{"optimizer_cpu", 2, "none", "cpu", "", c.keys};
    const config::Config config =
        testing::load(testing::tiny_config("llama", "bf16", t, "/tmp/unused", "/tmp/unused", 1),
                      {"strata.host_bytes_max=0", "strata.device_bytes_max=0"});
    offload::EstimateInput input;
    input.params = 1'300'000'000;
    input.shape = offload::assumed_shape(input.params);
    input.shape_assumed = true;
    const offload::Estimate e = train::estimate(config, input);
    // Blocks of 2048 add 8 bytes per 2048 elements (two absmax), padding a little more.
    EXPECT_GE(e.state_bytes_per_param(), c.bytes) << c.keys;
    EXPECT_LE(e.state_bytes_per_param(), c.bytes * 1.005 + 0.005) << c.keys;
    EXPECT_EQ(e.state_bytes_per_param(offload::Tier::kNvme), 0.0);
  }
}

}  // namespace
}  // namespace strata
