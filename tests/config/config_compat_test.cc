// Reading DeepSpeed configs as DeepSpeed reads them: every name DeepSpeed accepts (field names
// and their stage3_ aliases, old names), DeepSpeed's ranges, keys Strata accepts with no effect,
// features it refuses, unknown keys by section, and the report of what happened to each key.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"

namespace strata::config {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

Loaded load_ok(const std::string& text, const std::vector<std::string>& overrides = {}) {
  auto loaded = load_config_text(text, "ds.json", overrides, LoadOptions{1});
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string() << "\n" << text;
  return loaded.is_ok() ? *loaded : Loaded{};
}

std::string load_error(const std::string& text) {
  auto loaded = load_config_text(text, "ds.json", {}, LoadOptions{1});
  EXPECT_FALSE(loaded.is_ok()) << "expected an error for: " << text;
  if (loaded.is_ok()) return {};
  EXPECT_EQ(loaded.status().exit_code(), 2);
  return loaded.status().to_string();
}

std::vector<std::string> warnings(const Loaded& loaded) {
  std::vector<std::string> paths;
  for (const Note& note : loaded.notes) {
    if (note.severity == Severity::kWarning) paths.push_back(note.path);
  }
  return paths;
}

const KeyReport* report_of(const Loaded& loaded, const std::string& path) {
  for (const KeyReport& key : loaded.keys) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

TEST(ConfigNames, ZeroFieldNamesAndStage3AliasesAreBothRead) {
  struct Pair {
    const char* field;
    std::uint64_t ZeroConfig::*member;
  };
  const Pair pairs[] = {
      {"prefetch_bucket_size", &ZeroConfig::stage3_prefetch_bucket_size},
      {"max_live_parameters", &ZeroConfig::stage3_max_live_parameters},
      {"max_reuse_distance", &ZeroConfig::stage3_max_reuse_distance},
      {"param_persistence_threshold", &ZeroConfig::stage3_param_persistence_threshold},
  };
  for (const Pair& p : pairs) {
    const std::string field = p.field;
    Loaded by_field = load_ok(R"({"zero_optimization": {"stage": 3, ")" + field + R"(": 12345}})");
    EXPECT_EQ(by_field.config.zero_optimization.*p.member, 12345u) << field;
    Loaded by_alias =
        load_ok(R"({"zero_optimization": {"stage": 3, "stage3_)" + field + R"(": 678}})");
    EXPECT_EQ(by_alias.config.zero_optimization.*p.member, 678u) << field;
    // Both names, one value: fine; two values: an error naming both.
    load_ok(R"({"zero_optimization": {"stage": 3, ")" + field + R"(": 5, "stage3_)" + field +
            R"(": 5}})");
    EXPECT_CONTAINS(load_error(R"({"zero_optimization": {")" + field + R"(": 5, "stage3_)" + field +
                               R"(": 6}})"),
                    "zero_optimization." + field + ": another name of 'zero_optimization.stage3_" +
                        field + "', which is also set, differently");
  }
}

TEST(ConfigNames, Gather16BitFieldNameIsReadAndPrintedAsGiven) {
  // DeepSpeed's field name: today's bug read it as "ignored" and printed false.
  Loaded loaded =
      load_ok(R"({"zero_optimization": {"stage": 3, "gather_16bit_weights_on_model_save": true}})");
  EXPECT_TRUE(loaded.config.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_CONTAINS(to_json(loaded.config), "\"stage3_gather_16bit_weights_on_model_save\": true");
  for (const char* old :
       {"stage3_gather_fp16_weights_on_model_save", "gather_fp16_weights_on_model_save"}) {
    Loaded by_old =
        load_ok(std::string(R"({"zero_optimization": {"stage": 3, ")") + old + R"(": true}})");
    EXPECT_TRUE(by_old.config.zero_optimization.stage3_gather_16bit_weights_on_model_save) << old;
  }
}

TEST(ConfigNames, NoEffectKeysAreReadUnderBothNames) {
  for (const char* key : {"model_persistence_threshold", "stage3_model_persistence_threshold",
                          "module_granularity_threshold", "stage3_module_granularity_threshold"}) {
    Loaded loaded =
        load_ok(std::string(R"({"zero_optimization": {"stage": 3, ")") + key + R"(": 1000}})");
    const KeyReport* r = report_of(loaded, std::string("zero_optimization.") + key);
    ASSERT_NE(r, nullptr) << key;
    EXPECT_EQ(r->use, KeyUse::kNoEffect) << key;
  }
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"module_granularity_threshold": "x"}})"),
                  "expected a whole number");
}

