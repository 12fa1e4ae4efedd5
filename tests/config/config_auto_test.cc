// "auto" as the Hugging Face Trainer templates write it: resolved consistently (as the Trainer
// would with its default arguments, precision by the hardware), printed loudly, replaced by
// flags; and schedules whose warm-up outlasts the run.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "config/config.h"

namespace strata::config {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// The Hugging Face Trainer's ZeRO-3 template (transformers tests/deepspeed/ds_config_zero3.json),
// as users copy it.
const char* const kTrainerTemplate = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
           "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "optimizer": {"type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR",
                "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                           "warmup_num_steps": "auto"}},
  "zero_optimization": {
    "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu", "pin_memory": true}, "overlap_comm": true,
    "contiguous_gradients": true, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true},
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "steps_per_print": 2000,
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
})";

Loaded load_ok(const std::string& text, LoadOptions options = LoadOptions{1},
               const std::vector<std::string>& overrides = {}) {
  auto loaded = load_config_text(text, "ds.json", overrides, options);
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  return loaded.is_ok() ? *loaded : Loaded{};
}

std::map<std::string, std::string> autos(const Loaded& loaded) {
  std::map<std::string, std::string> m;
  for (const AutoChoice& a : loaded.autos)
    m[a.path] = a.value;
  return m;
}

TEST(ConfigAuto, TrainerTemplateResolvesAsTheTrainerWouldAndSaysSo) {
  Loaded loaded = load_ok(kTrainerTemplate);
  const Config& c = loaded.config;
  EXPECT_DOUBLE_EQ(c.optimizer.params.lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.optimizer.params.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8u);
  EXPECT_EQ(c.gradient_accumulation_steps, 1u);
  EXPECT_EQ(c.train_batch_size, 8u);
  EXPECT_DOUBLE_EQ(c.scheduler.params.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.params.warmup_max_lr, 5e-5);  // follows the learning rate
  EXPECT_EQ(c.scheduler.params.warmup_num_steps, 0);
  EXPECT_EQ(c.precision(), Precision::kBf16);
  // The choices that shape the job are listed together, each with where it came from.
  const auto chosen = autos(loaded);
  for (const char* path :
       {"precision", "optimizer.params.lr", "gradient_clipping", "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps", "scheduler.params.warmup_num_steps"}) {
    EXPECT_EQ(chosen.count(path), 1u) << path;
  }
  EXPECT_EQ(chosen.at("precision"), "bf16");
  EXPECT_EQ(chosen.at("optimizer.params.lr"), "5e-05");
  for (const AutoChoice& a : loaded.autos) {
    EXPECT_FALSE(a.reason.empty()) << a.path;
  }
}

TEST(ConfigAuto, PrecisionFollowsTheHardwareUnlessOneSwitchIsExplicit) {
  LoadOptions old_gpu(1);
  old_gpu.auto_precision = [] {
    return std::make_pair(Precision::kFp16, std::string("GPU 0 (sm_75) has no bf16"));
  };
  EXPECT_EQ(load_ok(kTrainerTemplate, old_gpu).config.precision(), Precision::kFp16);
  EXPECT_EQ(
      load_ok(R"({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})").config.precision(),
      Precision::kBf16);
  // An explicit switch wins over the other section's "auto".
  EXPECT_EQ(load_ok(R"({"fp16": {"enabled": "auto"}, "bf16": {"enabled": true}})", old_gpu)
                .config.precision(),
            Precision::kBf16);
  EXPECT_EQ(
      load_ok(R"({"fp16": {"enabled": true}, "bf16": {"enabled": "auto"}})").config.precision(),
      Precision::kFp16);
}

TEST(ConfigAuto, WarmupDecayWithAutoStepsFitsTheRun) {
  Loaded loaded = load_ok(R"({"scheduler": {"type": "WarmupDecayLR", "params":
      {"warmup_num_steps": "auto", "total_num_steps": "auto", "warmup_max_lr": "auto"}},
      "strata": {"train_steps": 100}})");
  EXPECT_EQ(loaded.config.scheduler.params.total_num_steps, 100);
  EXPECT_EQ(loaded.config.scheduler.params.warmup_num_steps, 0);
}

TEST(ConfigAuto, WarmupLongerThanTheRunIsAWarningNotAnError) {
  // DeepSpeed's default warm-up (1000 steps) with a quick 100-step try.
  for (const char* type : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}) {
    Loaded loaded = load_ok(std::string(R"({"scheduler": {"type": ")") + type +
                            R"("}, "strata": {"train_steps": 100}})");
    bool warned = false;
    for (const Note& note : loaded.notes) {
      if (note.path == "scheduler.params.warmup_num_steps" && note.severity == Severity::kWarning) {
        warned = true;
        EXPECT_CONTAINS(note.message, "1000 warm-up steps are more than the 100 steps");
      }
    }
    EXPECT_TRUE(warned) << type;
  }
}

TEST(ConfigAuto, FlagsChooseWhatAutoWouldHave) {
  LoadOptions options(1);
  options.flags = {{"--lr", "2e-5"}, {"--micro-batch-size", "4"}, {"--fp32", ""}};
  Loaded loaded = load_ok(kTrainerTemplate, options);
  EXPECT_DOUBLE_EQ(loaded.config.optimizer.params.lr, 2e-5);
  EXPECT_DOUBLE_EQ(loaded.config.scheduler.params.warmup_max_lr, 2e-5);  // WarmupLR peak too
  EXPECT_EQ(loaded.config.train_micro_batch_size_per_gpu, 4u);
  EXPECT_EQ(loaded.config.precision(), Precision::kFp32);
  const auto chosen = autos(loaded);
  EXPECT_EQ(chosen.count("optimizer.params.lr"), 0u);  // the flag chose it
  EXPECT_EQ(chosen.count("precision"), 0u);
}

TEST(ConfigAuto, AutoOnAKeyWithNoEffectIsQuiet) {
  Loaded loaded = load_ok(R"({"train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"reduce_bucket_size": "auto",
      "allgather_bucket_size": "auto", "overlap_comm": "auto"}})");
  for (const Note& note : loaded.notes) {
    EXPECT_NE(note.severity, Severity::kWarning) << note.path;
  }
}

TEST(ConfigAuto, EffectiveConfigOfATemplateReadsBackTheSame) {
  Loaded first = load_ok(kTrainerTemplate);
  const std::string json = to_json(first.config);
  EXPECT_EQ(to_json(load_ok(json).config), json);
}

}  // namespace
}  // namespace strata::config
