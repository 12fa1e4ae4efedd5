// `strata eval` on each family's model as transformers wrote it gives transformers' loss; and a
// fine-tune of a Hugging Face model as users run it: `strata train` from a model directory with
// a tokenizer writes output_dir/final with the source's tokenizer files, generation_config.json
// and config keys (token ids, dtype), and `strata convert` of the run's checkpoint writes the same
// directory (the checkpoint remembers where the model came from); resuming from that checkpoint
// accepts the same model.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/run_strata.h"
#include "tests/model/fixture_support.h"
#include "tests/train/llmc_tokens.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::run_strata;
using testing::source_path;
using testing::TempDir;

std::string config(const std::string& out, int steps) {
  return R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
    "strata": {"output_dir": ")" +
         out + R"(", "train_steps": )" + std::to_string(steps) +
         R"(, "cpu_threads": 2, "checkpoint_every_steps": 2,
      "device_bytes_max": "64MiB", "host_bytes_max": "256MiB",
      "model": {"path": ")" +
         source_path("tests/fixtures/models/qwen2_tied") + R"("},
      "data": {"source": "synthetic", "seq_len": 16, "synthetic_vocab_size": 64}}})";
}

class EvalFamilies : public ::testing::TestWithParam<std::string> {};

// The fixture's token stream as an llm.c file: strata eval's windows of 16 are the fixture's batch
// rows, so its mean loss is the float64 reference's.
TEST_P(EvalFamilies, StrataEvalGivesTransformersLoss) {
  const testing::Fixture fx = testing::load_fixture(GetParam());
  TempDir dir;
  const std::string tokens = dir.write_file("tokens.bin", testing::llmc_file(fx.tokens));
  auto r = run_strata({"eval", "--model", testing::fixture_dir(GetParam()), "--data", tokens,
                       "--seq-len", std::to_string(fx.seq_len), "--threads", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json::Value v = testing::parse_json(r.out);
  EXPECT_EQ(v["tokens"].asInt64(), fx.batch * fx.seq_len);
  const double want = fx.tensor("loss")[0];
  EXPECT_NEAR(v["loss"].asDouble(), want, 1e-5 * want) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EvalFamilies, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return info.param; });

TEST(HfFamiliesCli, FinalAndConvertCarryTheTokenizerAndConfigKeys) {
  TempDir dir;
  auto train = run_strata(
      {"train", "--config", dir.write_file("c.json", config(dir.path() + "/out", 2))}, {}, 300);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const std::string source = source_path("tests/fixtures/models/qwen2_tied");
  auto convert = run_strata(
      {"convert", dir.path() + "/out/checkpoints", dir.path() + "/converted", "--dtype", "bf16"});
  ASSERT_EQ(convert.exit_code, 0) << convert.err;
  for (const std::string& out : {dir.path() + "/out/final", dir.path() + "/converted"}) {
    for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
      ASSERT_TRUE(fs::exists(out + "/" + file)) << out << ": " << file;
      EXPECT_EQ(read_file(out + "/" + file), read_file(source + "/" + file)) << file;
    }
    const std::string cfg = read_file(out + "/config.json");
    for (const char* key :
         {R"("pad_token_id" : 0)", R"("eos_token_id" : 2)", R"("torch_dtype" : "float32")",
          R"("model_type" : "qwen2")", R"("sliding_window" : 5)"}) {
      EXPECT_NE(cfg.find(key), std::string::npos) << out << ": " << key << "\n" << cfg;
    }
  }
  // Resuming accepts the model the checkpoint was trained on.
  auto resume =
      run_strata({"train", "--config", dir.write_file("r.json", config(dir.path() + "/out", 4)),
                  "--set", "strata.resume_from=" + dir.path() + "/out/checkpoints"},
                 {}, 300);
  EXPECT_EQ(resume.exit_code, 0) << resume.err;
}

}  // namespace
}  // namespace strata
