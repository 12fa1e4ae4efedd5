#include "config/config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/json_source.h"

namespace strata::config {
namespace {

Config load_ok(const std::string& text, const std::vector<std::string>& overrides = {},
               std::int64_t world_size = 1) {
  auto loaded = load_config_text(text, "test.json", overrides, LoadOptions{world_size});
  EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  return loaded.is_ok() ? loaded->config : Config{};
}

// Loads `text` expecting a configuration error; returns its message.
std::string load_error(const std::string& text, const std::vector<std::string>& overrides = {},
                       std::int64_t world_size = 1) {
  auto loaded = load_config_text(text, "test.json", overrides, LoadOptions{world_size});
  EXPECT_FALSE(loaded.is_ok()) << "expected an error for: " << text;
  if (loaded.is_ok()) return {};
  EXPECT_EQ(loaded.status().exit_code(), 2);
  return loaded.status().to_string();
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST(ConfigDefaults, EmptyConfigGetsDeepSpeedDefaults) {
  Config c = load_ok("{}");
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50'000'000u);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 100'000u);
  EXPECT_EQ(c.zero_optimization.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero_optimization.offload_param.buffer_size, 100'000'000u);
  EXPECT_EQ(c.aio.block_size, 1'048'576u);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_DOUBLE_EQ(c.optimizer.params.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.params.betas[1], 0.999);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);  // DeepSpeed's default since 0.19.3
  EXPECT_EQ(c.precision(), Precision::kFp32);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 1u);
  EXPECT_EQ(c.gradient_accumulation_steps, 1u);
  EXPECT_EQ(c.train_batch_size, 1u);
}

TEST(ConfigDialect, AcceptsCommentsTrailingCommasAndExponentIntegers) {
  Config c = load_ok(R"({
    // line comment
    "zero_optimization": {   /* block comment */
      "stage": 3,            # hjson-style comment, "quotes" inside
      "stage3_prefetch_bucket_size": 5e8,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/mnt/a#b"},
    },
  })");
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 500'000'000u);
  ASSERT_EQ(c.zero_optimization.offload_optimizer.nvme_path.size(), 1u);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.nvme_path[0], "/mnt/a#b");
}

TEST(ConfigDialect, HashCommentBlankingKeepsOffsets) {
  std::string text = "{\"a\": \"x#y\", # gone\n\"b\": 1}";
  std::string blanked = blank_hash_comments(text);
  EXPECT_EQ(blanked.size(), text.size());
  EXPECT_EQ(blanked, "{\"a\": \"x#y\",       \n\"b\": 1}");
}

TEST(ConfigDialect, NvmePathMayBeAListToStripeOver) {
  Config c = load_ok(R"({"zero_optimization": {"stage": 3, "offload_param":
      {"device": "nvme", "nvme_path": ["/nvme0", "/nvme1"]}}})");
  EXPECT_EQ(c.zero_optimization.offload_param.nvme_path,
            (std::vector<std::string>{"/nvme0", "/nvme1"}));
}

TEST(ConfigErrors, MalformedJsonNamesLineAndColumn) {
  std::string e = load_error("{\n  \"fp16\": {\"enabled\": tru}\n}");
  EXPECT_CONTAINS(e, "malformed JSON");
  EXPECT_CONTAINS(e, "test.json:2:");
}

TEST(ConfigErrors, DuplicateKeyIsRejectedWithItsLocation) {
  std::string e = load_error("{\"zero_optimization\": {\"stage\": 2,\n \"stage\": 3}}");
  EXPECT_CONTAINS(e, "test.json:2:");
  EXPECT_CONTAINS(e, "Duplicate key: 'stage'");
}

TEST(ConfigErrors, UnknownKeySuggestsTheNearestValidKey) {
  std::string e = load_error(R"({"zero_optimization": {"stgae": 2}})");
  EXPECT_CONTAINS(e, "zero_optimization.stgae: unknown key; did you mean 'stage'?");
  e = load_error(
      R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memroy": true}}})");
  EXPECT_CONTAINS(e, "did you mean 'pin_memory'?");
}

