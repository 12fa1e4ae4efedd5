// The `strata train` flags: each a shorthand of its --set key paths, their problems reported with
// the config's in one round, and the rule that a training run names its model and data.
#include "config/flags.h"

#include <gtest/gtest.h>
#include <json/json.h>

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace strata::config {
namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

Json::Value effective(const Config& config) {
  Json::CharReaderBuilder builder;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  const std::string text = to_json(config);
  Json::Value v;
  std::string errors;
  EXPECT_TRUE(reader->parse(text.data(), text.data() + text.size(), &v, &errors)) << errors;
  return v;
}

const Json::Value& at(const Json::Value& root, const std::string& path) {
  const Json::Value* node = &root;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    node = &(*node)[path.substr(start, dot == std::string::npos ? dot : dot - start)];
    if (dot == std::string::npos) return *node;
    start = dot + 1;
  }
}

Result<Loaded> with_flags(const std::string& text, std::vector<FlagValue> flags,
                          const std::vector<std::string>& overrides = {},
                          Purpose purpose = Purpose::kCheck) {
  LoadOptions options(1);
  options.flags = std::move(flags);
  options.purpose = purpose;
  return load_config_text(text, "ds.json", overrides, options);
}

TEST(ConfigFlags, EveryFlagSetsItsKeyPaths) {
  // A scheduler with warmup_max_lr, so --lr sets both of its targets.
  const std::string base = R"({"scheduler": {"type": "WarmupLR"}, "strata": {"model":
      {"max_seq_len": 4096}}})";
  for (const TrainFlag& flag : train_flags()) {
    const std::string name(canonical_name(flag));
    std::string value;
    switch (flag.kind) {
      case FlagKind::kText:
        value = "/runs/a.bin";
        break;
      case FlagKind::kNumber:
        value = "0.25";
        break;
      case FlagKind::kWhole:
        value = "16";
        break;
      case FlagKind::kSwitch:
        break;
    }
    auto loaded = with_flags(base, {{name, value}});
    ASSERT_TRUE(loaded.is_ok()) << name << ": " << loaded.status().to_string();
    const Json::Value c = effective(loaded->config);
    for (const FlagTarget& target : flag.targets) {
      const Json::Value& got = at(c, std::string(target.path));
      if (flag.kind == FlagKind::kSwitch) {
        EXPECT_EQ(got.asBool(), target.fixed == "true") << name << " " << target.path;
      } else if (flag.kind == FlagKind::kText) {
        EXPECT_EQ(got.asString(), value) << name << " " << target.path;
      } else {
        EXPECT_DOUBLE_EQ(got.asDouble(), std::stod(value)) << name << " " << target.path;
      }
    }
    // The key report says which flag set the key.
    bool reported = false;
    for (const KeyReport& key : loaded->keys)
      reported = reported || key.origin.rfind(name, 0) == 0;
    EXPECT_TRUE(reported) << name;
  }
}

TEST(ConfigFlags, HuggingFaceSpellingsAreTheSameFlags) {
  EXPECT_EQ(find_train_flag("--learning_rate"), find_train_flag("--lr"));
  EXPECT_EQ(find_train_flag("--per_device_train_batch_size"),
            find_train_flag("--micro-batch-size"));
  EXPECT_EQ(find_train_flag("--max_steps"), find_train_flag("--steps"));
  EXPECT_EQ(find_train_flag("--no-such-flag"), nullptr);
}

TEST(ConfigFlags, TextFlagsStayTextAndDataFollowsItsExtension) {
  auto loaded = with_flags("{}", {{"--data", "123"}, {"--output-dir", "true"}});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->config.strata.data.path, "123");
  EXPECT_EQ(loaded->config.strata.output_dir, "true");
  EXPECT_EQ(loaded->config.strata.data.source, DataSource::kText);
  auto tokens = with_flags("{}", {{"--data", "/d/train.bin"}});
  ASSERT_TRUE(tokens.is_ok());
  EXPECT_EQ(tokens->config.strata.data.source, DataSource::kTokens);
  // A source the config names wins over the extension.
  auto named = with_flags(R"({"strata": {"data": {"source": "text"}}})", {{"--data", "a.bin"}});
  ASSERT_TRUE(named.is_ok());
  EXPECT_EQ(named->config.strata.data.source, DataSource::kText);
}

