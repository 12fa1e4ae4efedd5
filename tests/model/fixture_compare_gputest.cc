// The PyTorch fixtures (tests/fixtures/models: GPT-2 and Llama with grouped KV heads, tied and
// untied) on the CUDA backend: logits, loss and every parameter gradient against the float64
// reference. With fp32 GEMMs the tolerances are a few times the CPU test's (other summation
// orders); with bf16 GEMM inputs, the loss and each gradient tensor's relative L2 error are
// bounded instead. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "model/hf_io.h"
#include "model/resident_store.h"
#include "model/runner.h"
#include "support/gpu_support.h"
#include "tests/model/fixture_support.h"

namespace strata::model {
namespace {

struct FixtureRun {
  std::vector<float> logits;
  double loss = 0.0;
  std::vector<std::vector<float>> grads;  // per unit, padded
};

// Loads the fixture's weights into a CUDA ResidentStore and runs logits and one train step.
FixtureRun run_fixture(backend::Backend& gpu, const std::string& name, const testing::Fixture& fx,
                       const ModelShape& shape, const ModelLayout& layout) {
  FixtureRun run;
  auto store = ResidentStore<float>::create(gpu, layout);
  EXPECT_TRUE(store.is_ok()) << store.status().to_string();
  if (!store.is_ok()) return run;
  std::vector<std::vector<float>> host(layout.units.size());
  std::vector<float*> units;
  for (const UnitLayout& u : layout.units) {
    host[static_cast<std::size_t>(u.index)].assign(static_cast<std::size_t>(u.padded_numel), 0.0f);
    units.push_back(host[static_cast<std::size_t>(u.index)].data());
  }
  const Status loaded = load_hf_weights(testing::fixture_dir(name), layout, units);
  EXPECT_TRUE(loaded.is_ok()) << loaded.to_string();
  for (const UnitLayout& u : layout.units) {
    const auto& h = host[static_cast<std::size_t>(u.index)];
    EXPECT_TRUE(gpu.copy_async(backend::StreamKind::kCompute, (*store)->params(u.index), h.data(),
                               h.size() * sizeof(float))
                    .is_ok());
  }
  RunnerOptions options;
  options.batch = fx.batch;
  options.seq_len = fx.seq_len;
  auto runner = ModelRunner<float>::create(gpu, shape, layout, options);
  EXPECT_TRUE(runner.is_ok()) << runner.status().to_string();
  if (!runner.is_ok()) return run;
  const std::int64_t rows = fx.batch * fx.seq_len;
  std::vector<std::int32_t> inputs(fx.tokens.begin(), fx.tokens.begin() + rows);
  std::vector<std::int32_t> targets(fx.tokens.begin() + 1, fx.tokens.end());
  EXPECT_TRUE((*runner)->set_batch(inputs.data(), targets.data()).is_ok());
  run.logits.resize(static_cast<std::size_t>(rows * shape.vocab_size));
  EXPECT_TRUE((*runner)->logits(**store, run.logits.data()).is_ok());
  auto loss = (*runner)->train_step(**store, 1.0 / static_cast<double>(rows));
  EXPECT_TRUE(loss.is_ok()) << loss.status().to_string();
  run.loss = loss.is_ok() ? *loss : std::nan("");
  for (const UnitLayout& u : layout.units) {
    run.grads.push_back(testing::to_host<float>(gpu, (*store)->grads(u.index),
                                                static_cast<std::size_t>(u.padded_numel)));
  }
  EXPECT_TRUE(gpu.synchronize(backend::StreamKind::kCompute).is_ok());
  return run;
}

class FixtureCompareGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureCompareGpu, Fp32GemmsMatchPyTorch) {
  STRATA_GPU_OR_SKIP(gpu, {});
  const testing::Fixture fx = testing::load_fixture(GetParam());
  auto shape = read_hf_spec(testing::fixture_dir(GetParam()));
  ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
  const ModelLayout layout = build_layout(*shape);
  const FixtureRun run = run_fixture(gpu, GetParam(), fx, *shape, layout);
  ASSERT_FALSE(run.grads.empty());
  testing::expect_close("logits", run.logits.data(), fx.tensor("logits"), 2e-5, 1e-4);
  EXPECT_NEAR(run.loss, fx.tensor("loss")[0], 2e-5);
  for (const UnitLayout& unit : layout.units) {
    for (const TensorSlot& slot : unit.tensors) {
      const std::vector<float> want = fx.tensor("grad." + slot.name);
      double scale = 0.0;
      for (float w : want)
        scale = std::max(scale, static_cast<double>(std::abs(w)));
      testing::expect_close("grad." + slot.name,
                            run.grads[static_cast<std::size_t>(unit.index)].data() + slot.offset,
                            want, 5e-5 * scale + 1e-8, 1e-3);
    }
  }
}

TEST_P(FixtureCompareGpu, Bf16GemmsStayCloseToPyTorch) {
  backend::CudaBackendOptions options;
  options.gemm_precision = cuda::GemmPrecision::kBf16;
  STRATA_GPU_OR_SKIP(gpu, options);
  const testing::Fixture fx = testing::load_fixture(GetParam());
  auto shape = read_hf_spec(testing::fixture_dir(GetParam()));
  ASSERT_TRUE(shape.is_ok());
  const ModelLayout layout = build_layout(*shape);
  const FixtureRun run = run_fixture(gpu, GetParam(), fx, *shape, layout);
  ASSERT_FALSE(run.grads.empty());
  EXPECT_NEAR(run.loss, fx.tensor("loss")[0], 2e-2);
  for (const UnitLayout& unit : layout.units) {
    for (const TensorSlot& slot : unit.tensors) {
      const std::vector<float> want = fx.tensor("grad." + slot.name);
      const float* got = run.grads[static_cast<std::size_t>(unit.index)].data() + slot.offset;
      double diff = 0.0, norm = 0.0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        diff += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
        norm += static_cast<double>(want[i]) * want[i];
      }
      ASSERT_FALSE(std::isnan(diff)) << slot.name;
      EXPECT_LE(std::sqrt(diff), 5e-2 * std::sqrt(norm) + 1e-6) << "grad." << slot.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureCompareGpu, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::model
