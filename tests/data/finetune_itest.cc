// Fine-tuning end to end: a Hugging Face directory with its tokenizer + a JSONL file of
// conversations, prompt/response pairs and text -> tools/prepare_data.py -> the trainer with
// everything offloaded to NVMe -> weights that match PyTorch trained on the same masked data
// (tools/make_data_fixture.py), with and without packing; `strata eval` honours the mask; and the
// README's command line, whose output directory transformers loads.
//
// Masked targets and packed positions need ModelRunner::set_batch(inputs, targets, positions)
// (issue 15 part A): until the runner has it, the tests that train on masks skip with a message
// and the unmasked example runs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "model/runner.h"
#include "support/run_strata.h"
#include "tests/data/prepare_support.h"
#include "tests/model/fixture_support.h"
#include "train/trainer.h"

namespace strata::data {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr bool kMasks = kRunnerTakesMasks<model::ModelRunner<float>>;

#define STRATA_SKIP_WITHOUT_RUNNER_MASKS()                                                   \
  if (!kMasks) {                                                                             \
    GTEST_SKIP() << "this build's ModelRunner cannot mask targets or pack documents (needs " \
                    "set_batch(inputs, targets, positions), issue 15 part A)";               \
  }

std::string prepare(const TempDir& dir, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"--model",  testing::bpe_model_dir(),
                                   "--input",  testing::sft_jsonl(),
                                   "--output", dir.path() + "/data"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = testing::prepare_data(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return dir.path() + "/data/train.bin";
}

// The fixture's training run: fp32, AdamW from the reference's metadata, parameters and optimizer
// state on NVMe (ZeRO stage 3), one micro-batch per window so that every step sees the whole
// file in `windows` micro-batches whose counted targets differ.
std::string finetune_config(const testing::Fixture& fx, const std::string& dir,
                            const std::string& tokens, std::int64_t windows, bool packing) {
  return fmt::format(
      R"({{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": {},
          "optimizer": {{"type": "AdamW", "params": {{"lr": {}, "betas": [{}, {}], "eps": {},
                                                   "weight_decay": {}}}}},
          "zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 0,
            "offload_param": {{"device": "nvme", "nvme_path": "{}/nvme"}},
            "offload_optimizer": {{"device": "nvme", "nvme_path": "{}/nvme"}}}},
          "aio": {{"block_size": 65536, "queue_depth": 8}},
          "strata": {{"output_dir": "{}/out", "train_steps": 3, "cpu_threads": 2,
                      "device_bytes_max": "64MiB", "host_bytes_max": "256MiB",
                      "model": {{"path": "{}"}},
                      "data": {{"source": "tokens", "path": "{}", "seq_len": {},
                                "val_fraction": 0, "shuffle": false, "packing": {}}}}}}})",
      windows, fx.metadata("lr"), fx.metadata("beta1"), fx.metadata("beta2"), fx.metadata("eps"),
      fx.metadata("weight_decay"), dir, dir, dir, testing::bpe_model_dir(), tokens, fx.seq_len,
      packing ? "true" : "false");
}

testing::Fixture load_reference() {
  testing::Fixture fx;
  auto file = model::SafetensorsFile::open(testing::bpe_model_dir() + "/sft_reference.safetensors");
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  fx.file = std::make_unique<model::SafetensorsFile>(std::move(file).value());
  fx.seq_len = static_cast<std::int64_t>(fx.metadata("seq_len"));
  return fx;
}

std::int64_t window_count(const std::string& tokens, std::int64_t seq_len, bool packing) {
  config::DataConfig c;
  c.source = config::DataSource::kTokens;
  c.path = tokens;
  c.seq_len = seq_len;
  c.val_fraction = 0;
  c.packing = packing;
  auto ds = make_dataset(c, 384, 1);
  EXPECT_TRUE(ds.is_ok()) << ds.status().to_string();
  return ds.is_ok() ? (*ds)->train_samples() : 0;
}

