// ModelRunner::set_batch's two extensions of a plain (B, T) batch: ignored targets (-1, PyTorch's
// ignore_index) and packed positions (documents restarting inside a row, as transformers' packed
// position_ids): the loss is the mean over the counted targets, a batch with none counts 0 with
// zero gradients, bad positions are named by row and column, and a packed row trains exactly what
// its documents as separate rows train.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/model/runner_batch_support.h"
#include "tests/model/tiny_models.h"

namespace strata::model {
namespace {

using testing::make_cpu_test_backend;

struct TinyRun {
  std::unique_ptr<backend::Backend> backend = make_cpu_test_backend();
  ModelShape spec;
  ModelLayout layout;
  std::unique_ptr<ResidentStore<float>> store;
  std::unique_ptr<ModelRunner<float>> runner;

  TinyRun(const ModelShape& shape, std::int64_t batch, std::int64_t seq_len) : spec(shape) {
    layout = build_layout(spec);
    store = std::move(ResidentStore<float>::create(*backend, layout)).value();
    for (const UnitLayout& unit : layout.units) {
      const auto v =
          testing::random_floats(static_cast<std::size_t>(unit.padded_numel),
                                 static_cast<std::uint64_t>(unit.index) + 7, -0.4f, 0.4f);
      std::copy(v.begin(), v.end(), store->params(unit.index));
    }
    RunnerOptions options;
    options.batch = batch;
    options.seq_len = seq_len;
    runner = std::move(ModelRunner<float>::create(*backend, spec, layout, options)).value();
  }
};

double cross_entropy(const float* row, std::int64_t vocab, std::int32_t target) {
  double m = row[0], sum = 0.0;
  for (std::int64_t j = 1; j < vocab; ++j)
    m = std::max(m, static_cast<double>(row[j]));
  for (std::int64_t j = 0; j < vocab; ++j)
    sum += std::exp(static_cast<double>(row[j]) - m);
  return m + std::log(sum) - row[target];
}

TEST(RunnerBatch, LossIsTheMeanOverCountedTargets) {
  TinyRun s(testing::tiny_llama(false), 2, 6);
  std::vector<std::int32_t> inputs, targets;
  for (int i = 0; i < 12; ++i) {
    inputs.push_back((i * 7) % 13);
    targets.push_back(i % 4 == 1 ? -1 : (i * 5 + 3) % 13);
  }
  ASSERT_TRUE(s.runner->set_batch(inputs.data(), targets.data()).is_ok());
  EXPECT_EQ(s.runner->counted_targets(), 9);
  std::vector<float> logits(12 * 13);
  ASSERT_TRUE(s.runner->logits(*s.store, logits.data()).is_ok());
  double sum = 0.0;
  for (int i = 0; i < 12; ++i)
    if (targets[i] >= 0) sum += cross_entropy(logits.data() + i * 13, 13, targets[i]);
  auto eval = s.runner->evaluate(*s.store);
  ASSERT_TRUE(eval.is_ok());
  EXPECT_NEAR(*eval, sum / 9.0, 1e-5);
  s.store->zero_grads();
  auto train = s.runner->train_step(*s.store, 1.0 / 9.0);
  ASSERT_TRUE(train.is_ok());
  EXPECT_NEAR(*train, sum / 9.0, 1e-5);
}

TEST(RunnerBatch, NoCountedTargetGivesZeroLossAndZeroGradients) {
  TinyRun s(testing::tiny_qwen_like(), 1, 5);
  const std::vector<std::int32_t> inputs = {1, 2, 3, 4, 5}, targets(5, -1);
  ASSERT_TRUE(s.runner->set_batch(inputs.data(), targets.data()).is_ok());
  EXPECT_EQ(s.runner->counted_targets(), 0);
  s.store->zero_grads();
  auto loss = s.runner->train_step(*s.store, 1.0);
  ASSERT_TRUE(loss.is_ok());
  EXPECT_EQ(*loss, 0.0);
  EXPECT_EQ(*s.runner->evaluate(*s.store), 0.0);
  for (const UnitLayout& unit : s.layout.units) {
    for (std::int64_t i = 0; i < unit.numel; ++i)
      ASSERT_EQ(s.store->grads(unit.index)[i], 0.0f) << unit.name << "[" << i << "]";
  }
}

TEST(RunnerBatch, TargetsOtherThanMinusOneOutsideTheVocabularyAreNamed) {
  TinyRun s(testing::tiny_gpt2(true), 1, 3);
  const std::vector<std::int32_t> inputs = {1, 2, 3}, targets = {4, -2, 0};
  Status st = s.runner->set_batch(inputs.data(), targets.data());
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.to_string().find("token id -2 at batch position 1"), std::string::npos)
      << st.to_string();
}

TEST(RunnerBatch, BadPositionsAreNamedByRowAndColumn) {
  TinyRun s(testing::tiny_llama(true), 2, 4);
  const std::vector<std::int32_t> tokens(8, 3);
  const std::vector<std::int32_t> jump = {0, 1, 2, 3, 0, 1, 3, 4};
  Status st = s.runner->set_batch(tokens.data(), tokens.data(), jump.data());
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.to_string().find("position 3 at row 1 column 2 follows 1"), std::string::npos)
      << st.to_string();
  const std::vector<std::int32_t> beyond = {2, 3, 4, 5, 0, 1, 2, 3};
  st = s.runner->set_batch(tokens.data(), tokens.data(), beyond.data());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.to_string().find("position 4 at row 0 column 2 is outside [0, seq_len 4)"),
            std::string::npos)
      << st.to_string();
}

// Positions 0..T-1 given explicitly take the same path as none: the same bits.
TEST(RunnerBatch, ExplicitDefaultPositionsAreBitIdenticalToNone) {
  for (const ModelShape& spec : {testing::tiny_gpt2(false), testing::tiny_phi3_like()}) {
    auto backend = make_cpu_test_backend();
    std::vector<std::vector<float>> params;
    for (const UnitLayout& unit : build_layout(spec).units) {
      params.push_back(testing::random_floats(static_cast<std::size_t>(unit.padded_numel),
                                              static_cast<std::uint64_t>(unit.index), -0.4f, 0.4f));
    }
    std::vector<std::int32_t> inputs, targets, positions;
    for (int i = 0; i < 14; ++i) {
      inputs.push_back(i % 11);
      targets.push_back((i + 3) % 11);
      positions.push_back(i % 7);
    }
    const auto none = testing::run_model(*backend, spec, params, 2, 7, inputs, targets, nullptr);
    const auto given =
        testing::run_model(*backend, spec, params, 2, 7, inputs, targets, &positions);
    EXPECT_EQ(none.logits, given.logits) << hf_model_type(spec);
    EXPECT_EQ(none.loss, given.loss);
    EXPECT_EQ(none.grads, given.grads);
  }
}

TEST(RunnerBatch, PackedRowTrainsWhatSeparateRowsTrain) {
  auto backend = make_cpu_test_backend();
  testing::expect_packed_equals_separate(*backend, testing::tiny_gpt2(true), 5, 7);
  testing::expect_packed_equals_separate(*backend, testing::tiny_llama(false), 9, 4);
  testing::expect_packed_equals_separate(*backend, testing::tiny_qwen_like(), 6, 8);
  // LongRoPE picks its factors by the batch's largest position: 2 + 2 keeps both at the short ones.
  testing::expect_packed_equals_separate(*backend, testing::tiny_phi3_like(), 2, 2);
}

}  // namespace
}  // namespace strata::model