TEST(ConfigErrors, UnknownKeyWithNoCloseMatchListsEveryValidKey) {
  std::string e = load_error(R"({"zero_optimization": {"offload_param": {"frobnicate": 1}}})");
  // Every key accepted there, the ones with no effect included.
  EXPECT_CONTAINS(e,
                  "zero_optimization.offload_param.frobnicate: unknown key; valid keys in "
                  "'zero_optimization.offload_param': device, nvme_path, pin_memory, buffer_count, "
                  "buffer_size, max_in_cpu");
}

TEST(ConfigErrors, KeyValidInAnotherSectionIsStillUnknownHere) {
  // buffer_size belongs to offload_param, not offload_optimizer.
  std::string e = load_error(
      R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "buffer_size": 1e8}}})");
  EXPECT_CONTAINS(e, "zero_optimization.offload_optimizer.buffer_size: unknown key");
}

TEST(ConfigErrors, WrongTypesNameTheKeyAndWhatWasGiven) {
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"stage": "3"}})"),
                  "zero_optimization.stage: expected a whole number, got the string \"3\"");
  EXPECT_CONTAINS(load_error(R"({"fp16": {"enabled": 1}})"),
                  "fp16.enabled: expected true or false, got 1");
  EXPECT_CONTAINS(load_error(R"({"fp16": true})"), "fp16: expected a section");
  EXPECT_CONTAINS(load_error(R"({"optimizer": {"params": {"betas": 0.9}}})"),
                  "optimizer.params.betas: expected a list of two numbers");
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"reduce_bucket_size": 1.5}})"),
                  "expected a whole number");
}

TEST(ConfigErrors, OutOfRangeValuesSayWhatIsValid) {
  std::string e = load_error("{\n\"zero_optimization\": {\"stage\": 4}}");
  EXPECT_CONTAINS(e,
                  "test.json:2:32: zero_optimization.stage: 4 is out of range; valid: from 0 to 3");
  EXPECT_CONTAINS(load_error(R"({"optimizer": {"params": {"eps": 0}}})"), "greater than 0");
  EXPECT_CONTAINS(load_error(R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})"),
                  "out of range");
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"offload_optimizer": {"ratio": 1.5}}})"),
                  "ratio: 1.5 is out of range");
  EXPECT_CONTAINS(load_error(R"({"strata": {"train_steps": 0}})"), "valid: from 1 to 268435456");
}

TEST(ConfigErrors, BadEnumListsTheValidValues) {
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"offload_param": {"device": "gpu"}}})"),
                  "'gpu' is not valid; valid values: none, cpu, nvme");
  EXPECT_CONTAINS(load_error(R"({"optimizer": {"type": "Lamb"}})"), "valid values: Adam, AdamW");
  EXPECT_CONTAINS(load_error(R"({"scheduler": {"type": "OneCycle"}})"),
                  "valid values: none, WarmupLR, WarmupDecayLR, WarmupCosineLR");
}

TEST(ConfigErrors, OffloadParamNeedsStageThree) {
  std::string e =
      load_error(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})");
  EXPECT_CONTAINS(e, "offloading parameters needs ZeRO stage 3");
  load_ok(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})");
}

TEST(ConfigErrors, OffloadOptimizerNeedsAZeroStage) {
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})"),
                  "needs ZeRO stage 1, 2 or 3");
}

