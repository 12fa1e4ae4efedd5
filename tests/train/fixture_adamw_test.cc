// The trainer against PyTorch: three AdamW steps (torch.optim.AdamW, float64) on the fixture's
// batch, starting from the fixture's Hugging Face directory, give the same weights.
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"
#include "tests/model/fixture_support.h"
#include "tests/train/fixture_config.h"
#include "tests/train/llmc_tokens.h"
#include "train/trainer.h"

namespace strata::train {
namespace {

class FixtureAdamW : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureAdamW, ThreeStepsMatchTorchAdamW) {
  const testing::Fixture fx = testing::load_fixture(GetParam());
  testing::TempDir dir;
  const std::string tokens = dir.write_file("tokens.bin", testing::llmc_file(fx.tokens));
  const std::string text = testing::fixture_train_config(
      fx, GetParam(), dir.path(), tokens,
      R"("cpu_threads": 2, "device_bytes_max": "256MiB", "host_bytes_max": "256MiB",)");
  auto loaded = config::load_config_text(text, "fixture.json", {});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  TrainerOptions options;
  options.quiet = true;
  auto trainer = Trainer::create(loaded->config, options);
  ASSERT_TRUE(trainer.is_ok()) << trainer.status().to_string();
  for (int step = 0; step < 3; ++step) {
    auto report = (*trainer)->train_step();
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    if (step == 0) {
      EXPECT_NEAR(report->loss, fx.tensor("loss")[0], 1e-5);
    }
  }
  // An element whose gradient is almost zero (a key bias: softmax ignores it) moves by up to lr
  // per step on fp32 rounding noise alone, so the tolerance is 1% of one step's lr; a wrong
  // update (bias correction, decay, moments) is off by a whole lr.
  ASSERT_TRUE((*trainer)->finish_step().is_ok());
  const model::ModelLayout& layout = (*trainer)->layout();
  double worst = 0.0;
  for (const model::UnitLayout& unit : layout.units) {
    auto master = (*trainer)->state().view(offload::SlotKind::kMaster, unit.index);
    ASSERT_TRUE(master.is_ok()) << master.status().to_string();
    for (const model::TensorSlot& slot : unit.tensors) {
      const auto c =
          testing::expect_close("after3." + slot.name, *master + slot.offset,
                                fx.tensor("after3." + slot.name), 0.01 * fx.metadata("lr"), 1e-5);
      worst = std::max(worst, c.max_abs_error);
    }
  }
  std::printf("%s: weights after 3 AdamW steps, worst |error| %.3g (lr %g)\n", GetParam().c_str(),
              worst, fx.metadata("lr"));
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureAdamW, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::train
