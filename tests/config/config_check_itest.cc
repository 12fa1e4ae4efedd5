// `strata config check` as a user runs it: the configs users wrote for DeepSpeed, the shipped
// profiles, exit codes, and that docs/config.md documents every key.
#include <gtest/gtest.h>
#include <json/json.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/flags.h"
#include "support/run_strata.h"

namespace strata {
namespace {

using testing::parse_json;
using testing::run_strata;
using testing::source_path;

std::vector<std::string> json_files_in(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Configs in the shapes users write for DeepSpeed (tests/fixtures/ds-configs-users/README.md).
std::string users_config(const std::string& name) {
  return source_path("tests/fixtures/ds-configs-users/" + name);
}

TEST(ConfigCheck, AcceptsEveryConfigUsersWroteForDeepSpeed) {
  auto files = json_files_in(source_path("tests/fixtures/ds-configs-users"));
  ASSERT_GE(files.size(), 7u) << "expected the users' configs in tests/fixtures/ds-configs-users";
  for (const std::string& file : files) {
    auto r = run_strata({"config", "check", file}, {"WORLD_SIZE=1"});
    EXPECT_EQ(r.exit_code, 0) << file << "\n" << r.err;
    Json::Value effective = parse_json(r.out);
    EXPECT_TRUE(effective.isMember("zero_optimization")) << file;
    EXPECT_GE(effective["train_batch_size"].asUInt64(), 1u) << file;
  }
}

TEST(ConfigCheck, CommentedConfigDerivesBatchSizeAndKeepsOffload) {
  auto r = run_strata({"config", "check", users_config("zero2-bf16-offload-cpu-commented.json")},
                      {"WORLD_SIZE=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value c = parse_json(r.out);
  EXPECT_TRUE(c["bf16"]["enabled"].asBool());
  EXPECT_EQ(c["gradient_accumulation_steps"].asUInt64(), 8u);
  EXPECT_EQ(c["train_micro_batch_size_per_gpu"].asUInt64(), 1u);
  EXPECT_EQ(c["train_batch_size"].asUInt64(), 8u);  // "0" meant: derive it
  EXPECT_EQ(c["zero_optimization"]["stage"].asInt(), 2);
  EXPECT_EQ(c["zero_optimization"]["offload_optimizer"]["device"].asString(), "cpu");
  // pin_memory: Strata always pins, so the effective configuration has no such key.
  EXPECT_FALSE(c["zero_optimization"]["offload_optimizer"].isMember("pin_memory"));
}

TEST(ConfigCheck, WorldSizeOptionAndEnvironmentDeriveTheTriple) {
  std::string file = users_config("zero2-fp16.json");  // train 32, accumulation 1
  auto r = run_strata({"config", "check", file, "--world-size", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_json(r.out)["train_micro_batch_size_per_gpu"].asUInt64(), 8u);
  r = run_strata({"config", "check", file}, {"RANK=0", "WORLD_SIZE=2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_json(r.out)["train_micro_batch_size_per_gpu"].asUInt64(), 16u);
  // A launcher sets both; one without the other is an error, not a silent world of 1.
  r = run_strata({"config", "check", file}, {"WORLD_SIZE=2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("WORLD_SIZE=2 is set but RANK is not"), std::string::npos) << r.err;
  r = run_strata({"config", "check", file, "--world-size", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not a whole multiple"), std::string::npos) << r.err;
}

TEST(ConfigCheck, EveryShippedProfileParses) {
  auto files = json_files_in(source_path("configs"));
  ASSERT_GE(files.size(), 11u);
  for (const std::string& file : files) {
    auto r = run_strata({"config", "check", "--quiet", file}, {"WORLD_SIZE=1"});
    EXPECT_EQ(r.exit_code, 0) << file << "\n" << r.err;
    EXPECT_TRUE(r.err.empty()) << "--quiet printed notes for " << file << ":\n" << r.err;
  }
  for (const char* name :
       {"zero2-offload-cpu-bf16", "zero2-offload-cpu-fp16", "zero2-offload-nvme-bf16",
        "zero2-offload-nvme-fp16", "zero3-offload-cpu-bf16", "zero3-offload-cpu-fp16",
        "zero3-offload-nvme-bf16", "zero3-offload-nvme-fp16", "zero3-nvme-bf16", "zero3-nvme-fp16",
        "demo"}) {
    EXPECT_TRUE(std::filesystem::exists(source_path(std::string("configs/") + name + ".json")))
        << name;
  }
}

TEST(ConfigCheck, EffectiveOutputIsAcceptedAgainUnchanged) {
  auto first = run_strata({"config", "check", "-q", source_path("configs/demo.json")});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  testing::TempDir dir;
  std::string again = dir.write_file("effective.json", first.out);
  auto second = run_strata({"config", "check", "-q", again});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.out, first.out);
}

TEST(ConfigCheck, ErrorsExitTwoAndNameTheProblem) {
  testing::TempDir dir;
  std::string bad = dir.write_file("bad.json", "{\n  \"zero_optimization\": {\"stage\": 4}\n}\n");
  auto r = run_strata({"config", "check", bad});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("bad.json:2:34: zero_optimization.stage: 4 is out of range"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty());

  r = run_strata({"config", "check", dir.path() + "/missing.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("missing.json"), std::string::npos) << r.err;

  r = run_strata(
      {"config", "check", source_path("configs/demo.json"), "--set", "aio.block_size=5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--set aio.block_size=5"), std::string::npos) << r.err;

  r = run_strata({"config", "check"});
  EXPECT_EQ(r.exit_code, 2);
}

TEST(ConfigCheck, SetOverridesAppearInTheOutput) {
  auto r = run_strata({"config", "check", "-q", users_config("zero3-minimal.json"), "--set",
                       "zero_optimization.offload_param.device=cpu", "--set",
                       "strata.host_bytes_max=8GiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value c = parse_json(r.out);
  EXPECT_EQ(c["zero_optimization"]["offload_param"]["device"].asString(), "cpu");
  EXPECT_EQ(c["strata"]["host_bytes_max"].asUInt64(), 8ull << 30);
}

TEST(ConfigCheck, HelpDescribesTheCommand) {
  auto r = run_strata({"config", "check", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--set"), std::string::npos) << r.out;
}

TEST(ConfigDocs, ConfigReferenceDocumentsEveryAcceptedKey) {
  std::string doc = testing::read_file(source_path("docs/config.md"));
  for (const config::AcceptedKey& key : config::accepted_keys()) {
    EXPECT_NE(doc.find("`" + key.path + "`"), std::string::npos)
        << "docs/config.md does not document `" << key.path << "`";
  }
}

TEST(ConfigDocs, TrainerDocsAndHelpListEveryFlag) {
  const std::string doc = testing::read_file(source_path("docs/trainer.md"));
  const auto help = run_strata({"train", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const config::TrainFlag& flag : config::train_flags()) {
    const std::string name(config::canonical_name(flag));
    EXPECT_NE(doc.find("`" + name), std::string::npos) << "docs/trainer.md lacks " << name;
    EXPECT_NE(help.out.find(name), std::string::npos) << "strata train --help lacks " << name;
    for (const config::FlagTarget& target : flag.targets) {
      EXPECT_NE(doc.find("`" + std::string(target.path)), std::string::npos)
          << name << " -> " << target.path;
    }
  }
}

// The public configs (tests/fixtures/ds-configs-public/README.md says where each came from)
// that turn on a feature changing the arithmetic, and the key each error must name.
const std::map<std::string, std::vector<std::string>> kRefusedPublicConfigs = {
    {"deepspeedexamples/BingBertSquad_1-bit_adam_nccl_deepspeed_onebitadam_bsz96_config.json",
     {"optimizer.type: 'OnebitAdam' is not supported"}},
    {"deepspeedexamples/DeepSpeed-ZenFlow_finetuning_zf_config.json",
     {"zero_optimization.zenflow: not supported"}},
    {"deepspeedexamples/bing_bert_01_adam_nccl_deepspeed_bsz4k_01adam_config_seq128_nccl.json",
     {"optimizer.type: 'ZeroOneAdam' is not supported"}},
    {"deepspeedexamples/"
     "bing_bert_1-bit_lamb_nccl_deepspeed_bsz64k_onebitlamb_config_seq128_nccl.json",
     {"optimizer.type: 'OneBitLamb' is not supported"}},
    {"deepspeedexamples/bing_bert_deepspeed_bsz4k_progressive_layer_drop_config_seq128.json",
     {"progressive_layer_drop: not supported"}},
    {"deepspeedexamples/bing_bert_deepspeed_bsz64k_lamb_config_seq128.json",
     {"optimizer.type: 'Lamb' is not supported", "sparse_attention: not supported"}},
    {"deepspeedexamples/compression_gpt2_config_ds_config_W8A8_Qgroup64_fp16.json",
     {"compression_training: not supported"}},
    {"deepspeedexamples/data_efficiency_gpt_finetuning_config_ds_config_gpt_base_random_ltd.json",
     {"data_efficiency: not supported"}},
    {"deepspeedexamples/inference_sglang_ds_offload_nvme_gds.json", {"aio.use_gds: not supported"}},
};

TEST(ConfigCheck, PublicDeepSpeedConfigsAreAcceptedOrRefusedByName) {
  const std::string root = source_path("tests/fixtures/ds-configs-public");
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 60u);
  std::size_t refused = 0;
  for (const std::string& file : files) {
    const std::string name = file.substr(root.size() + 1);
    auto r = run_strata({"config", "check", "-q", file}, {"WORLD_SIZE=1", "RANK=0"});
    auto expected = kRefusedPublicConfigs.find(name);
    if (expected == kRefusedPublicConfigs.end()) {
      EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.err;
      EXPECT_TRUE(parse_json(r.out).isMember("zero_optimization")) << name;
      continue;
    }
    ++refused;
    EXPECT_EQ(r.exit_code, 2) << name;
    for (const std::string& message : expected->second) {
      EXPECT_NE(r.err.find(message), std::string::npos) << name << "\n" << r.err;
    }
  }
  EXPECT_EQ(refused, kRefusedPublicConfigs.size());
}

TEST(ConfigCheck, EndsWithTheMigrationReport) {
  const std::string file =
      source_path("tests/fixtures/ds-configs-public/transformers/ds_config_zero3.json");
  auto r = run_strata({"config", "check", file}, {"WORLD_SIZE=1", "RANK=0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("what Strata does with each key of"), std::string::npos) << r.err;
  for (const char* row : {"steps_per_print  ", "zero_optimization.overlap_comm  ",
                          "zero_optimization.stage3_gather_fp16_weights_on_model_save  used"}) {
    EXPECT_NE(r.err.find(row), std::string::npos) << row << "\n" << r.err;
  }
  EXPECT_NE(r.err.find("35 keys: "), std::string::npos) << r.err;
  // The "auto" values that shape the job, loudly.
  EXPECT_NE(r.err.find("warning: the config leaves these to \"auto\""), std::string::npos);
  EXPECT_NE(r.err.find("optimizer.params.lr = 5e-05"), std::string::npos) << r.err;
  // A refused config still gets its report, before the error.
  auto refused = run_strata({"config", "check",
                             source_path("tests/fixtures/ds-configs-public/deepspeedexamples/"
                                         "inference_sglang_ds_offload_nvme_gds.json")},
                            {"WORLD_SIZE=1", "RANK=0"});
  EXPECT_EQ(refused.exit_code, 2);
  const std::size_t table = refused.err.find("aio.use_gds");
  const std::size_t error = refused.err.find("configuration error");
  ASSERT_NE(table, std::string::npos) << refused.err;
  EXPECT_LT(table, error) << refused.err;
  EXPECT_TRUE(refused.out.empty());
}

TEST(ConfigCheck, TakesTheTrainFlags) {
  auto r = run_strata({"config", "check", "-q", source_path("configs/demo.json"), "--lr", "2e-5",
                       "--steps", "7", "--bf16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value c = parse_json(r.out);
  EXPECT_DOUBLE_EQ(c["optimizer"]["params"]["lr"].asDouble(), 2e-5);
  EXPECT_EQ(c["strata"]["train_steps"].asInt(), 7);
}

}  // namespace
}  // namespace strata
