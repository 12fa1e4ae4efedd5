// The packed-sequence check shared by the CPU test and the CUDA one: a row holding two documents
// (positions restarting at the second) against the same documents as two rows of their own, each
// followed by filler whose targets are ignored (-1). Per-token logits, the mean loss and every
// gradient must agree within rounding.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "model/resident_store.h"
#include "model/runner.h"
#include "support/gpu_support.h"
#include "tests/model/fixture_support.h"

namespace strata::testing {

struct RunResult {
  std::vector<float> logits;  // (rows, V)
  double loss = 0.0;
  std::vector<std::vector<float>> grads;  // per unit
};

inline RunResult run_model(backend::Backend& backend, const model::ModelShape& spec,
                           const std::vector<std::vector<float>>& params, std::int64_t batch,
                           std::int64_t seq_len, const std::vector<std::int32_t>& inputs,
                           const std::vector<std::int32_t>& targets,
                           const std::vector<std::int32_t>* positions) {
  const model::ModelLayout layout = model::build_layout(spec);
  auto store = std::move(model::ResidentStore<float>::create(backend, layout)).value();
  for (const model::UnitLayout& unit : layout.units) {
    EXPECT_TRUE(backend
                    .copy_async(backend::StreamKind::kCompute, store->params(unit.index),
                                params[static_cast<std::size_t>(unit.index)].data(),
                                static_cast<std::uint64_t>(unit.padded_numel) * 4)
                    .is_ok());
  }
  model::RunnerOptions options;
  options.batch = batch;
  options.seq_len = seq_len;
  auto runner =
      std::move(model::ModelRunner<float>::create(backend, spec, layout, options)).value();
  RunResult r;
  const std::int32_t* pos = positions != nullptr ? positions->data() : nullptr;
  EXPECT_TRUE(runner->set_batch(inputs.data(), targets.data(), pos).is_ok());
  r.logits.resize(static_cast<std::size_t>(batch * seq_len * spec.vocab_size));
  EXPECT_TRUE(runner->logits(*store, r.logits.data()).is_ok());
  store->zero_grads();
  auto loss = runner->train_step(*store, 1.0 / static_cast<double>(runner->counted_targets()));
  EXPECT_TRUE(loss.is_ok());
  r.loss = loss.is_ok() ? *loss : 0.0;
  EXPECT_TRUE(backend.synchronize(backend::StreamKind::kCompute).is_ok());
  for (const model::UnitLayout& unit : layout.units) {
    std::vector<float> g(static_cast<std::size_t>(unit.padded_numel));
    EXPECT_TRUE(backend
                    .copy_async(backend::StreamKind::kCompute, g.data(), store->grads(unit.index),
                                g.size() * 4)
                    .is_ok());
    r.grads.push_back(std::move(g));
  }
  return r;
}

// Documents of lengths a and b (a + b = T): packed in one row, and as two rows with filler.
inline void expect_packed_equals_separate(backend::Backend& backend, const model::ModelShape& spec,
                                          std::int64_t a, std::int64_t b) {
  const std::int64_t t = a + b, v = spec.vocab_size;
  std::vector<std::vector<float>> params;
  for (const model::UnitLayout& unit : model::build_layout(spec).units) {
    params.push_back(random_floats(static_cast<std::size_t>(unit.padded_numel),
                                   static_cast<std::uint64_t>(unit.index) + 50, -0.4f, 0.4f));
  }
  std::vector<std::int32_t> doc_inputs, doc_targets;
  for (std::int64_t i = 0; i < t; ++i) {
    doc_inputs.push_back(static_cast<std::int32_t>((i * 5 + 2) % v));
    doc_targets.push_back(static_cast<std::int32_t>((i * 3 + 1) % v));
  }
  std::vector<std::int32_t> positions;
  for (std::int64_t i = 0; i < t; ++i)
    positions.push_back(static_cast<std::int32_t>(i < a ? i : i - a));
  const RunResult packed =
      run_model(backend, spec, params, 1, t, doc_inputs, doc_targets, &positions);
  // Row 0: document a then filler; row 1: document b then filler. Filler targets are ignored.
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(2 * t), 1), targets(inputs.size(), -1);
  for (std::int64_t i = 0; i < a; ++i) {
    inputs[i] = doc_inputs[i];
    targets[i] = doc_targets[i];
  }
  for (std::int64_t i = 0; i < b; ++i) {
    inputs[t + i] = doc_inputs[a + i];
    targets[t + i] = doc_targets[a + i];
  }
  const RunResult separate = run_model(backend, spec, params, 2, t, inputs, targets, nullptr);

  std::vector<float> want;
  want.insert(want.end(), separate.logits.begin(), separate.logits.begin() + a * v);
  want.insert(want.end(), separate.logits.begin() + t * v, separate.logits.begin() + (t + b) * v);
  expect_close("per-token logits", packed.logits.data(), want, 1e-5, 1e-4);
  EXPECT_NEAR(packed.loss, separate.loss, 1e-5);
  for (std::size_t u = 0; u < packed.grads.size(); ++u) {
    double scale = 0.0;
    for (float g : separate.grads[u])
      scale = std::max(scale, static_cast<double>(std::abs(g)));
    expect_close("grads of unit " + std::to_string(u), packed.grads[u].data(), separate.grads[u],
                 1e-5 * scale + 1e-7, 1e-4);
  }
}

}  // namespace strata::testing
