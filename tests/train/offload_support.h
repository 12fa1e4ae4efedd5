// Helpers for the offload tests: a tiny GPT-2 or Llama config with every tier choice, or one of the
// Llama-family fixtures of tests/fixtures/models (Qwen2, Qwen3, Mistral, Phi-3, ...: family names
// the fixture), a trainer built in-process (so tests can read the state and inject the I/O fault
// twin), and the state's bytes for bit-for-bit comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "train/trainer.h"

namespace strata::testing {

struct Tiers {
  std::string name;
  int stage = 0;
  std::string param = "none";      // offload_param.device
  std::string optimizer = "none";  // offload_optimizer.device
  std::string extra_zero;          // more zero_optimization keys
  std::string extra_strata;        // more strata keys
  int prefetch_bucket = 20000;     // stage3_prefetch_bucket_size
};

// The strata.model keys of `family`: gpt2 and llama are built from strata.model; any other name is
// a fixture directory of tests/fixtures/models (vocabulary 64, positions 32).
inline std::string tiny_model_keys(const std::string& family) {
  if (family == "gpt2" || family == "llama") {
    return R"("family": ")" + family +
           R"(", "vocab_size": 64, "max_seq_len": 32, "hidden_size": 32,
                "num_layers": 3, "num_heads": 4)" +
           (family == "llama" ? R"(, "num_kv_heads": 2, "tie_word_embeddings": false)" : "");
  }
#if defined(STRATA_SOURCE_DIR)
  return R"("family": "llama", "path": ")" + std::string(STRATA_SOURCE_DIR) +
         "/tests/fixtures/models/" + family + R"(")";
#else
  // Helper programs are built without the source tree's path: the model load then fails naming it.
  return "\"family\": \"llama\", \"path\": \"fixture " + family + ", test targets only\"";
#endif
}

inline std::string tiny_config(const std::string& family, const std::string& precision,
                               const Tiers& t, const std::string& out, const std::string& nvme,
                               int steps) {
  std::string p;
  if (precision == "bf16") p = R"("bf16": {"enabled": true},)";
  if (precision == "fp16") p = R"("fp16": {"enabled": true, "initial_scale_power": 12},)";
  const std::string nvme_path = R"(, "nvme_path": ")" + nvme + R"(")";
  return "{" + p + R"(
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2, "total_num_steps": 8}},
    "zero_optimization": {"stage": )" +
         std::to_string(t.stage) + R"(, "stage3_param_persistence_threshold": 0,
      "stage3_prefetch_bucket_size": )" +
         std::to_string(t.prefetch_bucket) + R"(,
      "offload_param": {"device": ")" +
         t.param + R"(")" + (t.param == "nvme" ? nvme_path : "") + R"(,
                        "max_in_cpu": 0, "buffer_count": 2, "buffer_size": 4096},
      "offload_optimizer": {"device": ")" +
         t.optimizer + R"(")" + (t.optimizer == "nvme" ? nvme_path : "") + R"(})" + t.extra_zero +
         R"(},
    "aio": {"block_size": 65536, "queue_depth": 8},
    "strata": {"output_dir": ")" +
         out + R"(", "train_steps": )" + std::to_string(steps) + R"(, "seed": 11, "cpu_threads": 2,
      "device_bytes_max": "64MiB", "host_bytes_max": "256MiB", "eval_batches": 1,)" +
         t.extra_strata + R"(
      "model": {)" +
         tiny_model_keys(family) + R"(},
      "data": {"source": "synthetic", "seq_len": 16, "synthetic_vocab_size": 64,
               "synthetic_branching": 3}}})";
}

inline config::Config load(const std::string& text,
                           const std::vector<std::string>& overrides = {}) {
  auto loaded = config::load_config_text(text, "test config", overrides);
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string() << "\n" << text;
  return loaded.is_ok() ? loaded->config : config::Config{};
}

// The `kinds` slots of every unit, unit by unit, back to back (after the step in flight ends).
inline std::vector<float> slot_values(train::Trainer& trainer,
                                      std::initializer_list<offload::SlotKind> kinds) {
  EXPECT_TRUE(trainer.finish_step().is_ok());
  std::vector<float> all;
  offload::OffloadStore& state = trainer.state();
  for (int u = 0; u < state.units(); ++u) {
    const auto n =
        static_cast<std::size_t>(state.layout().units[static_cast<std::size_t>(u)].padded_numel);
    for (offload::SlotKind kind : kinds) {
      auto view = state.view(kind, u);
      EXPECT_TRUE(view.is_ok()) << view.status().to_string();
      if (!view.is_ok()) return {};
      all.insert(all.end(), *view, *view + n);
    }
  }
  return all;
}

// Master weights, exp_avg and exp_avg_sq of every unit, back to back.
inline std::vector<float> state_bytes(train::Trainer& trainer) {
  return slot_values(trainer, {offload::SlotKind::kMaster, offload::SlotKind::kExpAvg,
                               offload::SlotKind::kExpAvgSq});
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace strata::testing