TEST(ConfigErrors, NvmeWithoutPathIsAnError) {
  EXPECT_CONTAINS(
      load_error(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
      "zero_optimization.offload_param.nvme_path: device is \"nvme\" but no nvme_path");
  EXPECT_CONTAINS(
      load_error(
          R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": ""}}})"),
      "an empty path");
}

TEST(ConfigErrors, Fp16AndBf16TogetherIsAnError) {
  EXPECT_CONTAINS(load_error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
                  "fp16 and bf16 are both enabled");
}

TEST(ConfigErrors, AioBlockSizeMustBeAMultipleOf4096) {
  std::string e = load_error(R"({"aio": {"block_size": 1000000}})");
  EXPECT_CONTAINS(e, "aio.block_size: 1000000 is not a multiple of 4096");
  EXPECT_CONTAINS(e, "1003520");
  load_ok(R"({"aio": {"block_size": 8388608}})");
}

TEST(ConfigErrors, EveryProblemIsReportedAtOnce) {
  std::string e = load_error(
      R"({"gradient_clippng": 1, "zero_optimization": {"stage": 9}, "aio": {"queue_depth": 0}})");
  EXPECT_CONTAINS(e, "3 problems");
  EXPECT_CONTAINS(e, "gradient_clippng: unknown key; did you mean 'gradient_clipping'?");
  EXPECT_CONTAINS(e, "zero_optimization.stage");
  EXPECT_CONTAINS(e, "aio.queue_depth");
}

TEST(ConfigErrors, CrossKeyProblemsArriveWithTheValueProblems) {
  // Before, the checks spanning several keys ran only once every value was valid, so these came
  // in a second round.
  std::string e = load_error(R"({"aio": {"queue_depth": 0}, "fp16": {"enabled": true},
      "bf16": {"enabled": true}, "train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_CONTAINS(e, "3 problems");
  EXPECT_CONTAINS(e, "aio.queue_depth");
  EXPECT_CONTAINS(e, "fp16 and bf16 are both enabled");
  EXPECT_CONTAINS(e, "10 is not a whole multiple of");
  // A check built on a bad value is skipped rather than reporting nonsense.
  e = load_error(R"({"strata": {"model": {"hidden_size": "big", "num_heads": 5}}})");
  EXPECT_CONTAINS(e, "strata.model.hidden_size: expected a whole number");
  EXPECT_EQ(e.find("heads do not divide"), std::string::npos) << e;
}

TEST(ConfigErrors, EmptyFileAndNonObjectRoot) {
  EXPECT_CONTAINS(load_error("  \n"), "the file is empty");
  EXPECT_CONTAINS(load_error("[1, 2]"), "must be a JSON object");
}

TEST(ConfigErrors, MissingFileNamesIt) {
  auto loaded = load_config_file("/nonexistent/ds.json", {});
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_EQ(loaded.status().exit_code(), 2);
  EXPECT_CONTAINS(loaded.status().to_string(), "/nonexistent/ds.json");
}

struct BatchCase {
  std::string json;
  std::int64_t world;
  std::uint64_t train, micro, accumulation;
};

TEST(ConfigBatch, AnyTwoOfTheTripleDeriveTheThird) {
  const std::vector<BatchCase> cases = {
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 2, 32, 4, 4},
      {R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4, 32, 4, 2},
      {R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", 2, 30, 3, 5},
      {R"({"train_batch_size": 8})", 1, 8, 8, 1},
      {R"({"train_batch_size": 8})", 4, 8, 2, 1},
      {R"({"train_micro_batch_size_per_gpu": 2})", 3, 6, 2, 1},
      {R"({"train_batch_size": 0, "gradient_accumulation_steps": 8})", 1, 8, 1, 8},
      // Nothing to derive the micro-batch from: "auto" is the Trainer's default of 8.
      {R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 4})",
       2, 64, 8, 4},
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"})",
       2, 32, 16, 1},
      {R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})",
       2, 24, 4, 3},
  };
  for (const BatchCase& c : cases) {
    Config config = load_ok(c.json, {}, c.world);
    EXPECT_EQ(config.train_batch_size, c.train) << c.json << " world " << c.world;
    EXPECT_EQ(config.train_micro_batch_size_per_gpu, c.micro) << c.json << " world " << c.world;
    EXPECT_EQ(config.gradient_accumulation_steps, c.accumulation) << c.json;
    EXPECT_EQ(config.world_size, c.world);
  }
}

