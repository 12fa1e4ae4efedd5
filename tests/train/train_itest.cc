// `strata train` and `strata eval` as users run them: metrics, checkpoints and a resumed run that
// continues bit-identically, determinism across thread counts, fp16 loss scaling that skips and
// backs off, every data source, and clear errors.
#include <gtest/gtest.h>
#include <json/json.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "support/run_strata.h"

namespace strata {
namespace {

using testing::read_file;
using testing::run_strata;
using testing::TempDir;

struct RunConfig {
  std::string family = "llama";
  std::string precision = "bf16";  // fp32, bf16, fp16
  int steps = 6;
  int threads = 2;
  std::string extra_strata;  // more keys for the strata section
  std::string extra_top;     // more top-level keys
  std::string data =
      R"("source": "synthetic", "seq_len": 16, "synthetic_vocab_size": 64, "synthetic_branching": 3)";
};

std::string config_text(const RunConfig& c, const std::string& out) {
  std::string precision;
  if (c.precision == "bf16") precision = R"("bf16": {"enabled": true},)";
  if (c.precision == "fp16") precision = R"("fp16": {"enabled": true, "initial_scale_power": 12},)";
  return "{" + precision + R"(
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2}},)" +
         c.extra_top + R"(
    "strata": {"output_dir": ")" +
         out + R"(", "train_steps": )" + std::to_string(c.steps) +
         R"(, "seed": 7, "cpu_threads": )" + std::to_string(c.threads) + R"(,
      "device_bytes_max": "256MiB", "host_bytes_max": "256MiB", "eval_batches": 2,)" +
         c.extra_strata + R"(
      "model": {"family": ")" +
         c.family + R"(", "vocab_size": 64, "max_seq_len": 32, "hidden_size": 32,
                "num_layers": 2, "num_heads": 4)" +
         (c.family == "llama" ? R"(, "num_kv_heads": 2)" : "") + R"(},
      "data": {)" +
         c.data + R"(}}})";
}

Json::Value parse(const std::string& text) {
  Json::CharReaderBuilder builder;
  std::unique_ptr<Json::CharReader> reader(builder.newCharReader());
  Json::Value v;
  std::string errors;
  EXPECT_TRUE(reader->parse(text.data(), text.data() + text.size(), &v, &errors)) << errors << text;
  return v;
}

std::vector<Json::Value> metrics_lines(const std::string& out) {
  std::ifstream in(out + "/metrics.jsonl");
  std::vector<Json::Value> lines;
  std::string line;
  while (std::getline(in, line))
    lines.push_back(parse(line));
  return lines;
}

// step -> loss of every step line.
std::map<int, double> step_losses(const std::string& out) {
  std::map<int, double> losses;
  for (const Json::Value& v : metrics_lines(out)) {
    if (v.isMember("loss")) losses[v["step"].asInt()] = v["loss"].asDouble();
  }
  return losses;
}

// Byte-for-byte equality without printing megabytes when it fails.
bool same_file(const std::string& a, const std::string& b) {
  const std::string x = read_file(a), y = read_file(b);
  return !x.empty() && x == y;
}