TEST(ConfigFlags, LrSetsTheWarmupPeakOnlyWhereTheSchedulerHasOne) {
  auto cosine = with_flags(R"({"scheduler": {"type": "WarmupCosineLR"}})", {{"--lr", "3e-4"}});
  ASSERT_TRUE(cosine.is_ok());
  EXPECT_DOUBLE_EQ(cosine->config.optimizer.params.lr, 3e-4);
  EXPECT_FALSE(cosine->given("scheduler.params.warmup_max_lr"));
  auto decay = with_flags(R"({"scheduler": {"type": "warmupdecaylr",
      "params": {"warmup_max_lr": 1e-3}}})",
                          {{"--lr", "3e-4"}});
  ASSERT_TRUE(decay.is_ok());
  EXPECT_DOUBLE_EQ(decay->config.scheduler.params.warmup_max_lr, 3e-4);
}

TEST(ConfigFlags, ProblemsOfFlagsAndConfigArriveInOneRound) {
  auto loaded = with_flags(R"({"zero_optimization": {"stage": 7}, "fp16": {"enabled": "yes"}})",
                           {{"--bf16", ""}, {"--fp16", ""}, {"--lr", "fast"}, {"--steps", "-3"}},
                           {"optimizer.params.lr=0.1"});
  ASSERT_FALSE(loaded.is_ok());
  const std::string e = loaded.status().to_string();
  EXPECT_CONTAINS(e, "--bf16 and --fp16 both set");
  EXPECT_CONTAINS(e, "--lr fast: expected a number");
  EXPECT_CONTAINS(e, "--steps -3: expected a whole number");
  EXPECT_CONTAINS(e, "zero_optimization.stage: 7 is out of range");
  EXPECT_EQ(loaded.status().exit_code(), 2);
  auto both = with_flags("{}", {{"--lr", "1e-4"}}, {"optimizer.params.lr=2e-4"});
  ASSERT_FALSE(both.is_ok());
  EXPECT_CONTAINS(both.status().to_string(),
                  "--lr 1e-4 and --set optimizer.params.lr=2e-4 both set optimizer.params.lr");
  // The same value twice is no conflict.
  EXPECT_TRUE(with_flags("{}", {{"--lr", "1e-4"}}, {"optimizer.params.lr=1e-4"}).is_ok());
}

TEST(ConfigFlags, AFlagReplacingTheFilesValueSaysSo) {
  auto loaded = with_flags(R"({"optimizer": {"params": {"lr": 1e-4}}})", {{"--lr", "2e-5"}});
  ASSERT_TRUE(loaded.is_ok());
  bool said = false;
  for (const Note& note : loaded->notes) {
    said = said || (note.path == "optimizer.params.lr" &&
                    note.message == "--lr 2e-5 replaces the value 0.0001 in ds.json");
  }
  EXPECT_TRUE(said);
}

TEST(ConfigFlags, ABadFlagValueIsLocatedAtTheFlag) {
  auto loaded = with_flags("{}", {{"--steps", "0"}});
  ASSERT_FALSE(loaded.is_ok());
  EXPECT_CONTAINS(loaded.status().to_string(), "--steps 0: strata.train_steps: 0 is out of range");
}

TEST(ConfigFlags, ATrainingRunNamesItsModelAndData) {
  auto bare = with_flags(R"({"zero_optimization": {"stage": 2}})", {}, {}, Purpose::kTrain);
  ASSERT_FALSE(bare.is_ok());
  const std::string e = bare.status().to_string();
  EXPECT_CONTAINS(e, "names neither a model nor data");
  EXPECT_CONTAINS(e, "--model DIR");
  EXPECT_CONTAINS(e, "--data FILE");
  EXPECT_EQ(bare.status().exit_code(), 2);
  auto no_data = with_flags("{}", {{"--model", "/models/llama"}}, {}, Purpose::kTrain);
  ASSERT_FALSE(no_data.is_ok());
  EXPECT_CONTAINS(no_data.status().to_string(), "names no data");
  EXPECT_EQ(no_data.status().to_string().find("--model"), std::string::npos);
  EXPECT_TRUE(
      with_flags("{}", {{"--model", "/models/llama"}, {"--data", "t.bin"}}, {}, Purpose::kTrain)
          .is_ok());
  // The synthetic source, asked for, with a model shape: the demo configs.
  EXPECT_TRUE(with_flags(R"({"strata": {"model": {"family": "gpt2", "num_layers": 2},
      "data": {"source": "synthetic"}}})",
                         {}, {}, Purpose::kTrain)
                  .is_ok());
  // config check only notes it.
  auto noted = with_flags("{}", {});
  ASSERT_TRUE(noted.is_ok());
  bool saw = false;
  for (const Note& note : noted->notes)
    saw = saw || note.message.find("strata train will ask for --model DIR and --data FILE") !=
                     std::string::npos;
  EXPECT_TRUE(saw);
}

}  // namespace
}  // namespace strata::config
