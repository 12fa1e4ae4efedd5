// `strata config check` as a user runs it: the configs users wrote for DeepSpeed, the shipped
// profiles, exit codes, and that docs/config.md documents every key.
#include <gtest/gtest.h>
#include <json/json.h>

#include <filesystem>
#include <memory>
#include <string>

#include "config/config.h"
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

TEST(ConfigCheck, AcceptsEveryConfigUsersWroteForDeepSpeed) {
  auto files = json_files_in(STRATA_SHARED_DIR "/ds-configs");
  ASSERT_GE(files.size(), 6u) << "expected the users' configs in " STRATA_SHARED_DIR "/ds-configs";
  for (const std::string& file : files) {
    auto r = run_strata({"config", "check", file}, {"WORLD_SIZE=1"});
    EXPECT_EQ(r.exit_code, 0) << file << "\n" << r.err;
    Json::Value effective = parse_json(r.out);
    EXPECT_TRUE(effective.isMember("zero_optimization")) << file;
    EXPECT_GE(effective["train_batch_size"].asUInt64(), 1u) << file;
  }
}

TEST(ConfigCheck, CommentedConfigDerivesBatchSizeAndKeepsOffload) {
  auto r = run_strata(
      {"config", "check", STRATA_SHARED_DIR "/ds-configs/zero2-bf16-offload-cpu-commented.json"},
      {"WORLD_SIZE=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json::Value c = parse_json(r.out);
  EXPECT_TRUE(c["bf16"]["enabled"].asBool());
  EXPECT_EQ(c["gradient_accumulation_steps"].asUInt64(), 8u);
  EXPECT_EQ(c["train_micro_batch_size_per_gpu"].asUInt64(), 1u);
  EXPECT_EQ(c["train_batch_size"].asUInt64(), 8u);  // "0" meant: derive it
  EXPECT_EQ(c["zero_optimization"]["stage"].asInt(), 2);
  EXPECT_EQ(c["zero_optimization"]["offload_optimizer"]["device"].asString(), "cpu");
  EXPECT_TRUE(c["zero_optimization"]["offload_optimizer"]["pin_memory"].asBool());
}

TEST(ConfigCheck, WorldSizeOptionAndEnvironmentDeriveTheTriple) {
  std::string file = STRATA_SHARED_DIR "/ds-configs/zero2-fp16.json";  // train 32, accumulation 1
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
  auto r = run_strata({"config", "check", "-q", STRATA_SHARED_DIR "/ds-configs/zero3-minimal.json",
                       "--set", "zero_optimization.offload_param.device=cpu", "--set",
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

TEST(ConfigDocs, ConfigReferenceDocumentsEveryKey) {
  std::string doc = testing::read_file(source_path("docs/config.md"));
  for (const std::string& path : config::all_key_paths()) {
    EXPECT_NE(doc.find("`" + path + "`"), std::string::npos)
        << "docs/config.md does not document `" << path << "`";
  }
}

}  // namespace
}  // namespace strata