testing::RunOutput train(const TempDir& dir, const RunConfig& c, const std::string& name,
                         const std::vector<std::string>& extra = {}) {
  const std::string out = dir.path() + "/" + name;
  const std::string config = dir.write_file(name + ".json", config_text(c, out));
  std::vector<std::string> args = {"train", "--config", config, "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_strata(args, {}, 300);
}

TEST(Train, WritesMetricsSummaryCheckpointAndFinalModel) {
  TempDir dir;
  RunConfig c;
  c.extra_strata = R"("eval_every_steps": 3,)";
  auto r = train(dir, c, "run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json::Value summary = parse(r.out);
  EXPECT_TRUE(summary["summary"].asBool());
  EXPECT_EQ(summary["steps"].asInt(), 6);
  EXPECT_NEAR(summary["entropy_floor"].asDouble(), std::log(3.0), 1e-9);
  EXPECT_TRUE(summary["final_loss"].isDouble());
  const std::string out = dir.path() + "/run";
  const auto lines = metrics_lines(out);
  int steps = 0, evals = 0;
  for (const Json::Value& v : lines) {
    if (v.isMember("loss")) {
      ++steps;
      for (const char* key :
           {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "device_bytes",
            "host_bytes", "nvme_bytes", "loss_scale", "skipped"}) {
        EXPECT_TRUE(v.isMember(key)) << key;
      }
      EXPECT_GT(v["device_bytes"].asUInt64(), 0u);
      EXPECT_GT(v["host_bytes"].asUInt64(), 0u);
    }
    if (v.isMember("eval_loss") && !v.isMember("summary")) ++evals;
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(evals, 2);
  EXPECT_TRUE(lines.back()["summary"].asBool());
  EXPECT_TRUE(std::filesystem::exists(out + "/final/config.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/final/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(
      out + "/checkpoints/step_00000006/state-rank00000-of-00001.safetensors"));
  EXPECT_EQ(read_file(out + "/checkpoints/latest"), "step_00000006\n");
  // The first step runs at the schedule's iteration -1 (WarmupCosineLR: lr 0), as in DeepSpeed.
  EXPECT_EQ(lines[0]["lr"].asDouble(), 0.0);
}

TEST(Train, ResumedRunContinuesBitIdentically) {
  // The last case keeps the optimizer state on the device (the CPU backend's arena): it is
  // checkpointed and resumed through the unit scratch.
  for (const auto& [family, precision, extra] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gpt2", "bf16", ""},
           {"llama", "fp16", ""},
           {"llama", "bf16", R"("device_optimizer": "on",)"},
           // Compressed optimizer state: checkpointed as stored (8-bit codes and absmax, bf16),
           // read back as stored; bf16 gradients accumulate over two micro-batches with the
           // stochastic rounding of their run-wide micro-batch number.
           {"llama", "bf16",
            R"("optimizer_state": {"moments": "8bit", "block_size": 64, "master": "bf16",
                                   "gradients": "bf16"},)"},
           {"gpt2", "fp16", R"("optimizer_state": {"moments": "bf16", "gradients": "bf16"},)"}}) {
    TempDir dir;
    RunConfig c;
    c.family = family;
    c.precision = precision;
    c.extra_strata = R"("checkpoint_every_steps": 3,)" + extra;
    ASSERT_EQ(train(dir, c, "straight").exit_code, 0);
    RunConfig first = c;
    first.steps = 3;
    // A three-step run would schedule its cosine over three steps; keep the six-step schedule.
    first.extra_top =
        R"("scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2, "total_num_steps": 6}},)";
    std::string text = config_text(first, dir.path() + "/split");
    // The override above repeats the scheduler key; drop the first occurrence.
    text.erase(
        text.find(R"("scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2}},)"),
        std::string(
            R"("scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2}},)")
            .size());
    const std::string config = dir.write_file("split.json", text);
    auto part = run_strata({"train", "--config", config, "--quiet"}, {}, 300);
    ASSERT_EQ(part.exit_code, 0) << part.err;
    auto resumed =
        run_strata({"train", "--config", config, "--quiet", "--set", "strata.train_steps=6",
                    "--set", "strata.resume_from=" + dir.path() + "/split/checkpoints"},
                   {}, 300);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_TRUE(same_file(dir.path() + "/straight/final/model.safetensors",
                          dir.path() + "/split/final/model.safetensors"))
        << family << " " << precision << " " << extra;
    EXPECT_TRUE(same_file(
        dir.path() + "/straight/checkpoints/step_00000006/state-rank00000-of-00001.safetensors",
        dir.path() + "/split/checkpoints/step_00000006/state-rank00000-of-00001.safetensors"))
        << family << " " << precision;
    EXPECT_EQ(step_losses(dir.path() + "/straight"), step_losses(dir.path() + "/split"));
    EXPECT_EQ(parse(resumed.out)["final_loss"].asDouble(),
              metrics_lines(dir.path() + "/straight").back()["final_loss"].asDouble());
  }
}