TEST(ConfigRanges, DeepSpeedsZeroesAreValidAndSayWhatTheyMean) {
  Loaded loaded = load_ok(R"({"zero_optimization": {"stage": 3, "sub_group_size": 0,
      "reduce_bucket_size": 0, "allgather_bucket_size": 0,
      "offload_param": {"device": "cpu", "buffer_count": 0, "buffer_size": 0},
      "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "ratio": 0}}})");
  // 0 tiles means Strata's default tile, shown as the value in effect.
  EXPECT_EQ(loaded.config.zero_optimization.sub_group_size, 33'554'432u);
  bool noted = false;
  for (const Note& note : loaded.notes)
    noted = noted || note.path == "zero_optimization.sub_group_size";
  EXPECT_TRUE(noted);
  EXPECT_DOUBLE_EQ(loaded.config.zero_optimization.offload_optimizer.ratio, 0.0);
  // Below DeepSpeed's ranges it is still an error.
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"reduce_bucket_size": -1}})"),
                  "zero_optimization.reduce_bucket_size: -1 is out of range");
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"sub_group_size": -5}})"),
                  "zero_optimization.sub_group_size: -5 is out of range");
  // The public Hugging Face template writes 1e14.
  EXPECT_EQ(load_ok(R"({"zero_optimization": {"sub_group_size": 1e14}})")
                .config.zero_optimization.sub_group_size,
            100'000'000'000'000u);
}

TEST(ConfigRanges, ZeroStagingBuffersCannotReadFromNvme) {
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"stage": 3, "offload_param":
      {"device": "nvme", "nvme_path": "/nvme", "buffer_count": 0}}})"),
                  "0 staging buffers cannot read parameters from NVMe");
}

TEST(ConfigUnknown, TopLevelSectionsStrataHasNoUseForWarnOncePerKey) {
  Loaded loaded = load_ok(R"({
    "_comment": "fine-tuning config",
    "comms_config": {"verbose": true},
    "monitor_config": {"enabled": true, "tag": "run"},
    "tensor_parallel": {"autotp_size": 2},
    "cuda_visible_devices": "0,1",
    "compile": {"disable": false, "backend": "inductor"},
    "flops_profiler": {"enabled": false},
    "tensorboard": {"enabled": true, "output_path": "tb"},
    "wandb": {"enabled": false},
    "csv_monitor": {"enabled": true},
    "comms_logger": {"enabled": true},
    "data_efficiency": {"enabled": false},
    "compression_training": {"weight_quantization": {"shared_parameters": {"enabled": false}}},
    "zero_allow_untested_optimizer": true,
    "train_micro_batch_size_per_gpu": 2
  })");
  // One warning per key that asks for something; "enabled": false asks for nothing; "_comment"
  // is a comment.
  EXPECT_EQ(warnings(loaded),
            (std::vector<std::string>{"zero_allow_untested_optimizer", "tensorboard", "csv_monitor",
                                      "monitor_config", "comms_logger", "comms_config", "compile",
                                      "tensor_parallel", "cuda_visible_devices"}));
  for (const char* key : {"_comment", "flops_profiler", "wandb", "data_efficiency"}) {
    const KeyReport* r = report_of(loaded, key);
    ASSERT_NE(r, nullptr) << key;
    EXPECT_EQ(r->use, KeyUse::kNoEffect) << key;
  }
}

TEST(ConfigUnknown, NearMissOfAKeyStrataUsesIsAnErrorEvenAtTheTopLevel) {
  EXPECT_CONTAINS(load_error(R"({"train_micro_batch_size_per_gpux": 4})"),
                  "train_micro_batch_size_per_gpux: unknown key; did you mean "
                  "'train_micro_batch_size_per_gpu'?");
  EXPECT_CONTAINS(load_error(R"({"aio": {"queue_dpeth": 4}})"),
                  "aio.queue_dpeth: unknown key; did you mean 'queue_depth'?");
}

