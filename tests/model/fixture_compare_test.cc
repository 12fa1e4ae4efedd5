// Strata against PyTorch + transformers (tests/fixtures/models, made by tools/make_fixtures.py):
// each tiny GPT-2 and Llama model (grouped KV heads, tied and untied embeddings) is loaded from
// its Hugging Face directory, and Strata's fp32 logits, loss and every parameter gradient are
// compared with the float64 reference.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "model/hf_io.h"
#include "model/resident_store.h"
#include "model/runner.h"
#include "tests/model/fixture_support.h"

namespace strata::model {
namespace {

class FixtureCompare : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureCompare, LogitsLossAndGradientsMatchPyTorch) {
  const std::string dir = testing::fixture_dir(GetParam());
  const testing::Fixture fx = testing::load_fixture(GetParam());
  auto shape = read_hf_spec(dir);
  ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
  const ModelLayout layout = build_layout(*shape);
  backend::CpuBackendOptions options;
  options.device_bytes_max = 256 << 20;
  options.host_bytes_max = 256 << 20;
  options.threads = 2;
  auto backend = std::move(backend::make_cpu_backend(options)).value();
  auto store = std::move(ResidentStore<float>::create(*backend, layout)).value();
  std::vector<float*> units;
  for (const UnitLayout& u : layout.units)
    units.push_back(store->params(u.index));
  Status loaded = load_hf_weights(dir, layout, units);
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();

  RunnerOptions run;
  run.batch = fx.batch;
  run.seq_len = fx.seq_len;
  auto runner = std::move(ModelRunner<float>::create(*backend, *shape, layout, run)).value();
  const std::int64_t rows = fx.batch * fx.seq_len;
  std::vector<std::int32_t> inputs(fx.tokens.begin(), fx.tokens.begin() + rows);
  std::vector<std::int32_t> targets(fx.tokens.begin() + 1, fx.tokens.end());
  ASSERT_TRUE(runner->set_batch(inputs.data(), targets.data()).is_ok());

  std::vector<float> logits(static_cast<std::size_t>(rows * shape->vocab_size));
  ASSERT_TRUE(runner->logits(*store, logits.data()).is_ok());
  const auto lc = testing::expect_close("logits", logits.data(), fx.tensor("logits"), 5e-6, 1e-5);

  auto loss = runner->train_step(*store, 1.0 / static_cast<double>(rows));
  ASSERT_TRUE(loss.is_ok());
  EXPECT_NEAR(*loss, fx.tensor("loss")[0], 1e-5);

  double worst_relative = 0.0;
  for (const UnitLayout& unit : layout.units) {
    for (const TensorSlot& slot : unit.tensors) {
      const std::vector<float> want = fx.tensor("grad." + slot.name);
      ASSERT_EQ(static_cast<std::int64_t>(want.size()), slot.numel) << slot.name;
      double scale = 0.0;
      for (float w : want)
        scale = std::max(scale, static_cast<double>(std::abs(w)));
      const auto c =
          testing::expect_close("grad." + slot.name, store->grads(unit.index) + slot.offset, want,
                                1e-5 * scale + 1e-8, 1e-4);
      worst_relative = std::max(worst_relative, c.max_abs_error / (scale + 1e-30));
    }
  }
  RecordProperty("logits_max_abs_error", std::to_string(lc.max_abs_error));
  RecordProperty("grad_worst_error_relative_to_tensor_max", std::to_string(worst_relative));
  std::printf(
      "%s: logits max |error| %.3g (max |logit| %.3g); loss %.7f vs %.7f; gradients "
      "worst |error| / max|grad| of the tensor %.3g\n",
      GetParam().c_str(), lc.max_abs_error, lc.max_abs_reference, *loss, fx.tensor("loss")[0],
      worst_relative);
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureCompare, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::model