TEST(Train, BitIdenticalWithOneOrTwoThreads) {
  TempDir dir;
  RunConfig c;
  c.steps = 3;
  c.threads = 1;
  ASSERT_EQ(train(dir, c, "one").exit_code, 0);
  c.threads = 2;
  ASSERT_EQ(train(dir, c, "two").exit_code, 0);
  EXPECT_TRUE(same_file(dir.path() + "/one/final/model.safetensors",
                        dir.path() + "/two/final/model.safetensors"));
}

TEST(Train, Fp16OverflowSkipsStepsAndBacksOffTheScale) {
  TempDir dir;
  RunConfig c;
  c.precision = "fp16";
  c.steps = 12;
  c.extra_top = R"("fp16": {"enabled": true, "initial_scale_power": 24, "hysteresis": 1},)";
  std::string text = config_text(c, dir.path() + "/out");
  text.erase(text.find(R"("fp16": {"enabled": true, "initial_scale_power": 12},)"),
             std::string(R"("fp16": {"enabled": true, "initial_scale_power": 12},)").size());
  auto r = run_strata({"train", "--config", dir.write_file("c.json", text), "--quiet"}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  double previous_scale = 0.0;
  bool saw_skip = false, saw_applied_after_skip = false;
  for (const Json::Value& v : metrics_lines(dir.path() + "/out")) {
    if (!v.isMember("loss")) continue;
    const double scale = v["loss_scale"].asDouble();
    if (previous_scale > 0 && saw_skip && !saw_applied_after_skip) {
      EXPECT_EQ(scale, previous_scale / 2) << "step " << v["step"].asInt();
    }
    if (v["skipped"].asBool()) {
      saw_skip = true;
      EXPECT_TRUE(v["grad_norm"].isNull());
      EXPECT_EQ(v["lr"].asDouble(), 0.0);
    } else if (saw_skip) {
      saw_applied_after_skip = true;
    }
    previous_scale = scale;
  }
  EXPECT_TRUE(saw_skip);
  EXPECT_TRUE(saw_applied_after_skip);
  const Json::Value summary = parse(r.out);
  EXPECT_GT(summary["skipped_steps"].asInt(), 0);
  EXPECT_TRUE(std::isfinite(summary["final_loss"].asDouble()));
}

TEST(Train, LossFallsTowardTheSyntheticFloor) {
  TempDir dir;
  RunConfig c;
  c.steps = 60;
  c.precision = "fp32";
  auto r = train(dir, c, "run", {"--set", "optimizer.params.lr=0.01"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto losses = step_losses(dir.path() + "/run");
  EXPECT_NEAR(losses.at(1), std::log(64.0), 0.3);  // starts near uniform over 64 tokens
  EXPECT_LT(parse(r.out)["final_loss"].asDouble(), 0.5 * (losses.at(1) + std::log(3.0)));
}

std::string llmc_tokens(std::uint32_t count, std::uint32_t modulo) {
  std::string header(1024, '\0');
  auto put = [&](int at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i)
      header[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(0, 20240520);
  put(4, 1);
  put(8, count);
  std::string body;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint32_t t = (i * 7 + i / 5) % modulo;
    body += static_cast<char>(t & 0xff);
    body += static_cast<char>(t >> 8);
  }
  return header + body;
}

std::string llmc_tokens_from(const std::vector<std::uint32_t>& tokens) {
  std::string header(1024, '\0');
  auto put = [&](int at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i)
      header[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(0, 20240520);
  put(4, 1);
  put(8, static_cast<std::uint32_t>(tokens.size()));
  std::string body;
  for (std::uint32_t t : tokens) {
    body += static_cast<char>(t & 0xff);
    body += static_cast<char>(t >> 8);
  }
  return header + body;
}

TEST(Train, TrainsOnTokenAndTextFilesAndEvalReadsTheFinalModel) {
  TempDir dir;
  const std::string tokens = dir.write_file("tokens.bin", llmc_tokens(2000, 64));
  RunConfig c;
  c.steps = 2;
  c.family = "gpt2";
  c.data = R"("source": "tokens", "path": ")" + tokens + R"(", "seq_len": 16)";
  auto r = train(dir, c, "tok");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto eval = run_strata({"eval", "--model", dir.path() + "/tok/final", "--data", tokens,
                          "--seq-len", "16", "--batch", "7", "--json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const Json::Value e = parse(eval.out);
  EXPECT_EQ(e["tokens"].asInt64(), (2000 - 1) / 16 * 16);
  EXPECT_GT(e["loss"].asDouble(), 0.5);
  EXPECT_LT(e["loss"].asDouble(), 2 * std::log(64.0));

  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "the quick brown fox jumps over the lazy dog. ";
  RunConfig t;
  t.steps = 2;
  t.data =
      R"("source": "text", "path": ")" + dir.write_file("book.txt", text) + R"(", "seq_len": 16)";
  std::string cfg = config_text(t, dir.path() + "/text");
  cfg.replace(cfg.find(R"("vocab_size": 64)"), 16, R"("vocab_size": 256)");
  auto tr = run_strata({"train", "--config", dir.write_file("text.json", cfg), "--quiet"}, {}, 300);
  ASSERT_EQ(tr.exit_code, 0) << tr.err;
}

TEST(Train, AConfigJsonAloneTrainsFromRandomInitialisation) {
  TempDir dir;
  RunConfig c;
  c.steps = 2;
  const std::string config =
      testing::source_path("tests/fixtures/models/llama_gqa_tied/config.json");
  auto r = run_strata(
      {"train", "--config", dir.write_file("c.json", config_text(c, dir.path() + "/out")), "--set",
       "strata.model.path=" + config},
      {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("loaded weights"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("llama with 17664 parameters"), std::string::npos) << r.err;
  // GPT-2's initialisation gives near-uniform predictions over the 67-token vocabulary.
  EXPECT_NEAR(step_losses(dir.path() + "/out").at(1), std::log(67.0), 0.1);
}

// Mistral's sliding window is implemented: a sequence longer than the window trains (the model
// transformers defines; tests/model's fixtures check the numbers).
TEST(Train, MistralSlidingWindowTrainsSequencesLongerThanTheWindow) {
  TempDir dir;
  std::string hf =
      read_file(testing::source_path("tests/fixtures/models/llama_gqa_tied/config.json"));
  const std::string type = R"("model_type": "llama")";
  ASSERT_NE(hf.find(type), std::string::npos);
  hf.replace(hf.find(type), type.size(), R"("model_type": "mistral", "sliding_window": 8)");
  const std::string model = dir.write_file("mistral.json", hf);
  RunConfig c;
  c.steps = 2;
  auto r = run_strata(
      {"train", "--config", dir.write_file("long.json", config_text(c, dir.path() + "/long")),
       "--set", "strata.model.path=" + model, "--set", "strata.data.seq_len=24"},
      {}, 300);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("model: mistral with"), std::string::npos) << r.err;
  EXPECT_EQ(step_losses(dir.path() + "/long").size(), 2u);
}

TEST(Train, ClearErrorsForMissingDataTinyBudgetsAndBadResume) {
  TempDir dir;
  RunConfig c;
  c.data = R"("source": "tokens", "path": ")" + dir.path() + R"(/missing.bin", "seq_len": 16)";
  auto missing = train(dir, c, "a");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("missing.bin"), std::string::npos) << missing.err;

  RunConfig small;
  auto budget = train(dir, small, "b", {"--set", "strata.device_bytes_max=64KiB"});
  EXPECT_EQ(budget.exit_code, 1);
  EXPECT_NE(budget.err.find("strata.device_bytes_max"), std::string::npos) << budget.err;

  auto resume = train(dir, small, "c", {"--set", "strata.resume_from=" + dir.path() + "/nowhere"});
  EXPECT_EQ(resume.exit_code, 1);
  EXPECT_NE(resume.err.find("no checkpoint here"), std::string::npos) << resume.err;

  auto eval = run_strata({"eval", "--model", dir.path() + "/nomodel", "--data", "x.bin"});
  EXPECT_NE(eval.exit_code, 0);
  EXPECT_NE(eval.err.find("nomodel"), std::string::npos) << eval.err;
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(BenchStep, ReportsThroughputGemmPeakAndMfu) {
  auto r = run_strata({"bench", "step", "--model",
                       testing::source_path("tests/fixtures/models/gpt2_tied/config.json"),
                       "--batch", "2", "--seq-len", "16", "--steps", "2", "--peak-sizes", "64,128",
                       "--peak-repeats", "1", "--backend", "cpu", "--json"},
                      {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json::Value j = parse(r.out);
  EXPECT_EQ(j["backend"].asString(), "cpu");
  EXPECT_EQ(j["model"].asString(), "gpt2");
  EXPECT_EQ(j["step_ms"].size(), 2u);
  for (const char* key : {"tokens_per_s", "achieved_gflops", "gemm_peak_gflops",
                          "openblas_threads_gflops", "mfu", "model_flops_per_step"}) {
    EXPECT_GT(j[key].asDouble(), 0.0) << key;
  }
  EXPECT_EQ(j["gemm_peak_n"].asInt(), 128);
  EXPECT_DOUBLE_EQ(j["mfu"].asDouble(),
                   j["achieved_gflops"].asDouble() / j["gemm_peak_gflops"].asDouble());
}

TEST(BenchStep, PredictPrintsTheStepModelWithoutRunningAndRefusesAnUnknownCard) {
  const std::string model = testing::source_path("tests/fixtures/models/gpt2_tied/config.json");
  auto r = run_strata({"bench", "step", "--predict", "--model", model, "--batch", "2", "--seq-len",
                       "16", "--card", "h200", "--reference-tokens-per-s", "1000", "--json"},
                      {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json::Value j = parse(r.out);
  EXPECT_EQ(j["card"].asString(), "h200");
  double sum = 0.0;
  std::set<std::string> families;
  for (const Json::Value& f : j["families"]) {
    sum += f["ms"].asDouble();
    families.insert(f["family"].asString());
  }
  EXPECT_TRUE(families.count("gemm") && families.count("attention") && families.count("adamw"));
  EXPECT_NEAR(j["predicted_step_ms"].asDouble(), sum, 1e-9 * sum);
  EXPECT_DOUBLE_EQ(j["predicted_over_reference"].asDouble(),
                   j["predicted_tokens_per_s"].asDouble() / 1000.0);
  EXPECT_FALSE(j.isMember("step_ms"));  // nothing was run
  auto bad = run_strata({"bench", "step", "--predict", "--model", model, "--card", "v100"}, {}, 60);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--card: unknown card 'v100'; valid: h100, h200, a100"), std::string::npos)
      << bad.err;
}

TEST(Eval, LossOfAFixtureModelMatchesPyTorch) {
  TempDir dir;
  const std::string fixture = testing::source_path("tests/fixtures/models/llama_gqa_untied");
  // Rebuild the fixture's token stream (tokens tensor, int32) as an llm.c uint16 file.
  const std::string st = read_file(fixture + "/fixture.safetensors");
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i)
    header = (header << 8) | static_cast<unsigned char>(st[i]);
  const Json::Value h = parse(st.substr(8, header));
  const std::uint64_t begin = h["tokens"]["data_offsets"][0].asUInt64();
  const std::uint64_t count = h["tokens"]["shape"][0].asUInt64();
  std::vector<std::uint32_t> tokens;
  for (std::uint64_t t = 0; t < count; ++t) {
    std::uint32_t v = 0;
    for (int b = 3; b >= 0; --b)
      v = (v << 8) | static_cast<unsigned char>(st[8 + header + begin + 4 * t + b]);
    tokens.push_back(v);
  }
  const std::string path = dir.write_file("tokens.bin", llmc_tokens_from(tokens));
  auto r = run_strata({"eval", "--model", fixture, "--data", path, "--seq-len",
                       h["__metadata__"]["seq_len"].asString(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::uint64_t loss_begin = h["loss"]["data_offsets"][0].asUInt64();
  float want = 0;
  std::memcpy(&want, st.data() + 8 + header + loss_begin, 4);
  EXPECT_NEAR(parse(r.out)["loss"].asDouble(), want, 1e-5);
  EXPECT_EQ(parse(r.out)["tokens"].asUInt64(), count - 1);
}

}  // namespace
}  // namespace strata