class FineTune : public ::testing::TestWithParam<bool> {};

TEST_P(FineTune, OffloadedTrainingOnMaskedDataMatchesPyTorch) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  STRATA_SKIP_WITHOUT_RUNNER_MASKS();
  const bool packing = GetParam();
  const std::string prefix = packing ? "packed." : "stream.";
  TempDir dir;
  const testing::Fixture fx = load_reference();
  const std::string tokens = prepare(dir);
  const std::int64_t windows = window_count(tokens, fx.seq_len, packing);
  ASSERT_GT(windows, 1);
  fs::create_directories(dir.path() + "/nvme");
  auto loaded = config::load_config_text(finetune_config(fx, dir.path(), tokens, windows, packing),
                                         "finetune.json", {});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  train::TrainerOptions options;
  options.quiet = true;
  auto trainer = train::Trainer::create(loaded->config, options);
  ASSERT_TRUE(trainer.is_ok()) << trainer.status().to_string();
  for (int step = 0; step < 3; ++step) {
    auto report = (*trainer)->train_step();
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    if (step == 0) {
      // The mean over the targets the mask counts, across micro-batches that count different
      // numbers of them, as PyTorch's sum over labels != -100 divided by their number.
      EXPECT_NEAR(report->loss, fx.tensor(prefix + "loss")[0], 1e-5);
      EXPECT_LT(report->loss_tokens, report->tokens);
    }
  }
  ASSERT_TRUE((*trainer)->finish_step().is_ok());
  for (const model::UnitLayout& unit : (*trainer)->layout().units) {
    auto master = (*trainer)->state().view(offload::SlotKind::kMaster, unit.index);
    ASSERT_TRUE(master.is_ok()) << master.status().to_string();
    for (const model::TensorSlot& slot : unit.tensors) {
      testing::expect_close(prefix + "after3." + slot.name, *master + slot.offset,
                            fx.tensor(prefix + "after3." + slot.name), 0.01 * fx.metadata("lr"),
                            1e-5);
    }
  }
}

