// The training config that replays a PyTorch fixture (tools/make_fixtures.py): its batch, AdamW
// hyper-parameters (no clipping, as the fixture's torch.optim.AdamW), model directory and token
// file, three steps, no shuffling or validation split.
// Shared by the CPU and the CUDA trainer tests against torch.optim.AdamW.
#pragma once

#include <fmt/format.h>

#include <string>

#include "tests/model/fixture_support.h"

namespace strata::testing {

// `strata_keys`: more keys for the strata section, each followed by a comma (backend, threads,
// budgets). Outputs go to `dir`/out.
inline std::string fixture_train_config(const Fixture& fx, const std::string& name,
                                        const std::string& dir, const std::string& tokens,
                                        const std::string& strata_keys) {
  return fmt::format(
      R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
          "gradient_clipping": 0.0,
          "optimizer": {{"type": "AdamW", "params": {{"lr": {}, "betas": [{}, {}], "eps": {},
                                                   "weight_decay": {}}}}},
          "strata": {{"output_dir": "{}/out", "train_steps": 3, {}
                      "model": {{"path": "{}"}},
                      "data": {{"source": "tokens", "path": "{}", "seq_len": {},
                                "val_fraction": 0, "shuffle": false}}}}}})",
      fx.batch, fx.metadata("lr"), fx.metadata("beta1"), fx.metadata("beta2"), fx.metadata("eps"),
      fx.metadata("weight_decay"), dir, strata_keys, fixture_dir(name), tokens, fx.seq_len);
}

}  // namespace strata::testing