TEST(ConfigBatch, InconsistentTripleShowsTheArithmetic) {
  std::string e = load_error(
      R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})",
      {}, 2);
  EXPECT_CONTAINS(e,
                  "32 does not equal train_micro_batch_size_per_gpu (4) × "
                  "gradient_accumulation_steps (3) × world size (2) = 24");
}

TEST(ConfigBatch, IndivisibleTotalIsAnError) {
  std::string e = load_error(R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_CONTAINS(e, "10 is not a whole multiple of");
  EXPECT_CONTAINS(load_error(R"({"train_batch_size": 3})", {}, 2), "not a whole multiple");
}

TEST(ConfigAuto, DeepSpeedOnlyAutoTakesDeepSpeedsDefaultWithANote) {
  auto loaded = load_config_text(
      R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
          "stage3_prefetch_bucket_size": "auto"}})",
      "hf.json", {});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->config.zero_optimization.stage3_prefetch_bucket_size, 50'000'000u);
  bool saw_note = false;
  for (const Note& note : loaded->notes) {
    if (note.path == "zero_optimization.stage3_prefetch_bucket_size") {
      saw_note = true;
      EXPECT_CONTAINS(note.message, "\"auto\" -> 50000000 (DeepSpeed's default");
    }
  }
  EXPECT_TRUE(saw_note);
}

TEST(ConfigAuto, DecayingSchedulerTakesTotalStepsFromTrainSteps) {
  Config c = load_ok(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10,
      "total_num_steps": "auto"}}, "strata": {"train_steps": 500}})");
  EXPECT_EQ(c.scheduler.params.total_num_steps, 500);
}

TEST(ConfigCompat, OldNamesAreMappedWithANote) {
  Config c = load_ok(R"({"aio": {"thread_count": 4}, "zero_optimization": {"stage": 3,
      "stage3_gather_fp16_weights_on_model_save": true}})");
  EXPECT_EQ(c.aio.intra_op_parallelism, 4);
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_CONTAINS(load_error(R"({"aio": {"thread_count": 4, "intra_op_parallelism": 2}})"),
                  "aio.thread_count: the old name of 'aio.intra_op_parallelism'");
  load_ok(R"({"aio": {"thread_count": 2, "intra_op_parallelism": 2}})");
}

TEST(ConfigCompat, LegacyCpuOffloadSwitchMapsToOffloadOptimizer) {
  Config c = load_ok(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_CONTAINS(load_error(R"({"zero_optimization": {"stage": 2, "cpu_offload": true,
      "offload_optimizer": {"device": "none"}}})"),
                  "an old switch for 'zero_optimization.offload_optimizer.device'");
}

TEST(ConfigCompat, KnownButUnusedDeepSpeedKeysAreAcceptedWithAWarningEach) {
  auto loaded = load_config_text(
      R"({"tensorboard": {"enabled": true}, "zero_optimization": {"stage": 2, "elastic_checkpoint": true}})",
      "t.json", {});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  std::vector<std::string> warned;
  for (const Note& note : loaded->notes) {
    if (note.severity == Severity::kWarning && note.message.find("no effect") != std::string::npos)
      warned.push_back(note.path);
  }
  EXPECT_EQ(warned,
            (std::vector<std::string>{"zero_optimization.elastic_checkpoint", "tensorboard"}));
}