TEST_P(FineTune, EvalCountsOnlyTheTargetsTheMaskCounts) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  STRATA_SKIP_WITHOUT_RUNNER_MASKS();
  const bool packing = GetParam();
  TempDir dir;
  const testing::Fixture fx = load_reference();
  const std::string tokens = prepare(dir);
  std::vector<std::string> args = {"eval", "--model",   testing::bpe_model_dir(),   "--data",
                                   tokens, "--seq-len", std::to_string(fx.seq_len), "--batch",
                                   "3",    "--json"};
  if (packing) args.push_back("--packing");
  auto r = testing::run_strata(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json::Value j = testing::parse_json(r.out);
  EXPECT_NEAR(j["loss"].asDouble(), fx.tensor(packing ? "packed.loss" : "stream.loss")[0], 1e-5);
  if (!packing) {
    // Targets of the 17 windows of 32 tokens that the mask counts.
    const std::vector<std::int32_t> flags = testing::reference_ints("flags");
    std::int64_t counted = 0;
    const std::int64_t windows = (static_cast<std::int64_t>(flags.size()) - 1) / fx.seq_len;
    for (std::int64_t i = 1; i <= windows * fx.seq_len; ++i)
      counted += flags[static_cast<std::size_t>(i)] & 1;
    EXPECT_EQ(j["tokens"].asInt64(), counted);
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, FineTune, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Packed" : "Stream"; });

// The README's example: prepare, `strata train` with the ZeRO-3 NVMe offload profile and a few
// --set, then `strata eval` on the held-out documents with the Hugging Face directory it wrote.
// Masked and packed once the runner takes masks; all targets counted, unpacked, until then.
TEST(FineTuneExample, PrepareTrainWithOffloadAndEvaluateTheHuggingFaceOutput) {
  STRATA_SKIP_WITHOUT_DATA_VENV();
  TempDir dir;
  std::vector<std::string> prep = {"--val-fraction", "0.25"};
  if (!kMasks) prep.push_back("--no-mask");
  const std::string tokens = prepare(dir, prep);
  fs::create_directories(dir.path() + "/nvme");
  std::vector<std::string> args = {
      "train",
      "--config",
      testing::source_path("configs/zero3-offload-nvme-bf16.json"),
      "--set",
      "strata.model.path=" + testing::bpe_model_dir(),
      "--set",
      "strata.data.source=tokens",
      "--set",
      "strata.data.path=" + tokens,
      "--set",
      "strata.data.val_path=" + dir.path() + "/data/val.bin",
      "--set",
      "strata.data.seq_len=32",
      "--set",
      std::string("strata.data.packing=") + (kMasks ? "true" : "false"),
      "--set",
      "zero_optimization.offload_optimizer.nvme_path=" + dir.path() + "/nvme",
      "--set",
      "train_micro_batch_size_per_gpu=2",
      "--set",
      "gradient_accumulation_steps=2",
      "--set",
      "strata.train_steps=3",
      "--set",
      "strata.device_bytes_max=64MiB",
      "--set",
      "strata.host_bytes_max=512MiB",
      "--set",
      "strata.output_dir=" + dir.path() + "/out",
      "--quiet"};
  auto r = testing::run_strata(args, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string final_dir = dir.path() + "/out/final";
  EXPECT_TRUE(fs::exists(final_dir + "/config.json"));
  EXPECT_TRUE(fs::exists(final_dir + "/model.safetensors"));
  auto e = testing::run_strata({"eval", "--model", final_dir, "--data",
                                dir.path() + "/data/val.bin", "--seq-len", "32", "--json"});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const Json::Value j = testing::parse_json(e.out);
  EXPECT_TRUE(std::isfinite(j["loss"].asDouble()));
  EXPECT_LT(j["loss"].asDouble(), std::log(384.0) + 1.0);  // a model, not noise
  EXPECT_EQ(j["mask"].asString(), dir.path() + "/data/val.mask.bin");
}

TEST(FineTuneExample, RawTextForAModelWithATokenizerSaysHowToPrepareIt) {
  TempDir dir;
  const std::string text = dir.write_file("notes.txt", "Some plain text for the model.\n");
  auto e = testing::run_strata({"eval", "--model", testing::bpe_model_dir(), "--data", text});
  EXPECT_EQ(e.exit_code, 2) << e.err;
  EXPECT_NE(e.err.find("raw bytes"), std::string::npos) << e.err;
  EXPECT_NE(e.err.find("tools/prepare_data.py --model " + testing::bpe_model_dir()),
            std::string::npos)
      << e.err;
  // Asked for explicitly, bytes are scored, with a warning.
  auto forced = testing::run_strata({"eval", "--model", testing::bpe_model_dir(), "--data", text,
                                     "--format", "text", "--seq-len", "8", "--json"});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.err.find("warning"), std::string::npos) << forced.err;
  // The same text named .bin is refused as tokens; as a training source "text" too.
  const std::string as_bin =
      dir.write_file("notes.bin", "Some plain text for the model, longer.\n");
  auto tokens =
      testing::run_strata({"eval", "--model", testing::bpe_model_dir(), "--data", as_bin});
  EXPECT_NE(tokens.exit_code, 0);
  EXPECT_NE(tokens.err.find("looks like text"), std::string::npos) << tokens.err;
  auto train = testing::run_strata(
      {"train", "--config", testing::source_path("configs/zero3-offload-nvme-bf16.json"), "--set",
       "strata.model.path=" + testing::bpe_model_dir(), "--set", "strata.data.source=text", "--set",
       "strata.data.path=" + text, "--set", "strata.data.seq_len=8", "--set",
       "strata.output_dir=" + dir.path() + "/out", "--quiet"});
  EXPECT_EQ(train.exit_code, 2) << train.err;
  EXPECT_NE(train.err.find("has its own tokenizer"), std::string::npos) << train.err;
}

}  // namespace
}  // namespace strata::data
