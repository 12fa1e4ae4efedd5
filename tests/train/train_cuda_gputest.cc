// The trainer on the CUDA backend (strata.backend = "cuda"): three AdamW steps from the PyTorch
// fixtures land on torch.optim.AdamW's weights; two bf16 runs give the same bits (offloaded runs
// will be compared bit for bit with in-memory ones); and a bf16 run's losses track the CPU
// backend's. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "config/config.h"
#include "offload/plan.h"
#include "tests/model/fixture_support.h"
#include "tests/train/fixture_config.h"
#include "tests/train/llmc_tokens.h"
#include "train/trainer.h"

namespace strata::train {
namespace {

// Creates a trainer, or says why the test must skip (no GPU); other failures fail the test.
std::unique_ptr<Trainer> make_trainer(const std::string& text, std::string* skip) {
  auto loaded = config::load_config_text(text, "test.json", {});
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  if (!loaded.is_ok()) return nullptr;
  TrainerOptions options;
  options.quiet = true;
  auto trainer = Trainer::create(loaded->config, options);
  if (!trainer.is_ok()) {
    if (trainer.status().code() == ErrorCode::kUnavailable) {
      *skip = trainer.status().to_string();
    } else {
      ADD_FAILURE() << trainer.status().to_string();
    }
    return nullptr;
  }
  return std::move(trainer).value();
}

class FixtureAdamWCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureAdamWCuda, ThreeStepsMatchTorchAdamW) {
  const testing::Fixture fx = testing::load_fixture(GetParam());
  testing::TempDir dir;
  const std::string tokens = dir.write_file("tokens.bin", testing::llmc_file(fx.tokens));
  const std::string text = testing::fixture_train_config(
      fx, GetParam(), dir.path(), tokens,
      R"("backend": "cuda", "device_bytes_max": "512MiB", "host_bytes_max": "256MiB",)");
  std::string skip;
  auto trainer = make_trainer(text, &skip);
  if (!skip.empty()) GTEST_SKIP() << "no GPU: " << skip;
  ASSERT_NE(trainer, nullptr);
  ASSERT_EQ(trainer->backend().name(), "cuda:0");
  for (int step = 0; step < 3; ++step) {
    auto report = trainer->train_step();
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    if (step == 0) {
      EXPECT_NEAR(report->loss, fx.tensor("loss")[0], 2e-5);
    }
  }
  // The CPU test allows 1% of one step's lr (fp32 rounding noise on near-zero gradients moves an
  // element by up to lr per step); the GPU's other summation orders get 2%.
  for (const model::UnitLayout& unit : trainer->layout().units) {
    auto master = trainer->state().view(offload::SlotKind::kMaster, unit.index);
    ASSERT_TRUE(master.is_ok()) << master.status().to_string();
    for (const model::TensorSlot& slot : unit.tensors) {
      testing::expect_close("after3." + slot.name, *master + slot.offset,
                            fx.tensor("after3." + slot.name), 0.02 * fx.metadata("lr"), 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureAdamWCuda, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

std::string synthetic_config(const std::string& backend, const std::string& out) {
  return R"({"bf16": {"enabled": true},
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "strata": {"output_dir": ")" +
         out + R"(", "train_steps": 4, "seed": 11, "backend": ")" + backend + R"(",
      "cpu_threads": 2, "device_bytes_max": "512MiB", "host_bytes_max": "256MiB",
      "model": {"family": "llama", "vocab_size": 128, "max_seq_len": 64, "hidden_size": 128,
                "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
      "data": {"source": "synthetic", "seq_len": 64, "synthetic_vocab_size": 128}}})";
}

TEST(TrainCuda, TwoRunsGiveTheSameBits) {
  testing::TempDir dir;
  std::string skip;
  auto first = make_trainer(synthetic_config("cuda", dir.path() + "/a"), &skip);
  if (!skip.empty()) GTEST_SKIP() << "no GPU: " << skip;
  auto second = make_trainer(synthetic_config("cuda", dir.path() + "/b"), &skip);
  ASSERT_TRUE(first && second);
  for (int step = 0; step < 3; ++step) {
    auto a = first->train_step();
    auto b = second->train_step();
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    EXPECT_EQ(std::memcmp(&a->loss, &b->loss, sizeof(double)), 0) << "step " << step;
  }
  for (const model::UnitLayout& unit : first->layout().units) {
    auto a = first->state().view(offload::SlotKind::kMaster, unit.index);
    auto b = second->state().view(offload::SlotKind::kMaster, unit.index);
    ASSERT_TRUE(a.is_ok() && b.is_ok()) << unit.name;
    EXPECT_EQ(std::memcmp(*a, *b, static_cast<std::size_t>(unit.padded_numel) * sizeof(float)), 0)
        << unit.name;
  }
}

TEST(TrainCuda, Bf16LossesTrackTheCpuBackend) {
  testing::TempDir dir;
  std::string skip;
  auto gpu = make_trainer(synthetic_config("cuda", dir.path() + "/gpu"), &skip);
  if (!skip.empty()) GTEST_SKIP() << "no GPU: " << skip;
  auto cpu = make_trainer(synthetic_config("cpu", dir.path() + "/cpu"), &skip);
  ASSERT_TRUE(gpu && cpu);
  for (int step = 0; step < 4; ++step) {
    auto g = gpu->train_step();
    auto c = cpu->train_step();
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    // bf16 GEMM inputs on the GPU against fp32 GEMMs on the CPU (both keep bf16 parameters).
    EXPECT_NEAR(g->loss, c->loss, 2e-2) << "step " << step;
    EXPECT_NEAR(g->grad_norm, c->grad_norm, 5e-2 * c->grad_norm) << "step " << step;
  }
}

}  // namespace
}  // namespace strata::train