TEST(ConfigUnknown, SectionsDeepSpeedReadsKeyByKeyWarnOnOtherKeys) {
  Loaded loaded = load_ok(R"({"train_micro_batch_size_per_gpu": 1, "aio": {"future_knob": 1},
      "activation_checkpointing": {"partition_activations": false, "new_thing": true},
      "optimizer": {"type": "AdamW", "extra": 1}})");
  EXPECT_EQ(warnings(loaded), (std::vector<std::string>{"optimizer.extra", "aio.future_knob",
                                                        "activation_checkpointing.new_thing"}));
}

TEST(ConfigUnknown, SectionsWithDeepSpeedModelsRefuseOtherKeys) {
  for (const char* text :
       {R"({"zero_optimization": {"frobnicate": 1}})", R"({"fp16": {"frobnicate": 1}})",
        R"({"bf16": {"frobnicate": 1}})", R"({"optimizer": {"params": {"frobnicate": 1}}})",
        R"({"scheduler": {"params": {"frobnicate": 1}}})", R"({"strata": {"frobnicate": 1}})"}) {
    EXPECT_CONTAINS(load_error(text), "frobnicate: unknown key; valid keys in");
  }
}

TEST(ConfigRefused, ArithmeticChangingFeaturesAreNamedErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.05}}})",
       "zero_optimization.zenflow: not supported by Strata: ZenFlow"},
      {R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}})",
       "bf16.bf16_master_weights_and_grads: not supported by Strata"},
      {R"({"bf16": {"enabled": true, "bf16_optimizer_states": true}})",
       "bf16.bf16_optimizer_states: not supported by Strata"},
      {R"({"fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})",
       "fp16.fp16_master_weights_and_grads: not supported by Strata"},
      {R"({"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4, "freeze_step": 400}}})",
       "optimizer.type: 'OneBitAdam' is not supported: 1-bit Adam"},
      {R"({"optimizer": {"type": "Lamb"}})", "optimizer.type: 'Lamb' is not supported"},
      {R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}}})",
       "scheduler.type: 'OneCycle' is not supported"},
      {R"({"aio": {"use_gds": true}})", "aio.use_gds: not supported by Strata: GPUDirect"},
      {R"({"optimizer": {"params": {"amsgrad": true}}})",
       "optimizer.params.amsgrad: not supported by Strata"},
      {R"({"zero_optimization": {"zero_quantized_gradients": true}})",
       "zero_optimization.zero_quantized_gradients: not supported by Strata"},
      {R"({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": true}}}})",
       "compression_training: not supported by Strata"},
      {R"({"gradient_allreduce_op": "sum"})", "gradient_allreduce_op: not supported by Strata"},
      {R"({"data_types": {"grad_accum_dtype": "bf16"}})",
       "data_types.grad_accum_dtype: 'bf16' is not supported by Strata"},
      {R"({"sparse_attention": {"mode": "fixed"}})", "sparse_attention: not supported by Strata"},
  };
  for (const auto& [text, message] : cases) {
    std::string e = load_error(text);
    EXPECT_CONTAINS(e, message);
    EXPECT_CONTAINS(e, "ds.json:1:");  // file:line:column
    // A refused optimizer's own parameters are not reported on top of it.
    EXPECT_EQ(e.find("freeze_step"), std::string::npos) << e;
  }
}

TEST(ConfigRefused, RefusedFeaturesSwitchedOffAreAccepted) {
  Loaded loaded = load_ok(R"({"train_micro_batch_size_per_gpu": 1, "aio": {"use_gds": false},
      "bf16": {"enabled": true, "bf16_master_weights_and_grads": false},
      "zero_optimization": {"zero_quantized_weights": false, "zenflow": null},
      "compression_training": {"sparse_pruning": {"shared_parameters": {"enabled": false}}},
      "gradient_allreduce_op": "mean", "data_types": {"grad_accum_dtype": "fp32"}})");
  EXPECT_TRUE(warnings(loaded).empty());
  EXPECT_EQ(report_of(loaded, "aio.use_gds")->use, KeyUse::kNoEffect);
}

