// Hostile config files: deep nesting, huge or endless files, special files, hundreds of thousands
// of unknown keys, integers at the edge of 64 bits, and values of every wrong type. Each is a
// named error (or a bounded list of them), never a crash, a hang or an exception.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/json_source.h"
#include "support/run_strata.h"

namespace strata::config {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  auto loaded = load_config_text(text, "hostile.json", overrides, LoadOptions{1});
  EXPECT_FALSE(loaded.is_ok());
  return loaded.is_ok() ? std::string() : loaded.status().to_string();
}

TEST(ConfigLimits, NestingHundredThousandDeepIsANamedError) {
  const std::size_t depth = 100'000;
  for (const char* open : {"[", "{\"a\": "}) {
    std::string text = "{\"x\": ";
    for (std::size_t i = 0; i < depth; ++i)
      text += open;
    std::string e = error_of(text);
    EXPECT_CONTAINS(e, "nest more than 64 levels deep");
    EXPECT_CONTAINS(e, "hostile.json:1:");
  }
  // 60 levels inside an unknown top-level key are fine.
  std::string ok = "{\"deep\": ";
  for (int i = 0; i < 60; ++i)
    ok += "[";
  for (int i = 0; i < 60; ++i)
    ok += "]";
  ok += "}";
  EXPECT_TRUE(load_config_text(ok, "ok.json", {}).is_ok());
  EXPECT_CONTAINS(error_of("{}", {"strata.x=" + std::string(100'000, '[')}),
                  "nests more than 64 levels deep");
}

TEST(ConfigLimits, BracketsInsideStringsAndCommentsDoNotCount) {
  std::string text = "{\"_comment\": \"" + std::string(200, '[') + "\", // " +
                     std::string(200, '{') + "\n \"x\": 1}";
  EXPECT_TRUE(load_config_text(text, "ok.json", {}).is_ok());
}

TEST(ConfigLimits, OnlyRegularFilesOfBoundedSizeAreRead) {
  testing::TempDir dir;
  // A FIFO with no writer: a named error at once, not a wait for data.
  const std::string fifo = dir.path() + "/fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto from_fifo = load_config_file(fifo, {});
  ASSERT_FALSE(from_fifo.is_ok());
  EXPECT_CONTAINS(from_fifo.status().to_string(), "is a FIFO (named pipe), not a config file");
  // An endless device.
  auto from_zero = load_config_file("/dev/zero", {});
  ASSERT_FALSE(from_zero.is_ok());
  EXPECT_CONTAINS(from_zero.status().to_string(), "/dev/zero: is a character device");
  auto from_dir = load_config_file(dir.path(), {});
  ASSERT_FALSE(from_dir.is_ok());
  EXPECT_CONTAINS(from_dir.status().to_string(), "is a directory");
  // 17 MiB of valid JSON is too big.
  const std::string big = dir.path() + "/big.json";
  {
    std::ofstream out(big);
    out << "{\"_comment\": \"" << std::string(17u << 20, 'x') << "\"}";
  }
  auto from_big = load_config_file(big, {});
  ASSERT_FALSE(from_big.is_ok());
  EXPECT_CONTAINS(from_big.status().to_string(), "a config may be at most 16 MiB");
  EXPECT_EQ(from_big.status().exit_code(), 2);
}

std::string many_keys(const std::string& section, std::size_t count) {
  std::string text = "{\"" + section + "\": {";
  for (std::size_t i = 0; i < count; ++i)
    text += (i ? ", \"" : "\"") + std::string("unknown_key_") + std::to_string(i) + "\": 1";
  return text + "}}";
}

TEST(ConfigLimits, HundredsOfThousandsOfUnknownKeysGiveABoundedReport) {
  // In a section whose unknown keys are errors: the first 20 listed, the rest counted.
  auto checked =
      check_config_text(many_keys("zero_optimization", 200'000), "keys.json", {}, LoadOptions{1});
  ASSERT_FALSE(checked.status.is_ok());
  const std::string& e = checked.status.message();
  EXPECT_CONTAINS(e, "zero_optimization.unknown_key_0: unknown key");
  EXPECT_CONTAINS(e, "199980 more unknown keys in 'zero_optimization' (not listed)");
  EXPECT_LT(e.size(), 100'000u);
  // At the top level (warnings): bounded too.
  std::string text = "{";
  for (int i = 0; i < 200'000; ++i)
    text += (i ? ", \"" : "\"") + std::string("k") + std::to_string(i) + "\": 1";
  auto top = check_config_text(text + "}", "top.json", {}, LoadOptions{1});
  EXPECT_TRUE(top.status.is_ok()) << top.status.to_string();
  EXPECT_LT(top.loaded.notes.size(), 40u);
}

TEST(ConfigLimits, EveryIntegerKeyHasAnUpperBoundNamedInTheError) {
  EXPECT_CONTAINS(error_of(R"({"train_micro_batch_size_per_gpu": 4611686018427387904})"),
                  "train_micro_batch_size_per_gpu: 4611686018427387904 is out of range; valid: 1 "
                  "to 1048576");
  EXPECT_CONTAINS(error_of(R"({"gradient_accumulation_steps": 1e12})"),
                  "gradient_accumulation_steps: 1000000000000 is out of range");
  EXPECT_CONTAINS(error_of(R"({"train_batch_size": 1e15})"), "train_batch_size: 1000000000000000");
  EXPECT_CONTAINS(error_of(R"({"strata": {"train_steps": 1e12}})"),
                  "strata.train_steps: 1000000000000 is out of range");
  EXPECT_CONTAINS(error_of(R"({"zero_optimization": {"sub_group_size": 1e18}})"),
                  "zero_optimization.sub_group_size: 1000000000000000000 is out of range");
  EXPECT_CONTAINS(error_of(R"({"strata": {"model": {"hidden_size": 1048576, "num_heads": 1}}})"),
                  "strata.model.hidden_size: 1048576 is out of range; valid: from 1 to 131072");
}

TEST(ConfigLimits, BatchArithmeticCannotOverflow) {
  // Each within its bound, the products are not: tokens per micro-batch, per step.
  EXPECT_CONTAINS(error_of(R"({"train_micro_batch_size_per_gpu": 1048576,
      "strata": {"model": {"max_seq_len": 16777216}, "data": {"seq_len": 16777216}}})"),
                  "tokens per micro-batch; valid: at most 268435456 tokens");
  EXPECT_CONTAINS(error_of(R"({"train_micro_batch_size_per_gpu": 1024,
      "gradient_accumulation_steps": 16777216, "strata": {"data": {"seq_len": 1024}}})"),
                  "more than 17179869184 tokens per step");
  auto large_world = load_config_text(
      R"({"train_micro_batch_size_per_gpu": 1048576, "gradient_accumulation_steps": 16777216,
          "train_batch_size": 1099511627776})",
      "w.json", {}, LoadOptions{1 << 20});
  ASSERT_FALSE(large_world.is_ok());
  EXPECT_CONTAINS(large_world.status().to_string(), "does not equal");
  EXPECT_CONTAINS(error_of(R"({"strata": {"data": {"synthetic_vocab_size": 1048576,
      "synthetic_branching": 1048576}}})"),
                  "strata.data.synthetic_branching: 1048576 successors");
}

TEST(ConfigLimits, WrongTypesAnywhereAreErrorsNotExceptions) {
  // Every section and key given a value of each wrong type; the loader must answer each with a
  // named error (an exception would end the test program).
  const std::vector<std::string> values = {"null",
                                           "true",
                                           "-1",
                                           "1.5",
                                           "1e400",
                                           "\"x\"",
                                           "[]",
                                           "[1, [2]]",
                                           "{}",
                                           "{\"a\": {\"b\": []}}",
                                           "18446744073709551616",
                                           "-9223372036854775809"};
  std::vector<std::string> paths;
  for (const AcceptedKey& key : accepted_keys())
    paths.push_back(key.path);
  for (const char* section : {"fp16", "bf16", "optimizer", "optimizer.params", "scheduler",
                              "scheduler.params", "zero_optimization", "aio", "strata",
                              "strata.model", "strata.data", "activation_checkpointing"}) {
    paths.push_back(section);
  }
  std::size_t loads = 0;
  for (const std::string& path : paths) {
    for (const std::string& value : values) {
      // As a file...
      std::string text = "{";
      std::string close = "}";
      std::size_t start = 0;
      while (true) {
        const std::size_t dot = path.find('.', start);
        text += "\"" + path.substr(start, dot == std::string::npos ? dot : dot - start) + "\": ";
        if (dot == std::string::npos) break;
        text += "{";
        close += "}";
        start = dot + 1;
      }
      text += value + close;
      auto loaded = load_config_text(text, "t.json", {});
      if (!loaded.is_ok()) {
        EXPECT_EQ(loaded.status().exit_code(), 2) << text;
      }
      // ... and as an override.
      auto overridden = load_config_text("{}", "t.json", {path + "=" + value});
      if (!overridden.is_ok()) {
        EXPECT_EQ(overridden.status().exit_code(), 2) << path << value;
      }
      loads += 2;
    }
  }
  EXPECT_GT(loads, 2000u);
}

TEST(ConfigLimits, MutatedConfigsNeverCrash) {
  // A valid config with random bytes changed: every result is a config or a named error.
  const std::string base = R"({"train_batch_size": 16, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/n"},
      "offload_optimizer": {"device": "cpu"}, "sub_group_size": 1e9},
    "aio": {"block_size": 1048576}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})";
  std::mt19937 rng(1234);  // seeded: a failure replays
  const std::string alphabet = "{}[]\":,.-+eE0123456789truefalsnul \n#/*\\";
  for (int i = 0; i < 3000; ++i) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int j = 0; j < edits; ++j) {
      text[rng() % text.size()] = alphabet[rng() % alphabet.size()];
    }
    auto loaded = load_config_text(text, "m.json", {});
    if (!loaded.is_ok()) {
      EXPECT_EQ(loaded.status().exit_code(), 2) << text;
    }
  }
}

}  // namespace
}  // namespace strata::config
