// Whole-model gradient checks in double precision: GPT-2 and Llama (grouped KV heads), tied and
// untied embeddings, with and without activation checkpointing, and the Llama family's options
// (biases, q/k norms, sliding windows, scaled and partial RoPE, fused names) with packed positions
// and ignored targets, against central differences of the mean token loss.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/layout.h"
#include "model/resident_store.h"
#include "model/runner.h"
#include "tests/kernels/grad_check.h"
#include "tests/model/tiny_models.h"

namespace strata::model {
namespace {

using testing::tiny_gpt2;
using testing::tiny_llama;
using testing::tiny_phi3_like;
using testing::tiny_qwen_like;

std::unique_ptr<backend::Backend> make_backend() {
  return testing::make_cpu_test_backend();
}

// Random parameters large enough that every path carries signal; norm weights near 1.
void fill_params(ResidentStore<double>& store, const ModelLayout& layout, std::uint64_t seed) {
  for (const UnitLayout& unit : layout.units) {
    double* p = store.params(unit.index);
    for (std::size_t t = 0; t < unit.tensors.size(); ++t) {
      const TensorSlot& slot = unit.tensors[t];
      const bool norm = slot.shape.size() == 1 && slot.name.find("weight") != std::string::npos;
      auto values = testing::random_vector(static_cast<std::size_t>(slot.numel),
                                           seed * 100 + unit.index * 10 + t, norm ? 0.8 : -0.5,
                                           norm ? 1.2 : 0.5);
      std::memcpy(p + slot.offset, values.data(), values.size() * sizeof(double));
    }
  }
}

struct Batch {
  std::vector<std::int32_t> inputs, targets;
};

Batch make_batch(const ModelShape& spec, std::int64_t rows, std::uint64_t seed) {
  Batch b;
  auto r = testing::random_vector(static_cast<std::size_t>(2 * rows), seed, 0.0,
                                  static_cast<double>(spec.vocab_size) - 1e-9);
  for (std::int64_t i = 0; i < rows; ++i) {
    b.inputs.push_back(static_cast<std::int32_t>(r[i]));
    b.targets.push_back(static_cast<std::int32_t>(r[rows + i]));
  }
  return b;
}

// `packed`: two documents per row (positions restart); `masked`: two targets are -1.
void check_model(const ModelShape& spec, bool checkpointing, bool packed = false,
                 bool masked = false) {
  auto backend = make_backend();
  const ModelLayout layout = build_layout(spec);
  auto store = std::move(ResidentStore<double>::create(*backend, layout)).value();
  fill_params(*store, layout, 7);
  RunnerOptions options;
  options.batch = 2;
  options.seq_len = 5;
  options.activation_checkpointing = checkpointing;
  options.logits_chunk_bytes = 3 * spec.vocab_size * sizeof(double);  // several head chunks
  auto runner = std::move(ModelRunner<double>::create(*backend, spec, layout, options)).value();
  const std::int64_t rows = options.batch * options.seq_len;
  Batch batch = make_batch(spec, rows, 3);
  const std::vector<std::int32_t> positions = {0, 1, 2, 0, 1, 0, 0, 1, 2, 3};
  if (masked) batch.targets[3] = batch.targets[7] = -1;
  ASSERT_TRUE(runner
                  ->set_batch(batch.inputs.data(), batch.targets.data(),
                              packed ? positions.data() : nullptr)
                  .is_ok());
  EXPECT_EQ(runner->counted_targets(), masked ? rows - 2 : rows);

  store->zero_grads();
  auto loss = runner->train_step(*store, 1.0 / static_cast<double>(runner->counted_targets()));
  ASSERT_TRUE(loss.is_ok()) << loss.status().to_string();
  auto eval = runner->evaluate(*store);
  ASSERT_TRUE(eval.is_ok());
  EXPECT_DOUBLE_EQ(*loss, *eval);
  for (const UnitLayout& unit : layout.units) {
    EXPECT_EQ(store->ready_count(unit.index), 1) << unit.name;
  }

  for (const UnitLayout& unit : layout.units) {
    for (const TensorSlot& slot : unit.tensors) {
      double* p = store->params(unit.index) + slot.offset;
      const double* g = store->grads(unit.index) + slot.offset;
      std::vector<double> x(p, p + slot.numel);
      std::vector<double> analytic(g, g + slot.numel);
      testing::expect_gradient_matches(
          slot.name, x, analytic,
          [&] {
            std::memcpy(p, x.data(), x.size() * sizeof(double));
            return *runner->evaluate(*store);
          },
          1e-6, 25);
      std::memcpy(p, x.data(), x.size() * sizeof(double));
    }
  }
}

TEST(ModelGradients, Gpt2Tied) {
  check_model(tiny_gpt2(true), false);
}
TEST(ModelGradients, Gpt2UntiedWithCheckpointing) {
  check_model(tiny_gpt2(false), true);
}
TEST(ModelGradients, LlamaGroupedKvUntied) {
  check_model(tiny_llama(false), false);
}
TEST(ModelGradients, LlamaGroupedKvTiedWithCheckpointing) {
  check_model(tiny_llama(true), true);
}
TEST(ModelGradients, QwenLikeBiasesNormsYarnAndOneWindowedLayer) {
  check_model(tiny_qwen_like(), false);
}
TEST(ModelGradients, PhiLikeFusedPartialLongRopeWindowedTiedWithCheckpointing) {
  check_model(tiny_phi3_like(), true);
}
TEST(ModelGradients, PhiLikePackedDocumentsUseTheShortFactors) {
  check_model(tiny_phi3_like(), false, true, false);
}
TEST(ModelGradients, Gpt2PackedDocumentsAndIgnoredTargets) {
  check_model(tiny_gpt2(false), false, true, true);
}
TEST(ModelGradients, QwenLikePackedDocumentsAndIgnoredTargets) {
  check_model(tiny_qwen_like(), true, true, true);
}

// Activation checkpointing recomputes with the same deterministic kernels: gradients are
// bit-identical to keeping every activation.
TEST(ModelRunner, CheckpointingGivesBitIdenticalGradients) {
  for (const ModelShape& spec : {tiny_gpt2(true), tiny_llama(false), tiny_qwen_like()}) {
    auto backend = make_backend();
    const ModelLayout layout = build_layout(spec);
    std::vector<std::vector<float>> grads[2];
    for (int ckpt = 0; ckpt < 2; ++ckpt) {
      auto store = std::move(ResidentStore<float>::create(*backend, layout)).value();
      for (const UnitLayout& unit : layout.units) {
        auto v =
            testing::random_vector(static_cast<std::size_t>(unit.numel), unit.index, -0.3, 0.3);
        std::copy(v.begin(), v.end(), store->params(unit.index));
      }
      RunnerOptions options;
      options.batch = 3;
      options.seq_len = 7;
      options.activation_checkpointing = ckpt == 1;
      auto runner = std::move(ModelRunner<float>::create(*backend, spec, layout, options)).value();
      const Batch batch = make_batch(spec, 21, 5);
      ASSERT_TRUE(runner->set_batch(batch.inputs.data(), batch.targets.data()).is_ok());
      ASSERT_TRUE(runner->train_step(*store, 1.0 / 21).is_ok());
      for (const UnitLayout& unit : layout.units) {
        grads[ckpt].emplace_back(store->grads(unit.index),
                                 store->grads(unit.index) + unit.padded_numel);
      }
    }
    EXPECT_EQ(grads[0], grads[1]) << family_name(spec.family);
  }
}

// Tied embeddings: the tied model's token-table gradient is the sum of what an untied model with
// equal weights gives its embedding and its head.
TEST(ModelRunner, TiedGradientIsTheSumOfBothUses) {
  const ModelShape tied_spec = tiny_gpt2(true), untied_spec = tiny_gpt2(false);
  auto backend = make_backend();
  const ModelLayout tied = build_layout(tied_spec), untied = build_layout(untied_spec);
  auto a = std::move(ResidentStore<double>::create(*backend, tied)).value();
  auto b = std::move(ResidentStore<double>::create(*backend, untied)).value();
  fill_params(*a, tied, 11);
  fill_params(*b, untied, 11);
  const UnitLayout& head = untied.units.back();
  const TensorSlot& lm = head.tensors[gpt2::kLmHead];
  const TensorSlot& wte = untied.units[0].tensors[gpt2::kWte];
  std::memcpy(b->params(head.index) + lm.offset, b->params(0) + wte.offset,
              wte.numel * sizeof(double));
  RunnerOptions options;
  options.batch = 2;
  options.seq_len = 4;
  auto ra = std::move(ModelRunner<double>::create(*backend, tied_spec, tied, options)).value();
  auto rb = std::move(ModelRunner<double>::create(*backend, untied_spec, untied, options)).value();
  const Batch batch = make_batch(tied_spec, 8, 9);
  ASSERT_TRUE(ra->set_batch(batch.inputs.data(), batch.targets.data()).is_ok());
  ASSERT_TRUE(rb->set_batch(batch.inputs.data(), batch.targets.data()).is_ok());
  const double la = *ra->train_step(*a, 0.125), lb = *rb->train_step(*b, 0.125);
  EXPECT_NEAR(la, lb, 1e-12);
  for (std::int64_t i = 0; i < wte.numel; ++i) {
    const double sum = b->grads(0)[wte.offset + i] + b->grads(head.index)[lm.offset + i];
    ASSERT_NEAR(a->grads(0)[wte.offset + i], sum, 1e-12) << i;
  }
}

TEST(ModelRunner, RejectsTokensOutsideTheVocabulary) {
  const ModelShape spec = tiny_gpt2(true);
  auto backend = make_backend();
  const ModelLayout layout = build_layout(spec);
  RunnerOptions options;
  options.batch = 1;
  options.seq_len = 3;
  auto runner = std::move(ModelRunner<float>::create(*backend, spec, layout, options)).value();
  std::vector<std::int32_t> inputs = {1, 2, 3}, targets = {4, 11, 0};
  Status s = runner->set_batch(inputs.data(), targets.data());
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("token id 11 at batch position 1"), std::string::npos)
      << s.to_string();
}

TEST(ModelRunner, SequenceLongerThanThePositionTableIsAnError) {
  const ModelShape spec = tiny_gpt2(true);
  auto backend = make_backend();
  RunnerOptions options;
  options.seq_len = 17;
  auto runner = ModelRunner<float>::create(*backend, spec, build_layout(spec), options);
  ASSERT_FALSE(runner.is_ok());
  EXPECT_NE(runner.status().to_string().find("max_seq_len 16"), std::string::npos);
}

TEST(ModelRunner, ActivationsThatDoNotFitNameTheDeviceBudget) {
  backend::CpuBackendOptions o;
  o.device_bytes_max = 64 << 10;
  o.threads = 1;
  auto backend = std::move(backend::make_cpu_backend(o)).value();
  const ModelShape spec = tiny_llama(false);
  RunnerOptions options;
  options.batch = 8;
  options.seq_len = 16;
  auto runner = ModelRunner<float>::create(*backend, spec, build_layout(spec), options);
  ASSERT_FALSE(runner.is_ok());
  EXPECT_EQ(runner.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(runner.status().to_string().find("strata.device_bytes_max"), std::string::npos);
}

}  // namespace
}  // namespace strata::model