TEST(ConfigMapped, ActivationCheckpointingSectionTurnsOnStratasOwn) {
  Loaded loaded = load_ok(R"({"activation_checkpointing": {"partition_activations": false,
      "cpu_checkpointing": true, "contiguous_memory_optimization": false}})");
  EXPECT_TRUE(loaded.config.strata.model.activation_checkpointing);
  EXPECT_TRUE(loaded.config.strata.model.activation_offload);
  // The section is read into strata.model and not printed itself.
  EXPECT_EQ(to_json(loaded.config).find("\"cpu_checkpointing\""), std::string::npos);
  // strata.model's own setting wins.
  Loaded off = load_ok(R"({"activation_checkpointing": {},
      "strata": {"model": {"activation_checkpointing": false}}})");
  EXPECT_FALSE(off.config.strata.model.activation_checkpointing);
}

TEST(ConfigMapped, OptimizerMaxGradNormIsReadAsGradientClipping) {
  EXPECT_DOUBLE_EQ(load_ok(R"({"optimizer": {"type": "Adam", "params": {"max_grad_norm": 0.5}}})")
                       .config.gradient_clipping,
                   0.5);
  load_ok(R"({"gradient_clipping": 1.0, "optimizer": {"params": {"max_grad_norm": 1.0}}})");
  EXPECT_CONTAINS(
      load_error(R"({"gradient_clipping": 1.0, "optimizer": {"params": {"max_grad_norm": 2.0}}})"),
      "optimizer.params.max_grad_norm: a second clipping norm");
}

TEST(ConfigMapped, OldZeroSwitchFormIsStageOne) {
  EXPECT_EQ(load_ok(R"({"zero_optimization": true})").config.zero_optimization.stage, 1);
}

TEST(ConfigReport, EveryKeyOfTheFileIsReportedInFileOrder) {
  auto checked = check_config_text(R"({
    "steps_per_print": 2000,
    "zero_optimization": {"stage": 2, "contiguous_gradients": true, "overlap_comm": true,
                          "stage3_max_live_parameters": 1e9},
    "aio": {"use_gds": true},
    "fp16": {"enabled": false, "loss_scale_window": 500}
  })",
                                   "ds.json", {}, LoadOptions{1});
  EXPECT_FALSE(checked.status.is_ok());
  std::vector<std::pair<std::string, KeyUse>> got;
  for (const KeyReport& key : checked.loaded.keys)
    got.emplace_back(key.path, key.use);
  const std::vector<std::pair<std::string, KeyUse>> want = {
      {"steps_per_print", KeyUse::kNoEffect},
      {"zero_optimization.stage", KeyUse::kUsed},
      {"zero_optimization.contiguous_gradients", KeyUse::kUsed},  // what Strata always does
      {"zero_optimization.overlap_comm", KeyUse::kNoEffect},
      {"zero_optimization.stage3_max_live_parameters", KeyUse::kNoEffect},  // stage 2
      {"aio.use_gds", KeyUse::kRefused},
      {"fp16.enabled", KeyUse::kUsed},
      {"fp16.loss_scale_window", KeyUse::kNoEffect},  // fp16 is off
  };
  EXPECT_EQ(got, want);
  EXPECT_EQ(checked.loaded.keys[0].origin, "ds.json:2:24");
}

TEST(ConfigReport, OverridesAreReportedWithTheirOrigin) {
  Loaded loaded = load_ok("{}", {"zero_optimization.stage=2"});
  const KeyReport* r = report_of(loaded, "zero_optimization.stage");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->origin, "--set zero_optimization.stage=2");
}

TEST(ConfigDocs, AcceptedKeysCoverEveryClass) {
  std::size_t used = 0, no_effect = 0, refused = 0;
  for (const AcceptedKey& key : accepted_keys()) {
    used += key.use == KeyUse::kUsed;
    no_effect += key.use == KeyUse::kNoEffect;
    refused += key.use == KeyUse::kRefused;
    if (key.use != KeyUse::kUsed) {
      EXPECT_FALSE(key.note.empty()) << key.path;
    }
  }
  EXPECT_GE(used, all_key_paths().size());
  EXPECT_GT(no_effect, 60u);
  EXPECT_GT(refused, 15u);
}

}  // namespace
}  // namespace strata::config