TEST(ConfigOverrides, SetReplacesCreatesAndParsesJson) {
  Config c = load_ok(R"({"zero_optimization": {"stage": 1}})",
                     {"zero_optimization.stage=3", "zero_optimization.offload_param.device=cpu",
                      "optimizer.params.betas=[0.8, 0.9]", "strata.device_bytes_max=24GiB",
                      "strata.output_dir=/tmp/run 1"});
  EXPECT_EQ(c.zero_optimization.stage, 3);
  EXPECT_EQ(c.zero_optimization.offload_param.device, OffloadDevice::kCpu);
  EXPECT_DOUBLE_EQ(c.optimizer.params.betas[0], 0.8);
  EXPECT_EQ(c.strata.device_bytes_max, 24ull << 30);
  EXPECT_EQ(c.strata.output_dir, "/tmp/run 1");
}

TEST(ConfigOverrides, ErrorsPointAtTheOverride) {
  EXPECT_CONTAINS(load_error("{}", {"zero_optimization.stage=7"}),
                  "--set zero_optimization.stage=7: zero_optimization.stage: 7 is out of range");
  auto no_equals = load_config_text("{}", "t.json", {"zero_optimization.stage"});
  ASSERT_FALSE(no_equals.is_ok());
  EXPECT_EQ(no_equals.status().code(), ErrorCode::kUsage);
  EXPECT_CONTAINS(no_equals.status().to_string(), "KEY.PATH=VALUE");
  EXPECT_CONTAINS(
      load_error(R"({"zero_optimization": {"stage": 2}})", {"zero_optimization.stage.x=1"}),
      "'zero_optimization.stage' is not a section");
}

TEST(ConfigStrata, ByteBudgetsAcceptUnitsAndRejectNonsense) {
  Config c = load_ok(R"({"strata": {"host_bytes_max": "1.5GiB", "device_bytes_max": 1e9}})");
  EXPECT_EQ(c.strata.host_bytes_max, 3ull << 29);
  EXPECT_EQ(c.strata.device_bytes_max, 1'000'000'000u);
  EXPECT_CONTAINS(load_error(R"({"strata": {"host_bytes_max": "lots"}})"),
                  "strata.host_bytes_max: the string \"lots\" is not a byte count");
  EXPECT_CONTAINS(load_error(R"({"strata": {"host_bytes_max": -5}})"), "expected a byte count");
}

TEST(ConfigStrata, ModelShapeIsChecked) {
  EXPECT_CONTAINS(load_error(R"({"strata": {"model": {"hidden_size": 100, "num_heads": 3}}})"),
                  "3 heads do not divide hidden_size 100");
  EXPECT_CONTAINS(load_error(R"({"strata": {"model": {"num_heads": 12, "num_kv_heads": 5}}})"),
                  "5 KV heads do not divide num_heads 12");
  EXPECT_CONTAINS(load_error(R"({"strata": {"data": {"seq_len": 4096}}})"),
                  "longer than the model's max_seq_len");
  EXPECT_CONTAINS(load_error(R"({"strata": {"data": {"source": "tokens"}}})"),
                  "strata.data.path: required");
}

TEST(ConfigJson, EffectiveConfigRoundTrips) {
  Config first = load_ok(R"({"train_batch_size": 16, "bf16": {"enabled": true},
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ["/a", "/b"]},
      "offload_optimizer": {"device": "cpu", "ratio": 0.5}},
      "scheduler": {"type": "WarmupLR"}, "strata": {"seed": 18446744073709551615}})",
                         {}, 2);
  std::string json = to_json(first);
  Config second = load_ok(json, {}, 2);
  EXPECT_EQ(to_json(second), json);
  EXPECT_EQ(second.strata.seed, 18446744073709551615ull);
  EXPECT_DOUBLE_EQ(second.zero_optimization.offload_optimizer.ratio, 0.5);
}

TEST(ConfigJson, EveryKeyPathIsPrintedInTheEffectiveConfig) {
  std::string json = to_json(load_ok("{}"));
  for (const std::string& path : all_key_paths()) {
    std::string leaf = path.substr(path.rfind('.') + 1);
    EXPECT_CONTAINS(json, "\"" + leaf + "\":");
  }
  EXPECT_GT(all_key_paths().size(), 90u);
}

}  // namespace
}  // namespace strata::config
