// `strata train` as a Hugging Face Trainer user runs it: a Trainer template config ("auto"
// everywhere) plus the flags they expect (--model, --data, --lr, --steps, --bf16, ...), the
// loud account of what "auto" became, DeepSpeed's breakdown switches, the 16-bit final model, and
// the refusal to train when no model or data is named.
#include <gtest/gtest.h>
#include <json/json.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/run_strata.h"
#include "tests/train/llmc_tokens.h"

namespace strata {
namespace {

using testing::parse_json;
using testing::read_file;
using testing::run_strata;
using testing::source_path;
using testing::TempDir;

std::string tokens_file(const TempDir& dir) {
  std::vector<std::int32_t> tokens;
  for (int i = 0; i < 4096; ++i)
    tokens.push_back((i * 7 + i / 13) % 61);  // the fixture model's vocabulary is 61
  return dir.write_file("train.bin", testing::llmc_file(tokens));
}

std::string template_path(const char* name) {
  return source_path(std::string("tests/fixtures/ds-configs-public/transformers/") + name);
}

std::vector<std::string> train_args(const TempDir& dir, const char* config) {
  return {"train",
          "--config",
          template_path(config),
          "--model",
          source_path("tests/fixtures/models/gpt2_tied"),
          "--data",
          tokens_file(dir),
          "--output-dir",
          dir.path() + "/out",
          "--steps",
          "3",
          "--per_device_train_batch_size",  // the Trainer's spelling
          "2",
          "--seq-len",
          "16",
          "--learning_rate",
          "1e-3",
          "--bf16",
          "--logging-steps",
          "1",
          "--set",
          "strata.cpu_threads=2",
          "--set",
          "strata.host_bytes_max=1GiB"};
}

TEST(TrainFlags, TrainerTemplateWithTrainerFlagsTrains) {
  TempDir dir;
  auto r = run_strata(train_args(dir, "ds_config_zero2.json"), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_json(r.out)["steps"].asInt(), 3);
  // What "auto" became, said loudly, each with the flag that chooses it.
  EXPECT_NE(r.err.find("warning: the config leaves these to \"auto\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gradient_clipping = 1.0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--max-grad-norm chooses"), std::string::npos) << r.err;
  // The flags' values are in effect.
  const Json::Value c = parse_json(read_file(dir.path() + "/out/effective_config.json"));
  EXPECT_DOUBLE_EQ(c["optimizer"]["params"]["lr"].asDouble(), 1e-3);
  EXPECT_DOUBLE_EQ(c["scheduler"]["params"]["warmup_max_lr"].asDouble(), 1e-3);
  EXPECT_EQ(c["train_micro_batch_size_per_gpu"].asInt(), 2);
  EXPECT_TRUE(c["bf16"]["enabled"].asBool());
  EXPECT_EQ(c["strata"]["data"]["source"].asString(), "tokens");
  // One progress line per step (--logging-steps 1), not DeepSpeed's steps_per_print 2000.
  EXPECT_NE(r.err.find("step 1/3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step 2/3"), std::string::npos) << r.err;
}

TEST(TrainFlags, BreakdownsPrintTheStepsSplitAndTheTiers) {
  TempDir dir;
  std::vector<std::string> args = train_args(dir, "ds_config_zero2.json");
  for (const char* s : {"wall_clock_breakdown=true", "memory_breakdown=true"}) {
    args.push_back("--set");
    args.push_back(s);
  }
  auto r = run_strata(args, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int step = 1; step <= 3; ++step) {
    const std::string s = "step " + std::to_string(step);
    EXPECT_NE(r.err.find(s + " time: forward "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(s + " memory: device "), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("optimizer and the rest"), std::string::npos);
  std::ifstream metrics(dir.path() + "/out/metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(metrics, line)) {
    const Json::Value v = parse_json(line);
    if (!v.isMember("loss")) continue;
    ++steps;
    EXPECT_GT(v["forward_ms"].asDouble(), 0.0) << line;
    EXPECT_GT(v["backward_ms"].asDouble(), 0.0) << line;
    EXPECT_TRUE(v.isMember("nvme_read_bytes")) << line;
  }
  EXPECT_EQ(steps, 3);
}

std::string safetensors_header(const std::string& path) {
  const std::string bytes = read_file(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  return bytes.substr(8, n);
}

TEST(TrainFlags, GatherSixteenBitFlagDecidesTheFinalModelsType) {
  // The ZeRO-3 template sets stage3_gather_fp16_weights_on_model_save: true.
  TempDir dir;
  auto r = run_strata(train_args(dir, "ds_config_zero3.json"), {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string header = safetensors_header(dir.path() + "/out/final/model.safetensors");
  EXPECT_NE(header.find("\"BF16\""), std::string::npos) << header;
  EXPECT_EQ(header.find("\"F32\""), std::string::npos) << header;
  // Without it: the fp32 master weights.
  TempDir other;
  std::vector<std::string> args = train_args(other, "ds_config_zero3.json");
  args.push_back("--set");
  args.push_back("zero_optimization.stage3_gather_fp16_weights_on_model_save=false");
  auto f = run_strata(args, {}, 300);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_NE(safetensors_header(other.path() + "/out/final/model.safetensors").find("\"F32\""),
            std::string::npos);
}

TEST(TrainFlags, NoModelOrDataNamedIsAnErrorListingTheFlags) {
  TempDir dir;
  auto r = run_strata({"train", "--config", template_path("ds_config_zero2.json"), "--set",
                       "strata.output_dir=" + dir.path() + "/out"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("names neither a model nor data"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--model DIR"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--data FILE"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/out"));
}

}  // namespace
}  // namespace strata
